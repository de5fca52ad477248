//! Strongly typed exports for TensorRT 10/11 `--stronglyTyped`: an FP16 model (FP16
//! initializers and activations, FP32 graph I/O, numerically sensitive ops kept FP32 with Casts
//! around them, as TensorRT Model Optimizer's AutoCast writes them) and a mixed model (the
//! INT8 Q/DQ model with every layer that is not INT8 in FP16).
//!
//! The rule that keeps a node in FP32 (stated once, here and in the README):
//! 1. its op is numerically sensitive in FP16: exponentials, logarithms, powers, square roots,
//!    reciprocals, softmax, normalisations and reductions ([`SENSITIVE_OPS`]): they overflow
//!    FP16's range (65504) or lose the small differences they are computed from;
//! 2. it is a Resize/Upsample that enlarges any axis more than [`MAX_FP16_UPSCALE`] times:
//!    every output pixel is interpolated from few inputs, so FP16 rounding of the inputs is
//!    spread over large areas of the output;
//! 3. it produces a graph output (the final logits), or feeds one through ops that only
//!    reshape, resize or activate ([`LOGITS_PASS_THROUGH`]), back to the first layer that
//!    computes: the scores users compare are not rounded to FP16;
//! 4. it reads a float constant beyond FP16's range (|v| > 65504), which FP16 would turn into
//!    infinity (AutoCast's `init_max`);
//! 5. in the mixed model, Q/DQ nodes and the layers reading a DequantizeLinear output: at the
//!    opsets quantscope writes (13..18) Q/DQ take FP32 only; TensorRT runs those layers in INT8;
//! 6. the FP16 overflow guard keeps it: its calibrated values leave FP16's safe range
//!    ([`crate::fp16_guard`]; the same list the engines apply).
//!
//! The model's opset is kept (Cast exists in every opset quantscope loads).

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{self, tensor_proto::DataType};

use crate::model::{Graph, Model, proto};
use crate::quant::QdqModel;

/// Ops kept in FP32 by rule 1.
pub const SENSITIVE_OPS: [&str; 22] = [
    "Softmax",
    "LogSoftmax",
    "Exp",
    "Log",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "LayerNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "LpNormalization",
    "MeanVarianceNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
    "CumSum",
    "Einsum",
];

/// Rule 2: a Resize enlarging any axis by more than this is kept in FP32.
pub const MAX_FP16_UPSCALE: f32 = 4.0;

/// Rule 3: ops walked through, back from a graph output, to find the layer producing logits.
pub const LOGITS_PASS_THROUGH: [&str; 14] = [
    "Resize",
    "Upsample",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Softmax",
    "LogSoftmax",
    "Sigmoid",
    "Relu",
    "Clip",
    "ArgMax",
];

/// FP16's largest finite value.
const FP16_MAX: f32 = 65504.0;

/// Ops whose output type is set by an attribute or that accept any input type: their inputs
/// are left as they are and their outputs typed as the op says.
const TYPE_NEUTRAL: [&str; 11] = [
    "Cast",
    "CastLike",
    "Shape",
    "Size",
    "Constant",
    "ConstantOfShape",
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "EyeLike",
];

#[derive(Debug, thiserror::Error)]
pub enum TypedError {
    #[error("{model}: the model has no graph; re-export it from its framework")]
    NoGraph { model: String },
    #[error(
        "{model}: `{tensor}` is a graph output of type {dtype}; the FP16 writer converts float32 models only"
    )]
    NotFloat32 {
        model: String,
        tensor: String,
        dtype: &'static str,
    },
}

/// A node the writer kept in FP32, and the rule that kept it.
pub use crate::fp16_guard::KeptFp32;

/// A strongly typed model and what the writer did to it.
#[derive(Clone, Debug)]
pub struct TypedModel {
    pub proto: pb::ModelProto,
    /// Nodes that compute in FP16.
    pub fp16_nodes: usize,
    /// Layers that read Q/DQ inputs (mixed model only): TensorRT runs them in INT8.
    pub int8_layers: usize,
    /// Nodes kept in FP32 by rules 1–4 and 6 (not counting Q/DQ and INT8 layers).
    pub kept_fp32: Vec<KeptFp32>,
    /// Cast nodes inserted at FP16/FP32 boundaries.
    pub casts: usize,
}

impl TypedModel {
    pub fn to_bytes(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(&self.proto)
    }
}

/// How a node computes in the written model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compute {
    F16,
    F32,
    /// Cast, Shape, Constant...: inputs untouched, output typed by the op.
    Neutral,
}

const FLOAT: i32 = DataType::Float as i32;
const FLOAT16: i32 = DataType::Float16 as i32;

/// The FP16 model of `model` (the prepared graph quantscope's engines run). `shapes` (from
/// [`crate::model::infer_shapes`]) lets rule 2 read a Resize's factor from its `sizes` input;
/// `guard` is the overflow guard's list (rule 6).
pub fn fp16_model(
    model: &Model,
    shapes: Option<&HashMap<String, Vec<usize>>>,
    guard: &[KeptFp32],
) -> Result<TypedModel, TypedError> {
    convert(
        &model.proto,
        &model.path.display().to_string(),
        shapes,
        false,
        guard,
    )
}

/// The mixed model of an INT8 Q/DQ model: layers with Q/DQ inputs as they are (INT8 in
/// TensorRT), every other layer FP16 except those rules 1–4 keep in FP32.
pub fn mixed_model(
    qdq: &QdqModel,
    model_name: &str,
    shapes: Option<&HashMap<String, Vec<usize>>>,
    guard: &[KeptFp32],
) -> Result<TypedModel, TypedError> {
    convert(&qdq.proto, model_name, shapes, true, guard)
}

fn convert(
    p: &pb::ModelProto,
    model_name: &str,
    shapes: Option<&HashMap<String, Vec<usize>>>,
    keep_qdq_fp32: bool,
    guard: &[KeptFp32],
) -> Result<TypedModel, TypedError> {
    let mut out = p.clone();
    let g = out.graph.as_mut().ok_or_else(|| TypedError::NoGraph {
        model: model_name.into(),
    })?;
    let types = proto::tensor_types(g);
    for o in &g.output {
        let t = types.get(&o.name).copied().unwrap_or(FLOAT);
        if !matches!(DataType::try_from(t), Ok(DataType::Float)) && crate::model::dtype_is_float(t)
        {
            return Err(TypedError::NotFloat32 {
                model: model_name.into(),
                tensor: o.name.clone(),
                dtype: proto::data_type_name(t),
            });
        }
    }
    let (compute, kept, int8_layers) = assign(g, &types, shapes, keep_qdq_fp32, guard);

    // What type each (node, input slot) wants for its float32 inputs.
    let wanted = |i: usize, slot: usize, n: &pb::NodeProto| -> Option<i32> {
        match compute[i] {
            Compute::Neutral => None,
            Compute::F32 => Some(FLOAT),
            Compute::F16 if keeps_fp32_slot(&n.op_type, slot) => Some(FLOAT),
            Compute::F16 => Some(FLOAT16),
        }
    };
    // Float initializers become FP16 when every reader wants FP16; one read both ways gets an
    // FP16 copy beside the FP32 original (a constant, not a Cast node TensorRT must fold).
    let mut init_wants: HashMap<String, HashSet<i32>> = HashMap::new();
    let init_names: HashSet<String> = g
        .initializer
        .iter()
        .filter(|t| t.data_type == FLOAT)
        .map(|t| t.name.clone())
        .collect();
    for (i, n) in g.node.iter().enumerate() {
        for (slot, t) in n.input.iter().enumerate() {
            if init_names.contains(t) {
                let w = wanted(i, slot, n).unwrap_or(FLOAT);
                init_wants.entry(t.clone()).or_default().insert(w);
            }
        }
        // A subgraph reads the outer graph's tensors by name, in FP32 (it is kept FP32).
        for t in captured(n) {
            if init_names.contains(&t) {
                init_wants.entry(t).or_default().insert(FLOAT);
            }
        }
    }
    // Current type of each tensor in the written graph.
    let mut cur: HashMap<String, i32> = types.clone();
    let mut copies: HashMap<(String, i32), String> = HashMap::new();
    let graph_inputs: HashSet<String> = g.input.iter().map(|i| i.name.clone()).collect();
    let mut new_inits = vec![];
    for t in g.initializer.iter_mut() {
        let Some(w) = init_wants.get(&t.name) else {
            continue;
        };
        // An initializer that is also a graph input (old exporters) keeps its declared type.
        if graph_inputs.contains(&t.name) || !w.contains(&FLOAT16) {
            continue;
        }
        let Some(f) = proto::tensor_f32(t) else {
            continue;
        };
        let half = f16_tensor(&t.name, &f.dims, &f.data);
        if w.contains(&FLOAT) {
            let name = format!("{}_fp16", t.name);
            copies.insert((t.name.clone(), FLOAT16), name.clone());
            new_inits.push(pb::TensorProto { name, ..half });
        } else {
            *t = half;
            cur.insert(t.name.clone(), FLOAT16);
        }
    }
    g.initializer.extend(new_inits);

    // Emit nodes in order, inserting a Cast before a reader whose wanted type differs.
    let graph_outputs: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
    let mut alias: HashMap<String, String> = HashMap::new();
    let mut casts = 0usize;
    let mut nodes = Vec::with_capacity(g.node.len() * 2);
    for (i, mut n) in std::mem::take(&mut g.node).into_iter().enumerate() {
        // The name a reader wanting `want` (None: either) reads float tensor `orig` under, a
        // Cast emitted before it where the current type differs.
        let mut read_as = |orig: &str, want: Option<i32>, nodes: &mut Vec<pb::NodeProto>| {
            let src = alias.get(orig).cloned().unwrap_or(orig.to_string());
            let have = cur.get(&src).copied().unwrap_or(FLOAT);
            let Some(want) = want.filter(|&w| w != have) else {
                return src;
            };
            let key = (orig.to_string(), want);
            if let Some(c) = copies.get(&key) {
                return c.clone();
            }
            let suffix = if want == FLOAT16 { "fp16" } else { "fp32" };
            let c = format!("{orig}_to_{suffix}");
            nodes.push(proto::node(
                "Cast",
                &format!("{orig}_cast_{suffix}"),
                &[&src],
                &[&c],
                vec![proto::int_attr("to", want as i64)],
            ));
            casts += 1;
            cur.insert(c.clone(), want);
            copies.insert(key, c.clone());
            c
        };
        for slot in 0..n.input.len() {
            let orig = n.input[slot].clone();
            if orig.is_empty() || types.get(&orig) != Some(&FLOAT) {
                continue;
            }
            n.input[slot] = read_as(&orig, wanted(i, slot, &n), &mut nodes);
        }
        // An `If`/`Loop` body reads outer tensors by name: each float one it reads is cast back
        // to FP32 where it went FP16, and the body reads the cast. Without it ONNX Runtime
        // refused SSDlite's FP16 model (an `Add` in an `If` branch bound to float16 and float).
        for orig in captured(&n) {
            if types.get(&orig) == Some(&FLOAT) {
                let name = read_as(&orig, Some(FLOAT), &mut nodes);
                if name != orig {
                    rename_captured(&mut n, &orig, &name);
                }
            }
        }
        if compute[i] == Compute::F16 {
            for o in n.output.iter_mut() {
                if o.is_empty() || types.get(o.as_str()) != Some(&FLOAT) {
                    continue;
                }
                if graph_outputs.contains(o.as_str()) {
                    // Graph outputs stay FP32: the node writes an FP16 copy, a Cast follows.
                    let h = format!("{o}_fp16");
                    alias.insert(o.clone(), h.clone());
                    cur.insert(h.clone(), FLOAT16);
                    *o = h;
                } else {
                    cur.insert(o.clone(), FLOAT16);
                }
            }
        }
        nodes.push(n);
    }
    for o in &g.output {
        if let Some(h) = alias.get(&o.name) {
            nodes.push(proto::node(
                "Cast",
                &format!("{}_cast_fp32", o.name),
                &[h],
                &[&o.name],
                vec![proto::int_attr("to", FLOAT as i64)],
            ));
            casts += 1;
        }
    }
    g.node = nodes;
    // Intermediate value infos carry the old types; ONNX Runtime and TensorRT infer them.
    g.value_info.clear();
    crate::model::drop_unused_initializers(g);
    let fp16_nodes = compute.iter().filter(|c| **c == Compute::F16).count();
    Ok(TypedModel {
        proto: out,
        fp16_nodes,
        int8_layers,
        kept_fp32: kept,
        casts,
    })
}

/// The outer-scope tensors node `n`'s subgraphs read: names their nodes (and theirs, nested)
/// read that the subgraph neither takes as an input nor defines.
fn captured(n: &pb::NodeProto) -> Vec<String> {
    fn reads(g: &pb::GraphProto, out: &mut Vec<String>) {
        let defined: HashSet<&str> = g
            .input
            .iter()
            .map(|i| i.name.as_str())
            .chain(g.initializer.iter().map(|t| t.name.as_str()))
            .chain(
                g.node
                    .iter()
                    .flat_map(|n| n.output.iter().map(String::as_str)),
            )
            .collect();
        let mut inner = vec![];
        for n in &g.node {
            inner.extend(n.input.iter().cloned());
            for a in &n.attribute {
                for sub in a.g.iter().chain(&a.graphs) {
                    reads(sub, &mut inner);
                }
            }
        }
        inner.extend(g.output.iter().map(|o| o.name.clone()));
        for t in inner {
            if !t.is_empty() && !defined.contains(t.as_str()) && !out.contains(&t) {
                out.push(t);
            }
        }
    }
    let mut out = vec![];
    for a in &n.attribute {
        for g in a.g.iter().chain(&a.graphs) {
            reads(g, &mut out);
        }
    }
    out
}

/// Makes node `n`'s subgraphs read outer tensor `from` as `to` (where no scope on the way
/// defines `from` itself).
fn rename_captured(n: &mut pb::NodeProto, from: &str, to: &str) {
    fn in_graph(g: &mut pb::GraphProto, from: &str, to: &str) {
        let defines = g.input.iter().any(|i| i.name == from)
            || g.initializer.iter().any(|t| t.name == from)
            || g.node.iter().any(|n| n.output.iter().any(|o| o == from));
        if defines {
            return;
        }
        for o in g.output.iter_mut().filter(|o| o.name == from) {
            o.name = to.to_string();
        }
        for n in g.node.iter_mut() {
            rename_captured(n, from, to);
            for t in n.input.iter_mut().filter(|t| *t == from) {
                *t = to.to_string();
            }
        }
    }
    for a in n.attribute.iter_mut() {
        for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
            in_graph(g, from, to);
        }
    }
}

/// Input slots that stay FP32 in an FP16 node: Resize's roi and scales (float32 by the spec)
/// and Upsample's scales.
fn keeps_fp32_slot(op: &str, slot: usize) -> bool {
    matches!((op, slot), ("Resize", 1 | 2) | ("Upsample", 1))
}

/// Decides how each node computes; returns the decision, the nodes rules 1–4 and 6 kept in
/// FP32 and the number of INT8 layers (rule 5).
fn assign(
    g: &pb::GraphProto,
    types: &HashMap<String, i32>,
    shapes: Option<&HashMap<String, Vec<usize>>>,
    keep_qdq_fp32: bool,
    guard: &[KeptFp32],
) -> (Vec<Compute>, Vec<KeptFp32>, usize) {
    let guarded: HashMap<&str, &str> = guard
        .iter()
        .map(|k| (k.node.as_str(), k.reason.as_str()))
        .collect();
    let graph = Graph::new(g);
    let logits = logits_nodes(g, &graph);
    let mut compute = vec![Compute::F16; g.node.len()];
    let mut kept = vec![];
    let mut int8_layers = 0;
    let is_float = |t: &String| types.get(t) == Some(&FLOAT);
    for (i, n) in g.node.iter().enumerate() {
        let touches_float = n.input.iter().chain(&n.output).any(is_float);
        if TYPE_NEUTRAL.contains(&n.op_type.as_str()) || !touches_float {
            compute[i] = Compute::Neutral;
            continue;
        }
        let custom = !(n.domain.is_empty() || n.domain == "ai.onnx");
        if matches!(n.op_type.as_str(), "QuantizeLinear" | "DequantizeLinear") {
            compute[i] = Compute::F32;
            continue;
        }
        if keep_qdq_fp32
            && n.input
                .iter()
                .any(|t| graph.producer_op(t) == Some("DequantizeLinear"))
        {
            compute[i] = Compute::F32;
            int8_layers += 1;
            continue;
        }
        let reason = if custom || n.attribute.iter().any(|a| a.g.is_some()) {
            Some("custom-domain op or op with a subgraph: its types are not known here".into())
        } else if SENSITIVE_OPS.contains(&n.op_type.as_str()) {
            Some("numerically sensitive in FP16 (exp/log/pow/normalisation/reduction)".into())
        } else if let Some(f) = upscale(n, &graph, shapes).filter(|f| *f > MAX_FP16_UPSCALE) {
            Some(format!(
                "upsamples {f:.1}x (more than {MAX_FP16_UPSCALE}x): FP16 rounding would spread over large output areas"
            ))
        } else if let Some(why) = logits.get(&i) {
            Some(why.clone())
        } else if reads_beyond_fp16(n, &graph) {
            Some("reads a constant beyond FP16's range (|v| > 65504)".into())
        } else if let Some(why) = guarded.get(n.name.as_str()) {
            Some(format!("overflow guard: {why}"))
        } else {
            None
        };
        if let Some(reason) = reason {
            compute[i] = Compute::F32;
            kept.push(KeptFp32 {
                node: n.name.clone(),
                op: n.op_type.clone(),
                reason,
            });
        }
    }
    (compute, kept, int8_layers)
}

/// Rule 3: the nodes from each graph output back through pass-through ops to the first layer
/// that computes, with the reason.
fn logits_nodes(g: &pb::GraphProto, graph: &Graph) -> HashMap<usize, String> {
    let mut out = HashMap::new();
    for o in &g.output {
        let mut t = o.name.clone();
        // A bound on the walk: real heads are a handful of ops deep.
        for _ in 0..16 {
            let Some(i) = graph.producer(&t) else {
                break;
            };
            let n = graph.node(i);
            out.entry(i).or_insert_with(|| {
                format!("final logits: produces or feeds graph output `{}`", o.name)
            });
            if !LOGITS_PASS_THROUGH.contains(&n.op_type.as_str()) {
                break;
            }
            match n.input.first() {
                Some(x) if graph.initializer(x).is_none() => t = x.clone(),
                _ => break,
            }
        }
    }
    out
}

/// Rule 2: the largest factor a Resize/Upsample enlarges an axis by, from its scales
/// initializer, or from its sizes and the inferred input shape.
fn upscale(
    n: &pb::NodeProto,
    graph: &Graph,
    shapes: Option<&HashMap<String, Vec<usize>>>,
) -> Option<f32> {
    let scales_slot = match n.op_type.as_str() {
        "Upsample" => 1,
        "Resize" if n.input.len() == 2 => 1,
        "Resize" => 2,
        _ => return None,
    };
    let from_scales = n
        .input
        .get(scales_slot)
        .filter(|s| !s.is_empty())
        .and_then(|s| graph.initializer(s))
        .and_then(proto::tensor_f32)
        .filter(|t| !t.is_empty())
        .map(|t| t.data.iter().copied().fold(0f32, f32::max));
    if from_scales.is_some() {
        return from_scales;
    }
    let sizes = n
        .input
        .get(3)
        .filter(|s| !s.is_empty())
        .and_then(|s| graph.initializer(s))
        .and_then(proto::tensor_i64)?;
    let input = shapes?.get(n.input.first()?)?;
    (input.len() == sizes.len()).then(|| {
        sizes
            .iter()
            .zip(input)
            .map(|(&o, &i)| o as f32 / (i.max(1)) as f32)
            .fold(0f32, f32::max)
    })
}

/// Rule 4: the node reads a float initializer with a value FP16 cannot hold.
fn reads_beyond_fp16(n: &pb::NodeProto, graph: &Graph) -> bool {
    n.input.iter().enumerate().any(|(slot, t)| {
        !keeps_fp32_slot(&n.op_type, slot)
            && graph
                .initializer(t)
                .filter(|t| t.data_type == FLOAT)
                .and_then(proto::tensor_f32)
                .is_some_and(|t| t.data.iter().any(|v| v.abs() > FP16_MAX))
    })
}

/// An FP16 initializer (round to nearest even, as `half` does).
fn f16_tensor(name: &str, dims: &[usize], data: &[f32]) -> pb::TensorProto {
    pb::TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: FLOAT16,
        raw_data: data
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
