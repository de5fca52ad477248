//! The FP16 way of an int8 or FP8 layer (`ConvImpl::AsF16`): the Q/DQ plan lets it run
//! quantized, but where FP16 times faster the builder keeps FP16. The quantized input is
//! dequantized into an FP16 scratch copy, a float implementation (cuBLASLt or cuDNN) runs on
//! the dequantized weights, and the epilogue writes the planned output type.

use super::super::LIB_WORKSPACE_BYTES;
use super::super::device::{DevBuf, Launch};
use super::super::kernels::{launch, round_up};
use super::cudnn::{self, CudnnSetup};
use super::gemm::{self, GemmSetup};
use super::{COL_MAX_BYTES, ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, symmetric_pads};
use crate::backend::cuda::error::{CudaError, CudaResult, have};
use crate::backend::cuda::plan::DType;

pub(super) struct F16Way;

pub(super) const F16_WAY: F16Way = F16Way;

impl ConvFamily for F16Way {
    fn name(&self) -> &'static str {
        "FP16 way"
    }
    fn optional(&self) -> bool {
        true
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["f16"]
    }
    fn applies(&self, _cx: &Launch, l: &ConvLayer) -> bool {
        l.step.quant.is_some()
    }
    /// The layer with dequantized weights, set up for the float implementations; `None`
    /// when none applies.
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let c = &l.step;
        let q = have(c.quant.as_ref(), "the quantized weights")?;
        let k = c.reduction();
        let mut fs = c.clone();
        fs.w = q
            .values()
            .iter()
            .enumerate()
            .map(|(i, &v)| v * q.w_scales[i / k])
            .collect();
        fs.quant = None;
        let cols_fit = c.is_pointwise() || l.m * round_up(k, 16) * 2 <= COL_MAX_BYTES;
        // Each library may have nothing for the shape (cuDNN takes rank-4 NHWC only, so a
        // Gemm / MatMul layer has cuBLASLt alone); the way is offered while one of them has.
        let gemm = if c.groups == 1 && cols_fit {
            offered(gemm::setup(cx, &fs, l.m, DType::F16, l.tf32))?
        } else {
            None
        };
        let cudnn = if symmetric_pads(c) {
            offered(cudnn::setup(
                cx,
                &fs,
                DType::F16,
                l.tf32,
                cx.f16_in_ptr(),
                !l.untimed,
            ))?
        } else {
            None
        };
        if gemm.is_none() && cudnn.is_none() {
            return Ok(None);
        }
        Ok(Some(Box::new(F16Setup {
            ones: DevBuf::from_slice(&vec![1.0f32; c.cout])?,
            gemm,
            cudnn,
        })))
    }
}

/// A library's setup, `None` where it has nothing for the shape; other errors fail.
fn offered<T>(setup: CudaResult<T>) -> CudaResult<Option<T>> {
    match setup {
        Ok(s) => Ok(Some(s)),
        Err(CudaError::Unsupported(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Dequantized weights for the float implementations and unit alphas (the FP16 conv already
/// computes real units).
struct F16Setup {
    gemm: Option<GemmSetup>,
    cudnn: Option<CudnnSetup>,
    ones: DevBuf,
}

impl ConvSetup for F16Setup {
    fn candidates(&self, l: &ConvLayer) -> Vec<ConvImpl> {
        let mut inner = vec![];
        if let Some(g) = &self.gemm {
            inner.extend(g.offer(&l.step, |algo, im2col| ConvImpl::Gemm { algo, im2col }));
        }
        if let Some(c) = &self.cudnn {
            inner.extend(c.offer(|algo| ConvImpl::Cudnn { algo }));
        }
        inner
            .into_iter()
            .map(|i| ConvImpl::AsF16(Box::new(i)))
            .collect()
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let ConvImpl::AsF16(inner) = imp else {
            return Err(CudaError::Internal(format!(
                "the FP16 way asked for {}",
                imp.key()
            )));
        };
        let c = &l.step;
        let n = cx.td(c.input).numel();
        launch!(cx.stream, cx.dev.k.unary, n; way.input, way.in_t.code(), way.in_scale,
            cx.f16_in_ptr(), DType::F16.code(), 1.0f32, n as i64, 0i32, 0.0f32, 0.0f32)?;
        let f16 = ConvWay {
            input: cx.f16_in_ptr(),
            in_t: DType::F16,
            in_scale: 1.0,
            alpha: self.ones.ptr,
        };
        match **inner {
            ConvImpl::Gemm { .. } => {
                have(self.gemm.as_ref(), "FP16 GEMM setup")?.launch(cx, l, inner, &f16)
            }
            ConvImpl::Cudnn { .. } => {
                have(self.cudnn.as_ref(), "FP16 cuDNN setup")?.launch(cx, l, inner, &f16)
            }
            _ => Err(CudaError::Internal(format!(
                "nested FP16 way {}",
                inner.key()
            ))),
        }
    }

    fn weights_bytes(&self) -> u64 {
        self.gemm.as_ref().map_or(0, |g| g.weights_bytes())
            + self.cudnn.as_ref().map_or(0, |c| c.weights_bytes())
    }

    fn workspace_bytes(&self, _imp: &ConvImpl) -> usize {
        LIB_WORKSPACE_BYTES
    }

    fn keep_only(&mut self, imp: &ConvImpl) {
        if let ConvImpl::AsF16(inner) = imp {
            if !matches!(**inner, ConvImpl::Gemm { .. }) {
                self.gemm = None;
            }
            if !matches!(**inner, ConvImpl::Cudnn { .. }) {
                self.cudnn = None;
            }
        }
    }
}
