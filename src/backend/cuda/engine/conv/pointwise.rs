//! Int8 1x1 convs (and Gemm / MatMul rows) on the `__dp4a` kernels: `conv_pw_i8` (a block's
//! weight rows in shared memory, PW_CO output channels a thread) and `conv_pw_i8_word` (a
//! thread per four output channels of a pixel, the output written in whole lines).

use cudarc::driver::LaunchConfig;

use super::super::args::FastDiv;
use super::super::device::{DevBuf, Launch};
use super::super::kernels::{PW_CO, PW_MAX_SHARED_BYTES, PW_THREADS, launch};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, Epi};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::{ConvStep, DType};

pub(super) struct Pointwise;

pub(super) const POINTWISE: Pointwise = Pointwise;

impl ConvFamily for Pointwise {
    fn name(&self) -> &'static str {
        "pointwise kernel"
    }
    fn optional(&self) -> bool {
        false
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["pw", "pww"]
    }
    /// An int8 1x1 conv (or Gemm / MatMul) reading int8, 4-byte rows in and out, and 32-bit
    /// indices (`m` rows).
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        let c = &l.step;
        c.quant.as_ref().is_some_and(|q| q.is_int8())
            && cx.td(c.input).dtype == DType::I8
            && c.is_pointwise()
            && c.cin.is_multiple_of(4)
            && c.cout.is_multiple_of(4)
            && l.m.saturating_mul(c.cin.max(c.cout)) < i32::MAX as usize
    }
    fn prepare(&self, _cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        Ok(Some(Box::new(PwSetup {
            w: weights(&l.step)?,
        })))
    }
}

/// The pointwise kernels' weights: 32-bit words `[cin / 4, cout]`, word `v * cout + c`
/// holding the int8 weights `[c][4v .. 4v + 4]` (a thread of `conv_pw_i8_word` reads its
/// four channels' words as one 16-byte vector).
fn weights(c: &ConvStep) -> CudaResult<DevBuf> {
    let q = c
        .quant
        .as_ref()
        .ok_or_else(|| CudaError::Internal("pointwise kernel: not an int8 layer".into()))?;
    let w: Vec<i8> = (0..c.cout * c.cin)
        .map(|i| {
            let (v, ch, j) = (i / (4 * c.cout), i / 4 % c.cout, i % 4);
            q.w[ch * c.cin + 4 * v + j]
        })
        .collect();
    DevBuf::from_slice(&w)
}

struct PwSetup {
    w: DevBuf,
}

impl ConvSetup for PwSetup {
    /// `conv_pw_i8` while a block's weight rows fit PW_MAX_SHARED_BYTES, and the word kernel.
    fn candidates(&self, l: &ConvLayer) -> Vec<ConvImpl> {
        let mut v = vec![];
        if PW_CO * l.step.cin <= PW_MAX_SHARED_BYTES {
            v.push(ConvImpl::Pointwise);
        }
        v.push(ConvImpl::PointwiseWord);
        v
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        match imp {
            ConvImpl::Pointwise => {
                // x: pixels; y: blocks of PW_CO output channels.
                let cfg = LaunchConfig {
                    grid_dim: (
                        l.m.div_ceil(PW_THREADS) as u32,
                        c.cout.div_ceil(PW_CO) as u32,
                        1,
                    ),
                    block_dim: (PW_THREADS as u32, 1, 1),
                    shared_mem_bytes: (PW_CO * c.cin) as u32,
                };
                launch!(cx.stream, cx.dev.k.conv_pw_i8, cfg cfg; way.input, self.w.ptr, way.alpha, l.bias.ptr,
                    e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                    u(l.m), u(c.cin), u(c.cout), e.act.0, e.act.1, e.act.2)
            }
            ConvImpl::PointwiseWord => {
                // One thread per output word (four channels of a pixel).
                let words = l.m * c.cout / 4;
                let per_px = FastDiv::of(&[(c.cout / 4) as i64]);
                launch!(cx.stream, cx.dev.k.conv_pw_i8_word, words; way.input, self.w.ptr, way.alpha, l.bias.ptr,
                    e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                    u(l.m), u(c.cin), u(c.cout), e.act.0, e.act.1, e.act.2, per_px.magic[0], per_px.shift[0])
            }
            _ => Err(CudaError::Internal(format!(
                "a pointwise setup asked for {}",
                imp.key()
            ))),
        }
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }
}
