//! QuantizeLinear / DequantizeLinear of the Q/DQ plan: symmetric int8 only (zero point 0),
//! per-tensor for activations, per-axis for constant weights. A dequantized activation stays
//! int8 (`Value::Dequant`) so readers that take int8 (convolutions, matmuls, elementwise)
//! read it with its scale and only float-only readers get a dequantized copy.

use super::{Builder, OpFamily, Value, err};
use crate::backend::cuda::plan::{Act, DType, PlanResult, Step};
use crate::model::proto;
use tract_onnx::pb;

pub const FAMILY: OpFamily = OpFamily {
    name: "quantization",
    ops: &["QuantizeLinear", "DequantizeLinear"],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    if b.g.node(i).op_type == "QuantizeLinear" {
        quantize(b, i)
    } else {
        dequantize(b, i)
    }
}

/// The per-tensor scale of Q node `n` when its zero point is a symmetric int8 0.
pub(super) fn q_scale(b: &Builder<'_>, n: &pb::NodeProto) -> Option<f32> {
    let s = b.const_of(n.input.get(1)?)?;
    let zp = b.g.initializer(n.input.get(2)?)?;
    let zero = zp.data_type == pb::tensor_proto::DataType::Int8 as i32
        && proto::tensor_i64(zp)?.iter().all(|&v| v == 0);
    (s.len() == 1 && zero).then_some(s.data[0])
}

fn quantize(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let scale = b
        .const_of(&n.input[1])
        .filter(|s| s.len() == 1)
        .ok_or_else(|| err(n, "only per-tensor constant scales are supported"))?
        .data[0];
    match n.input.get(2).filter(|s| !s.is_empty()) {
        Some(zp) => {
            let ok = b.g.initializer(zp).is_some_and(|t| {
                t.data_type == pb::tensor_proto::DataType::Int8 as i32
                    && proto::tensor_i64(t).is_some_and(|v| v.iter().all(|&z| z == 0))
            });
            if !ok {
                return Err(err(n, "only symmetric int8 (zero point 0) is supported"));
            }
        }
        None => {
            return Err(err(
                n,
                "uint8 quantization (no zero point) is not supported",
            ));
        }
    }
    if !b.int8 {
        return Err(err(n, "QuantizeLinear in a float engine"));
    }
    let x = b.float_tensor_of(&n.input[0], "quantize input")?;
    let d = b.desc(x).clone();
    let o = b.tensor(&n.output[0], d.shape, d.layout, DType::I8, scale);
    b.emit(
        n,
        o,
        Step::Unary {
            name: n.name.clone(),
            input: x,
            out: o,
            act: Act::None,
        },
    )
}

fn dequantize(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let scales = b
        .const_of(&n.input[1])
        .ok_or_else(|| err(n, "scale must be a constant"))?
        .data;
    match b.values.get(&n.input[0]).cloned() {
        Some(Value::ConstI8 { data, dims, .. }) => {
            // A quantized weight: keep the int8 data and also its float value.
            let axis = proto::attr_i(n, "axis").unwrap_or(1);
            let axis = super::axis(n, axis, dims.len().max(1))?;
            let per = scales.len() != 1;
            if per && dims.get(axis) != Some(&scales.len()) {
                return Err(err(n, "per-axis scales do not match the weight's axis"));
            }
            let inner: usize = dims.get(axis + 1..).map_or(1, |d| d.iter().product());
            let f: Vec<f32> = data
                .iter()
                .enumerate()
                .map(|(k, &v)| {
                    let s = if per {
                        scales[(k / inner) % dims[axis]]
                    } else {
                        scales[0]
                    };
                    v as f32 * s
                })
                .collect();
            // Keep the int8 form under the DQ output's name for the layers that take it.
            b.values.insert(
                format!("{}#int8", n.output[0]),
                Value::ConstI8 {
                    data,
                    dims: dims.clone(),
                    scales,
                },
            );
            b.values.insert(
                n.output[0].clone(),
                Value::Const(proto::F32Tensor { dims, data: f }),
            );
            Ok(())
        }
        Some(Value::Tensor(t)) if b.desc(t).dtype == DType::I8 => {
            if scales.len() != 1 {
                return Err(err(n, "per-channel activation dequantization"));
            }
            b.values.insert(
                n.output[0].clone(),
                Value::Dequant {
                    src: t,
                    scale: scales[0],
                },
            );
            Ok(())
        }
        _ => Err(err(n, "input is not an int8 tensor or int8 constant")),
    }
}
