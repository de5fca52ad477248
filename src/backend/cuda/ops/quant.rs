//! QuantizeLinear / DequantizeLinear of the Q/DQ plan: symmetric int8 (zero point 0) in INT8
//! engines, FP8 E4M3 (`float8e4m3fn`, zero point 0) in FP8 ones; per-tensor for activations,
//! per-axis for constant weights. A dequantized activation stays quantized (`Value::Dequant`)
//! so readers that take it (convolutions, matmuls, elementwise) read it with its scale and only
//! float-only readers get a dequantized copy.

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

/// The quantized type a zero-point initializer names when it is all zeros: I8 for int8, F8
/// for `float8e4m3fn`; `None` for anything else (uint8, a non-zero zero point).
fn zero_point_type(t: &pb::TensorProto) -> Option<DType> {
    if t.data_type == pb::tensor_proto::DataType::Int8 as i32 {
        proto::tensor_i64(t)?
            .iter()
            .all(|&v| v == 0)
            .then_some(DType::I8)
    } else {
        crate::quant::fp8::tensor_codes(t)?
            .iter()
            .all(|&c| c & 0x7f == 0)
            .then_some(DType::F8)
    }
}

/// The per-tensor scale of Q node `n` when it quantizes to this engine's type with zero
/// point 0.
pub(super) fn q_scale(b: &Builder<'_>, n: &pb::NodeProto) -> Option<f32> {
    let s = b.const_of(n.input.get(1)?)?;
    let zp = b.g.initializer(n.input.get(2)?)?;
    let same = b.quant.is_some() && zero_point_type(zp) == b.quant;
    (s.len() == 1 && same).then_some(s.data[0])
}

fn quantize(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let scale = b
        .const_of(&n.input[1])
        .filter(|s| s.len() == 1)
        .ok_or_else(|| err(n, "only per-tensor constant scales are supported"))?
        .data[0];
    let zp = n
        .input
        .get(2)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| err(n, "uint8 quantization (no zero point) is not supported"))?;
    let Some(engine_t) = b.quant else {
        return Err(err(n, "QuantizeLinear in a float engine"));
    };
    let t = b.g.initializer(zp).and_then(zero_point_type);
    if t != Some(engine_t) {
        return Err(err(
            n,
            match engine_t {
                DType::F8 => "an FP8 engine takes FP8 E4M3 Q/DQ (float8e4m3fn, zero point 0)",
                _ => {
                    "only symmetric int8 (zero point 0) is supported: re-quantize with symmetric activations, or give quantscope the float model to calibrate"
                }
            },
        ));
    }
    let x = b.float_tensor_of(&n.input[0], "quantize input")?;
    let d = b.desc(x).clone();
    let o = b.tensor(&n.output[0], d.shape, d.layout, engine_t, scale);
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
    // A quantized weight: its unscaled values, and its quantized form, kept under the DQ
    // output's name (`#int8` / `#fp8`) for the layers that take it.
    let (values, dims, key, quantized) = match b.values.get(&n.input[0]).cloned() {
        Some(Value::ConstI8 { data, dims, .. }) => (
            data.iter().map(|&v| v as f32).collect::<Vec<f32>>(),
            dims.clone(),
            "int8",
            Value::ConstI8 {
                data,
                dims,
                scales: scales.clone(),
            },
        ),
        Some(Value::ConstF8 { codes, dims, .. }) => (
            codes
                .iter()
                .map(|&c| crate::quant::fp8::e4m3_to_f32(c))
                .collect(),
            dims.clone(),
            "fp8",
            Value::ConstF8 {
                codes,
                dims,
                scales: scales.clone(),
            },
        ),
        Some(Value::Tensor(t)) if b.desc(t).dtype.is_quantized() => {
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
            return Ok(());
        }
        _ => {
            return Err(err(
                n,
                "input is not a quantized (int8 or FP8) tensor or constant",
            ));
        }
    };
    let axis = proto::attr_i(n, "axis").unwrap_or(1);
    let axis = super::axis(n, axis, dims.len().max(1))?;
    let f = crate::quant::dequantize_per_axis(&values, &dims, axis, &scales)
        .ok_or_else(|| err(n, "per-axis scales do not match the weight's axis"))?;
    b.values.insert(format!("{}#{key}", n.output[0]), quantized);
    b.values.insert(
        n.output[0].clone(),
        Value::Const(proto::F32Tensor { dims, data: f }),
    );
    Ok(())
}
