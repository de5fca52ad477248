//! The Layers tab's rows for a CUDA engine: each step timed alone, with what ran it (the conv
//! implementation chosen, or the NVRTC kernel), the precision it computed in, and the stream.

use super::CudaEngine;
use super::conv::ConvImpl;
use crate::backend::cuda::error::CudaResult;
use crate::backend::cuda::plan::{DType, Step, float_type};
use crate::backend::{LayerTime, Precision};

impl CudaEngine {
    /// Each step timed alone, with what ran it and in which precision (an int8 layer the
    /// builder ran in FP16, or a layer the Q/DQ plan leaves in float, says so).
    pub(super) fn profile_layers(&self, engine: Precision) -> CudaResult<Vec<LayerTime>> {
        let float_name = match float_type(engine) {
            DType::F16 => "fp16",
            _ if self.tf32 => "fp32 (tf32)",
            _ => "fp32",
        };
        // A float conv computing in F32 in an FP16 engine: the overflow guard's.
        let kept_fp32 = |c: &crate::backend::cuda::plan::ConvStep| {
            float_type(engine) == DType::F16 && self.plan.tensors[c.input].dtype == DType::F32
        };
        let mut out = vec![];
        for (si, s) in self.plan.steps.iter().enumerate() {
            let time_ms = self.time_launches(si)?;
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
                    (precision, format!("{p} {}{out}", imp.describe()))
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
        Ok(out)
    }
}

/// What the Layers tab calls a quantized type.
fn quant_name(t: DType) -> &'static str {
    if t == DType::F8 { "fp8" } else { "int8" }
}
