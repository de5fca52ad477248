//! Depthwise convs on the NVRTC kernels: `conv_dw4` (any type, four channels of four
//! adjacent outputs a thread); for int8 square kernels of DW_ROWS_SHAPES, the kernels that
//! read each input row's window once (`conv_dw_i8_k{K}s{S}`); and for any int8 one, the
//! kernel that copies a tile's input window into shared memory once (`conv_dw_i8_tile`).
//! Epilogue fused in all three; all pad int8 input with the step's pad code.

use cudarc::driver::LaunchConfig;

use super::super::args::FastDiv;
use super::super::device::{DevBuf, Launch};
use super::super::kernels::{DW_ROWS_SHAPES, launch};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, Epi};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::{ConvStep, DType};

/// Which depthwise kernel a family runs.
#[derive(Clone, Copy)]
enum DwKernel {
    /// `conv_dw4`: any input type, each tap read from global memory (L1).
    Taps,
    /// `conv_dw_i8_k{K}s{S}`: int8, each input row's window read once per output row.
    Rows,
    /// `conv_dw_i8_tile`: int8, a tile's input window copied into shared memory once.
    Tile,
}

/// A family of one depthwise kernel.
pub(super) struct Depthwise {
    kernel: DwKernel,
}

pub(super) const DEPTHWISE: Depthwise = Depthwise {
    kernel: DwKernel::Taps,
};
pub(super) const DEPTHWISE_ROWS: Depthwise = Depthwise {
    kernel: DwKernel::Rows,
};
pub(super) const DEPTHWISE_TILE: Depthwise = Depthwise {
    kernel: DwKernel::Tile,
};

impl ConvFamily for Depthwise {
    fn name(&self) -> &'static str {
        match self.kernel {
            DwKernel::Taps => "depthwise kernel",
            DwKernel::Rows => "row-window depthwise kernel",
            DwKernel::Tile => "shared-memory tile depthwise kernel",
        }
    }
    fn optional(&self) -> bool {
        false
    }
    fn tokens(&self) -> &'static [&'static str] {
        match self.kernel {
            DwKernel::Taps => &["dw"],
            DwKernel::Rows => &["dwr"],
            DwKernel::Tile => &["dwt"],
        }
    }
    fn takes_pad_code(&self) -> bool {
        true
    }
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        match self.kernel {
            DwKernel::Taps => depthwise_ok(cx, &l.step),
            DwKernel::Rows => rows_kernel(cx, &l.step).is_some(),
            DwKernel::Tile => tile_of(cx, l).is_some(),
        }
    }
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let c = &l.step;
        // What `applies` found, sized once more and kept (the vectorized kernel where it
        // finds nothing: `applies` said it would).
        let run = match self.kernel {
            DwKernel::Taps => None,
            DwKernel::Rows => rows_kernel(cx, c).map(DwRun::Rows),
            DwKernel::Tile => tile_of(cx, l).map(DwRun::Tile),
        }
        .unwrap_or(DwRun::Taps);
        let w = match run {
            DwRun::Rows(_) => rows_weights(c)?,
            DwRun::Taps | DwRun::Tile(_) => weights(c, l.float)?,
        };
        Ok(Some(Box::new(DwSetup { w, run })))
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

/// Threads of a `conv_dw_i8_tile` block.
const TILE_THREADS: usize = 256;
/// Channel groups (of four) a tile block takes at most: 64 channels, so that a pixel's slab is
/// two 32-byte sectors of the NHWC input and a warp's 32 threads read two adjacent pixels.
const TILE_GROUPS: usize = 16;
/// The input window's bytes a tile block aims under: a few blocks an SM (228 KiB on Hopper).
const TILE_WINDOW_BYTES: usize = 24 << 10;
/// Shared memory a launch gets without raising the kernel's limit.
const TILE_SMEM_MAX: usize = 48 << 10;

/// How `conv_dw_i8_tile` splits a layer: tiles of `toh` x `tow` outputs and slabs of `cg`
/// channel groups, `blocks` blocks of `smem` bytes of shared memory each.
#[derive(Debug, Clone, Copy)]
struct DwTile {
    toh: usize,
    tow: usize,
    cg: usize,
    blocks: usize,
    smem: usize,
}

/// The tile of a depthwise layer of `n` images, `c` channels (a multiple of 4), `[oh, ow]`
/// outputs, kernel `k`, stride `s`, dilation `d`, on a GPU of `sms` SMs: channels in even
/// slabs of at most TILE_GROUPS groups; the output tile from 32 x 32 down (halving its longer
/// side) until its input window fits TILE_WINDOW_BYTES and the grid has two blocks an SM,
/// or it is 4 x 4 (a small image's halo would then cost more than the idle SMs). `None` where
/// even that window does not fit the shared memory a launch gets (a large dilation).
fn dw_tile(
    n: usize,
    c: usize,
    out: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    sms: usize,
) -> Option<DwTile> {
    let c4 = c / 4;
    let slabs = c4.div_ceil(TILE_GROUPS);
    let cg = c4.div_ceil(slabs);
    let taps_groups = (k[0] * k[1]).div_ceil(4);
    let span = |t: usize, i: usize| (t - 1) * s[i] + (k[i] - 1) * d[i] + 1;
    let window = |t: [usize; 2]| span(t[0], 0) * span(t[1], 1) * cg * 4;
    let blocks = |t: [usize; 2]| n * out[0].div_ceil(t[0]) * out[1].div_ceil(t[1]) * slabs;
    let mut t = [out[0].min(32), out[1].min(32)];
    while (window(t) > TILE_WINDOW_BYTES || blocks(t) < 2 * sms) && t[0] * t[1] > 16 {
        let i = usize::from(t[1] > t[0]);
        t[i] = t[i].div_ceil(2);
    }
    let smem = 16 * taps_groups * (1 + cg) + window(t);
    (smem <= TILE_SMEM_MAX && c4 > 0).then_some(DwTile {
        toh: t[0],
        tow: t[1],
        cg,
        blocks: blocks(t),
        smem,
    })
}

/// The tile `conv_dw_i8_tile` runs layer `l` in, if it takes the layer: an int8 depthwise
/// layer reading int8 that `depthwise_ok` takes, whose window fits (`dw_tile`).
fn tile_of(cx: &Launch, l: &ConvLayer) -> Option<DwTile> {
    let c = &l.step;
    let int8 = c.quant.as_ref().is_some_and(|q| q.is_int8()) && cx.td(c.input).dtype == DType::I8;
    if !(int8 && depthwise_ok(cx, c)) {
        return None;
    }
    let n = cx.td(c.input).shape[0];
    dw_tile(
        n,
        c.cin,
        [l.oh, l.ow],
        c.k,
        c.stride,
        c.dilation,
        cx.dev.sms,
    )
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

/// A depthwise layer's weights in its kernel's layout, and the kernel it runs.
struct DwSetup {
    w: DevBuf,
    run: DwRun,
}

/// The kernel a depthwise setup runs, with what was sized for it at setup: the row kernel's
/// index in DW_ROWS_SHAPES, the tile kernel's split of the layer.
#[derive(Clone, Copy)]
enum DwRun {
    Taps,
    Rows(usize),
    Tile(DwTile),
}

impl DwRun {
    fn imp(self) -> ConvImpl {
        match self {
            DwRun::Taps => ConvImpl::Depthwise,
            DwRun::Rows(kernel) => ConvImpl::DepthwiseRows { kernel },
            DwRun::Tile(_) => ConvImpl::DepthwiseTile,
        }
    }
}

impl ConvSetup for DwSetup {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        vec![self.run.imp()]
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let (h, w) = l.in_hw(cx.plan);
        let n = cx.td(c.input).shape[0];
        // Threads: four channels of DW_PX (4) adjacent outputs along x each, unravelled as
        // [n, oh, ceil(ow / 4), c / 4] (`dw_place`).
        let threads = cx.td(c.out).numel() / l.ow / 4 * l.ow.div_ceil(4);
        let place = FastDiv::of(&[c.cin as i64 / 4, l.ow.div_ceil(4) as i64, l.oh as i64]);
        if *imp != self.run.imp() {
            return Err(CudaError::Internal(format!(
                "a depthwise setup asked for {}",
                imp.key()
            )));
        }
        match self.run {
            DwRun::Taps => launch!(cx.stream, cx.dev.k.conv_dw4, threads;
                way.input, way.in_t.code(), self.w.ptr, way.alpha, l.bias.ptr,
                e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow),
                u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
                u(c.dilation[0]), u(c.dilation[1]), e.act.0, e.act.1, e.act.2,
                c.pad_code as i32, place),
            DwRun::Rows(kernel) => {
                launch!(cx.stream, cx.dev.k.conv_dw_i8[kernel], threads;
                way.input, self.w.ptr, way.alpha, l.bias.ptr,
                e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow),
                u(c.pads[0]), u(c.pads[1]), e.act.0, e.act.1, e.act.2, c.pad_code as i32, place)
            }
            DwRun::Tile(t) => {
                let cfg = LaunchConfig {
                    grid_dim: (t.blocks as u32, 1, 1),
                    block_dim: (TILE_THREADS as u32, 1, 1),
                    shared_mem_bytes: t.smem as u32,
                };
                launch!(cx.stream, cx.dev.k.conv_dw_i8_tile, cfg cfg;
                way.input, self.w.ptr, way.alpha, l.bias.ptr,
                e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
                u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow),
                u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
                u(c.dilation[0]), u(c.dilation[1]), e.act.0, e.act.1, e.act.2,
                c.pad_code as i32, u(t.toh), u(t.tow), u(t.cg))
            }
        }
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EfficientNet-B0's and DeepLab's depthwise shapes on a 132-SM GPU: the window fits,
    /// the grid covers every output and channel, and a small grid shrinks the tile.
    #[test]
    fn tiles_fit_shared_memory_and_cover_the_layer() {
        let shapes = [
            // (n, c, out, k, s, d)
            (32, 32, 112, 3, 1, 1),
            (32, 96, 56, 3, 2, 1),
            (32, 240, 28, 5, 1, 1),
            (32, 672, 14, 5, 1, 1),
            (32, 1152, 7, 3, 1, 1),
            (1, 72, 56, 5, 2, 1),
            (1, 960, 33, 3, 1, 4),
            (1, 24, 14, 7, 1, 1),
        ];
        for (n, c, o, k, s, d) in shapes {
            let t = dw_tile(n, c, [o, o], [k, k], [s, s], [d, d], 132).expect("a tile");
            let span = |t: usize| (t - 1) * s + (k - 1) * d + 1;
            let window = span(t.toh) * span(t.tow) * t.cg * 4;
            let slabs = (c / 4).div_ceil(t.cg);
            assert!(t.cg <= TILE_GROUPS && slabs * t.cg >= c / 4, "{c}: {t:?}");
            assert!(t.smem <= TILE_SMEM_MAX && t.smem >= window, "{t:?}");
            assert!(window <= TILE_WINDOW_BYTES || t.toh * t.tow <= 16, "{t:?}");
            let tiles = o.div_ceil(t.toh) * o.div_ceil(t.tow);
            assert_eq!(t.blocks, n * tiles * slabs, "{t:?}");
            assert!(t.blocks >= 264 || t.toh * t.tow <= 16, "{o}x{o}x{c}: {t:?}");
        }
        // Channels split into even slabs: 72 channels as two of 9 groups, not 16 + 2.
        let t = dw_tile(1, 72, [56, 56], [3, 3], [1, 1], [1, 1], 132).expect("a tile");
        assert_eq!(t.cg, 9);
        // 3x3 stride 1 over 32 channels at 56x56, batch 32: a 32 x 32 tile reads a 34 x 34
        // window of 32-byte slabs (37 KB), so it halves to 16 x 32 (19.6 KB), whose 256 blocks
        // are under two an SM: 16 x 16, 512 blocks.
        let t = dw_tile(32, 32, [56, 56], [3, 3], [1, 1], [1, 1], 132).expect("a tile");
        assert_eq!((t.toh, t.tow, t.blocks), (16, 16, 512));
    }

    /// A dilation whose 4 x 4 tile's window outgrows shared memory takes no tile.
    #[test]
    fn a_window_too_large_takes_no_tile() {
        assert!(dw_tile(1, 256, [65, 65], [3, 3], [1, 1], [36, 36], 132).is_none());
        assert!(dw_tile(1, 256, [65, 65], [3, 3], [1, 1], [2, 2], 132).is_some());
    }
}
