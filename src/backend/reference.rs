//! The reference interpreter: "run this graph on the CPU and read its tensors", the one narrow
//! interface that calibration, CLE, GPTQ, bias correction, sensitivity and the per-layer SQNR
//! go through. Both CPU engines implement it (ONNX Runtime where it is loaded, tract otherwise,
//! as `--cpu-engine` resolved); callers never name an engine.
//!
//! tract stays where it is the right tool and not behind this interface: shape inference and
//! constant folding for the CUDA planner, and sequential bias correction, which rewrites each
//! layer's output while the batch flows through the graph (`TractModel::run_adjusting`), a hook
//! ONNX Runtime does not offer.

use tract_onnx::pb;

use super::cpu::{self, CpuEngineKind};
use super::{BackendError, Output, Precision};
use crate::model::Model;

/// Bytes of requested tensors one run may hand out: calibration batches as many images as fit.
/// A model whose tensors for one image exceed it still runs, one image at a time.
pub const BATCH_BUDGET_BYTES: usize = 512 << 20;

/// The most images one batched run takes.
pub const MAX_BATCH: usize = 16;

/// A graph loaded for reading its tensors.
pub trait Interpreter: Send + Sync {
    /// Runs `images` images (their values back to back in the model's layout) and returns the
    /// graph's first output and then each requested tensor, in the order they were asked for,
    /// each holding every image.
    fn run_batch(
        &self,
        input: &[f32],
        images: usize,
    ) -> Result<(Output, Vec<Activation>), BackendError>;

    /// One image: [`Interpreter::run_batch`] with one.
    fn run(&self, input: &[f32]) -> Result<(Output, Vec<Activation>), BackendError> {
        self.run_batch(input, 1)
    }

    /// The most images [`Interpreter::run_batch`] takes (1 where the engine fixes the batch).
    fn max_batch(&self) -> usize;

    /// "onnxruntime" or "tract", for logs.
    fn engine(&self) -> &'static str;
}

/// One requested tensor's values as f32, moved out of the engine where it can be.
pub struct Activation(Values);

enum Values {
    Owned(Vec<f32>),
    Tract(tract_onnx::prelude::Tensor),
}

impl Activation {
    pub fn from_vec(v: Vec<f32>) -> Activation {
        Activation(Values::Owned(v))
    }
    pub(crate) fn from_tract(t: tract_onnx::prelude::Tensor) -> Activation {
        Activation(Values::Tract(t))
    }
    /// The values, moved out where they are already a vector.
    pub fn into_vec(self) -> Vec<f32> {
        match self.0 {
            Values::Owned(v) => v,
            Values::Tract(_) => self.as_ref().to_vec(),
        }
    }
    /// The values of image `k` of `images` (the tensor split evenly along its first axis).
    pub fn image(&self, k: usize, images: usize) -> &[f32] {
        let all = self.as_ref();
        let per = all.len() / images.max(1);
        all.get(k * per..(k + 1) * per).unwrap_or(&[])
    }
}

impl AsRef<[f32]> for Activation {
    fn as_ref(&self) -> &[f32] {
        match &self.0 {
            Values::Owned(v) => v,
            Values::Tract(t) => t
                .try_as_plain_ram()
                .ok()
                .and_then(|p| p.as_slice::<f32>().ok())
                .unwrap_or(&[]),
        }
    }
}

/// Loads `graph` (its input fixed at batch 1, `image_shape`) on the CPU engine in force, with
/// `tensors` readable. Q/DQ graphs run as exact fake quantization.
pub fn open(
    graph: &pb::ModelProto,
    image_shape: [usize; 4],
    tensors: &[String],
) -> Result<Box<dyn Interpreter>, BackendError> {
    let build_err = |reason: String| BackendError::Build {
        precision: Precision::Fp32,
        reason,
    };
    match cpu::engine_kind() {
        CpuEngineKind::Ort => {
            let probe =
                cpu::onnxruntime::OrtProbe::new(graph, image_shape, tensors, cpu::threads())
                    .map_err(build_err)?;
            Ok(Box::new(OrtInterpreter(probe)))
        }
        CpuEngineKind::Tract => {
            let probe = cpu::Probe::from_graph(graph, image_shape, tensors)?;
            Ok(Box::new(probe))
        }
    }
}

/// [`open`] on `model` at input size `hw`.
pub fn open_model(
    model: &Model,
    hw: [usize; 2],
    tensors: &[String],
) -> Result<Box<dyn Interpreter>, BackendError> {
    open(
        &model.with_fixed_input(1, hw),
        model.input_shape(1, hw),
        tensors,
    )
}

/// How many images a batched pass over `interp` should run at once, given what the tensors of
/// one image take (measured on a first run).
pub fn batch_for(interp: &dyn Interpreter, image_bytes: usize) -> usize {
    (BATCH_BUDGET_BYTES / image_bytes.max(1)).clamp(1, interp.max_batch().min(MAX_BATCH))
}

struct OrtInterpreter(cpu::onnxruntime::OrtProbe);

impl Interpreter for OrtInterpreter {
    fn run_batch(
        &self,
        input: &[f32],
        images: usize,
    ) -> Result<(Output, Vec<Activation>), BackendError> {
        let (first, rest) = self.0.run(input, images).map_err(BackendError::Run)?;
        Ok((
            first,
            rest.into_iter()
                .map(|o| Activation::from_vec(o.data))
                .collect(),
        ))
    }
    fn max_batch(&self) -> usize {
        MAX_BATCH
    }
    fn engine(&self) -> &'static str {
        "onnxruntime"
    }
}
