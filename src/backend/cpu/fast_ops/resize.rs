//! A 2-tap (bilinear / nearest) Resize over the H and W axes of NCHW f32.
//!
//! tract 0.23's `Resize` resamples one axis at a time through a generic loop whose inner
//! length is the product of the axes after it: 1 for W, so every output value of the last
//! axis costs a `fill` and a short loop (18 of 57 ms of DeepLabV3-MNv2 on one core).
//! [`FastResize`] uses the same taps and weights (built once, by tract's own `plan_axis`,
//! when the model is built), W first and then H so that only `in_h` rows need gathers; the
//! results differ from tract's by f32 rounding only (tests compare against tract's op).

use rayon::prelude::*;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::nn::resize::{AxisPlan, Interpolator, Resize};

use super::{on_tract_pool, tract_is_parallel};

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

#[cfg(test)]
mod tests {
    use tract_onnx::pb;

    use super::super::super::TractModel;
    use super::super::tests::{kernels, output, tract_reference};
    use crate::model::proto;
    use crate::model::testing::{GraphBuilder, values};

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
            let kernels = kernels(&ours, &x);
            assert!(
                kernels.iter().any(|k| k.contains("quantscope")),
                "{attrs:?}: our Resize is in the plan: {kernels:?}"
            );
            let got = output(&ours, &x);
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
}
