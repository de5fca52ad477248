//! Data-aware weight rounding (GPTQ; Frantar et al., 2023, "OPTQ: accurate quantization for
//! generative pre-trained transformers"), for the INT8 engines. Each quantized layer's weights
//! are rounded to the int8 grid of their usual scale (max |w| per output channel / 127) one
//! input column at a time, the inputs with the most energy first (act order), and each column's
//! rounding error is pushed onto the columns not yet rounded through the inverse of H = Σ x xᵀ,
//! the second moment of the layer's inputs over the calibration images. What stays closest to
//! FP32 is the layer's output, not each weight.
//!
//! Each channel's largest weight keeps ±127 (no error is pushed onto it), so the scales do not
//! move: the result is written back into the model as values on the int8 grid, and the Q/DQ
//! model, its calibration cache and TensorRT see ordinary per-channel int8 weights.
//!
//! This module does the arithmetic; `prepare` runs the FP32 model to feed it activations.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tract_onnx::pb;

use crate::model::{Layout, Model, proto};
use crate::quant::QuantPlan;

/// How the INT8 engines' weights are rounded to int8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WeightRounding {
    /// Each weight to its nearest int8 step (TensorRT's and ONNX Runtime's quantizers).
    #[default]
    Nearest,
    /// GPTQ: rounded together, so each layer's output stays closest to FP32 on the
    /// calibration images.
    Gptq,
}

impl WeightRounding {
    pub const ALL: [WeightRounding; 2] = [WeightRounding::Nearest, WeightRounding::Gptq];

    pub fn name(self) -> &'static str {
        match self {
            WeightRounding::Nearest => "nearest",
            WeightRounding::Gptq => "gptq",
        }
    }
}

/// The input samples per layer used for H: enough for a well-conditioned d×d moment (d = one
/// output channel's weights), bounded so that a 4608-wide layer costs seconds, not minutes.
fn samples_for(d: usize) -> usize {
    (4 * d).clamp(1024, 8192)
}

/// Damping added to H's diagonal, as a share of its mean (GPTQ's default).
const DAMP: f64 = 0.01;

/// Widest row rounded this way; wider layers keep round-to-nearest (H alone would be 170 MB).
pub const MAX_ROW: usize = 4608;

/// How a layer's input is cut into rows of H.
#[derive(Clone, Debug)]
enum Shape {
    /// NCHW conv: `groups` independent problems, each over `cin_g * kh * kw` inputs.
    Conv {
        groups: usize,
        cin_g: usize,
        cout_g: usize,
        k: [usize; 2],
        stride: [usize; 2],
        pads: [usize; 4],
        dil: [usize; 2],
        in_hw: [usize; 2],
        out_hw: [usize; 2],
    },
    /// Gemm / MatMul: the input's last axis (`k` wide) against `n` outputs; `b_nk`: the
    /// weight is stored [n, k] (Gemm transB = 1), else [k, n].
    Dense { k: usize, n: usize, b_nk: bool },
}

/// One layer whose weights are rounded this way.
#[derive(Clone, Debug)]
pub struct Layer {
    pub node: String,
    pub weight: String,
    /// The activation tensor the layer reads (its H comes from it).
    pub input: String,
    /// The shift c when `input` is centered (holds t - c, see `prepare::center`), else 0. The
    /// INT8 engine's rounding error meets t (the bias folds c × Σ rounded weights), so H is
    /// taken on t and the bias absorbs c × Σ(rounded - float).
    pub center: f32,
    shape: Shape,
}

impl Layer {
    /// Length of one row (one output channel's weights).
    fn row(&self) -> usize {
        match &self.shape {
            Shape::Conv { cin_g, k, .. } => cin_g * k[0] * k[1],
            Shape::Dense { k, .. } => *k,
        }
    }

    fn problems(&self) -> usize {
        match &self.shape {
            Shape::Conv { groups, .. } => *groups,
            Shape::Dense { .. } => 1,
        }
    }

    /// Bytes of this layer's H matrices.
    pub fn h_bytes(&self) -> usize {
        self.problems() * self.row() * self.row() * 8
    }
}

/// The layers of `plan` this rounding applies to, and, for the others, why not: a weight read
/// by one Conv (NCHW, 2-D), Gemm (transA = 0) or 2-D-weight MatMul, whose input shape is known.
pub fn layers(
    model: &Model,
    plan: &QuantPlan,
    shapes: &HashMap<String, Vec<usize>>,
) -> (Vec<Layer>, Vec<(String, String)>) {
    let g = model.graph();
    let (mut out, mut skipped) = (vec![], vec![]);
    for wq in &plan.weights {
        let [(i, 1)] = wq.uses[..] else {
            continue;
        };
        let Some(n) = g.node.get(i) else { continue };
        let skip = |why: &str| (n.name.clone(), why.to_string());
        let (Some(x), Some(w)) = (
            n.input.first().and_then(|x| shapes.get(x).map(|s| (x, s))),
            model.initializer(&wq.tensor),
        ) else {
            skipped.push(skip("input shape unknown"));
            continue;
        };
        let shape = match (n.op_type.as_str(), w.dims.as_slice()) {
            ("Conv", &[cout, cin_g, kh, kw]) if model.info.layout == Layout::Nchw => {
                let ints = |name: &str, default: &[i64]| {
                    proto::attr_ints(n, name).unwrap_or_else(|| default.to_vec())
                };
                let groups = proto::attr_i(n, "group").unwrap_or(1).max(1) as usize;
                let stride = ints("strides", &[1, 1]);
                let pads = ints("pads", &[0, 0, 0, 0]);
                let dil = ints("dilations", &[1, 1]);
                let out = n.output.first().and_then(|o| shapes.get(o));
                let auto_pad = proto::attr_str(n, "auto_pad").unwrap_or_default();
                match (x.1.as_slice(), out.map(|o| o.as_slice())) {
                    (&[1, _, h, w], Some(&[1, _, oh, ow]))
                        if stride.len() == 2
                            && pads.len() == 4
                            && dil.len() == 2
                            && cout % groups == 0
                            && (auto_pad.is_empty() || auto_pad == "NOTSET") =>
                    {
                        let u = |v: i64| v.max(0) as usize;
                        Shape::Conv {
                            groups,
                            cin_g,
                            cout_g: cout / groups,
                            k: [kh, kw],
                            stride: [u(stride[0]).max(1), u(stride[1]).max(1)],
                            pads: [u(pads[0]), u(pads[1]), u(pads[2]), u(pads[3])],
                            dil: [u(dil[0]).max(1), u(dil[1]).max(1)],
                            in_hw: [h, w],
                            out_hw: [oh, ow],
                        }
                    }
                    _ => {
                        skipped.push(skip("conv shape or padding not handled"));
                        continue;
                    }
                }
            }
            ("Gemm", &[a, b]) if proto::attr_i(n, "transA").unwrap_or(0) == 0 => {
                let b_nk = proto::attr_i(n, "transB").unwrap_or(0) == 1;
                let (k, n_out) = if b_nk { (b, a) } else { (a, b) };
                Shape::Dense { k, n: n_out, b_nk }
            }
            ("MatMul", &[k, n_out]) => Shape::Dense {
                k,
                n: n_out,
                b_nk: false,
            },
            _ => {
                skipped.push(skip("not a Conv, Gemm or MatMul with a 2-D weight"));
                continue;
            }
        };
        let center = match shape {
            Shape::Conv { .. } => plan.centered.get(x.0).copied().unwrap_or(0.0),
            Shape::Dense { .. } => 0.0,
        };
        let layer = Layer {
            node: n.name.clone(),
            weight: wq.tensor.clone(),
            input: x.0.clone(),
            center,
            shape,
        };
        if layer.row() > MAX_ROW {
            skipped.push(skip(&format!(
                "rows of {} weights, over {MAX_ROW}",
                layer.row()
            )));
            continue;
        }
        out.push(layer);
    }
    (out, skipped)
}

/// H of each of a layer's problems (d×d, f64), summed over images.
pub struct Moments {
    pub h: Vec<Vec<f64>>,
    pub images: usize,
}

impl Moments {
    pub fn new(layer: &Layer) -> Moments {
        let d = layer.row();
        Moments {
            h: vec![vec![0.0; d * d]; layer.problems()],
            images: 0,
        }
    }

    /// Adds one image's input to the layer (`x`: the activation, batch 1, NCHW or [.., k]);
    /// `of_images`: how many images will be added in all, to spread the samples.
    pub fn add(&mut self, layer: &Layer, x: &[f32], of_images: usize) {
        let d = layer.row();
        let want = samples_for(d).div_ceil(of_images.max(1)).max(1);
        for (g, h) in self.h.iter_mut().enumerate() {
            let p = samples(layer, x, g, want);
            let rows = p.len() / d.max(1);
            if rows == 0 {
                continue;
            }
            // H += Pᵀ P, P being rows × d, row-major.
            // SAFETY: the pointers cover rows×d (p) and d×d (h) elements with the strides given.
            unsafe {
                matrixmultiply::dgemm(
                    d,
                    rows,
                    d,
                    1.0,
                    p.as_ptr(),
                    1,
                    d as isize,
                    p.as_ptr(),
                    d as isize,
                    1,
                    1.0,
                    h.as_mut_ptr(),
                    d as isize,
                    1,
                );
            }
        }
        self.images += 1;
    }
}

/// Up to `want` input rows (each `layer.row()` long) of problem `g`, taken at evenly spaced
/// output positions: conv patches (zero where padding) or rows of a dense input.
fn samples(layer: &Layer, x: &[f32], g: usize, want: usize) -> Vec<f64> {
    match &layer.shape {
        Shape::Conv {
            cin_g,
            k,
            stride,
            pads,
            dil,
            in_hw,
            out_hw,
            ..
        } => {
            let positions = out_hw[0] * out_hw[1];
            let step = positions.div_ceil(want).max(1);
            let plane = in_hw[0] * in_hw[1];
            let d = cin_g * k[0] * k[1];
            let mut p = Vec::with_capacity(positions.div_ceil(step) * d);
            for pos in (0..positions).step_by(step) {
                let (oy, ox) = (pos / out_hw[1], pos % out_hw[1]);
                for c in 0..*cin_g {
                    let base = (g * cin_g + c) * plane;
                    for ky in 0..k[0] {
                        let iy = (oy * stride[0] + ky * dil[0]) as isize - pads[0] as isize;
                        for kx in 0..k[1] {
                            let ix = (ox * stride[1] + kx * dil[1]) as isize - pads[1] as isize;
                            let inside = (0..in_hw[0] as isize).contains(&iy)
                                && (0..in_hw[1] as isize).contains(&ix);
                            let v = if inside {
                                x.get(base + iy as usize * in_hw[1] + ix as usize)
                                    .copied()
                                    .unwrap_or(0.0)
                                    + layer.center
                            } else {
                                0.0
                            };
                            p.push(v as f64);
                        }
                    }
                }
            }
            p
        }
        Shape::Dense { k, .. } => {
            let rows = x.len() / k.max(&1);
            let step = rows.div_ceil(want).max(1);
            (0..rows)
                .step_by(step)
                .flat_map(|r| x[r * k..(r + 1) * k].iter().map(|&v| v as f64))
                .collect()
        }
    }
}

/// Σ aᵢbᵢ in eight lanes, so the compiler vectorises it (a plain fold keeps its one
/// accumulator's order and does not).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Lower Cholesky factor of the symmetric positive definite `a` (n×n, row-major), in place;
/// `false` when `a` is not positive definite. Column by column, the rows below the diagonal in
/// parallel (each a dot product of two contiguous rows): ResNet-50's 4608-wide layers made
/// the scalar version GPTQ's slowest step.
fn cholesky(a: &mut [f64], n: usize) -> bool {
    for j in 0..n {
        let (top, bottom) = a.split_at_mut((j + 1) * n);
        let row_j = &mut top[j * n..];
        let s = row_j[j] - dot(&row_j[..j], &row_j[..j]);
        if s <= 0.0 || !s.is_finite() {
            return false;
        }
        let l = s.sqrt();
        row_j[j] = l;
        row_j[j + 1..].fill(0.0);
        let row_j = &row_j[..j];
        bottom.par_chunks_mut(n).for_each(|row_i| {
            row_i[j] = (row_i[j] - dot(&row_i[..j], row_j)) / l;
        });
    }
    true
}

/// The upper factor U of H⁻¹ = Uᵀ U that GPTQ steps along, from H (damped in place).
fn inverse_factor(h: &mut [f64], d: usize) -> Option<Vec<f64>> {
    // A column no image ever fed (a dead input) gets a unit diagonal: its weight's rounding
    // then moves nothing else.
    for i in 0..d {
        if h[i * d + i] == 0.0 {
            h[i * d + i] = 1.0;
        }
    }
    let mean = (0..d).map(|i| h[i * d + i]).sum::<f64>() / d.max(1) as f64;
    let mut damp = DAMP * mean;
    for _ in 0..4 {
        let mut l = h.to_vec();
        for i in 0..d {
            l[i * d + i] += damp;
        }
        if cholesky(&mut l, d) {
            // L⁻¹ by columns (each a forward substitution, in parallel), stored transposed:
            // row j of `inv_t` is column j of L⁻¹, zero before j.
            let mut inv_t = vec![0.0; d * d];
            inv_t.par_chunks_mut(d).enumerate().for_each(|(j, x)| {
                x[j] = 1.0 / l[j * d + j];
                for i in j + 1..d {
                    x[i] = -dot(&l[i * d + j..i * d + i], &x[j..i]) / l[i * d + i];
                }
            });
            // H⁻¹ = L⁻ᵀ L⁻¹ = inv_t · inv_tᵀ, as one GEMM.
            let mut hinv = vec![0.0; d * d];
            // SAFETY: inv_t and hinv hold d×d elements; the strides read inv_t row-major as A
            // and column-major as B (its transpose), and write hinv row-major.
            unsafe {
                matrixmultiply::dgemm(
                    d,
                    d,
                    d,
                    1.0,
                    inv_t.as_ptr(),
                    d as isize,
                    1,
                    inv_t.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    hinv.as_mut_ptr(),
                    d as isize,
                    1,
                );
            }
            if cholesky(&mut hinv, d) {
                let mut u = vec![0.0; d * d];
                for i in 0..d {
                    for j in 0..=i {
                        u[j * d + i] = hinv[i * d + j];
                    }
                }
                return Some(u);
            }
        }
        damp = damp * 10.0 + f64::MIN_POSITIVE;
    }
    None
}

/// Rounds one problem's rows (`d` wide, inputs of moment `h`) with GPTQ, columns in order of
/// decreasing H diagonal ("act order", GPTQ's `desc_act`): the inputs with the most energy are
/// rounded first, while the most columns are left to take their error. On DeepLab coco96
/// (../shared, default recipe) it lifted every method: max / percentile / MSE / entropy
/// 40.71 / 40.86 / 41.49 / 41.00 → 41.52 / 41.34 / 41.67 / 41.13 of FP32's 41.70 (README,
/// "GPTQ in act order").
fn round_problem(rows: &mut [f32], d: usize, scales: &[f32], h: &[f64]) -> Result<(), String> {
    let mut perm: Vec<usize> = (0..d).collect();
    perm.sort_by(|&a, &b| h[b * d + b].total_cmp(&h[a * d + a]));
    let mut hp: Vec<f64> = (0..d * d)
        .map(|i| h[perm[i / d] * d + perm[i % d]])
        .collect();
    let u = inverse_factor(&mut hp, d).ok_or("its input moments are not positive definite")?;
    let mut permuted: Vec<f32> = rows
        .chunks(d)
        .flat_map(|r| perm.iter().map(|&j| r[j]))
        .collect();
    round_rows(&mut permuted, d, scales, &u);
    for (r, q) in rows.chunks_mut(d).zip(permuted.chunks(d)) {
        for (i, &j) in perm.iter().enumerate() {
            r[j] = q[i];
        }
    }
    Ok(())
}

/// Rounds each row of `rows` (`d` wide) to multiples of its scale in [-127, 127], GPTQ-style
/// along `u`; each row's largest weight receives no error, so it keeps ±127 and the scale.
fn round_rows(rows: &mut [f32], d: usize, scales: &[f32], u: &[f64]) {
    rows.par_chunks_mut(d)
        .zip(scales.par_iter())
        .for_each(|(row, &s)| {
            if s <= 0.0 || !s.is_finite() {
                return;
            }
            let keep = row
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .map(|(i, _)| i)
                .unwrap_or(0);
            let mut w: Vec<f64> = row.iter().map(|&v| v as f64).collect();
            let s64 = s as f64;
            for j in 0..d {
                let q = (w[j] / s64).round_ties_even().clamp(-127.0, 127.0);
                row[j] = q as f32 * s;
                let e = (w[j] - q * s64) / u[j * d + j];
                for k in j + 1..d {
                    if k != keep {
                        w[k] -= e * u[j * d + k];
                    }
                }
            }
        });
}

/// The float weights GPTQ replaced, by node: what a layer computes in FP32. GPTQ moves each
/// weight to compensate for its neighbours' rounding, which only helps where the layer runs in
/// int8; a layer that a mixed-precision plan keeps in float gets these back
/// ([`FloatWeights::restore`]), and so computes what the FP32 model does.
#[derive(Clone, Debug, Default)]
pub struct FloatWeights {
    /// Per node, the initializers as they were before rounding (its weight, and its bias where
    /// the centering fold changed it).
    by_node: BTreeMap<String, Vec<pb::TensorProto>>,
}

impl FloatWeights {
    /// Records `t` as `node`'s original, unless an earlier original of it is held.
    fn record(&mut self, node: &str, t: &pb::TensorProto) {
        let held = self.by_node.entry(node.to_string()).or_default();
        if !held.iter().any(|h| h.name == t.name) {
            held.push(t.clone());
        }
    }

    /// Nodes whose weights GPTQ changed.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.by_node.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// `model` with the original float weights (and biases) of `nodes` back; nodes GPTQ did
    /// not round are left as they are.
    pub fn restore<'a>(&self, model: &Model, nodes: impl IntoIterator<Item = &'a str>) -> Model {
        let mut out = model.clone();
        let Some(g) = out.proto.graph.as_mut() else {
            return out;
        };
        for t in nodes
            .into_iter()
            .filter_map(|n| self.by_node.get(n))
            .flatten()
        {
            if let Some(slot) = g.initializer.iter_mut().find(|i| i.name == t.name) {
                *slot = t.clone();
            }
        }
        out
    }

    /// The model a mixed-precision plan's Q/DQ is placed on: `model` (the INT8 path's) with
    /// the layers kept in float given their float weights back. Borrowed when none of them
    /// was rounded.
    pub fn for_plan<'m>(&self, model: &'m Model, keep_float: &[String]) -> Cow<'m, Model> {
        match keep_float.iter().any(|n| self.by_node.contains_key(n)) {
            true => Cow::Owned(self.restore(model, keep_float.iter().map(String::as_str))),
            false => Cow::Borrowed(model),
        }
    }

    /// `model` with every rounded layer's float weights back: the FP32 model in the INT8
    /// path's graph (CLE and centering are exact FP32 rewrites), so its tensors are the
    /// reference for the INT8 path's.
    pub fn restore_all(&self, model: &Model) -> Model {
        self.restore(model, self.nodes().collect::<Vec<_>>())
    }
}

/// Rounds `layer`'s weights in `model` with its moments; the weight initializer is replaced by
/// values on the int8 grid, and what it replaced is recorded in `originals`. `Err` says why
/// the layer keeps round-to-nearest.
pub fn round_layer(
    model: &mut pb::ModelProto,
    layer: &Layer,
    m: Moments,
    originals: &mut FloatWeights,
) -> Result<(), String> {
    let g = model.graph.as_mut().ok_or("no graph")?;
    let t = g
        .initializer
        .iter_mut()
        .find(|t| t.name == layer.weight)
        .ok_or("weight not found")?;
    let w = proto::tensor_f32(t).ok_or("weight unreadable")?;
    let d = layer.row();
    // Rows of d weights per output channel, grouped by problem.
    let (mut rows, per_problem) = match &layer.shape {
        Shape::Conv { cout_g, .. } => (w.data.clone(), *cout_g),
        Shape::Dense { k, n, b_nk } => {
            if *b_nk {
                (w.data.clone(), *n)
            } else {
                let mut r = vec![0.0; k * n];
                for (i, v) in w.data.iter().enumerate() {
                    r[(i % n) * k + i / n] = *v;
                }
                (r, *n)
            }
        }
    };
    // The usual per-channel scale (as `quantize_weight` computes it).
    let scales: Vec<f32> = rows
        .chunks(d)
        .map(|r| {
            let a = r.iter().fold(0f32, |m, v| m.max(v.abs()));
            if a > 0.0 { a / 127.0 } else { 0.0 }
        })
        .collect();
    for (p, h) in m.h.iter().enumerate() {
        let span = p * per_problem * d..(p + 1) * per_problem * d;
        round_problem(
            &mut rows[span],
            d,
            &scales[p * per_problem..(p + 1) * per_problem],
            h,
        )?;
    }
    let data = match &layer.shape {
        Shape::Dense { k, n, b_nk: false } => {
            let mut out = vec![0.0; k * n];
            for (i, v) in out.iter_mut().enumerate() {
                *v = rows[(i % n) * k + i / n];
            }
            out
        }
        _ => rows,
    };
    let fold = (layer.center != 0.0).then(|| {
        let channels = w.dims.first().copied().unwrap_or(1);
        crate::quant::centered::rounding_fold(layer.center, &data, &w.data, channels)
    });
    originals.record(&layer.node, t);
    *t = proto::f32_tensor(&layer.weight, &w.dims, &data);
    if let Some(fold) = fold {
        let bias = g
            .node
            .iter()
            .find(|n| n.name == layer.node)
            .and_then(|n| n.input.get(2))
            .filter(|b| !b.is_empty())
            .cloned()
            .ok_or("a centered input's conv has no bias")?;
        let t = g
            .initializer
            .iter_mut()
            .find(|t| t.name == bias)
            .ok_or("bias not found")?;
        originals.record(&layer.node, t);
        let mut b = proto::tensor_f32(t).ok_or("bias unreadable")?;
        b.data.iter_mut().zip(&fold).for_each(|(v, d)| *v += d);
        *t = proto::f32_tensor(&bias, &b.dims, &b.data);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
