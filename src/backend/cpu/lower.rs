//! Turns a Q/DQ model into one that computes in int8 on tract's integer kernels.
//!
//! For each Conv / Gemm / MatMul whose inputs are `DequantizeLinear` of int8 data:
//! - when every reader of its output is a `QuantizeLinear` of one scale (directly, or after a
//!   Relu / Clip), it becomes `QLinearConv` writing int8 at that scale (the activation becomes
//!   an int8 clamp: quantization is monotonic, so `Q(relu(y)) = max(Q(y), 0)`), and int8
//!   chains stay int8, as TensorRT fuses conv + bias + ReLU + quantize;
//! - otherwise it becomes `ConvInteger` / `MatMulInteger` (exact i32 accumulation) followed by
//!   one multiply by `x_scale * w_scale[c]` and the float bias, which is what the Q/DQ graph
//!   means, computed without the float rounding of the accumulation.
//! Everything else runs in float and is listed, with the reason, in `float_nodes`.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

use super::float_node;
use crate::backend::FloatNode;
use crate::model::{Graph, proto};

pub struct Lowered {
    pub proto: pb::ModelProto,
    pub int8_nodes: Vec<String>,
    pub float_nodes: Vec<FloatNode>,
}

/// An int8 tensor seen through a DequantizeLinear with zero point 0.
struct Dq {
    int8: String,
    scales: Vec<f32>,
}

fn dq_source(g: &Graph, tensor: &str) -> Option<Dq> {
    let n = g.node(g.producer(tensor)?);
    if n.op_type != "DequantizeLinear" {
        return None;
    }
    let scales = proto::tensor_f32(g.initializer(n.input.get(1)?)?)?.data;
    if let Some(zp) = n.input.get(2).filter(|s| !s.is_empty()) {
        let t = g.initializer(zp)?;
        if t.data_type != pb::tensor_proto::DataType::Int8 as i32
            || proto::tensor_i64(t)?.iter().any(|&v| v != 0)
        {
            return None;
        }
    } else {
        // No zero point means uint8 in ONNX: not the symmetric int8 we lower.
        return None;
    }
    Some(Dq {
        int8: n.input[0].clone(),
        scales,
    })
}

/// The scale of a QuantizeLinear node when it is symmetric int8.
fn q_scale(g: &Graph, n: &pb::NodeProto) -> Option<f32> {
    if n.op_type != "QuantizeLinear" {
        return None;
    }
    let s = proto::tensor_f32(g.initializer(n.input.get(1)?)?)?.data;
    let zp = g.initializer(n.input.get(2)?)?;
    let zero = proto::tensor_i64(zp)?.iter().all(|&v| v == 0);
    (s.len() == 1 && zero && zp.data_type == pb::tensor_proto::DataType::Int8 as i32)
        .then_some(s[0])
}

/// Float bounds of a Relu / Clip node (constant bounds only).
fn activation_bounds(g: &Graph, n: &pb::NodeProto) -> Option<(f32, f32)> {
    match n.op_type.as_str() {
        "Relu" => Some((0.0, f32::INFINITY)),
        "Clip" => {
            let bound = |i: usize, default: f32| match n.input.get(i).filter(|s| !s.is_empty()) {
                None => Some(default),
                Some(name) => proto::tensor_f32(g.initializer(name)?).map(|t| t.data[0]),
            };
            Some((bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?))
        }
        _ => None,
    }
}

/// When `tensor` is read only by int8 QuantizeLinear nodes of one scale, optionally through a
/// single Relu/Clip: (activation node, bounds, the Q nodes, the scale).
fn int8_output(g: &Graph, tensor: &str) -> Option<(Option<usize>, (f32, f32), Vec<usize>, f32)> {
    if g.is_graph_output(tensor) {
        return None;
    }
    let readers = g.consumers(tensor);
    let (act, bounds, q_tensor) = match readers {
        [(i, 0)] if activation_bounds(g, g.node(*i)).is_some() => {
            let a = g.node(*i);
            (Some(*i), activation_bounds(g, a)?, a.output[0].as_str())
        }
        _ => (None, (f32::NEG_INFINITY, f32::INFINITY), tensor),
    };
    if act.is_some() && g.is_graph_output(q_tensor) {
        return None;
    }
    let qs = g.consumers(q_tensor);
    if qs.is_empty() || qs.iter().any(|&(_, slot)| slot != 0) {
        return None;
    }
    let scale = q_scale(g, g.node(qs[0].0))?;
    qs.iter()
        .all(|&(i, _)| q_scale(g, g.node(i)) == Some(scale))
        .then(|| (act, bounds, qs.iter().map(|q| q.0).collect(), scale))
}

/// Lowers `p` (a Q/DQ model with a fixed input). Errors only on a malformed graph.
pub fn lower_qdq(p: &pb::ModelProto) -> Result<Lowered, String> {
    let gp = p.graph.as_ref().ok_or("no graph")?;
    let g = Graph::new(gp);
    let mut inits: Vec<pb::TensorProto> = vec![];
    // Node index -> replacement nodes; nodes in `drop` disappear.
    let mut replace: HashMap<usize, Vec<pb::NodeProto>> = HashMap::new();
    let mut drop: HashSet<usize> = HashSet::new();
    // Tensor renames for readers of removed QuantizeLinear outputs.
    let mut rename: HashMap<String, String> = HashMap::new();
    let mut int8_nodes = vec![];
    let mut float_nodes = vec![];
    let zero_i8 = "lowered_zero_i8".to_string();
    inits.push(proto::i8_tensor(&zero_i8, &[], &[0]));

    for (i, n) in gp.node.iter().enumerate() {
        let op = n.op_type.as_str();
        if op == "QuantizeLinear" || op == "DequantizeLinear" {
            continue;
        }
        if !matches!(op, "Conv" | "Gemm" | "MatMul") {
            if !drop.contains(&i) {
                let reason = if op == "ConvTranspose" {
                    "no integer ConvTranspose kernel in tract: runs in float"
                } else {
                    "no int8 form for this op on the CPU backend: runs in float"
                };
                float_nodes.push(float_node(n, reason));
            }
            continue;
        }
        let (Some(x), Some(w)) = (
            dq_source(&g, &n.input[0]),
            n.input.get(1).and_then(|t| dq_source(&g, t)),
        ) else {
            float_nodes.push(float_node(
                n,
                "inputs are not quantized (excluded, or not a symmetric int8 Q/DQ pattern)",
            ));
            continue;
        };
        if x.scales.len() != 1 {
            float_nodes.push(float_node(
                n,
                "activation quantized per channel: no integer kernel for it",
            ));
            continue;
        }
        let w_init = g.initializer(&w.int8);
        let name = &n.name;
        let out = n.output[0].clone();
        let bias = n
            .input
            .get(2)
            .filter(|s| !s.is_empty())
            .and_then(|b| g.initializer(b))
            .and_then(proto::tensor_f32);
        let mut new_nodes = vec![];
        match op {
            "Conv" => {
                let Some(w_t) = w_init else {
                    float_nodes.push(float_node(n, "weight is not a constant"));
                    continue;
                };
                let c = w_t.dims[0] as usize;
                let ws: Vec<f32> = if w.scales.len() == 1 {
                    vec![w.scales[0]; c]
                } else {
                    w.scales.clone()
                };
                let attrs: Vec<pb::AttributeProto> = n.attribute.clone();
                if let Some((act, (lo, hi), qs, y_scale)) = int8_output(&g, &out) {
                    let (xs, wsn, ys, b) = (
                        format!("{name}_xs"),
                        format!("{name}_ws"),
                        format!("{name}_ys"),
                        format!("{name}_bias_i32"),
                    );
                    inits.push(proto::f32_tensor(&xs, &[], &[x.scales[0]]));
                    inits.push(proto::f32_tensor(&wsn, &[c], &ws));
                    inits.push(proto::f32_tensor(&ys, &[], &[y_scale]));
                    let mut inputs = vec![
                        x.int8.as_str(),
                        &xs,
                        &zero_i8,
                        &w.int8,
                        &wsn,
                        &zero_i8,
                        &ys,
                        &zero_i8,
                    ];
                    if let Some(bias) = &bias {
                        let q: Vec<i32> = bias
                            .data
                            .iter()
                            .zip(&ws)
                            .map(|(b, s)| (b / (x.scales[0] * s)).round_ties_even() as i32)
                            .collect();
                        inits.push(proto::i32_tensor(&b, &[c], &q));
                        inputs.push(&b);
                    }
                    let q_out = g.node(qs[0]).output[0].clone();
                    let conv_out = if act.is_some() {
                        format!("{name}_int8_preact")
                    } else {
                        q_out.clone()
                    };
                    new_nodes.push(proto::node(
                        "QLinearConv",
                        name,
                        &inputs,
                        &[&conv_out],
                        attrs,
                    ));
                    if let Some(a) = act {
                        // Clamp in the int8 domain at the quantized bounds.
                        let qb =
                            |v: f32| (v / y_scale).round_ties_even().clamp(-128.0, 127.0) as i8;
                        let (lo_q, hi_q) = (
                            if lo.is_finite() { qb(lo) } else { -128 },
                            if hi.is_finite() { qb(hi) } else { 127 },
                        );
                        let (lo_n, hi_n) = (format!("{name}_lo_i8"), format!("{name}_hi_i8"));
                        inits.push(proto::i8_tensor(&lo_n, &[], &[lo_q]));
                        inits.push(proto::i8_tensor(&hi_n, &[], &[hi_q]));
                        let mid = format!("{name}_int8_lo");
                        new_nodes.push(proto::node(
                            "Max",
                            &format!("{name}_act_lo"),
                            &[&conv_out, &lo_n],
                            &[&mid],
                            vec![],
                        ));
                        new_nodes.push(proto::node(
                            "Min",
                            &format!("{name}_act_hi"),
                            &[&mid, &hi_n],
                            &[&q_out],
                            vec![],
                        ));
                        drop.insert(a);
                    }
                    for &q in &qs {
                        drop.insert(q);
                        let o = &g.node(q).output[0];
                        if *o != q_out {
                            rename.insert(o.clone(), q_out.clone());
                        }
                    }
                } else {
                    let (acc, accf, k) = (
                        format!("{name}_acc_i32"),
                        format!("{name}_acc_f32"),
                        format!("{name}_rescale"),
                    );
                    new_nodes.push(proto::node(
                        "ConvInteger",
                        name,
                        &[&x.int8, &w.int8],
                        &[&acc],
                        attrs,
                    ));
                    let mut kdims = vec![1usize; w_t.dims.len()];
                    kdims[1] = c;
                    let kv: Vec<f32> = ws.iter().map(|s| s * x.scales[0]).collect();
                    inits.push(proto::f32_tensor(&k, &kdims, &kv));
                    new_nodes.push(cast_to_f32(&format!("{name}_to_f32"), &acc, &accf));
                    rescale_and_bias(
                        &mut new_nodes,
                        &mut inits,
                        name,
                        &accf,
                        &k,
                        bias.as_ref().map(|b| (b, kdims.as_slice())),
                        &out,
                    );
                }
            }
            _ => {
                // Gemm / MatMul -> MatMulInteger, B as [K, N].
                let trans_a = proto::attr_i(n, "transA").unwrap_or(0) == 1;
                let trans_b = proto::attr_i(n, "transB").unwrap_or(0) == 1;
                if trans_a {
                    float_nodes.push(float_node(n, "Gemm with transA: no integer form"));
                    continue;
                }
                let alpha = proto::attr_f(n, "alpha").unwrap_or(1.0);
                let beta = proto::attr_f(n, "beta").unwrap_or(1.0);
                let (b_name, ncols) = match (w_init, op == "Gemm" && trans_b) {
                    (Some(t), true) => {
                        let v = proto::tensor_i64(t).ok_or("int8 weight unreadable")?;
                        let (nn, kk) = (t.dims[0] as usize, t.dims[1] as usize);
                        let mut tr = vec![0i8; nn * kk];
                        for r in 0..nn {
                            for c in 0..kk {
                                tr[c * nn + r] = v[r * kk + c] as i8;
                            }
                        }
                        let b = format!("{name}_b_kn_int8");
                        inits.push(proto::i8_tensor(&b, &[kk, nn], &tr));
                        (b, nn)
                    }
                    (Some(t), false) => (w.int8.clone(), *t.dims.last().unwrap_or(&1) as usize),
                    (None, true) => {
                        float_nodes
                            .push(float_node(n, "transposed non-constant B: no integer form"));
                        continue;
                    }
                    (None, false) => (w.int8.clone(), w.scales.len()),
                };
                let ws: Vec<f32> = if w.scales.len() == 1 {
                    vec![w.scales[0]; ncols]
                } else {
                    w.scales.clone()
                };
                let (acc, accf, k) = (
                    format!("{name}_acc_i32"),
                    format!("{name}_acc_f32"),
                    format!("{name}_rescale"),
                );
                new_nodes.push(proto::node(
                    "MatMulInteger",
                    name,
                    &[&x.int8, &b_name],
                    &[&acc],
                    vec![],
                ));
                new_nodes.push(cast_to_f32(&format!("{name}_to_f32"), &acc, &accf));
                let kv: Vec<f32> = ws.iter().map(|s| s * x.scales[0] * alpha).collect();
                inits.push(proto::f32_tensor(&k, &[kv.len()], &kv));
                let c_term = if op == "Gemm" {
                    bias.map(|b| proto::F32Tensor {
                        data: b.data.iter().map(|v| v * beta).collect(),
                        dims: b.dims,
                    })
                } else {
                    None
                };
                let dims = c_term.as_ref().map(|c| c.dims.clone()).unwrap_or_default();
                rescale_and_bias(
                    &mut new_nodes,
                    &mut inits,
                    name,
                    &accf,
                    &k,
                    c_term.as_ref().map(|c| (c, dims.as_slice())),
                    &out,
                );
            }
        }
        int8_nodes.push(name.clone());
        replace.insert(i, new_nodes);
    }

    let mut out = p.clone();
    let og = out.graph.as_mut().ok_or("no graph")?;
    og.node.clear();
    for (i, n) in gp.node.iter().enumerate() {
        if drop.contains(&i) {
            continue;
        }
        match replace.remove(&i) {
            Some(v) => og.node.extend(v),
            None => og.node.push(n.clone()),
        }
    }
    for n in og.node.iter_mut() {
        for inp in n.input.iter_mut() {
            if let Some(r) = rename.get(inp) {
                *inp = r.clone();
            }
        }
    }
    og.initializer.extend(inits);
    // Order: a QLinearConv now writes a tensor its old Q node wrote later; re-sort.
    topo_sort(og)?;
    crate::model::drop_unused_initializers(og);
    Ok(Lowered {
        proto: out,
        int8_nodes,
        float_nodes,
    })
}

fn cast_to_f32(name: &str, from: &str, to: &str) -> pb::NodeProto {
    proto::node(
        "Cast",
        name,
        &[from],
        &[to],
        vec![proto::int_attr(
            "to",
            pb::tensor_proto::DataType::Float as i64,
        )],
    )
}

/// `out = acc * k (+ bias)`.
fn rescale_and_bias(
    nodes: &mut Vec<pb::NodeProto>,
    inits: &mut Vec<pb::TensorProto>,
    name: &str,
    acc: &str,
    k: &str,
    bias: Option<(&proto::F32Tensor, &[usize])>,
    out: &str,
) {
    match bias {
        None => nodes.push(proto::node(
            "Mul",
            &format!("{name}_rescale_mul"),
            &[acc, k],
            &[out],
            vec![],
        )),
        Some((b, kdims)) => {
            let scaled = format!("{name}_scaled");
            let bn = format!("{name}_bias_f32");
            let dims: Vec<usize> = if kdims.iter().product::<usize>() == b.len() {
                kdims.to_vec()
            } else {
                b.dims.clone()
            };
            inits.push(proto::f32_tensor(&bn, &dims, &b.data));
            nodes.push(proto::node(
                "Mul",
                &format!("{name}_rescale_mul"),
                &[acc, k],
                &[&scaled],
                vec![],
            ));
            nodes.push(proto::node(
                "Add",
                &format!("{name}_bias_add"),
                &[&scaled, &bn],
                &[out],
                vec![],
            ));
        }
    }
}

/// Sorts nodes so every tensor is written before it is read (Kahn's algorithm, stable).
pub fn topo_sort(g: &mut pb::GraphProto) -> Result<(), String> {
    let mut available: HashSet<String> = g.input.iter().map(|i| i.name.clone()).collect();
    available.extend(g.initializer.iter().map(|t| t.name.clone()));
    available.insert(String::new());
    let mut pending: Vec<pb::NodeProto> = std::mem::take(&mut g.node);
    let mut sorted = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let before = pending.len();
        let mut rest = vec![];
        for n in pending {
            if n.input.iter().all(|i| available.contains(i)) {
                available.extend(n.output.iter().cloned());
                sorted.push(n);
            } else {
                rest.push(n);
            }
        }
        if rest.len() == before {
            let names: Vec<String> = rest.iter().take(3).map(|n| n.name.clone()).collect();
            return Err(format!(
                "the lowered graph has a cycle or a missing tensor near {names:?}"
            ));
        }
        pending = rest;
    }
    g.node = sorted;
    Ok(())
}
