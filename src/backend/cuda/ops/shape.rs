//! Shape subgraphs and constant folding: `Shape`/`Size` of device tensors become host
//! constants (shapes are fixed per engine), and any node whose inputs are all constants
//! (Gather on shapes, ConstantOfShape, Range, Where on masks, arithmetic on shapes, ...) is
//! evaluated on the host with tract's implementation of the op, so no kernel runs for it and
//! its ONNX semantics are tract's, not a second copy of them.

use std::sync::OnceLock;

use tract_onnx::model::ParsingContext;
use tract_onnx::pb;
use tract_onnx::prelude::*;

use super::{Builder, OpFamily, Value, err};
use crate::backend::cuda::plan::PlanResult;
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "shape",
    ops: &[
        "Shape",
        "Size",
        "ConstantOfShape",
        "Range",
        "Constant",
        "EyeLike",
    ],
    lower,
};

/// Folded outputs larger than this many elements are refused (a mask or table that large is
/// not a shape computation, and would be uploaded as a constant).
const MAX_FOLDED_ELEMENTS: usize = 1 << 26;

/// Ops never folded here: a dequantized constant weight stays int8 for the layers that take
/// it (`quant`). A QuantizeLinear of a constant (a weight shared through Identity, which the
/// Q/DQ plan quantizes like an activation) folds to an int8 constant.
const NO_FOLD: &[&str] = &["DequantizeLinear"];

fn onnx() -> &'static tract_onnx::Onnx {
    static ONNX: OnceLock<tract_onnx::Onnx> = OnceLock::new();
    ONNX.get_or_init(tract_onnx::onnx)
}

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    // Shape and Size of device tensors are handled by `try_fold`; anything that reaches
    // here had an input that is computed on the device.
    Err(err(
        n,
        "its inputs must be build-time constants (they depend on computed values here)",
    ))
}

/// Folds node `n` on the host when it can: returns whether it did.
pub(super) fn try_fold(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<bool> {
    let op = n.op_type.as_str();
    if op == "Shape" || op == "Size" {
        let Some(shape) = n.input.first().and_then(|x| b.shape_of(x)) else {
            return Ok(false);
        };
        let v: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let t = if op == "Size" {
            tensor0(v.iter().product::<i64>())
        } else {
            let r = v.len() as i64;
            let clamp = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
            let start = clamp(proto::attr_i(n, "start").unwrap_or(0));
            let end = clamp(proto::attr_i(n, "end").unwrap_or(r));
            tensor1(&v[start..end.max(start)])
        };
        b.values.insert(n.output[0].clone(), Value::Host(t));
        return Ok(true);
    }
    if NO_FOLD.contains(&op) {
        return Ok(false);
    }
    let ins: Vec<&String> = n.input.iter().filter(|s| !s.is_empty()).collect();
    if !ins.iter().all(|s| b.is_const(s)) {
        return Ok(false);
    }
    let Some(inputs) = ins
        .iter()
        .map(|s| host_tensor(b, s).map(|t| t.into_tvalue()))
        .collect::<Option<TVec<TValue>>>()
    else {
        return Ok(false);
    };
    let Some(outs) = eval(b, n, inputs) else {
        return Ok(false);
    };
    for (name, t) in n.output.iter().zip(outs) {
        if name.is_empty() {
            continue;
        }
        if t.len() > MAX_FOLDED_ELEMENTS {
            return Err(err(
                n,
                format!(
                    "folds to a constant of {} elements; that is not a shape computation",
                    t.len()
                ),
            ));
        }
        b.values.insert(name.clone(), value_of(t));
    }
    Ok(true)
}

/// Evaluates `n` on `inputs` with tract's op; None when tract cannot (then the op's family
/// lowers it, or reports it).
fn eval(b: &Builder<'_>, n: &pb::NodeProto, inputs: TVec<TValue>) -> Option<Vec<Tensor>> {
    let framework = onnx();
    let build = framework.op_register.0.get(&n.op_type)?;
    let ctx = ParsingContext {
        onnx_operator_set_version: b.opset,
        framework,
        model: b.model,
        parent_graphs: vec![],
        model_dir: None,
        template: InferenceModel::default(),
    };
    let (op, _) = build(&ctx, n).ok()?;
    // tract may panic on inputs it does not expect; that only means "not folded here".
    let out = crate::guard::catch("folding a constant", || op.eval_out_of_plan(inputs))
        .ok()?
        .ok()??;
    Some(out.into_iter().map(|v| v.into_tensor()).collect())
}

/// A constant value as a tract tensor.
fn host_tensor(b: &Builder<'_>, name: &str) -> Option<Tensor> {
    match b.values.get(name)? {
        Value::Host(t) => Some(t.clone()),
        Value::Const(c) => Tensor::from_shape(&c.dims, &c.data).ok(),
        Value::ConstI8 { data, dims, .. } => Tensor::from_shape(dims, data).ok(),
        _ => None,
    }
}

/// A folded tensor as a planner value: floats as float constants, the rest as host values.
fn value_of(t: Tensor) -> Value {
    let dt = t.datum_type();
    if dt.is_float()
        && let Some(data) = super::host_values::<f32>(&t)
    {
        return Value::Const(proto::F32Tensor {
            dims: t.shape().to_vec(),
            data,
        });
    }
    if dt == i8::datum_type()
        && let Some(data) = super::host_values::<i8>(&t)
    {
        return Value::ConstI8 {
            data,
            dims: t.shape().to_vec(),
            scales: vec![],
        };
    }
    Value::Host(t)
}
