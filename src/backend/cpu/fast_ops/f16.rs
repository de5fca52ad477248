//! FP16 numerics on the CPU: f16 weights after tract's folding, and one rounding of each
//! layer's output to f16 ([`RoundF16`]: eight values per F16C instruction pair where the CPU
//! has F16C, `half` one value at a time elsewhere). One pass per layer output, where a
//! Cast(f16) -> Cast(f32) pair per ONNX node made two copies.

use rayon::prelude::*;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::nn::resize::Resize;

use super::{on_tract_pool, tract_is_parallel};

/// Rounds an f32 tensor to f16 values (kept in f32), in place when the value is not shared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundF16;

/// Rounds every value of `v` to the nearest f16 (half to even; overflow to ±inf).
pub fn round_to_f16(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has the features the function is compiled for (checked above).
        unsafe { round_to_f16_f16c(v) };
        return;
    }
    round_to_f16_scalar(v);
}

/// `half`'s conversion, one value at a time (0.8 ns a value on the 2-core EPYC, in cache).
fn round_to_f16_scalar(v: &mut [f32]) {
    for x in v {
        *x = half::f16::from_f32(*x).to_f32();
    }
}

/// Eight values per F16C instruction pair (vcvtps2ph with round-to-nearest-even, then
/// vcvtph2ps): the same results as `half`, several times faster.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn round_to_f16_f16c(v: &mut [f32]) {
    use std::arch::x86_64::{
        _MM_FROUND_TO_NEAREST_INT, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps,
        _mm256_storeu_ps,
    };
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 8 f32; the unaligned load and store stay inside it.
        unsafe {
            let x = _mm256_loadu_ps(c.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    round_to_f16_scalar(chunks.into_remainder());
}

impl Op for RoundF16 {
    fn name(&self) -> StaticName {
        "RoundF16".into()
    }

    op_as_typed_op!();
}

impl EvalOp for RoundF16 {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut t = args_1!(inputs).into_tensor();
        {
            let mut ram = t.try_as_plain_ram_mut()?;
            let v = ram.as_slice_mut::<f32>()?;
            // Big tensors are split over the threads: the pass is bound by memory bandwidth.
            const CHUNK: usize = 1 << 15;
            if v.len() > 2 * CHUNK && tract_is_parallel() {
                on_tract_pool(|| v.par_chunks_mut(CHUNK).for_each(round_to_f16));
            } else {
                round_to_f16(v);
            }
        }
        Ok(tvec!(t.into_tvalue()))
    }
}

impl TypedOp for RoundF16 {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        ensure!(
            inputs[0].datum_type == f32::datum_type(),
            "RoundF16 takes f32"
        );
        Ok(tvec!(f32::fact(inputs[0].shape.clone())))
    }
}
/// Rounds every f32 constant of a decluttered model to f16 values: the weights of an FP16
/// engine, after tract folded batch norms and the like into them (as TensorRT folds, then
/// converts). Constants read by tract's `Resize` (its scales) keep full precision: they are
/// output sizes, not weights.
pub fn round_constants_to_f16(model: &mut TypedModel) -> TractResult<usize> {
    use tract_onnx::tract_core::ops::konst::Const;
    let mut keep: std::collections::HashSet<usize> = Default::default();
    for node in model.nodes() {
        if node.op_is::<Resize>() {
            keep.extend(node.inputs.iter().skip(1).map(|o| o.node));
        }
    }
    let mut done = 0;
    for id in 0..model.nodes().len() {
        if keep.contains(&id) {
            continue;
        }
        let Some(k) = model.node(id).op_as::<Const>() else {
            continue;
        };
        if k.val().datum_type() != f32::datum_type()
            || k.exotic_fact().is_some()
            || !k.val().is_plain()
        {
            continue;
        }
        let mut t = k.val().as_ref().clone();
        round_to_f16(t.try_as_plain_ram_mut()?.as_slice_mut::<f32>()?);
        let k = Const::new(Arc::new(t))?;
        let fact = k.output_facts(&[])?.remove(0);
        model.node_mut(id).op = Box::new(k);
        model.set_outlet_fact(OutletId::new(id, 0), fact)?;
        done += 1;
    }
    Ok(done)
}

/// Puts a [`RoundF16`] after every node of an optimized model that computes new f32 values
/// (a layer, with whatever tract fused into it), so each layer's output is rounded once, as
/// an FP16 engine stores it; the model's outputs stay as computed (in f32), as before.
/// Ops that only move values (reshapes, slices, concatenations, max pooling) of already
/// rounded inputs are left alone: their outputs are f16 values already. Nodes of the ONNX
/// nodes in `keep_fp32` (tract names the nodes it makes of `n` as `n` or `n.<part>`) are not
/// rounded: the overflow guard keeps them in FP32.
pub fn round_outputs_to_f16(model: &mut TypedModel, keep_fp32: &[String]) -> TractResult<usize> {
    use tract_onnx::tract_core::ops::array::{Gather, MultiBroadcastTo, Slice, TypedConcat};
    use tract_onnx::tract_core::ops::change_axes::{AxisOp, IntoShape};
    use tract_onnx::tract_core::ops::cnn::{MaxPool, OptMaxPool};
    use tract_onnx::tract_core::ops::konst::Const;
    let outputs: Vec<OutletId> = model.output_outlets()?.to_vec();
    let mut rounded: std::collections::HashSet<OutletId> = Default::default();
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        if node.op_is::<Const>() || node.op_is::<RoundF16>() {
            continue;
        }
        let kept = keep_fp32.iter().any(|k| {
            node.name == *k
                || node
                    .name
                    .strip_prefix(k.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        });
        if kept {
            continue;
        }
        let moves_values = node.op_is::<AxisOp>()
            || node.op_is::<IntoShape>()
            || node.op_is::<Slice>()
            || node.op_is::<TypedConcat>()
            || node.op_is::<MultiBroadcastTo>()
            || node.op_is::<Gather>()
            || node.op_is::<MaxPool>()
            || node.op_is::<OptMaxPool>();
        let is_rounded =
            |i: &OutletId| rounded.contains(i) || model.node(i.node).op_is::<RoundF16>();
        if moves_values && node.inputs.iter().all(is_rounded) {
            rounded.extend((0..node.outputs.len()).map(|s| OutletId::new(id, s)));
            continue;
        }
        for slot in 0..node.outputs.len() {
            let outlet = OutletId::new(id, slot);
            let fact = model.outlet_fact(outlet)?;
            if fact.datum_type != f32::datum_type() || !fact.is_plain() {
                continue;
            }
            if outputs.contains(&outlet) {
                continue;
            }
            let name = format!("{}.round_f16.{slot}", model.node(id).name);
            let mut patch = TypedModelPatch::default();
            let tap = patch.tap_model(model, outlet)?;
            let r = patch.wire_node(name, RoundF16, &[tap])?[0];
            patch.shunt_outside(model, outlet, r)?;
            patch.apply(model)?;
            rounded.insert(outlet);
            done += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {

    use super::super::super::{Numerics, TractModel};
    use crate::backend::{Backend, BuildInput, BuildSpec, Precision};
    use crate::model::proto;
    use crate::model::testing::{GraphBuilder, residual_classifier, values};

    #[test]
    fn round_to_f16_is_the_f16_cast() {
        let mut v: Vec<f32> = values(5000, 3).iter().map(|x| x * 70_000.0).collect();
        // Ties (half to even), the largest f16, overflow, subnormals, signed zero, NaN.
        v.extend([
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65504.0,
            65520.0,
            -1e9,
            1e-7,
            -3e-8,
            -0.0,
            f32::NAN,
        ]);
        let mut ours = v.clone();
        super::round_to_f16(&mut ours);
        for (o, x) in ours.iter().zip(&v) {
            let want = half::f16::from_f32(*x).to_f32();
            assert!(
                o.to_bits() == want.to_bits() || o.is_nan() && want.is_nan(),
                "{x}: {o} vs {want}"
            );
        }
    }

    fn segmenter() -> GraphBuilder {
        let mut b = GraphBuilder::new(&[1, 3, 24, 24]);
        let c1 = b.conv_bn("stem", "x", 3, 8);
        let r1 = b.op("Relu", "stem.relu", &[&c1]);
        let c2 = b.conv("block.conv", &r1, 8, 8, 3);
        let add = b.op("Add", "block.add", &[&c2, &r1]);
        let c3 = b.conv("head", &add, 8, 5, 1);
        let g = &mut b.graph;
        g.initializer.push(proto::f32_tensor("roi", &[0], &[]));
        g.initializer.push(proto::f32_tensor("scales", &[0], &[]));
        g.initializer
            .push(proto::i64_tensor("sizes", &[4], &[1, 5, 50, 50]));
        g.node.push(proto::node(
            "Resize",
            "up",
            &[&c3, "roi", "scales", "sizes"],
            &["y"],
            vec![
                proto::str_attr("mode", "linear"),
                proto::str_attr("coordinate_transformation_mode", "half_pixel"),
            ],
        ));
        b.output("y");
        b
    }

    #[test]
    fn fp16_engine_keeps_the_numerics_of_the_cast_simulation() {
        for (name, b, hw) in [
            ("classifier", residual_classifier(10), [16, 16]),
            ("segmenter", segmenter(), [24, 24]),
        ] {
            let model = b.model();
            let spec = BuildSpec { batch: 1, hw };
            let shape = model.input_shape(1, hw);
            let build = |precision| {
                super::super::super::CpuBackend
                    .build(
                        BuildInput::Float {
                            model: &model,
                            precision,
                            keep_fp32: &[],
                        },
                        spec,
                    )
                    .expect("build")
            };
            let x = values(shape.iter().product(), 7);
            let fp32 = build(Precision::Fp32).run(&x).expect("fp32").data;
            let mut fp16 = build(Precision::Fp16);
            assert!(fp16.info().simulated, "{name}: FP16 on the CPU is labelled");
            let ours = fp16.run(&x).expect("fp16").data;
            // The previous simulation: a Cast(f16) -> Cast(f32) pair after every ONNX node.
            let sim = super::super::super::fp16_simulation(&model, spec).expect("simulation");
            let sim = TractModel::new(&sim, shape, &[]).expect("sim build");
            let sim = sim.run_all(&x).expect("sim run");
            let sim = sim[0]
                .try_as_plain_ram()
                .expect("ram")
                .as_slice::<f32>()
                .expect("f32")
                .to_vec();
            let max = fp32.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err =
                |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let (vs_fp32, vs_sim) = (err(&ours, &fp32), err(&ours, &sim));
            let sim_vs_fp32 = err(&sim, &fp32);
            assert!(vs_fp32 > 0.0, "{name}: rounding to f16 changes the output");
            // Both are FP16 numerics: they differ by a few f16 steps (2^-11 relative) where
            // one rounds a folded batch norm's output once and the other twice, far less than
            // either differs from FP32.
            assert!(
                vs_sim <= 4.0 * max / 2048.0,
                "{name}: new FP16 vs the cast simulation {vs_sim}, output scale {max}"
            );
            assert!(
                vs_fp32 <= 4.0 * sim_vs_fp32.max(max / 2048.0),
                "{name}: FP16 vs FP32 {vs_fp32}, simulation vs FP32 {sim_vs_fp32}"
            );
            // And the work is one rounding op per layer, not two casts per node.
            let kernels: Vec<String> = TractModel::with_numerics(
                &model.with_fixed_input(1, hw),
                shape,
                &[],
                Numerics::Fp16,
                &[],
            )
            .expect("fp16 model")
            .profile(&x, 1)
            .expect("profile")
            .into_iter()
            .map(|l| l.kernel)
            .collect();
            assert!(kernels.iter().any(|k| k == "RoundF16"), "{kernels:?}");
            assert!(!kernels.iter().any(|k| k == "Cast"), "{kernels:?}");
        }
    }
}
