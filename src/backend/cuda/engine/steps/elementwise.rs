//! Elementwise steps: `Unary` (an activation with a dtype conversion: quantize, dequantize,
//! cast, copy) and `Nary` (broadcast arithmetic over up to three operands).

use super::super::args::{NaryArgs, nary_args, nary_groups};
use super::super::device::Launch;
use super::super::kernels::launch;
use super::{Check, not_a};
use crate::backend::cuda::error::{CudaResult, ensure};
use crate::backend::cuda::plan::{DType, Operand, Step};

pub(super) fn unary(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Unary {
        input, out, act, ..
    } = s
    else {
        return Err(not_a("Unary", s));
    };
    c.is("the input", c.numel(*input), c.numel(*out))?;
    let Some(cx) = go else { return Ok(()) };
    let (k, st) = (&cx.dev.k, cx.stream);
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    let (a, a0, a1) = act.code();
    let n = c.numel(*out);
    if n.is_multiple_of(4) {
        launch!(st, k.unary4, n / 4; ip, it, is, op, ot, os, (n / 4) as i64, a, a0, a1)
    } else {
        launch!(st, k.unary, n; ip, it, is, op, ot, os, n as i64, a, a0, a1)
    }
}

pub(super) fn nary(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Nary {
        op,
        inputs,
        strides,
        dims,
        out,
        act,
        ..
    } = s
    else {
        return Err(not_a("Nary", s));
    };
    ensure(inputs.len() == op.arity(), || {
        format!("{op:?} takes {} inputs, got {}", op.arity(), inputs.len())
    })?;
    let mut a = nary_args(c.plan, inputs, strides, dims, *out)?;
    let Some(cx) = go else { return Ok(()) };
    let (k, st) = (&cx.dev.k, cx.stream);
    let mut ci = 0;
    for (j, o) in inputs.iter().enumerate() {
        a.ptrs[j] = cx.operand(o, ci)?.0;
        ci += matches!(o, Operand::Const(..)) as usize;
    }
    let (ac, a0, a1) = act.code();
    let (optr, ot, os) = cx.tensor(*out);
    let n = c.numel(*out);
    // A group of the output's type in one 16-byte word where the shapes allow and the bases
    // are 16-byte aligned (arena offsets are); else groups of 4.
    let (width, wide) = match cx.td(*out).dtype {
        DType::F32 => (4, &k.nary4),
        DType::F16 => (8, &k.nary8),
        DType::I8 | DType::F8 => (16, &k.nary16),
    };
    let aligned = |g: &NaryArgs, vec: i32| {
        optr.is_multiple_of(16)
            && (0..g.nin as usize).all(|j| vec >> j & 1 == 0 || g.ptrs[j].is_multiple_of(16))
    };
    let grouped = nary_groups(&a, width).filter(|(g, v)| aligned(g, *v));
    if let Some((aw, vec)) = grouped {
        launch!(st, *wide, n / width as usize; aw, optr, ot, os, n as i64 / width, op.code(), ac, a0, a1, vec)
    } else if let Some((a4, vec)) = nary_groups(&a, 4) {
        launch!(st, k.nary4, n / 4; a4, optr, ot, os, (n / 4) as i64, op.code(), ac, a0, a1, vec)
    } else {
        launch!(st, k.nary, n; a, optr, ot, os, n as i64, op.code(), ac, a0, a1)
    }
}
