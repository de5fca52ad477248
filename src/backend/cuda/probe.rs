//! The calibration statistics pass on the GPU: an FP32 engine built with the tensors that
//! calibration reads as taps (`Plan::taps`), copied to the host after each batch, behind the
//! same `Interpreter` the CPU engines implement. Strict IEEE FP32, as the CPU computes, so the
//! statistics (and the cache they are kept in, shared by both) do not depend on the device.

use std::sync::Mutex;

use super::engine::CudaEngine;
use super::error::{CudaError, CudaResult};
use super::{CudaBackend, ops};
use crate::backend::reference::{Activation, BATCH_BUDGET_BYTES, Interpreter, MAX_BATCH};
use crate::backend::{
    BackendError, BuildEffort, BuildInput, BuildSpec, Fp32Math, Output, Precision,
};
use crate::model::Model;

pub struct CudaProbe {
    engine: Mutex<CudaEngine>,
    /// Images the engine runs at once; a smaller last batch is padded with zero images.
    batch: usize,
    /// Input values of one image.
    image_values: usize,
}

/// Builds the statistics engine for `model` at `hw` reading `tensors`: as many images per
/// batch as the tensors' host copies fit in [`BATCH_BUDGET_BYTES`], at most [`MAX_BATCH`]
/// (one where the graph fixes its batch). No conv is timed (`BuildEffort::Fast`): the pass
/// is a few dozen batches, where a timed search would cost more than it saves.
pub fn open(model: &Model, hw: [usize; 2], tensors: &[String]) -> CudaResult<CudaProbe> {
    CudaBackend::status().map_err(CudaError::Unsupported)?;
    let one = model.input_shape(1, hw);
    // Sized on the host-only plan of one image, which also names a tensor the GPU cannot
    // read before anything is built.
    let sizing = ops::lower_for(
        &model.with_fixed_input(1, hw),
        one,
        Precision::Fp32,
        ops::Target::default(),
        &[],
        tensors,
    )
    .map_err(CudaError::Unsupported)?;
    let image_bytes: usize = sizing.taps.iter().map(|&t| sizing.tensors[t].bytes()).sum();
    let batch = (BATCH_BUDGET_BYTES / image_bytes.max(1)).clamp(1, MAX_BATCH);
    let backend = CudaBackend {
        fp32_math: Fp32Math::Strict,
        effort: BuildEffort::Fast,
        near_tie: None,
    };
    let input = BuildInput::Float {
        model,
        precision: Precision::Fp32,
        keep_fp32: &[],
    };
    let build = |batch: usize| {
        backend.build_engine(
            &input,
            BuildSpec { batch, hw },
            Precision::Fp32,
            &|_, _| {},
            tensors,
        )
    };
    let (engine, batch) = match build(batch) {
        Ok(e) => (e, batch),
        // A graph that fixes its batch (a Reshape to [1, ...]) runs one image at a time.
        Err(_) if batch > 1 => (build(1)?, 1),
        Err(e) => return Err(e),
    };
    Ok(CudaProbe {
        engine: Mutex::new(engine),
        batch,
        image_values: one.iter().product(),
    })
}

impl Interpreter for CudaProbe {
    fn run_batch(
        &self,
        input: &[f32],
        images: usize,
    ) -> Result<(Output, Vec<Activation>), BackendError> {
        if images == 0 || images > self.batch || input.len() != images * self.image_values {
            return Err(BackendError::Run(format!(
                "the GPU statistics engine takes 1 to {} images of {} values; given {} values \
                 for {images}",
                self.batch,
                self.image_values,
                input.len()
            )));
        }
        let padded;
        let input = if images < self.batch {
            let mut v = input.to_vec();
            v.resize(self.batch * self.image_values, 0.0);
            padded = v;
            &padded
        } else {
            input
        };
        let (mut out, taps) = self
            .engine
            .lock()
            .map_err(|_| BackendError::Run("the GPU statistics engine panicked earlier".into()))?
            .run_tapped(input)
            .map_err(CudaError::at_run)?;
        // The batch is the outermost axis of every tensor, so the images asked for come first.
        let keep = |mut v: Vec<f32>| {
            v.truncate(v.len() / self.batch * images);
            v
        };
        if out.shape.first() == Some(&self.batch) {
            out.shape[0] = images;
        }
        out.data = keep(out.data);
        Ok((
            out,
            taps.into_iter()
                .map(|t| Activation::from_vec(keep(t)))
                .collect(),
        ))
    }

    fn max_batch(&self) -> usize {
        self.batch
    }

    fn engine(&self) -> &'static str {
        "cuda (FP32)"
    }
}
