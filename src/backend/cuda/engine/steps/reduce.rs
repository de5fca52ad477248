//! Steps that reduce along an axis: `Reduce` (sum, mean, max... of the middle axis of
//! `[outer, len, inner]`), `Softmax` and `Norm` (LayerNormalization's rows). Contiguous rows
//! (`inner == 1`) take the row kernels, a block a row.

use super::super::device::Launch;
use super::super::kernels::{launch, rows_cfg};
use super::{Check, not_a};
use crate::backend::cuda::error::{CudaResult, ensure};
use crate::backend::cuda::plan::Step;

pub(super) fn reduce(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Reduce {
        input,
        out,
        outer,
        len,
        inner,
        op,
        ..
    } = s
    else {
        return Err(not_a("Reduce", s));
    };
    c.positive("the reduced length", &[*len])?;
    c.is(
        "the input",
        c.numel(*input),
        c.prod(&[*outer, *len, *inner]),
    )?;
    c.is("the output", c.numel(*out), c.prod(&[*outer, *inner]))?;
    let Some(cx) = go else { return Ok(()) };
    let (k, st) = (&cx.dev.k, cx.stream);
    let ((ip, it, is), (optr, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    let opc = *op as i32;
    if *inner == 1 {
        launch!(st, k.reduce_rows, cfg rows_cfg(*outer, *len); ip, it, is, optr, ot, os,
            *outer as i64, *len as i64, opc)
    } else {
        launch!(st, k.reduce, outer * inner; ip, it, is, optr, ot, os,
            *outer as i64, *len as i64, *inner as i64, opc)
    }
}

pub(super) fn softmax(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Softmax {
        input,
        out,
        outer,
        len,
        inner,
        log,
        ..
    } = s
    else {
        return Err(not_a("Softmax", s));
    };
    let n = c.prod(&[*outer, *len, *inner]);
    c.is("the input", c.numel(*input), n)?;
    c.is("the output", c.numel(*out), n)?;
    let Some(cx) = go else { return Ok(()) };
    let (k, st) = (&cx.dev.k, cx.stream);
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    if *inner == 1 {
        launch!(st, k.softmax_rows, cfg rows_cfg(*outer, *len); ip, it, is, op, ot, os,
            *outer as i64, *len as i64, *log as i32)
    } else {
        launch!(st, k.softmax, outer * inner; ip, it, is, op, ot, os,
            *outer as i64, *len as i64, *inner as i64, *log as i32)
    }
}

pub(super) fn norm(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Norm {
        input,
        out,
        rows,
        len,
        eps,
        gamma,
        beta,
        ..
    } = s
    else {
        return Err(not_a("Norm", s));
    };
    c.positive("the row length", &[*len])?;
    c.is("the input", c.numel(*input), c.prod(&[*rows, *len]))?;
    c.is("the output", c.numel(*out), c.prod(&[*rows, *len]))?;
    ensure(gamma.is_empty() || gamma.len() == *len, || {
        format!("gamma holds {}, the row {len}", gamma.len())
    })?;
    ensure(beta.is_empty() || beta.len() == *len, || {
        format!("beta holds {}, the row {len}", beta.len())
    })?;
    // Step::constants() uploads beta only along with gamma.
    ensure(beta.is_empty() || !gamma.is_empty(), || {
        "beta without gamma".to_string()
    })?;
    let Some(cx) = go else { return Ok(()) };
    let (g, b) = if gamma.is_empty() {
        (0u64, 0u64)
    } else {
        (cx.const_ptr(0)?, cx.const_ptr(1)?)
    };
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    launch!(cx.stream, cx.dev.k.norm_rows, cfg rows_cfg(*rows, *len); ip, it, is, op, ot, os,
        *rows as i64, *len as i64, *eps, g, b)
}
