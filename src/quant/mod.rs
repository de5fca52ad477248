//! Q/DQ placement by TensorRT's explicit-quantization rules, writing the Q/DQ ONNX model and
//! the TensorRT calibration cache. Depends on no backend: backends read the Q/DQ model.

pub mod carried;
pub mod centered;
pub mod fp8;
mod opset;
pub mod rounding;
pub mod testing;

pub use opset::{ensure_opset13, ensure_opset19};

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use prost::Message;
use serde::{Deserialize, Serialize};
use tract_onnx::pb;

use crate::calib::{Method, Ranges};
use crate::model::{Graph, Model, proto};
use crate::precision::Precision;

/// Ops whose inputs are quantized (activation per tensor, weight per output channel).
pub const QUANTIZABLE: [&str; 4] = ["Conv", "ConvTranspose", "Gemm", "MatMul"];

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{0}")]
    Opset(String),
}

/// An activation tensor to quantize and the (node, input slot) pairs that read it quantized.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActQuant {
    pub tensor: String,
    pub uses: Vec<(usize, usize)>,
}

/// A weight initializer quantized per channel along `axis`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightQuant {
    pub tensor: String,
    pub axis: usize,
    pub uses: Vec<(usize, usize)>,
}

/// Where Q/DQ pairs go in a model. Computed once per (model, exclusions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantPlan {
    pub activations: Vec<ActQuant>,
    pub weights: Vec<WeightQuant>,
    /// Names of the Conv/Gemm/MatMul nodes whose inputs are quantized.
    pub quantized_nodes: Vec<String>,
    /// Quantizable nodes left in float, with the reason.
    pub float_nodes: Vec<(String, String)>,
    /// Activation tensors that hold t - c (activation centering, [`centered`]), by tensor: the
    /// readers' biases fold c × Σ(rounded weights) where the float model folds c × Σ(weights).
    #[serde(default)]
    pub centered: BTreeMap<String, f32>,
}

impl QuantPlan {
    /// The activation tensors that need calibration statistics.
    pub fn tensors(&self) -> Vec<String> {
        self.activations.iter().map(|a| a.tensor.clone()).collect()
    }
}

fn is_excluded(node: &pb::NodeProto, exclude: &[String]) -> bool {
    exclude
        .iter()
        .any(|e| e == &node.name || e == &node.op_type)
}

/// Checks that every name the user asked to keep in float (`--exclude`, a plan's `keep_float`)
/// is a node name or an op type of the model: a misspelt name would otherwise be ignored and
/// the layer quantized after all. The error suggests the nearest names.
pub fn check_exclusions(model: &Model, names: &[String], setting: &str) -> Result<(), String> {
    let nodes = &model.graph().node;
    let candidates = nodes
        .iter()
        .flat_map(|n| [n.name.as_str(), n.op_type.as_str()]);
    check_names(model, names, candidates, setting, "a node name or op type")
}

/// Refuses names in `names` that are not activation tensors of `model` (a node's output or the
/// graph's input), with the nearest ones: a per-tensor setting for a misspelt tensor would be
/// ignored without a word.
pub fn check_tensor_names(model: &Model, names: &[String], setting: &str) -> Result<(), String> {
    let g = model.graph();
    let candidates = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(String::as_str))
        .chain(g.input.iter().map(|i| i.name.as_str()));
    check_names(model, names, candidates, setting, "an activation tensor")
}

/// The names in `names` not among `candidates`, refused with up to three near ones.
fn check_names<'a>(
    model: &Model,
    names: &[String],
    candidates: impl Iterator<Item = &'a str>,
    setting: &str,
    what: &str,
) -> Result<(), String> {
    let mut candidates: Vec<&str> = candidates.collect();
    candidates.sort_unstable();
    candidates.dedup();
    let unknown: Vec<&String> = names
        .iter()
        .filter(|e| candidates.binary_search(&e.as_str()).is_err())
        .collect();
    let Some(first) = unknown.first() else {
        return Ok(());
    };
    let mut near: Vec<(f64, &str)> = candidates
        .iter()
        .map(|c| (strsim::normalized_levenshtein(first, c), *c))
        .filter(|(d, _)| *d > 0.4)
        .collect();
    near.sort_by(|a, b| b.0.total_cmp(&a.0));
    let hint = match near.len() {
        0 => "`quantscope inspect MODEL` lists the model's ops".to_string(),
        _ => format!(
            "did you mean {}?",
            near.iter()
                .take(3)
                .map(|(_, c)| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Err(format!(
        "{setting}: {} not {what} of {}: `{}`; {hint}",
        if unknown.len() == 1 { "is" } else { "are" },
        model.path.display(),
        unknown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("`, `"),
    ))
}

/// Places Q/DQ by TensorRT's rules: both inputs of Conv, ConvTranspose, Gemm, MatMul; the
/// residual input of an Add fed by a Conv (so conv + add can fuse); never a graph output
/// (Q/DQ sit on consumer edges only); bias stays float; excluded nodes stay float.
pub fn plan(model: &Model, exclude: &[String]) -> QuantPlan {
    let gp = model.graph();
    let g = Graph::new(gp);
    let mut acts: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
    let mut weights: BTreeMap<String, (usize, Vec<(usize, usize)>)> = BTreeMap::new();
    let mut out = QuantPlan {
        centered: centered::shifts(&model.proto),
        ..Default::default()
    };
    if model.info.prequantized {
        return out;
    }
    let is_float_init = |name: &str| {
        g.initializer(name)
            .is_some_and(|t| crate::model::dtype_is_float(t.data_type))
    };
    for (i, n) in gp.node.iter().enumerate() {
        let quantizable = QUANTIZABLE.contains(&n.op_type.as_str());
        let residual_add = n.op_type == "Add"
            && n.input.len() == 2
            && n.input.iter().all(|t| g.initializer(t).is_none())
            && n.input.iter().any(|t| g.producer_op(t) == Some("Conv"));
        if !(quantizable || residual_add) {
            continue;
        }
        if is_excluded(n, exclude) {
            if quantizable {
                out.float_nodes
                    .push((n.name.clone(), "excluded by the experiment".into()));
            }
            continue;
        }
        if residual_add {
            // The Add fuses into the conv whose output only it reads (TensorRT's conv + add
            // fusion, and the CUDA engine's): that input stays unquantized and the other is
            // quantized. Where both inputs are conv outputs (the first block of each
            // torchvision MobileNetV2 stage adds the previous block's projection, which the
            // next conv also reads), only the private one can fuse.
            let fusable = |t: &String| {
                g.producer_op(t) == Some("Conv")
                    && g.consumers(t).len() == 1
                    && !g.is_graph_output(t)
            };
            let slot = match (fusable(&n.input[0]), fusable(&n.input[1])) {
                (true, _) => 1,
                (false, true) => 0,
                _ if g.producer_op(&n.input[0]) == Some("Conv") => 1,
                _ => 0,
            };
            acts.entry(n.input[slot].clone())
                .or_default()
                .push((i, slot));
            continue;
        }
        if n.input.len() < 2 {
            out.float_nodes
                .push((n.name.clone(), "fewer than two inputs".into()));
            continue;
        }
        for slot in 0..2 {
            let t = &n.input[slot];
            if slot == 1 && is_float_init(t) {
                let axis = weight_axis(n, g.initializer(t).map(|t| t.dims.len()).unwrap_or(0));
                weights
                    .entry(t.clone())
                    .or_insert((axis, vec![]))
                    .1
                    .push((i, slot));
            } else if g.initializer(t).is_none() {
                acts.entry(t.clone()).or_default().push((i, slot));
            } else {
                // A constant data input (rare): quantize it per tensor like an activation.
                acts.entry(t.clone()).or_default().push((i, slot));
            }
        }
        out.quantized_nodes.push(n.name.clone());
    }
    out.activations = acts
        .into_iter()
        .map(|(tensor, uses)| ActQuant { tensor, uses })
        .collect();
    out.weights = weights
        .into_iter()
        .map(|(tensor, (axis, uses))| WeightQuant { tensor, axis, uses })
        .collect();
    out
}

/// The output-channel axis of a weight: 0 for Conv, 1 for ConvTranspose, N's axis for Gemm.
fn weight_axis(n: &pb::NodeProto, rank: usize) -> usize {
    match n.op_type.as_str() {
        "ConvTranspose" => 1,
        "Gemm" => {
            if proto::attr_i(n, "transB").unwrap_or(0) == 1 {
                0
            } else {
                1
            }
        }
        "MatMul" => rank.saturating_sub(1),
        _ => 0,
    }
}

/// Symmetric int8 per-channel quantization of a weight: scale = amax / 127, round half to
/// even, clamp to [-127, 127]. Returns (values, scales).
pub fn quantize_weight(w: &proto::F32Tensor, axis: usize) -> (Vec<i8>, Vec<f32>) {
    quantize_weight_floored(w, axis, &[])
}

/// [`quantize_weight`] with a smallest scale per channel (`floor[c]`; missing entries are no
/// floor).
pub fn quantize_weight_floored(
    w: &proto::F32Tensor,
    axis: usize,
    floor: &[f32],
) -> (Vec<i8>, Vec<f32>) {
    let channels = w.dims.get(axis).copied().unwrap_or(1).max(1);
    let inner: usize = w.dims.iter().skip(axis + 1).product();
    let channel_of = |i: usize| (i / inner.max(1)) % channels;
    let mut amax = vec![0f32; channels];
    for (i, v) in w.data.iter().enumerate() {
        let c = channel_of(i);
        amax[c] = amax[c].max(v.abs());
    }
    let scales: Vec<f32> = amax
        .iter()
        .enumerate()
        .map(|(c, &a)| {
            let s = if a > 0.0 { a / 127.0 } else { 1.0 };
            s.max(floor.get(c).copied().unwrap_or(0.0))
        })
        .collect();
    let q = w
        .data
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (v / scales[channel_of(i)])
                .round_ties_even()
                .clamp(-127.0, 127.0) as i8
        })
        .collect();
    (q, scales)
}

/// The float values of a tensor quantized along `axis`: `values[k]` (its unscaled steps) times
/// its channel's scale, or the one scale of a per-tensor quantization. `None` when the scales
/// match neither.
pub fn dequantize_per_axis(
    values: &[f32],
    dims: &[usize],
    axis: usize,
    scales: &[f32],
) -> Option<Vec<f32>> {
    let channels = dims.get(axis).copied().unwrap_or(1).max(1);
    if scales.len() != 1 && scales.len() != channels {
        return None;
    }
    let inner: usize = dims
        .get(axis + 1..)
        .map_or(1, |d| d.iter().product::<usize>().max(1));
    Some(
        values
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                v * scales[if scales.len() == 1 {
                    0
                } else {
                    (k / inner) % channels
                }]
            })
            .collect(),
    )
}

/// Activation scale from amax (a dead, all-zero tensor gets scale 1: any scale maps 0 to 0).
pub fn act_scale(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / 127.0
    } else {
        1.0
    }
}

/// What a Q/DQ model quantizes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum QFormat {
    /// Symmetric int8 (zero point 0): scale amax / 127; opset 13.
    #[default]
    Int8,
    /// FP8 E4M3 (`float8e4m3fn`, zero point 0): scale amax / 448; opset 19.
    Fp8E4M3,
}

impl QFormat {
    /// The format a quantized precision is built in; `None` for float precisions.
    pub fn of(precision: Precision) -> Option<QFormat> {
        match precision {
            Precision::Int8 => Some(QFormat::Int8),
            Precision::Fp8 => Some(QFormat::Fp8E4M3),
            _ => None,
        }
    }
    pub fn precision(self) -> Precision {
        match self {
            QFormat::Int8 => Precision::Int8,
            QFormat::Fp8E4M3 => Precision::Fp8,
        }
    }
    fn act_scale(self, amax: f32) -> f32 {
        match self {
            QFormat::Int8 => act_scale(amax),
            QFormat::Fp8E4M3 => fp8::act_scale(amax),
        }
    }
}

/// A model with Q/DQ pairs, ready for ONNX Runtime, TensorRT or a backend.
#[derive(Clone, Debug)]
pub struct QdqModel {
    pub proto: pb::ModelProto,
    pub format: QFormat,
    /// Activation tensor -> scale.
    pub scales: BTreeMap<String, f32>,
    pub method: Option<Method>,
    pub plan: QuantPlan,
}

impl QdqModel {
    pub fn to_bytes(&self) -> Vec<u8> {
        self.proto.encode_to_vec()
    }

    pub fn save(&self, path: &Path) -> Result<(), crate::files::OutputError> {
        crate::files::write(path, self.to_bytes())
    }

    /// TensorRT calibration cache: a header line, then `tensor: <hex of the f32 scale>`.
    pub fn calibration_cache(&self) -> String {
        // 8601 = TensorRT 8.6.1, the oldest version whose Q/DQ and cache readers we target.
        let mut s = String::from("TRT-8601-EntropyCalibration2\n");
        for (name, scale) in &self.scales {
            s.push_str(&format!("{name}: {:08x}\n", scale.to_bits()));
        }
        s
    }

    pub fn save_calibration_cache(&self, path: &Path) -> Result<(), crate::files::OutputError> {
        crate::files::write(path, self.calibration_cache())
    }
}

/// Writes int8 Q/DQ into the model per `plan`, with activation scales from `ranges`.
/// A model that already has Q/DQ (QAT) is returned as it is.
pub fn build_qdq(
    model: &Model,
    plan: &QuantPlan,
    ranges: Option<&Ranges>,
) -> Result<QdqModel, QuantError> {
    build_qdq_as(model, plan, ranges, QFormat::Int8)
}

/// [`build_qdq`] quantizing to `format`: the same placement, scales and zero points of that
/// format. FP8 models move to opset 19; a model that already has Q/DQ can only be read as the
/// INT8 it carries.
pub fn build_qdq_as(
    model: &Model,
    plan: &QuantPlan,
    ranges: Option<&Ranges>,
    format: QFormat,
) -> Result<QdqModel, QuantError> {
    let mut p = model.proto.clone();
    if let Some(carried) = carried::carried_format(model) {
        if format != carried {
            return Err(QuantError::Opset(format!(
                "the model already carries its own {} Q/DQ (pre-quantized): its {} row runs \
                 them; {} needs the float model",
                carried.precision(),
                carried.precision(),
                format.precision()
            )));
        }
        return Ok(QdqModel {
            proto: p,
            format,
            scales: BTreeMap::new(),
            method: None,
            plan: plan.clone(),
        });
    }
    match format {
        QFormat::Int8 => opset::ensure_opset13(&mut p),
        QFormat::Fp8E4M3 => opset::ensure_opset19(&mut p),
    }
    .map_err(QuantError::Opset)?;
    let g = p.graph.as_mut().expect("a loaded model has a graph");
    let nodes = std::mem::take(&mut g.node);
    let mut rename: HashMap<(usize, usize), String> = HashMap::new();
    let mut before: BTreeMap<usize, Vec<pb::NodeProto>> = BTreeMap::new();
    let mut scales = BTreeMap::new();
    let zp_name = match format {
        QFormat::Int8 => {
            g.initializer
                .push(proto::i8_tensor("qs_zero_point_i8", &[], &[0]));
            "qs_zero_point_i8"
        }
        QFormat::Fp8E4M3 => {
            g.initializer
                .push(fp8::f8_tensor("qs_zero_point_f8", &[], &[0]));
            "qs_zero_point_f8"
        }
    };

    for a in &plan.activations {
        let amax = ranges
            .and_then(|r| r.amax.get(&a.tensor).copied())
            .unwrap_or(0.0);
        let scale = format.act_scale(amax);
        scales.insert(a.tensor.clone(), scale);
        let s_name = format!("{}_scale", a.tensor);
        let (q, dq) = (
            format!("{}_quantized", a.tensor),
            format!("{}_dequantized", a.tensor),
        );
        g.initializer
            .push(proto::f32_tensor(&s_name, &[], &[scale]));
        let first = a.uses.iter().map(|u| u.0).min().unwrap_or(0);
        let at = before.entry(first).or_default();
        at.push(proto::node(
            "QuantizeLinear",
            &format!("{}_Q", a.tensor),
            &[&a.tensor, &s_name, zp_name],
            &[&q],
            vec![],
        ));
        at.push(proto::node(
            "DequantizeLinear",
            &format!("{}_DQ", a.tensor),
            &[&q, &s_name, zp_name],
            &[&dq],
            vec![],
        ));
        for &u in &a.uses {
            rename.insert(u, dq.clone());
        }
    }
    // Per node, the bias change that makes activation centering exact for its rounded weights.
    let mut folds: HashMap<String, Vec<f32>> = HashMap::new();
    for wq in &plan.weights {
        let Some(w) = g
            .initializer
            .iter()
            .find(|t| t.name == wq.tensor)
            .and_then(proto::tensor_f32)
        else {
            continue;
        };
        let (s_name, z_name, dq) = (
            format!("{}_wscale", wq.tensor),
            format!("{}_wzero", wq.tensor),
            format!("{}_dequantized", wq.tensor),
        );
        let (q_name, s) = match format {
            QFormat::Int8 => {
                let floor = bias_scale_floor(&nodes, g, wq, &scales, ranges);
                let (q, s) = quantize_weight_floored(&w, wq.axis, &floor);
                centered_folds(&nodes, wq, &plan.centered, &w, &q, &s, &mut folds);
                let q_name = format!("{}_int8", wq.tensor);
                g.initializer.push(proto::i8_tensor(&q_name, &w.dims, &q));
                g.initializer
                    .push(proto::i8_tensor(&z_name, &[s.len()], &vec![0; s.len()]));
                (q_name, s)
            }
            // FP8 biases stay float in every runtime: no int32 bias to protect.
            QFormat::Fp8E4M3 => {
                let (q, s) = fp8::quantize_weight(&w, wq.axis);
                let q_name = format!("{}_fp8", wq.tensor);
                g.initializer.push(fp8::f8_tensor(&q_name, &w.dims, &q));
                g.initializer
                    .push(fp8::f8_tensor(&z_name, &[s.len()], &vec![0; s.len()]));
                (q_name, s)
            }
        };
        g.initializer
            .push(proto::f32_tensor(&s_name, &[s.len()], &s));
        let first = wq.uses.iter().map(|u| u.0).min().unwrap_or(0);
        before.entry(first).or_default().push(proto::node(
            "DequantizeLinear",
            &format!("{}_DQ", wq.tensor),
            &[&q_name, &s_name, &z_name],
            &[&dq],
            vec![proto::int_attr("axis", wq.axis as i64)],
        ));
        for &u in &wq.uses {
            rename.insert(u, dq.clone());
        }
    }
    let corrections = ranges.map(|r| &r.bias_correction);
    for (i, mut n) in nodes.into_iter().enumerate() {
        // Only quantized layers carry a quantization shift; layers kept in float keep theirs.
        let bc = corrections
            .and_then(|c| c.get(&n.name))
            .filter(|_| plan.quantized_nodes.contains(&n.name));
        let shift: Option<Vec<f32>> = match (bc, folds.remove(&n.name)) {
            (Some(b), Some(f)) if b.len() == f.len() => {
                Some(b.iter().zip(&f).map(|(x, y)| x + y).collect())
            }
            (Some(b), _) => Some(b.clone()),
            (None, f) => f,
        };
        if let Some(shift) = shift {
            add_to_bias(g, &mut n, &shift, "bias_corrected");
        }
        if let Some(v) = before.remove(&i) {
            g.node.extend(v);
        }
        for (slot, inp) in n.input.iter_mut().enumerate() {
            if let Some(r) = rename.get(&(i, slot)) {
                *inp = r.clone();
            }
        }
        g.node.push(n);
    }
    crate::model::drop_unused_initializers(g);
    Ok(QdqModel {
        proto: p,
        format,
        scales,
        method: ranges.map(|r| r.method),
        plan: plan.clone(),
    })
}

/// For each Conv reading weight `wq` on a centered tensor (shift c), the bias change
/// c × Σ(dequantized - float weights) per output channel, into `folds` by node name: the
/// float model folded c × Σ(float weights), the INT8 engine multiplies by the rounded ones.
fn centered_folds(
    nodes: &[pb::NodeProto],
    wq: &WeightQuant,
    centered: &BTreeMap<String, f32>,
    w: &proto::F32Tensor,
    q: &[i8],
    scales: &[f32],
    folds: &mut HashMap<String, Vec<f32>>,
) {
    for &(i, slot) in &wq.uses {
        let Some(n) = nodes.get(i).filter(|n| n.op_type == "Conv" && slot == 1) else {
            continue;
        };
        let Some(&c) = n.input.first().and_then(|x| centered.get(x)) else {
            continue;
        };
        if let Some(fold) = centered::int8_fold(c, w, q, scales, wq.axis) {
            folds.insert(n.name.clone(), fold);
        }
    }
}

/// Largest |bias / (input scale × weight scale)| a weight scale may give: runtimes that add the
/// bias in int32 (ONNX Runtime's QLinearConv, and its QDQ bias quantization, which runs even at
/// basic graph optimisation) must hold it, with room to spare.
const MAX_INT32_BIAS: f32 = (1u32 << 30) as f32;

/// Per output channel, the smallest weight scale that keeps the node's bias (bias correction
/// included) within [`MAX_INT32_BIAS`] steps of input scale × weight scale. Without it a
/// near-dead channel (weights around 1e-14, as trained models have) gets a scale so small that
/// an int32 bias saturates and that channel's output is wrong in such runtimes; the floor only
/// rounds such weights to 0, which they nearly are. Empty when no use has a float bias.
fn bias_scale_floor(
    nodes: &[pb::NodeProto],
    g: &pb::GraphProto,
    wq: &WeightQuant,
    act_scales: &BTreeMap<String, f32>,
    ranges: Option<&Ranges>,
) -> Vec<f32> {
    let mut floor: Vec<f32> = vec![];
    for &(i, _) in &wq.uses {
        let Some(n) = nodes.get(i) else { continue };
        let (Some(x), Some(b)) = (n.input.first(), n.input.get(2)) else {
            continue;
        };
        let Some(&sx) = act_scales.get(x) else {
            continue;
        };
        let Some(bias) = g
            .initializer
            .iter()
            .find(|t| &t.name == b)
            .and_then(proto::tensor_f32)
        else {
            continue;
        };
        let shift = ranges.and_then(|r| r.bias_correction.get(&n.name));
        floor.resize(floor.len().max(bias.data.len()), 0.0);
        for (c, v) in bias.data.iter().enumerate() {
            let shifted = v.abs() + shift.and_then(|s| s.get(c)).map_or(0.0, |d| d.abs());
            floor[c] = floor[c].max(shifted / (sx * MAX_INT32_BIAS));
        }
    }
    floor
}

/// Adds `shift` (one value per output channel) to the node's float bias, creating the bias
/// when the node has none (Conv and Gemm only). The result is a new initializer
/// `{node}_{tag}` (a bias may be shared), replaced when a shift with the same tag came first.
pub(crate) fn add_to_bias(g: &mut pb::GraphProto, n: &mut pb::NodeProto, shift: &[f32], tag: &str) {
    if !matches!(n.op_type.as_str(), "Conv" | "ConvTranspose" | "Gemm") {
        return;
    }
    let old = n
        .input
        .get(2)
        .filter(|s| !s.is_empty())
        .and_then(|b| g.initializer.iter().find(|t| &t.name == b))
        .and_then(proto::tensor_f32);
    let mut b = old
        .map(|t| t.data)
        .unwrap_or_else(|| vec![0.0; shift.len()]);
    if b.len() != shift.len() {
        return;
    }
    for (v, d) in b.iter_mut().zip(shift) {
        *v += d;
    }
    let name = format!("{}_{tag}", n.name);
    let t = proto::f32_tensor(&name, &[b.len()], &b);
    match g.initializer.iter_mut().find(|i| i.name == name) {
        Some(slot) => *slot = t,
        None => g.initializer.push(t),
    }
    n.input.resize(3, String::new());
    n.input[2] = name;
}

#[cfg(test)]
mod tests;
