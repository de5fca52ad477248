//! The NVRTC kernels as the engine sees them: their source, compiled once per process, the
//! functions loaded by name, how they launch (`launch!`, programmatic dependent launches),
//! and the tile and limit constants that must match their `#define`s (the tests check).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::OnceLock;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, sys};

use super::log_msg;
use crate::backend::cuda::error::{CudaError, CudaResult, drv};
use crate::backend::cuda::plan::Act;
use crate::backend::cuda::plan::DType;

pub(super) use crate::backend::cuda::kernel_source::KERNELS;
/// Output channels per thread of the int8 pointwise kernel (`PW_CO` in kernels/conv_pw_i8.cu).
pub(super) const PW_CO: usize = 16;
/// Threads (pixels) per block of the int8 pointwise kernel.
pub(super) const PW_THREADS: usize = 128;
/// Shared memory the pointwise kernel may take per block (the default dynamic limit).
pub(super) const PW_MAX_SHARED_BYTES: usize = 48 << 10;
/// The int8 GEMV kernel's most rows and threads a block (a warp per four output channels):
/// `GV_MAX_M`, `GV_THREADS` in kernels/conv_pw_i8.cu.
pub(super) const GV_MAX_M: usize = 4;
pub(super) const GV_THREADS: usize = 64;
/// The int8 tensor-core conv kernel's tile: output pixels and channels a block computes,
/// bytes of the reduction a stage copies, threads a block (`MMA_BM`, `MMA_BN`, `MMA_BK`,
/// `MMA_THREADS` in kernels/conv_i8_mma.cu).
pub(super) const MMA_BM: usize = 128;
pub(super) const MMA_BN: usize = 64;
pub(super) const MMA_BK: usize = 64;
pub(super) const MMA_THREADS: usize = 128;
/// Its cp.async stages and their rows' bytes (`MMA_STAGES`, `MMA_LD` in kernels/conv_i8_mma.cu).
pub(super) const MMA_STAGES: usize = 3;
pub(super) const MMA_LD: usize = MMA_BK + 16;
/// Dynamic shared memory of a `bm`-pixel tensor-core block: the stages, the tile's alphas and
/// biases (f32), and with `residual` its int8 residual tile (the layout at `MMA_BM` in
/// kernels/conv_i8_mma.cu; the kernel reads the residual from global memory where the launch gave it no
/// room). With the residual, a 128-pixel block takes more than the 48 KiB a launch gets
/// without asking: `Device::new` raises the kernels' limit.
pub(super) const fn mma_smem_bytes(bm: usize, residual: bool) -> usize {
    MMA_STAGES * (bm + MMA_BN) * MMA_LD + 2 * MMA_BN * 4 + if residual { bm * MMA_BN } else { 0 }
}
/// The Hopper int8 kernels' tile height, the bytes of the reduction a stage copies and their
/// stages (`WG_BM`, `WG_BK`, `WG_STAGES` in kernels/conv_i8_wgmma.cu; their tiles are MMA_BN
/// or twice that wide, a warpgroup of `MMA_THREADS` for every MMA_BN channels).
pub(super) const WG_BM: usize = 128;
pub(super) const WG_BK: usize = 128;
pub(super) const WG_STAGES: usize = 4;
/// Dynamic shared memory of a `conv_i8_wgmma` block of `bm`-pixel by `bn`-channel tiles:
/// 1 KiB of slack to put its stages on a 1024-byte boundary (the 128-byte swizzle's period),
/// the stages, the alphas and biases and (64-channel tiles) the int8 residual tile. About
/// 106 KiB at 128 x 64, 70 at 64 x 64, 130 at 128 x 128: more than the 48 KiB a launch gets
/// without asking (`Kernels::load` raises the limit).
pub(super) const fn wgmma_smem_bytes(bm: usize, bn: usize) -> usize {
    let residual = if bn == MMA_BN { bm * MMA_BN } else { 0 };
    1024 + WG_STAGES * (bm + bn) * WG_BK + 2 * bn * 4 + residual
}
/// The wgmma kernels' tiles, (pixels, channels): `conv_i8_wgmma`, `conv_i8_wgmma64` and
/// `conv_i8_wgmma_wide` (two warpgroups a block), in the order the builder offers them.
pub(super) const WGMMA_TILES: [(usize, usize); 3] =
    [(WG_BM, MMA_BN), (WG_BM / 2, MMA_BN), (WG_BM, 2 * MMA_BN)];
/// The streaming wgmma kernel's tile height, its largest reduction (bytes a weight row) and
/// its most copy stages (`WGS_BM`, `WGS_MAX_KPAD`, `WGS_MAX_STAGES` in kernels/conv_i8_wgmma.cu).
pub(super) const WGS_BM: usize = 64;
pub(super) const WGS_MAX_KPAD: usize = 1024;
pub(super) const WGS_MAX_STAGES: usize = 6;
/// The most dynamic shared memory a block may have on compute capability 9.0 (227 KiB): the
/// limit `Kernels::load` raises the streaming wgmma kernel's to.
pub(super) const WGS_MAX_SMEM: usize = 227 << 10;
/// Dynamic shared memory of a `conv_i8_wgmma_stream` block of reduction `kpad` and `stages`
/// copy stages of `stage` bytes (`wgs_tile_stage`, or a window box): 1 KiB of slack to put its
/// tiles on 1024-byte boundaries, the weights (WGS_BM rows of WG_BK bytes for every WG_BK of
/// the reduction), the stages, two code tiles (ROWS_CODE_LD bytes a row), the alphas and
/// biases, and an mbarrier (8 bytes) a stage (`WgsSmem` in the kernel).
pub(super) const fn wgs_smem_bytes(kpad: usize, stage: usize, stages: usize) -> usize {
    1024 + wgs_x_tile(kpad)
        + stages * stage
        + 2 * WGS_BM * ROWS_CODE_LD
        + 2 * MMA_BN * 4
        + 8 * stages
}
/// The weights' bytes, and a 1x1 conv's x tile's: WGS_BM rows of WG_BK bytes for every WG_BK
/// of the reduction.
const fn wgs_x_tile(kpad: usize) -> usize {
    kpad.div_ceil(WG_BK) * WGS_BM * WG_BK
}
/// A stage of a 1x1 conv's tiles: its x tile, in the weights' layout, and its residual tile
/// (MMA_BN bytes a row).
pub(super) const fn wgs_tile_stage(kpad: usize) -> usize {
    wgs_x_tile(kpad) + WGS_BM * MMA_BN
}
/// The most blocks an SM the streaming wgmma kernel runs (its launch bounds' occupancy).
pub(super) const WGS_MAX_BLOCKS: usize = 4;
/// The most window boxes a block of a stem keeps in flight.
pub(super) const WGS_MAX_WINDOWS: usize = 16;
/// How the streaming wgmma kernel runs a reduction of `kpad` bytes in stages of `stage` bytes
/// (from `stages`) on an SM of `smem_per_sm` bytes of shared memory: (blocks an SM, copy
/// stages), from the most blocks an SM down, each with the most stages that fit its share of
/// the SM, where that is more stages than the plans before it. More blocks hide more of each
/// other's latency (the kernel's warps wait on their epilogue's dependent instructions:
/// Nsight Compute on an H200 measured 4.3 cycles between a warp's instructions at two blocks
/// an SM); more stages keep more tiles in flight. None for a reduction whose weights and the
/// fewest stages do not fit.
pub(super) fn wgs_plans(
    kpad: usize,
    stage: usize,
    stages: std::ops::RangeInclusive<usize>,
    smem_per_sm: usize,
) -> Vec<(usize, usize)> {
    let mut plans: Vec<(usize, usize)> = vec![];
    for blocks in (1..=WGS_MAX_BLOCKS).rev() {
        // The driver keeps 1 KiB of each block's share.
        let budget = (smem_per_sm / blocks)
            .saturating_sub(1024)
            .min(WGS_MAX_SMEM);
        let fits = stages
            .clone()
            .rev()
            .find(|&s| wgs_smem_bytes(kpad, stage, s) <= budget);
        if let Some(n) = fits
            && plans.iter().all(|&(_, s)| s < n)
        {
            plans.push((blocks, n));
        }
    }
    plans
}
/// The compute capability `conv_i8_wgmma` runs on, exactly: wgmma is an sm_90a feature that
/// later GPUs do not have; on 9.0 the PTX is compiled for `compute_90a` (`ptx_arch`).
pub(crate) const WGMMA_COMPUTE: (i32, i32) = (9, 0);
/// The NVRTC target for a GPU of compute capability (maj, min): `compute_90a` on sm_90, whose
/// architecture-specific features (wgmma) only that target compiles; `compute_XY` elsewhere.
pub(super) fn ptx_arch((maj, min): (i32, i32)) -> String {
    let suffix = if (maj, min) == WGMMA_COMPUTE { "a" } else { "" };
    format!("compute_{maj}{min}{suffix}")
}
/// Blocks an SM the tensor-core kernels' launch bounds ask for: (tile height, blocks), the
/// implicit GEMM kernels' and the streaming 1x1 ones' alike.
pub(super) const MMA_OCCUPANCY: [(usize, usize); 2] = [(MMA_BM, 4), (MMA_BM / 2, 6)];
/// Whether the residual tile keeps that occupancy on an SM of `smem_per_sm` bytes of shared
/// memory (the driver takes 1 KiB a block): on sm_90's 228 KiB it does; on the 100 KiB of
/// sm_86 / sm_89 it would halve the 128-pixel kernel's blocks (2 -> 1 an SM).
pub(super) fn mma_residual_fits(smem_per_sm: usize) -> bool {
    MMA_OCCUPANCY
        .iter()
        .all(|&(bm, blocks)| blocks * (mma_smem_bytes(bm, true) + 1024) <= smem_per_sm)
}
/// Dynamic shared memory of a streaming 1x1 tensor-core block (`conv_i8_mmas` in kernels/conv_i8_mma.cu)
/// of `bm`-pixel tiles and reduction `kpad`: its MMA_BN weight rows and two x tiles, `kpad` and
/// 16 bytes a row, two residual / code tiles of ROWS_CODE_LD bytes a row, the alphas and
/// biases.
pub(super) const fn mmas_smem_bytes(bm: usize, kpad: usize) -> usize {
    (MMA_BN + 2 * bm) * (kpad + 16) + 2 * bm * ROWS_CODE_LD + 2 * MMA_BN * 4
}
/// Reductions (bytes a weight row) the streaming 1x1 kernel takes: 16-byte pieces a row that
/// divide its threads, and whole rows of weights in shared memory.
pub(super) const MMAS_KPADS: [usize; 3] = [64, 128, 256];
/// Dynamic shared memory the streaming 1x1 kernel may take a block: the row-at-a-time
/// kernel's limit (within sm_86's and sm_89's 99 KiB), so that its 128-pixel tiles run up to
/// kpad 128 and its 64-pixel ones up to 256.
pub(super) const MMAS_MAX_SMEM: usize = ROWS_MAX_SMEM;
/// Output pixels a row at most, for the row-at-a-time tensor-core kernel (`ROWS_MAX_OW` in
/// kernels/conv_i8_mma.cu: a warp's 16 channels of a row in its registers).
pub(super) const ROWS_MAX_OW: usize = 128;
/// Dynamic shared memory the row-at-a-time kernel may take a block, the limit `Device::new`
/// raises it to: within the 99 KiB a block may have on sm_86 / sm_89 (sm_80 and sm_90 allow
/// more).
pub(super) const ROWS_MAX_SMEM: usize = 96 << 10;
/// Dynamic shared memory of a row-at-a-time tensor-core block (the layout in kernels/conv_i8_mma.cu):
/// MMA_BN weight rows of `kpad` + 16 bytes, two input windows of kh rows of ow + kw - 1
/// 16-byte pixels (plus 16 of slack), the row in whole 16-pixel tiles (int8 codes of
/// ROWS_CODE_LD bytes a pixel with `codes`, else int32 sums), the alphas and biases.
pub(super) fn rows_smem_bytes(kpad: usize, kh: usize, kw: usize, ow: usize, codes: bool) -> usize {
    let pixel = if codes {
        ROWS_CODE_LD
    } else {
        (MMA_BN + 8) * 4
    };
    MMA_BN * (kpad + 16)
        + 2 * (kh * (ow + kw - 1) + 16) * 16
        + ow.next_multiple_of(16) * pixel
        + 2 * MMA_BN * 4
}
/// Bytes a pixel of the row-at-a-time kernel's staged int8 codes (`ROWS_CODE_LD`).
pub(super) const ROWS_CODE_LD: usize = MMA_BN + 16;
/// kernels/epi_i8.cuh's `epi_i8_ok`: whether the tensor-core kernels' int8 epilogue computes an
/// output of type `out` with a residual of type `residual` (or none) and activation `act`:
/// int8 out, an int8 residual or none, ReLU, clip, SiLU, hard swish or no activation.
pub(super) fn epi_i8_ok(out: DType, residual: Option<DType>, act: Act) -> bool {
    out == DType::I8
        && residual.is_none_or(|r| r == DType::I8)
        && matches!(
            act,
            Act::None | Act::Relu | Act::Clip(..) | Act::Silu | Act::HardSwish
        )
}
/// Whether the row-at-a-time kernel stages int8 codes (its epilogue in registers) for an
/// output of type `out` with activation `act`: `epi_i8_ok` without a residual.
pub(super) fn rows_codes(out: DType, residual: bool, act: Act) -> bool {
    !residual && epi_i8_ok(out, None, act)
}
/// (kernel size, stride) of the row-window int8 depthwise kernels, square both ways
/// (`conv_dw_i8_k{K}s{S}` in kernels/conv_dw.cu): MobileNets' and EfficientNets' 3x3 and 5x5
/// depthwise layers, ConvNeXt's 7x7 ones.
pub(super) const DW_ROWS_SHAPES: [(usize, usize); 5] = [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)];
/// Compute capability from which the tensor-core kernel runs (cp.async, int8 m16n8k32).
pub(crate) const MMA_COMPUTE: (i32, i32) = (8, 0);
/// The functions of the compiled module, one field per kernel.
pub(super) struct Kernels {
    pub(super) epilogue: Kernel,
    pub(super) conv_direct: Kernel,
    pub(super) conv_dw4: Kernel,
    /// `conv_dw_i8_k{K}s{S}` for each of DW_ROWS_SHAPES, in order.
    pub(super) conv_dw_i8: Vec<Kernel>,
    pub(super) conv_dw_i8_tile: Kernel,
    pub(super) im2col: Kernel,
    pub(super) im2col_v16: Kernel,
    pub(super) unary: Kernel,
    pub(super) unary4: Kernel,
    pub(super) view: Kernel,
    pub(super) nary: Kernel,
    pub(super) nary4: Kernel,
    pub(super) nary8: Kernel,
    pub(super) nary16: Kernel,
    pub(super) reduce: Kernel,
    pub(super) reduce_rows: Kernel,
    pub(super) norm_rows: Kernel,
    pub(super) softmax: Kernel,
    pub(super) softmax_rows: Kernel,
    pub(super) matmul: Kernel,
    pub(super) gather: Kernel,
    pub(super) pad_nd: Kernel,
    pub(super) conv_transpose: Kernel,
    pub(super) pool: Kernel,
    pub(super) pool4: Kernel,
    pub(super) gap: Kernel,
    pub(super) concat: Kernel,
    pub(super) resize: Kernel,
    pub(super) space_to_depth: Kernel,
    pub(super) max_pool16: Kernel,
    pub(super) space_to_depth16: Kernel,
    pub(super) conv_pw_i8: Kernel,
    pub(super) conv_pw_i8_word: Kernel,
    pub(super) conv_pw_i8_gemv: Kernel,
    pub(super) conv_i8_mma: Kernel,
    pub(super) conv_i8_mma64: Kernel,
    pub(super) conv_i8_rows: Kernel,
    pub(super) conv_i8_mmas: Kernel,
    pub(super) conv_i8_mmas64: Kernel,
    pub(super) conv_i8_wgmma: Kernel,
    pub(super) conv_i8_wgmma64: Kernel,
    pub(super) conv_i8_wgmma_wide: Kernel,
    pub(super) conv_i8_wgmma_stream: Kernel,
    pub(super) gap_finish: Kernel,
}

impl Kernels {
    /// Loads every kernel from `module` and raises the shared-memory limits of those that
    /// ask for more than the 48 KiB a launch gets by default (compute capability `compute`,
    /// `smem_per_sm` bytes of shared memory an SM). `pdl`: launch them as programmatic
    /// dependent launches.
    pub(super) fn load(
        module: &std::sync::Arc<CudaModule>,
        pdl: bool,
        compute: (i32, i32),
        smem_per_sm: usize,
    ) -> CudaResult<Kernels> {
        let f = |n: &str| drv(module.load_function(n), n).map(|f| Kernel { f, pdl });
        let k = Kernels {
            epilogue: f("epilogue")?,
            conv_direct: f("conv_direct")?,
            conv_dw4: f("conv_dw4")?,
            conv_dw_i8: DW_ROWS_SHAPES
                .iter()
                .map(|(k, s)| f(&format!("conv_dw_i8_k{k}s{s}")))
                .collect::<Result<_, _>>()?,
            conv_dw_i8_tile: f("conv_dw_i8_tile")?,
            im2col: f("im2col")?,
            im2col_v16: f("im2col_v16")?,
            unary: f("unary")?,
            unary4: f("unary4")?,
            view: f("view")?,
            nary: f("nary")?,
            nary4: f("nary4")?,
            nary8: f("nary8")?,
            nary16: f("nary16")?,
            reduce: f("reduce")?,
            reduce_rows: f("reduce_rows")?,
            norm_rows: f("norm_rows")?,
            softmax: f("softmax")?,
            softmax_rows: f("softmax_rows")?,
            matmul: f("matmul")?,
            gather: f("gather")?,
            pad_nd: f("pad_nd")?,
            conv_transpose: f("conv_transpose")?,
            pool: f("pool")?,
            pool4: f("pool4")?,
            gap: f("global_avg_pool")?,
            concat: f("concat_part")?,
            resize: f("resize")?,
            space_to_depth: f("space_to_depth")?,
            max_pool16: f("max_pool16")?,
            space_to_depth16: f("space_to_depth16")?,
            conv_pw_i8: f("conv_pw_i8")?,
            conv_pw_i8_word: f("conv_pw_i8_word")?,
            conv_pw_i8_gemv: f("conv_pw_i8_gemv")?,
            conv_i8_mma: f("conv_i8_mma")?,
            conv_i8_mma64: f("conv_i8_mma64")?,
            conv_i8_rows: f("conv_i8_rows")?,
            conv_i8_mmas: f("conv_i8_mmas")?,
            conv_i8_mmas64: f("conv_i8_mmas64")?,
            conv_i8_wgmma: f("conv_i8_wgmma")?,
            conv_i8_wgmma64: f("conv_i8_wgmma64")?,
            conv_i8_wgmma_wide: f("conv_i8_wgmma_wide")?,
            conv_i8_wgmma_stream: f("conv_i8_wgmma_stream")?,
            gap_finish: f("gap_finish")?,
        };
        let raise = |k: &Kernel, bytes: usize, what: &str| {
            drv(
                k.f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                ),
                what,
            )
        };
        if compute >= MMA_COMPUTE && mma_residual_fits(smem_per_sm) {
            for (f, bm) in [(&k.conv_i8_mma, MMA_BM), (&k.conv_i8_mma64, MMA_BM / 2)] {
                raise(
                    f,
                    mma_smem_bytes(bm, true),
                    "raising the tensor-core kernel's shared memory limit",
                )?;
            }
        }
        if compute >= MMA_COMPUTE {
            raise(
                &k.conv_i8_rows,
                ROWS_MAX_SMEM,
                "raising the row-at-a-time kernel's shared memory limit",
            )?;
            for f in [&k.conv_i8_mmas, &k.conv_i8_mmas64] {
                raise(
                    f,
                    MMAS_MAX_SMEM,
                    "raising the streaming 1x1 kernel's shared memory limit",
                )?;
            }
        }
        if compute == WGMMA_COMPUTE {
            for (bm, bn) in WGMMA_TILES {
                raise(
                    k.wgmma(bm, bn),
                    wgmma_smem_bytes(bm, bn),
                    "raising the Hopper int8 kernel's shared memory limit",
                )?;
            }
            raise(
                &k.conv_i8_wgmma_stream,
                WGS_MAX_SMEM,
                "raising the streaming Hopper 1x1 kernel's shared memory limit",
            )?;
        }
        Ok(k)
    }

    /// The wgmma kernel of `bm` x `bn` tiles (one of WGMMA_TILES).
    pub(super) fn wgmma(&self, bm: usize, bn: usize) -> &Kernel {
        match (bm, bn) {
            (WG_BM, MMA_BN) => &self.conv_i8_wgmma,
            (_, MMA_BN) => &self.conv_i8_wgmma64,
            _ => &self.conv_i8_wgmma_wide,
        }
    }
}

/// Names of the kernels the engine loads (the compile check makes sure each is in the PTX).
#[cfg(test)]
pub(super) const KERNEL_NAMES: [&str; 48] = [
    "epilogue",
    "conv_direct",
    "conv_dw4",
    "conv_dw_i8_k3s1",
    "conv_dw_i8_k3s2",
    "conv_dw_i8_k5s1",
    "conv_dw_i8_k5s2",
    "conv_dw_i8_k7s1",
    "conv_dw_i8_tile",
    "im2col",
    "im2col_v16",
    "unary",
    "unary4",
    "view",
    "nary",
    "nary4",
    "nary8",
    "nary16",
    "reduce",
    "reduce_rows",
    "norm_rows",
    "softmax",
    "softmax_rows",
    "matmul",
    "gather",
    "pad_nd",
    "conv_transpose",
    "pool",
    "pool4",
    "global_avg_pool",
    "concat_part",
    "resize",
    "space_to_depth",
    "max_pool16",
    "space_to_depth16",
    "conv_pw_i8",
    "conv_pw_i8_word",
    "conv_pw_i8_gemv",
    "conv_i8_mma",
    "conv_i8_mma64",
    "conv_i8_rows",
    "conv_i8_mmas",
    "conv_i8_mmas64",
    "conv_i8_wgmma",
    "conv_i8_wgmma64",
    "conv_i8_wgmma_wide",
    "conv_i8_wgmma_stream",
    "gap_finish",
];

/// Compiles the kernels (`kernel_source`) for `arch` (`compute_XY`) with NVRTC: (PTX,
/// compiler log). The log is empty on a clean compile; warnings show up in it, each naming
/// its file of `kernels/` and line.
pub(super) fn compile_kernels(arch: &str) -> CudaResult<(String, String)> {
    use cudarc::nvrtc::result as nv;
    let nv_err = |stage: &'static str, e: nv::NvrtcError, log: &str| CudaError::Nvrtc {
        stage,
        status: format!("{e:?}"),
        log: log.trim().to_string(),
    };
    // cuda_fp16.h is not built into NVRTC 13: it comes from the toolkit's include folder or
    // the `nvidia-cuda-runtime` wheel's (`libs::include_dirs`).
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
    ];
    options.extend(
        crate::backend::cuda::libs::include_dirs()
            .into_iter()
            .map(|p| format!("--include-path={}", p.display())),
    );
    let src = std::ffi::CString::new(KERNELS).map_err(|e| CudaError::Nvrtc {
        stage: "kernels/",
        status: e.to_string(),
        log: String::new(),
    })?;
    let name = c"kernels";
    let prog = nv::create_program(&src, Some(name)).map_err(|e| nv_err("create", e, ""))?;
    let as_string = |v: Vec<std::ffi::c_char>| {
        let bytes: Vec<u8> = v
            .into_iter()
            .map(|c| c as u8)
            .take_while(|&c| c != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    // Safety: `prog` was created above and is destroyed once, at the end.
    let compiled = unsafe { nv::compile_program(prog, &options) };
    let log = unsafe { nv::get_program_log(prog) }
        .map(as_string)
        .unwrap_or_default();
    let out = match compiled {
        Err(e) => Err(nv_err("compile", e, &log)),
        Ok(()) => unsafe { nv::get_ptx(prog) }
            .map(|p| (as_string(p), log))
            .map_err(|e| nv_err("get PTX", e, "")),
    };
    let _ = unsafe { nv::destroy_program(prog) };
    out
}

/// PTX of the kernels, compiled once per process (per compute capability).
pub(super) fn ptx(arch: &str) -> CudaResult<String> {
    static PTX: OnceLock<CudaResult<String>> = OnceLock::new();
    PTX.get_or_init(|| {
        let (ptx, log) = compile_kernels(arch)?;
        if !log.trim().is_empty() {
            log_msg(&format!("NVRTC: {}", log.trim()));
        }
        Ok(ptx)
    })
    .clone()
}

/// A launch of a thread per element, 256 a block.
pub(super) fn elems_cfg(n: usize) -> LaunchConfig {
    let threads = 256u32;
    let blocks = n.div_ceil(threads as usize).max(1) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A block per row (grid-stride past 2^20 rows), whole warps, at most 256 threads: the row
/// kernels (`reduce_rows`, `norm_rows`, `softmax_rows`) reduce each row across the block.
pub(super) fn rows_cfg(rows: usize, len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (round_up(len.clamp(1, 256), 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `v` rounded up to a multiple of `m`.
pub(super) fn round_up(v: usize, m: usize) -> usize {
    v.div_ceil(m) * m
}

/// Launches kernel `$f` (a `Kernel`) on `$stream` with the arguments listed, which must
/// mirror the kernel's parameters in `kernels/`: `cfg CONFIG;` gives the launch
/// configuration, a count `N;` launches a thread per element.
macro_rules! launch {
    ($stream:expr, $f:expr, cfg $cfg:expr; $($a:expr),* $(,)?) => {
        $crate::backend::cuda::engine::kernels::launch!($stream, $f, cfg $cfg, cluster 1; $($a),*)
    };
    // Blocks in clusters of `cluster` along the grid's z (1: no clusters).
    ($stream:expr, $f:expr, cfg $cfg:expr, cluster $cl:expr; $($a:expr),* $(,)?) => {{
        let cfg: cudarc::driver::LaunchConfig = $cfg;
        let args = ($($a,)*);
        let mut ptrs: Vec<*mut std::ffi::c_void> = Vec::with_capacity(36);
        $crate::backend::cuda::engine::kernels::push_args!(ptrs, args; (0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35); $($a),*);
        $f.launch(&$stream, cfg, $cl, &mut ptrs)
    }};
    // One thread per element.
    ($stream:expr, $f:expr, $n:expr; $($a:expr),* $(,)?) => {
        $crate::backend::cuda::engine::kernels::launch!($stream, $f, cfg $crate::backend::cuda::engine::kernels::elems_cfg($n); $($a),*)
    };
}

macro_rules! push_args {
    ($p:ident, $args:ident; ($($idx:tt)*); ) => {};
    ($p:ident, $args:ident; ($i0:tt $($idx:tt)*); $a0:expr $(, $a:expr)*) => {
        $p.push($crate::backend::cuda::engine::kernels::arg_ptr(&$args.$i0));
        $crate::backend::cuda::engine::kernels::push_args!($p, $args; ($($idx)*); $($a),*);
    };
}

pub(super) use {launch, push_args};

/// A kernel argument as `cuLaunchKernelEx` takes it: a pointer to the value, which must stay
/// alive until the launch returns (the `launch!` macro's tuple).
pub(super) fn arg_ptr<T: DeviceRepr>(a: &T) -> *mut c_void {
    a as *const T as *mut c_void
}

/// A kernel of `kernels/`, and whether it is launched as a programmatic dependent launch:
/// on sm_90 and later (unless QUANTSCOPE_CUDA_PDL=off) every one is, so that its blocks are
/// scheduled, and run what precedes their `pdl_wait` (index arithmetic, weight copies), while
/// the kernel before it in the stream finishes. In ResNet-50's INT8 graph at batch 32 most
/// layers take 5 to 35 us, and each launch's start-up and the previous kernel's last wave were
/// time with idle SMs. The kernels themselves wait (`griddepcontrol.wait`) before they read an
/// activation or write anything, so the attribute is safe only for kernels of this file.
pub(super) struct Kernel {
    f: CudaFunction,
    pdl: bool,
}

impl Kernel {
    /// Launches on `stream` with `args` from `arg_ptr`, in clusters of `cluster_z` blocks
    /// along the grid's z (compute capability 9.0 and up) where that is more than 1.
    pub(super) fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        cluster_z: u32,
        args: &mut [*mut c_void],
    ) -> CudaResult<()> {
        // The driver call takes the calling thread's context, as cudarc's launches bind it.
        drv(
            stream.context().bind_to_thread(),
            "binding the CUDA context",
        )?;
        // SAFETY: a zeroed attribute is a valid value of the plain-data union; only the id
        // and the one field read for that id are set.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        if self.pdl {
            attrs[n].id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if cluster_z > 1 {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = 1;
            attrs[n].value.clusterDim.y = 1;
            attrs[n].value.clusterDim.z = cluster_z;
            n += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        // SAFETY: `args` points at live values of the kernel's parameter types, in order (the
        // launch! call sites mirror the kernels' signatures, as cudarc's builder did).
        let r = unsafe {
            sys::cuLaunchKernelEx(&config, self.f.cu_function(), args.as_mut_ptr(), null_mut())
        };
        drv(r.result(), "kernel launch")
    }
}
