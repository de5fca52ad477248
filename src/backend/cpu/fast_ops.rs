//! Our own kernels for what tract runs slowly, put into tract's graph by rewrites: a 2-tap
//! (bilinear / nearest) Resize over the H and W axes of NCHW f32, the f16 rounding the
//! FP16 engine applies once per layer output, and the f32 -> i8 cast of the INT8 engines.
//!
//! - tract 0.23's `Resize` resamples one axis at a time through a generic loop whose inner
//!   length is the product of the axes after it: 1 for W, so every output value of the last
//!   axis costs a `fill` and a short loop (18 of 57 ms of DeepLabV3-MNv2 on one core).
//!   [`FastResize`] uses the same taps and weights (built once, by tract's own `plan_axis`,
//!   when the model is built), W first and then H so that only `in_h` rows need gathers; the
//!   results differ from tract's by f32 rounding only (tests compare against tract's op).
//! - [`RoundF16`] rounds an f32 tensor to the nearest f16 value in place (round half to even,
//!   as an f32 -> f16 cast does), eight values per F16C instruction pair where the CPU has
//!   F16C (`half` one value at a time elsewhere). One pass per layer output, where a
//!   Cast(f16) -> Cast(f32) pair per ONNX node made two copies.
//! - [`CastF32ToI8`]: the cast that ends each quantize, 32 values per AVX2 step where tract
//!   casts one at a time (casts took 4-17 ms of an INT8 run of the bench models on the 2-core
//!   EPYC, 0.9-2.1 ms with this op).
//!
//! The Resize and the rounding run on the threads of tract's matrix multiplies (its current
//! executor).

use rayon::prelude::*;
use tract_linalg::multithread::{Executor, current_tract_executor};
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::nn::resize::{AxisPlan, Interpolator, Resize};

/// Whether tract runs on several threads. When it does not, our kernels run inline: handing
/// each op to a one-thread pool would cost a context switch per op, which a busy machine
/// turns into milliseconds.
fn tract_is_parallel() -> bool {
    !matches!(current_tract_executor(), Executor::SingleThread)
}

/// Runs `f` (which uses rayon's `par_*` iterators) on tract's rayon pool.
fn on_tract_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match current_tract_executor() {
        Executor::MultiThread(pool) => pool.install(f),
        // rayon's global pool, which `par_*` iterators use outside any `install`.
        _ => f(),
    }
}

/// The two taps of each output index along one axis: `out[x] = w0[x] * in[i0[x]] +
/// w1[x] * in[i1[x]]`, a zero weight's tap skipped (as tract does).
#[derive(Clone, Debug, PartialEq)]
struct Taps {
    i0: Vec<usize>,
    i1: Vec<usize>,
    w0: Vec<f32>,
    w1: Vec<f32>,
}

impl Taps {
    fn from_plan(plan: &AxisPlan) -> Option<Taps> {
        if plan.window != 2 || plan.extrapolated.iter().any(|&e| e) {
            return None;
        }
        let n = plan.extrapolated.len();
        let (mut t, mut x) = (
            Taps {
                i0: Vec::with_capacity(n),
                i1: Vec::with_capacity(n),
                w0: Vec::with_capacity(n),
                w1: Vec::with_capacity(n),
            },
            0,
        );
        while x < n {
            t.i0.push(plan.indices[2 * x]);
            t.i1.push(plan.indices[2 * x + 1]);
            t.w0.push(plan.weights[2 * x]);
            t.w1.push(plan.weights[2 * x + 1]);
            x += 1;
        }
        Some(t)
    }

    /// `out[x] = w0 src[i0] + w1 src[i1]`, without branches: a zero weight's tap adds a zero
    /// (tract skips it; the two differ only where that tap reads an infinity or a NaN).
    #[inline]
    fn apply(&self, src: &[f32], out: &mut [f32]) {
        for ((o, (&i0, &i1)), (&w0, &w1)) in out
            .iter_mut()
            .zip(self.i0.iter().zip(&self.i1))
            .zip(self.w0.iter().zip(&self.w1))
        {
            *o = w0 * src[i0] + w1 * src[i1];
        }
    }
}

/// Resize of the last two axes of a rank-4 f32 tensor with a 2-tap kernel (linear or
/// nearest), shapes fixed at build time.
#[derive(Clone, Debug, PartialEq)]
pub struct FastResize {
    in_hw: [usize; 2],
    out_hw: [usize; 2],
    /// `None`: the axis is not resampled (same length, scale 1).
    rows: Option<Taps>,
    cols: Option<Taps>,
}

// Weights are finite numbers from the plan: equality is reflexive for them.
impl Eq for FastResize {}

impl FastResize {
    /// The replacement for tract's `Resize` at `node`, when its input is a concrete rank-4 f32
    /// tensor, its scales or sizes are constants, the batch and channel axes keep their size
    /// and the kernel has two taps; `None` keeps tract's op.
    pub fn for_node(model: &TypedModel, node: &TypedNode) -> TractResult<Option<FastResize>> {
        let Some(op) = node.op_as::<Resize>() else {
            return Ok(None);
        };
        if op.interpolator == Interpolator::Cubic {
            return Ok(None);
        }
        let input = model.outlet_fact(node.inputs[0])?;
        let Some(shape) = input.shape.as_concrete() else {
            return Ok(None);
        };
        if input.datum_type != f32::datum_type() || shape.len() != 4 {
            return Ok(None);
        }
        let konst = |ix: Option<usize>| -> TractResult<Option<Arc<Tensor>>> {
            Ok(match ix.and_then(|i| node.inputs.get(i)) {
                Some(o) => model.outlet_fact(*o)?.konst.clone(),
                None => None,
            })
        };
        let (scales, sizes) = (
            konst(op.optional_scales_input)?,
            konst(op.optional_sizes_input)?,
        );
        if op.optional_scales_input.is_some() && scales.is_none()
            || op.optional_sizes_input.is_some() && sizes.is_none()
        {
            return Ok(None);
        }
        let out_shape = op.compute_output_shape(shape, scales.as_deref(), sizes.as_deref())?;
        // The per-axis scales exactly as tract's eval derives them.
        let per_axis: Vec<f32> = match scales.as_deref().filter(|s| s.len() == shape.len()) {
            Some(s) => s
                .cast_to::<f32>()?
                .try_as_plain_ram()?
                .as_slice::<f32>()?
                .to_vec(),
            None => out_shape
                .iter()
                .zip(shape)
                .map(|(o, i)| *o as f32 / *i as f32)
                .collect(),
        };
        let untouched = |axis: usize| shape[axis] == out_shape[axis] && per_axis[axis] == 1.0;
        if !untouched(0) || !untouched(1) {
            return Ok(None);
        }
        let taps = |axis: usize| -> Option<Option<Taps>> {
            if untouched(axis) {
                return Some(None);
            }
            Taps::from_plan(&op.plan_axis(per_axis[axis], shape[axis], out_shape[axis])).map(Some)
        };
        let (Some(rows), Some(cols)) = (taps(2), taps(3)) else {
            return Ok(None);
        };
        Ok(Some(FastResize {
            in_hw: [shape[2], shape[3]],
            out_hw: [out_shape[2], out_shape[3]],
            rows,
            cols,
        }))
    }

    /// One channel plane: `src` is `in_h x in_w`, `dst` is `out_h x out_w`, `wide` a scratch
    /// for `in_h x out_w` values. The W taps first, on the `in_h` input rows (the only
    /// gathers), then the H taps, a blend of two whole rows that vectorizes: tract goes H then
    /// W, which rounds differently (by an f32 step or two, as ONNX Runtime's order does too)
    /// and gathers on every output row.
    fn plane(&self, src: &[f32], dst: &mut [f32], wide: &mut Vec<f32>) {
        let [in_h, in_w] = self.in_hw;
        let out_w = self.out_hw[1];
        let wide: &[f32] = match &self.cols {
            None => src,
            Some(t) => {
                wide.resize(in_h * out_w, 0.0);
                for (row, out) in src.chunks_exact(in_w).zip(wide.chunks_exact_mut(out_w)) {
                    t.apply(row, out);
                }
                wide
            }
        };
        let Some(t) = &self.rows else {
            dst.copy_from_slice(&wide[..dst.len()]);
            return;
        };
        for (y, out) in dst.chunks_exact_mut(out_w).enumerate() {
            let (w0, w1) = (t.w0[y], t.w1[y]);
            let a = &wide[t.i0[y] * out_w..][..out_w];
            let b = &wide[t.i1[y] * out_w..][..out_w];
            out.iter_mut()
                .zip(a.iter().zip(b))
                .for_each(|(o, (a, b))| *o = w0 * a + w1 * b);
        }
    }
}

impl Op for FastResize {
    fn name(&self) -> StaticName {
        "Resize (quantscope 2-tap)".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("{:?} -> {:?}", self.in_hw, self.out_hw)])
    }

    op_as_typed_op!();
}

impl EvalOp for FastResize {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        let shape = input.shape();
        ensure!(
            shape.len() == 4 && shape[2..] == self.in_hw,
            "FastResize built for H x W {:?}, given {:?}",
            self.in_hw,
            shape
        );
        let (n, c) = (shape[0], shape[1]);
        let src = input.try_as_plain_ram()?.as_slice::<f32>()?;
        let [in_h, in_w] = self.in_hw;
        let [out_h, out_w] = self.out_hw;
        let mut out = vec![0f32; n * c * out_h * out_w];
        if !out.is_empty() && in_h * in_w > 0 {
            let (out_plane, in_plane) = (out_h * out_w, in_h * in_w);
            if tract_is_parallel() {
                on_tract_pool(|| {
                    out.par_chunks_mut(out_plane)
                        .zip(src.par_chunks(in_plane))
                        .for_each_init(Vec::new, |wide, (dst, src)| self.plane(src, dst, wide))
                });
            } else {
                let mut wide = Vec::new();
                for (dst, src) in out.chunks_mut(out_plane).zip(src.chunks(in_plane)) {
                    self.plane(src, dst, &mut wide);
                }
            }
        }
        let t = tract_ndarray::Array4::from_shape_vec((n, c, out_h, out_w), out)?.into_tensor();
        Ok(tvec!(t.into_tvalue()))
    }
}

impl TypedOp for FastResize {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let s = &inputs[0].shape;
        ensure!(s.rank() == 4, "FastResize takes a rank-4 input");
        Ok(tvec!(f32::fact([
            s[0].clone(),
            s[1].clone(),
            self.out_hw[0].to_dim(),
            self.out_hw[1].to_dim()
        ])))
    }
}

/// Replaces every tract `Resize` that [`FastResize`] covers; returns how many.
pub fn replace_resizes(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        if let Some(op) = FastResize::for_node(model, node)? {
            let patch = TypedModelPatch::replace_single_op(model, node, &node.inputs[..1], op)?;
            patch.apply(model)?;
            done += 1;
        }
    }
    Ok(done)
}

/// Rounds an f32 tensor to f16 values (kept in f32), in place when the value is not shared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundF16;

/// Rounds every value of `v` to the nearest f16 (half to even; overflow to ±inf).
pub fn round_to_f16(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has the features the function is compiled for (checked above).
        unsafe { round_to_f16_f16c(v) };
        return;
    }
    round_to_f16_scalar(v);
}

/// `half`'s conversion, one value at a time (0.8 ns a value on the 2-core EPYC, in cache).
fn round_to_f16_scalar(v: &mut [f32]) {
    for x in v {
        *x = half::f16::from_f32(*x).to_f32();
    }
}

/// Eight values per F16C instruction pair (vcvtps2ph with round-to-nearest-even, then
/// vcvtph2ps): the same results as `half`, several times faster.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn round_to_f16_f16c(v: &mut [f32]) {
    use std::arch::x86_64::{
        _MM_FROUND_TO_NEAREST_INT, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps,
        _mm256_storeu_ps,
    };
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 8 f32; the unaligned load and store stay inside it.
        unsafe {
            let x = _mm256_loadu_ps(c.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    round_to_f16_scalar(chunks.into_remainder());
}

impl Op for RoundF16 {
    fn name(&self) -> StaticName {
        "RoundF16".into()
    }

    op_as_typed_op!();
}

impl EvalOp for RoundF16 {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut t = args_1!(inputs).into_tensor();
        {
            let mut ram = t.try_as_plain_ram_mut()?;
            let v = ram.as_slice_mut::<f32>()?;
            // Big tensors are split over the threads: the pass is bound by memory bandwidth.
            const CHUNK: usize = 1 << 15;
            if v.len() > 2 * CHUNK && tract_is_parallel() {
                on_tract_pool(|| v.par_chunks_mut(CHUNK).for_each(round_to_f16));
            } else {
                round_to_f16(v);
            }
        }
        Ok(tvec!(t.into_tvalue()))
    }
}

impl TypedOp for RoundF16 {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(
            inputs[0].datum_type == f32::datum_type(),
            "RoundF16 takes f32"
        );
        Ok(tvec!(f32::fact(inputs[0].shape.clone())))
    }
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

/// Rounds every f32 constant of a decluttered model to f16 values: the weights of an FP16
/// engine, after tract folded batch norms and the like into them (as TensorRT folds, then
/// converts). Constants read by tract's `Resize` (its scales) keep full precision: they are
/// output sizes, not weights.
pub fn round_constants_to_f16(model: &mut TypedModel) -> TractResult<usize> {
    use tract_onnx::tract_core::ops::konst::Const;
    let mut keep: std::collections::HashSet<usize> = Default::default();
    for node in model.nodes() {
        if node.op_is::<Resize>() {
            keep.extend(node.inputs.iter().skip(1).map(|o| o.node));
        }
    }
    let mut done = 0;
    for id in 0..model.nodes().len() {
        if keep.contains(&id) {
            continue;
        }
        let Some(k) = model.node(id).op_as::<Const>() else {
            continue;
        };
        if k.val().datum_type() != f32::datum_type()
            || k.exotic_fact().is_some()
            || !k.val().is_plain()
        {
            continue;
        }
        let mut t = k.val().as_ref().clone();
        round_to_f16(t.try_as_plain_ram_mut()?.as_slice_mut::<f32>()?);
        let k = Const::new(Arc::new(t))?;
        let fact = k.output_facts(&[])?.remove(0);
        model.node_mut(id).op = Box::new(k);
        model.set_outlet_fact(OutletId::new(id, 0), fact)?;
        done += 1;
    }
    Ok(done)
}

/// Puts a [`RoundF16`] after every node of an optimized model that computes new f32 values
/// (a layer, with whatever tract fused into it), so each layer's output is rounded once, as
/// an FP16 engine stores it; the model's outputs stay as computed (in f32), as before.
/// Ops that only move values (reshapes, slices, concatenations, max pooling) of already
/// rounded inputs are left alone: their outputs are f16 values already.
pub fn round_outputs_to_f16(model: &mut TypedModel) -> TractResult<usize> {
    use tract_onnx::tract_core::ops::array::{Gather, MultiBroadcastTo, Slice, TypedConcat};
    use tract_onnx::tract_core::ops::change_axes::{AxisOp, IntoShape};
    use tract_onnx::tract_core::ops::cnn::{MaxPool, OptMaxPool};
    use tract_onnx::tract_core::ops::konst::Const;
    let outputs: Vec<OutletId> = model.output_outlets()?.to_vec();
    let mut rounded: std::collections::HashSet<OutletId> = Default::default();
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        if node.op_is::<Const>() || node.op_is::<RoundF16>() {
            continue;
        }
        let moves_values = node.op_is::<AxisOp>()
            || node.op_is::<IntoShape>()
            || node.op_is::<Slice>()
            || node.op_is::<TypedConcat>()
            || node.op_is::<MultiBroadcastTo>()
            || node.op_is::<Gather>()
            || node.op_is::<MaxPool>()
            || node.op_is::<OptMaxPool>();
        let is_rounded =
            |i: &OutletId| rounded.contains(i) || model.node(i.node).op_is::<RoundF16>();
        if moves_values && node.inputs.iter().all(is_rounded) {
            rounded.extend((0..node.outputs.len()).map(|s| OutletId::new(id, s)));
            continue;
        }
        for slot in 0..node.outputs.len() {
            let outlet = OutletId::new(id, slot);
            let fact = model.outlet_fact(outlet)?;
            if fact.datum_type != f32::datum_type() || !fact.is_plain() {
                continue;
            }
            if outputs.contains(&outlet) {
                continue;
            }
            let name = format!("{}.round_f16.{slot}", model.node(id).name);
            let mut patch = TypedModelPatch::default();
            let tap = patch.tap_model(model, outlet)?;
            let r = patch.wire_node(name, RoundF16, &[tap])?[0];
            patch.shunt_outside(model, outlet, r)?;
            patch.apply(model)?;
            rounded.insert(outlet);
            done += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use tract_onnx::pb;
    use tract_onnx::prelude::*;

    use super::super::{Numerics, TractModel};
    use crate::backend::{Backend, BuildInput, BuildSpec, Precision};
    use crate::model::proto;
    use crate::model::testing::{GraphBuilder, residual_classifier, values};

    /// `x` (1 x c x h x w) -> Resize to `out_hw` with the given attributes, by `sizes`
    /// (opset 13: roi, scales empty) or by `scales`.
    fn resize_model(
        c: usize,
        hw: [usize; 2],
        out: Result<[usize; 2], [f32; 2]>,
        attrs: &[(&str, &str)],
    ) -> pb::ModelProto {
        let mut b = GraphBuilder::new(&[1, c, hw[0], hw[1]]);
        let g = &mut b.graph;
        g.initializer.push(proto::f32_tensor("roi", &[0], &[]));
        let inputs: Vec<&str> = match out {
            Ok([h, w]) => {
                g.initializer.push(proto::f32_tensor("scales", &[0], &[]));
                g.initializer.push(proto::i64_tensor(
                    "sizes",
                    &[4],
                    &[1, c as i64, h as i64, w as i64],
                ));
                vec!["x", "roi", "scales", "sizes"]
            }
            Err([sh, sw]) => {
                g.initializer
                    .push(proto::f32_tensor("scales", &[4], &[1.0, 1.0, sh, sw]));
                vec!["x", "roi", "scales"]
            }
        };
        let attrs = attrs.iter().map(|(k, v)| proto::str_attr(k, v)).collect();
        g.node
            .push(proto::node("Resize", "resize", &inputs, &["y"], attrs));
        b.output("y");
        let bytes = b.to_bytes(13);
        prost::Message::decode(bytes.as_slice()).expect("decodes")
    }

    /// tract's own pipeline, without our rewrites: the previous implementation.
    fn tract_reference(p: &pb::ModelProto, shape: [usize; 4], x: &[f32]) -> Vec<f32> {
        let mut m = tract_onnx::onnx().parse(p, None).expect("parse").model;
        m.set_input_fact(0, f32::fact(shape).into()).expect("fact");
        let plan = m
            .into_optimized()
            .expect("optimize")
            .into_runnable()
            .expect("plan");
        let t = Tensor::from_shape(&shape, x).expect("tensor");
        let out = plan.run(tvec!(t.into())).expect("run");
        out[0]
            .try_as_plain_ram()
            .expect("ram")
            .as_slice::<f32>()
            .expect("f32")
            .to_vec()
    }

    #[test]
    fn fast_resize_matches_tracts_resize_to_float_rounding() {
        let cases: Vec<(Result<[usize; 2], [f32; 2]>, Vec<(&str, &str)>)> = vec![
            // DeepLab's head: 33 -> 257, half pixel bilinear.
            (
                Ok([257, 257]),
                vec![
                    ("mode", "linear"),
                    ("coordinate_transformation_mode", "half_pixel"),
                ],
            ),
            (
                Ok([40, 23]),
                vec![
                    ("mode", "linear"),
                    ("coordinate_transformation_mode", "align_corners"),
                ],
            ),
            (
                Err([2.0, 2.0]),
                vec![
                    ("mode", "linear"),
                    ("coordinate_transformation_mode", "pytorch_half_pixel"),
                ],
            ),
            // Downsampling, and a broadcast from 1 x 1 (DeepLab's image pooling branch).
            (
                Ok([5, 7]),
                vec![
                    ("mode", "linear"),
                    ("coordinate_transformation_mode", "asymmetric"),
                ],
            ),
            (
                Ok([29, 31]),
                vec![
                    ("mode", "nearest"),
                    ("coordinate_transformation_mode", "asymmetric"),
                    ("nearest_mode", "floor"),
                ],
            ),
        ];
        for (hw, (out, attrs)) in [[33, 33], [9, 11], [6, 5], [13, 17], [1, 1]]
            .into_iter()
            .zip(cases)
        {
            let shape = [1, 3, hw[0], hw[1]];
            let p = resize_model(3, hw, out, &attrs);
            let x = values(shape.iter().product(), 11);
            let ours = TractModel::new(&p, shape, &[]).expect("build");
            let kernels: Vec<String> = ours
                .profile(&x, 1)
                .expect("profile")
                .into_iter()
                .map(|l| l.kernel)
                .collect();
            assert!(
                kernels.iter().any(|k| k.contains("quantscope")),
                "{attrs:?}: our Resize is in the plan: {kernels:?}"
            );
            let got = ours.run_all(&x).expect("run");
            let got = got[0]
                .try_as_plain_ram()
                .expect("ram")
                .as_slice::<f32>()
                .expect("f32")
                .to_vec();
            let want = tract_reference(&p, shape, &x);
            assert_eq!(got.len(), want.len(), "{attrs:?}");
            // Each output is a convex blend of at most four inputs: the two orders of the
            // passes agree to a few f32 steps of the largest input.
            let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 4.0 * f32::EPSILON * scale,
                "{attrs:?} {hw:?} -> {out:?}: max difference {err} (input scale {scale})"
            );
        }
    }

    #[test]
    fn round_to_f16_is_the_f16_cast() {
        let mut v: Vec<f32> = values(5000, 3).iter().map(|x| x * 70_000.0).collect();
        // Ties (half to even), the largest f16, overflow, subnormals, signed zero, NaN.
        v.extend([
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65504.0,
            65520.0,
            -1e9,
            1e-7,
            -3e-8,
            -0.0,
            f32::NAN,
        ]);
        let mut ours = v.clone();
        super::round_to_f16(&mut ours);
        for (o, x) in ours.iter().zip(&v) {
            let want = half::f16::from_f32(*x).to_f32();
            assert!(
                o.to_bits() == want.to_bits() || o.is_nan() && want.is_nan(),
                "{x}: {o} vs {want}"
            );
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

    /// A small segmenter shape: conv-relu6 (Clip), depthwise-free residual, bilinear resize.
    fn segmenter() -> GraphBuilder {
        let mut b = GraphBuilder::new(&[1, 3, 24, 24]);
        let c1 = b.conv_bn("stem", "x", 3, 8);
        let r1 = b.op("Relu", "stem.relu", &[&c1]);
        let c2 = b.conv("block.conv", &r1, 8, 8, 3);
        let add = b.op("Add", "block.add", &[&c2, &r1]);
        let c3 = b.conv("head", &add, 8, 5, 1);
        let g = &mut b.graph;
        g.initializer.push(proto::f32_tensor("roi", &[0], &[]));
        g.initializer.push(proto::f32_tensor("scales", &[0], &[]));
        g.initializer
            .push(proto::i64_tensor("sizes", &[4], &[1, 5, 50, 50]));
        g.node.push(proto::node(
            "Resize",
            "up",
            &[&c3, "roi", "scales", "sizes"],
            &["y"],
            vec![
                proto::str_attr("mode", "linear"),
                proto::str_attr("coordinate_transformation_mode", "half_pixel"),
            ],
        ));
        b.output("y");
        b
    }

    #[test]
    fn fp16_engine_keeps_the_numerics_of_the_cast_simulation() {
        for (name, b, hw) in [
            ("classifier", residual_classifier(10), [16, 16]),
            ("segmenter", segmenter(), [24, 24]),
        ] {
            let model = b.model();
            let spec = BuildSpec { batch: 1, hw };
            let shape = model.input_shape(1, hw);
            let build = |precision| {
                super::super::CpuBackend
                    .build(
                        BuildInput::Float {
                            model: &model,
                            precision,
                        },
                        spec,
                    )
                    .expect("build")
            };
            let x = values(shape.iter().product(), 7);
            let fp32 = build(Precision::Fp32).run(&x).expect("fp32").data;
            let mut fp16 = build(Precision::Fp16);
            assert!(fp16.info().simulated, "{name}: FP16 on the CPU is labelled");
            let ours = fp16.run(&x).expect("fp16").data;
            // The previous simulation: a Cast(f16) -> Cast(f32) pair after every ONNX node.
            let sim = super::super::fp16_simulation(&model, spec).expect("simulation");
            let sim = TractModel::new(&sim, shape, &[]).expect("sim build");
            let sim = sim.run_all(&x).expect("sim run");
            let sim = sim[0]
                .try_as_plain_ram()
                .expect("ram")
                .as_slice::<f32>()
                .expect("f32")
                .to_vec();
            let max = fp32.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err =
                |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let (vs_fp32, vs_sim) = (err(&ours, &fp32), err(&ours, &sim));
            let sim_vs_fp32 = err(&sim, &fp32);
            assert!(vs_fp32 > 0.0, "{name}: rounding to f16 changes the output");
            // Both are FP16 numerics: they differ by a few f16 steps (2^-11 relative) where
            // one rounds a folded batch norm's output once and the other twice, far less than
            // either differs from FP32.
            assert!(
                vs_sim <= 4.0 * max / 2048.0,
                "{name}: new FP16 vs the cast simulation {vs_sim}, output scale {max}"
            );
            assert!(
                vs_fp32 <= 4.0 * sim_vs_fp32.max(max / 2048.0),
                "{name}: FP16 vs FP32 {vs_fp32}, simulation vs FP32 {sim_vs_fp32}"
            );
            // And the work is one rounding op per layer, not two casts per node.
            let kernels: Vec<String> = TractModel::with_numerics(
                &model.with_fixed_input(1, hw),
                shape,
                &[],
                Numerics::Fp16,
            )
            .expect("fp16 model")
            .profile(&x, 1)
            .expect("profile")
            .into_iter()
            .map(|l| l.kernel)
            .collect();
            assert!(kernels.iter().any(|k| k == "RoundF16"), "{kernels:?}");
            assert!(!kernels.iter().any(|k| k == "Cast"), "{kernels:?}");
        }
    }
}
