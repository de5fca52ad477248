//! Turns a Q/DQ model into one that computes in int8 on tract's integer kernels.
//!
//! - Each Conv / Gemm / MatMul whose inputs are `DequantizeLinear` of int8 data becomes
//!   `ConvInteger` / `MatMulInteger` (i8 x i8 -> exact i32 accumulation) followed by one
//!   multiply by `x_scale * w_scale[c]` and the float bias: what the Q/DQ graph means,
//!   without the float rounding of the accumulation.
//! - Every remaining per-tensor `QuantizeLinear` becomes `Div -> clamp -> Round -> Cast(int8)`
//!   and every `DequantizeLinear` of an activation `Cast -> Mul`: the same arithmetic (ONNX
//!   rounds half to even, as tract's `Round` does), in ops tract fuses into single passes,
//!   where its own quantize/dequantize kernels are scalar loops several times slower.
//! - Grouped (depthwise) convs stay float on the dequantized int8 input and weights: tract has
//!   no int8 kernel for them and its im2col fallback is slower than float. They run on our
//!   depthwise kernel (`fast_ops::depthwise`, 32 outputs per AVX2 step), and each quantize
//!   chain (after an integer conv or a float op, through the cast to int8) runs as one fused
//!   pass (`fast_ops::quant::Requantize`), bit for bit the ops written here.
//!
//! Everything that runs in float is listed, with the reason, in `float_nodes`.
//!
//! An FP8 Q/DQ model (`float8e4m3fn`) is lowered by [`lower_fp8`] to FP8 numerics in float:
//! each activation Q -> DQ pair becomes one E4M3 rounding (`fast_ops::fp8`), each FP8 weight
//! its dequantized f32 value. The CPU has no FP8 arithmetic: the accuracy is an FP8
//! engine's (FP32 accumulation, as FP8 tensor cores accumulate), the speed is not.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

use super::float_node;
use crate::backend::FloatNode;
use crate::model::{Graph, proto};

pub struct Lowered {
    pub proto: pb::ModelProto,
    /// The nodes that compute on quantized (int8, or E4M3-rounded) inputs.
    pub quantized_nodes: Vec<String>,
    pub float_nodes: Vec<FloatNode>,
}

/// An int8 tensor seen through a DequantizeLinear with zero point 0.
struct Dq {
    int8: String,
    scales: Vec<f32>,
}

fn is_zero_int8(g: &Graph, name: Option<&String>) -> bool {
    let Some(t) = name
        .filter(|s| !s.is_empty())
        .and_then(|n| g.initializer(n))
    else {
        // No zero point means uint8 in ONNX: not the symmetric int8 this lowering handles.
        return false;
    };
    t.data_type == pb::tensor_proto::DataType::Int8 as i32
        && proto::tensor_i64(t).is_some_and(|v| v.iter().all(|&x| x == 0))
}

fn dq_source(g: &Graph, tensor: &str) -> Option<Dq> {
    let n = g.node(g.producer(tensor)?);
    if n.op_type != "DequantizeLinear" || !is_zero_int8(g, n.input.get(2)) {
        return None;
    }
    let scales = proto::tensor_f32(g.initializer(n.input.get(1)?)?)?.data;
    Some(Dq {
        int8: n.input[0].clone(),
        scales,
    })
}

/// A scalar scale of a Q or DQ node, when it is symmetric per-tensor int8.
fn per_tensor_scale(g: &Graph, n: &pb::NodeProto) -> Option<f32> {
    let s = proto::tensor_f32(g.initializer(n.input.get(1)?)?)?.data;
    (s.len() == 1 && is_zero_int8(g, n.input.get(2))).then_some(s[0])
}

/// Lowers `p` (a Q/DQ model with a fixed input). Errors only on a malformed graph.
pub fn lower_qdq(p: &pb::ModelProto) -> Result<Lowered, String> {
    let gp = p.graph.as_ref().ok_or("no graph")?;
    let g = Graph::new(gp);
    let mut inits: Vec<pb::TensorProto> = vec![];
    // Node index -> the nodes that replace it.
    let mut replace: HashMap<usize, Vec<pb::NodeProto>> = HashMap::new();
    let mut int8_nodes = vec![];
    let mut float_nodes = vec![];

    for (i, n) in gp.node.iter().enumerate() {
        let op = n.op_type.as_str();
        let name = &n.name;
        match op {
            "QuantizeLinear" | "DequantizeLinear" => continue,
            "Conv" | "Gemm" | "MatMul" => {}
            "ConvTranspose" => {
                float_nodes.push(float_node(
                    n,
                    "no integer ConvTranspose kernel in tract: runs in float",
                ));
                continue;
            }
            _ => {
                float_nodes.push(float_node(
                    n,
                    "no int8 form for this op on the CPU backend: runs in float",
                ));
                continue;
            }
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
        let out = n.output[0].clone();
        let bias = n
            .input
            .get(2)
            .filter(|s| !s.is_empty())
            .and_then(|b| g.initializer(b))
            .and_then(proto::tensor_f32);
        let (acc, k) = (format!("{name}_acc_i32"), format!("{name}_rescale"));
        let mut new_nodes = vec![];
        // The integer node writes `acc`; `k` and the float bias (for Gemm, C * beta) follow.
        let bias = if op == "Conv" {
            let Some(w_t) = w_init else {
                float_nodes.push(float_node(n, "weight is not a constant"));
                continue;
            };
            if proto::attr_i(n, "group").unwrap_or(1) > 1 {
                float_nodes.push(float_node(
                    n,
                    "grouped/depthwise conv: tract has no int8 kernel for it, so it runs in float on the dequantized int8 input and weights (the Q/DQ model's arithmetic)",
                ));
                continue;
            }
            let c = w_t.dims[0] as usize;
            let ws = per_channel(&w.scales, c);
            new_nodes.push(proto::node(
                "ConvInteger",
                name,
                &[&x.int8, &w.int8],
                &[&acc],
                n.attribute.clone(),
            ));
            let mut kdims = vec![1usize; w_t.dims.len()];
            kdims[1] = c;
            inits.push(proto::f32_tensor(
                &k,
                &kdims,
                &ws.iter().map(|s| s * x.scales[0]).collect::<Vec<_>>(),
            ));
            bias.map(|b| proto::F32Tensor {
                dims: kdims,
                data: b.data,
            })
        } else {
            // Gemm / MatMul -> MatMulInteger with B as [K, N].
            if proto::attr_i(n, "transA").unwrap_or(0) == 1 {
                float_nodes.push(float_node(n, "Gemm with transA: no integer form"));
                continue;
            }
            let trans_b = op == "Gemm" && proto::attr_i(n, "transB").unwrap_or(0) == 1;
            let alpha = proto::attr_f(n, "alpha").unwrap_or(1.0);
            let beta = proto::attr_f(n, "beta").unwrap_or(1.0);
            let (b_name, ncols) = match (w_init, trans_b) {
                (Some(t), true) => {
                    let v = proto::tensor_i64(t).ok_or("int8 weight unreadable")?;
                    let (rows, cols) = (t.dims[0] as usize, t.dims[1] as usize);
                    let mut tr = vec![0i8; rows * cols];
                    for r in 0..rows {
                        for c in 0..cols {
                            tr[c * rows + r] = v[r * cols + c] as i8;
                        }
                    }
                    let b = format!("{name}_b_kn_int8");
                    inits.push(proto::i8_tensor(&b, &[cols, rows], &tr));
                    (b, rows)
                }
                (Some(t), false) => (w.int8.clone(), *t.dims.last().unwrap_or(&1) as usize),
                (None, true) => {
                    float_nodes.push(float_node(n, "transposed non-constant B: no integer form"));
                    continue;
                }
                (None, false) => (w.int8.clone(), w.scales.len()),
            };
            let ws = per_channel(&w.scales, ncols);
            new_nodes.push(proto::node(
                "MatMulInteger",
                name,
                &[&x.int8, &b_name],
                &[&acc],
                vec![],
            ));
            inits.push(proto::f32_tensor(
                &k,
                &[ncols],
                &ws.iter()
                    .map(|s| s * x.scales[0] * alpha)
                    .collect::<Vec<_>>(),
            ));
            if op == "Gemm" {
                bias.map(|b| proto::F32Tensor {
                    data: b.data.iter().map(|v| v * beta).collect(),
                    dims: b.dims,
                })
            } else {
                None
            }
        };
        rescale_and_bias(
            &mut new_nodes,
            &mut inits,
            name,
            &acc,
            &k,
            bias.as_ref(),
            &out,
        );
        int8_nodes.push(name.clone());
        replace.insert(i, new_nodes);
    }

    lower_quantize_pairs(&g, &mut replace, &mut inits);
    Ok(Lowered {
        proto: rewritten(p, replace, inits)?,
        quantized_nodes: int8_nodes,
        float_nodes,
    })
}

/// `p` with node `i` replaced by `replace[i]` where there is one, `inits` added, and what the
/// replacements left unread dropped.
fn rewritten(
    p: &pb::ModelProto,
    mut replace: HashMap<usize, Vec<pb::NodeProto>>,
    inits: Vec<pb::TensorProto>,
) -> Result<pb::ModelProto, String> {
    let mut out = p.clone();
    let og = out.graph.as_mut().ok_or("no graph")?;
    let nodes = std::mem::take(&mut og.node);
    for (i, n) in nodes.into_iter().enumerate() {
        match replace.remove(&i) {
            Some(v) => og.node.extend(v),
            None => og.node.push(n),
        }
    }
    og.initializer.extend(inits);
    remove_dead_nodes(og);
    crate::model::drop_unused_initializers(og);
    Ok(out)
}

/// The scales of a Q or DQ node to `float8e4m3fn` (zero point absent or FP8 zeros), or
/// `None` when the node is not FP8.
fn fp8_scales(g: &Graph, n: &pb::NodeProto) -> Option<Vec<f32>> {
    use crate::quant::fp8;
    let zp = g.initializer(n.input.get(2).filter(|s| !s.is_empty())?)?;
    let zero = fp8::tensor_codes(zp)?.iter().all(|&c| c & 0x7f == 0);
    let s = proto::tensor_f32(g.initializer(n.input.get(1)?)?)?.data;
    zero.then_some(s)
}

/// Lowers an FP8 Q/DQ model `p` to float arithmetic with FP8 numerics (see the module's
/// doc). Errors on a Q/DQ node it cannot read (non-constant scales, an FP8 activation read
/// by anything but a DequantizeLinear, int8 nodes mixed in).
pub fn lower_fp8(p: &pb::ModelProto) -> Result<Lowered, String> {
    use crate::backend::cpu::fast_ops::fp8::OP_TYPE;
    use crate::quant::fp8;
    let gp = p.graph.as_ref().ok_or("no graph")?;
    let g = Graph::new(gp);
    let mut inits: Vec<pb::TensorProto> = vec![];
    let mut replace: HashMap<usize, Vec<pb::NodeProto>> = HashMap::new();
    let quantized = |t: &str| {
        g.producer(t)
            .is_some_and(|i| g.node(i).op_type == "DequantizeLinear")
    };
    let (mut fp8_nodes, mut float_nodes) = (vec![], vec![]);
    for (i, n) in gp.node.iter().enumerate() {
        let what = || format!("{} `{}`", n.op_type, n.name);
        match n.op_type.as_str() {
            "QuantizeLinear" => {
                let s = fp8_scales(&g, n)
                    .filter(|s| s.len() == 1)
                    .ok_or_else(|| format!("{}: not a per-tensor FP8 quantize", what()))?;
                let mut nodes = vec![];
                for &(c, _) in g.consumers(&n.output[0]) {
                    let dq = g.node(c);
                    if dq.op_type != "DequantizeLinear" || fp8_scales(&g, dq) != Some(s.clone()) {
                        return Err(format!(
                            "{}: read by {} `{}`, not by a DequantizeLinear at its scale",
                            what(),
                            dq.op_type,
                            dq.name
                        ));
                    }
                    let mut r = proto::node(
                        OP_TYPE,
                        &format!("{}_e4m3", dq.name),
                        &[&n.input[0]],
                        &[&dq.output[0]],
                        vec![],
                    );
                    r.attribute.push(pb::AttributeProto {
                        name: "scale".into(),
                        r#type: pb::attribute_proto::AttributeType::Float as i32,
                        f: s[0],
                        ..Default::default()
                    });
                    nodes.push(r);
                    replace.insert(c, vec![]);
                }
                replace.insert(i, nodes);
            }
            "DequantizeLinear" if g.initializer(&n.input[0]).is_some() => {
                let (Some(t), Some(s)) = (g.initializer(&n.input[0]), fp8_scales(&g, n)) else {
                    return Err(format!("{}: not an FP8 weight", what()));
                };
                let codes = fp8::tensor_codes(t).ok_or_else(|| format!("{}: no codes", what()))?;
                let dims: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
                let axis = proto::attr_i(n, "axis").unwrap_or(1);
                let axis = if axis < 0 {
                    axis + dims.len() as i64
                } else {
                    axis
                } as usize;
                let values: Vec<f32> = codes.iter().map(|&c| fp8::e4m3_to_f32(c)).collect();
                let data = crate::quant::dequantize_per_axis(&values, &dims, axis, &s)
                    .ok_or_else(|| format!("{}: scales do not match the axis", what()))?;
                inits.push(proto::f32_tensor(&n.output[0], &dims, &data));
                replace.insert(i, vec![]);
            }
            "DequantizeLinear" => {}
            "Conv" | "ConvTranspose" | "Gemm" | "MatMul"
                if n.input.iter().take(2).all(|t| quantized(t)) =>
            {
                fp8_nodes.push(n.name.clone())
            }
            _ => float_nodes.push(float_node(
                n,
                "FP8 simulation: runs in FP32 on E4M3-rounded inputs where they are quantized",
            )),
        }
    }
    Ok(Lowered {
        proto: rewritten(p, replace, inits)?,
        quantized_nodes: fp8_nodes,
        float_nodes,
    })
}

fn scalar(name: String, v: f32, inits: &mut Vec<pb::TensorProto>) -> String {
    inits.push(proto::f32_tensor(&name, &[], &[v]));
    name
}

/// Rewrites every per-tensor symmetric QuantizeLinear as fused arithmetic giving the integer
/// value as a float, `d = round_half_even(clamp(x / s, -128, 127))`; readers that take int8
/// (the integer convs) get `Cast(d, int8)`, and each live DequantizeLinear of it with the same
/// scale becomes `d * s` — a quantize/dequantize pair costs no cast at all.
fn lower_quantize_pairs(
    g: &Graph,
    replace: &mut HashMap<usize, Vec<pb::NodeProto>>,
    inits: &mut Vec<pb::TensorProto>,
) {
    // Who reads what once the convs are replaced: the readers that decide what a Q must give.
    let mut readers: HashMap<String, Vec<(Option<usize>, String)>> = HashMap::new();
    for (i, n) in g.proto.node.iter().enumerate() {
        match replace.get(&i) {
            Some(new) => {
                for m in new {
                    for inp in &m.input {
                        readers
                            .entry(inp.clone())
                            .or_default()
                            .push((None, m.op_type.clone()));
                    }
                }
            }
            None => {
                for inp in &n.input {
                    readers
                        .entry(inp.clone())
                        .or_default()
                        .push((Some(i), n.op_type.clone()));
                }
            }
        }
    }
    let is_read = |t: &str| readers.contains_key(t) || g.is_graph_output(t);
    let mut dq_done: HashSet<usize> = HashSet::new();
    for (i, n) in g.proto.node.iter().enumerate() {
        if n.op_type != "QuantizeLinear" {
            continue;
        }
        let Some(s) = per_tensor_scale(g, n) else {
            continue;
        };
        let name = &n.name;
        let q_out = &n.output[0];
        let list = readers.get(q_out).cloned().unwrap_or_default();
        let mut dqs = vec![];
        let mut needs_int8 = g.is_graph_output(q_out);
        for (idx, op) in &list {
            match idx {
                Some(j)
                    if op == "DequantizeLinear" && per_tensor_scale(g, g.node(*j)) == Some(s) =>
                {
                    if is_read(&g.node(*j).output[0]) {
                        dqs.push(*j);
                    }
                }
                _ => needs_int8 = true,
            }
        }
        let (a, b, c, up, d) = (
            format!("{name}_div"),
            format!("{name}_lo"),
            format!("{name}_hi"),
            format!("{name}_up"),
            format!("{name}_int"),
        );
        let s_n = scalar(format!("{name}_s"), s, inits);
        let lo = scalar(format!("{name}_min"), -128.0, inits);
        let hi = scalar(format!("{name}_max"), 127.0, inits);
        // Round half to even as `(v + 1.5 * 2^23) - 1.5 * 2^23`: exact for |v| <= 128 in IEEE
        // arithmetic, and fused with the ops around it, where tract's Round is a scalar pass.
        let magic = scalar(format!("{name}_round_magic"), 12_582_912.0, inits);
        let mut nodes = vec![
            proto::node("Div", &a, &[&n.input[0], &s_n], &[&a], vec![]),
            proto::node("Max", &b, &[&a, &lo], &[&b], vec![]),
            proto::node("Min", &c, &[&b, &hi], &[&c], vec![]),
            proto::node("Add", &up, &[&c, &magic], &[&up], vec![]),
            proto::node("Sub", &d, &[&up, &magic], &[&d], vec![]),
        ];
        if needs_int8 {
            let to_i8 = vec![proto::int_attr(
                "to",
                pb::tensor_proto::DataType::Int8 as i64,
            )];
            nodes.push(proto::node("Cast", name, &[&d], &[q_out], to_i8));
        }
        replace.insert(i, nodes);
        for j in dqs {
            let dq = g.node(j);
            replace.insert(
                j,
                vec![proto::node(
                    "Mul",
                    &dq.name,
                    &[&d, &s_n],
                    &[&dq.output[0]],
                    vec![],
                )],
            );
            dq_done.insert(j);
        }
    }
    // Any other DequantizeLinear of an activation: Cast + Mul.
    for (j, n) in g.proto.node.iter().enumerate() {
        if n.op_type != "DequantizeLinear"
            || dq_done.contains(&j)
            || g.initializer(&n.input[0]).is_some()
        {
            continue;
        }
        if let Some(s) = per_tensor_scale(g, n) {
            let f = format!("{}_f32", n.name);
            let s_n = scalar(format!("{}_s", n.name), s, inits);
            replace.insert(
                j,
                vec![
                    cast_to_f32(&format!("{}_cast", n.name), &n.input[0], &f),
                    proto::node("Mul", &n.name, &[&f, &s_n], &[&n.output[0]], vec![]),
                ],
            );
        }
    }
}

/// A weight's scales, one per output channel (a per-tensor scale repeated `channels` times).
fn per_channel(scales: &[f32], channels: usize) -> Vec<f32> {
    if scales.len() == 1 {
        vec![scales[0]; channels]
    } else {
        scales.to_vec()
    }
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

/// `out = float(acc) * k (+ bias)`: the i32 accumulator back to the float the Q/DQ graph means.
fn rescale_and_bias(
    nodes: &mut Vec<pb::NodeProto>,
    inits: &mut Vec<pb::TensorProto>,
    name: &str,
    acc: &str,
    k: &str,
    bias: Option<&proto::F32Tensor>,
    out: &str,
) {
    let accf = format!("{name}_acc_f32");
    nodes.push(cast_to_f32(&format!("{name}_to_f32"), acc, &accf));
    let acc = accf.as_str();
    match bias {
        None => nodes.push(proto::node(
            "Mul",
            &format!("{name}_rescale_mul"),
            &[acc, k],
            &[out],
            vec![],
        )),
        Some(b) => {
            let (scaled, bn) = (format!("{name}_scaled"), format!("{name}_bias_f32"));
            inits.push(proto::f32_tensor(&bn, &b.dims, &b.data));
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

/// Drops nodes whose outputs nobody reads (the DequantizeLinear nodes a lowering bypassed).
fn remove_dead_nodes(g: &mut pb::GraphProto) {
    loop {
        let read: HashSet<&str> = g
            .node
            .iter()
            .flat_map(|n| n.input.iter().map(|s| s.as_str()))
            .chain(g.output.iter().map(|o| o.name.as_str()))
            .collect();
        let dead: HashSet<usize> = (0..g.node.len())
            .filter(|&i| {
                g.node[i]
                    .output
                    .iter()
                    .all(|o| o.is_empty() || !read.contains(o.as_str()))
            })
            .collect();
        if dead.is_empty() {
            return;
        }
        let mut k = 0;
        g.node.retain(|_| {
            k += 1;
            !dead.contains(&(k - 1))
        });
    }
}
