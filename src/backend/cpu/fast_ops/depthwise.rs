//! Depthwise convolution (one filter per channel, f32, NCHW or CHW, 2-D), with the clamp of a
//! following ReLU / ReLU6 fused into it.
//!
//! tract 0.23's `DepthWiseConv` walks each output point through its patch zones: 8-10 ms of a
//! MobileNetV2 or DeepLabV3-MNv2 run on one core of the 2-core EPYC, as long as ONNX Runtime's
//! whole FP32 run. [`FastDepthwise`] first lays each channel plane out zero-padded and split
//! into stride phases ([`Layout`]), so that each tap is one constant offset over the whole
//! plane; then 32 outputs at a time accumulate in four AVX2 registers over all the taps, one
//! load, multiply and add per tap and 8 outputs. Each sum is `bias + w0 x0 + w1 x1 + ...` in tap order, with
//! separate multiplies and adds (no FMA), so the AVX2 and the scalar path give the same bits;
//! the results differ from tract's by f32 rounding of the sum's order only.

use rayon::prelude::*;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::cnn::{Conv, KernelFormat};
use tract_onnx::tract_core::ops::konst::Const;

use super::{Bin, bin_by_constant, on_tract_pool, scalar, sole_consumer, tract_is_parallel};

/// Outputs of a row computed together: four AVX2 registers.
const BLOCK: usize = 32;

/// A depthwise convolution with its shapes fixed at build time.
#[derive(Clone, Debug, PartialEq)]
pub struct FastDepthwise {
    channels: usize,
    /// Whether the tensors carry a batch axis (NCHW) or not (CHW, as tract's declutter leaves
    /// a batch of 1 at times).
    has_n: bool,
    in_hw: [usize; 2],
    out_hw: [usize; 2],
    kernel_hw: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    /// Zero rows above and columns left of the input.
    pad_before: [usize; 2],
    /// `channels x kh x kw`.
    weights: Arc<Vec<f32>>,
    /// One per channel.
    bias: Arc<Vec<f32>>,
    /// `min(max(y, lo), hi)` on each output: a following Max / Min by constants (ReLU, ReLU6),
    /// applied in that order as tract would.
    clamp: [f32; 2],
}

// Weights are finite numbers from the model: equality is reflexive for them.
impl Eq for FastDepthwise {}

/// The per-plane layout: the zero-padded input split into `strides[0] x strides[1]` phase
/// planes (phase `(p, q)` holds padded rows `p, p + sh, ...` and columns `q, q + sw, ...`), each
/// `rows x cols` plus `slack` values. Output point `(oy, ox)` of tap `(ky, kx)` then reads phase
/// `(ky dh % sh, kx dw % sw)` at `(oy + ky dh / sh) cols + ox + kx dw / sw`: with outputs
/// numbered `oy cols + ox` (the `cols - out_w` extra ones per row computed and dropped), every
/// tap of a plane is one constant offset, and a block of outputs one contiguous read per tap.
struct Layout {
    rows: usize,
    cols: usize,
    /// Values after each phase plane, so that whole blocks past the last row stay in it.
    slack: usize,
}

impl Layout {
    fn plane_len(&self) -> usize {
        self.rows * self.cols + self.slack
    }

    /// Outputs computed per plane, whole blocks.
    fn flat_len(&self, out_h: usize) -> usize {
        (out_h * self.cols).div_ceil(BLOCK) * BLOCK
    }
}

impl FastDepthwise {
    /// The replacement for the depthwise `Conv` at `node` (f32, 2-D, channel first, one filter
    /// per channel, constant OIHW weights and bias, concrete shapes); `None` keeps tract's op.
    fn for_node(model: &TypedModel, node: &TypedNode) -> TractResult<Option<FastDepthwise>> {
        let Some(conv) = node.op_as::<Conv>() else {
            return Ok(None);
        };
        let spec = &conv.pool_spec;
        let c = spec.input_channels;
        if conv.q_params.is_some()
            || conv.kernel_fmt != KernelFormat::OIHW
            || spec.rank() != 2
            || spec.data_format.c_is_last()
            || c < 2
            || conv.group != c
            || spec.output_channels != c
            || node.inputs.len() != 3
        {
            return Ok(None);
        }
        let input = model.outlet_fact(node.inputs[0])?;
        let Some(shape) = input.shape.as_concrete() else {
            return Ok(None);
        };
        let has_n = spec.data_format.has_n();
        if input.datum_type != f32::datum_type() || shape.len() != 3 + has_n as usize {
            return Ok(None);
        }
        let in_hw = [shape[shape.len() - 2], shape[shape.len() - 1]];
        let konst = |o: OutletId| -> Option<Arc<Tensor>> {
            model.node(o.node).op_as::<Const>().map(|k| k.val().clone())
        };
        let (Some(w), Some(b)) = (konst(node.inputs[1]), konst(node.inputs[2])) else {
            return Ok(None);
        };
        let [kh, kw] = [spec.kernel_shape[0], spec.kernel_shape[1]];
        if w.datum_type() != f32::datum_type()
            || w.shape() != [c, 1, kh, kw]
            || b.datum_type() != f32::datum_type()
            || !(b.len() == c || b.len() == 1)
            || !w.is_plain()
            || !b.is_plain()
        {
            return Ok(None);
        }
        let weights = w.try_as_plain_ram()?.as_slice::<f32>()?.to_vec();
        let bias: Vec<f32> = match b.try_as_plain_ram()?.as_slice::<f32>()? {
            [one] => vec![*one; c],
            all => all.to_vec(),
        };
        let (strides, dilations) = (spec.strides(), spec.dilations());
        let geo = spec
            .padding
            .compute(&in_hw, &spec.kernel_shape, &dilations, &strides);
        let out_hw = [geo[0].convoluted, geo[1].convoluted];
        if [
            out_hw,
            in_hw,
            [kh, kw],
            [strides[0], strides[1]],
            [dilations[0], dilations[1]],
        ]
        .iter()
        .any(|pair| pair.contains(&0))
        {
            return Ok(None);
        }
        Ok(Some(FastDepthwise {
            channels: c,
            has_n,
            in_hw,
            out_hw,
            kernel_hw: [kh, kw],
            strides: [strides[0], strides[1]],
            dilations: [dilations[0], dilations[1]],
            pad_before: [geo[0].pad_before, geo[1].pad_before],
            weights: Arc::new(weights),
            bias: Arc::new(bias),
            clamp: [f32::NEG_INFINITY, f32::INFINITY],
        }))
    }

    fn layout(&self) -> Layout {
        let ([oh, ow], [kh, kw]) = (self.out_hw, self.kernel_hw);
        let ([sh, sw], [dh, dw]) = (self.strides, self.dilations);
        let (shift_h, shift_w) = ((kh - 1) * dh / sh, (kw - 1) * dw / sw);
        Layout {
            rows: oh + shift_h,
            cols: ow + shift_w,
            slack: shift_w + BLOCK,
        }
    }

    /// Lays one input plane (`in_h x in_w`) out as [`Layout`] says. `buf` keeps its zeros
    /// between planes of one run (the padding is at the same places in each), so only the
    /// input values are written.
    fn lay_out(&self, src: &[f32], l: &Layout, buf: &mut Vec<f32>) {
        let ([h, w], [pt, pl], [sh, sw]) = (self.in_hw, self.pad_before, self.strides);
        let len = sh * sw * l.plane_len();
        if buf.len() != len {
            buf.clear();
            buf.resize(len, 0.0);
        }
        for (k, phase) in buf.chunks_exact_mut(l.plane_len()).enumerate() {
            let (p, q) = (k / sw, k % sw);
            // Phase column j reads input column j sw + q - pad_left: j in [j0, j1).
            let j0 = pl.saturating_sub(q).div_ceil(sw);
            let j1 = (w + pl).saturating_sub(q).div_ceil(sw).min(l.cols);
            if j0 >= j1 {
                continue;
            }
            let x0 = j0 * sw + q - pl;
            for (r, row) in phase.chunks_exact_mut(l.cols).take(l.rows).enumerate() {
                let Some(y) = (r * sh + p).checked_sub(pt).filter(|&y| y < h) else {
                    continue;
                };
                let line = &src[y * w + x0..(y + 1) * w];
                let dst = &mut row[j0..j1];
                match sw {
                    1 => dst.copy_from_slice(&line[..dst.len()]),
                    2 => every_other(line, dst),
                    _ => dst
                        .iter_mut()
                        .zip(line.iter().step_by(sw))
                        .for_each(|(d, s)| *d = *s),
                }
            }
        }
    }

    /// One channel plane: `src` is `in_h x in_w`, `dst` is `out_h x out_w`; `buf` and `flat`
    /// are scratch.
    fn plane(
        &self,
        c: usize,
        src: &[f32],
        dst: &mut [f32],
        buf: &mut Vec<f32>,
        flat: &mut Vec<f32>,
    ) {
        let l = self.layout();
        self.lay_out(src, &l, buf);
        let ([kh, kw], [sh, sw], [dh, dw]) = (self.kernel_hw, self.strides, self.dilations);
        let weights = &self.weights[c * kh * kw..][..kh * kw];
        let mut taps: Vec<(usize, f32)> = Vec::with_capacity(kh * kw);
        for ky in 0..kh {
            for kx in 0..kw {
                let phase = (ky * dh % sh) * sw + kx * dw % sw;
                let start = phase * l.plane_len() + (ky * dh / sh) * l.cols + kx * dw / sw;
                taps.push((start, weights[ky * kw + kx]));
            }
        }
        let [oh, ow] = self.out_hw;
        flat.resize(l.flat_len(oh), 0.0);
        blocks(buf, &taps, self.bias[c], self.clamp, flat);
        for (out, row) in dst.chunks_exact_mut(ow).zip(flat.chunks(l.cols)) {
            out.copy_from_slice(&row[..ow]);
        }
    }
}

/// `dst[j] = src[2 j]` for each `j` of `dst` (`src` holds at least `2 dst.len() - 1` values):
/// the columns of one stride-2 phase, 8 per AVX2 shuffle where the scalar loop took most of a
/// stride-2 layer's time.
fn every_other(src: &[f32], dst: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        done = unsafe { every_other_avx2(src, dst) };
    }
    for (d, s) in dst[done..]
        .iter_mut()
        .zip(src[2 * done..].iter().step_by(2))
    {
        *d = *s;
    }
}

/// The whole groups of 8 of [`every_other`]; returns how many values it wrote.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn every_other_avx2(src: &[f32], dst: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let mut j = 0;
    while j + 8 <= dst.len() && 2 * j + 16 <= src.len() {
        // SAFETY: 16 values of `src` from 2 j and 8 of `dst` from j are in bounds (checked).
        unsafe {
            let a = _mm256_loadu_ps(src.as_ptr().add(2 * j));
            let b = _mm256_loadu_ps(src.as_ptr().add(2 * j + 8));
            // [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit pairs in order.
            let even = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
            let even = _mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(even));
            _mm256_storeu_ps(dst.as_mut_ptr().add(j), _mm256_castpd_ps(even));
        }
        j += 8;
    }
    j
}

/// `out[x] = clamp(bias + sum_t w_t * buf[start_t + x])` for each `x` of `out` (whole
/// blocks).
fn blocks(buf: &[f32], taps: &[(usize, f32)], bias: f32, clamp: [f32; 2], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { blocks_avx2(buf, taps, bias, clamp, out) };
        return;
    }
    blocks_scalar(buf, taps, bias, clamp, out);
}

fn blocks_scalar(buf: &[f32], taps: &[(usize, f32)], bias: f32, clamp: [f32; 2], out: &mut [f32]) {
    for (x, o) in out.iter_mut().enumerate() {
        let mut acc = bias;
        for &(start, w) in taps {
            acc = acc + w * buf[start + x];
        }
        *o = acc.max(clamp[0]).min(clamp[1]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn blocks_avx2(
    buf: &[f32],
    taps: &[(usize, f32)],
    bias: f32,
    clamp: [f32; 2],
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (lo, hi) = (_mm256_set1_ps(clamp[0]), _mm256_set1_ps(clamp[1]));
    for (x0, dst) in out.chunks_exact_mut(BLOCK).enumerate() {
        let x0 = x0 * BLOCK;
        let mut acc = [_mm256_set1_ps(bias); BLOCK / 8];
        for &(start, w) in taps {
            let w = _mm256_set1_ps(w);
            let src = &buf[start + x0..][..BLOCK];
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `src` holds BLOCK values (the slice above is bounds-checked).
                let v = unsafe { _mm256_loadu_ps(src.as_ptr().add(8 * k)) };
                *a = _mm256_add_ps(*a, _mm256_mul_ps(w, v));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            let v = _mm256_min_ps(_mm256_max_ps(*a, lo), hi);
            // SAFETY: `dst` holds BLOCK values.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(8 * k), v) };
        }
    }
}

impl Op for FastDepthwise {
    fn name(&self) -> StaticName {
        "DepthwiseConv (quantscope)".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!(
            "{} ch, {:?} -> {:?}, kernel {:?}, strides {:?}, dilations {:?}, clamp {:?}",
            self.channels,
            self.in_hw,
            self.out_hw,
            self.kernel_hw,
            self.strides,
            self.dilations,
            self.clamp
        )])
    }

    op_as_typed_op!();
}

impl EvalOp for FastDepthwise {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let input = args_1!(inputs);
        let shape = input.shape();
        ensure!(
            shape.len() == 3 + self.has_n as usize
                && shape[shape.len() - 3] == self.channels
                && shape[shape.len() - 2..] == self.in_hw,
            "FastDepthwise built for {} channels of {:?}, given {:?}",
            self.channels,
            self.in_hw,
            shape
        );
        let src = input.try_as_plain_ram()?.as_slice::<f32>()?;
        let ([ih, iw], [oh, ow]) = (self.in_hw, self.out_hw);
        let planes = src.len() / (ih * iw);
        let mut out = vec![0f32; planes * oh * ow];
        let work = |(k, (dst, src)): (usize, (&mut [f32], &[f32])), scratch: &mut [Vec<f32>; 2]| {
            let [buf, flat] = scratch;
            self.plane(k % self.channels, src, dst, buf, flat)
        };
        // Each thread takes planes of at least PER_THREAD outputs: small planes one per task
        // spend more on hand-offs than on the sums (seen on 16 cores).
        const PER_THREAD: usize = 32 * 1024;
        let min_planes = PER_THREAD.div_ceil(oh * ow);
        if tract_is_parallel() && planes >= 2 * min_planes {
            on_tract_pool(|| {
                out.par_chunks_mut(oh * ow)
                    .zip(src.par_chunks(ih * iw))
                    .with_min_len(min_planes)
                    .enumerate()
                    .for_each_init(Default::default, |scratch, job| work(job, scratch))
            });
        } else {
            let mut scratch = Default::default();
            for job in out.chunks_mut(oh * ow).zip(src.chunks(ih * iw)).enumerate() {
                work(job, &mut scratch);
            }
        }
        let mut out_shape: TVec<usize> = shape.into();
        let r = out_shape.len();
        out_shape[r - 2..].copy_from_slice(&self.out_hw);
        let t = tract_ndarray::ArrayD::from_shape_vec(&*out_shape, out)?.into_tensor();
        Ok(tvec!(t.into_tvalue()))
    }
}

impl TypedOp for FastDepthwise {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let mut shape: TVec<TDim> = inputs[0].shape.iter().cloned().collect();
        let r = shape.len();
        ensure!(r == 3 + self.has_n as usize, "FastDepthwise: rank {r}");
        shape[r - 2] = self.out_hw[0].to_dim();
        shape[r - 1] = self.out_hw[1].to_dim();
        Ok(tvec!(f32::fact(shape)))
    }
}

/// Replaces every depthwise `Conv` of a decluttered model that [`FastDepthwise`] covers, with
/// the `Max` (then `Min`) by constants that follows it where nothing else reads the conv's
/// output; returns how many.
pub fn replace_depthwise(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(mut op) = FastDepthwise::for_node(model, node)? else {
            continue;
        };
        // The clamp that follows: Max by a constant, then Min by a constant.
        let mut last = id;
        for want_max in [true, false] {
            let Some(next) = sole_consumer(model, OutletId::new(last, 0))? else {
                break;
            };
            let by = bin_by_constant(model, model.node(next), OutletId::new(last, 0))?;
            match by.and_then(|(bin, k)| Some((bin, scalar(&k)?))) {
                Some((Bin::Max, lo)) if want_max => op.clamp[0] = lo,
                Some((Bin::Min, hi)) if !want_max => op.clamp[1] = hi,
                _ => break,
            }
            last = next;
        }
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, node.inputs[0])?;
        let y = patch.wire_node(&node.name, op, &[x])?[0];
        patch.shunt_outside(model, OutletId::new(last, 0), y)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use tract_onnx::pb;

    use super::super::super::TractModel;
    use super::super::tests::{kernels, output, tract_reference};
    use crate::model::proto;
    use crate::model::testing::{GraphBuilder, values};

    /// x (n x c x h x w) -> depthwise Conv (k x k, the given strides, dilations and pads)
    /// -> [Clip(0, 6)].
    fn depthwise_model(
        shape: [usize; 4],
        k: usize,
        stride: usize,
        dilation: usize,
        pads: [i64; 4],
        relu6: bool,
    ) -> pb::ModelProto {
        let c = shape[1];
        let mut b = GraphBuilder::new(&shape);
        let w = b.random("w", &[c, 1, k, k], 0.5);
        let bias = b.random("b", &[c], 0.2);
        let mut y = b.node(
            "Conv",
            "dw",
            &["x", &w, &bias],
            vec![
                proto::ints_attr("kernel_shape", &[k as i64, k as i64]),
                proto::ints_attr("strides", &[stride as i64; 2]),
                proto::ints_attr("dilations", &[dilation as i64; 2]),
                proto::ints_attr("pads", &pads),
                proto::int_attr("group", c as i64),
            ],
        );
        if relu6 {
            let lo = b.constant("lo", &[], &[0.0]);
            let hi = b.constant("hi", &[], &[6.0]);
            y = b.op("Clip", "relu6", &[&y, &lo, &hi]);
        }
        b.output(&y);
        prost::Message::decode(b.to_bytes(13).as_slice()).expect("decodes")
    }

    #[test]
    fn fast_depthwise_matches_tracts_conv_to_float_rounding() {
        // MobileNet's 3x3 stride 1 and 2, DeepLab's dilated ones, a 5x5 (EfficientNet), odd
        // and asymmetric padding, rows longer than one block of 32, a batch of 2.
        let cases: [([usize; 4], usize, usize, usize, [i64; 4], bool); 7] = [
            ([1, 16, 13, 13], 3, 1, 1, [1, 1, 1, 1], true),
            ([1, 8, 37, 41], 3, 2, 1, [1, 1, 1, 1], true),
            ([1, 6, 33, 33], 3, 1, 2, [2, 2, 2, 2], false),
            ([1, 5, 19, 23], 3, 1, 4, [4, 4, 4, 4], true),
            ([2, 4, 20, 70], 5, 2, 1, [2, 2, 2, 2], false),
            ([1, 3, 9, 10], 3, 2, 1, [0, 1, 1, 0], true),
            ([1, 7, 8, 8], 3, 1, 1, [0, 0, 0, 0], false),
        ];
        for (shape, k, s, d, pads, relu6) in cases {
            let p = depthwise_model(shape, k, s, d, pads, relu6);
            let x: Vec<f32> = values(shape.iter().product(), 5)
                .iter()
                .map(|v| v * 4.0)
                .collect();
            let ours = TractModel::new(&p, shape, &[]).expect("build");
            let kernels = kernels(&ours, &x);
            let case = format!("{shape:?} k{k} s{s} d{d} pads {pads:?} relu6 {relu6}");
            assert!(
                kernels.iter().any(|k| k.contains("Depthwise")),
                "{case}: our depthwise conv is in the plan: {kernels:?}"
            );
            // The clamp is fused: nothing else runs.
            assert_eq!(kernels.len(), 1, "{case}: {kernels:?}");
            let got = output(&ours, &x);
            let want = tract_reference(&p, shape, &x);
            assert_eq!(got.len(), want.len(), "{case}");
            // Sums of k*k + 1 terms of at most 4 * 0.5 in magnitude, in another order.
            let bound = (k * k + 1) as f32 * 2.0 * 4.0 * f32::EPSILON;
            let err = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= bound, "{case}: max difference {err} (bound {bound})");
            if relu6 {
                assert!(got.iter().all(|v| (0.0..=6.0).contains(v)), "{case}");
            }
        }
    }
}
