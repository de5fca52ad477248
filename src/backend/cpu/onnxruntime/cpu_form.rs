//! The CPU run's form of a symmetric int8 Q/DQ model, two exact rewrites of the engine's copy
//! (the file exported for TensorRT is not touched):
//! - Activations as uint8 with zero point 128. ONNX Runtime's x86 int8 kernels are u8
//!   (activations) x s8 (weights); s8 x s8 models take a much slower path. With
//!   q = clamp(round(x / s), -128, 127), the uint8 code is q + 128 = clamp(round(x / s) + 128,
//!   0, 255), and (code - 128) * s = q * s. Weights stay int8.
//! - A conv's output quantized before its ReLU / Clip, at the scale the activation's output is
//!   quantized at. TensorRT's placement quantizes a layer's inputs, not its output, so
//!   `DQ -> Conv -> Relu -> Q` is no unit ONNX Runtime runs on its integer kernels;
//!   `DQ -> Conv -> Q -> DQ -> Relu -> Q` is. Exact, because rounding is monotone and clipping
//!   commutes with it: round(clamp(y, a, b) / s) = round(clamp(s * round(y / s), a, b) / s)
//!   for every y (a value that rounds below a bound a rounds to the same code as a itself).
//! - A constant Pad before a Q -> DQ -> Conv (activation centering's, `prepare::center`: the
//!   conv's zero padding moved into a Pad with value -c) goes back into the conv:
//!   `x -> Pad(v) -> Q(s, z) -> DQ(s, z) -> Conv` becomes `x -> Q(s, z) -> DQ(s, p) -> Conv(pads)`
//!   with p = Q(v), the padded value's code. The conv's zero padding is then the code p, the
//!   dequantized interior reads d = (z - p) * s more than before, and the conv's bias drops
//!   by d × Σ(its dequantized weights) per output channel: exact, and in int32 an integer number
//!   of bias steps. ONNX Runtime would otherwise run the Pad on its own, between two integer
//!   convs it then could not keep in one layout (the bundled scenes model's INT8 form: 5.5 ms
//!   before centering padded its 3x3 convs, 10.1 ms with the Pads, measured).

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{self, tensor_proto::DataType};

/// For each tensor of `g`, the nodes reading it and the node writing it (by index).
fn readers_and_writers(
    g: &pb::GraphProto,
) -> (HashMap<String, Vec<usize>>, HashMap<String, usize>) {
    let mut readers: HashMap<String, Vec<usize>> = HashMap::new();
    let mut writer: HashMap<String, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for t in &n.input {
            readers.entry(t.clone()).or_default().push(i);
        }
        for t in &n.output {
            writer.insert(t.clone(), i);
        }
    }
    (readers, writer)
}

/// Puts a QuantizeLinear -> DequantizeLinear pair between each quantized Conv / Gemm / MatMul
/// and the ReLU or Clip that is its only reader, where every reader of that activation is a
/// QuantizeLinear at one scale and zero point: the pair uses those. Returns how many pairs.
pub fn quantize_before_activations(p: &mut pb::ModelProto) -> usize {
    let Some(g) = p.graph.as_mut() else {
        return 0;
    };
    let (readers, writer) = readers_and_writers(g);
    let graph_outputs: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    let only_reader = |t: &str| match readers.get(t).map(Vec::as_slice) {
        Some([r]) if !graph_outputs.contains(t) => Some(*r),
        _ => None,
    };
    // (activation node, the scale and zero point its readers quantize at)
    let mut inserts: Vec<(usize, String, String)> = vec![];
    for (a, act) in g.node.iter().enumerate() {
        if !matches!(act.op_type.as_str(), "Relu" | "Clip") || act.input.is_empty() {
            continue;
        }
        let qs: Vec<&pb::NodeProto> = readers
            .get(&act.output[0])
            .map(|r| r.iter().map(|&i| &g.node[i]).collect())
            .unwrap_or_default();
        let Some(first) = qs.first() else { continue };
        let one_scale = qs.iter().all(|q| {
            q.op_type == "QuantizeLinear"
                && q.input.len() >= 3
                && q.input[1] == first.input[1]
                && q.input[2] == first.input[2]
        });
        let Some(&c) = writer.get(&act.input[0]) else {
            continue;
        };
        let conv = &g.node[c];
        let quantized = conv
            .input
            .first()
            .and_then(|x| writer.get(x))
            .is_some_and(|&d| g.node[d].op_type == "DequantizeLinear");
        if one_scale
            && !graph_outputs.contains(act.output[0].as_str())
            && matches!(conv.op_type.as_str(), "Conv" | "Gemm" | "MatMul")
            && quantized
            && only_reader(&conv.output[0]) == Some(a)
        {
            inserts.push((a, first.input[1].clone(), first.input[2].clone()));
        }
    }
    let count = inserts.len();
    // From the last, so earlier indices stay valid.
    for (a, scale, zp) in inserts.into_iter().rev() {
        let y = g.node[a].input[0].clone();
        let (q, d) = (format!("{y}_cpu_q"), format!("{y}_cpu_dq"));
        let name = &g.node[a].name;
        let qn = crate::model::proto::node(
            "QuantizeLinear",
            &format!("{name}_cpu_quantize"),
            &[&y, &scale, &zp],
            &[&q],
            vec![],
        );
        let dn = crate::model::proto::node(
            "DequantizeLinear",
            &format!("{name}_cpu_dequantize"),
            &[&q, &scale, &zp],
            &[&d],
            vec![],
        );
        g.node[a].input[0] = d;
        g.node.insert(a, dn);
        g.node.insert(a, qn);
    }
    count
}

/// Folds each constant Pad whose only reader is a QuantizeLinear, read only by
/// DequantizeLinears that only Convs without padding read (their weights int8 constants
/// through a DequantizeLinear), back into those convs (see the module's note). Returns how
/// many Pads were folded.
pub fn pads_into_convs(p: &mut pb::ModelProto) -> usize {
    let Some(g) = p.graph.as_mut() else {
        return 0;
    };
    let (readers, writer) = readers_and_writers(g);
    let graph_outputs: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
    let init = |name: &str| g.initializer.iter().find(|t| t.name == name);
    let scalar_f32 = |name: &str| {
        init(name)
            .and_then(crate::model::proto::tensor_f32)
            .filter(|t| t.data.len() == 1)
            .map(|t| t.data[0])
    };
    let scalar_i8 = |name: &str| {
        init(name)
            .filter(|t| t.data_type == DataType::Int8 as i32)
            .and_then(crate::model::proto::tensor_i64)
            .filter(|v| v.len() == 1)
            .map(|v| v[0])
    };
    let only = |t: &str| match readers.get(t).map(Vec::as_slice) {
        Some(r) if !r.is_empty() && !graph_outputs.contains(t) => Some(r.to_vec()),
        _ => None,
    };
    // Per output channel, Σ of conv `c`'s dequantized weights (int8 codes × per-channel scale).
    let weight_sums = |c: &pb::NodeProto| -> Option<Vec<f32>> {
        let d = &g.node[*writer.get(c.input.get(1)?)?];
        let q = init(&d.input[0]).filter(|t| t.data_type == DataType::Int8 as i32)?;
        let codes = crate::model::proto::tensor_i64(q)?;
        let scales = crate::model::proto::tensor_f32(init(d.input.get(1)?)?)?.data;
        let channels = *q.dims.first()? as usize;
        let per = codes.len() / channels.max(1);
        (d.op_type == "DequantizeLinear"
            && per > 0
            && (scales.len() == channels || scales.len() == 1))
            .then(|| {
                codes
                    .chunks(per)
                    .enumerate()
                    .map(|(k, w)| w.iter().sum::<i64>() as f32 * scales[k.min(scales.len() - 1)])
                    .collect()
            })
    };
    /// One Pad to fold: its node, its Q, the Q's DQs, their convs (with their weight sums),
    /// the padded value's code, the spatial pads and d = (z - code) * s.
    struct Fold {
        pad: usize,
        q: usize,
        dqs: Vec<usize>,
        convs: Vec<(usize, Vec<f32>)>,
        code: i64,
        pads: Vec<i64>,
        shift: f32,
    }
    let mut folds: Vec<Fold> = vec![];
    for (i, n) in g.node.iter().enumerate() {
        let constant = crate::model::proto::attr_str(n, "mode").is_none_or(|m| m == "constant");
        if n.op_type != "Pad" || !n.domain.is_empty() || !constant || n.input.len() < 2 {
            continue;
        }
        let Some(pads) = init(&n.input[1]).and_then(crate::model::proto::tensor_i64) else {
            continue;
        };
        // NCHW: nothing on batch and channels, [0, 0, begins.., 0, 0, ends..].
        let half = pads.len() / 2;
        if pads.len() != 8 || pads[0..2] != [0, 0] || pads[half..half + 2] != [0, 0] {
            continue;
        }
        let spatial: Vec<i64> = [&pads[2..half], &pads[half + 2..]].concat();
        let v = match n.input.get(2).filter(|v| !v.is_empty()) {
            Some(v) => scalar_f32(v),
            None => Some(0.0),
        };
        let Some(&[q]) = only(&n.output[0]).as_deref() else {
            continue;
        };
        let qn = &g.node[q];
        let (Some(v), Some(s), Some(z)) = (
            v,
            qn.input.get(1).and_then(|x| scalar_f32(x)),
            qn.input.get(2).and_then(|x| scalar_i8(x)),
        ) else {
            continue;
        };
        if qn.op_type != "QuantizeLinear" || s.is_nan() || s <= 0.0 {
            continue;
        }
        let Some(dqs) = only(&qn.output[0]) else {
            continue;
        };
        let mut convs = vec![];
        let fits = dqs.iter().all(|&d| {
            let dn = &g.node[d];
            let same = dn.op_type == "DequantizeLinear"
                && dn.input.get(1) == qn.input.get(1)
                && dn.input.get(2) == qn.input.get(2);
            same && only(&dn.output[0]).is_some_and(|cs| {
                cs.iter().all(|&c| {
                    let cn = &g.node[c];
                    let unpadded = crate::model::proto::attr_ints(cn, "pads")
                        .is_none_or(|p| p.iter().all(|&x| x == 0))
                        && crate::model::proto::attr_str(cn, "auto_pad")
                            .is_none_or(|a| a.is_empty() || a == "NOTSET");
                    let sums = (cn.op_type == "Conv" && cn.input[0] == dn.output[0] && unpadded)
                        .then(|| weight_sums(cn))
                        .flatten();
                    sums.map(|w| convs.push((c, w))).is_some()
                })
            })
        });
        if !fits {
            continue;
        }
        let code = ((v / s).round_ties_even() + z as f32).clamp(-128.0, 127.0) as i64;
        folds.push(Fold {
            pad: i,
            q,
            dqs,
            convs,
            code,
            pads: spatial,
            shift: (z - code) as f32 * s,
        });
    }
    let count = folds.len();
    let mut dropped = HashSet::new();
    for f in folds {
        let x = g.node[f.pad].input[0].clone();
        g.node[f.q].input[0] = x;
        dropped.insert(f.pad);
        let zp = format!("{}_cpu_pad_code", g.node[f.pad].name);
        g.initializer
            .push(crate::model::proto::i8_tensor(&zp, &[], &[f.code as i8]));
        for d in f.dqs {
            g.node[d].input[2] = zp.clone();
        }
        for (c, sums) in f.convs {
            let mut n = std::mem::take(&mut g.node[c]);
            let down: Vec<f32> = sums.iter().map(|w| -f.shift * w).collect();
            crate::quant::add_to_bias(g, &mut n, &down, "cpu_pad_bias");
            n.attribute.retain(|a| a.name != "pads");
            n.attribute
                .push(crate::model::proto::ints_attr("pads", &f.pads));
            g.node[c] = n;
        }
    }
    let mut i = 0;
    g.node.retain(|_| {
        i += 1;
        !dropped.contains(&(i - 1))
    });
    if count > 0 {
        g.value_info.clear();
    }
    count
}

/// The shared uint8 zero point the rewritten activations use.
const U8_ZERO_POINT: &str = "qs_zero_point_u8_128";

/// Rewrites every activation QuantizeLinear of `p` that is symmetric int8 (per-tensor scale,
/// zero point an int8 zero) to uint8 with zero point 128, and the DequantizeLinear nodes that
/// read it. Returns how many Q nodes were rewritten. A Q whose output reaches anything but a
/// DequantizeLinear (a graph output, say) is left as it is.
pub fn to_u8_activations(p: &mut pb::ModelProto) -> usize {
    let Some(g) = p.graph.as_mut() else {
        return 0;
    };
    let inits: HashMap<&str, &pb::TensorProto> =
        g.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
    let graph_outputs: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for t in &n.input {
            readers.entry(t.as_str()).or_default().push(i);
        }
    }
    let is_scalar = |name: &str| {
        inits
            .get(name)
            .is_some_and(|t| t.dims.iter().product::<i64>() == 1)
    };
    let is_i8_zero = |name: &str| {
        inits.get(name).is_some_and(|t| {
            t.data_type == DataType::Int8 as i32
                && t.dims.iter().product::<i64>() == 1
                && crate::model::proto::tensor_i64(t).is_some_and(|v| v.iter().all(|&x| x == 0))
        })
    };
    let is_i8_scalar = |name: &str| {
        inits.get(name).is_some_and(|t| {
            t.data_type == DataType::Int8 as i32 && t.dims.iter().product::<i64>() == 1
        })
    };
    let mut rewrite: Vec<usize> = vec![];
    for (i, n) in g.node.iter().enumerate() {
        if n.op_type != "QuantizeLinear" || !n.domain.is_empty() || n.input.len() < 3 {
            continue;
        }
        let out = n.output[0].as_str();
        let dqs = readers.get(out).map(Vec::as_slice).unwrap_or(&[]);
        let only_dq = !dqs.is_empty()
            && dqs.iter().all(|&j| {
                let d = &g.node[j];
                d.op_type == "DequantizeLinear" && d.input.len() >= 3 && d.input[0] == out
            });
        if !inits.contains_key(n.input[0].as_str())
            && is_scalar(&n.input[1])
            && is_i8_zero(&n.input[2])
            && only_dq
            && !graph_outputs.contains(out)
            && dqs.iter().all(|&j| is_i8_scalar(&g.node[j].input[2]))
        {
            rewrite.push(i);
            rewrite.extend_from_slice(dqs);
        }
    }
    let count = rewrite
        .iter()
        .filter(|&&i| g.node[i].op_type == "QuantizeLinear")
        .count();
    if count == 0 {
        return 0;
    }
    // A zero point of 0 becomes the shared 128; another (a DQ `pads_into_convs` gave the pad's
    // code) its own value + 128.
    let mut own: Vec<pb::TensorProto> = vec![];
    for i in rewrite {
        let zp = &g.node[i].input[2];
        let v = inits
            .get(zp.as_str())
            .and_then(|t| crate::model::proto::tensor_i64(t))
            .map_or(0, |c| c[0]);
        g.node[i].input[2] = if v == 0 {
            U8_ZERO_POINT.into()
        } else {
            let name = format!("{zp}_u8");
            if !own.iter().any(|t| t.name == name) {
                own.push(pb::TensorProto {
                    name: name.clone(),
                    dims: vec![],
                    data_type: DataType::Uint8 as i32,
                    raw_data: vec![(v + 128) as u8],
                    ..Default::default()
                });
            }
            name
        };
    }
    g.initializer.extend(own);
    g.initializer.push(pb::TensorProto {
        name: U8_ZERO_POINT.into(),
        dims: vec![],
        data_type: DataType::Uint8 as i32,
        raw_data: vec![128],
        ..Default::default()
    });
    // Value infos typed int8 for the rewritten tensors would now be wrong: ORT infers them.
    g.value_info.clear();
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::proto;

    /// A quantized conv (`x` and `w` through Q/DQ at scale `s` / `ws`), then `tail`; `out` is
    /// the graph output.
    fn quantized_conv(tail: Vec<pb::NodeProto>, out: &str) -> pb::ModelProto {
        let node =
            |op: &str, name: &str, i: &[&str], o: &str| proto::node(op, name, i, &[o], vec![]);
        let mut nodes = vec![
            node("QuantizeLinear", "q", &["x", "s", "zp"], "xq"),
            node("DequantizeLinear", "dq", &["xq", "s", "zp"], "xd"),
            node("DequantizeLinear", "wdq", &["w", "ws", "zp"], "wd"),
            node("Conv", "conv", &["xd", "wd"], "y"),
        ];
        nodes.extend(tail);
        pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: nodes,
                initializer: vec![
                    proto::f32_tensor("s", &[], &[0.1]),
                    proto::f32_tensor("s2", &[], &[0.05]),
                    proto::i8_tensor("zp", &[], &[0]),
                    proto::i8_tensor("w", &[1, 1, 1, 1], &[5]),
                    proto::f32_tensor("ws", &[], &[0.2]),
                ],
                output: vec![proto::float_value_info(out, None)],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn qdq_graph() -> pb::ModelProto {
        // A Q whose codes are a graph output keeps its type.
        let q_out = proto::node(
            "QuantizeLinear",
            "q_out",
            &["y", "s", "zp"],
            &["yq"],
            vec![],
        );
        quantized_conv(vec![q_out], "yq")
    }

    #[test]
    fn activations_become_u8_weights_stay_i8() {
        let mut p = qdq_graph();
        assert_eq!(to_u8_activations(&mut p), 1);
        let g = p.graph.as_ref().expect("graph");
        let zp =
            |name: &str| g.node.iter().find(|n| n.name == name).expect("node").input[2].clone();
        assert_eq!(zp("q"), U8_ZERO_POINT);
        assert_eq!(zp("dq"), U8_ZERO_POINT);
        assert_eq!(zp("wdq"), "zp", "weights stay int8");
        assert_eq!(zp("q_out"), "zp", "a graph output keeps its type");
        let u8zp = g
            .initializer
            .iter()
            .find(|t| t.name == U8_ZERO_POINT)
            .expect("zero point");
        assert_eq!(
            (u8zp.data_type, u8zp.raw_data.as_slice()),
            (DataType::Uint8 as i32, &[128u8][..])
        );
    }

    #[test]
    fn a_conv_is_quantized_before_its_relu_at_the_relu_output_scale() {
        let mut p = quantized_conv(
            vec![
                proto::node("Relu", "relu", &["y"], &["r"], vec![]),
                proto::node("QuantizeLinear", "q2", &["r", "s2", "zp"], &["rq"], vec![]),
                proto::node(
                    "DequantizeLinear",
                    "dq2",
                    &["rq", "s2", "zp"],
                    &["out"],
                    vec![],
                ),
            ],
            "out",
        );
        assert_eq!(quantize_before_activations(&mut p), 1);
        let g = p.graph.as_ref().expect("graph");
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(
            ops[3..7],
            ["Conv", "QuantizeLinear", "DequantizeLinear", "Relu"],
            "{ops:?}"
        );
        assert_eq!(
            g.node[4].input,
            ["y", "s2", "zp"],
            "at the ReLU output's scale"
        );
        assert_eq!(
            g.node[6].input[0], g.node[5].output[0],
            "the ReLU reads the pair"
        );
        // A second pass finds nothing more to do.
        assert_eq!(quantize_before_activations(&mut p), 0);
    }

    /// The arithmetic the rewrites rely on, over every code and rounding boundary: the uint8
    /// code minus 128, times the scale, is the int8 code times the scale, bit for bit; and
    /// quantizing before a clip then again after it gives the code of quantizing after it.
    #[test]
    fn both_forms_dequantize_to_the_same_values() {
        let s = 0.0371f32;
        let q = |v: f32| (v / s).round_ties_even().clamp(-128.0, 127.0);
        for i in -20_000..20_000 {
            let x = i as f32 * 0.00173;
            let qu = ((x / s).round_ties_even() + 128.0).clamp(0.0, 255.0);
            assert_eq!((qu - 128.0) * s, q(x) * s, "x = {x}");
            for (lo, hi) in [(0.0, f32::INFINITY), (0.0, 6.0), (-0.93, 2.2)] {
                assert_eq!(q((q(x) * s).clamp(lo, hi)), q(x.clamp(lo, hi)), "x = {x}");
            }
        }
    }
}
