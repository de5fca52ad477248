//! Depthwise convs on the NVRTC kernels: `conv_dw4` (any type, four channels of four
//! adjacent outputs a thread) and, for int8 square kernels of DW_ROWS_SHAPES, the kernels
//! that read each input row's window once (`conv_dw_i8_k{K}s{S}`). Epilogue fused in both;
//! both pad int8 input with the step's pad code.

use super::super::device::{DevBuf, Launch};
use super::super::kernels::{DW_ROWS_SHAPES, launch};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, Epi};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::{ConvStep, DType};

/// `conv_dw4` (`rows: false`) or the row-window int8 kernels (`rows: true`).
pub(super) struct Depthwise {
    rows: bool,
}

pub(super) const DEPTHWISE: Depthwise = Depthwise { rows: false };
pub(super) const DEPTHWISE_ROWS: Depthwise = Depthwise { rows: true };

impl ConvFamily for Depthwise {
    fn name(&self) -> &'static str {
        if self.rows {
            "row-window depthwise kernel"
        } else {
            "depthwise kernel"
        }
    }
    fn optional(&self) -> bool {
        false
    }
    fn tokens(&self) -> &'static [&'static str] {
        if self.rows { &["dwr"] } else { &["dw"] }
    }
    fn takes_pad_code(&self) -> bool {
        true
    }
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        if self.rows {
            rows_kernel(cx, &l.step).is_some()
        } else {
            depthwise_ok(cx, &l.step)
        }
    }
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let c = &l.step;
        let setup = match rows_kernel(cx, c).filter(|_| self.rows) {
            Some(kernel) => DwSetup {
                w: rows_weights(c)?,
                imp: ConvImpl::DepthwiseRows { kernel },
            },
            None => DwSetup {
                w: weights(c, l.float)?,
                imp: ConvImpl::Depthwise,
            },
        };
        Ok(Some(Box::new(setup)))
    }
}

/// Whether the depthwise kernel takes this layer: one input channel per group and one output
/// per channel, a multiple of 4 channels, 2-D, an input it reads, tensors its 32-bit indices
/// reach.
fn depthwise_ok(cx: &Launch, c: &ConvStep) -> bool {
    let xd = cx.td(c.input);
    let input_ok = match xd.dtype {
        DType::I8 | DType::F8 => c.quant.as_ref().is_some_and(|q| q.dtype == xd.dtype),
        DType::F16 | DType::F32 => c.quant.is_none(),
    };
    let fits_i32 = |t: usize| cx.td(t).numel() < i32::MAX as usize;
    c.groups > 1
        && c.groups == c.cin
        && c.cout == c.cin
        && c.cin.is_multiple_of(4)
        && xd.shape.len() == 4
        && input_ok
        && fits_i32(c.input)
        && fits_i32(c.out)
}

/// Which of the row-window int8 depthwise kernels takes this layer (its index in
/// DW_ROWS_SHAPES), if one does: an int8 depthwise layer reading int8 that `depthwise_ok`
/// takes, square kernel and stride among DW_ROWS_SHAPES, dilation 1.
fn rows_kernel(cx: &Launch, c: &ConvStep) -> Option<usize> {
    let shape = DW_ROWS_SHAPES
        .iter()
        .position(|&s| (c.k[0], c.stride[0]) == s)?;
    (depthwise_ok(cx, c)
        && c.quant.as_ref().is_some_and(|q| q.is_int8())
        && cx.td(c.input).dtype == DType::I8
        && c.k[0] == c.k[1]
        && c.stride[0] == c.stride[1]
        && c.dilation == [1, 1])
    .then_some(shape)
}

/// The row-window depthwise kernel's weights: int8 `[KH][ceil(KW / 4)][C][4]`, a row's taps
/// in groups of four, zeros past the row's last tap.
fn rows_weights(c: &ConvStep) -> CudaResult<DevBuf> {
    let q = c
        .quant
        .as_ref()
        .ok_or_else(|| CudaError::Internal("depthwise row kernel: not an int8 layer".into()))?;
    let (kh, kw) = (c.k[0], c.k[1]);
    let groups = kw.div_ceil(4);
    let w: Vec<i8> = (0..kh * groups * c.cout * 4)
        .map(|i| {
            let (row, ch, j) = (i / (groups * c.cout * 4), i / 4 % c.cout, i % 4);
            let kx = i / (c.cout * 4) % groups * 4 + j;
            if kx < kw {
                q.w[(ch * kh + row) * kw + kx]
            } else {
                0
            }
        })
        .collect();
    DevBuf::from_slice(&w)
}

/// The depthwise kernel's weights: int8 as `[ceil(KH * KW / 4), C, 4]`, float tap-major
/// `[KH * KW, C]` as the engine's float type would round them (kept in f32), FP8 as their
/// values tap-major (the kernel's float path reads the FP8 input).
fn weights(c: &ConvStep, float: DType) -> CudaResult<DevBuf> {
    let taps = c.k[0] * c.k[1];
    let tap_major = |v: &dyn Fn(usize) -> f32| -> Vec<f32> {
        (0..taps * c.cout)
            .map(|i| v((i % c.cout) * taps + i / c.cout))
            .collect()
    };
    match &c.quant {
        Some(q) if !q.is_int8() => {
            let v = q.values();
            DevBuf::from_slice(&tap_major(&|i| v[i]))
        }
        Some(q) => {
            // [tap group of 4, C, 4], zeros past the last tap (the kernel's __dp4a order).
            let groups = taps.div_ceil(4);
            let w: Vec<i8> = (0..groups * c.cout * 4)
                .map(|i| {
                    let (g, ch, j) = (i / (c.cout * 4), i / 4 % c.cout, i % 4);
                    let t = g * 4 + j;
                    if t < taps { q.w[ch * taps + t] } else { 0 }
                })
                .collect();
            DevBuf::from_slice(&w)
        }
        None if float == DType::F16 => {
            DevBuf::from_slice(&tap_major(&|i| half::f16::from_f32(c.w[i]).to_f32()))
        }
        None => DevBuf::from_slice(&tap_major(&|i| c.w[i])),
    }
}

/// A depthwise layer's weights in its kernel's layout, and which kernel.
struct DwSetup {
    w: DevBuf,
    imp: ConvImpl,
}

impl ConvSetup for DwSetup {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        vec![self.imp.clone()]
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let (h, w) = l.in_hw(cx.plan);
        let n = cx.td(c.input).shape[0];
        // Threads: four channels of DW_PX (4) adjacent outputs along x each.
        let threads = cx.td(c.out).numel() / l.ow / 4 * l.ow.div_ceil(4);
        match imp {
            ConvImpl::Depthwise => launch!(cx.stream, cx.dev.k.conv_dw4, threads;
                way.input, way.in_t.code(), self.w.ptr, way.alpha, l.bias.ptr,
                e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow),
                u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
                u(c.dilation[0]), u(c.dilation[1]), e.act.0, e.act.1, e.act.2,
                c.pad_code as i32),
            ConvImpl::DepthwiseRows { kernel } => {
                launch!(cx.stream, cx.dev.k.conv_dw_i8[*kernel], threads;
                way.input, self.w.ptr, way.alpha, l.bias.ptr,
                e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow),
                u(c.pads[0]), u(c.pads[1]), e.act.0, e.act.1, e.act.2, c.pad_code as i32)
            }
            _ => Err(CudaError::Internal(format!(
                "a depthwise setup asked for {}",
                imp.key()
            ))),
        }
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }
}
