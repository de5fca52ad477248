//! `MatMul` steps that are not convolutions (attention's batched products of activations):
//! the tiled `matmul` kernel, int8 operands read with their scales. Products with constant
//! weights lower to convs and take the conv implementations.

use cudarc::driver::LaunchConfig;

use super::super::args::operand_len;
use super::super::device::Launch;
use super::super::kernels::launch;
use super::{Check, not_a};
use crate::backend::cuda::error::{CudaResult, ensure};
use crate::backend::cuda::plan::Step;

pub(super) fn matmul(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::MatMul {
        a,
        b,
        out,
        batch,
        m,
        n,
        k,
        a_stride,
        b_stride,
        trans_b,
        ..
    } = s
    else {
        return Err(not_a("MatMul", s));
    };
    c.positive("m, n, k", &[*m, *n, *k])?;
    for (what, v) in [("m", *m), ("n", *n), ("k", *k)] {
        c.int(what, v)?;
    }
    let need = |stride: usize, mat: usize| {
        batch
            .saturating_sub(1)
            .saturating_mul(stride)
            .saturating_add(mat)
    };
    let (na, nb) = (need(*a_stride, m * k), need(*b_stride, k * n));
    ensure(c.numel(*a) >= na, || {
        format!("A holds {}, the batches read {na}", c.numel(*a))
    })?;
    let lb = operand_len(c.plan, b);
    ensure(lb >= nb, || format!("B holds {lb}, the batches read {nb}"))?;
    c.is("the output", c.numel(*out), c.prod(&[*batch, *m, *n]))?;
    let Some(cx) = go else { return Ok(()) };
    let (bp, bt, bs) = cx.operand(b, 0)?;
    let cfg = LaunchConfig {
        grid_dim: (
            n.div_ceil(32) as u32,
            m.div_ceil(32).min(65_535) as u32,
            (*batch).clamp(1, 65_535) as u32,
        ),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    let u = |v: usize| v as i32;
    let ((ap, at, as_), (op, ot, os)) = (cx.tensor(*a), cx.tensor(*out));
    launch!(cx.stream, cx.dev.k.matmul, cfg cfg; ap, at, as_, bp, bt, bs, op, ot, os,
        *batch as i64, u(*m), u(*n), u(*k), *a_stride as i64, *b_stride as i64, *trans_b as i32)
}
