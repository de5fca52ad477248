//! Data movement as real ops: Transpose (any perm), Slice (steps, negative), Expand, Tile,
//! Gather with a scalar index, Split and DepthToSpace / SpaceToDepth are one strided copy each
//! (`Step::View`, reading through the input's layout); Reshape, Flatten, Squeeze and
//! Unsqueeze are free views of a plain tensor; Gather with several or computed indices,
//! Concat and Pad have their own steps.

use tract_onnx::pb;

use super::{Builder, OpFamily, Value, err};
use crate::backend::cuda::plan::{
    Layout, MAX_RANK, Operand, PadMode, PlanResult, Step, reshape_dims, squeeze_dims,
};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "movement",
    ops: &[
        "Transpose",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Expand",
        "Tile",
        "Gather",
        "Slice",
        "Split",
        "Concat",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
    ],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    match n.op_type.as_str() {
        "Transpose" => transpose(b, n),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => reshape(b, n),
        "Expand" => expand(b, n),
        "Tile" => tile(b, n),
        "Gather" => gather(b, n),
        "Slice" => slice(b, n),
        "Split" => split(b, n),
        "Concat" => concat(b, n),
        "Pad" => pad(b, n),
        _ => depth_space(b, n),
    }
}

/// The node's first input as a device tensor (int8 kept: movement does not change values).
fn input(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<usize> {
    b.any_tensor_of(&n.input[0], &format!("{} input", n.op_type))
}

/// Emits a view of `x` into a new tensor of logical `shape` for node output `name`:
/// `logical[k]` is the input stride of output dim k. The output keeps an NHWC layout when
/// `keep_layout` and the input has one.
#[allow(clippy::too_many_arguments)]
fn view(
    b: &mut Builder<'_>,
    x: usize,
    name: &str,
    step_name: &str,
    shape: Vec<usize>,
    logical: Vec<i64>,
    offset: i64,
    keep_layout: bool,
) -> PlanResult<usize> {
    if shape.len() > MAX_RANK {
        return Err(format!(
            "`{step_name}`: rank {} is above {MAX_RANK}",
            shape.len()
        ));
    }
    let d = b.desc(x).clone();
    let layout = if keep_layout && d.layout == Layout::Nhwc && shape.len() == 4 {
        Layout::Nhwc
    } else {
        Layout::Plain
    };
    let o = b.tensor(name, shape, layout, d.dtype, d.scale);
    let step = b.view_step(step_name, x, o, Some(logical), offset);
    b.plan.steps.push(step);
    b.values.insert(name.into(), Value::Tensor(o));
    Ok(o)
}

fn transpose(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let r = d.shape.len();
    let perm: Vec<usize> = proto::attr_ints(n, "perm")
        .map(|p| p.iter().map(|&v| v as usize).collect())
        .unwrap_or_else(|| (0..r).rev().collect());
    let mut seen = perm.clone();
    seen.sort();
    if seen != (0..r).collect::<Vec<_>>() {
        return Err(err(
            n,
            format!("perm {perm:?} is not a permutation of rank {r}"),
        ));
    }
    let st = super::logical_strides(&d);
    let shape = perm.iter().map(|&p| d.shape[p]).collect();
    let logical = perm.iter().map(|&p| st[p]).collect();
    view(b, x, &n.output[0], &n.name, shape, logical, 0, false)?;
    Ok(())
}

fn reshape(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let new_shape: Vec<usize> = match n.op_type.as_str() {
        "Flatten" => {
            let r = d.shape.len();
            let a = proto::attr_i(n, "axis").unwrap_or(1);
            let a = if a < 0 { a + r as i64 } else { a };
            if !(0..=r as i64).contains(&a) {
                return Err(err(n, format!("axis {a} out of range for rank {r}")));
            }
            let a = a as usize;
            vec![d.shape[..a].iter().product(), d.shape[a..].iter().product()]
        }
        "Reshape" => {
            let spec = b
                .ints_input(n, 1)?
                .ok_or_else(|| err(n, "no target shape"))?;
            if proto::attr_i(n, "allowzero").unwrap_or(0) == 1 && spec.contains(&0) {
                return Err(err(n, "allowzero with a 0 in the shape is not supported"));
            }
            reshape_dims(&d.shape, &spec)
                .ok_or_else(|| err(n, format!("cannot reshape {:?} to {spec:?}", d.shape)))?
        }
        _ => {
            let axes = match proto::attr_ints(n, "axes") {
                Some(a) => a,
                None => b.ints_input(n, 1)?.unwrap_or_default(),
            };
            let squeeze = n.op_type == "Squeeze";
            let axes = if squeeze && axes.is_empty() {
                (0..d.shape.len() as i64)
                    .filter(|&k| d.shape[k as usize] == 1)
                    .collect()
            } else {
                axes
            };
            squeeze_dims(&d.shape, &axes, squeeze).ok_or_else(|| err(n, "bad axes"))?
        }
    };
    // Only a plain (row-major) tensor can be viewed under a new shape; an NHWC tensor with
    // H = W = 1 has the same order as its plain form.
    let same_order =
        d.layout == Layout::Plain || d.shape.len() != 4 || d.shape[2] * d.shape[3] == 1;
    let src = if same_order {
        x
    } else {
        b.to_layout(x, Layout::Plain, "reshape")?
    };
    b.alias(&n.output[0], src, new_shape);
    Ok(())
}

fn expand(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let spec: Vec<usize> = b
        .ints_input(n, 1)?
        .ok_or_else(|| err(n, "no shape"))?
        .iter()
        .map(|&v| v.max(0) as usize)
        .collect();
    let shape = super::broadcast_shape(&[d.shape.clone(), spec.clone()])
        .ok_or_else(|| err(n, format!("{:?} does not broadcast to {spec:?}", d.shape)))?;
    let logical = super::bcast_logical(&d.shape, &super::logical_strides(&d), &shape);
    view(b, x, &n.output[0], &n.name, shape, logical, 0, true)?;
    Ok(())
}

fn tile(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let reps = b.ints_input(n, 1)?.ok_or_else(|| err(n, "no repeats"))?;
    if reps.len() != d.shape.len() || reps.iter().any(|&r| r < 1) {
        return Err(err(n, "repeats must be positive, one per dim"));
    }
    // out[r * len + i] = in[i]: each repeated dim becomes (repeat, len) with stride (0, s).
    let st = super::logical_strides(&d);
    let (mut dims, mut strides) = (vec![], vec![]);
    for (k, &r) in reps.iter().enumerate() {
        if r > 1 {
            dims.push(r as usize);
            strides.push(0);
        }
        dims.push(d.shape[k]);
        strides.push(st[k]);
    }
    let shape: Vec<usize> = d
        .shape
        .iter()
        .zip(&reps)
        .map(|(&s, &r)| s * r as usize)
        .collect();
    if dims.len() > MAX_RANK {
        return Err(err(n, "tiling this many dims is not supported"));
    }
    // The split dims are an exact row-major refinement of the plain output.
    let o = b.tensor(&n.output[0], shape, Layout::Plain, d.dtype, d.scale);
    b.plan.steps.push(Step::View {
        name: n.name.clone(),
        input: x,
        out: o,
        dims,
        strides,
        offset: 0,
    });
    b.values.insert(n.output[0].clone(), Value::Tensor(o));
    Ok(())
}

fn gather(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let r = d.shape.len();
    let a = super::axis(n, proto::attr_i(n, "axis").unwrap_or(0), r)?;
    let len = d.shape[a];
    let idx_shape = b
        .shape_of(&n.input[1])
        .ok_or_else(|| err(n, "indices unknown"))?;
    let out_shape: Vec<usize> = d.shape[..a]
        .iter()
        .chain(&idx_shape)
        .chain(&d.shape[a + 1..])
        .copied()
        .collect();
    if let Some(idx) = b.ints_const(&n.input[1]) {
        let wrap = |v: i64| -> PlanResult<usize> {
            let w = if v < 0 { v + len as i64 } else { v };
            if (0..len as i64).contains(&w) {
                Ok(w as usize)
            } else {
                Err(err(n, format!("index {v} out of range for a dim of {len}")))
            }
        };
        let idx: Vec<usize> = idx.iter().map(|&v| wrap(v)).collect::<PlanResult<_>>()?;
        if idx.len() == 1 {
            // One index (x[:, 0] of a class token, a channel pick): a strided view.
            let st = super::logical_strides(&d);
            let logical: Vec<i64> = (0..r)
                .filter(|&k| k != a)
                .map(|k| st[k])
                .collect::<Vec<_>>();
            let mut lg = logical;
            let mut shape: Vec<usize> = (0..r).filter(|&k| k != a).map(|k| d.shape[k]).collect();
            if !idx_shape.is_empty() {
                // Indices of shape [1]: the axis stays with size 1.
                lg.insert(a, 0);
                shape.insert(a, 1);
            }
            view(
                b,
                x,
                &n.output[0],
                &n.name,
                shape,
                lg,
                idx[0] as i64 * st[a],
                false,
            )?;
            return Ok(());
        }
        let x = b.to_layout(x, Layout::Plain, "gather")?;
        let o = b.tensor(&n.output[0], out_shape, Layout::Plain, d.dtype, d.scale);
        return b.emit(
            n,
            o,
            Step::Gather {
                name: n.name.clone(),
                input: x,
                indices: Operand::Const(idx.iter().map(|&v| v as f32).collect(), idx_shape),
                out: o,
                outer: d.shape[..a].iter().product(),
                axis_len: len,
                count: idx.len(),
                inner: d.shape[a + 1..].iter().product(),
            },
        );
    }
    let it = b.float_tensor_of(&n.input[1], "gather indices")?;
    let it = b.to_layout(it, Layout::Plain, "gather")?;
    let x = b.to_layout(x, Layout::Plain, "gather")?;
    let count = b.desc(it).numel();
    let o = b.tensor(&n.output[0], out_shape, Layout::Plain, d.dtype, d.scale);
    b.emit(
        n,
        o,
        Step::Gather {
            name: n.name.clone(),
            input: x,
            indices: Operand::Tensor(it),
            out: o,
            outer: d.shape[..a].iter().product(),
            axis_len: len,
            count,
            inner: d.shape[a + 1..].iter().product(),
        },
    )
}

/// Start, stop (exclusive, may be -1 for a negative step) and step of one sliced axis.
fn slice_range(len: usize, start: i64, end: i64, step: i64) -> (i64, usize) {
    let l = len as i64;
    let norm = |v: i64| if v < 0 { v + l } else { v };
    if step > 0 {
        let s = norm(start).clamp(0, l);
        let e = norm(end).clamp(0, l);
        (
            s,
            if e > s {
                ((e - s + step - 1) / step) as usize
            } else {
                0
            },
        )
    } else {
        let s = norm(start).clamp(-1, l - 1);
        let e = norm(end).clamp(-1, l - 1);
        (
            s,
            if s > e {
                ((s - e + (-step) - 1) / (-step)) as usize
            } else {
                0
            },
        )
    }
}

fn slice(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let r = d.shape.len();
    // Opset < 10: attributes; after: inputs.
    let (starts, ends, axes, steps) = if b.opset < 10 {
        (
            proto::attr_ints(n, "starts").ok_or_else(|| err(n, "no starts"))?,
            proto::attr_ints(n, "ends").ok_or_else(|| err(n, "no ends"))?,
            proto::attr_ints(n, "axes"),
            None,
        )
    } else {
        (
            b.ints_input(n, 1)?.ok_or_else(|| err(n, "no starts"))?,
            b.ints_input(n, 2)?.ok_or_else(|| err(n, "no ends"))?,
            b.ints_input(n, 3)?,
            b.ints_input(n, 4)?,
        )
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&v| super::axis(n, v, r))
            .collect::<PlanResult<_>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or(vec![1; axes.len()]);
    if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
        return Err(err(n, "starts, ends, axes and steps differ in length"));
    }
    let st = super::logical_strides(&d);
    let mut shape = d.shape.clone();
    let mut logical = st.clone();
    let mut offset = 0i64;
    for (k, &a) in axes.iter().enumerate() {
        if steps[k] == 0 {
            return Err(err(n, "a step of 0"));
        }
        let (s, len) = slice_range(d.shape[a], starts[k], ends[k], steps[k]);
        shape[a] = len;
        if len > 0 {
            offset += s * st[a];
        }
        logical[a] = st[a] * steps[k];
    }
    view(b, x, &n.output[0], &n.name, shape, logical, offset, true)?;
    Ok(())
}

fn split(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    let a = super::axis(n, proto::attr_i(n, "axis").unwrap_or(0), d.shape.len())?;
    let len = d.shape[a];
    let parts = n.output.len();
    let sizes: Vec<usize> = match proto::attr_ints(n, "split").or(b.ints_input(n, 1)?) {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let per = len.div_ceil(parts.max(1));
            (0..parts)
                .map(|k| per.min(len.saturating_sub(k * per)))
                .collect()
        }
    };
    if sizes.len() != parts || sizes.iter().sum::<usize>() != len {
        return Err(err(n, format!("split sizes {sizes:?} do not cover {len}")));
    }
    let st = super::logical_strides(&d);
    let mut start = 0;
    for (k, out) in n.output.iter().enumerate() {
        let mut shape = d.shape.clone();
        shape[a] = sizes[k];
        if !out.is_empty() {
            view(
                b,
                x,
                out,
                &format!("{}.{k}", n.name),
                shape,
                st.clone(),
                (start * st[a] as usize) as i64,
                true,
            )?;
        }
        start += sizes[k];
    }
    Ok(())
}

fn concat(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let mut ins = vec![];
    for t in n.input.iter().filter(|t| !t.is_empty()) {
        ins.push(b.float_tensor_of(t, "concat input")?);
    }
    // Empty inputs (a zero-length piece) take no part.
    ins.retain(|&t| b.desc(t).numel() > 0);
    let d0 = b
        .desc(*ins.first().ok_or_else(|| err(n, "no non-empty input"))?)
        .clone();
    let a = super::axis(
        n,
        proto::attr_i(n, "axis").ok_or_else(|| err(n, "no axis"))?,
        d0.shape.len(),
    )?;
    let layout = if d0.shape.len() == 4 && a == 1 {
        Layout::Nhwc
    } else {
        Layout::Plain
    };
    let mut conv = vec![];
    for t in ins {
        conv.push(b.to_layout(t, layout, "concat")?);
    }
    let mut shape = d0.shape.clone();
    shape[a] = conv.iter().map(|&t| b.desc(t).shape[a]).sum();
    for &t in &conv {
        let s = &b.desc(t).shape;
        if s.len() != shape.len() || (0..s.len()).any(|k| k != a && s[k] != shape[k]) {
            return Err(err(n, "inputs differ outside the concat axis"));
        }
    }
    let (outer, inner) = if layout == Layout::Nhwc {
        (shape[0] * shape[2] * shape[3], 1)
    } else {
        (shape[..a].iter().product(), shape[a + 1..].iter().product())
    };
    let o = b.tensor(&n.output[0], shape, layout, b.float, 1.0);
    b.emit(
        n,
        o,
        Step::Concat {
            name: n.name.clone(),
            inputs: conv,
            out: o,
            outer,
            inner,
        },
    )
}

fn pad(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let mode = match proto::attr_str(n, "mode")
        .unwrap_or("constant".into())
        .as_str()
    {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => return Err(err(n, format!("pad mode `{m}` is not supported"))),
    };
    let x = b.float_tensor_of(&n.input[0], "pad input")?;
    let d = b.desc(x).clone();
    let r = d.shape.len();
    let pads = match proto::attr_ints(n, "pads") {
        Some(p) => p,
        None => b.ints_input(n, 1)?.ok_or_else(|| err(n, "no pads"))?,
    };
    let value = n
        .input
        .get(2)
        .filter(|s| !s.is_empty())
        .and_then(|s| b.const_f32(s))
        .and_then(|t| t.data.first().copied())
        .or(proto::attr_f(n, "value"))
        .unwrap_or(0.0);
    // Opset 18: `axes` says which dims the pads are for.
    let axes: Vec<usize> = match b.ints_input(n, 3)? {
        Some(a) => a
            .iter()
            .map(|&v| super::axis(n, v, r))
            .collect::<PlanResult<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(err(
            n,
            format!("{} pads for {} axes", pads.len(), axes.len()),
        ));
    }
    let (mut begin, mut end) = (vec![0i64; r], vec![0i64; r]);
    for (k, &a) in axes.iter().enumerate() {
        begin[a] = pads[k];
        end[a] = pads[k + axes.len()];
    }
    let shape: Vec<usize> = (0..r)
        .map(|k| {
            let v = d.shape[k] as i64 + begin[k] + end[k];
            usize::try_from(v).map_err(|_| err(n, "pads crop more than the dim"))
        })
        .collect::<PlanResult<_>>()?;
    if mode == PadMode::Reflect
        && (0..r).any(|k| (begin[k].max(end[k]) > 0) && begin[k].max(end[k]) >= d.shape[k] as i64)
    {
        return Err(err(n, "reflect pads must be smaller than the dim"));
    }
    let o = b.tensor(&n.output[0], shape, d.layout, b.float, 1.0);
    let order = super::stored_order(&d);
    b.emit(
        n,
        o,
        Step::Pad {
            name: n.name.clone(),
            input: x,
            out: o,
            in_dims: super::stored_dims(&d),
            begin: order.iter().map(|&k| begin[k]).collect(),
            mode,
            value,
        },
    )
}

/// DepthToSpace (DCR and CRD) and SpaceToDepth as one strided copy into plain NCHW.
fn depth_space(b: &mut Builder<'_>, n: &pb::NodeProto) -> PlanResult<()> {
    let x = input(b, n)?;
    let d = b.desc(x).clone();
    if d.shape.len() != 4 {
        return Err(err(n, "needs an NCHW input"));
    }
    let bs = proto::attr_i(n, "blocksize")
        .ok_or_else(|| err(n, "no blocksize"))?
        .max(1) as usize;
    let [nb, c, h, w] = [d.shape[0], d.shape[1], d.shape[2], d.shape[3]];
    let st = super::logical_strides(&d);
    let (sn, sc, sh, sw) = (st[0], st[1], st[2], st[3]);
    let bi = bs as i64;
    let (out, dims, strides) = if n.op_type == "DepthToSpace" {
        if c % (bs * bs) != 0 {
            return Err(err(n, "channels are not a multiple of blocksize^2"));
        }
        let co = c / (bs * bs);
        let coi = co as i64;
        // out[n, c', h*b + i, w*b + j] = in[n, src channel, h, w]
        let (s_c, s_i, s_j) = if proto::attr_str(n, "mode").as_deref() == Some("CRD") {
            (bi * bi * sc, bi * sc, sc)
        } else {
            (sc, bi * coi * sc, coi * sc)
        };
        (
            vec![nb, co, h * bs, w * bs],
            vec![nb, co, h, bs, w, bs],
            vec![sn, s_c, sh, s_i, sw, s_j],
        )
    } else {
        if h % bs != 0 || w % bs != 0 {
            return Err(err(n, "H and W must be multiples of blocksize"));
        }
        // out[n, (i*b + j)*C + c, y, x] = in[n, c, y*b + i, x*b + j]
        (
            vec![nb, c * bs * bs, h / bs, w / bs],
            vec![nb, bs, bs, c, h / bs, w / bs],
            vec![sn, sh, sw, sc, bi * sh, bi * sw],
        )
    };
    let o = b.tensor(&n.output[0], out, Layout::Plain, d.dtype, d.scale);
    b.emit(
        n,
        o,
        Step::View {
            name: n.name.clone(),
            input: x,
            out: o,
            dims,
            strides,
            offset: 0,
        },
    )
}
