//! Helpers of the CUDA tests: the GPU (or why there is none), the error measure, random
//! inputs, a max-calibrated Q/DQ model for building CPU and CUDA INT8 engines from one plan,
//! and the CPU INT8 engine's output the CUDA ones are held to.

use quantscope::backend::cpu::CpuBackend;
use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildInput, BuildSpec, Engine, Output};
use quantscope::calib::{Method, Stats};
use quantscope::model::Model;
use quantscope::model::testing::values;
use quantscope::quant;

/// The CUDA backend when it can run here (FP32 engines in strict FP32, for parity with the
/// CPU); else prints why the test skips.
pub fn gpu() -> Option<CudaBackend> {
    match CudaBackend::strict().check() {
        Ok(dev) => {
            eprintln!("cuda: {dev}");
            Some(CudaBackend::strict())
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let m = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-12);
    a.iter()
        .zip(b)
        .fold(0f64, |e, (x, y)| e.max((*x as f64 - *y as f64).abs()))
        / m
}

/// A deterministic input of `m` at `batch` x `hw`, values in [-2, 2).
pub fn input_for(m: &Model, batch: usize, hw: [usize; 2], seed: u64) -> Vec<f32> {
    let n: usize = m.input_shape(batch, hw).iter().product();
    values(n, seed).iter().map(|v| v * 2.0).collect()
}

/// The Q/DQ model of `m`, calibrated (max) on `images` random inputs (seeds 100, 101, ...).
pub fn max_qdq(m: &Model, hw: [usize; 2], images: usize) -> Result<quant::QdqModel, String> {
    max_qdq_as(m, hw, images, quant::QFormat::Int8)
}

/// [`max_qdq`] in `format` (INT8 or FP8 E4M3).
pub fn max_qdq_as(
    m: &Model,
    hw: [usize; 2],
    images: usize,
    format: quant::QFormat,
) -> Result<quant::QdqModel, String> {
    let plan = quant::plan(m, &[]);
    let tensors = plan.tensors();
    // The reference interpreter a run calibrates on (ONNX Runtime where it is loaded).
    let probe = quantscope::backend::reference::open_model(m, hw, &tensors)
        .map_err(|e| format!("probe: {e:#}"))?;
    let mut stats = Stats::new("test".into(), &tensors);
    for k in 0..images {
        let (_, acts) = probe
            .run(&input_for(m, 1, hw, 100 + k as u64))
            .map_err(|e| format!("probe run: {e:#}"))?;
        stats.add(&tensors, &acts);
    }
    let ranges = stats.ranges(Method::Max, 99.99);
    quant::build_qdq_as(m, &plan, Some(&ranges), format).map_err(|e| format!("qdq: {e:#}"))
}

/// The CPU engine of `m` built from `qdq` (INT8, or FP8 simulated).
pub fn cpu_int8_engine(
    m: &Model,
    qdq: &quant::QdqModel,
    spec: BuildSpec,
) -> Result<Box<dyn Engine>, String> {
    CpuBackend
        .build(
            BuildInput::Quantized {
                model: m,
                qdq,
                keep_fp32: &[],
            },
            spec,
        )
        .map_err(|e| format!("cpu int8: {e:#}"))
}

/// [`cpu_int8_engine`], run on `x`.
pub fn cpu_int8_run(
    m: &Model,
    qdq: &quant::QdqModel,
    spec: BuildSpec,
    x: &[f32],
) -> Result<Output, String> {
    cpu_int8_engine(m, qdq, spec)?
        .run(x)
        .map_err(|e| format!("cpu int8: {e:#}"))
}

/// The CPU FP32 engine of `m`, run on `x`: the reference the quantized engines are held to.
pub fn cpu_fp32_run(m: &Model, spec: BuildSpec, x: &[f32]) -> Output {
    CpuBackend
        .build(
            BuildInput::Float {
                model: m,
                precision: quantscope::backend::Precision::Fp32,
                keep_fp32: &[],
            },
            spec,
        )
        .and_then(|mut e| e.run(x))
        .expect("cpu fp32")
}
