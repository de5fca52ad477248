//! The quantize step of the INT8 engines.
//!
//! - [`Requantize`]: what the lowering (`lower.rs`) writes after each integer conv or matmul
//!   and before each int8 input, as one pass: i32 accumulator -> f32, per-channel rescale and
//!   bias, the activation's clamp, the quantize (multiply, clamp, round half to even by the
//!   1.5 * 2^23 trick) and the cast to i8 (or the dequantize multiply, where a float op reads
//!   the value). tract fuses these ten elementwise ops into one chain that still makes a pass
//!   of memory per op (11-14 ms of a DeepLabV3-MNv2 INT8 run on one core of the 2-core EPYC);
//!   here the values stay in registers, 32 per AVX2 step. The same f32 operations run in the
//!   same order (no FMA), so the results are tract's, bit for bit (tested).
//! - [`CastF32ToI8`]: the cast that ends a quantize the fusion does not cover, 32 values per
//!   AVX2 step where tract casts one at a time (casts took 4-17 ms of an INT8 run of the
//!   bench models on the 2-core EPYC, 0.9-2.1 ms with this op).

use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::cast::Cast;

use super::{Bin, bin_by_constant, scalar, sole_consumer};

/// The constants of one channel: `t = x * mul + add`, then (after the activation's clamp)
/// `t * q` where `q` is 1/scale of the quantize (tract's declutter folds the rescale into it
/// where no bias or activation sits between, making it per channel).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Channel {
    mul: f32,
    add: f32,
    q: f32,
}

/// The arithmetic of one [`Requantize`] around the per-channel constants, in this order:
/// `x * mul + add`, the activation's clamp, `* q`, the int8 clamp, the rounding.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Steps {
    /// The activation's clamp (ReLU, ReLU6): `min(max(t, lo), hi)`.
    act: [f32; 2],
    /// `min(max(t, lo), hi)` after `* q` (the int8 range).
    q_clamp: [f32; 2],
    /// `(t + magic) - magic`: round half to even while `|t| < 2^22`.
    magic: f32,
    /// `None`: cast to i8; `Some(s)`: f32 output `t * s` (the dequantize a float op reads).
    out_scale: Option<f32>,
}

impl Steps {
    /// One value of channel `c`.
    #[inline(always)]
    fn scalar(&self, x: f32, c: &Channel) -> f32 {
        let t = x * c.mul + c.add;
        let t = t.max(self.act[0]).min(self.act[1]);
        let t = (t * c.q).max(self.q_clamp[0]).min(self.q_clamp[1]);
        (t + self.magic) - self.magic
    }
}

/// The quantize chain the INT8 lowering writes, as one op: see the module's text.
#[derive(Clone, Debug, PartialEq)]
pub struct Requantize {
    /// The input is the i32 accumulator (converted to f32 first), else f32.
    from_i32: bool,
    /// The axis the constants run along (one [`Channel`] per index), if they vary.
    axis: Option<usize>,
    /// One per index of `axis`, or one (`mul` 1 and `add` 0 where the graph has no such step).
    channels: Arc<Vec<Channel>>,
    steps: Steps,
}

// The constants are finite numbers from the graph: equality is reflexive for them.
impl Eq for Requantize {}

/// Where a [`Requantize`] sits in the graph: its input, and the node whose output it replaces.
struct Chain {
    input: OutletId,
    last: usize,
}

impl Requantize {
    /// The fused op for the quantize chain ending at `sub`, the `Sub` of the rounding trick,
    /// walking back to where the chain starts and on to its cast or dequantize.
    fn for_chain(model: &TypedModel, sub: &TypedNode) -> TractResult<Option<(Requantize, Chain)>> {
        // Walks back from `node`: the node producing its data input, with the constant of
        // `node` when it is a binary op by one, and when that producer feeds only `node`.
        let back = |node: &TypedNode| -> TractResult<Option<(&TypedNode, Bin, Arc<Tensor>)>> {
            let Some(&input) = node.inputs.first() else {
                return Ok(None);
            };
            let Some((bin, k)) = bin_by_constant(model, node, input)? else {
                return Ok(None);
            };
            Ok(Some((model.node(input.node), bin, k)))
        };
        let single = |n: &TypedNode| -> TractResult<bool> {
            Ok(sole_consumer(model, OutletId::new(n.id, 0))?.is_some())
        };
        // The required tail: Mul(1/scale) -> Max -> Min -> Add(magic) -> Sub(magic).
        let (mut tail, mut q) = (vec![], None);
        let mut node = sub;
        for want in [Bin::Sub, Bin::Add, Bin::Min, Bin::Max, Bin::Mul] {
            let Some((prev, bin, k)) = back(node)? else {
                return Ok(None);
            };
            if bin != want || (want != Bin::Mul && !single(prev)?) {
                return Ok(None);
            }
            if want == Bin::Mul {
                q = Some(k);
                break;
            }
            let Some(v) = scalar(&k) else {
                return Ok(None);
            };
            tail.push(v);
            node = prev;
        }
        let [magic, magic_add, q_hi, q_lo] = tail[..] else {
            return Ok(None);
        };
        if magic != magic_add {
            return Ok(None);
        }
        // `node` is the Mul(1/scale); its input starts the chain unless more steps precede it
        // in this order: [Cast i32->f32] -> [Mul] -> [Add] -> [Max] -> [Min].
        let mut act = [f32::NEG_INFINITY, f32::INFINITY];
        let (mut mul, mut add): (Option<Arc<Tensor>>, Option<Arc<Tensor>>) = (None, None);
        let mut allowed = [Bin::Min, Bin::Max, Bin::Add, Bin::Mul].as_slice();
        let mut first = node;
        while let Some(input) = first.inputs.first() {
            let prev = model.node(input.node);
            if !single(prev)? || prev.outputs.len() != 1 {
                break;
            }
            let Some((_, bin, k)) = back(prev)? else {
                break;
            };
            let Some(at) = allowed.iter().position(|b| *b == bin) else {
                break;
            };
            match bin {
                Bin::Min | Bin::Max => {
                    let Some(v) = scalar(&k) else { break };
                    act[(bin == Bin::Min) as usize] = v;
                }
                Bin::Add => add = Some(k),
                Bin::Mul => mul = Some(k),
                Bin::Sub => break,
            }
            allowed = &allowed[at + 1..];
            first = prev;
        }
        // An i32 accumulator converted just before the chain.
        let mut input = first.inputs[0];
        let mut from_i32 = false;
        let prev = model.node(input.node);
        if let Some(cast) = prev.op_as::<Cast>()
            && cast.to == f32::datum_type()
            && model.outlet_fact(prev.inputs[0])?.datum_type == i32::datum_type()
            && single(prev)?
        {
            input = prev.inputs[0];
            from_i32 = true;
        }
        let Some(shape) = model
            .outlet_fact(input)?
            .shape
            .as_concrete()
            .map(|s| s.to_vec())
        else {
            return Ok(None);
        };
        // The per-channel axis of `mul` and `add`, which must agree.
        let mut axis = None;
        let mut per_axis = |k: &Option<Arc<Tensor>>, default: f32| -> Option<Vec<f32>> {
            let Some(k) = k else {
                return Some(vec![default]);
            };
            let v = k.try_as_plain_ram().ok()?.as_slice::<f32>().ok()?.to_vec();
            if v.len() == 1 {
                return Some(v);
            }
            let offset = shape.len().checked_sub(k.rank())?;
            let varying: Vec<usize> = (0..k.rank()).filter(|&a| k.shape()[a] > 1).collect();
            let [a] = varying[..] else { return None };
            let a = a + offset;
            if shape[a] != v.len() || axis.is_some_and(|b| b != a) {
                return None;
            }
            axis = Some(a);
            Some(v)
        };
        let (Some(mul), Some(add), Some(q)) =
            (per_axis(&mul, 1.0), per_axis(&add, 0.0), per_axis(&q, 1.0))
        else {
            return Ok(None);
        };
        let n = axis.map_or(1, |a| shape[a]);
        let at = |v: &[f32], c: usize| if v.len() == n { v[c] } else { v[0] };
        let channels = (0..n)
            .map(|c| Channel {
                mul: at(&mul, c),
                add: at(&add, c),
                q: at(&q, c),
            })
            .collect();
        // What reads the rounded value: the cast to i8, a dequantize, or anything else.
        let mut last = sub.id;
        let mut out_scale = Some(1.0);
        if let Some(next) = sole_consumer(model, OutletId::new(sub.id, 0))? {
            let next = model.node(next);
            // The vector cast truncates; it is `as i8` for the whole numbers of the int8 range.
            if let Some(cast) = next.op_as::<Cast>()
                && cast.to == i8::datum_type()
                && q_lo >= -128.0
                && q_hi <= 127.0
            {
                (last, out_scale) = (next.id, None);
            } else if let Some((Bin::Mul, k)) =
                bin_by_constant(model, next, OutletId::new(sub.id, 0))?
                && let Some(s) = scalar(&k)
            {
                (last, out_scale) = (next.id, Some(s));
            }
        }
        let op = Requantize {
            from_i32,
            axis,
            channels: Arc::new(channels),
            steps: Steps {
                act,
                q_clamp: [q_lo, q_hi],
                magic,
                out_scale,
            },
        };
        Ok(Some((op, Chain { input, last })))
    }

    /// `(outer, channels, inner)`: the input as `outer x channels x inner` blocks.
    fn blocks(&self, shape: &[usize]) -> (usize, usize, usize) {
        match self.axis {
            Some(a) => (
                shape[..a].iter().product(),
                shape[a],
                shape[a + 1..].iter().product(),
            ),
            None => (1, 1, shape.iter().product()),
        }
    }
}

/// Input element types of [`Requantize`].
trait Acc: Copy {
    fn to_f32(self) -> f32;
    /// Eight values as f32.
    ///
    /// # Safety
    /// `p` points to 8 readable values; the CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl Acc for i32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const i32) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: per the trait's contract.
        unsafe { _mm256_cvtepi32_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

impl Acc for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: per the trait's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

/// The output of one block: i8 values, or f32 ones.
enum OutBlock<'a> {
    I8(&'a mut [i8]),
    F32(&'a mut [f32]),
}

/// One block of values sharing `mul` and `add`.
fn requantize_block<T: Acc>(src: &[T], c: &Channel, s: &Steps, out: OutBlock) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { requantize_block_avx2(src, c, s, out) };
        return;
    }
    requantize_tail(src, c, s, out, 0);
}

/// Values `from..` of the block, one at a time.
fn requantize_tail<T: Acc>(src: &[T], c: &Channel, s: &Steps, out: OutBlock, from: usize) {
    let values = src[from..].iter().map(|x| s.scalar(x.to_f32(), c));
    match (out, s.out_scale) {
        (OutBlock::I8(o), _) => o[from..]
            .iter_mut()
            .zip(values)
            .for_each(|(o, t)| *o = t as i8),
        (OutBlock::F32(o), k) => {
            let k = k.unwrap_or(1.0);
            o[from..]
                .iter_mut()
                .zip(values)
                .for_each(|(o, t)| *o = t * k)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn requantize_block_avx2<T: Acc>(src: &[T], c: &Channel, s: &Steps, out: OutBlock) {
    use std::arch::x86_64::*;
    let set = |v: f32| _mm256_set1_ps(v);
    let (m, a, act_lo, act_hi) = (set(c.mul), set(c.add), set(s.act[0]), set(s.act[1]));
    let (q, q_lo, q_hi, magic) = (set(c.q), set(s.q_clamp[0]), set(s.q_clamp[1]), set(s.magic));
    let k = set(s.out_scale.unwrap_or(1.0));
    // The same operations, in the same order, as `Steps::scalar`.
    let step = |x: __m256| {
        let t = _mm256_add_ps(_mm256_mul_ps(x, m), a);
        let t = _mm256_min_ps(_mm256_max_ps(t, act_lo), act_hi);
        let t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(t, q), q_lo), q_hi);
        _mm256_sub_ps(_mm256_add_ps(t, magic), magic)
    };
    let n = src.len();
    let whole = n / 32 * 32;
    // packs work within 128-bit lanes: this puts the 32-bit groups back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for i in (0..whole).step_by(32) {
        // SAFETY: `i + 32 <= n` values are read from `src`.
        let v: [__m256; 4] =
            std::array::from_fn(|j| step(unsafe { T::load8(src.as_ptr().add(i + 8 * j)) }));
        match &out {
            OutBlock::I8(o) => {
                // The values are whole numbers in the int8 range: truncation is exact.
                let [a, b, c, d] = v.map(|v| _mm256_cvttps_epi32(v));
                let ab = _mm256_packs_epi32(a, b);
                let cd = _mm256_packs_epi32(c, d);
                let abcd = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
                // SAFETY: `o` has `n` values, `i + 32 <= n`.
                unsafe { _mm256_storeu_si256(o.as_ptr().add(i) as *mut __m256i, abcd) };
            }
            OutBlock::F32(o) => {
                for (j, v) in v.iter().enumerate() {
                    // SAFETY: `o` has `n` values, `i + 32 <= n`.
                    unsafe {
                        _mm256_storeu_ps(
                            o.as_ptr().add(i + 8 * j) as *mut f32,
                            _mm256_mul_ps(*v, k),
                        )
                    };
                }
            }
        }
    }
    requantize_tail(src, c, s, out, whole);
}

impl Op for Requantize {
    fn name(&self) -> StaticName {
        "Requantize (quantscope)".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "from {}, per-channel axis {:?}, {:?}",
            if self.from_i32 { "i32" } else { "f32" },
            self.axis,
            self.steps
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for Requantize {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        if self.from_i32 {
            self.run(input.try_as_plain_ram()?.as_slice::<i32>()?, input.shape())
        } else {
            self.run(input.try_as_plain_ram()?.as_slice::<f32>()?, input.shape())
        }
    }
}

impl Requantize {
    fn run<T: Acc>(&self, src: &[T], shape: &[usize]) -> TractResult<TVec<TValue>> {
        let (outer, channels, inner) = self.blocks(shape);
        ensure!(
            channels == self.channels.len() && outer * channels * inner == src.len(),
            "Requantize built for {} channels, given shape {shape:?}",
            self.channels.len()
        );
        // Blocks share one channel's constants: a channel's run, or chunks of everything.
        // One thread: this pass over memory ran slower split over tract's pool (DeepLabV3-MNv2
        // on the 16-core Xeon of the GPU machine: 11.8 ms summed at 16 threads, 6.3 ms on one).
        const CHUNK: usize = 16 * 1024;
        let per = if inner >= CHUNK || self.axis.is_some() {
            inner
        } else {
            CHUNK
        };
        let per = per.max(1);
        let c = |k: usize| &self.channels[if self.axis.is_some() { k % channels } else { 0 }];
        let t = match self.steps.out_scale {
            None => {
                let mut out = vec![0i8; src.len()];
                for (k, (o, s)) in out.chunks_mut(per).zip(src.chunks(per)).enumerate() {
                    requantize_block(s, c(k), &self.steps, OutBlock::I8(o));
                }
                tract_ndarray::ArrayD::from_shape_vec(shape, out)?.into_tensor()
            }
            Some(_) => {
                let mut out = vec![0f32; src.len()];
                for (k, (o, s)) in out.chunks_mut(per).zip(src.chunks(per)).enumerate() {
                    requantize_block(s, c(k), &self.steps, OutBlock::F32(o));
                }
                tract_ndarray::ArrayD::from_shape_vec(shape, out)?.into_tensor()
            }
        };
        Ok(tvec!(t.into_tvalue()))
    }
}

impl TypedOp for Requantize {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let want = if self.from_i32 {
            i32::datum_type()
        } else {
            f32::datum_type()
        };
        ensure!(inputs[0].datum_type == want, "Requantize takes {want:?}");
        let shape = inputs[0].shape.clone();
        Ok(tvec!(match self.steps.out_scale {
            None => i8::fact(shape),
            Some(_) => f32::fact(shape),
        }))
    }
}

/// Replaces each quantize chain of a decluttered INT8 model by one [`Requantize`]; returns
/// how many.
pub fn fuse_requantize(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        // Earlier patches may have removed this node.
        if id >= model.nodes().len() {
            continue;
        }
        let node = model.node(id);
        let Some((op, chain)) = Requantize::for_chain(model, node)? else {
            continue;
        };
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, chain.input)?;
        let y = patch.wire_node(format!("{}.requantize", node.name), op, &[x])?[0];
        patch.shunt_outside(model, OutletId::new(chain.last, 0), y)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

/// f32 -> i8 with Rust's `as` semantics (truncate toward zero, saturate, NaN -> 0), the cast
/// that ends every quantize of an INT8 engine. tract's cast is a scalar loop (0.8 ns a value
/// on the 2-core EPYC); this one converts 32 values per AVX2 step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CastF32ToI8;

/// `out[i] = v[i] as i8` for every value.
pub fn f32_to_i8(v: &[f32], out: &mut [i8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { f32_to_i8_avx2(v, out) };
        return;
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o = *x as i8;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn f32_to_i8_avx2(v: &[f32], out: &mut [i8]) {
    use std::arch::x86_64::*;
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    // Clamp (NaN becomes -128 here, then 0 through the ordered mask), truncate to i32.
    let to_i32 = |p: *const f32| {
        // SAFETY: callers pass a pointer to 8 readable f32.
        let x = unsafe { _mm256_loadu_ps(p) };
        let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(x, x);
        let c = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(x, lo), hi), ordered);
        _mm256_cvttps_epi32(c)
    };
    // packs work within 128-bit lanes: this puts the 32-bit groups back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let n = v.len().min(out.len());
    let mut i = 0;
    while i + 32 <= n {
        let p = v[i..].as_ptr();
        // SAFETY: `i + 32 <= n`, so the four loads of 8 and the store of 32 stay in bounds.
        unsafe {
            let ab = _mm256_packs_epi32(to_i32(p), to_i32(p.add(8)));
            let cd = _mm256_packs_epi32(to_i32(p.add(16)), to_i32(p.add(24)));
            let abcd = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
            _mm256_storeu_si256(out[i..].as_mut_ptr() as *mut __m256i, abcd);
        }
        i += 32;
    }
    for (o, x) in out[i..n].iter_mut().zip(&v[i..n]) {
        *o = *x as i8;
    }
}

impl Op for CastF32ToI8 {
    fn name(&self) -> StaticName {
        "Cast f32->i8 (quantscope)".into()
    }

    op_as_typed_op!();
}

impl EvalOp for CastF32ToI8 {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        let v = input.try_as_plain_ram()?.as_slice::<f32>()?;
        let mut out = vec![0i8; v.len()];
        f32_to_i8(v, &mut out);
        let t = tract_ndarray::ArrayD::from_shape_vec(input.shape(), out)?.into_tensor();
        Ok(tvec!(t.into_tvalue()))
    }
}

impl TypedOp for CastF32ToI8 {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(
            inputs[0].datum_type == f32::datum_type(),
            "CastF32ToI8 takes f32"
        );
        Ok(tvec!(i8::fact(inputs[0].shape.clone())))
    }
}

/// Replaces tract's f32 -> i8 casts of an optimized model by [`CastF32ToI8`]; returns how many.
pub fn replace_i8_casts(model: &mut TypedModel) -> TractResult<usize> {
    use tract_onnx::tract_core::ops::cast::Cast;
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(cast) = node.op_as::<Cast>() else {
            continue;
        };
        let input = model.outlet_fact(node.inputs[0])?;
        if cast.to != i8::datum_type() || input.datum_type != f32::datum_type() || !input.is_plain()
        {
            continue;
        }
        let patch = TypedModelPatch::replace_single_op(model, node, &node.inputs, CastF32ToI8)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::super::super::{Probe, TractModel, lower_qdq};
    use super::super::tests::{kernels, output, tract_reference};
    use crate::calib::{Method, Stats};
    use crate::model::testing::{GraphBuilder, values};
    use crate::model::{Model, proto};
    use crate::quant;

    /// conv -> ReLU6 (Clip) -> conv -> ReLU -> 1x1 conv -> residual Add -> ReLU -> 1x1 conv
    /// without bias -> 1x1 conv -> pooled Gemm head: every quantize chain the lowering writes
    /// (after an integer conv with and without an activation, without a bias, where tract
    /// folds the rescale into the quantize's multiply, after a float Add, before the head).
    fn quantizable() -> Model {
        let mut b = GraphBuilder::new(&[1, 3, 20, 20]);
        let c1 = b.conv_bn("stem", "x", 3, 8);
        let lo = b.constant("lo", &[], &[0.0]);
        let hi = b.constant("hi", &[], &[6.0]);
        let r1 = b.op("Clip", "stem.relu6", &[&c1, &lo, &hi]);
        let c2 = b.conv("block.conv1", &r1, 8, 16, 3);
        let r2 = b.op("Relu", "block.relu1", &[&c2]);
        let c3 = b.conv("block.conv2", &r2, 16, 8, 1);
        let add = b.op("Add", "block.add", &[&c3, &r1]);
        let r3 = b.op("Relu", "block.relu2", &[&add]);
        let w = b.random("tail.w", &[12, 8, 1, 1], 0.4);
        let c4 = b.node(
            "Conv",
            "tail.conv1",
            &[&r3, &w],
            vec![proto::ints_attr("kernel_shape", &[1, 1])],
        );
        let c5 = b.conv("tail.conv2", &c4, 12, 8, 1);
        let y = b.head(&c5, 8, 10);
        b.output(&y);
        b.model()
    }

    /// The lowered (integer) INT8 graph of `m` at `batch`, calibrated (max) on 4 inputs.
    fn lowered_int8(m: &Model, batch: usize, hw: [usize; 2]) -> tract_onnx::pb::ModelProto {
        let plan = quant::plan(m, &[]);
        let tensors = plan.tensors();
        let probe = Probe::new(m, hw, &tensors).expect("probe");
        let mut stats = Stats::new("test".into(), &tensors);
        for k in 0..4 {
            let x: Vec<f32> = values(m.input_shape(1, hw).iter().product(), 40 + k)
                .iter()
                .map(|v| v * 2.0)
                .collect();
            let (_, acts) = probe.run(&x).expect("probe run");
            stats.add(&tensors, &acts);
        }
        let ranges = stats.ranges(Method::Max, 99.99);
        let qdq = quant::build_qdq(m, &plan, Some(&ranges)).expect("qdq");
        let qdq = Model {
            proto: qdq.proto,
            ..m.clone()
        };
        lower_qdq(&qdq.with_fixed_input(batch, hw))
            .expect("lowered")
            .proto
    }

    #[test]
    fn requantize_gives_tracts_quantize_chains_bit_for_bit() {
        let m = quantizable();
        for batch in [1, 2] {
            let hw = [20, 20];
            let p = lowered_int8(&m, batch, hw);
            let shape = m.input_shape(batch, hw);
            let x: Vec<f32> = values(shape.iter().product(), 3)
                .iter()
                .map(|v| v * 2.5)
                .collect();
            let ours = TractModel::new(&p, shape, &[]).expect("build");
            let kernels = kernels(&ours, &x);
            let fused = kernels
                .iter()
                .filter(|k| k.starts_with("Requantize"))
                .count();
            // The input's; the stem's (read as i8 by the next conv and as f32 by the residual
            // Add: its output stays f32); the next conv's; the residual's; the bias-free
            // conv's; the pooled head input's.
            assert_eq!(fused, 6, "batch {batch}: {fused} fused in {kernels:?}");
            let got = output(&ours, &x);
            let want = tract_reference(&p, shape, &x);
            assert_eq!(got.len(), want.len());
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "batch {batch}: {got:?} vs tract's {want:?}");
        }
    }

    #[test]
    fn requantize_block_vector_and_scalar_paths_agree() {
        // Every length mod 32, a per-channel rescale and bias, both outputs, a clamp that cuts
        // (ReLU6), values that round half to even and saturate.
        let steps = |out_scale| super::Steps {
            act: [0.0, 6.0],
            q_clamp: [-128.0, 127.0],
            magic: 12_582_912.0,
            out_scale,
        };
        let acc: Vec<i32> = values(1000, 8)
            .iter()
            .map(|v| (v * 4000.0) as i32)
            .collect();
        for n in [1000, 999, 31, 33, 64] {
            for out_scale in [None, Some(0.047)] {
                let s = steps(out_scale);
                let c = super::Channel {
                    mul: 0.0021,
                    add: 0.37,
                    q: 127.0 / 6.0,
                };
                let want: Vec<f32> = acc[..n].iter().map(|&x| s.scalar(x as f32, &c)).collect();
                match out_scale {
                    None => {
                        let mut out = vec![0i8; n];
                        super::requantize_block(&acc[..n], &c, &s, super::OutBlock::I8(&mut out));
                        for (o, w) in out.iter().zip(&want) {
                            assert_eq!(*o, *w as i8);
                        }
                        assert!(out.iter().any(|&v| v == 127) && out.iter().any(|&v| v == 0));
                    }
                    Some(k) => {
                        let mut out = vec![0f32; n];
                        super::requantize_block(&acc[..n], &c, &s, super::OutBlock::F32(&mut out));
                        for (o, w) in out.iter().zip(&want) {
                            assert_eq!(o.to_bits(), (w * k).to_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn f32_to_i8_is_the_as_cast() {
        let mut v: Vec<f32> = values(10_000, 9).iter().map(|x| x * 300.0).collect();
        v.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            127.5,
            128.0,
            -128.9,
            -129.0,
            -0.7,
            0.99,
            -0.0,
            1e10,
        ]);
        // Every length mod 32, so the vector loop and the tail both run.
        for n in [v.len(), v.len() - 1, 31, 33, 5] {
            let mut out = vec![0i8; n];
            super::f32_to_i8(&v[..n], &mut out);
            for (o, x) in out.iter().zip(&v) {
                assert_eq!(*o, *x as i8, "{x}");
            }
        }
    }
}
