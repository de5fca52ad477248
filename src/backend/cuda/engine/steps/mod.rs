//! Every step but the convolution, one file per family: each step's check and its launch
//! side by side, in one function. `run` checks a step's sizes against its tensors (the
//! kernels trust them, so a planner bug becomes an error naming the step instead of an
//! out-of-bounds access on the device) and, given a launch context, launches it. The engine
//! checks every step before it allocates anything, and each launch checks again, which costs
//! nothing measurable: runs replay a captured CUDA graph.

mod conv_transpose;
mod elementwise;
mod matmul;
mod movement;
mod pool;
mod reduce;
mod resize;

pub(super) use pool::gap_splits;

use super::args::prod;
use super::device::Launch;
use crate::backend::cuda::error::{CudaError, CudaResult, ensure};
use crate::backend::cuda::plan::{Layout, Plan, Step};

/// Checks step `s` of `plan` and, with `go`, launches it. Conv steps are checked by their own
/// setup and launched by the engine's conv implementations (`conv`).
pub(super) fn run(plan: &Plan, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let nt = plan.tensors.len();
    for t in s.inputs().into_iter().chain([s.output()]) {
        ensure(t < nt, || {
            format!("tensor {t} does not exist ({nt} tensors)")
        })?;
    }
    // Nothing to write: a zero-sized launch is an error.
    let go = go.filter(|_| plan.tensors[s.output()].numel() > 0);
    let c = Check { plan };
    match s {
        Step::Conv(_) => Ok(()),
        Step::Unary { .. } => elementwise::unary(&c, s, go),
        Step::Nary { .. } => elementwise::nary(&c, s, go),
        Step::View { .. } => movement::view(&c, s, go),
        Step::Gather { .. } => movement::gather(&c, s, go),
        Step::Concat { .. } => movement::concat(&c, s, go),
        Step::Pad { .. } => movement::pad(&c, s, go),
        Step::SpaceToDepth { .. } => movement::space_to_depth(&c, s, go),
        Step::Reduce { .. } => reduce::reduce(&c, s, go),
        Step::Softmax { .. } => reduce::softmax(&c, s, go),
        Step::Norm { .. } => reduce::norm(&c, s, go),
        Step::MatMul { .. } => matmul::matmul(&c, s, go),
        Step::Pool { .. } => pool::pool(&c, s, go),
        Step::GlobalAvgPool { .. } => pool::global_avg_pool(&c, s, go),
        Step::Resize { .. } => resize::resize(&c, s, go),
        Step::ConvTranspose { .. } => conv_transpose::conv_transpose(&c, s, go),
    }
}

/// The error for a family function handed a step of another kind (a dispatch bug).
fn not_a(kind: &str, s: &Step) -> CudaError {
    CudaError::Internal(format!(
        "`{}` is a {}, not a {kind} step",
        s.name(),
        s.kind()
    ))
}

/// The checks steps share, over the plan's tensors.
struct Check<'a> {
    plan: &'a Plan,
}

impl Check<'_> {
    fn numel(&self, t: usize) -> usize {
        self.plan.tensors[t].numel()
    }
    /// `what` holds `want` elements.
    fn is(&self, what: &str, have: usize, want: usize) -> CudaResult<()> {
        ensure(have == want, || {
            format!("{what} holds {have} elements, expected {want}")
        })
    }
    /// `v` fits a kernel's 32-bit argument.
    fn int(&self, what: &str, v: usize) -> CudaResult<()> {
        ensure(v <= i32::MAX as usize, || {
            format!("{what} = {v} does not fit 32 bits")
        })
    }
    /// Tensor `t` is rank 4 (in `layout`, if given), with dims that fit 32 bits.
    fn rank4(&self, t: usize, layout: Option<Layout>) -> CudaResult<()> {
        let d = &self.plan.tensors[t];
        ensure(
            d.shape.len() == 4 && layout.is_none_or(|l| d.layout == l),
            || {
                format!(
                    "tensor `{}` is {:?} {:?}, expected rank 4{}",
                    d.name,
                    d.shape,
                    d.layout,
                    layout.map_or(String::new(), |l| format!(" {l:?}"))
                )
            },
        )?;
        d.shape.iter().try_for_each(|&v| self.int("a dim", v))
    }
    fn positive(&self, what: &str, v: &[usize]) -> CudaResult<()> {
        ensure(v.iter().all(|&x| x > 0), || {
            format!("{what} {v:?} must be positive")
        })
    }
    /// Input and output of a rank-4 NHWC step agree in N and C.
    fn same_nc(&self, input: usize, out: usize) -> CudaResult<()> {
        let (i, o) = (&self.plan.tensors[input], &self.plan.tensors[out]);
        ensure(i.shape[..2] == o.shape[..2], || {
            format!(
                "input {:?} and output {:?} differ in N or C",
                i.shape, o.shape
            )
        })
    }
    /// `prod(dims)`, saturating.
    fn prod(&self, dims: &[usize]) -> usize {
        prod(dims)
    }
}

#[cfg(test)]
pub(super) fn check(plan: &Plan, s: &Step) -> CudaResult<()> {
    run(plan, s, None)
}
