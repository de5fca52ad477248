//! Data movement steps: `View` (strided reads: transpose, slice, expand, layout change),
//! `Gather`, `Concat`, `Pad` and `SpaceToDepth` (a stem's regrouping into 16-byte taps).

use super::super::args::{operand_len, pad_args, view_args};
use super::super::device::Launch;
use super::super::kernels::launch;
use super::{Check, not_a};
use crate::backend::cuda::error::{CudaError, CudaResult, ensure};
use crate::backend::cuda::plan::{DType, Layout, Operand, Step};

pub(super) fn view(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::View {
        input,
        out,
        dims,
        strides,
        offset,
        ..
    } = s
    else {
        return Err(not_a("View", s));
    };
    let a = view_args(c.plan, *input, *out, dims, strides, *offset)?;
    let Some(cx) = go else { return Ok(()) };
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    let n = c.numel(*out);
    launch!(cx.stream, cx.dev.k.view, n; ip, it, is, op, ot, os, n as i64, a)
}

pub(super) fn gather(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Gather {
        input,
        indices,
        out,
        outer,
        axis_len,
        count,
        inner,
        ..
    } = s
    else {
        return Err(not_a("Gather", s));
    };
    c.is(
        "the input",
        c.numel(*input),
        c.prod(&[*outer, *axis_len, *inner]),
    )?;
    c.is(
        "the output",
        c.numel(*out),
        c.prod(&[*outer, *count, *inner]),
    )?;
    let li = operand_len(c.plan, indices);
    ensure(li >= *count, || format!("{li} indices for {count} outputs"))?;
    if let Operand::Const(v, _) = indices {
        let l = *axis_len as f32;
        if let Some(bad) = v.iter().find(|&&i| i < -l || i >= l) {
            return Err(CudaError::Shape(format!(
                "index {bad} is out of range for an axis of {axis_len}"
            )));
        }
    }
    let Some(cx) = go else { return Ok(()) };
    let (ip, it, is) = cx.operand(indices, 0)?;
    let ((xp, xt, xs), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    let n = c.numel(*out);
    launch!(cx.stream, cx.dev.k.gather, n; xp, xt, xs, ip, it, is, op, ot, os,
        *outer as i64, *axis_len as i64, *count as i64, *inner as i64)
}

pub(super) fn concat(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Concat {
        inputs,
        out,
        outer,
        inner,
        ..
    } = s
    else {
        return Err(not_a("Concat", s));
    };
    let row = outer.saturating_mul(*inner);
    c.positive("outer x inner", &[row])?;
    let mut total = 0usize;
    for &t in inputs {
        ensure(c.numel(t).is_multiple_of(row), || {
            format!(
                "input `{}` does not split into {outer} x {inner}",
                c.plan.tensors[t].name
            )
        })?;
        total += c.numel(t);
    }
    c.is("the output", c.numel(*out), total)?;
    let Some(cx) = go else { return Ok(()) };
    let axis_total = c.numel(*out) / row;
    let (op, ot, os) = cx.tensor(*out);
    let mut off = 0usize;
    for &t in inputs {
        let len = c.numel(t) / row;
        let n = c.numel(t);
        if n > 0 {
            let (ip, it, is) = cx.tensor(t);
            launch!(cx.stream, cx.dev.k.concat, n; ip, it, is, op, ot, os,
                *outer as i64, len as i64, axis_total as i64, off as i64, *inner as i64)?;
        }
        off += len;
    }
    Ok(())
}

pub(super) fn pad(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Pad {
        input,
        out,
        in_dims,
        begin,
        mode,
        value,
        ..
    } = s
    else {
        return Err(not_a("Pad", s));
    };
    let a = pad_args(c.plan, *input, *out, in_dims, begin, *mode)?;
    let Some(cx) = go else { return Ok(()) };
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    let n = c.numel(*out);
    launch!(cx.stream, cx.dev.k.pad_nd, n; ip, it, is, op, ot, os, n as i64, a, *value)
}

pub(super) fn space_to_depth(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::SpaceToDepth {
        input,
        out,
        block,
        pads,
        ..
    } = s
    else {
        return Err(not_a("SpaceToDepth", s));
    };
    c.rank4(*input, None)?;
    c.rank4(*out, Some(Layout::Nhwc))?;
    c.positive("block", &[*block])?;
    let (xd, od) = (&c.plan.tensors[*input], &c.plan.tensors[*out]);
    let (i, o) = (&xd.shape, &od.shape);
    let cells = block * block;
    ensure(
        o[0] == i[0]
            && o[1] % cells == 0
            && o[1] / cells >= i[1]
            && (o[1] / cells).is_multiple_of(4),
        || format!("{i:?} cannot regroup into {o:?} by blocks of {block}"),
    )?;
    let Some(cx) = go else { return Ok(()) };
    let k = &cx.dev.k;
    let [_, ch, h, w] = [i[0], i[1], i[2], i[3]];
    // (b, c, h, w) element strides of the input as stored.
    let st: [i64; 4] = if xd.layout == Layout::Nhwc {
        [h * w * ch, 1, w * ch, ch]
    } else {
        [ch * h * w, h * w, w, 1]
    }
    .map(|v| v as i64);
    let (nb, c2, hs, ws) = (o[0], o[1], o[2], o[3]);
    let u = |v: usize| v as i32;
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    // The int8 16-byte-tap regrouping (2 x 2 cells of four channels): a thread a pixel.
    if od.dtype == DType::I8
        && *block == 2
        && c2 == 16
        && ch <= 4
        && nb * hs * ws < i32::MAX as usize
    {
        return launch!(cx.stream, k.space_to_depth16, nb * hs * ws; ip, it, is,
            st[0], st[1], st[2], st[3], u(h), u(w), u(ch), op, os,
            u(nb), u(hs), u(ws), u(pads[0]), u(pads[1]));
    }
    launch!(cx.stream, k.space_to_depth, nb * hs * ws * c2 / 4; ip, it, is,
        st[0], st[1], st[2], st[3], u(h), u(w), u(ch), op, ot, os,
        u(nb), u(hs), u(ws), u(*block), u(c2 / (block * block)), u(pads[0]), u(pads[1]))
}
