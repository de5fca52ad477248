//! `Backend` (can this machine build engines? build one) and `Engine` (run a batch,
//! synchronize, say what it holds), shaped like tract's `Runtime`. FP32/FP16 engines are
//! built from the model graph; INT8 engines from the Q/DQ model, as TensorRT does.

pub mod cpu;
pub mod cuda;
pub mod reference;

/// Lives in [`crate::precision`] so that `quant` can name it without a backend.
pub use crate::precision::Precision;

use serde::{Deserialize, Serialize};

use crate::fp16_guard::KeptFp32;
use crate::model::Model;
use crate::quant::QdqModel;

/// How FP32 engines on a GPU do their convolutions and GEMMs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Fp32Math {
    /// TF32 tensor cores (inputs rounded to a 10-bit mantissa, FP32 accumulation) on compute
    /// capability 8.0 and newer, as PyTorch's cuDNN convolutions and TensorRT do by default.
    #[default]
    Tf32,
    /// IEEE FP32 multiply-adds only: slower, and what the CPU engine computes.
    Strict,
}

/// How hard a GPU builder searches for each convolution's implementation: the counterpart of
/// TensorRT's builder optimization level. The CPU backends have nothing to search.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum BuildEffort {
    /// No timing: each conv takes the implementation a fixed preference order names first
    /// among those that apply, cuDNN's heuristic choice where cuDNN runs it.
    Fast,
    /// Every candidate timed, once per distinct conv shape: a layer shaped like one already
    /// timed in the same engine takes its choice and sets up only that implementation.
    #[default]
    Default,
    /// Every candidate of every conv timed, repeated shapes included.
    Exhaustive,
}

impl BuildEffort {
    pub fn name(self) -> &'static str {
        match self {
            BuildEffort::Fast => "fast",
            BuildEffort::Default => "default",
            BuildEffort::Exhaustive => "exhaustive",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// This machine's CPU: ONNX Runtime where its library is found, else tract (runs everywhere).
    #[default]
    Cpu,
    /// cuDNN + cuBLASLt + NVRTC through cudarc, loaded at run time.
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" | "gpu" => Ok(BackendKind::Cuda),
            _ => Err(format!("unknown backend `{s}` (expected cpu or cuda)")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend `{backend}` cannot run here: {why}")]
    Unavailable { backend: &'static str, why: String },
    #[error("building the {precision} engine: {reason}")]
    Build {
        precision: Precision,
        reason: String,
    },
    #[error("running the engine: {0}")]
    Run(String),
}

/// What an engine is built from (references only, so it is cheap to copy).
#[derive(Clone, Copy)]
pub enum BuildInput<'a> {
    /// FP32 or FP16 from the (prepared) model.
    Float {
        model: &'a Model,
        precision: Precision,
        /// Layers an FP16 engine keeps in FP32 (the overflow guard's list; FP32 ignores it).
        keep_fp32: &'a [KeptFp32],
    },
    /// INT8 or FP8 from the Q/DQ model (its `format` says which).
    Quantized {
        model: &'a Model,
        qdq: &'a QdqModel,
        /// Float layers kept in FP32 where the engine runs the others in FP16 (the CUDA
        /// engine); engines computing float layers in FP32 anyway ignore it.
        keep_fp32: &'a [KeptFp32],
    },
}

impl BuildInput<'_> {
    pub fn precision(&self) -> Precision {
        match self {
            BuildInput::Float { precision, .. } => *precision,
            BuildInput::Quantized { qdq, .. } => qdq.format.precision(),
        }
    }
    pub fn model(&self) -> &Model {
        match self {
            BuildInput::Float { model, .. } | BuildInput::Quantized { model, .. } => model,
        }
    }
    /// The overflow guard's list the engine applies where it computes in FP16.
    pub fn keep_fp32(&self) -> &[KeptFp32] {
        match self {
            BuildInput::Float { keep_fp32, .. } | BuildInput::Quantized { keep_fp32, .. } => {
                keep_fp32
            }
        }
    }
}

/// Batch size and input height/width the engine is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildSpec {
    pub batch: usize,
    pub hw: [usize; 2],
}

/// A node that runs in floating point in an INT8 engine, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FloatNode {
    pub node: String,
    pub op: String,
    pub reason: String,
}

/// Time one layer (or fused group) took, from the engine's own profiling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerTime {
    pub layer: String,
    pub kernel: String,
    pub time_ms: f64,
    /// The precision the layer computed in, and why where the engine chose it ("int8",
    /// "fp16, timed faster than int8", "fp16, float in the Q/DQ plan", ...); `None` where the
    /// backend does not say (the CPU's tract nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
}

/// What a built engine is and holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    pub backend: String,
    pub device: String,
    /// True where a precision is emulated (FP16 on the CPU backend: FP16 numerics in f32
    /// memory, so the accuracy is real and the latency is not an FP16 device's).
    pub simulated: bool,
    /// An FP32 engine whose convolutions and GEMMs may use TF32 tensor cores.
    #[serde(default)]
    pub tf32: bool,
    /// Threads a CPU engine runs on: the process's count, or one where one ran it faster
    /// ([`Engine::choose_threads`]).
    #[serde(default)]
    pub threads: Option<usize>,
    /// Nodes that compute on quantized inputs (int8, or FP8 E4M3).
    pub int8_nodes: usize,
    pub float_nodes: Vec<FloatNode>,
    /// Layers computed in FP32 where the engine computes the rest in FP16: the FP16 overflow
    /// guard's list ([`crate::fp16_guard`]), as the engine applied it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fp32_layers: Vec<KeptFp32>,
    pub weights_bytes: u64,
    pub activations_bytes: u64,
    pub workspace_bytes: u64,
    /// Device memory taken by the engine as the driver reports it (GPU backends).
    pub device_mem_bytes: Option<u64>,
    /// Device memory still free once the engine was built (GPU backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_bytes: Option<u64>,
    pub layer_times: Vec<LayerTime>,
    /// The layer times are each layer's share of the whole run (they sum to its time), not
    /// each layer timed alone (the CUDA engine's profile, `engine::profile`).
    #[serde(default)]
    pub layer_times_in_run: bool,
    /// The runtime that ran the engine and the form it ran, where there was a choice
    /// ("onnxruntime 1.32.0; INT8 form: u8 activations (zero point 128), ...").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// The first model output of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub trait Engine: Send {
    fn info(&self) -> &EngineInfo;
    fn batch(&self) -> usize;
    /// Runs one batch. `input` holds `batch x C x H x W` values in the model's layout.
    fn run(&mut self, input: &[f32]) -> Result<Output, BackendError>;
    /// Runs one batch and returns how long the work took on the device, in ms, without
    /// copying the output back: the benchmark's clock. CPU engines time `run`.
    fn timed_run(&mut self, input: &[f32]) -> Result<f64, BackendError> {
        let t = std::time::Instant::now();
        self.run(input)?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
    /// Time per layer (or fused group) on `input`, slowest first.
    fn profile(&mut self, _input: &[f32]) -> Result<Vec<LayerTime>, BackendError> {
        Ok(self.info().layer_times.clone())
    }
    /// Settles the threads the engine runs on, by timing (CPU: the process's count or one,
    /// whichever runs it faster); called just before the engine is timed, when nothing else
    /// runs. Returns the threads chosen, if the backend has a choice.
    fn choose_threads(&mut self) -> Result<Option<usize>, BackendError> {
        Ok(None)
    }
    /// Milliseconds the engine's idle threads keep cores busy after a run, waiting for the
    /// next one. An engine timed right after this one has its runs counted only once they
    /// have stopped ([`crate::bench::measure_side_by_side`]).
    fn idle_spin_ms(&self) -> f64 {
        0.0
    }
}

pub trait Backend {
    fn kind(&self) -> BackendKind;
    /// A description of the device when the backend can run here, else why it cannot.
    fn check(&self) -> Result<String, String>;
    fn build(
        &self,
        input: BuildInput<'_>,
        spec: BuildSpec,
    ) -> Result<Box<dyn Engine>, BackendError>;
    /// `build`, telling `progress` (layers done, layers in all) as a backend that builds
    /// layer by layer (CUDA: each conv's implementation chosen) goes; the others build in
    /// one go.
    fn build_with_progress(
        &self,
        input: BuildInput<'_>,
        spec: BuildSpec,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Box<dyn Engine>, BackendError> {
        let _ = progress;
        self.build(input, spec)
    }
    /// An interpreter on this backend's device for the calibration statistics pass, reading
    /// `tensors` of `model` at input size `hw` after each batch; `None` where the CPU's
    /// reference interpreter does that pass (the CPU backend).
    fn statistics_probe(
        &self,
        model: &Model,
        hw: [usize; 2],
        tensors: &[String],
    ) -> Option<Result<Box<dyn reference::Interpreter>, BackendError>> {
        let _ = (model, hw, tensors);
        None
    }
}

/// The backend of `kind`, a GPU's FP32 engines on TF32 (the default [`Fp32Math`]), built with
/// the default [`BuildEffort`].
pub fn backend(kind: BackendKind) -> Box<dyn Backend> {
    backend_with(kind, Fp32Math::default(), BuildEffort::default())
}

/// The backend of `kind`; `fp32_math` says how a GPU's FP32 engines compute (the CPU's are
/// always strict FP32), `effort` how hard a GPU builder searches.
pub fn backend_with(
    kind: BackendKind,
    fp32_math: Fp32Math,
    effort: BuildEffort,
) -> Box<dyn Backend> {
    match kind {
        BackendKind::Cpu => Box::new(cpu::CpuBackend),
        BackendKind::Cuda => Box::new(cuda::CudaBackend {
            fp32_math,
            effort,
            near_tie: None,
        }),
    }
}
