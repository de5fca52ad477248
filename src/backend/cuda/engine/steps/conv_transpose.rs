//! `ConvTranspose` steps (a segmentation decoder's upsampling) on the direct NCHW kernel,
//! weights and bias as the step's uploaded constants.

use super::super::device::Launch;
use super::super::kernels::launch;
use super::{Check, not_a};
use crate::backend::cuda::error::{CudaResult, ensure};
use crate::backend::cuda::plan::{Layout, Step};

pub(super) fn conv_transpose(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::ConvTranspose {
        input,
        out,
        w,
        bias,
        groups,
        k: kk,
        stride,
        pads,
        dilation,
        act,
        ..
    } = s
    else {
        return Err(not_a("ConvTranspose", s));
    };
    c.rank4(*input, Some(Layout::Plain))?;
    c.rank4(*out, Some(Layout::Plain))?;
    c.positive("groups", &[*groups])?;
    c.positive("kernel", kk)?;
    c.positive("strides", stride)?;
    c.positive("dilations", dilation)?;
    let (i, o) = (&c.plan.tensors[*input].shape, &c.plan.tensors[*out].shape);
    let (cin, cout) = (i[1], o[1]);
    ensure(i[0] == o[0], || format!("batch {} in, {} out", i[0], o[0]))?;
    ensure(
        cin.is_multiple_of(*groups) && cout.is_multiple_of(*groups),
        || format!("{cin} -> {cout} channels do not split into {groups} groups"),
    )?;
    c.is(
        "the weights",
        w.len(),
        c.prod(&[cin, cout / groups, kk[0], kk[1]]),
    )?;
    ensure(bias.is_empty() || bias.len() == cout, || {
        format!("bias holds {}, channels {cout}", bias.len())
    })?;
    let Some(cx) = go else { return Ok(()) };
    let (wp, bp) = (cx.const_ptr(0)?, cx.const_ptr(1)?);
    let (ac, a0, a1) = act.code();
    let u = |v: usize| v as i32;
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    launch!(cx.stream, cx.dev.k.conv_transpose, c.numel(*out); ip, it, is, wp, bp, op, ot, os,
        u(i[0]), u(i[1]), u(i[2]), u(i[3]), u(o[1]), u(o[2]), u(o[3]),
        u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]),
        u(dilation[0]), u(dilation[1]), u(*groups), ac, a0, a1)
}
