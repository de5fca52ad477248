//! Int8 convs on the tensor cores (mma.sync m16n8k32, cp.async; compute capability 8.0+), the
//! epilogue (bias, residual, activation, requantization) in registers: `conv_i8_mma` /
//! `conv_i8_mma64` (implicit GEMM in 128- or 64-pixel tiles), `conv_i8_mmas*` (1x1 with the
//! block's weights resident, pixel tiles streamed) and `conv_i8_rows` (a regrouped stem, a
//! row of output pixels a block); on compute capability 9.0 also `conv_i8_wgmma`, the implicit
//! GEMM on Hopper's warpgroup instructions, whose reduction a layer of few tiles splits over a
//! cluster of blocks, and `conv_i8_wgmma_stream`, the streaming 1x1 kernel on them.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::super::args::{FastDiv, Swizzle, TensorMap};
use super::super::device::{DevBuf, Launch};
use super::super::kernels::{
    Kernel, MMA_BK, MMA_BM, MMA_BN, MMA_COMPUTE, MMA_OCCUPANCY, MMA_THREADS, MMAS_KPADS,
    MMAS_MAX_SMEM, ROWS_MAX_OW, ROWS_MAX_SMEM, WG_BK, WGMMA_COMPUTE, WGMMA_TILES, WGS_BM,
    WGS_MAX_KPAD, WGS_MAX_STAGES, WGS_MAX_WINDOWS, epi_i8_ok, launch, mma_smem_bytes,
    mmas_smem_bytes, round_up, rows_codes, rows_smem_bytes, wgmma_smem_bytes, wgs_plans,
    wgs_smem_bytes, wgs_tile_stage,
};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, Epi, padded_rows};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::{ConvStep, DType};

pub(super) struct Mma;

pub(super) const MMA: Mma = Mma;

impl ConvFamily for Mma {
    fn name(&self) -> &'static str {
        "int8 tensor-core kernel"
    }
    fn optional(&self) -> bool {
        false
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["mma", "mmas", "mmar", "wgmma", "wgmmaw", "wgs"]
    }
    /// The implicit GEMMs (`conv_i8_mma*`, `conv_i8_wgmma*`) pool in their epilogue.
    fn fuses_pool(&self) -> bool {
        true
    }
    /// An int8 conv of one group reading int8 (NHWC, or rows for a 1x1 one), a tap's input
    /// channels in whole 16-byte copies, output rows of 4-byte groups, 32-bit row indices
    /// and input offsets and row tiles within the grid's y limit, on a GPU of compute
    /// capability 8.0 or more.
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        let (c, m) = (&l.step, l.m);
        let xd = cx.td(c.input);
        c.quant.as_ref().is_some_and(|q| q.is_int8())
            && cx.dev.compute >= MMA_COMPUTE
            && xd.dtype == DType::I8
            && c.groups == 1
            && (xd.shape.len() == 4 || c.is_pointwise())
            && c.cin.is_multiple_of(16)
            && c.cout.is_multiple_of(4)
            && m < i32::MAX as usize
            && xd.numel() < i32::MAX as usize
            && row_tiles(c, m, MMA_BM) <= u16::MAX as usize
    }
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let c = &l.step;
        let pooled = c.pool_hw.is_some();
        let mut imps = vec![ConvImpl::Mma { bm: MMA_BM }];
        // Half-height tiles while their row tiles fit the grid's y limit too.
        if row_tiles(c, l.m, MMA_BM / 2) <= u16::MAX as usize {
            imps.push(ConvImpl::Mma { bm: MMA_BM / 2 });
        }
        if !pooled && rows_ok(cx, c) {
            imps.push(ConvImpl::MmaRows);
        }
        // Hopper's warpgroup kernels: row tiles within the grid's y limit (as above), 128-
        // channel tiles where they are whole (the weights are padded to 64 rows); then, for
        // a layer of few tiles, the same tiles with the reduction split over a cluster.
        if cx.dev.compute == WGMMA_COMPUTE {
            let tiles: Vec<(usize, usize)> = WGMMA_TILES
                .into_iter()
                .filter(|&(bm, bn)| {
                    row_tiles(c, l.m, bm) <= u16::MAX as usize
                        && (bn == MMA_BN || c.cout.is_multiple_of(bn))
                })
                .collect();
            let split = |&(bm, bn): &(usize, usize)| {
                let splits = if pooled {
                    1
                } else {
                    wgmma_splits(cx, c, l.m, bm, bn)
                };
                (splits > 1).then_some(ConvImpl::Wgmma { bm, bn, splits })
            };
            imps.extend(
                tiles
                    .iter()
                    .map(|&(bm, bn)| ConvImpl::Wgmma { bm, bn, splits: 1 }),
            );
            imps.extend(tiles.iter().filter_map(split));
        }
        imps.extend(
            [MMA_BM, MMA_BM / 2]
                .into_iter()
                .filter(|&bm| !pooled && stream_ok(cx, c, l.m, bm))
                .map(|bm| ConvImpl::MmaStream { bm }),
        );
        // Hopper's streaming kernel, in each way its reduction fits shared memory where every
        // block streams two tiles or more: a block of one tile pays its weights' copy for
        // nothing, and on an H200 such layers (ResNet-50's at batch 1) timed faster alone
        // than they ran in the engine (0.217 ms against 0.204 without the kernel).
        let kpad = round_up(c.reduction(), MMA_BK);
        if cx.dev.compute == WGMMA_COMPUTE
            && !pooled
            && kpad <= WGS_MAX_KPAD
            && let Some(read) = wgs_read(cx, l)
        {
            imps.extend(
                wgs_plans(kpad, read.stage, read.stages.clone(), cx.dev.smem_per_sm)
                    .into_iter()
                    .filter(|&(blocks, _)| read.tiles >= 2 * wgs_rows(cx, l, &read, blocks))
                    .map(|(blocks, stages)| ConvImpl::WgmmaStream { blocks, stages }),
            );
        }
        Ok(Some(Box::new(MmaSetup {
            w: weights(c)?,
            imps,
            gap: c.pool_hw.map(|hw| GapBufs::new(l, hw)).transpose()?,
        })))
    }
}

/// Row tiles of `bm` pixels of conv `c` of `m` output pixels: with a fused pool, each
/// image's own (`gap_tile_rows` in kernels/conv_i8_mma.cu), else `bm` pixels from the first.
fn row_tiles(c: &ConvStep, m: usize, bm: usize) -> usize {
    match c.pool_hw {
        Some([oh, ow]) => m / (oh * ow) * (oh * ow).div_ceil(bm),
        None => m.div_ceil(bm),
    }
}

/// The most blocks a cluster has (the portable limit, which needs no opt-in).
const MAX_SPLITS: usize = 8;

/// Blocks a tile that a wgmma kernel of `bm` x `bn` tiles splits conv `c`'s reduction over
/// (1: no split): where its tiles are fewer than the SMs hold at once, the power of two up to
/// MAX_SPLITS that brings the blocks closest to that without passing it, each block keeping
/// at least two reduction tiles (WG_BK bytes each) to pipeline. ResNet-50's layer4 3x3 conv
/// at batch 1 (49 pixels, 512 channels, a reduction of 36 tiles) is 8 tiles of 64 x 64 on an
/// H200's 132 SMs: 8 blocks, each a 36-tile reduction; split 8 ways, 64 blocks of 4 or 5.
pub(super) fn wgmma_splits(cx: &Launch, c: &ConvStep, m: usize, bm: usize, bn: usize) -> usize {
    split_count(
        c.cout.div_ceil(bn) * row_tiles(c, m, bm),
        round_up(c.reduction(), MMA_BK).div_ceil(WG_BK),
        cx.dev.sms * cx.dev.resident_blocks(wgmma_smem_bytes(bm, bn)),
    )
}

/// `wgmma_splits` for `tiles` tiles of `ktiles` reduction tiles each, on a GPU that holds
/// `at_once` of the kernel's blocks at a time.
fn split_count(tiles: usize, ktiles: usize, at_once: usize) -> usize {
    let room = at_once / tiles.max(1);
    let mut splits = 1;
    while splits * 2 <= MAX_SPLITS.min(room) && splits * 2 * 2 <= ktiles {
        splits *= 2;
    }
    splits
}

/// Whether the row-at-a-time tensor-core kernel runs int8 conv `c` (on top of `applies`):
/// stride 1, no dilation, 16 input channels, an even kernel width, rows of at most
/// ROWS_MAX_OW pixels, and its shared memory within ROWS_MAX_SMEM.
fn rows_ok(cx: &Launch, c: &ConvStep) -> bool {
    let od = cx.td(c.out);
    od.shape.len() == 4
        && c.stride == [1, 1]
        && c.dilation == [1, 1]
        && c.cin == 16
        && c.k[1].is_multiple_of(2)
        && od.shape[3] <= ROWS_MAX_OW
        && rows_smem_bytes(
            round_up(c.reduction(), MMA_BK),
            c.k[0],
            c.k[1],
            od.shape[3],
            rows_codes(od.dtype, c.residual.is_some(), c.act),
        ) <= ROWS_MAX_SMEM
}

/// The grid's rows of pixel tiles for `conv_i8_wgmma_stream` on layer `l`, read as `read`,
/// at `blocks` blocks an SM (`wgs_plans` fits them in shared memory): the blocks that run at
/// once, shared among the layer's tiles of output channels, at most one a tile and the
/// grid's y limit.
fn wgs_rows(cx: &Launch, l: &ConvLayer, read: &WgsRead, blocks: usize) -> usize {
    (blocks * cx.dev.sms / l.step.cout.div_ceil(MMA_BN))
        .clamp(1, read.tiles)
        .min(u16::MAX as usize)
}

/// `WgsGeom` of kernels/conv_i8_wgmma.cu, field for field: `kh` 0 for a 1x1 conv's rows; for
/// a stem's windows, a window row's bytes (128 or 64), the filter rows, the padded input's
/// positions (`vw` x `vh` an image) and the output's pixels (`ow` x `oh`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct WgsGeom {
    cb: i32,
    kh: i32,
    vw: i32,
    vh: i32,
    ow: i32,
    oh: i32,
}
unsafe impl DeviceRepr for WgsGeom {}

/// How `conv_i8_wgmma_stream` reads a layer's input: its geometry, its tiles, the x map's rows
/// (`[bytes, stride]`, how many; `rows` for the kernel) and its copy stages (bytes each, how
/// many a block may keep).
struct WgsRead {
    geom: WgsGeom,
    tiles: usize,
    map: [usize; 2],
    map_rows: usize,
    rows: usize,
    stage: usize,
    stages: std::ops::RangeInclusive<usize>,
}

/// How `conv_i8_wgmma_stream` reads layer `l` (on top of `applies`), where it can:
/// - a 1x1 conv or Gemm / MatMul rows (`stream_fits`): tiles of WGS_BM rows of cin bytes, each
///   in boxes of WG_BK bytes, a stage with its residual tile; two stages or more, so that a
///   tile's copy overlaps the work on the one before;
/// - a regrouped stem (`space_to_depth_stem`: stride 1, no dilation or padding, two filter
///   rows or more of kw x cin = 64 or 128 bytes, no residual; the stems the kernel's windows
///   were written for and the GPU tests run): the windows of its padded input, a map row
///   for every input position; tiles of WGS_BM output pixels of a row (the last of a row
///   partial), a box a stage, from as many stages as its filter rows and two more (a tile
///   that waits on its window while the next two tiles' rows are copied) to WGS_MAX_WINDOWS.
///   The windows of the last kw - 1 positions would run past the input; they are outputs of
///   no pixel.
fn wgs_read(cx: &Launch, l: &ConvLayer) -> Option<WgsRead> {
    let c = &l.step;
    let kpad = round_up(c.reduction(), MMA_BK);
    if stream_fits(cx, c, l.m, WGS_BM) {
        return Some(WgsRead {
            geom: WgsGeom {
                cb: WG_BK as i32,
                kh: 0,
                vw: 1,
                vh: 1,
                ow: 1,
                oh: 1,
            },
            tiles: l.m.div_ceil(WGS_BM),
            map: [c.cin, c.cin],
            map_rows: l.m,
            rows: l.m,
            stage: wgs_tile_stage(kpad),
            stages: 2..=WGS_MAX_STAGES,
        });
    }
    let xd = cx.td(c.input);
    let (vh, vw) = l.in_hw(cx.plan);
    let window = c.k[1] * c.cin;
    let rows = xd.shape.first()? * vh * vw;
    let fits = xd.shape.len() == 4
        && c.stride == [1, 1]
        && c.dilation == [1, 1]
        && c.pads == [0; 4]
        && c.k[0] >= 2
        && (window == 64 || window == WG_BK)
        && c.residual.is_none()
        && c.cout.is_multiple_of(16)
        && (rows + WGS_BM) * window.max(c.cout) < i32::MAX as usize
        && epi_i8_ok(cx.td(c.out).dtype, None, c.act);
    let u = |v: usize| v as i32;
    fits.then(|| WgsRead {
        geom: WgsGeom {
            cb: u(window),
            kh: u(c.k[0]),
            vw: u(vw),
            vh: u(vh),
            ow: u(l.ow),
            oh: u(l.oh),
        },
        tiles: rows / (vh * vw) * l.ow.div_ceil(WGS_BM) * l.oh,
        map: [window, c.cin],
        map_rows: rows - (c.k[1] - 1),
        rows,
        stage: WGS_BM * window,
        stages: c.k[0] + 2..=WGS_MAX_WINDOWS,
    })
}

/// Whether the streaming 1x1 tensor-core kernel runs int8 conv `c` of `m` output pixels in
/// `bm`-pixel tiles (on top of `applies`): a reduction of MMAS_KPADS, its shared memory
/// within MMAS_MAX_SMEM, and what both streaming kernels need (`stream_fits`).
fn stream_ok(cx: &Launch, c: &ConvStep, m: usize, bm: usize) -> bool {
    let kpad = round_up(c.reduction(), MMA_BK);
    MMAS_KPADS.contains(&kpad)
        && mmas_smem_bytes(bm, kpad) <= MMAS_MAX_SMEM
        && stream_fits(cx, c, m, bm)
}

/// What both streaming 1x1 kernels (`conv_i8_mmas*`, `conv_i8_wgmma_stream`) need of conv
/// `c` of `m` output pixels in `bm`-pixel tiles: pointwise (Gemm / MatMul rows are), output
/// channels in whole 16-byte pieces, input and output offsets below 2^31 up to the last
/// tile's end (32-bit offsets), and an epilogue the int8 one in registers computes: int8
/// output, int8 residual or none, an activation of `epi_i8_ok`. (Tensors start buffers,
/// 256-byte aligned.)
fn stream_fits(cx: &Launch, c: &ConvStep, m: usize, bm: usize) -> bool {
    c.is_pointwise()
        && (m + bm) * c.cin.max(c.cout) < i32::MAX as usize
        && c.cout.is_multiple_of(16)
        && epi_i8_ok(
            cx.td(c.out).dtype,
            c.residual.map(|r| cx.td(r).dtype),
            c.act,
        )
}

/// The tensor-core kernels' weights: int8 OHWI rows, `[cout rounded up to MMA_BN]` by
/// `[KH * KW * Cin rounded up to MMA_BK]`, zero in the padding (whole tiles: no bounds
/// checks on the weight side).
fn weights(c: &ConvStep) -> CudaResult<DevBuf> {
    let q = c
        .quant
        .as_ref()
        .ok_or_else(|| CudaError::Internal("tensor-core kernel: not an int8 layer".into()))?;
    let k = c.reduction();
    let w = padded_rows(
        &q.w,
        c.cout,
        k,
        round_up(c.cout, MMA_BN),
        round_up(k, MMA_BK),
    );
    DevBuf::from_slice(&w)
}

struct MmaSetup {
    w: DevBuf,
    imps: Vec<ConvImpl>,
    /// Where a conv with a fused global average pool keeps its partial sums.
    gap: Option<GapBufs>,
}

/// `GapFuse` of kernels/conv_i8_mma.cu, field for field: where a fused pool's tiles of an
/// image split into several keep their sums (tile `t`'s at `part[t * cout + c]`), the
/// finished tiles of each such image and column of tiles (`count[column * n + image]`, zero
/// between launches: the image's last tile resets it), and the pixels an image.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GapFuse {
    part: u64,
    count: u64,
    hw: i32,
}
unsafe impl DeviceRepr for GapFuse {}

/// The fused pool's buffers, sized for the smallest tiles of any candidate (`MMA_BM / 2`
/// pixels, `MMA_BN` channels).
struct GapBufs {
    part: DevBuf,
    count: DevBuf,
    hw: usize,
}

impl GapBufs {
    fn new(l: &ConvLayer, [oh, ow]: [usize; 2]) -> CudaResult<GapBufs> {
        let (hw, cout) = (oh * ow, l.step.cout);
        let n = l.m / hw;
        Ok(GapBufs {
            part: DevBuf::new(n * hw.div_ceil(MMA_BM / 2) * cout * 4)?,
            count: DevBuf::new(cout.div_ceil(MMA_BN) * n * 4)?,
            hw,
        })
    }

    /// What the kernels take; a null `part` where no pool is fused.
    fn args(gap: Option<&GapBufs>) -> GapFuse {
        gap.map_or(
            GapFuse {
                part: 0,
                count: 0,
                hw: 1,
            },
            |g| GapFuse {
                part: g.part.ptr,
                count: g.count.ptr,
                hw: g.hw as i32,
            },
        )
    }
}

impl ConvSetup for MmaSetup {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        self.imps.clone()
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        // The implicit GEMM kernels: the mma.sync one in tiles of `bm` pixels by MMA_BN
        // channels, or Hopper's wgmma ones in `bm` x `bn` tiles; the same parameters and weights.
        let k = &cx.dev.k;
        let mma_smem = |bm| mma_smem_bytes(bm, cx.dev.mma_residual);
        match *imp {
            ConvImpl::Mma { bm } => {
                let f = if bm == MMA_BM {
                    &k.conv_i8_mma
                } else {
                    &k.conv_i8_mma64
                };
                self.implicit_gemm(cx, l, f, (bm, MMA_BN, 1), mma_smem(bm), way)
            }
            ConvImpl::Wgmma { bm, bn, splits } => {
                let f = k.wgmma(bm, bn);
                let smem = wgmma_smem_bytes(bm, bn);
                self.implicit_gemm(cx, l, f, (bm, bn, splits), smem, way)
            }
            ConvImpl::MmaStream { bm } => self.streaming(cx, l, bm, way),
            ConvImpl::WgmmaStream { blocks, stages } => {
                self.wgmma_streaming(cx, l, (blocks, stages), way)
            }
            ConvImpl::MmaRows => self.rows(cx, l, way),
            _ => Err(CudaError::Internal(format!(
                "a tensor-core setup asked for {}",
                imp.key()
            ))),
        }
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }
}

impl MmaSetup {
    /// Launches implicit GEMM kernel `f` in tiles of (pixels, channels) `bm` x `bn`, each
    /// tile's reduction split over a cluster of `splits` blocks (1: none; the wgmma kernels
    /// alone), with `smem` bytes of dynamic shared memory.
    fn implicit_gemm(
        &self,
        cx: &Launch,
        l: &ConvLayer,
        f: &Kernel,
        (bm, bn, splits): (usize, usize, usize),
        smem: usize,
        way: &ConvWay,
    ) -> CudaResult<()> {
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let (h, w) = l.in_hw(cx.plan);
        // Rows of a Gemm / MatMul are 1x1 images.
        let (oh, ow) = if cx.td(c.input).shape.len() == 4 {
            (l.oh, l.ow)
        } else {
            (1, 1)
        };
        // x: tiles of output channels (the blocks sharing a tile of pixels run together);
        // y: tiles of pixels (with a fused pool, of one image each); z: the blocks of a split
        // reduction, a cluster. The wgmma kernels take a warpgroup of MMA_THREADS for every
        // MMA_BN channels of a tile.
        let cfg = LaunchConfig {
            grid_dim: (
                c.cout.div_ceil(bn) as u32,
                row_tiles(c, l.m, bm) as u32,
                splits as u32,
            ),
            block_dim: ((MMA_THREADS * bn / MMA_BN) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // Row -> (image, output row): divisions by oh * ow and ow.
        let div = FastDiv::of(&[(oh * ow) as i64, ow as i64]);
        launch!(cx.stream, f, cfg cfg, cluster splits as u32; way.input, self.w.ptr, way.alpha, l.bias.ptr,
            e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
            u(l.m), u(c.cin), u(round_up(c.reduction(), MMA_BK)), u(c.cout), e.act.0, e.act.1, e.act.2,
            u(h), u(w), u(oh), u(ow), u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]),
            u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]),
            div.magic[0], div.shift[0], div.magic[1], div.shift[1],
            GapBufs::args(self.gap.as_ref()))
    }

    fn streaming(&self, cx: &Launch, l: &ConvLayer, bm: usize, way: &ConvWay) -> CudaResult<()> {
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let kpad = round_up(c.reduction(), MMA_BK);
        let smem = mmas_smem_bytes(bm, kpad);
        let k = &cx.dev.k;
        let f = if bm == MMA_BM {
            &k.conv_i8_mmas
        } else {
            &k.conv_i8_mmas64
        };
        // As many blocks as run at once (shared memory, and the launch bounds' blocks an SM,
        // which the registers allow), each stepping over pixel tiles: x tiles of output
        // channels (the blocks sharing a tile of pixels run together).
        let bound = MMA_OCCUPANCY
            .iter()
            .find(|&&(h, _)| h == bm)
            .map_or(1, |&(_, b)| b);
        let per_sm = cx.dev.resident_blocks(smem).min(bound);
        let col_tiles = c.cout.div_ceil(MMA_BN);
        let blocks = (per_sm * cx.dev.sms / col_tiles).clamp(1, l.m.div_ceil(bm));
        let cfg = LaunchConfig {
            grid_dim: (col_tiles as u32, blocks.min(u16::MAX as usize) as u32, 1),
            block_dim: (MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        launch!(cx.stream, f, cfg cfg; way.input, self.w.ptr, way.alpha, l.bias.ptr,
            e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2, u(c.cout),
            e.act.0, e.act.1, e.act.2, u(l.m), u(c.cin), u(kpad))
    }

    /// `conv_i8_wgmma_stream` with `stages` copy stages, `blocks` blocks an SM (one of
    /// `wgs_plans`): as many blocks as run at once, each stepping over pixel tiles; x tiles of
    /// output channels (the blocks sharing a tile of pixels run together). Its input and
    /// residual go in as tensor maps (the tensor memory accelerator's copies), encoded for
    /// this launch's buffers.
    fn wgmma_streaming(
        &self,
        cx: &Launch,
        l: &ConvLayer,
        (blocks, stages): (usize, usize),
        way: &ConvWay,
    ) -> CudaResult<()> {
        let c = &l.step;
        let read = wgs_read(cx, l).ok_or_else(|| {
            CudaError::Internal(format!(
                "{}: the streaming wgmma kernel cannot read it",
                c.name
            ))
        })?;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let kpad = round_up(c.reduction(), MMA_BK);
        let smem = wgs_smem_bytes(kpad, read.stage, stages);
        let cfg = LaunchConfig {
            grid_dim: (
                c.cout.div_ceil(MMA_BN) as u32,
                wgs_rows(cx, l, &read, blocks) as u32,
                1,
            ),
            block_dim: (MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // x: boxes of a row's cb bytes by WGS_BM rows, that swizzle (the wgmma operand
        // layout); the residual: rows of cout bytes, boxes of MMA_BN by WGS_BM, 64-byte
        // swizzle. Both zero-filled past their rows and columns.
        let cb = read.geom.cb as usize;
        let swizzle = if cb == WG_BK {
            Swizzle::B128
        } else {
            Swizzle::B64
        };
        let xmap = TensorMap::rows(way.input, read.map, read.map_rows, [cb, WGS_BM], swizzle)?;
        let rmap = match e.res {
            (ptr, 2, _) => TensorMap::rows(ptr, [c.cout; 2], l.m, [MMA_BN, WGS_BM], Swizzle::B64)?,
            _ => TensorMap::default(),
        };
        launch!(cx.stream, cx.dev.k.conv_i8_wgmma_stream, cfg cfg; xmap, rmap, self.w.ptr,
            way.alpha, l.bias.ptr, e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2,
            u(c.cout), e.act.0, e.act.1, e.act.2, u(read.rows), u(kpad), u(stages), read.geom)
    }

    fn rows(&self, cx: &Launch, l: &ConvLayer, way: &ConvWay) -> CudaResult<()> {
        let c = &l.step;
        let e = Epi::of(cx, c);
        let u = |v: usize| v as i32;
        let (h, w) = l.in_hw(cx.plan);
        let kpad = round_up(c.reduction(), MMA_BK);
        let codes = rows_codes(cx.td(c.out).dtype, c.residual.is_some(), c.act);
        let smem = rows_smem_bytes(kpad, c.k[0], c.k[1], l.ow, codes);
        // Blocks step over the output rows: as many as fit the SMs at once, so that each
        // reads its weights once.
        let rows = cx.td(c.input).shape[0] * l.oh;
        let per_sm = cx.dev.resident_blocks(smem);
        let cfg = LaunchConfig {
            grid_dim: (
                c.cout.div_ceil(MMA_BN) as u32,
                rows.min(per_sm * cx.dev.sms).min(u16::MAX as usize) as u32,
                1,
            ),
            block_dim: (MMA_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        launch!(cx.stream, cx.dev.k.conv_i8_rows, cfg cfg; way.input, self.w.ptr, way.alpha, l.bias.ptr,
            e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2, u(c.cout),
            e.act.0, e.act.1, e.act.2, u(rows), u(h), u(w), u(l.oh), u(l.ow), u(c.k[0]), u(c.k[1]),
            u(c.pads[0]), u(c.pads[1]), u(kpad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ResNet-50's layers on an H200 (132 SMs; three 64 x 64 blocks an SM, two 128 x 64
    /// ones): layer4's 3x3 conv at batch 1 (8 tiles of 36 reduction tiles) splits 8 ways,
    /// layer3's 1x1 reduction (16 tiles of 8) 4 ways, so that each block keeps two; layer4's
    /// 3x3 at batch 32 in 128 x 64 tiles (104 tiles, 264 blocks at once) 2 ways; a layer
    /// that fills the GPU (200 tiles of 64 x 64) or has a reduction of three tiles not at all.
    #[test]
    fn few_tiles_split_their_reduction_up_to_a_cluster() {
        assert_eq!(split_count(8, 36, 396), 8);
        assert_eq!(split_count(16, 8, 396), 4);
        assert_eq!(split_count(104, 36, 264), 2);
        assert_eq!(split_count(200, 36, 396), 1);
        assert_eq!(split_count(8, 3, 396), 1);
    }
}
