//! `Resize` steps over NHWC: nearest, linear and cubic, every coordinate mode ONNX has.

use super::super::device::Launch;
use super::super::kernels::launch;
use super::{Check, not_a};
use crate::backend::cuda::error::{CudaResult, ensure};
use crate::backend::cuda::plan::{Layout, Step};

pub(super) fn resize(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Resize {
        input,
        out,
        mode,
        coord,
        nearest,
        scale_hw,
        cubic_a,
        exclude_outside,
        ..
    } = s
    else {
        return Err(not_a("Resize", s));
    };
    c.rank4(*input, Some(Layout::Nhwc))?;
    c.rank4(*out, Some(Layout::Nhwc))?;
    ensure((0..=2).contains(mode), || format!("mode {mode} (0 to 2)"))?;
    ensure(scale_hw.iter().all(|&v| v > 0.0), || {
        format!("scales {scale_hw:?} must be positive")
    })?;
    c.same_nc(*input, *out)?;
    c.positive("input size", &c.plan.tensors[*input].shape)?;
    let Some(cx) = go else { return Ok(()) };
    let (i, o) = (cx.td(*input), cx.td(*out));
    let u = |v: usize| v as i32;
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    launch!(cx.stream, cx.dev.k.resize, o.numel(); ip, it, is, op, ot, os,
        u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
        scale_hw[0], scale_hw[1], *mode, *coord, *nearest, *cubic_a, *exclude_outside as i32)
}
