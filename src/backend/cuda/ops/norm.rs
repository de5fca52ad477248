//! Normalisations and reductions: LayerNormalization (and the ReduceMean/Sub/Pow/ReduceMean/
//! Add/Sqrt/Div pattern older exporters emit, fused into the same step), Instance and Group
//! normalisation, Softmax / LogSoftmax on any axis, and the Reduce ops over any axes. Rows
//! that are contiguous in the tensor's storage are reduced in place; other axes are first
//! brought last by one strided copy.

use tract_onnx::pb;

use super::{Builder, OpFamily, Value, err};
use crate::backend::cuda::plan::{Layout, PlanResult, ReduceOp, Step};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "normalization",
    ops: &[
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "Softmax",
        "LogSoftmax",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceL2",
        "ReduceL1",
        "ReduceSumSquare",
        "ReduceProd",
        "ReduceLogSumExp",
    ],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    match n.op_type.as_str() {
        "LayerNormalization" => layer_norm(b, n),
        "InstanceNormalization" => group_norm(b, n, None),
        "GroupNormalization" => {
            let g = proto::attr_i(n, "num_groups").ok_or_else(|| err(n, "no num_groups"))?;
            group_norm(b, n, Some(g.max(1) as usize))
        }
        "Softmax" | "LogSoftmax" => softmax(b, n),
        "ReduceMean" if fuse_decomposed_layer_norm(b, i)? => Ok(()),
        _ => reduce(b, n),
    }
}

/// Reduce axes of `n` (attribute before opset 18 for most, input 1 after; ReduceSum since 13).
fn reduce_axes(b: &Builder<'_>, n: &pb::NodeProto, rank: usize) -> PlanResult<Vec<usize>> {
    let axes = match proto::attr_ints(n, "axes") {
        Some(a) => Some(a),
        None => b.ints_input(n, 1)?,
    };
    let noop = proto::attr_i(n, "noop_with_empty_axes").unwrap_or(0) == 1;
    let mut v: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&a| super::axis(n, a, rank))
            .collect::<PlanResult<_>>()?,
        _ if noop => vec![],
        _ => (0..rank).collect(),
    };
    v.sort();
    v.dedup();
    Ok(v)
}

fn reduce(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let op = match n.op_type.as_str() {
        "ReduceMean" => ReduceOp::Mean,
        "ReduceSum" => ReduceOp::Sum,
        "ReduceMax" => ReduceOp::Max,
        "ReduceMin" => ReduceOp::Min,
        "ReduceL2" => ReduceOp::L2,
        "ReduceL1" => ReduceOp::L1,
        "ReduceSumSquare" => ReduceOp::SumSquare,
        "ReduceProd" => ReduceOp::Prod,
        _ => ReduceOp::LogSumExp,
    };
    let x = b.float_tensor_of(&n.input[0], "reduce input")?;
    let rank = b.desc(x).shape.len();
    let axes = reduce_axes(b, n, rank)?;
    let keep = proto::attr_i(n, "keepdims").unwrap_or(1) == 1;
    if axes.is_empty() {
        let v = b
            .values
            .get(&n.input[0])
            .cloned()
            .ok_or_else(|| err(n, "input unknown"))?;
        b.values.insert(n.output[0].clone(), v);
        return Ok(());
    }
    let o = reduce_tensor(b, x, &axes, keep, op, &n.output[0], &n.name)?;
    b.values.insert(n.output[0].clone(), Value::Tensor(o));
    Ok(())
}

/// Reduces logical `axes` of tensor `x` into a new tensor named `out_name`.
pub(super) fn reduce_tensor(
    b: &mut Builder<'_>,
    x: usize,
    axes: &[usize],
    keep: bool,
    op: ReduceOp,
    out_name: &str,
    step_name: &str,
) -> PlanResult<usize> {
    let d = b.desc(x).clone();
    let out_shape: Vec<usize> = (0..d.shape.len())
        .filter_map(|k| {
            if axes.contains(&k) {
                keep.then_some(1)
            } else {
                Some(d.shape[k])
            }
        })
        .collect();
    // In storage order: which positions are reduced, and do they form one run?
    let order = super::stored_order(&d);
    let pos: Vec<usize> = (0..order.len())
        .filter(|&p| axes.contains(&order[p]))
        .collect();
    let run = pos.windows(2).all(|w| w[1] == w[0] + 1);
    let kept_in_order = {
        let kept: Vec<usize> = order
            .iter()
            .copied()
            .filter(|k| !axes.contains(k))
            .collect();
        kept.windows(2).all(|w| w[0] < w[1])
    };
    let keeps_nhwc = keep && d.layout == Layout::Nhwc && d.shape.len() == 4;
    if run && (kept_in_order || keeps_nhwc) {
        let sd = super::stored_dims(&d);
        let (p0, p1) = (pos[0], pos[pos.len() - 1] + 1);
        let outer: usize = sd[..p0].iter().product();
        let len: usize = sd[p0..p1].iter().product();
        let inner: usize = sd[p1..].iter().product();
        let layout = if keeps_nhwc {
            Layout::Nhwc
        } else {
            Layout::Plain
        };
        let o = b.tensor(out_name, out_shape, layout, b.float, 1.0);
        b.plan.steps.push(Step::Reduce {
            name: step_name.into(),
            input: x,
            out: o,
            outer,
            len,
            inner,
            op,
        });
        return Ok(o);
    }
    // Bring the reduced axes last (kept axes in order), then reduce contiguous rows.
    let perm: Vec<usize> = (0..d.shape.len())
        .filter(|k| !axes.contains(k))
        .chain(axes.iter().copied())
        .collect();
    let st = super::logical_strides(&d);
    let pshape: Vec<usize> = perm.iter().map(|&k| d.shape[k]).collect();
    let t = b.tensor(
        &format!("{out_name}.permuted"),
        pshape,
        Layout::Plain,
        d.dtype,
        d.scale,
    );
    let step = b.view_step(
        &format!("{step_name}.permute"),
        x,
        t,
        Some(perm.iter().map(|&k| st[k]).collect()),
        0,
    );
    b.plan.steps.push(step);
    let len: usize = axes.iter().map(|&k| d.shape[k]).product();
    let o = b.tensor(out_name, out_shape, Layout::Plain, b.float, 1.0);
    b.plan.steps.push(Step::Reduce {
        name: step_name.into(),
        input: t,
        out: o,
        outer: d.numel() / len.max(1),
        len,
        inner: 1,
        op,
    });
    Ok(o)
}

/// `Step::Norm` over the trailing `len` elements of plain tensor `x`.
#[allow(clippy::too_many_arguments)]
fn norm_rows(
    b: &mut Builder<'_>,
    x: usize,
    len: usize,
    eps: f32,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    out_name: &str,
    step_name: &str,
) -> usize {
    let d = b.desc(x).clone();
    let o = b.tensor(out_name, d.shape.clone(), Layout::Plain, b.float, 1.0);
    b.plan.steps.push(Step::Norm {
        name: step_name.into(),
        input: x,
        out: o,
        rows: d.numel() / len.max(1),
        len,
        eps,
        gamma,
        beta,
    });
    o
}

/// A constant affine parameter of `len` values (broadcast from one value if need be).
fn affine(
    b: &Builder<'_>,
    n: &pb::NodeProto,
    slot: usize,
    len: usize,
    default: f32,
) -> PlanResult<Vec<f32>> {
    match n.input.get(slot).filter(|s| !s.is_empty()) {
        None => Ok(vec![default; len]),
        Some(s) => {
            let c = b
                .const_f32(s)
                .ok_or_else(|| err(n, "scale and bias must be constants"))?;
            match c.len() {
                1 => Ok(vec![c.data[0]; len]),
                l if l == len => Ok(c.data),
                l => Err(err(n, format!("{l} parameters for rows of {len}"))),
            }
        }
    }
}

fn layer_norm(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = b.float_tensor_of(&n.input[0], "layer norm input")?;
    let x = b.to_layout(x, Layout::Plain, "layer norm")?;
    let d = b.desc(x).clone();
    let a = super::axis(n, proto::attr_i(n, "axis").unwrap_or(-1), d.shape.len())?;
    let len: usize = d.shape[a..].iter().product();
    let eps = proto::attr_f(n, "epsilon").unwrap_or(1e-5);
    let gamma = affine(b, n, 1, len, 1.0)?;
    let beta = affine(b, n, 2, len, 0.0)?;
    if n.output
        .iter()
        .skip(1)
        .any(|o| !o.is_empty() && !b.g.consumers(o).is_empty())
    {
        return Err(err(n, "the mean / inverse std outputs are not produced"));
    }
    let o = norm_rows(b, x, len, eps, gamma, beta, &n.output[0], &n.name);
    b.values.insert(n.output[0].clone(), Value::Tensor(o));
    Ok(())
}

/// Instance norm (`groups` None: one group per channel) and group norm: each (batch, group)
/// normalised over its channels and pixels, then a per-channel scale and bias.
fn group_norm(b: &mut Builder<'_>, n: &pb::NodeProto, groups: Option<usize>) -> PlanResult<()> {
    let x = b.float_tensor_of(&n.input[0], "norm input")?;
    let x = b.to_layout(x, Layout::Plain, "group norm")?;
    let d = b.desc(x).clone();
    if d.shape.len() < 3 {
        return Err(err(n, "needs an [N, C, ...] input"));
    }
    let c = d.shape[1];
    let g = groups.unwrap_or(c);
    if g == 0 || c % g != 0 {
        return Err(err(n, format!("{c} channels do not split into {g} groups")));
    }
    let spatial: usize = d.shape[2..].iter().product();
    let eps = proto::attr_f(n, "epsilon").unwrap_or(1e-5);
    let per_channel = |v: Vec<f32>| -> Vec<f32> {
        if v.len() == c {
            v
        } else {
            // Opset 18 GroupNormalization: one value per group.
            (0..c).map(|k| v[k / (c / g)]).collect()
        }
    };
    let plen = if groups.is_some()
        && n.input
            .get(1)
            .and_then(|s| b.shape_of(s))
            .is_some_and(|s| s.iter().product::<usize>() == g)
    {
        g
    } else {
        c
    };
    let scale = per_channel(affine(b, n, 1, plen, 1.0)?);
    let bias = per_channel(affine(b, n, 2, plen, 0.0)?);
    let t = norm_rows(
        b,
        x,
        (c / g) * spatial,
        eps,
        vec![],
        vec![],
        &format!("{}.normalized", n.output[0]),
        &format!("{}.normalize", n.name),
    );
    super::elementwise::channel_affine(b, n, t, scale, bias)
}

fn softmax(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = b.float_tensor_of(&n.input[0], "softmax input")?;
    let d = b.desc(x).clone();
    let r = d.shape.len();
    let legacy = b.opset < 13;
    let a = super::axis(
        n,
        proto::attr_i(n, "axis").unwrap_or(if legacy { 1 } else { -1 }),
        r.max(1),
    )?;
    let (x, outer, len, inner) = if !legacy && d.layout == Layout::Nhwc && r == 4 && a == 1 {
        // Channels are innermost in NHWC: rows of C.
        (x, d.shape[0] * d.shape[2] * d.shape[3], d.shape[1], 1)
    } else {
        let x = b.to_layout(x, Layout::Plain, "softmax")?;
        if legacy {
            // Before opset 13 the input is flattened to 2-D at `axis`.
            (
                x,
                d.shape[..a].iter().product(),
                d.shape[a..].iter().product(),
                1,
            )
        } else {
            (
                x,
                d.shape[..a].iter().product(),
                d.shape[a],
                d.shape[a + 1..].iter().product(),
            )
        }
    };
    let layout = b.desc(x).layout;
    let o = b.tensor(&n.output[0], d.shape, layout, b.float, 1.0);
    b.emit(
        n,
        o,
        Step::Softmax {
            name: n.name.clone(),
            input: x,
            out: o,
            outer,
            len,
            inner,
            log: n.op_type == "LogSoftmax",
        },
    )
}

/// Matches LayerNorm written out (torch < 1.13 style / opset < 17 exports) starting at the
/// first ReduceMean, and lowers it as one `Step::Norm` with any constant affine after it.
fn fuse_decomposed_layer_norm(b: &mut Builder<'_>, i: usize) -> PlanResult<bool> {
    let Some(m) = match_layer_norm(b, i) else {
        return Ok(false);
    };
    let x = b.float_tensor_of(&m.input, "layer norm input")?;
    let x = b.to_layout(x, Layout::Plain, "layer norm")?;
    let d = b.desc(x).clone();
    let r = d.shape.len();
    let axes: Vec<usize> = m
        .axes
        .iter()
        .map(|&a| if a < 0 { a + r as i64 } else { a } as usize)
        .collect();
    let first = r - axes.len();
    if !(first..r).all(|k| axes.contains(&k)) {
        return Ok(false);
    }
    let len: usize = d.shape[first..].iter().product();
    let fit = |v: Option<Vec<f32>>, default: f32| match v {
        Some(v) if v.len() == len => Some(v),
        Some(v) if v.len() == 1 => Some(vec![v[0]; len]),
        Some(_) => None,
        None => Some(vec![default; len]),
    };
    let (Some(gamma), Some(beta)) = (fit(m.gamma, 1.0), fit(m.beta, 0.0)) else {
        return Ok(false);
    };
    for &k in &m.nodes {
        b.skip.insert(k);
    }
    let name = m
        .nodes
        .iter()
        .map(|&k| b.g.node(k).name.clone())
        .collect::<Vec<_>>()
        .join("+");
    let o = norm_rows(b, x, len, m.eps, gamma, beta, &m.output, &name);
    b.values.insert(m.output, Value::Tensor(o));
    Ok(true)
}

struct LayerNormMatch {
    input: String,
    axes: Vec<i64>,
    eps: f32,
    gamma: Option<Vec<f32>>,
    beta: Option<Vec<f32>>,
    nodes: Vec<usize>,
    output: String,
}

fn match_layer_norm(b: &Builder<'_>, i: usize) -> Option<LayerNormMatch> {
    let g = &b.g;
    let only = |t: &str| -> Option<usize> {
        let c = g.consumers(t);
        (c.len() == 1 && !g.is_graph_output(t)).then(|| c[0].0)
    };
    let axes_of = |k: usize| -> Option<Vec<i64>> {
        let n = g.node(k);
        proto::attr_ints(n, "axes").or_else(|| b.ints_const(n.input.get(1)?))
    };
    let r1 = g.node(i);
    let x = r1.input.first()?.clone();
    let axes = axes_of(i)?;
    let sub_i = only(&r1.output[0])?;
    let sub = g.node(sub_i);
    if sub.op_type != "Sub" || sub.input[0] != x || sub.input[1] != r1.output[0] {
        return None;
    }
    let dev = &sub.output[0];
    let cons = g.consumers(dev);
    if cons.len() != 2 || g.is_graph_output(dev) {
        return None;
    }
    let (mut sq_i, mut div_i) = (None, None);
    for &(k, _) in cons {
        match g.node(k).op_type.as_str() {
            "Pow" => sq_i = Some(k),
            "Div" => div_i = Some(k),
            _ => return None,
        }
    }
    let (sq_i, div_i) = (sq_i?, div_i?);
    let sq = g.node(sq_i);
    if b.const_f32(sq.input.get(1)?)?.data.first() != Some(&2.0) {
        return None;
    }
    let r2_i = only(&sq.output[0])?;
    let r2 = g.node(r2_i);
    if r2.op_type != "ReduceMean" || axes_of(r2_i)? != axes {
        return None;
    }
    let add_i = only(&r2.output[0])?;
    let add = g.node(add_i);
    let eps_name = if add.input[0] == r2.output[0] {
        &add.input[1]
    } else {
        &add.input[0]
    };
    if add.op_type != "Add" {
        return None;
    }
    let eps = *b.const_f32(eps_name)?.data.first()?;
    let sqrt_i = only(&add.output[0])?;
    let sqrt = g.node(sqrt_i);
    let div = g.node(div_i);
    if sqrt.op_type != "Sqrt" || only(&sqrt.output[0])? != div_i || div.input[0] != *dev {
        return None;
    }
    let mut nodes = vec![i, sub_i, sq_i, r2_i, add_i, sqrt_i, div_i];
    let mut output = div.output[0].clone();
    let other = |k: usize, t: &str| -> Option<Vec<f32>> {
        let n = g.node(k);
        let o = if n.input[0] == t {
            &n.input[1]
        } else {
            &n.input[0]
        };
        b.const_of(o).map(|c| c.data)
    };
    let mut gamma = None;
    let mut beta = None;
    if let Some(k) = only(&output)
        && g.node(k).op_type == "Mul"
        && let Some(v) = other(k, &output)
    {
        gamma = Some(v);
        nodes.push(k);
        output = g.node(k).output[0].clone();
    }
    if let Some(k) = only(&output)
        && g.node(k).op_type == "Add"
        && let Some(v) = other(k, &output)
    {
        beta = Some(v);
        nodes.push(k);
        output = g.node(k).output[0].clone();
    }
    Some(LayerNormMatch {
        input: x,
        axes,
        eps,
        gamma,
        beta,
        nodes,
        output,
    })
}
