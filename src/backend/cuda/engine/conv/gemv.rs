//! Int8 1x1 convs and Gemm / MatMul of a few output rows (at most `GV_MAX_M`: a classifier at
//! batch 1 to 4, the squeeze-excitation convs of a pooled vector) on the weight-streaming
//! `__dp4a` GEMV, `conv_pw_i8_gemv`: a warp per four output channels, every block's weights
//! requested at once, so that the layer takes about its weights' bytes at the memory's pace.

use cudarc::driver::LaunchConfig;

use super::super::device::{DevBuf, Launch};
use super::super::kernels::{GV_MAX_M, GV_THREADS, launch};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, Epi};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::DType;

pub(super) struct Gemv;

pub(super) const GEMV: Gemv = Gemv;

/// Output channels a block computes: four a warp.
const GV_CHANNELS: usize = 4 * GV_THREADS / 32;

impl ConvFamily for Gemv {
    fn name(&self) -> &'static str {
        "int8 GEMV kernel"
    }
    fn optional(&self) -> bool {
        false
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["pwv"]
    }
    /// An int8 1x1 conv (or Gemm / MatMul) reading int8, of at most GV_MAX_M output rows,
    /// input rows and output channels in whole 4-byte words, and 32-bit row offsets.
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        let c = &l.step;
        c.quant.as_ref().is_some_and(|q| q.is_int8())
            && cx.td(c.input).dtype == DType::I8
            && c.is_pointwise()
            && l.m <= GV_MAX_M
            && c.cin.is_multiple_of(4)
            && c.cout.is_multiple_of(4)
            && l.m * c.cin.max(c.cout) < i32::MAX as usize
    }
    fn prepare(&self, _cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let q = l
            .step
            .quant
            .as_ref()
            .ok_or_else(|| CudaError::Internal("GEMV kernel: not an int8 layer".into()))?;
        // The plan's int8 weights are OHWI, which for a 1x1 conv are the kernel's [cout][cin]
        // rows already.
        Ok(Some(Box::new(GemvSetup {
            w: DevBuf::from_slice(&q.w)?,
        })))
    }
}

struct GemvSetup {
    w: DevBuf,
}

impl ConvSetup for GemvSetup {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        vec![ConvImpl::Gemv]
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let ConvImpl::Gemv = imp else {
            return Err(CudaError::Internal(format!(
                "a GEMV setup asked for {}",
                imp.key()
            )));
        };
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let cfg = LaunchConfig {
            grid_dim: (c.cout.div_ceil(GV_CHANNELS) as u32, 1, 1),
            block_dim: (GV_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(cx.stream, cx.dev.k.conv_pw_i8_gemv, cfg cfg; way.input, self.w.ptr, way.alpha, l.bias.ptr,
            e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
            u(l.m), u(c.cin), u(c.cout), e.act.0, e.act.1, e.act.2)
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }
}
