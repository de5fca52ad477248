//! The direct conv kernel (`conv_direct`): any conv the engine takes, any type, epilogue
//! fused. It is the correctness fallback: offered where no other family applies, and timed
//! beside the others only on small layers (below DIRECT_MAX_MACS).

use super::super::device::{DevBuf, Launch};
use super::super::kernels::launch;
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, Epi, halves};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::DType;

/// Multiply-adds below which the direct kernel is timed beside the other candidates.
pub(in super::super) const DIRECT_MAX_MACS: f64 = 2e8;

pub(in super::super) struct Direct;

pub(in super::super) const DIRECT: Direct = Direct;

impl ConvFamily for Direct {
    fn name(&self) -> &'static str {
        "direct kernel"
    }
    fn optional(&self) -> bool {
        false
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["direct"]
    }
    fn applies(&self, _cx: &Launch, _l: &ConvLayer) -> bool {
        true
    }
    fn prepare(&self, _cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let c = &l.step;
        let w = match &c.quant {
            Some(q) if q.is_int8() => DevBuf::from_slice(&q.w)?,
            // FP8: the kernel's float path reads the FP8 input; weights as their values.
            Some(q) => DevBuf::from_slice(&q.values())?,
            // FP16 engines: the weights as FP16 rounds them, kept in f32.
            None if l.float == DType::F16 => {
                let v: Vec<f32> = halves(&c.w).iter().map(|h| h.to_f32()).collect();
                DevBuf::from_slice(&v)?
            }
            None => DevBuf::from_slice(&c.w)?,
        };
        Ok(Some(Box::new(DirectSetup { w })))
    }
}

struct DirectSetup {
    w: DevBuf,
}

impl ConvSetup for DirectSetup {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        vec![ConvImpl::Direct]
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        if *imp != ConvImpl::Direct {
            return Err(CudaError::Internal(format!(
                "the direct setup asked for {}",
                imp.key()
            )));
        }
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let (h, w) = l.in_hw(cx.plan);
        let n = cx.td(c.input).shape[0];
        launch!(cx.stream, cx.dev.k.conv_direct, cx.td(c.out).numel();
            way.input, way.in_t.code(), way.in_scale, self.w.ptr, way.alpha, l.bias.ptr,
            e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
            u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow), u(c.cout),
            u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
            u(c.dilation[0]), u(c.dilation[1]), u(c.groups), e.act.0, e.act.1, e.act.2)
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }
}
