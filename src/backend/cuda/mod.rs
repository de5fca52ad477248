//! The CUDA backend: cuDNN + cuBLASLt + NVRTC through cudarc, loaded at run time so the same
//! binary runs without a GPU. `check` finds and loads the libraries (see `libs`) and says
//! precisely what is missing; `build` lowers the model (`plan`), then builds the device engine
//! (`engine`): NHWC activations, conv + bias + residual + activation fused, INT8 layers where
//! the Q/DQ plan puts them (each also timed in FP16, the faster kept), float layers of INT8
//! engines in FP16, per-layer implementation chosen by timing (cached on disk, `cache`),
//! replayed as a CUDA graph. `probe` builds the FP32 engine the calibration statistics pass
//! runs on, with the tensors it reads copied out after each batch.

pub mod cache;
mod dnn_graph;
pub mod engine;
pub mod error;
mod kernel_source;
pub mod libs;
pub mod ops;
pub mod plan;
mod probe;
mod streams;

use std::sync::OnceLock;

use prost::Message;

use super::reference::Interpreter;
use super::{Backend, BackendError, BackendKind, BuildInput, BuildSpec, Engine, Precision};
use error::{CudaError, CudaResult};

#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend {
    pub fp32_math: super::Fp32Math,
    /// How hard the builder searches each conv's implementation.
    pub effort: super::BuildEffort,
    /// How much slower alone than the fastest (a fraction of its time) a conv candidate may
    /// be and still be timed again in the engine's run; `None`: QUANTSCOPE_CUDA_NEAR_TIE, else
    /// [`engine::NEAR_TIE`].
    pub near_tie: Option<f64>,
}

impl CudaBackend {
    /// FP32 engines in strict IEEE FP32 (no TF32): what parity with the CPU needs.
    pub fn strict() -> CudaBackend {
        CudaBackend {
            fp32_math: super::Fp32Math::Strict,
            ..Default::default()
        }
    }
}

/// Oldest compute capability with FP8 (E4M3) tensor cores: Ada (8.9), Hopper (9.0) and newer.
pub const FP8_COMPUTE: (i32, i32) = (8, 9);

/// Oldest compute capability the engine supports (int8 tensor-core GEMMs, NHWC cuDNN).
pub const MIN_COMPUTE: (i32, i32) = (7, 5);

fn probe() -> Result<String, String> {
    let (found, load_errors) = libs::preload();
    let missing: Vec<&str> = found
        .iter()
        .filter(|f| f.path.is_none())
        .map(|f| f.lib)
        .collect();
    let hint = format!(
        "searched {} folders (set {} to add some)",
        libs::search_dirs(std::env::var(libs::ENV_DIRS).ok().as_deref()).len(),
        libs::ENV_DIRS
    );
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Err(format!(
                "no NVIDIA driver: libcuda.so.1 cannot be loaded ({hint})"
            ));
        }
    }
    let mut ver = 0i32;
    let r = unsafe { cudarc::driver::sys::cuInit(0) };
    if r != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(format!(
            "the NVIDIA driver is present but cuInit failed: {r:?} (no GPU visible?)"
        ));
    }
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut ver) };
    let count = cudarc::driver::result::device::get_count().map_err(|e| format!("{e:?}"))?;
    if count < 1 {
        return Err("the NVIDIA driver sees no GPU".into());
    }
    let dev = cudarc::driver::result::device::get(0).map_err(|e| format!("{e:?}"))?;
    use cudarc::driver::sys::CUdevice_attribute as A;
    let attr = |a| unsafe { cudarc::driver::result::device::get_attribute(dev, a) }.unwrap_or(0);
    let cc = (
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
    );
    let name = cudarc::driver::result::device::get_name(dev).unwrap_or_else(|_| "GPU".into());
    if cc < MIN_COMPUTE {
        return Err(format!(
            "{name} has compute capability {}.{}; the CUDA backend needs {}.{} or newer",
            cc.0, cc.1, MIN_COMPUTE.0, MIN_COMPUTE.1
        ));
    }
    let need = |present: bool, lib: &str, what: &str| -> Result<(), String> {
        if present {
            Ok(())
        } else {
            Err(format!(
                "{what} is missing: {lib} not found or not loadable ({hint}{})",
                if load_errors.is_empty() {
                    String::new()
                } else {
                    format!("; load errors: {}", load_errors.join("; "))
                }
            ))
        }
    };
    unsafe {
        need(
            cudarc::nvrtc::sys::is_culib_present(),
            "libnvrtc.so.13",
            "NVRTC",
        )?;
        need(
            cudarc::cublaslt::sys::is_culib_present(),
            "libcublasLt.so.13",
            "cuBLASLt",
        )?;
        need(
            cudarc::cudnn::sys::is_culib_present(),
            "libcudnn.so.9",
            "cuDNN 9",
        )?;
    }
    let _ = missing;
    let cudnn_v = unsafe { cudarc::cudnn::sys::cudnnGetVersion() };
    let mem = unsafe { cudarc::driver::result::device::total_mem(dev) }.unwrap_or(0);
    Ok(format!(
        "{name} (sm_{}{}, {:.0} GiB), driver CUDA {}.{}, cuDNN {}.{}.{}",
        cc.0,
        cc.1,
        mem as f64 / (1u64 << 30) as f64,
        ver / 1000,
        (ver % 1000) / 10,
        cudnn_v / 10000,
        (cudnn_v % 10000) / 100,
        cudnn_v % 100
    ))
}

impl CudaBackend {
    fn status() -> Result<String, String> {
        static STATUS: OnceLock<Result<String, String>> = OnceLock::new();
        STATUS.get_or_init(probe).clone()
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn check(&self) -> Result<String, String> {
        Self::status()
    }

    fn build(
        &self,
        input: BuildInput<'_>,
        spec: BuildSpec,
    ) -> Result<Box<dyn Engine>, BackendError> {
        self.build_with_progress(input, spec, &|_, _| {})
    }

    fn build_with_progress(
        &self,
        input: BuildInput<'_>,
        spec: BuildSpec,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Box<dyn Engine>, BackendError> {
        let precision = input.precision();
        Self::status().map_err(|why| BackendError::Unavailable {
            backend: "cuda",
            why,
        })?;
        self.build_engine(&input, spec, precision, progress, &[])
            .map(|e| Box::new(e) as Box<dyn Engine>)
            .map_err(|e| e.at_build(precision))
    }

    fn statistics_probe(
        &self,
        model: &crate::model::Model,
        hw: [usize; 2],
        tensors: &[String],
    ) -> Option<Result<Box<dyn Interpreter>, BackendError>> {
        Some(
            probe::open(model, hw, tensors)
                .map(|p| Box::new(p) as Box<dyn Interpreter>)
                .map_err(|e| e.at_build(Precision::Fp32)),
        )
    }
}

impl CudaBackend {
    /// Lowers the model (`plan`), then builds the device engine, with the choice cache.
    /// `taps`: tensors the engine keeps for the host to read after each run (`Plan::taps`).
    fn build_engine(
        &self,
        input: &BuildInput<'_>,
        spec: BuildSpec,
        precision: Precision,
        progress: &dyn Fn(usize, usize),
        taps: &[String],
    ) -> CudaResult<engine::CudaEngine> {
        let model = input.model();
        if model.info.layout != crate::model::Layout::Nchw {
            return Err(CudaError::Unsupported(
                "the CUDA backend takes NCHW image inputs".into(),
            ));
        }
        let p = match input {
            BuildInput::Float { .. } => model.with_fixed_input(spec.batch, spec.hw),
            BuildInput::Quantized { qdq, .. } => crate::model::Model {
                proto: qdq.proto.clone(),
                ..model.clone()
            }
            .with_fixed_input(spec.batch, spec.hw),
        };
        let shape = model.input_shape(spec.batch, spec.hw);
        // The whole build, device set-up to graph capture, one at a time in the process (see
        // `engine::build_lock`).
        let _one_at_a_time = engine::build_lock();
        let device_start = std::time::Instant::now();
        let dev = engine::Device::new()?;
        engine::log_msg(&format!(
            "device, kernels and libraries ready in {:.0} ms",
            device_start.elapsed().as_secs_f64() * 1e3
        ));
        let target = ops::Target {
            int8_mma: dev.compute >= engine::MMA_COMPUTE,
        };
        let plan = ops::lower_for(&p, shape, precision, target, input.keep_fp32(), taps).map_err(
            |first| {
                // Name every node the backend cannot take, not only the first, so one run tells
                // the user the whole gap.
                let all = ops::survey(&p, shape, precision).unwrap_or_default();
                CudaError::Unsupported(if all.len() > 1 {
                    let list: Vec<String> = all.iter().take(12).map(|u| u.why.clone()).collect();
                    let more = all.len().saturating_sub(12);
                    format!(
                        "the CUDA backend cannot take {} node(s): {}{}",
                        all.len(),
                        list.join("; "),
                        if more > 0 {
                            format!("; and {more} more")
                        } else {
                            String::new()
                        }
                    )
                } else {
                    first
                })
            },
        )?;
        if precision == Precision::Fp8 && dev.compute < FP8_COMPUTE {
            return Err(CudaError::Unsupported(format!(
                "{} has compute capability {}.{}: FP8 (E4M3) tensor cores need {}.{} or newer \
                 (Ada, Hopper, Blackwell). Its accuracy can still be measured: the CPU backend \
                 simulates FP8 numerics (--backend cpu --precisions fp8)",
                dev.name, dev.compute.0, dev.compute.1, FP8_COMPUTE.0, FP8_COMPUTE.1
            )));
        }
        // TF32 needs Ampere's tensor cores (compute capability 8.0).
        let tf32 = precision == Precision::Fp32
            && self.fp32_math == super::Fp32Math::Tf32
            && dev.compute >= (8, 0);
        // The choices belong to the plan: the model, the layers the guard keeps in FP32, and
        // the taps (a tapped tensor is not fused away, so its convs' epilogues differ).
        let mut hasher = blake3::Hasher::new();
        hasher.update(&p.encode_to_vec());
        for name in input.keep_fp32().iter().map(|k| &k.node).chain(taps) {
            hasher.update(name.as_bytes());
            hasher.update(b"\0");
        }
        let fingerprint = hasher.finalize().to_hex()[..16].to_string();
        let name = cache::file_name(
            &fingerprint,
            &dev.name,
            if tf32 { "fp32-tf32" } else { precision.name() },
            spec.batch,
            spec.hw,
        );
        // Exhaustive searches anew; the fast effort's untimed choices are not stored, so a
        // later build at another effort still times what the cache does not hold.
        let cached = match self.effort {
            super::BuildEffort::Exhaustive => cache::Choices::default(),
            _ => cache::load(&name),
        };
        let how = engine::BuildHow {
            precision,
            tf32,
            batch: spec.batch,
            effort: self.effort,
            near_tie: self.near_tie.unwrap_or_else(near_tie_knob),
        };
        let (eng, choices) = engine::CudaEngine::build(dev, plan, how, &cached, progress)?;
        if choices != cached && self.effort != super::BuildEffort::Fast {
            cache::store(&name, &choices);
        }
        Ok(eng)
    }
}

/// The near tie QUANTSCOPE_CUDA_NEAR_TIE asks for (a fraction from 0 to 1), else
/// [`engine::NEAR_TIE`]; a value it cannot read is reported and left out.
fn near_tie_knob() -> f64 {
    let Ok(v) = std::env::var("QUANTSCOPE_CUDA_NEAR_TIE") else {
        return engine::NEAR_TIE;
    };
    match v.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => f,
        _ => {
            engine::log_msg(&format!(
                "QUANTSCOPE_CUDA_NEAR_TIE={v} is not a fraction from 0 to 1: using {}",
                engine::NEAR_TIE
            ));
            engine::NEAR_TIE
        }
    }
}

/// The nodes of `model` the CUDA planner cannot take for `precision` at input size `hw`,
/// found without a GPU and without building anything (for INT8, on the Q/DQ placement with
/// placeholder scales: placement, not calibration, decides what lowers). Empty: it all lowers.
pub fn coverage(
    model: &crate::model::Model,
    hw: [usize; 2],
    precision: Precision,
) -> Result<Vec<ops::Unsupported>, String> {
    let p = if let Some(format) = crate::quant::QFormat::of(precision) {
        let plan = crate::quant::plan(model, &[]);
        let q =
            crate::quant::build_qdq_as(model, &plan, None, format).map_err(|e| e.to_string())?;
        crate::model::Model {
            proto: q.proto,
            ..model.clone()
        }
        .with_fixed_input(1, hw)
    } else {
        crate::quant::carried::float_model(model).with_fixed_input(1, hw)
    };
    let shape = model.input_shape(1, hw);
    crate::guard::catch("surveying the CUDA plan", || {
        ops::survey(&p, shape, precision)
    })?
}

/// Per precision, the nodes the CUDA planner cannot take (empty: all of it lowers), or why it
/// could not plan at all.
pub type Coverage = Vec<(Precision, Result<Vec<ops::Unsupported>, String>)>;

/// [`coverage`] for every precision, at `size` (default: the model's own input size, else
/// 224x224).
pub fn coverage_all(model: &crate::model::Model, size: Option<[usize; 2]>) -> Coverage {
    let hw = size
        .or_else(|| model.input_hw(None).ok())
        .unwrap_or([224, 224]);
    Precision::ALL
        .iter()
        .map(|&p| (p, coverage(model, hw, p)))
        .collect()
}

/// Precisions the engine builds natively (none emulated).
pub const PRECISIONS: [Precision; 4] = Precision::ALL;
