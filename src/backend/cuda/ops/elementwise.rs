//! Elementwise ops with full NumPy broadcasting in any layout (`Step::Nary` reads each input
//! through its own strides, so a `[1,C,1,1]` squeeze-excite scale multiplies an NHWC
//! activation without a copy), every activation (`Act`), and the pass-through ops (Identity,
//! Dropout, float-to-float Cast). A following activation is fused into the step.

use tract_onnx::pb;

use super::{Builder, OpFamily, Value, err};
use crate::backend::cuda::plan::{Act, EwOp, Layout, Operand, PlanResult, Step};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "elementwise",
    ops: &[
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "Not",
        "Mod",
        "Where",
        "PRelu",
        "Relu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Erf",
        "Gelu",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "Abs",
        "Softplus",
        "LeakyRelu",
        "Elu",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "Sin",
        "Cos",
        "Selu",
        "Softsign",
        "Mish",
        "Identity",
        "Dropout",
        "Cast",
    ],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let op = n.op_type.as_str();
    match op {
        "Identity" | "Dropout" | "Cast" => pass_through(b, n),
        "Mean" => variadic(b, n),
        "Sum" | "Max" | "Min" if n.input.len() != 2 => variadic(b, n),
        _ => {
            if let Some(ew) = binary_op(n)? {
                return nary(b, n, ew);
            }
            let mut act = act_of(b, n)
                .ok_or_else(|| err(n, "its parameters must be constants (Clip bounds, slopes)"))?;
            let (mut out, mut name) = (n.output[0].clone(), n.name.clone());
            if let Some(mi) = silu_mul(b, n) {
                // One pass instead of a sigmoid pass and a two-input multiply pass.
                let m = b.g.node(mi);
                b.skip.insert(mi);
                (act, out, name) = (Act::Silu, m.output[0].clone(), format!("{name}+{}", m.name));
            }
            let x = b.float_tensor_of(&n.input[0], "activation input")?;
            let d = b.desc(x).clone();
            let o = b.tensor(&out, d.shape, d.layout, b.float, 1.0);
            b.plan.steps.push(Step::Unary {
                name,
                input: x,
                out: o,
                act,
            });
            b.values.insert(out, Value::Tensor(o));
            Ok(())
        }
    }
}

/// The Mul of SiLU spelled `Mul(x, Sigmoid(x))` (either operand order), as PyTorch exports
/// `nn.SiLU` (ONNX has no SiLU op; EfficientNet has one in every block): when `n` is that
/// Sigmoid and the Mul its only reader, the Mul's node index.
pub(super) fn silu_mul(b: &Builder<'_>, n: &pb::NodeProto) -> Option<usize> {
    if n.op_type != "Sigmoid" {
        return None;
    }
    let mi = b.single_consumer(&n.output[0])?;
    let m = b.g.node(mi);
    let (x, s) = (&n.input[0], &n.output[0]);
    let pair = m.input.len() == 2
        && ((&m.input[0], &m.input[1]) == (x, s) || (&m.input[0], &m.input[1]) == (s, x));
    (m.op_type == "Mul" && pair && !b.skip.contains(&mi)).then_some(mi)
}

/// The elementwise op of a binary / ternary node, None for activations.
fn binary_op(n: &pb::NodeProto) -> PlanResult<Option<EwOp>> {
    Ok(Some(match n.op_type.as_str() {
        "Add" | "Sum" => EwOp::Add,
        "Sub" => EwOp::Sub,
        "Mul" => EwOp::Mul,
        "Div" => EwOp::Div,
        "Pow" => EwOp::Pow,
        "Max" => EwOp::Max,
        "Min" => EwOp::Min,
        "Equal" => EwOp::Equal,
        "Less" => EwOp::Less,
        "Greater" => EwOp::Greater,
        "LessOrEqual" => EwOp::LessOrEqual,
        "GreaterOrEqual" => EwOp::GreaterOrEqual,
        "And" => EwOp::And,
        "Or" => EwOp::Or,
        "Xor" => EwOp::Xor,
        "Mod" => {
            if proto::attr_i(n, "fmod").unwrap_or(0) == 1 {
                EwOp::Fmod
            } else {
                EwOp::Mod
            }
        }
        "Where" => EwOp::Where,
        "PRelu" => EwOp::PRelu,
        _ => return Ok(None),
    }))
}

/// The activation `n` computes, when it is one with constant parameters.
pub(super) fn act_of(b: &Builder<'_>, n: &pb::NodeProto) -> Option<Act> {
    let f = |name: &str, default: f32| proto::attr_f(n, name).unwrap_or(default);
    Some(match n.op_type.as_str() {
        "Relu" => Act::Relu,
        "Sigmoid" => Act::Sigmoid,
        "HardSwish" => Act::HardSwish,
        "HardSigmoid" => Act::HardSigmoid(f("alpha", 0.2), f("beta", 0.5)),
        "Tanh" => Act::Tanh,
        "Erf" => Act::Erf,
        "Gelu" => match proto::attr_str(n, "approximate").as_deref() {
            Some("tanh") => Act::GeluTanh,
            _ => Act::Gelu,
        },
        "Exp" => Act::Exp,
        "Log" => Act::Log,
        "Sqrt" => Act::Sqrt,
        "Reciprocal" => Act::Reciprocal,
        "Neg" => Act::Neg,
        "Abs" => Act::Abs,
        "Softplus" => Act::Softplus,
        "LeakyRelu" => Act::LeakyRelu(f("alpha", 0.01)),
        "Elu" => Act::Elu(f("alpha", 1.0)),
        "Not" => Act::Not,
        "Floor" => Act::Floor,
        "Ceil" => Act::Ceil,
        "Round" => Act::Round,
        "Sign" => Act::Sign,
        "Sin" => Act::Sin,
        "Cos" => Act::Cos,
        "Selu" => Act::Selu(f("alpha", 1.673_263_2), f("gamma", 1.050_701)),
        "Softsign" => Act::Softsign,
        "Mish" => Act::Mish,
        "Clip" => {
            let bound = |slot: usize, attr: &str, default: f32| -> Option<f32> {
                match n.input.get(slot).filter(|s| !s.is_empty()) {
                    Some(name) => b.const_f32(name).and_then(|t| t.data.first().copied()),
                    None => Some(proto::attr_f(n, attr).unwrap_or(default)),
                }
            };
            Act::Clip(
                bound(1, "min", f32::NEG_INFINITY)?,
                bound(2, "max", f32::INFINITY)?,
            )
        }
        _ => return None,
    })
}

/// Identity, Dropout (inference: identity) and Cast between float types share the tensor.
fn pass_through(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    if n.op_type == "Cast" {
        use pb::tensor_proto::DataType as T;
        let to = proto::attr_i(n, "to").unwrap_or(0) as i32;
        let float = [
            T::Float as i32,
            T::Float16 as i32,
            T::Double as i32,
            T::Bfloat16 as i32,
        ];
        if !float.contains(&to) {
            return Err(err(
                n,
                format!(
                    "casting a computed tensor to {} is not supported (only shapes may be integers here)",
                    proto::data_type_name(to)
                ),
            ));
        }
    }
    let v = b
        .values
        .get(&n.input[0])
        .cloned()
        .ok_or_else(|| err(n, "input unknown"))?;
    b.values.insert(n.output[0].clone(), v);
    Ok(())
}

/// Sum / Mean / Max / Min of any number of inputs, as a chain of binary steps.
fn variadic(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let ew = match n.op_type.as_str() {
        "Max" => EwOp::Max,
        "Min" => EwOp::Min,
        _ => EwOp::Add,
    };
    let mut acc = n.input[0].clone();
    for (k, x) in n.input.iter().enumerate().skip(1) {
        let name = format!("{}.part{k}", n.output[0]);
        let o = nary_of(
            b,
            n,
            ew,
            &[acc.clone(), x.clone()],
            &name,
            Act::None,
            &n.name,
        )?;
        b.values.insert(name.clone(), Value::Tensor(o));
        acc = name;
    }
    if n.input.len() == 1 {
        let v = b
            .values
            .get(&acc)
            .cloned()
            .ok_or_else(|| err(n, "input unknown"))?;
        b.values.insert(n.output[0].clone(), v);
        return Ok(());
    }
    let t = b.float_tensor_of(&acc, "sum")?;
    if n.op_type == "Mean" {
        let o = scale_by(b, t, 1.0 / n.input.len() as f32, &n.name)?;
        b.values.insert(n.output[0].clone(), Value::Tensor(o));
    } else {
        b.values.insert(n.output[0].clone(), Value::Tensor(t));
    }
    Ok(())
}

/// A binary / ternary node as one step, with the activation that follows fused.
fn nary(b: &mut Builder<'_>, n: &pb::NodeProto, ew: EwOp) -> PlanResult<()> {
    if n.input.len() != ew.arity() {
        return Err(err(n, format!("expects {} inputs", ew.arity())));
    }
    if n.input.iter().all(|s| b.is_const(s)) {
        // Constant masks and tables tract did not fold (e.g. Where on integer conditions).
        return fold(b, n, ew);
    }
    let mut fused = vec![];
    let (act, tname) = b.fuse_act(&n.output[0], &mut fused, true);
    let name = std::iter::once(n.name.clone())
        .chain(fused)
        .collect::<Vec<_>>()
        .join("+");
    let o = nary_of(b, n, ew, &n.input, &tname, act, &name)?;
    b.values.insert(tname, Value::Tensor(o));
    Ok(())
}

/// `ew` of constant inputs, evaluated on the host with NumPy broadcasting.
fn fold(b: &mut Builder<'_>, n: &pb::NodeProto, ew: EwOp) -> PlanResult<()> {
    let cs: Vec<proto::F32Tensor> = n
        .input
        .iter()
        .map(|s| {
            b.const_f32(s)
                .ok_or_else(|| err(n, format!("constant `{s}` has no float value")))
        })
        .collect::<PlanResult<_>>()?;
    let shapes: Vec<Vec<usize>> = cs.iter().map(|c| c.dims.clone()).collect();
    let out = super::broadcast_shape(&shapes).ok_or_else(|| err(n, "inputs do not broadcast"))?;
    let strides: Vec<Vec<i64>> = cs
        .iter()
        .map(|c| super::bcast_logical(&c.dims, &super::row_major(&c.dims), &out))
        .collect();
    let total: usize = out.iter().product();
    let mut data = Vec::with_capacity(total);
    let mut vals = vec![0f32; cs.len()];
    for i in 0..total {
        let mut rem = i;
        let mut idx = vec![0i64; cs.len()];
        for d in (0..out.len()).rev() {
            let k = (rem % out[d]) as i64;
            rem /= out[d];
            for (j, st) in strides.iter().enumerate() {
                idx[j] += k * st[d];
            }
        }
        for (j, c) in cs.iter().enumerate() {
            vals[j] = c.data[idx[j] as usize];
        }
        data.push(ew.apply(&vals));
    }
    b.values.insert(
        n.output[0].clone(),
        Value::Const(proto::F32Tensor { dims: out, data }),
    );
    Ok(())
}

/// One `Step::Nary` of `op` over the values `ins`, into a new tensor named `out_name`.
pub(super) fn nary_of(
    b: &mut Builder<'_>,
    n: &pb::NodeProto,
    op: EwOp,
    ins: &[String],
    out_name: &str,
    act: Act,
    step_name: &str,
) -> PlanResult<usize> {
    let shapes: Vec<Vec<usize>> = ins
        .iter()
        .map(|s| {
            b.shape_of(s)
                .ok_or_else(|| err(n, format!("input `{s}` unknown")))
        })
        .collect::<PlanResult<_>>()?;
    let out_shape = super::broadcast_shape(&shapes).ok_or_else(|| {
        err(
            n,
            format!("inputs {shapes:?} do not broadcast (or rank above 8)"),
        )
    })?;
    let mut operands = vec![];
    let mut nhwc = false;
    for s in ins {
        if b.is_const(s) {
            let c = b
                .const_f32(s)
                .ok_or_else(|| err(n, format!("constant `{s}` has no float value")))?;
            operands.push(Operand::Const(c.data, c.dims));
        } else {
            let t = b.any_tensor_of(s, "elementwise input")?;
            let d = b.desc(t);
            nhwc |= d.layout == Layout::Nhwc && d.shape.len() == 4 && d.shape == out_shape;
            operands.push(Operand::Tensor(t));
        }
    }
    if !operands.iter().any(|o| matches!(o, Operand::Tensor(_))) {
        return Err(err(
            n,
            "every input is a constant but it could not be folded",
        ));
    }
    let layout = if nhwc { Layout::Nhwc } else { Layout::Plain };
    let o = b.tensor(out_name, out_shape.clone(), layout, b.float, 1.0);
    let od = b.desc(o).clone();
    let strides = operands
        .iter()
        .map(|op| match op {
            Operand::Const(_, dims) => super::bcast_strides(dims, &od),
            Operand::Tensor(t) => {
                let d = b.desc(*t);
                let logical =
                    super::bcast_logical(&d.shape, &super::logical_strides(d), &out_shape);
                super::to_stored(&od, &logical).1
            }
        })
        .collect();
    b.plan.steps.push(Step::Nary {
        name: step_name.into(),
        op,
        inputs: operands,
        strides,
        dims: super::stored_dims(&od),
        out: o,
        act,
    });
    Ok(o)
}

/// `x * scale[c] + shift[c]` over axis 1 of tensor `x` (BatchNormalization left unfolded,
/// the affine of Instance/GroupNormalization), with the activation that follows fused; the
/// result is node `n`'s output.
pub(super) fn channel_affine(
    b: &mut Builder<'_>,
    n: &pb::NodeProto,
    x: usize,
    scale: Vec<f32>,
    shift: Vec<f32>,
) -> PlanResult<()> {
    let d = b.desc(x).clone();
    // [C, 1, ..., 1] broadcasts over axis 1.
    let pdims: Vec<usize> = std::iter::once(scale.len())
        .chain(std::iter::repeat_n(1, d.shape.len().saturating_sub(2)))
        .collect();
    let t = b.tensor(
        &format!("{}.scaled", n.output[0]),
        d.shape.clone(),
        d.layout,
        b.float,
        1.0,
    );
    let dims = super::stored_dims(&d);
    let xs = super::to_stored(&d, &super::logical_strides(&d)).1;
    let cs = super::bcast_strides(&pdims, &d);
    b.plan.steps.push(Step::Nary {
        name: format!("{}.scale", n.name),
        op: EwOp::Mul,
        inputs: vec![Operand::Tensor(x), Operand::Const(scale, pdims.clone())],
        strides: vec![xs.clone(), cs.clone()],
        dims: dims.clone(),
        out: t,
        act: Act::None,
    });
    let mut fused = vec![];
    let (act, tname) = b.fuse_act(&n.output[0], &mut fused, true);
    let o = b.tensor(&tname, d.shape, d.layout, b.float, 1.0);
    b.plan.steps.push(Step::Nary {
        name: std::iter::once(n.name.clone())
            .chain(fused)
            .collect::<Vec<_>>()
            .join("+"),
        op: EwOp::Add,
        inputs: vec![Operand::Tensor(t), Operand::Const(shift, pdims)],
        strides: vec![xs, cs],
        dims,
        out: o,
        act,
    });
    b.values.insert(tname, Value::Tensor(o));
    Ok(())
}

/// `t * factor` as a new tensor.
pub(super) fn scale_by(
    b: &mut Builder<'_>,
    t: usize,
    factor: f32,
    name: &str,
) -> PlanResult<usize> {
    let d = b.desc(t).clone();
    let o = b.tensor(
        &format!("{name}.scaled"),
        d.shape.clone(),
        d.layout,
        b.float,
        1.0,
    );
    let dims = super::stored_dims(&d);
    b.plan.steps.push(Step::Nary {
        name: name.into(),
        op: EwOp::Mul,
        inputs: vec![Operand::Tensor(t), Operand::Const(vec![factor], vec![1])],
        strides: vec![
            super::to_stored(&d, &super::logical_strides(&d)).1,
            vec![0; dims.len()],
        ],
        dims,
        out: o,
        act: Act::None,
    });
    Ok(o)
}
