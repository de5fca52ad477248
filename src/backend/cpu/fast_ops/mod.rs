//! Our own kernels for what tract runs slowly, put into tract's graph by rewrites, one module
//! per op family: [`resize`] (2-tap Resize), [`f16`] (the FP16 engine's rounding), [`fp8`]
//! (the FP8 engine's E4M3 rounding), [`quant`]
//! (the INT8 engines' quantize, fused with what precedes it), [`depthwise`] (depthwise
//! convolution).
//!
//! The depthwise conv, the Resize and the f16 rounding run on the threads of tract's matrix
//! multiplies (its current executor) where the work is large enough; the requantize on one.

mod depthwise;
mod f16;
pub mod fp8;
mod quant;
mod resize;

pub use depthwise::replace_depthwise;
pub use f16::{round_constants_to_f16, round_outputs_to_f16};
pub use quant::{fuse_requantize, replace_i8_casts};
pub use resize::replace_resizes;

use tract_linalg::multithread::{Executor, current_tract_executor};
use tract_onnx::prelude::*;

/// Whether tract runs on several threads. When it does not, our kernels run inline: handing
/// each op to a one-thread pool would cost a context switch per op, which a busy machine
/// turns into milliseconds.
fn tract_is_parallel() -> bool {
    !matches!(current_tract_executor(), Executor::SingleThread)
}

/// Runs `f` (which uses rayon's `par_*` iterators) on tract's rayon pool.
fn on_tract_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match current_tract_executor() {
        Executor::MultiThread(pool) => pool.install(f),
        // rayon's global pool, which `par_*` iterators use outside any `install`.
        _ => f(),
    }
}

/// The elementwise ops our kernels absorb from the graph around them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Max,
    Min,
}

/// `(op, constant)` when `node` is the binary `op` of `input` (its left operand, for `Sub`)
/// and an f32 constant, with the shape of `input` (the constant broadcasts into it).
fn bin_by_constant(
    model: &TypedModel,
    node: &TypedNode,
    input: OutletId,
) -> TractResult<Option<(Bin, Arc<Tensor>)>> {
    use tract_onnx::tract_core::ops::binary::TypedBinOp;
    use tract_onnx::tract_core::ops::konst::Const;
    use tract_onnx::tract_core::ops::math::{Add, Max, Min, Mul, Sub};
    let Some(op) = node.op_as::<TypedBinOp>() else {
        return Ok(None);
    };
    let bin = if op.0.is::<Add>() {
        Bin::Add
    } else if op.0.is::<Sub>() {
        Bin::Sub
    } else if op.0.is::<Mul>() {
        Bin::Mul
    } else if op.0.is::<Max>() {
        Bin::Max
    } else if op.0.is::<Min>() {
        Bin::Min
    } else {
        return Ok(None);
    };
    let [a, b] = node.inputs[..] else {
        return Ok(None);
    };
    let other = match (a == input, b == input) {
        (true, false) => b,
        (false, true) if bin != Bin::Sub => a,
        _ => return Ok(None),
    };
    let Some(k) = model.node(other.node).op_as::<Const>() else {
        return Ok(None);
    };
    let v = k.val();
    if v.datum_type() != f32::datum_type()
        || !v.is_plain()
        || model.outlet_fact(OutletId::new(node.id, 0))?.shape != model.outlet_fact(input)?.shape
    {
        return Ok(None);
    }
    Ok(Some((bin, v.clone())))
}

/// The value of a one-value f32 tensor, unless it is NaN.
fn scalar(t: &Tensor) -> Option<f32> {
    let v = t.try_as_plain_ram().ok()?.as_slice::<f32>().ok()?;
    match v {
        [x] if !x.is_nan() => Some(*x),
        _ => None,
    }
}

/// The only consumer of `outlet`, when it has exactly one and is not a model output.
fn sole_consumer(model: &TypedModel, outlet: OutletId) -> TractResult<Option<usize>> {
    let succ = model.outlet_successors(outlet);
    if succ.len() != 1 || model.output_outlets()?.contains(&outlet) {
        return Ok(None);
    }
    Ok(Some(succ[0].node))
}

#[cfg(test)]
mod tests {
    use tract_onnx::pb;
    use tract_onnx::prelude::*;

    /// The first of `out`, as f32 values.
    fn first_f32(out: &[TValue]) -> Vec<f32> {
        out[0]
            .try_as_plain_ram()
            .expect("ram")
            .as_slice::<f32>()
            .expect("f32")
            .to_vec()
    }

    /// tract's own pipeline, without our rewrites: what our kernels replace.
    pub(super) fn tract_reference(p: &pb::ModelProto, shape: [usize; 4], x: &[f32]) -> Vec<f32> {
        let mut m = tract_onnx::onnx().parse(p, None).expect("parse").model;
        m.set_input_fact(0, f32::fact(shape).into()).expect("fact");
        let plan = m
            .into_optimized()
            .expect("optimize")
            .into_runnable()
            .expect("plan");
        let t = Tensor::from_shape(&shape, x).expect("tensor");
        first_f32(&plan.run(tvec!(t.into())).expect("run"))
    }

    /// The kind of each node of `m`'s plan that ran on `x` (its profile), the source left out.
    pub(super) fn kernels(m: &super::super::TractModel, x: &[f32]) -> Vec<String> {
        m.profile(x, 1)
            .expect("profile")
            .into_iter()
            .map(|l| l.kernel)
            .filter(|k| k != "Source")
            .collect()
    }

    /// `m`'s first output on `x`, as f32 values.
    pub(super) fn output(m: &super::super::TractModel, x: &[f32]) -> Vec<f32> {
        first_f32(&m.run_all(x).expect("run"))
    }
}
