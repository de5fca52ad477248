//! The Layers tab's rows for a CUDA engine: each step's time in the run (or, for a large
//! engine, alone), with what ran it (the conv implementation chosen, or the NVRTC kernel), the
//! precision it computed in, and the stream.

use super::CudaEngine;
use super::choose::StreamTimer;
use super::conv::ConvImpl;
use crate::backend::cuda::error::{CudaResult, drv};
use crate::backend::cuda::plan::{DType, Step, float_type};
use crate::backend::{LayerTime, Precision};

impl CudaEngine {
    /// Each step's time, with what ran it and in which precision (an int8 layer the builder
    /// ran in FP16, or a layer the Q/DQ plan leaves in float, says so), and whether the times
    /// are each step's share of the run (`in_run_times`) rather than each step timed alone.
    pub(super) fn profile_layers(&self, engine: Precision) -> CudaResult<(Vec<LayerTime>, bool)> {
        let float_name = match float_type(engine) {
            DType::F16 => "fp16",
            _ if self.tf32 => "fp32 (tf32)",
            _ => "fp32",
        };
        // A float conv computing in F32 in an FP16 engine: the overflow guard's.
        let kept_fp32 = |c: &crate::backend::cuda::plan::ConvStep| {
            float_type(engine) == DType::F16 && self.plan.tensors[c.input].dtype == DType::F32
        };
        let in_run = self.in_run_times()?;
        let mut out = vec![];
        for (si, s) in self.plan.steps.iter().enumerate() {
            let time_ms = match &in_run {
                Some(t) => t[si],
                None => self.time_launches(si)?,
            };
            let chosen = self.convs.get(&si).and_then(|rt| rt.chosen());
            let (precision, kernel) = match (s, chosen) {
                (Step::Conv(c), Some(imp)) => {
                    let precision = match (&c.quant, imp) {
                        (Some(q), ConvImpl::AsF16(_)) => {
                            format!("fp16, timed faster than {}", quant_name(q.dtype))
                        }
                        (Some(q), ConvImpl::Direct | ConvImpl::Depthwise) if !q.is_int8() => {
                            "fp8 data, fp32 arithmetic (no fp8 kernel for this layer)".to_string()
                        }
                        (Some(q), _) => quant_name(q.dtype).to_string(),
                        (None, _) if kept_fp32(c) => {
                            "fp32, kept by the FP16 overflow guard".to_string()
                        }
                        (None, _) if engine.is_quantized() => {
                            format!("{float_name}, float in the Q/DQ plan")
                        }
                        (None, _) => float_name.to_string(),
                    };
                    let p = c.quant.as_ref().map_or("float", |q| quant_name(q.dtype));
                    let out = match self.plan.tensors[c.out].dtype {
                        DType::I8 => " -> int8",
                        DType::F8 => " -> fp8",
                        _ => "",
                    };
                    let pooled = if c.pool_hw.is_some() {
                        ", global average pool fused"
                    } else {
                        ""
                    };
                    (precision, format!("{p} {}{pooled}{out}", imp.describe()))
                }
                // Other steps compute in f32 registers; their data is in the output's type.
                _ => {
                    let data = match self.plan.tensors[s.output()].dtype {
                        DType::I8 => "int8 data",
                        DType::F8 => "fp8 data",
                        DType::F16 => "fp16 data",
                        DType::F32 => "fp32 data",
                    };
                    (data.to_string(), format!("nvrtc {}", s.kind()))
                }
            };
            let kernel = match self.lanes.stream_of(si) {
                0 => kernel,
                k => format!("{kernel} (stream {k}, beside the main one)"),
            };
            let layer = match s {
                Step::Conv(c) if !c.fused.is_empty() => {
                    format!("{}+{}", c.name, c.fused.join("+"))
                }
                _ => s.name().to_string(),
            };
            out.push(LayerTime {
                layer,
                kernel,
                time_ms,
                precision: Some(precision),
            });
        }
        Ok((out, in_run.is_some()))
    }
}

impl CudaEngine {
    /// Milliseconds each step adds to the run: the graph of steps `0..=si` timed less the graph
    /// of steps `0..si`, each the median of a few blocks of back-to-back launches. Timed alone,
    /// a step is launched after itself, its input and weights hot and, as a programmatic
    /// dependent launch, its start overlapping its own previous launch; in the run it follows
    /// another kernel. On an H200, EfficientNet-B0's INT8 steps timed alone summed to 0.433 ms
    /// at batch 1 where the engine took 0.574 (its int8 depthwise kernels 0.047 ms of the
    /// difference), and FP16's to 0.545 of 0.552: alone, INT8 looked 21 % faster than FP16; it
    /// was 4 % slower. The increments sum to the whole graph's time, its launch included (in
    /// the first step's). They are noisy at the microsecond (one can be below zero), and the
    /// cost grows with the square of the steps: an engine whose profile would take more than
    /// [`IN_RUN_BUDGET_MS`] is timed step by step alone (`None`), as is every engine under
    /// QUANTSCOPE_CUDA_PROFILE=alone.
    fn in_run_times(&self) -> CudaResult<Option<Vec<f64>>> {
        let n = self.plan.steps.len();
        let forced = std::env::var("QUANTSCOPE_CUDA_PROFILE").ok();
        if forced.as_deref() == Some("alone") || n == 0 {
            return Ok(None);
        }
        let timer = StreamTimer::new(self)?;
        // Milliseconds per launch of the graph of the first `k` steps.
        let prefix = |k: usize| {
            self.graph_ms(&timer, || {
                self.lanes.run(&self.dev, k, |si| self.run_step(si))
            })
        };
        let whole_ms = prefix(n)?;
        // Prefixes take half the whole on average; each costs its blocks and a capture.
        let cost_ms =
            n as f64 * (IN_RUN_BLOCKS as f64 * (whole_ms / 2.0).max(IN_RUN_BLOCK_MS) + 1.0);
        if cost_ms > IN_RUN_BUDGET_MS && forced.as_deref() != Some("in-run") {
            return Ok(None);
        }
        let mut prefix_ms = (1..n).map(prefix).collect::<CudaResult<Vec<f64>>>()?;
        prefix_ms.push(whole_ms);
        Ok(Some(
            (0..n)
                .map(|k| prefix_ms[k] - if k == 0 { 0.0 } else { prefix_ms[k - 1] })
                .collect(),
        ))
    }
}

impl CudaEngine {
    /// Milliseconds per launch of what `launches` puts on the stream, captured as a CUDA graph:
    /// the median of [`IN_RUN_BLOCKS`] blocks of back-to-back launches of about
    /// [`IN_RUN_BLOCK_MS`] each.
    pub(super) fn graph_ms(
        &self,
        timer: &StreamTimer,
        launches: impl FnOnce() -> CudaResult<()>,
    ) -> CudaResult<f64> {
        let g = self.capture_graph(launches)?;
        let timed = |n: usize| {
            timer.per_launch(n, &|| {
                (0..n).try_for_each(|_| drv(g.launch(), "graph launch"))
            })
        };
        let once = timed(1)?;
        let n = ((IN_RUN_BLOCK_MS / once.max(1e-4)) as usize).clamp(1, 50);
        let blocks = (0..IN_RUN_BLOCKS)
            .map(|_| timed(n))
            .collect::<CudaResult<Vec<f64>>>()?;
        Ok(super::choose::median(&blocks))
    }
}

/// Blocks of launches each graph is timed in (the median is kept), and about how long each
/// block lasts.
const IN_RUN_BLOCKS: usize = 3;
const IN_RUN_BLOCK_MS: f64 = 1.0;
/// The longest an in-run profile may take (QUANTSCOPE_CUDA_PROFILE=in-run lifts it).
const IN_RUN_BUDGET_MS: f64 = 8000.0;

/// What the Layers tab calls a quantized type.
fn quant_name(t: DType) -> &'static str {
    if t == DType::F8 { "fp8" } else { "int8" }
}
