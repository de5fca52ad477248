//! A pre-quantized model's own Q/DQ: which format it carries, and the float model behind it
//! (weights dequantized, activation Q/DQ pairs removed), which its FP32 and FP16 rows run so
//! that they are the float reference its quantized row is compared with.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

use super::{QFormat, fp8};
use crate::model::{Model, proto};

/// The format of the Q/DQ a pre-quantized model carries: FP8 when any zero point is
/// `float8e4m3fn`, else INT8 (int8 or uint8). `None` for a model without Q/DQ.
pub fn carried_format(model: &Model) -> Option<QFormat> {
    if !model.info.prequantized {
        return None;
    }
    let g = model.graph();
    let fp8_zero_point = g
        .node
        .iter()
        .filter(|n| n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear")
        .filter_map(|n| n.input.get(2))
        .filter_map(|z| g.initializer.iter().find(|t| &t.name == z))
        .any(|t| t.data_type == fp8::ONNX_FLOAT8E4M3FN);
    Some(if fp8_zero_point {
        QFormat::Fp8E4M3
    } else {
        QFormat::Int8
    })
}

/// The layers of a Q/DQ graph that compute on quantized values: Conv, ConvTranspose, Gemm and
/// MatMul whose data and weight inputs both come through a DequantizeLinear.
pub fn quantized_layers(g: &pb::GraphProto) -> Vec<String> {
    let dequantized: HashSet<&str> = g
        .node
        .iter()
        .filter(|n| n.op_type == "DequantizeLinear")
        .filter_map(|n| n.output.first().map(String::as_str))
        .collect();
    let reads = |n: &pb::NodeProto, k: usize| {
        n.input
            .get(k)
            .is_some_and(|x| dequantized.contains(x.as_str()))
    };
    g.node
        .iter()
        .filter(|n| super::QUANTIZABLE.contains(&n.op_type.as_str()))
        .filter(|n| reads(n, 0) && reads(n, 1))
        .map(|n| n.name.clone())
        .collect()
}

/// The layers of a Q/DQ graph whose data and weight inputs both come through a
/// DequantizeLinear, where the data's has an asymmetric zero point (uint8, or int8 other than
/// 0): ONNX Runtime runs those as quantized kernels; tract's census (symmetric int8 only) does
/// not count them.
pub fn asymmetric_layers(g: &pb::GraphProto) -> Vec<String> {
    let inits: HashMap<&str, &pb::TensorProto> =
        g.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
    let symmetric = |zp: Option<&String>| {
        zp.and_then(|z| inits.get(z.as_str())).is_some_and(|t| {
            // FP8 has no zero point to shift: tract's census counts it like int8.
            t.data_type == fp8::ONNX_FLOAT8E4M3FN
                || t.data_type == pb::tensor_proto::DataType::Int8 as i32
                    && proto::tensor_i64(t).is_some_and(|v| v.iter().all(|&z| z == 0))
        })
    };
    // DequantizeLinear outputs, and whether their zero point is asymmetric.
    let dequantized: HashMap<&str, bool> = g
        .node
        .iter()
        .filter(|n| n.op_type == "DequantizeLinear")
        .filter_map(|n| Some((n.output.first()?.as_str(), !symmetric(n.input.get(2)))))
        .collect();
    g.node
        .iter()
        .filter(|n| super::QUANTIZABLE.contains(&n.op_type.as_str()))
        .filter(|n| {
            let input = |k: usize| n.input.get(k).and_then(|x| dequantized.get(x.as_str()));
            input(0) == Some(&true) && input(1).is_some()
        })
        .map(|n| n.name.clone())
        .collect()
}

/// The model the float engines build: `model` itself, or for a pre-quantized model the float
/// model it carries.
pub fn float_model(model: &Model) -> Cow<'_, Model> {
    if model.info.prequantized {
        Cow::Owned(float_form(model))
    } else {
        Cow::Borrowed(model)
    }
}

/// `model` with every DequantizeLinear of a constant replaced by the float constant it
/// computes, and every QuantizeLinear whose readers are all DequantizeLinear removed with them
/// (their readers read the float tensor; a graph output keeps its name through an Identity).
/// Q/DQ left over (a quantized tensor read by other ops, a quantized graph output) stay.
pub fn float_form(model: &Model) -> Model {
    let mut p = model.proto.clone();
    let g = p.graph.as_mut().expect("a loaded model has a graph");
    let inits: HashMap<String, pb::TensorProto> = g
        .initializer
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let outputs: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
    let mut drop: HashSet<usize> = HashSet::new();
    let mut rename: HashMap<String, String> = HashMap::new();
    let mut identity: HashMap<usize, String> = HashMap::new();
    let mut made = vec![];
    for (i, n) in g.node.iter().enumerate() {
        if n.op_type == "DequantizeLinear"
            && let Some(t) = dequantized_constant(n, &inits)
        {
            made.push(t);
            drop.insert(i);
        }
    }
    for (i, n) in g.node.iter().enumerate() {
        if n.op_type != "QuantizeLinear" || outputs.contains(&n.output[0]) {
            continue;
        }
        let readers: Vec<usize> = g
            .node
            .iter()
            .enumerate()
            .filter(|(_, r)| r.input.contains(&n.output[0]))
            .map(|(k, _)| k)
            .collect();
        if readers
            .iter()
            .all(|&r| g.node[r].op_type == "DequantizeLinear")
        {
            drop.insert(i);
            for r in readers {
                if outputs.contains(&g.node[r].output[0]) {
                    // The graph output keeps its name: the DQ becomes an Identity of the float.
                    identity.insert(r, n.input[0].clone());
                } else {
                    drop.insert(r);
                    rename.insert(g.node[r].output[0].clone(), n.input[0].clone());
                }
            }
        }
    }
    let nodes = std::mem::take(&mut g.node);
    g.node = nodes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !drop.contains(i))
        .map(|(i, mut n)| {
            if let Some(x) = identity.get(&i) {
                n.op_type = "Identity".into();
                n.input = vec![x.clone()];
                n.attribute.clear();
            }
            for x in n.input.iter_mut() {
                if let Some(to) = rename.get(x) {
                    *x = to.clone();
                }
            }
            n
        })
        .collect();
    g.initializer.extend(made);
    crate::model::drop_unused_initializers(g);
    let mut info = model.info.clone();
    info.prequantized = false;
    info.nodes = g.node.len();
    Model {
        path: model.path.clone(),
        proto: p,
        info,
    }
}

/// The float constant `DequantizeLinear` node `n` computes from constant inputs: int8, uint8,
/// int32 or FP8 values, minus the zero point, times the scale, per tensor or along `axis`.
fn dequantized_constant(
    n: &pb::NodeProto,
    inits: &HashMap<String, pb::TensorProto>,
) -> Option<pb::TensorProto> {
    let x = inits.get(n.input.first()?)?;
    let scale = proto::tensor_f32(inits.get(n.input.get(1)?)?)?;
    let values: Vec<f32> = match fp8::tensor_codes(x) {
        Some(codes) => codes.iter().map(|&c| fp8::e4m3_to_f32(c)).collect(),
        None => {
            let q = proto::tensor_i64(x)?;
            let zero = match n.input.get(2).filter(|z| !z.is_empty()) {
                Some(z) => proto::tensor_i64(inits.get(z)?)?,
                None => vec![0],
            };
            let dims: Vec<usize> = x.dims.iter().map(|&d| d.max(0) as usize).collect();
            let zero: Vec<f32> = zero.iter().map(|&z| z as f32).collect();
            // The zero point runs along the same axis as the scale.
            let shifted = super::dequantize_per_axis(
                &vec![1.0; q.len()],
                &dims,
                axis(n, dims.len())?,
                &zero,
            )?;
            q.iter().zip(shifted).map(|(&v, z)| v as f32 - z).collect()
        }
    };
    let dims: Vec<usize> = x.dims.iter().map(|&d| d.max(0) as usize).collect();
    let f = super::dequantize_per_axis(&values, &dims, axis(n, dims.len())?, &scale.data)?;
    Some(proto::f32_tensor(&n.output[0], &dims, &f))
}

/// DequantizeLinear's `axis` (default 1), made non-negative; 0 for a scalar or 1-D tensor
/// whose default axis does not exist.
fn axis(n: &pb::NodeProto, rank: usize) -> Option<usize> {
    let a = proto::attr_i(n, "axis").unwrap_or(1);
    let a = if a < 0 { a + rank as i64 } else { a };
    Some(if rank <= 1 {
        0
    } else {
        usize::try_from(a).ok()?
    })
}
