//! Device side of the CUDA backend: allocates the plan's buffers and weights, picks each
//! convolution's implementation by timing the candidates (cuDNN's algorithms through
//! `cudnnFindConvolutionForwardAlgorithmEx`, cuBLASLt GEMM over NHWC rows (with im2col for
//! k x k), cuDNN's graph-API conv with the epilogue fused (`dnn_graph`: int8 or FP8 with the
//! requantization, or FP16), a cuBLASLt GEMM that writes the layer's output from its own
//! epilogue, the vectorized depthwise kernel, the direct NVRTC kernel; for int8 and FP8 layers
//! also the layer run in FP16), captures the whole run in a CUDA graph (independent branches
//! side by side on auxiliary streams, as `streams` schedules them), and times it with CUDA
//! events. Every other step runs on an NVRTC kernel of `kernels.cu`; each step's sizes are
//! checked against its tensors before anything is allocated (`check_step`), and its
//! `Step::constants()` are uploaded once (counted in `weights_bytes`).

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::{Arc, OnceLock};

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, result, sys,
};

use super::cache::Choices;
use super::dnn_graph::{ConvGraph, ConvSpec, Geometry, GraphAct, Ptrs};
use super::kernel_source::KERNELS;
use super::plan::{
    Act, ConvStep, DType, Layout, MAX_RANK, Operand, PadMode, Plan, Step, TensorDesc,
    assign_buffers, float_type,
};
use super::streams::{Schedule, schedule};
use crate::backend::{BackendError, Engine, EngineInfo, LayerTime, Output, Precision};

/// Workspace offered to cuDNN and cuBLASLt.
const LIB_WORKSPACE_BYTES: usize = 64 << 20;
/// Auxiliary streams independent branches may run on, beside the main one. An ASPP head has
/// four convs side by side; ResNet's downsampling blocks one shortcut.
const AUX_STREAMS: usize = 3;
/// cuDNN graph-API execution plans a conv's candidates include, best heuristic first. All of
/// the (at most 8) configs the heuristics return made ResNet-50's INT8 graph at batch 32 on an
/// H200 0.8 % faster (0.756 ms against 0.762) and its eval's build five times as long (53 s
/// against 9 to 10 s for the other warm runs of that call): each plan is finalized, and
/// timed, on every conv.
const DNN_PLANS: usize = 3;
/// Direct kernel is only timed below this many MACs (it is a correctness fallback).
const DIRECT_MAX_MACS: f64 = 2e8;
/// Rounds in which every conv candidate is timed once; the median of its rounds decides.
const CHOICE_ROUNDS: usize = 3;
/// Each candidate timing launches the layer back to back for about this long ...
const CHOICE_BATCH_MS: f64 = 0.2;
/// ... and at most this many times.
const CHOICE_MAX_LAUNCHES: usize = 20;
/// Largest im2col buffer a float GEMM candidate may ask for (int8 GEMMs always get theirs).
const COL_MAX_BYTES: usize = 256 << 20;
/// Blocks a global average pool aims for (four per SM on a 132-SM H100 or H200).
const GAP_BLOCKS: usize = 512;
/// The fewest pixels a lane of a global average pool sums where it has fewer than 32 lanes.
const GAP_LANE_PIXELS: usize = 6;
/// The least input a split of a global average pool's block reads.
const GAP_SPLIT_BYTES: usize = 64 << 10;
/// Output channels per thread of the int8 pointwise kernel (`PW_CO` in kernels.cu).
const PW_CO: usize = 16;
/// Threads (pixels) per block of the int8 pointwise kernel.
const PW_THREADS: usize = 128;
/// Shared memory the pointwise kernel may take per block (the default dynamic limit).
const PW_MAX_SHARED_BYTES: usize = 48 << 10;
/// The int8 tensor-core conv kernel's tile: output pixels and channels a block computes,
/// bytes of the reduction a stage copies, threads a block (`MMA_BM`, `MMA_BN`, `MMA_BK`,
/// `MMA_THREADS` in kernels.cu).
const MMA_BM: usize = 128;
const MMA_BN: usize = 64;
const MMA_BK: usize = 64;
const MMA_THREADS: usize = 128;
/// Its cp.async stages and their rows' bytes (`MMA_STAGES`, `MMA_LD` in kernels.cu).
const MMA_STAGES: usize = 3;
const MMA_LD: usize = MMA_BK + 16;
/// Dynamic shared memory of a `bm`-pixel tensor-core block: the stages, the tile's alphas and
/// biases (f32), and with `residual` its int8 residual tile (the layout at `MMA_BM` in
/// kernels.cu; the kernel reads the residual from global memory where the launch gave it no
/// room). With the residual, a 128-pixel block takes more than the 48 KiB a launch gets
/// without asking: `Device::new` raises the kernels' limit.
const fn mma_smem_bytes(bm: usize, residual: bool) -> usize {
    MMA_STAGES * (bm + MMA_BN) * MMA_LD + 2 * MMA_BN * 4 + if residual { bm * MMA_BN } else { 0 }
}
/// Blocks an SM the tensor-core kernels' launch bounds ask for: (tile height, blocks), the
/// implicit GEMM kernels' and the streaming 1x1 ones' alike.
const MMA_OCCUPANCY: [(usize, usize); 2] = [(MMA_BM, 4), (MMA_BM / 2, 6)];
/// Whether the residual tile keeps that occupancy on an SM of `smem_per_sm` bytes of shared
/// memory (the driver takes 1 KiB a block): on sm_90's 228 KiB it does; on the 100 KiB of
/// sm_86 / sm_89 it would halve the 128-pixel kernel's blocks (2 -> 1 an SM).
fn mma_residual_fits(smem_per_sm: usize) -> bool {
    MMA_OCCUPANCY
        .iter()
        .all(|&(bm, blocks)| blocks * (mma_smem_bytes(bm, true) + 1024) <= smem_per_sm)
}
/// Dynamic shared memory of a streaming 1x1 tensor-core block (`conv_i8_mmas` in kernels.cu)
/// of `bm`-pixel tiles and reduction `kpad`: its MMA_BN weight rows and two x tiles, `kpad` and
/// 16 bytes a row, two residual / code tiles of ROWS_CODE_LD bytes a row, the alphas and
/// biases.
const fn mmas_smem_bytes(bm: usize, kpad: usize) -> usize {
    (MMA_BN + 2 * bm) * (kpad + 16) + 2 * bm * ROWS_CODE_LD + 2 * MMA_BN * 4
}
/// Reductions (bytes a weight row) the streaming 1x1 kernel takes: 16-byte pieces a row that
/// divide its threads, and whole rows of weights in shared memory.
const MMAS_KPADS: [usize; 3] = [64, 128, 256];
/// Dynamic shared memory the streaming 1x1 kernel may take a block: the row-at-a-time
/// kernel's limit (within sm_86's and sm_89's 99 KiB), so that its 128-pixel tiles run up to
/// kpad 128 and its 64-pixel ones up to 256.
const MMAS_MAX_SMEM: usize = ROWS_MAX_SMEM;
/// Output pixels a row at most, for the row-at-a-time tensor-core kernel (`ROWS_MAX_OW` in
/// kernels.cu: a warp's 16 channels of a row in its registers).
const ROWS_MAX_OW: usize = 128;
/// Dynamic shared memory the row-at-a-time kernel may take a block, the limit `Device::new`
/// raises it to: within the 99 KiB a block may have on sm_86 / sm_89 (sm_80 and sm_90 allow
/// more).
const ROWS_MAX_SMEM: usize = 96 << 10;
/// Dynamic shared memory of a row-at-a-time tensor-core block (the layout in kernels.cu):
/// MMA_BN weight rows of `kpad` + 16 bytes, two input windows of kh rows of ow + kw - 1
/// 16-byte pixels (plus 16 of slack), the row in whole 16-pixel tiles (int8 codes of
/// ROWS_CODE_LD bytes a pixel with `codes`, else int32 sums), the alphas and biases.
fn rows_smem_bytes(kpad: usize, kh: usize, kw: usize, ow: usize, codes: bool) -> usize {
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
const ROWS_CODE_LD: usize = MMA_BN + 16;
/// kernels.cu's `epi_i8_ok`: whether the tensor-core kernels' int8 epilogue computes an
/// output of type `out` with a residual of type `residual` (or none) and activation `act`:
/// int8 out, an int8 residual or none, ReLU, clip, SiLU or no activation.
fn epi_i8_ok(out: DType, residual: Option<DType>, act: Act) -> bool {
    out == DType::I8
        && residual.is_none_or(|r| r == DType::I8)
        && matches!(act, Act::None | Act::Relu | Act::Clip(..) | Act::Silu)
}
/// Whether the row-at-a-time kernel stages int8 codes (its epilogue in registers) for an
/// output of type `out` with activation `act`: `epi_i8_ok` without a residual.
fn rows_codes(out: DType, residual: bool, act: Act) -> bool {
    !residual && epi_i8_ok(out, None, act)
}
/// (kernel size, stride) of the row-window int8 depthwise kernels, square both ways
/// (`conv_dw_i8_k{K}s{S}` in kernels.cu): MobileNets' and EfficientNets' 3x3 and 5x5
/// depthwise layers, ConvNeXt's 7x7 ones.
const DW_ROWS_SHAPES: [(usize, usize); 5] = [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)];
/// Compute capability from which the tensor-core kernel runs (cp.async, int8 m16n8k32).
pub(crate) const MMA_COMPUTE: (i32, i32) = (8, 0);

pub type DevResult<T> = Result<T, String>;

fn drv<T>(r: Result<T, cudarc::driver::DriverError>, what: &str) -> DevResult<T> {
    r.map_err(|e| format!("{what}: {e:?}"))
}

fn dnn_ok(s: dnn::cudnnStatus_t, what: &str) -> DevResult<()> {
    if s == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {s:?}"))
    }
}

fn lt_ok(s: lt::cublasStatus_t, what: &str) -> DevResult<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {s:?}"))
    }
}

/// A device allocation freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    fn new(bytes: usize) -> DevResult<DevBuf> {
        let b = bytes.max(256);
        let ptr = drv(unsafe { result::malloc_sync(b) }, "cuMemAlloc")?;
        drv(unsafe { result::memset_d8_sync(ptr, 0, b) }, "cuMemset")?;
        Ok(DevBuf { ptr, bytes: b })
    }
    fn from_slice<T: Copy>(v: &[T]) -> DevResult<DevBuf> {
        let b = DevBuf::new(std::mem::size_of_val(v))?;
        if !v.is_empty() {
            drv(
                unsafe { result::memcpy_htod_sync(b.ptr, v) },
                "cuMemcpyHtoD",
            )?;
        }
        Ok(b)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

/// `ViewArgs` of kernels.cu (the `view` kernel's strided read), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ViewArgs {
    dims: [i64; MAX_RANK],
    strides: [i64; MAX_RANK],
    offset: i64,
    rank: i32,
    pad: i32,
    div: FastDiv,
}
unsafe impl DeviceRepr for ViewArgs {}

/// `NaryArgs` of kernels.cu: the output's dims, each input's strides over them, its device
/// pointer, dtype code (-1: f32 constant buffer) and scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct NaryArgs {
    dims: [i64; MAX_RANK],
    strides: [[i64; MAX_RANK]; 3],
    ptrs: [u64; 3],
    t: [i32; 3],
    scale: [f32; 3],
    rank: i32,
    nin: i32,
    div: FastDiv,
}
unsafe impl DeviceRepr for NaryArgs {}

/// `PadArgs` of kernels.cu (the `pad_nd` kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PadArgs {
    out_dims: [i64; MAX_RANK],
    in_dims: [i64; MAX_RANK],
    begin: [i64; MAX_RANK],
    rank: i32,
    mode: i32,
    div: FastDiv,
}
unsafe impl DeviceRepr for PadArgs {}

/// `FastDiv` of kernels.cu: per dim, the multiplier and shift that divide an index below 2^31
/// by the dim as `umulhi(n, magic) >> shift` (magic 0: a dim of 1, or one no fast index meets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct FastDiv {
    magic: [u32; MAX_RANK],
    shift: [u32; MAX_RANK],
}

impl FastDiv {
    /// With l = ceil(log2 d) and magic = ceil(2^(31 + l) / d) < 2^32 (e = magic * d -
    /// 2^(31 + l) < d), n * magic / 2^(31 + l) exceeds n / d by n * e / (d * 2^(31 + l)),
    /// below 2^-l <= 1 / d for n < 2^31: the floor is n / d's (Granlund and Montgomery 1994,
    /// for 31-bit dividends). The shift is l - 1 because umulhi already drops 32 bits.
    fn of(dims: &[i64]) -> FastDiv {
        let mut f = FastDiv::default();
        for (k, &d) in dims.iter().enumerate().take(MAX_RANK) {
            if (2..=1 << 31).contains(&d) {
                let l = 64 - (d as u64 - 1).leading_zeros();
                f.magic[k] = (1u128 << (31 + l)).div_ceil(d as u128) as u32;
                f.shift[k] = l - 1;
            }
        }
        f
    }
}

struct Kernels {
    epilogue: Kernel,
    conv_direct: Kernel,
    conv_dw4: Kernel,
    /// `conv_dw_i8_k{K}s{S}` for each of DW_ROWS_SHAPES, in order.
    conv_dw_i8: Vec<Kernel>,
    im2col: Kernel,
    im2col_v16: Kernel,
    unary: Kernel,
    unary4: Kernel,
    view: Kernel,
    nary: Kernel,
    nary4: Kernel,
    nary8: Kernel,
    nary16: Kernel,
    reduce: Kernel,
    reduce_rows: Kernel,
    norm_rows: Kernel,
    softmax: Kernel,
    softmax_rows: Kernel,
    matmul: Kernel,
    gather: Kernel,
    pad_nd: Kernel,
    conv_transpose: Kernel,
    pool: Kernel,
    pool4: Kernel,
    gap: Kernel,
    concat: Kernel,
    resize: Kernel,
    space_to_depth: Kernel,
    max_pool16: Kernel,
    space_to_depth16: Kernel,
    conv_pw_i8: Kernel,
    conv_pw_i8_word: Kernel,
    conv_i8_mma: Kernel,
    conv_i8_mma64: Kernel,
    conv_i8_rows: Kernel,
    conv_i8_mmas: Kernel,
    conv_i8_mmas64: Kernel,
    gap_finish: Kernel,
}

/// Names of the kernels the engine loads (the compile check makes sure each is in the PTX).
#[cfg(test)]
const KERNEL_NAMES: [&str; 42] = [
    "epilogue",
    "conv_direct",
    "conv_dw4",
    "conv_dw_i8_k3s1",
    "conv_dw_i8_k3s2",
    "conv_dw_i8_k5s1",
    "conv_dw_i8_k5s2",
    "conv_dw_i8_k7s1",
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
    "conv_i8_mma",
    "conv_i8_mma64",
    "conv_i8_rows",
    "conv_i8_mmas",
    "conv_i8_mmas64",
    "gap_finish",
];

/// Compiles the kernels (`kernel_source`) for `arch` (`compute_XY`) with NVRTC: (PTX,
/// compiler log). The log is empty on a clean compile; warnings show up in it, each naming
/// its file of `kernels/` and line.
fn compile_kernels(arch: &str) -> DevResult<(String, String)> {
    use cudarc::nvrtc::result as nv;
    let nv_err = |what: &str, e: nv::NvrtcError| format!("NVRTC {what}: {e:?}");
    // cuda_fp16.h is not built into NVRTC 13: it comes from the toolkit's include folder or
    // the `nvidia-cuda-runtime` wheel's (`libs::include_dirs`).
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
    ];
    options.extend(
        super::libs::include_dirs()
            .into_iter()
            .map(|p| format!("--include-path={}", p.display())),
    );
    let src = std::ffi::CString::new(KERNELS).map_err(|e| format!("kernels/: {e}"))?;
    let name = c"kernels";
    let prog = nv::create_program(&src, Some(name)).map_err(|e| nv_err("create", e))?;
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
        Err(e) => Err(format!("{}: {}", nv_err("compile", e), log.trim())),
        Ok(()) => unsafe { nv::get_ptx(prog) }
            .map(|p| (as_string(p), log))
            .map_err(|e| nv_err("get PTX", e)),
    };
    let _ = unsafe { nv::destroy_program(prog) };
    out
}

/// PTX of the kernels, compiled once per process (per compute capability).
fn ptx(arch: &str) -> DevResult<String> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        let (ptx, log) = compile_kernels(arch)?;
        if !log.trim().is_empty() {
            log_msg(&format!("NVRTC: {}", log.trim()));
        }
        Ok(ptx)
    })
    .clone()
}

fn elems_cfg(n: usize) -> LaunchConfig {
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
fn rows_cfg(rows: usize, len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (round_up(len.clamp(1, 256), 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Product that saturates instead of overflowing (a saturated size never matches a tensor).
fn prod(v: &[usize]) -> usize {
    v.iter().fold(1usize, |a, &b| a.saturating_mul(b))
}

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// Dims in stored order: `[N, H, W, C]` for an NHWC rank-4 tensor, else its shape.
fn stored_dims(t: &TensorDesc) -> Vec<usize> {
    if t.layout == Layout::Nhwc && t.shape.len() == 4 {
        vec![t.shape[0], t.shape[2], t.shape[3], t.shape[1]]
    } else {
        t.shape.clone()
    }
}

/// Drops unit dims and merges each dim into the one before it where every operand reads the
/// pair as one run (`outer stride == inner stride * inner dim`), so a transpose of `[1, C, H,
/// W]` or a broadcast over contiguous rows unravels over fewer dims, and plans of rank > 8
/// still fit when they collapse. The output (contiguous) always merges.
fn collapse(dims: &[usize], strides: &[&[i64]]) -> (Vec<i64>, Vec<Vec<i64>>) {
    let mut od: Vec<i64> = vec![];
    let mut os: Vec<Vec<i64>> = vec![vec![]; strides.len()];
    for (d, &size) in dims.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let size = size as i64;
        let merges = !od.is_empty()
            && strides
                .iter()
                .zip(&os)
                .all(|(s, o)| o.last().copied() == Some(s[d].saturating_mul(size)));
        if merges {
            if let Some(last) = od.last_mut() {
                *last = last.saturating_mul(size);
            }
            for (s, o) in strides.iter().zip(os.iter_mut()) {
                if let Some(last) = o.last_mut() {
                    *last = s[d];
                }
            }
        } else {
            od.push(size);
            for (s, o) in strides.iter().zip(os.iter_mut()) {
                o.push(s[d]);
            }
        }
    }
    (od, os)
}

/// Checks that a strided read over `dims` from `offset` stays inside `len` elements.
fn in_bounds(
    what: &str,
    dims: &[i64],
    strides: &[i64],
    offset: i64,
    len: usize,
) -> Result<(), String> {
    if dims.contains(&0) {
        return Ok(());
    }
    let (mut lo, mut hi) = (offset, offset);
    for (&d, &s) in dims.iter().zip(strides) {
        let span = (d - 1).saturating_mul(s);
        if span < 0 {
            lo = lo.saturating_add(span);
        } else {
            hi = hi.saturating_add(span);
        }
    }
    ensure(lo >= 0 && hi < len as i64, || {
        format!("{what} reads elements {lo}..={hi} of {len}")
    })
}

fn operand_len(plan: &Plan, o: &Operand) -> usize {
    match o {
        Operand::Tensor(t) => plan.tensors[*t].numel(),
        Operand::Const(v, _) => v.len(),
    }
}

/// The `view` kernel's arguments for a `Step::View`, its read checked against the input.
fn view_args(
    plan: &Plan,
    input: usize,
    out: usize,
    dims: &[usize],
    strides: &[i64],
    offset: i64,
) -> Result<ViewArgs, String> {
    ensure(dims.len() == strides.len(), || {
        format!("{} dims but {} strides", dims.len(), strides.len())
    })?;
    let n = prod(dims);
    let want = plan.tensors[out].numel();
    ensure(n == want, || {
        format!("dims {dims:?} hold {n} elements, the output {want}")
    })?;
    let (d, s) = collapse(dims, &[strides]);
    ensure(d.len() <= MAX_RANK, || {
        format!("rank {} (after merging dims) is over {MAX_RANK}", d.len())
    })?;
    in_bounds("the view", &d, &s[0], offset, plan.tensors[input].numel())?;
    let mut a = ViewArgs {
        offset,
        rank: d.len() as i32,
        ..Default::default()
    };
    a.dims[..d.len()].copy_from_slice(&d);
    a.strides[..d.len()].copy_from_slice(&s[0]);
    a.div = FastDiv::of(&a.dims[..d.len()]);
    Ok(a)
}

/// The `nary` kernel's arguments for a `Step::Nary` (device pointers left 0: the engine fills
/// them), each input's reads checked against its tensor or constant.
fn nary_args(
    plan: &Plan,
    inputs: &[Operand],
    strides: &[Vec<i64>],
    dims: &[usize],
    out: usize,
) -> Result<NaryArgs, String> {
    ensure(!inputs.is_empty() && inputs.len() <= 3, || {
        format!("{} inputs (1 to 3 are supported)", inputs.len())
    })?;
    ensure(strides.len() == inputs.len(), || {
        format!("{} inputs but {} stride lists", inputs.len(), strides.len())
    })?;
    for (j, s) in strides.iter().enumerate() {
        ensure(s.len() == dims.len(), || {
            format!("input {j} has {} strides over {} dims", s.len(), dims.len())
        })?;
    }
    let n = prod(dims);
    let want = plan.tensors[out].numel();
    ensure(n == want, || {
        format!("dims {dims:?} hold {n} elements, the output {want}")
    })?;
    let sl: Vec<&[i64]> = strides.iter().map(|v| v.as_slice()).collect();
    let (d, ss) = collapse(dims, &sl);
    ensure(d.len() <= MAX_RANK, || {
        format!("rank {} (after merging dims) is over {MAX_RANK}", d.len())
    })?;
    let mut a = NaryArgs {
        rank: d.len() as i32,
        nin: inputs.len() as i32,
        ..Default::default()
    };
    a.dims[..d.len()].copy_from_slice(&d);
    a.div = FastDiv::of(&a.dims[..d.len()]);
    for (j, (o, s)) in inputs.iter().zip(&ss).enumerate() {
        in_bounds(&format!("input {j}"), &d, s, 0, operand_len(plan, o))?;
        a.strides[j][..s.len()].copy_from_slice(s);
        (a.t[j], a.scale[j]) = match o {
            Operand::Tensor(t) => (plan.tensors[*t].dtype.code(), plan.tensors[*t].scale),
            Operand::Const(..) => (-1, 1.0),
        };
    }
    Ok(a)
}

/// `a` over groups of `width` (`nary4`, `nary8`, `nary16`) along its innermost dim, with
/// the mask of inputs read as vectors; `None` when the innermost dim is not whole groups or
/// an input neither runs along it (stride 1, other strides whole groups) nor stays constant
/// along it (stride 0).
fn nary_groups(a: &NaryArgs, width: i64) -> Option<(NaryArgs, i32)> {
    let last = (a.rank as usize).checked_sub(1)?;
    if a.dims[last] % width != 0 {
        return None;
    }
    let mut g = *a;
    let mut vec = 0;
    for k in 0..a.nin as usize {
        match a.strides[k][last] {
            0 => {}
            1 if a.strides[k][..last].iter().all(|s| s % width == 0) => vec |= 1 << k,
            _ => return None,
        }
        g.strides[k][last] *= width;
    }
    g.dims[last] /= width;
    g.div = FastDiv::of(&g.dims[..=last]);
    Some((g, vec))
}

/// Pixel lanes of a global average pool's block over `pixels` pixels: GAP_LANE_PIXELS a lane
/// or more, 32 lanes at most (the kernel's shared memory).
fn gap_lanes(pixels: usize) -> usize {
    (pixels / GAP_LANE_PIXELS).clamp(1, 32)
}

/// Blocks along the pixels of a global average pool of `n` images of `c` channels of
/// `esize` bytes and `hw` pixels: enough for about GAP_BLOCKS blocks in all (a block per
/// image and 32 channels left most SMs idle on EfficientNet-B0's batch-32 pools), but none
/// reading less than GAP_SPLIT_BYTES (on the ../shared DeepLab's 35 KB blocks, splitting
/// only added the second kernel's launch).
fn gap_splits(n: usize, c: usize, hw: usize, esize: usize) -> usize {
    let blocks = n * c.div_ceil(32);
    let block_bytes = hw * c.min(32) * esize;
    GAP_BLOCKS
        .div_ceil(blocks.max(1))
        .min(block_bytes / GAP_SPLIT_BYTES)
        .max(1)
}

/// The `pad_nd` kernel's arguments for a `Step::Pad`.
fn pad_args(
    plan: &Plan,
    input: usize,
    out: usize,
    in_dims: &[usize],
    begin: &[i64],
    mode: PadMode,
) -> Result<PadArgs, String> {
    let od = stored_dims(&plan.tensors[out]);
    let r = in_dims.len();
    ensure(begin.len() == r && od.len() == r, || {
        format!("input dims {in_dims:?}, pads {begin:?} and output dims {od:?} differ in rank")
    })?;
    ensure(r <= MAX_RANK, || format!("rank {r} is over {MAX_RANK}"))?;
    let have = plan.tensors[input].numel();
    ensure(prod(in_dims) == have, || {
        format!("input dims {in_dims:?} do not hold the input's {have} elements")
    })?;
    ensure(
        mode == PadMode::Constant || od.iter().zip(in_dims).all(|(&o, &i)| o == 0 || i > 0),
        || format!("{mode:?} padding of an empty axis"),
    )?;
    let mut a = PadArgs {
        rank: r as i32,
        mode: mode as i32,
        ..Default::default()
    };
    for d in 0..r {
        a.out_dims[d] = od[d] as i64;
        a.in_dims[d] = in_dims[d] as i64;
        a.begin[d] = begin[d];
    }
    a.div = FastDiv::of(&a.out_dims[..r]);
    Ok(a)
}

/// Checks a step's sizes against its tensors before anything runs: the kernels trust them,
/// so a planner bug becomes an error here instead of an out-of-bounds access on the device.
/// Conv steps are checked by their own setup.
fn check_step(plan: &Plan, s: &Step) -> Result<(), String> {
    let nt = plan.tensors.len();
    for t in s.inputs().into_iter().chain([s.output()]) {
        ensure(t < nt, || {
            format!("tensor {t} does not exist ({nt} tensors)")
        })?;
    }
    let td = |t: usize| &plan.tensors[t];
    let numel = |t: usize| td(t).numel();
    let is = |what: &str, have: usize, want: usize| {
        ensure(have == want, || {
            format!("{what} holds {have} elements, expected {want}")
        })
    };
    let int = |what: &str, v: usize| {
        ensure(v <= i32::MAX as usize, || {
            format!("{what} = {v} does not fit 32 bits")
        })
    };
    let rank4 = |t: usize, layout: Option<Layout>| -> Result<(), String> {
        let d = td(t);
        ensure(
            d.shape.len() == 4 && layout.is_none_or(|l| d.layout == l),
            || {
                format!(
                    "tensor `{}` is {:?} {:?}, expected rank 4{}",
                    d.name,
                    d.shape,
                    d.layout,
                    layout.map_or(String::new(), |l| format!(" {l:?}"))
                )
            },
        )?;
        d.shape.iter().try_for_each(|&v| int("a dim", v))
    };
    let positive = |what: &str, v: &[usize]| {
        ensure(v.iter().all(|&x| x > 0), || {
            format!("{what} {v:?} must be positive")
        })
    };
    match s {
        Step::Conv(_) => Ok(()),
        Step::Unary { input, out, .. } => is("the input", numel(*input), numel(*out)),
        Step::View {
            input,
            out,
            dims,
            strides,
            offset,
            ..
        } => view_args(plan, *input, *out, dims, strides, *offset).map(|_| ()),
        Step::Nary {
            op,
            inputs,
            strides,
            dims,
            out,
            ..
        } => {
            ensure(inputs.len() == op.arity(), || {
                format!("{op:?} takes {} inputs, got {}", op.arity(), inputs.len())
            })?;
            nary_args(plan, inputs, strides, dims, *out).map(|_| ())
        }
        Step::Reduce {
            input,
            out,
            outer,
            len,
            inner,
            ..
        } => {
            positive("the reduced length", &[*len])?;
            is("the input", numel(*input), prod(&[*outer, *len, *inner]))?;
            is("the output", numel(*out), prod(&[*outer, *inner]))
        }
        Step::Norm {
            input,
            out,
            rows,
            len,
            gamma,
            beta,
            ..
        } => {
            positive("the row length", &[*len])?;
            is("the input", numel(*input), prod(&[*rows, *len]))?;
            is("the output", numel(*out), prod(&[*rows, *len]))?;
            ensure(gamma.is_empty() || gamma.len() == *len, || {
                format!("gamma holds {}, the row {len}", gamma.len())
            })?;
            ensure(beta.is_empty() || beta.len() == *len, || {
                format!("beta holds {}, the row {len}", beta.len())
            })?;
            // Step::constants() uploads beta only along with gamma.
            ensure(beta.is_empty() || !gamma.is_empty(), || {
                "beta without gamma".to_string()
            })
        }
        Step::MatMul {
            a,
            b,
            out,
            batch,
            m,
            n,
            k,
            a_stride,
            b_stride,
            ..
        } => {
            positive("m, n, k", &[*m, *n, *k])?;
            for (what, v) in [("m", *m), ("n", *n), ("k", *k)] {
                int(what, v)?;
            }
            let need = |stride: usize, mat: usize| {
                batch
                    .saturating_sub(1)
                    .saturating_mul(stride)
                    .saturating_add(mat)
            };
            let (na, nb) = (need(*a_stride, m * k), need(*b_stride, k * n));
            ensure(numel(*a) >= na, || {
                format!("A holds {}, the batches read {na}", numel(*a))
            })?;
            let lb = operand_len(plan, b);
            ensure(lb >= nb, || format!("B holds {lb}, the batches read {nb}"))?;
            is("the output", numel(*out), prod(&[*batch, *m, *n]))
        }
        Step::Gather {
            input,
            indices,
            out,
            outer,
            axis_len,
            count,
            inner,
            ..
        } => {
            is(
                "the input",
                numel(*input),
                prod(&[*outer, *axis_len, *inner]),
            )?;
            is("the output", numel(*out), prod(&[*outer, *count, *inner]))?;
            let li = operand_len(plan, indices);
            ensure(li >= *count, || format!("{li} indices for {count} outputs"))?;
            if let Operand::Const(v, _) = indices {
                let l = *axis_len as f32;
                if let Some(bad) = v.iter().find(|&&i| i < -l || i >= l) {
                    return Err(format!(
                        "index {bad} is out of range for an axis of {axis_len}"
                    ));
                }
            }
            Ok(())
        }
        Step::Pool {
            input,
            out,
            k,
            stride,
            dilation,
            ..
        } => {
            rank4(*input, Some(Layout::Nhwc))?;
            rank4(*out, Some(Layout::Nhwc))?;
            positive("kernel", k)?;
            positive("strides", stride)?;
            positive("dilations", dilation)?;
            let (i, o) = (td(*input), td(*out));
            ensure(i.shape[..2] == o.shape[..2], || {
                format!(
                    "input {:?} and output {:?} differ in N or C",
                    i.shape, o.shape
                )
            })
        }
        Step::GlobalAvgPool { input, out, .. } => {
            rank4(*input, None)?;
            let i = td(*input);
            is("the output", numel(*out), i.shape[0] * i.shape[1])
        }
        Step::Concat {
            inputs,
            out,
            outer,
            inner,
            ..
        } => {
            let row = outer.saturating_mul(*inner);
            positive("outer x inner", &[row])?;
            let mut total = 0usize;
            for &t in inputs {
                ensure(numel(t).is_multiple_of(row), || {
                    format!(
                        "input `{}` does not split into {outer} x {inner}",
                        td(t).name
                    )
                })?;
                total += numel(t);
            }
            is("the output", numel(*out), total)
        }
        Step::Resize {
            input,
            out,
            mode,
            scale_hw,
            ..
        } => {
            rank4(*input, Some(Layout::Nhwc))?;
            rank4(*out, Some(Layout::Nhwc))?;
            ensure((0..=2).contains(mode), || format!("mode {mode} (0 to 2)"))?;
            ensure(scale_hw.iter().all(|&v| v > 0.0), || {
                format!("scales {scale_hw:?} must be positive")
            })?;
            let (i, o) = (td(*input), td(*out));
            ensure(i.shape[..2] == o.shape[..2], || {
                format!(
                    "input {:?} and output {:?} differ in N or C",
                    i.shape, o.shape
                )
            })?;
            positive("input size", &i.shape)
        }
        Step::Softmax {
            input,
            out,
            outer,
            len,
            inner,
            ..
        } => {
            let n = prod(&[*outer, *len, *inner]);
            is("the input", numel(*input), n)?;
            is("the output", numel(*out), n)
        }
        Step::Pad {
            input,
            out,
            in_dims,
            begin,
            mode,
            ..
        } => pad_args(plan, *input, *out, in_dims, begin, *mode).map(|_| ()),
        Step::SpaceToDepth {
            input, out, block, ..
        } => {
            rank4(*input, None)?;
            rank4(*out, Some(Layout::Nhwc))?;
            positive("block", &[*block])?;
            let (i, o) = (&td(*input).shape, &td(*out).shape);
            let cells = block * block;
            ensure(
                o[0] == i[0]
                    && o[1] % cells == 0
                    && o[1] / cells >= i[1]
                    && (o[1] / cells).is_multiple_of(4),
                || format!("{i:?} cannot regroup into {o:?} by blocks of {block}"),
            )
        }
        Step::ConvTranspose {
            input,
            out,
            w,
            bias,
            groups,
            k,
            stride,
            dilation,
            ..
        } => {
            rank4(*input, Some(Layout::Plain))?;
            rank4(*out, Some(Layout::Plain))?;
            positive("groups", &[*groups])?;
            positive("kernel", k)?;
            positive("strides", stride)?;
            positive("dilations", dilation)?;
            let (i, o) = (&td(*input).shape, &td(*out).shape);
            let (cin, cout) = (i[1], o[1]);
            ensure(i[0] == o[0], || format!("batch {} in, {} out", i[0], o[0]))?;
            ensure(
                cin.is_multiple_of(*groups) && cout.is_multiple_of(*groups),
                || format!("{cin} -> {cout} channels do not split into {groups} groups"),
            )?;
            is(
                "the weights",
                w.len(),
                prod(&[cin, cout / groups, k[0], k[1]]),
            )?;
            ensure(bias.is_empty() || bias.len() == cout, || {
                format!("bias holds {}, channels {cout}", bias.len())
            })
        }
    }
}

macro_rules! launch {
    ($stream:expr, $f:expr, cfg $cfg:expr; $($a:expr),* $(,)?) => {{
        let cfg: LaunchConfig = $cfg;
        let args = ($($a,)*);
        let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(36);
        push_args!(ptrs, args; (0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35); $($a),*);
        $f.launch(&$stream, cfg, &mut ptrs)
    }};
    // One thread per element.
    ($stream:expr, $f:expr, $n:expr; $($a:expr),* $(,)?) => {
        launch!($stream, $f, cfg elems_cfg($n); $($a),*)
    };
}

macro_rules! push_args {
    ($p:ident, $args:ident; ($($idx:tt)*); ) => {};
    ($p:ident, $args:ident; ($i0:tt $($idx:tt)*); $a0:expr $(, $a:expr)*) => {
        $p.push(arg_ptr(&$args.$i0));
        push_args!($p, $args; ($($idx)*); $($a),*);
    };
}

/// A kernel argument as `cuLaunchKernelEx` takes it: a pointer to the value, which must stay
/// alive until the launch returns (the `launch!` macro's tuple).
fn arg_ptr<T: DeviceRepr>(a: &T) -> *mut c_void {
    a as *const T as *mut c_void
}

/// A kernel of kernels.cu, and whether it is launched as a programmatic dependent launch:
/// on sm_90 and later (unless QUANTSCOPE_CUDA_PDL=off) every one is, so that its blocks are
/// scheduled, and run what precedes their `pdl_wait` (index arithmetic, weight copies), while
/// the kernel before it in the stream finishes. In ResNet-50's INT8 graph at batch 32 most
/// layers take 5 to 35 us, and each launch's start-up and the previous kernel's last wave were
/// time with idle SMs. The kernels themselves wait (`griddepcontrol.wait`) before they read an
/// activation or write anything, so the attribute is safe only for kernels of this file.
struct Kernel {
    f: CudaFunction,
    pdl: bool,
}

impl Kernel {
    /// Launches on `stream` with `args` from `arg_ptr`.
    fn launch(
        &self,
        stream: &CudaStream,
        cfg: LaunchConfig,
        args: &mut [*mut c_void],
    ) -> DevResult<()> {
        // The driver call takes the calling thread's context, as cudarc's launches bind it.
        drv(
            stream.context().bind_to_thread(),
            "binding the CUDA context",
        )?;
        // SAFETY: a zeroed attribute is a valid value of the plain-data union; only the id
        // and the one field read for that id are set.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        // SAFETY: `args` points at live values of the kernel's parameter types, in order (the
        // launch! call sites mirror kernels.cu's signatures, as cudarc's builder did).
        let r = unsafe {
            sys::cuLaunchKernelEx(&config, self.f.cu_function(), args.as_mut_ptr(), null_mut())
        };
        drv(r.result(), "kernel launch")
    }
}

/// Shared handles: context, stream, kernels, cuDNN and cuBLASLt.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    k: Kernels,
    cudnn: dnn::cudnnHandle_t,
    lt: lt::cublasLtHandle_t,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// Whether the tensor-core kernels get room for their residual tile (`mma_residual_fits`).
    mma_residual: bool,
    /// Multiprocessors, and bytes of shared memory each (the row-at-a-time kernel's grid).
    sms: usize,
    smem_per_sm: usize,
}

impl Drop for Device {
    fn drop(&mut self) {
        unsafe {
            let _ = self.stream.synchronize();
            dnn::cudnnDestroy(self.cudnn);
            lt::cublasLtDestroy(self.lt);
        }
    }
}

impl Device {
    pub fn new() -> DevResult<Device> {
        let ctx = drv(CudaContext::new(0), "creating the CUDA context")?;
        let (maj, min) = drv(ctx.compute_capability(), "compute capability")?;
        let name = drv(ctx.name(), "device name")?;
        let stream = drv(ctx.new_stream(), "creating a stream")?;
        let ptx_src = ptx(&format!("compute_{maj}{min}"))?;
        let module = drv(
            ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx_src)),
            "loading the kernels",
        )?;
        let pdl = (maj, min) >= (9, 0) && pdl_enabled();
        let f = |n: &str| drv(module.load_function(n), n).map(|f| Kernel { f, pdl });
        let k = Kernels {
            epilogue: f("epilogue")?,
            conv_direct: f("conv_direct")?,
            conv_dw4: f("conv_dw4")?,
            conv_dw_i8: DW_ROWS_SHAPES
                .iter()
                .map(|(k, s)| f(&format!("conv_dw_i8_k{k}s{s}")))
                .collect::<Result<_, _>>()?,
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
            conv_i8_mma: f("conv_i8_mma")?,
            conv_i8_mma64: f("conv_i8_mma64")?,
            conv_i8_rows: f("conv_i8_rows")?,
            conv_i8_mmas: f("conv_i8_mmas")?,
            conv_i8_mmas64: f("conv_i8_mmas64")?,
            gap_finish: f("gap_finish")?,
        };
        let smem_per_sm = drv(
            ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            ),
            "shared memory per multiprocessor",
        )?;
        let mma_residual = mma_residual_fits(smem_per_sm.max(0) as usize);
        if (maj, min) >= MMA_COMPUTE && mma_residual {
            for (f, bm) in [(&k.conv_i8_mma, MMA_BM), (&k.conv_i8_mma64, MMA_BM / 2)] {
                drv(
                    f.f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        mma_smem_bytes(bm, true) as i32,
                    ),
                    "raising the tensor-core kernel's shared memory limit",
                )?;
            }
        }
        if (maj, min) >= MMA_COMPUTE {
            drv(
                k.conv_i8_rows.f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    ROWS_MAX_SMEM as i32,
                ),
                "raising the row-at-a-time kernel's shared memory limit",
            )?;
            for f in [&k.conv_i8_mmas, &k.conv_i8_mmas64] {
                drv(
                    f.f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        MMAS_MAX_SMEM as i32,
                    ),
                    "raising the streaming 1x1 kernel's shared memory limit",
                )?;
            }
        }
        let sms = drv(
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            "multiprocessor count",
        )?
        .max(1) as usize;
        let mut cudnn = std::ptr::null_mut();
        dnn_ok(unsafe { dnn::cudnnCreate(&mut cudnn) }, "cudnnCreate")?;
        dnn_ok(
            unsafe { dnn::cudnnSetStream(cudnn, stream.cu_stream() as _) },
            "cudnnSetStream",
        )?;
        let lt = cudarc::cublaslt::result::create_handle()
            .map_err(|e| format!("cublasLtCreate: {e}"))?;
        Ok(Device {
            ctx,
            stream,
            k,
            cudnn,
            lt,
            name,
            compute: (maj, min),
            mma_residual,
            sms,
            smem_per_sm: smem_per_sm.max(0) as usize,
        })
    }

    /// Blocks of `smem` bytes of dynamic shared memory an SM holds at once (the driver keeps
    /// 1 KiB a block), at least one: the grid of the kernels whose blocks step over their
    /// work, as many as run at once. Registers and launch bounds may allow fewer: callers cap
    /// it at those.
    fn resident_blocks(&self, smem: usize) -> usize {
        (self.smem_per_sm / (smem + 1024)).max(1)
    }
}

/// How one convolution runs.
#[derive(Clone, Debug, PartialEq)]
pub enum ConvImpl {
    Direct,
    /// cuBLASLt GEMM into a raw buffer, then the epilogue kernel: `algo` is the index in the
    /// heuristic list; `im2col` when not pointwise.
    Gemm {
        algo: usize,
        im2col: bool,
    },
    /// cuBLASLt GEMM that writes the layer's output itself: bias, residual (beta * C) and
    /// ReLU in its epilogue (int8 layers: the per-channel scale as an alpha vector and the
    /// int8 output), so no raw pass.
    GemmFused {
        algo: usize,
        im2col: bool,
    },
    Cudnn {
        algo: i32,
    },
    /// cuDNN graph-API conv with (scale,) bias, residual, ReLU or clip and the output
    /// conversion fused (`dnn_graph`); `plan` indexes its execution plans.
    CudnnGraph {
        plan: usize,
    },
    /// Depthwise conv on the vectorized kernel (`conv_dw4`), epilogue fused.
    Depthwise,
    /// Int8 depthwise conv on the kernels that read each input row's window once
    /// (`conv_dw_i8_k{K}s{S}`, square kernels and strides of DW_ROWS_SHAPES, dilation 1):
    /// `kernel` indexes DW_ROWS_SHAPES.
    DepthwiseRows {
        kernel: usize,
    },
    /// Int8 1x1 conv (or Gemm / MatMul) on the `__dp4a` kernel (`conv_pw_i8`), epilogue fused.
    Pointwise,
    /// The same on `conv_pw_i8_word`: a thread per four output channels of a pixel, so that
    /// the output is written in whole lines (expansion layers).
    PointwiseWord,
    /// Int8 conv (or Gemm / MatMul) as an implicit GEMM on the int8 tensor cores, epilogue
    /// fused, in tiles of `bm` output pixels: `MMA_BM` (`conv_i8_mma`) or half that
    /// (`conv_i8_mma64`: twice the blocks, more of them an SM).
    Mma {
        bm: usize,
    },
    /// Int8 1x1 conv (or Gemm / MatMul) with an int8 output on the tensor cores, each block
    /// keeping its channels' weights in shared memory and streaming tiles of `bm` output
    /// pixels (`conv_i8_mmas`, or `conv_i8_mmas64` at half height), the next tile's copy
    /// overlapping the current one's work.
    MmaStream {
        bm: usize,
    },
    /// Int8 stride-1 conv over 16 channels (a regrouped stem) on the tensor cores a row of
    /// output pixels at a time (`conv_i8_rows`), each row's input window read into shared
    /// memory once.
    MmaRows,
    /// A layer the Q/DQ plan lets run in int8 (or FP8), run in FP16 because that timed faster:
    /// the quantized input is dequantized into a scratch FP16 copy, the inner float implementation runs on
    /// dequantized weights, and the epilogue writes the planned output type.
    AsF16(Box<ConvImpl>),
}

impl ConvImpl {
    pub fn key(&self) -> String {
        match self {
            ConvImpl::Direct => "direct".into(),
            ConvImpl::Gemm { algo, im2col } => {
                format!("gemm:{algo}:{}", if *im2col { "im2col" } else { "rows" })
            }
            ConvImpl::GemmFused { algo, im2col } => {
                format!("gemmf:{algo}:{}", if *im2col { "im2col" } else { "rows" })
            }
            ConvImpl::Cudnn { algo } => format!("cudnn:{algo}"),
            ConvImpl::CudnnGraph { plan } => format!("cudnng:{plan}"),
            ConvImpl::Depthwise => "dw".into(),
            ConvImpl::DepthwiseRows { .. } => "dwr".into(),
            ConvImpl::Pointwise => "pw".into(),
            ConvImpl::PointwiseWord => "pww".into(),
            ConvImpl::Mma { bm } if *bm == MMA_BM => "mma".into(),
            ConvImpl::Mma { bm } => format!("mma{bm}"),
            ConvImpl::MmaStream { bm } if *bm == MMA_BM => "mmas".into(),
            ConvImpl::MmaStream { bm } => format!("mmas{bm}"),
            ConvImpl::MmaRows => "mmar".into(),
            ConvImpl::AsF16(inner) => format!("f16+{}", inner.key()),
        }
    }
    /// Whether a cached key names this implementation: its whole key, or its family without
    /// the algorithm (`gemmf` answers for `gemmf:0:im2col`, not `gemm` for `gemmf:..`).
    pub fn answers(&self, key: &str) -> bool {
        let own = self.key();
        own == key
            || own
                .strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':'))
    }
    /// What the per-layer report calls it.
    fn describe(&self) -> String {
        match self {
            ConvImpl::Direct => "direct kernel".into(),
            ConvImpl::Gemm { im2col, .. } => {
                format!("cuBLASLt GEMM{}", if *im2col { " + im2col" } else { "" })
            }
            ConvImpl::GemmFused { im2col, .. } => format!(
                "cuBLASLt GEMM, fused epilogue{}",
                if *im2col { " + im2col" } else { "" }
            ),
            ConvImpl::Cudnn { algo } => format!("cuDNN algo {algo}"),
            ConvImpl::CudnnGraph { plan } => {
                format!("cuDNN graph conv, fused epilogue (plan {plan})")
            }
            ConvImpl::Depthwise => "depthwise kernel".into(),
            ConvImpl::DepthwiseRows { .. } => "depthwise kernel, a row window at a time".into(),
            ConvImpl::Pointwise => "pointwise dp4a kernel".into(),
            ConvImpl::PointwiseWord => "pointwise dp4a kernel, 4 channels a thread".into(),
            ConvImpl::Mma { bm } => {
                format!("int8 tensor-core implicit GEMM kernel, {bm}-pixel tiles")
            }
            ConvImpl::MmaStream { bm } => {
                format!("int8 tensor-core 1x1 kernel, weights resident, {bm}-pixel tiles streamed")
            }
            ConvImpl::MmaRows => {
                "int8 tensor-core kernel, a row of pixels a block (input window in shared memory)"
                    .into()
            }
            ConvImpl::AsF16(inner) => format!("run in fp16 (timed faster): {}", inner.describe()),
        }
    }
}

struct GemmSetup {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    /// Layout of C and D.
    d: lt::cublasLtMatrixLayout_t,
    algos: Vec<lt::cublasLtMatmulHeuristicResult_t>,
    w: DevBuf,
    kpad: usize,
    /// Rows of D (output channels, padded for the raw-output GEMMs).
    cout_pad: usize,
    int8: bool,
    /// The output written by the GEMM's own epilogue (`ConvImpl::GemmFused`).
    fused: Option<FusedOut>,
}

/// Device constants of a GEMM that writes the layer's output, D = act(alpha * AB + beta * C +
/// bias[c]); for an int8 layer alpha is per channel and everything is in units of the output
/// scale, so D's rounding to int8 is the requantization.
struct FusedOut {
    /// Per-channel alpha (int8 layers); `None`: alpha is 1.
    alpha: Option<DevBuf>,
    bias: DevBuf,
    /// Residual weight (host scalar); `None` when there is no residual (beta = 0 mode).
    beta: Option<f32>,
}

/// A cuDNN graph conv with its weights (KRSC) and scale (int8 layers) and bias, in output
/// units.
struct DnnConv {
    graph: ConvGraph,
    w: DevBuf,
    /// Per-channel scale in output units (int8 layers).
    scale: Option<DevBuf>,
    bias: DevBuf,
    /// Input channels the graph reads: the layer's, or more (zero channels appended into the
    /// input-copy scratch) where the layer's do not fill a 16-byte vector (a stem's 3).
    cin_pad: usize,
    /// Where the residual is FP8 (cuDNN 9.14 has no engine for an FP8 operand in the fused
    /// add): the graph writes the conv + bias in FP16 to the raw scratch and the epilogue
    /// kernel adds the residual and the activation, with these unit alphas and zero biases.
    split: Option<(DevBuf, DevBuf)>,
}

/// Channels a cuDNN graph conv of input type `t` reads: 16 bytes' worth at least.
fn graph_cin(cin: usize, t: DType) -> usize {
    round_up(cin, 16 / t.bytes())
}

/// The FP16 way of running an int8 or FP8 layer (`ConvImpl::AsF16`): dequantized weights for the
/// float implementations and unit alphas (the FP16 conv already computes real units).
struct F16Path {
    gemm: Option<GemmSetup>,
    cudnn: Option<CudnnSetup>,
    ones: DevBuf,
}

impl Drop for GemmSetup {
    fn drop(&mut self) {
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.desc);
            lt::cublasLtMatrixLayoutDestroy(self.a);
            lt::cublasLtMatrixLayoutDestroy(self.b);
            lt::cublasLtMatrixLayoutDestroy(self.d);
        }
    }
}

/// A cuBLASLt matmul descriptor being configured; destroyed on drop unless taken.
struct GemmDesc(lt::cublasLtMatmulDesc_t);

impl GemmDesc {
    /// A descriptor for D = op(A)^T B (weights transposed, columns as they are).
    fn new(compute: lt::cublasComputeType_t, scale: lt::cudaDataType_t) -> DevResult<GemmDesc> {
        let desc = cudarc::cublaslt::result::create_matmul_desc(compute, scale)
            .map_err(|e| format!("{e}"))?;
        let d = GemmDesc(desc);
        use lt::cublasLtMatmulDescAttributes_t as A;
        d.set(A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
        d.set(A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
        Ok(d)
    }
    fn set<T>(&self, attr: lt::cublasLtMatmulDescAttributes_t, v: &T) -> DevResult<()> {
        unsafe {
            cudarc::cublaslt::result::set_matmul_desc_attribute(
                self.0,
                attr,
                v as *const T as *const c_void,
                std::mem::size_of::<T>(),
            )
        }
        .map_err(|e| format!("{attr:?}: {e}"))
    }
    fn take(self) -> lt::cublasLtMatmulDesc_t {
        let d = self.0;
        std::mem::forget(self);
        d
    }
}

impl Drop for GemmDesc {
    fn drop(&mut self) {
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.0);
        }
    }
}

/// `rows` rows of `k` values, zero padded to `[rows_pad, kpad]` (GEMM operands keep 16-element
/// alignment).
fn padded_rows<T: Copy + Default>(
    v: &[T],
    rows: usize,
    k: usize,
    rows_pad: usize,
    kpad: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); rows_pad * kpad];
    for o in 0..rows {
        out[o * kpad..o * kpad + k].copy_from_slice(&v[o * k..(o + 1) * k]);
    }
    out
}

/// cuDNN's 2-D convolution takes one padding per axis.
fn symmetric_pads(c: &ConvStep) -> bool {
    c.pads[0] == c.pads[2] && c.pads[1] == c.pads[3]
}

struct CudnnSetup {
    x: dnn::cudnnTensorDescriptor_t,
    y: dnn::cudnnTensorDescriptor_t,
    w_desc: dnn::cudnnFilterDescriptor_t,
    conv: dnn::cudnnConvolutionDescriptor_t,
    w: DevBuf,
    algos: Vec<(i32, usize)>,
}

impl Drop for CudnnSetup {
    fn drop(&mut self) {
        unsafe {
            dnn::cudnnDestroyTensorDescriptor(self.x);
            dnn::cudnnDestroyTensorDescriptor(self.y);
            dnn::cudnnDestroyFilterDescriptor(self.w_desc);
            dnn::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

/// A convolution on the device: its epilogue constants and the chosen implementation.
struct ConvRt {
    step: ConvStep,
    alpha: DevBuf,
    bias: DevBuf,
    /// Direct-kernel weights (f32 or i8, OHWI), kept only when chosen.
    direct_w: Option<DevBuf>,
    /// Weights of the depthwise kernel (`depthwise_weights`) or of the int8 pointwise kernel
    /// (`pointwise_weights`; a conv has at most one of the two), kept only when chosen.
    kernel_w: Option<DevBuf>,
    /// Weights of the int8 tensor-core kernel (`mma_weights`), kept only when chosen.
    mma_w: Option<DevBuf>,
    /// Weights of the int8 row-window depthwise kernel (`depthwise_rows_weights`), kept only
    /// when chosen.
    rows_w: Option<DevBuf>,
    gemm: Option<GemmSetup>,
    gemm_fused: Option<GemmSetup>,
    cudnn: Option<CudnnSetup>,
    dnn: Option<DnnConv>,
    f16: Option<Box<F16Path>>,
    chosen: ConvImpl,
    m: usize,
    oh: usize,
    ow: usize,
}

/// Where a conv reads its input and which setups it runs with: the layer's own, or its FP16
/// way's (`ConvImpl::AsF16`).
struct ConvWay<'a> {
    input: u64,
    in_t: DType,
    in_scale: f32,
    gemm: Option<&'a GemmSetup>,
    cudnn: Option<&'a CudnnSetup>,
    /// Per-channel factor the epilogue applies to the raw output.
    alpha: u64,
}

pub struct CudaEngine {
    plan: Plan,
    bufs: Vec<DevBuf>,
    slot_of: Vec<usize>,
    convs: HashMap<usize, ConvRt>,
    /// Each step's `Step::constants()`, uploaded in that order (`None` for an empty one,
    /// which the kernels take as a null pointer: absent).
    consts: HashMap<usize, Vec<Option<DevBuf>>>,
    scratch: DevBuf,
    raw_off: usize,
    col_off: usize,
    f16_in_off: usize,
    ws_off: usize,
    graph: Option<cudarc::driver::CudaGraph>,
    /// The streams beside the main one that `schedule` puts steps on.
    aux: Vec<AuxStream>,
    /// Stream of each step and its waits; `None` while every step runs on the main stream.
    schedule: Option<Schedule>,
    /// Per step, the event recorded after it where a step on another stream waits for it.
    events: Vec<Option<CudaEvent>>,
    /// Stream the launches go to: 0 the main one, k the aux stream k - 1.
    lane: Cell<usize>,
    /// Set when a step takes the engine-wide scratch (raw output, im2col columns, FP16 input
    /// copy), which only the main stream owns.
    scratch_taken: Cell<bool>,
    info: EngineInfo,
    batch: usize,
    out_shape: Vec<usize>,
    /// FP32 convolutions and GEMMs may use TF32 tensor cores.
    tf32: bool,
    /// Last, so it is dropped last: cuDNN execution plans, cuBLASLt descriptors, the graph
    /// and the buffers above must go while the handles and the context they belong to live.
    dev: Device,
}

// The raw cuDNN / cuBLASLt handles are only used from the thread that owns the engine.
unsafe impl Send for CudaEngine {}

/// An auxiliary stream, with the library workspace of the steps that run on it (the main
/// stream's is in the engine's scratch).
struct AuxStream {
    stream: Arc<CudaStream>,
    ws: Option<DevBuf>,
    /// Recorded on the main stream before a run (this stream waits for it) and on this stream
    /// after its last step (the main stream waits for that).
    fork: CudaEvent,
    join: CudaEvent,
}

/// What the Layers tab calls a quantized type.
fn quant_name(t: DType) -> &'static str {
    if t == DType::F8 { "fp8" } else { "int8" }
}

fn round_up(v: usize, m: usize) -> usize {
    v.div_ceil(m) * m
}

impl CudaEngine {
    fn ptr(&self, t: usize) -> u64 {
        self.bufs[self.slot_of[t]].ptr
    }

    /// Builds the engine: buffers, weights, per-conv choice (timed, or from `cached`). `tf32`:
    /// an FP32 engine's convolutions and GEMMs may use TF32 tensor cores.
    pub fn build(
        dev: Device,
        plan: Plan,
        precision: Precision,
        tf32: bool,
        batch: usize,
        cached: &Choices,
    ) -> DevResult<(CudaEngine, Choices)> {
        drv(dev.ctx.bind_to_thread(), "binding the context")?;
        // Every step's sizes against its tensors, before anything is allocated: a planner bug
        // becomes an error naming the step, not an out-of-bounds access on the device.
        for s in &plan.steps {
            check_step(&plan, s).map_err(|e| format!("step `{}` ({}): {e}", s.name(), s.kind()))?;
        }
        let (free_before, _) = drv(result::mem_get_info(), "cuMemGetInfo")?;
        // Buffers are shared only between steps that stay ordered when every step that may
        // leave the main stream does (which ones do is known after the first run).
        let roots: Vec<usize> = (0..plan.tensors.len())
            .map(|t| plan.tensors[t].alias_of.unwrap_or(t))
            .collect();
        let draft = schedule(&plan, &roots, &vec![true; plan.steps.len()], AUX_STREAMS);
        let (slot_of, sizes) = assign_buffers(&plan, |a, b| draft.before(a, b));
        let mut bufs = vec![];
        for &s in &sizes {
            bufs.push(DevBuf::new(s)?);
        }
        let float = float_type(precision);
        // Scratch: raw conv output + im2col columns + FP16 copy of an int8 conv input (for
        // the FP16 way of int8 layers) + library workspace.
        let (mut raw_max, mut col_max, mut f16_in_max) = (0usize, 0usize, 0usize);
        let mut convs = HashMap::new();
        let mut weights_bytes = 0u64;
        for (si, s) in plan.steps.iter().enumerate() {
            if let Step::Conv(c) = s {
                let od = &plan.tensors[c.out];
                let (n, _, hw) = od.nchw();
                let m = n * hw;
                let (oh, ow) = if od.shape.len() == 4 {
                    (od.shape[2], od.shape[3])
                } else {
                    (1, 1)
                };
                let cout_pad = round_up(c.cout, 16);
                raw_max = raw_max.max(m * cout_pad * 4);
                let kpad = round_up(c.reduction(), 16);
                if c.groups == 1 {
                    let xd = &plan.tensors[c.input];
                    if c.quant.is_some() {
                        col_max = col_max.max(m * kpad);
                        f16_in_max = f16_in_max.max(xd.numel() * 2);
                    }
                    // The cuDNN graph conv's input with its channels padded.
                    let cin_pad = graph_cin(c.cin, xd.dtype);
                    if cin_pad != c.cin {
                        let copy = xd.numel() / c.cin * cin_pad * xd.dtype.bytes();
                        f16_in_max = f16_in_max.max(copy);
                    }
                    // Float GEMMs (an int8 layer's FP16 way included) need im2col columns.
                    let esz = if c.quant.is_some() { 2 } else { float.bytes() };
                    if m * kpad * esz <= COL_MAX_BYTES {
                        col_max = col_max.max(m * kpad * esz);
                    }
                } else if c.quant.is_some() {
                    f16_in_max = f16_in_max.max(plan.tensors[c.input].numel() * 2);
                }
                let alpha: Vec<f32> = match &c.quant {
                    Some(q) => q.w_scales.iter().map(|s| s * q.x_scale).collect(),
                    None => vec![1.0; c.cout],
                };
                let rt = ConvRt {
                    step: c.clone(),
                    alpha: DevBuf::from_slice(&alpha)?,
                    bias: DevBuf::from_slice(&c.bias)?,
                    direct_w: None,
                    kernel_w: None,
                    mma_w: None,
                    rows_w: None,
                    gemm: None,
                    gemm_fused: None,
                    cudnn: None,
                    dnn: None,
                    f16: None,
                    chosen: ConvImpl::Direct,
                    m,
                    oh,
                    ow,
                };
                weights_bytes += 8 * c.cout as u64;
                convs.insert(si, rt);
            }
        }
        // A split global average pool keeps its partial sums in the raw scratch too.
        for s in &plan.steps {
            if let Step::GlobalAvgPool { input, .. } = s {
                let x = &plan.tensors[*input];
                let (n, c, hw) = x.nchw();
                let splits = gap_splits(n, c, hw, x.dtype.bytes());
                if splits > 1 {
                    raw_max = raw_max.max(n * splits * c * 4);
                }
            }
        }
        let raw_off = 0;
        let col_off = round_up(raw_max, 256);
        let f16_in_off = col_off + round_up(col_max, 256);
        let ws_off = f16_in_off + round_up(f16_in_max, 256);
        let scratch = DevBuf::new(ws_off + LIB_WORKSPACE_BYTES)?;
        let mut consts = HashMap::new();
        for (si, s) in plan.steps.iter().enumerate() {
            let cs = s.constants();
            if cs.is_empty() {
                continue;
            }
            let mut bufs = Vec::with_capacity(cs.len());
            for c in cs {
                weights_bytes += std::mem::size_of_val(c) as u64;
                bufs.push(if c.is_empty() {
                    None
                } else {
                    Some(DevBuf::from_slice(c)?)
                });
            }
            consts.insert(si, bufs);
        }
        let mut eng = CudaEngine {
            dev,
            out_shape: plan.tensors[plan.output].shape.clone(),
            plan,
            bufs,
            slot_of,
            convs,
            consts,
            scratch,
            raw_off,
            col_off,
            f16_in_off,
            ws_off,
            graph: None,
            aux: vec![],
            schedule: None,
            events: vec![],
            lane: Cell::new(0),
            scratch_taken: Cell::new(false),
            info: EngineInfo::default(),
            batch,
            tf32: tf32 && float == DType::F32,
        };
        // Choose each conv's implementation, in execution order (inputs exist by then).
        let mut choices = Choices::default();
        let conv_ids: Vec<usize> = {
            let mut v: Vec<usize> = eng.convs.keys().copied().collect();
            v.sort();
            v
        };
        let choose_start = std::time::Instant::now();
        for si in conv_ids {
            let chosen = eng.choose_conv(si, float, cached)?;
            choices
                .convs
                .insert(eng.convs[&si].step.name.clone(), chosen.key());
        }
        for rt in eng.convs.values() {
            let f16 = rt.f16.as_deref();
            weights_bytes += [rt.direct_w.as_ref(), rt.kernel_w.as_ref()]
                .iter()
                .flatten()
                .map(|b| b.bytes as u64)
                .sum::<u64>()
                + [
                    rt.gemm.as_ref(),
                    rt.gemm_fused.as_ref(),
                    f16.and_then(|f| f.gemm.as_ref()),
                ]
                .iter()
                .flatten()
                .map(|g| g.w.bytes as u64)
                .sum::<u64>()
                + rt.dnn.as_ref().map_or(0, |d| d.w.bytes as u64)
                + [rt.cudnn.as_ref(), f16.and_then(|f| f.cudnn.as_ref())]
                    .iter()
                    .flatten()
                    .map(|c| c.w.bytes as u64)
                    .sum::<u64>();
        }
        drv(eng.dev.stream.synchronize(), "synchronize")?;
        // A first run on the main stream, which also tells which steps take the main stream's
        // scratch; then the streams, the per-layer times and the graph.
        let mut movable = vec![];
        for si in 0..eng.plan.steps.len() {
            eng.scratch_taken.set(false);
            eng.run_step(si)
                .map_err(|e| format!("step `{}`: {e}", eng.plan.steps[si].name()))?;
            movable.push(!eng.scratch_taken.get());
        }
        drv(eng.dev.stream.synchronize(), "first run")?;
        eng.set_up_streams(&movable)?;
        let profile_start = std::time::Instant::now();
        let layer_times = eng.profile_layers(precision)?;
        let capture_start = std::time::Instant::now();
        let graph_note = match eng.capture() {
            Ok(()) => match &eng.schedule {
                Some(s) => format!(
                    "CUDA graph, {} steps on {} streams beside the main one",
                    s.aux_steps(),
                    s.streams - 1
                ),
                None => "CUDA graph".to_string(),
            },
            Err(e) => format!("eager launches (graph capture failed: {e})"),
        };
        log_msg(&format!(
            "{precision} batch {batch}: conv choices {:.0} ms, layer profile {:.0} ms, graph capture {:.0} ms",
            (profile_start - choose_start).as_secs_f64() * 1e3,
            (capture_start - profile_start).as_secs_f64() * 1e3,
            capture_start.elapsed().as_secs_f64() * 1e3
        ));
        let (free_after, _) = drv(result::mem_get_info(), "cuMemGetInfo")?;
        eng.info = EngineInfo {
            backend: "cuda".into(),
            device: format!(
                "{} ({graph_note}; float layers {})",
                eng.dev.name,
                match float {
                    DType::F16 => "FP16",
                    _ if eng.tf32 => "FP32 with TF32 tensor cores",
                    _ => "FP32",
                }
            ),
            simulated: false,
            tf32: eng.tf32,
            threads: None,
            int8_nodes: eng.plan.int8_nodes.len(),
            float_nodes: eng.plan.float_nodes.clone(),
            weights_bytes,
            activations_bytes: eng.bufs.iter().map(|b| b.bytes as u64).sum(),
            workspace_bytes: eng.scratch.bytes as u64
                + eng
                    .aux
                    .iter()
                    .filter_map(|a| a.ws.as_ref())
                    .map(|b| b.bytes as u64)
                    .sum::<u64>(),
            device_mem_bytes: Some(free_before.saturating_sub(free_after) as u64),
            layer_times,
            engine: None,
        };
        Ok((eng, choices))
    }

    fn raw_ptr(&self) -> u64 {
        self.scratch_taken.set(true);
        self.scratch.ptr + self.raw_off as u64
    }
    fn col_ptr(&self) -> u64 {
        self.scratch_taken.set(true);
        self.scratch.ptr + self.col_off as u64
    }
    fn f16_in_ptr(&self) -> u64 {
        self.scratch_taken.set(true);
        self.scratch.ptr + self.f16_in_off as u64
    }
    /// The library workspace of the stream launches go to, and its bytes.
    fn ws(&self) -> (u64, usize) {
        match self.lane.get() {
            0 => (self.scratch.ptr + self.ws_off as u64, LIB_WORKSPACE_BYTES),
            k => self.aux[k - 1]
                .ws
                .as_ref()
                .map_or((0, 0), |b| (b.ptr, b.bytes)),
        }
    }
    fn ws_ptr(&self) -> u64 {
        self.ws().0
    }
    /// The stream launches go to.
    fn stream(&self) -> &Arc<CudaStream> {
        match self.lane.get() {
            0 => &self.dev.stream,
            k => &self.aux[k - 1].stream,
        }
    }

    /// Library workspace bytes step `si` needs with its chosen implementation.
    fn ws_need(&self, si: usize) -> usize {
        let Some(rt) = self.convs.get(&si) else {
            return 0;
        };
        match &rt.chosen {
            ConvImpl::CudnnGraph { plan } => rt.dnn.as_ref().map_or(0, |d| d.graph.plans[*plan].1),
            ConvImpl::Gemm { algo, .. } => {
                rt.gemm.as_ref().map_or(0, |g| g.algos[*algo].workspaceSize)
            }
            ConvImpl::GemmFused { algo, .. } => rt
                .gemm_fused
                .as_ref()
                .map_or(0, |g| g.algos[*algo].workspaceSize),
            ConvImpl::Cudnn { .. } | ConvImpl::AsF16(_) => LIB_WORKSPACE_BYTES,
            ConvImpl::Direct
            | ConvImpl::Depthwise
            | ConvImpl::DepthwiseRows { .. }
            | ConvImpl::Pointwise
            | ConvImpl::PointwiseWord
            | ConvImpl::Mma { .. }
            | ConvImpl::MmaStream { .. }
            | ConvImpl::MmaRows => 0,
        }
    }

    /// Puts independent branches on auxiliary streams (`streams::schedule`), each with a
    /// workspace as large as its steps need. `movable[s]`: step `s` took none of the main
    /// stream's scratch in the first run. Leaves everything on the main stream where no step
    /// has a branch to run beside.
    fn set_up_streams(&mut self, movable: &[bool]) -> DevResult<()> {
        let sch = schedule(&self.plan, &self.slot_of, movable, AUX_STREAMS);
        if sch.streams == 1 {
            return Ok(());
        }
        let mut need = vec![0usize; sch.streams - 1];
        for (si, &k) in sch.stream.iter().enumerate() {
            if k > 0 {
                need[k - 1] = need[k - 1].max(self.ws_need(si));
            }
        }
        for bytes in need {
            self.aux.push(AuxStream {
                stream: drv(self.dev.ctx.new_stream(), "creating a stream")?,
                ws: if bytes > 0 {
                    Some(DevBuf::new(bytes)?)
                } else {
                    None
                },
                fork: drv(self.dev.ctx.new_event(None), "event")?,
                join: drv(self.dev.ctx.new_event(None), "event")?,
            });
        }
        self.events = sch
            .signalled()
            .into_iter()
            .map(|e| {
                e.then(|| drv(self.dev.ctx.new_event(None), "event"))
                    .transpose()
            })
            .collect::<DevResult<_>>()?;
        for (si, s) in self.plan.steps.iter().enumerate() {
            if sch.stream[si] > 0 || !sch.waits[si].is_empty() {
                let waits: Vec<&str> = sch.waits[si]
                    .iter()
                    .map(|&w| self.plan.steps[w].name())
                    .collect();
                log_msg(&format!(
                    "stream {}: `{}` after {waits:?}",
                    sch.stream[si],
                    s.name()
                ));
            }
        }
        self.schedule = Some(sch);
        Ok(())
    }

    /// Makes launches go to stream `lane`, cuDNN's included.
    fn set_lane(&self, lane: usize) -> DevResult<()> {
        if self.lane.replace(lane) != lane {
            dnn_ok(
                unsafe { dnn::cudnnSetStream(self.dev.cudnn, self.stream().cu_stream() as _) },
                "cudnnSetStream",
            )?;
        }
        Ok(())
    }

    fn choose_conv(&mut self, si: usize, float: DType, cached: &Choices) -> DevResult<ConvImpl> {
        let (step, m) = {
            let rt = &self.convs[&si];
            (rt.step.clone(), rt.m)
        };
        let quant = step.quant.is_some();
        // Int8 layers have integer library paths; FP8 layers have the cuDNN graph's FP8 conv
        // and the float kernels reading FP8 (direct, depthwise, the FP16 way).
        let int8 = step.quant.as_ref().is_some_and(|q| q.is_int8());
        let fp8 = quant && !int8;
        let macs = (m * step.cout * step.reduction()) as f64;
        let name = step.name.clone();
        let note = |what: &str, e: String| log_msg(&format!("{name}: no {what} ({e})"));
        let setup_start = std::time::Instant::now();
        // Set up every applicable implementation, each in the layer's planned precision, and
        // for an int8 layer its FP16 way too ("FP16 vs INT8 where the plan allows").
        // A GEMM that is not a plain 1x1 reads im2col columns from the scratch, which `build`
        // sized for float columns up to COL_MAX_BYTES only (int8 columns always).
        let cols_fit = int8
            || step.is_pointwise()
            || m * round_up(step.reduction(), 16) * float.bytes() <= COL_MAX_BYTES;
        let gemm_ok = step.groups == 1 && !fp8 && cols_fit;
        let mut rt_gemm = None;
        if gemm_ok {
            rt_gemm = self
                .setup_gemm(&step, m, float)
                .map_err(|e| note("cuBLASLt GEMM", e))
                .ok();
        }
        let mut rt_gemm_fused = None;
        if cols_fit && self.gemm_fused_ok(&step, float) {
            rt_gemm_fused = self
                .setup_gemm_fused(&step, m, float)
                .map_err(|e| note("fused-epilogue cuBLASLt GEMM", e))
                .ok();
        }
        let mut rt_dnn = None;
        if self.dnn_graph_ok(&step) {
            rt_dnn = self
                .setup_dnn_graph(&step)
                .map_err(|e| note("cuDNN graph conv", e))
                .ok();
        }
        let mut rt_cudnn = None;
        if !quant && symmetric_pads(&step) {
            rt_cudnn = self
                .setup_cudnn(&step, float, self.ptr(step.input))
                .map_err(|e| note("cuDNN conv", e))
                .ok();
        }
        let rt_f16 = if quant {
            self.setup_f16_path(&step, m)
                .map_err(|e| note("FP16 way", e))
                .ok()
                .flatten()
        } else {
            None
        };
        let im2col = |g: &GemmSetup| !(step.is_pointwise() && g.kpad == step.cin);
        let mut cands: Vec<ConvImpl> = vec![];
        let gemms = |g: &GemmSetup, f: &dyn Fn(usize, bool) -> ConvImpl| {
            (0..g.algos.len().min(3))
                .map(|a| f(a, im2col(g)))
                .collect::<Vec<_>>()
        };
        let cudnns = |c: &CudnnSetup| {
            c.algos
                .iter()
                .take(3)
                .map(|&(algo, _)| ConvImpl::Cudnn { algo })
                .collect::<Vec<_>>()
        };
        if let Some(g) = &rt_gemm {
            cands.extend(gemms(g, &|algo, im2col| ConvImpl::Gemm { algo, im2col }));
        }
        if let Some(g) = &rt_gemm_fused {
            cands.extend(gemms(g, &|algo, im2col| ConvImpl::GemmFused {
                algo,
                im2col,
            }));
        }
        if let Some(c) = &rt_cudnn {
            cands.extend(cudnns(c));
        }
        if let Some(d) = &rt_dnn {
            cands.extend((0..d.graph.plans.len()).map(|plan| ConvImpl::CudnnGraph { plan }));
        }
        if self.depthwise_ok(&step) {
            let w = self.depthwise_weights(&step, float)?;
            self.convs.get_mut(&si).expect("conv").kernel_w = Some(w);
            cands.push(ConvImpl::Depthwise);
        }
        if let Some(kernel) = self.depthwise_rows(&step) {
            let w = self.depthwise_rows_weights(&step)?;
            self.convs.get_mut(&si).expect("conv").rows_w = Some(w);
            cands.push(ConvImpl::DepthwiseRows { kernel });
        }
        if self.pointwise_ok(&step, m) {
            let w = self.pointwise_weights(&step)?;
            self.convs.get_mut(&si).expect("conv").kernel_w = Some(w);
            if PW_CO * step.cin <= PW_MAX_SHARED_BYTES {
                cands.push(ConvImpl::Pointwise);
            }
            cands.push(ConvImpl::PointwiseWord);
        }
        if self.mma_ok(&step, m) {
            let w = self.mma_weights(&step)?;
            self.convs.get_mut(&si).expect("conv").mma_w = Some(w);
            cands.push(ConvImpl::Mma { bm: MMA_BM });
            // Half-height tiles while their row tiles fit the grid's y limit too.
            if m.div_ceil(MMA_BM / 2) <= u16::MAX as usize {
                cands.push(ConvImpl::Mma { bm: MMA_BM / 2 });
            }
            if self.mma_rows_ok(&step) {
                cands.push(ConvImpl::MmaRows);
            }
            cands.extend(
                [MMA_BM, MMA_BM / 2]
                    .into_iter()
                    .filter(|&bm| self.mma_stream_ok(&step, m, bm))
                    .map(|bm| ConvImpl::MmaStream { bm }),
            );
        }
        if let Some(f) = &rt_f16 {
            let mut inner = vec![];
            if let Some(g) = &f.gemm {
                inner.extend(gemms(g, &|algo, im2col| ConvImpl::Gemm { algo, im2col }));
            }
            if let Some(c) = &f.cudnn {
                inner.extend(cudnns(c));
            }
            cands.extend(inner.into_iter().map(|i| ConvImpl::AsF16(Box::new(i))));
        }
        {
            let rt = self.convs.get_mut(&si).expect("conv");
            rt.gemm = rt_gemm;
            rt.gemm_fused = rt_gemm_fused;
            rt.cudnn = rt_cudnn;
            rt.dnn = rt_dnn;
            rt.f16 = rt_f16;
        }
        if cands.is_empty() || macs < DIRECT_MAX_MACS {
            let w = match &step.quant {
                Some(q) if q.is_int8() => DevBuf::from_slice(&q.w)?,
                // FP8: the kernel's float path reads the FP8 input; weights as their values.
                Some(q) => DevBuf::from_slice(&q.values())?,
                None => {
                    let v: Vec<f32> = if float == DType::F16 {
                        step.w
                            .iter()
                            .map(|&x| half::f16::from_f32(x).to_f32())
                            .collect()
                    } else {
                        step.w.clone()
                    };
                    DevBuf::from_slice(&v)?
                }
            };
            self.convs.get_mut(&si).expect("conv").direct_w = Some(w);
            cands.push(ConvImpl::Direct);
        }
        // A cached key picks its candidate; a key without its algorithm (`gemmf`, `f16+cudnn`)
        // picks the first of that family, which is how the tests force an implementation.
        let cached_pick = cached
            .convs
            .get(&step.name)
            .and_then(|k| cands.iter().find(|c| c.answers(k)));
        let pick = if let Some(c) = cached_pick {
            c.clone()
        } else if cands.len() == 1 {
            cands[0].clone()
        } else {
            let setup_ms = setup_start.elapsed().as_secs_f64() * 1e3;
            let timing_start = std::time::Instant::now();
            // Candidates are timed in rounds, each round every candidate once, so that clock
            // changes during the build weigh on all of them alike; each timing averages
            // back-to-back launches (a layer of 10-20 µs timed launch by launch picked
            // different cuDNN plans from one build to the next, 5 % apart end to end).
            let mut times: Vec<Option<Vec<f64>>> = vec![Some(vec![]); cands.len()];
            for _ in 0..CHOICE_ROUNDS {
                for (c, ts) in cands.iter().zip(times.iter_mut()) {
                    let Some(v) = ts else { continue };
                    self.convs.get_mut(&si).expect("conv").chosen = c.clone();
                    match self.time_launches(si) {
                        Ok(t) => v.push(t),
                        Err(e) => {
                            log_msg(&format!("{}: candidate {} failed: {e}", step.name, c.key()));
                            *ts = None;
                        }
                    }
                }
            }
            let median = |v: &Vec<f64>| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
            };
            let timed: Vec<(f64, &ConvImpl)> = cands
                .iter()
                .zip(&times)
                .filter_map(|(c, t)| t.as_ref().map(|t| (median(t), c)))
                .collect();
            log_msg(&format!(
                "{}: {} (set up in {setup_ms:.0} ms, timed in {:.0} ms)",
                step.name,
                timed
                    .iter()
                    .map(|(t, c)| format!("{} {:.1} us", c.key(), t * 1e3))
                    .collect::<Vec<_>>()
                    .join(", "),
                timing_start.elapsed().as_secs_f64() * 1e3
            ));
            timed
                .into_iter()
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map_or_else(|| cands[0].clone(), |(_, c)| c.clone())
        };
        let rt = self.convs.get_mut(&si).expect("conv");
        rt.chosen = pick.clone();
        // Keep only what the choice needs.
        if !matches!(pick, ConvImpl::Gemm { .. }) {
            rt.gemm = None;
        }
        if !matches!(pick, ConvImpl::GemmFused { .. }) {
            rt.gemm_fused = None;
        }
        if !matches!(pick, ConvImpl::Cudnn { .. }) {
            rt.cudnn = None;
        }
        if !matches!(pick, ConvImpl::CudnnGraph { .. }) {
            rt.dnn = None;
        }
        if !matches!(
            pick,
            ConvImpl::Depthwise | ConvImpl::Pointwise | ConvImpl::PointwiseWord
        ) {
            rt.kernel_w = None;
        }
        if !matches!(
            pick,
            ConvImpl::Mma { .. } | ConvImpl::MmaStream { .. } | ConvImpl::MmaRows
        ) {
            rt.mma_w = None;
        }
        if !matches!(pick, ConvImpl::DepthwiseRows { .. }) {
            rt.rows_w = None;
        }
        match &pick {
            ConvImpl::AsF16(inner) => {
                if let Some(f) = rt.f16.as_deref_mut() {
                    if !matches!(**inner, ConvImpl::Gemm { .. }) {
                        f.gemm = None;
                    }
                    if !matches!(**inner, ConvImpl::Cudnn { .. }) {
                        f.cudnn = None;
                    }
                }
            }
            _ => rt.f16 = None,
        }
        if pick != ConvImpl::Direct {
            rt.direct_w = None;
        }
        Ok(pick)
    }

    /// Whether cuBLASLt can write this layer's output itself: the output in the GEMM's type
    /// (int8 for an int8 layer, else the engine's float type), ReLU or no activation, a
    /// residual of the output's type, and output channels that keep the rows 16-byte aligned.
    fn gemm_fused_ok(&self, c: &ConvStep, float: DType) -> bool {
        let od = &self.plan.tensors[c.out];
        let out_t = if c.quant.is_some() { DType::I8 } else { float };
        c.quant.as_ref().is_none_or(|q| q.is_int8())
            && c.groups == 1
            && od.dtype == out_t
            && matches!(c.act, Act::None | Act::Relu)
            && (c.cout * out_t.bytes()).is_multiple_of(16)
            && c.residual
                .is_none_or(|r| self.plan.tensors[r].dtype == out_t)
    }

    /// The activation a cuDNN graph conv ends with, in output units; `None` when the graph
    /// has none for this layer's.
    fn graph_act(&self, c: &ConvStep) -> Option<GraphAct> {
        let od = &self.plan.tensors[c.out];
        let unit = od.unit();
        let act = match c.act {
            Act::None => GraphAct::None,
            Act::Relu => GraphAct::Relu,
            Act::Clip(lo, hi) if lo < hi => GraphAct::Clip(lo / unit, hi / unit),
            Act::Silu => GraphAct::Swish(unit),
            _ => return None,
        };
        if od.dtype != DType::F8 {
            return Some(act);
        }
        // An FP8 output saturates at +-448 steps, as QuantizeLinear and the kernels' `st` do:
        // the clip says so rather than trusting the library's conversion.
        const MAX: f32 = crate::quant::fp8::E4M3_MAX;
        Some(match act {
            GraphAct::None => GraphAct::Clip(-MAX, MAX),
            GraphAct::Relu => GraphAct::Clip(0.0, MAX),
            GraphAct::Clip(lo, hi) => GraphAct::Clip(lo.max(-MAX), hi.min(MAX)),
            // The graph ends in one activation: Swish leaves no op for the clip.
            GraphAct::Swish(_) => return None,
        })
    }

    /// Whether the cuDNN graph conv can run this layer: an int8 layer (int8 or FP16 output),
    /// an FP8 one (FP8 or FP16 output) or an FP16 one (FP16 output), ReLU, clip, SiLU or no
    /// activation, a residual of int8 or FP16 (or FP8, in an FP8 layer), and 16-byte aligned
    /// output rows (input channels are padded where they are not). FP32
    /// layers keep the legacy path: its algorithm
    /// list is what `--fp32-math strict` can hold to IEEE FP32.
    fn dnn_graph_ok(&self, c: &ConvStep) -> bool {
        let t = |t: usize| self.plan.tensors[t].dtype;
        let io = |x: usize| matches!(t(x), DType::I8 | DType::F16);
        let fp8 = c.quant.as_ref().is_some_and(|q| q.dtype == DType::F8);
        let out_ok = if let Some(q) = &c.quant {
            t(c.input) == q.dtype && (t(c.out) == q.dtype || t(c.out) == DType::F16)
        } else {
            t(c.input) == DType::F16 && t(c.out) == DType::F16
        };
        c.groups == 1
            && out_ok
            && self.graph_act(c).is_some()
            && c.cout.is_multiple_of(16)
            && c.residual
                .is_none_or(|r| io(r) || (fp8 && t(r) == DType::F8))
    }

    /// Whether the depthwise kernel takes this layer: one input channel per group and one
    /// output per channel, a multiple of 4 channels, 2-D, an input it reads, tensors its
    /// 32-bit indices reach.
    fn depthwise_ok(&self, c: &ConvStep) -> bool {
        let xd = &self.plan.tensors[c.input];
        let input_ok = match xd.dtype {
            DType::I8 | DType::F8 => c.quant.as_ref().is_some_and(|q| q.dtype == xd.dtype),
            DType::F16 | DType::F32 => c.quant.is_none(),
        };
        let fits_i32 = |t: usize| self.plan.tensors[t].numel() < i32::MAX as usize;
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
    fn depthwise_rows(&self, c: &ConvStep) -> Option<usize> {
        let shape = DW_ROWS_SHAPES
            .iter()
            .position(|&s| (c.k[0], c.stride[0]) == s)?;
        (self.depthwise_ok(c)
            && c.quant.as_ref().is_some_and(|q| q.is_int8())
            && self.plan.tensors[c.input].dtype == DType::I8
            && c.k[0] == c.k[1]
            && c.stride[0] == c.stride[1]
            && c.dilation == [1, 1])
        .then_some(shape)
    }

    /// The row-window depthwise kernel's weights: int8 `[KH][ceil(KW / 4)][C][4]`, a row's taps
    /// in groups of four, zeros past the row's last tap.
    fn depthwise_rows_weights(&self, c: &ConvStep) -> DevResult<DevBuf> {
        let q = c
            .quant
            .as_ref()
            .ok_or("depthwise row kernel: not an int8 layer")?;
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

    /// Whether the int8 pointwise kernels (`conv_pw_i8`, `conv_pw_i8_word`) take this layer:
    /// an int8 1x1 conv (or Gemm / MatMul) reading int8, 4-byte rows in and out, and 32-bit
    /// indices (`m` rows). `conv_pw_i8` also needs a block's weight rows within
    /// `PW_MAX_SHARED_BYTES`.
    fn pointwise_ok(&self, c: &ConvStep, m: usize) -> bool {
        let xd = &self.plan.tensors[c.input];
        c.quant.as_ref().is_some_and(|q| q.is_int8())
            && xd.dtype == DType::I8
            && c.is_pointwise()
            && c.cin.is_multiple_of(4)
            && c.cout.is_multiple_of(4)
            && m.saturating_mul(c.cin.max(c.cout)) < i32::MAX as usize
    }

    /// Whether the int8 tensor-core kernel (`conv_i8_mma`) takes this layer: an int8 conv of
    /// one group reading int8 (NHWC, or rows for a 1x1 one), a tap's input channels in whole
    /// 16-byte copies, output rows of 4-byte groups, 32-bit row indices and input offsets and
    /// row tiles within the grid's y limit, on a GPU of compute capability 8.0 or more.
    fn mma_ok(&self, c: &ConvStep, m: usize) -> bool {
        let xd = &self.plan.tensors[c.input];
        c.quant.as_ref().is_some_and(|q| q.is_int8())
            && self.dev.compute >= MMA_COMPUTE
            && xd.dtype == DType::I8
            && c.groups == 1
            && (xd.shape.len() == 4 || c.is_pointwise())
            && c.cin.is_multiple_of(16)
            && c.cout.is_multiple_of(4)
            && m < i32::MAX as usize
            && xd.numel() < i32::MAX as usize
            && m.div_ceil(MMA_BM) <= u16::MAX as usize
    }

    /// Whether the row-at-a-time tensor-core kernel runs int8 conv `c` (on top of `mma_ok`):
    /// stride 1, no dilation, 16 input channels, an even kernel width, rows of at most
    /// ROWS_MAX_OW pixels, and its shared memory within ROWS_MAX_SMEM.
    fn mma_rows_ok(&self, c: &ConvStep) -> bool {
        let od = &self.plan.tensors[c.out];
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

    /// Whether the streaming 1x1 tensor-core kernel runs int8 conv `c` of `m` output pixels in
    /// `bm`-pixel tiles (on top of `mma_ok`): pointwise (Gemm / MatMul rows are), a reduction
    /// of MMAS_KPADS, output channels in whole 16-byte pieces, input and output offsets below
    /// 2^31 up to the last tile's end (32-bit offsets), its shared memory within MMAS_MAX_SMEM, and an epilogue the int8 one
    /// in registers computes: int8 output, int8 residual or none, an activation of
    /// `epi_i8_ok`. (Tensors start buffers, 256-byte aligned.)
    fn mma_stream_ok(&self, c: &ConvStep, m: usize, bm: usize) -> bool {
        let od = &self.plan.tensors[c.out];
        let kpad = round_up(c.reduction(), MMA_BK);
        c.is_pointwise()
            && (m + bm) * c.cin.max(c.cout) < i32::MAX as usize
            && MMAS_KPADS.contains(&kpad)
            && c.cout.is_multiple_of(16)
            && mmas_smem_bytes(bm, kpad) <= MMAS_MAX_SMEM
            && epi_i8_ok(
                od.dtype,
                c.residual.map(|r| self.plan.tensors[r].dtype),
                c.act,
            )
    }

    /// The tensor-core kernel's weights: int8 OHWI rows, `[cout rounded up to MMA_BN]` by
    /// `[KH * KW * Cin rounded up to MMA_BK]`, zero in the padding (whole tiles: no bounds
    /// checks on the weight side).
    fn mma_weights(&self, c: &ConvStep) -> DevResult<DevBuf> {
        let q = c
            .quant
            .as_ref()
            .ok_or("tensor-core kernel: not an int8 layer")?;
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

    /// The pointwise kernels' weights: 32-bit words `[cin / 4, cout]`, word `v * cout + c`
    /// holding the int8 weights `[c][4v .. 4v + 4]` (a thread of `conv_pw_i8_word` reads its
    /// four channels' words as one 16-byte vector).
    fn pointwise_weights(&self, c: &ConvStep) -> DevResult<DevBuf> {
        let q = c
            .quant
            .as_ref()
            .ok_or("pointwise kernel: not an int8 layer")?;
        let w: Vec<i8> = (0..c.cout * c.cin)
            .map(|i| {
                let (v, ch, j) = (i / (4 * c.cout), i / 4 % c.cout, i % 4);
                q.w[ch * c.cin + 4 * v + j]
            })
            .collect();
        DevBuf::from_slice(&w)
    }

    /// The depthwise kernel's weights: int8 as `[ceil(KH * KW / 4), C, 4]`, float tap-major
    /// `[KH * KW, C]` as the engine's float type would round them (kept in f32), FP8 as their
    /// values tap-major (the kernel's float path reads the FP8 input).
    fn depthwise_weights(&self, c: &ConvStep, float: DType) -> DevResult<DevBuf> {
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

    /// The cuDNN graph conv of a layer (`ConvImpl::CudnnGraph`): its execution plans, weights
    /// as they are (OHWI is cuDNN's KRSC; FP16 for a float layer), and for an int8 layer the
    /// scale; scale and bias in output units (a float output's unit is 1).
    fn setup_dnn_graph(&self, c: &ConvStep) -> DevResult<DnnConv> {
        let (xd, od) = (&self.plan.tensors[c.input], &self.plan.tensors[c.out]);
        let hw = |s: &[usize]| if s.len() == 4 { (s[2], s[3]) } else { (1, 1) };
        let ((h, w), (oh, ow)) = (hw(&xd.shape), hw(&od.shape));
        let cin_pad = graph_cin(c.cin, xd.dtype);
        let g = Geometry {
            n: xd.shape[0],
            c: cin_pad,
            h,
            w,
            k: c.cout,
            kh: c.k[0],
            kw: c.k[1],
            oh,
            ow,
            pads_pre: [c.pads[0], c.pads[1]],
            pads_post: [c.pads[2], c.pads[3]],
            stride: c.stride,
            dilation: c.dilation,
        };
        let dt = |t: DType| match t {
            DType::I8 => dnn::cudnnDataType_t::CUDNN_DATA_INT8,
            DType::F8 => dnn::cudnnDataType_t::CUDNN_DATA_FP8_E4M3,
            DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
            DType::F32 => dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        };
        // OHWI rows of `cin` values, zero padded to `cin_pad`.
        let taps = c.cout * c.k[0] * c.k[1];
        let pad_in = |v: &[f32]| padded_rows(v, taps, c.cin, taps, cin_pad);
        let split = c
            .residual
            .is_some_and(|r| self.plan.tensors[r].dtype == DType::F8);
        let unit = if split { 1.0 } else { od.unit() };
        let residual = c.residual.filter(|_| !split).map(|r| {
            let rd = &self.plan.tensors[r];
            (rd.unit() / unit, dt(rd.dtype))
        });
        let spec = ConvSpec {
            input: dt(xd.dtype),
            scale: c.quant.is_some(),
            residual,
            act: if split {
                GraphAct::None
            } else {
                self.graph_act(c).ok_or("activation not fusable")?
            },
            out: dt(if split { DType::F16 } else { od.dtype }),
        };
        let graph = ConvGraph::new(self.dev.cudnn, g, spec, LIB_WORKSPACE_BYTES, DNN_PLANS)?;
        let bias: Vec<f32> = c.bias.iter().map(|b| b / unit).collect();
        let (w, scale) = match &c.quant {
            Some(q) => {
                let scale: Vec<f32> = q.w_scales.iter().map(|s| s * q.x_scale / unit).collect();
                let w = padded_rows(&q.w, taps, c.cin, taps, cin_pad);
                (DevBuf::from_slice(&w)?, Some(DevBuf::from_slice(&scale)?))
            }
            None => {
                let h: Vec<half::f16> = pad_in(&c.w)
                    .iter()
                    .map(|&v| half::f16::from_f32(v))
                    .collect();
                (DevBuf::from_slice(&h)?, None)
            }
        };
        let split = if split {
            Some((
                DevBuf::from_slice(&vec![1.0f32; c.cout])?,
                DevBuf::from_slice(&vec![0.0f32; c.cout])?,
            ))
        } else {
            None
        };
        Ok(DnnConv {
            graph,
            w,
            scale,
            bias: DevBuf::from_slice(&bias)?,
            cin_pad,
            split,
        })
    }

    /// The FP16 way of an int8 layer: the layer with dequantized weights, set up for the float
    /// implementations. `None` when none applies.
    fn setup_f16_path(&self, c: &ConvStep, m: usize) -> DevResult<Option<Box<F16Path>>> {
        let q = c.quant.as_ref().ok_or("not a quantized layer")?;
        let k = c.reduction();
        let mut fs = c.clone();
        fs.w = q
            .values()
            .iter()
            .enumerate()
            .map(|(i, &v)| v * q.w_scales[i / k])
            .collect();
        fs.quant = None;
        let gemm =
            if c.groups == 1 && (c.is_pointwise() || m * round_up(k, 16) * 2 <= COL_MAX_BYTES) {
                Some(self.setup_gemm(&fs, m, DType::F16)?)
            } else {
                None
            };
        let cudnn = if symmetric_pads(c) {
            Some(self.setup_cudnn(&fs, DType::F16, self.f16_in_ptr())?)
        } else {
            None
        };
        if gemm.is_none() && cudnn.is_none() {
            return Ok(None);
        }
        Ok(Some(Box::new(F16Path {
            ones: DevBuf::from_slice(&vec![1.0f32; c.cout])?,
            gemm,
            cudnn,
        })))
    }

    fn setup_gemm(&self, c: &ConvStep, m: usize, float: DType) -> DevResult<GemmSetup> {
        if c.quant.as_ref().is_some_and(|q| !q.is_int8()) {
            return Err("no cuBLASLt GEMM for FP8 layers (their FP16 way has one)".into());
        }
        let int8 = c.quant.is_some();
        let k = c.reduction();
        let kpad = round_up(k, 16);
        let cout_pad = round_up(c.cout, 16);
        let (ab_t, d_t, compute, scale_t) = if int8 {
            (
                lt::cudaDataType_t::CUDA_R_8I,
                lt::cudaDataType_t::CUDA_R_32I,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32I,
                lt::cudaDataType_t::CUDA_R_32I,
            )
        } else if float == DType::F16 {
            (
                lt::cudaDataType_t::CUDA_R_16F,
                lt::cudaDataType_t::CUDA_R_16F,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType_t::CUDA_R_32F,
            )
        } else {
            (
                lt::cudaDataType_t::CUDA_R_32F,
                lt::cudaDataType_t::CUDA_R_32F,
                if self.tf32 {
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
                } else {
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F
                },
                lt::cudaDataType_t::CUDA_R_32F,
            )
        };
        // Weights [cout_pad, kpad], zero padded.
        let w = if let Some(q) = &c.quant {
            DevBuf::from_slice(&padded_rows(&q.w, c.cout, k, cout_pad, kpad))?
        } else {
            let v = padded_rows(&c.w, c.cout, k, cout_pad, kpad);
            if float == DType::F16 {
                let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                DevBuf::from_slice(&h)?
            } else {
                DevBuf::from_slice(&v)?
            }
        };
        let desc = GemmDesc::new(compute, scale_t)?;
        self.finish_gemm(desc, ab_t, d_t, w, kpad, cout_pad, m, int8, None)
    }

    /// The GEMM that writes the layer's output from its own epilogue (`ConvImpl::GemmFused`):
    /// the bias and ReLU as cuBLASLt epilogues, the residual as beta * C. An int8 layer's
    /// per-channel alpha is a device vector and everything is in the output's int8 units; a
    /// float layer's bias is in the output's type (cuBLASLt's default for FP16 / FP32 D).
    fn setup_gemm_fused(&self, c: &ConvStep, m: usize, float: DType) -> DevResult<GemmSetup> {
        if c.quant.as_ref().is_some_and(|q| !q.is_int8()) {
            return Err("no cuBLASLt GEMM for FP8 layers".into());
        }
        let od = &self.plan.tensors[c.out];
        let unit = od.unit();
        let k = c.reduction();
        let kpad = round_up(k, 16);
        let beta = c.residual.map(|r| self.plan.tensors[r].unit() / unit);
        let bias: Vec<f32> = c.bias.iter().map(|b| b / unit).collect();
        use lt::cublasLtMatmulDescAttributes_t as A;
        use lt::cublasLtPointerMode_t as M;
        use lt::cudaDataType_t as T;
        let (desc, ab_t, w, fused, bias_t) = if let Some(q) = &c.quant {
            let alpha: Vec<f32> = q.w_scales.iter().map(|s| s * q.x_scale / unit).collect();
            let fused = FusedOut {
                alpha: Some(DevBuf::from_slice(&alpha)?),
                bias: DevBuf::from_slice(&bias)?,
                beta,
            };
            let desc = GemmDesc::new(lt::cublasComputeType_t::CUBLAS_COMPUTE_32I, T::CUDA_R_32F)?;
            let mode = if beta.is_some() {
                M::CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST
            } else {
                M::CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO
            };
            desc.set(A::CUBLASLT_MATMUL_DESC_POINTER_MODE, &(mode as i32))?;
            let w = DevBuf::from_slice(&padded_rows(&q.w, c.cout, k, c.cout, kpad))?;
            (desc, T::CUDA_R_8I, w, fused, T::CUDA_R_32F)
        } else {
            let rows = padded_rows(&c.w, c.cout, k, c.cout, kpad);
            let (compute, ab_t, w, bias_buf) = if float == DType::F16 {
                let h = |v: &[f32]| -> Vec<half::f16> {
                    v.iter().map(|&x| half::f16::from_f32(x)).collect()
                };
                (
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    T::CUDA_R_16F,
                    DevBuf::from_slice(&h(&rows))?,
                    DevBuf::from_slice(&h(&bias))?,
                )
            } else {
                (
                    if self.tf32 {
                        lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
                    } else {
                        lt::cublasComputeType_t::CUBLAS_COMPUTE_32F
                    },
                    T::CUDA_R_32F,
                    DevBuf::from_slice(&rows)?,
                    DevBuf::from_slice(&bias)?,
                )
            };
            let fused = FusedOut {
                alpha: None,
                bias: bias_buf,
                beta,
            };
            (GemmDesc::new(compute, T::CUDA_R_32F)?, ab_t, w, fused, ab_t)
        };
        let epi = if c.act == Act::Relu {
            lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS
        } else {
            lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        };
        desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE, &(epi as u32))?;
        let bias_ptr = fused.bias.ptr as *const c_void;
        desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr)?;
        desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(bias_t as i32))?;
        let int8 = c.quant.is_some();
        self.finish_gemm(desc, ab_t, ab_t, w, kpad, c.cout, m, int8, Some(fused))
    }

    /// Matrix layouts (A = weights [rows, kpad] transposed, B = columns [m, kpad], C = D =
    /// [m, rows]) and cuBLASLt's heuristic algorithms for them.
    #[allow(clippy::too_many_arguments)]
    fn finish_gemm(
        &self,
        desc: GemmDesc,
        ab_t: lt::cudaDataType_t,
        d_t: lt::cudaDataType_t,
        w: DevBuf,
        kpad: usize,
        rows: usize,
        m: usize,
        int8: bool,
        fused: Option<FusedOut>,
    ) -> DevResult<GemmSetup> {
        use cudarc::cublaslt::result as r;
        let e = |x: r::CublasError| format!("{x}");
        let a = r::create_matrix_layout(ab_t, kpad as u64, rows as u64, kpad as i64).map_err(e)?;
        let b = r::create_matrix_layout(ab_t, kpad as u64, m as u64, kpad as i64).map_err(e)?;
        let d = r::create_matrix_layout(d_t, rows as u64, m as u64, rows as i64).map_err(e)?;
        // From here the setup owns every handle (its Drop frees them on any error).
        let mut setup = GemmSetup {
            desc: desc.take(),
            a,
            b,
            d,
            algos: vec![],
            w,
            kpad,
            cout_pad: rows,
            int8,
            fused,
        };
        let pref = r::create_matmul_pref().map_err(e)?;
        let ws = LIB_WORKSPACE_BYTES as u64;
        let mut heur: Vec<lt::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; 8];
        let mut count = 0i32;
        let st = unsafe {
            let set = r::set_matmul_pref_attribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const _ as *const c_void,
                8,
            );
            let st = match set {
                Ok(()) => lt::cublasLtMatmulAlgoGetHeuristic(
                    self.dev.lt,
                    setup.desc,
                    a,
                    b,
                    d,
                    d,
                    pref,
                    8,
                    heur.as_mut_ptr(),
                    &mut count,
                ),
                Err(_) => lt::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
            };
            let _ = r::destroy_matmul_pref(pref);
            st
        };
        lt_ok(st, "cublasLtMatmulAlgoGetHeuristic")?;
        setup.algos = heur
            .into_iter()
            .take(count.max(0) as usize)
            .filter(|h| h.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .collect();
        if setup.algos.is_empty() {
            return Err("no cuBLASLt algorithm for this shape".into());
        }
        Ok(setup)
    }

    /// cuDNN convolution in `float` (FP32 or FP16), its algorithms found by timing them on
    /// the input at `x_ptr`.
    fn setup_cudnn(&self, c: &ConvStep, float: DType, x_ptr: u64) -> DevResult<CudnnSetup> {
        let t = if float == DType::F16 {
            dnn::cudnnDataType_t::CUDNN_DATA_HALF
        } else {
            dnn::cudnnDataType_t::CUDNN_DATA_FLOAT
        };
        let xd = &self.plan.tensors[c.input];
        let od = &self.plan.tensors[c.out];
        if xd.shape.len() != 4 || xd.layout != Layout::Nhwc {
            return Err("input is not NHWC rank 4".into());
        }
        let nhwc = dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
        let i = |v: usize| v as i32;
        let mut s = CudnnSetup {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w_desc: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            w: if float == DType::F16 {
                let h: Vec<half::f16> = c.w.iter().map(|&x| half::f16::from_f32(x)).collect();
                DevBuf::from_slice(&h)?
            } else {
                DevBuf::from_slice(&c.w)?
            },
            algos: vec![],
        };
        unsafe {
            dnn_ok(dnn::cudnnCreateTensorDescriptor(&mut s.x), "create x")?;
            dnn_ok(dnn::cudnnCreateTensorDescriptor(&mut s.y), "create y")?;
            dnn_ok(dnn::cudnnCreateFilterDescriptor(&mut s.w_desc), "create w")?;
            dnn_ok(
                dnn::cudnnCreateConvolutionDescriptor(&mut s.conv),
                "create conv",
            )?;
            dnn_ok(
                dnn::cudnnSetTensor4dDescriptor(
                    s.x,
                    nhwc,
                    t,
                    i(xd.shape[0]),
                    i(xd.shape[1]),
                    i(xd.shape[2]),
                    i(xd.shape[3]),
                ),
                "x descriptor",
            )?;
            dnn_ok(
                dnn::cudnnSetTensor4dDescriptor(
                    s.y,
                    nhwc,
                    t,
                    i(od.shape[0]),
                    i(od.shape[1]),
                    i(od.shape[2]),
                    i(od.shape[3]),
                ),
                "y descriptor",
            )?;
            dnn_ok(
                dnn::cudnnSetFilter4dDescriptor(
                    s.w_desc,
                    t,
                    nhwc,
                    i(c.cout),
                    i(c.cin / c.groups),
                    i(c.k[0]),
                    i(c.k[1]),
                ),
                "filter descriptor",
            )?;
            dnn_ok(
                dnn::cudnnSetConvolution2dDescriptor(
                    s.conv,
                    i(c.pads[0]),
                    i(c.pads[1]),
                    i(c.stride[0]),
                    i(c.stride[1]),
                    i(c.dilation[0]),
                    i(c.dilation[1]),
                    dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
                "conv descriptor",
            )?;
            dnn_ok(
                dnn::cudnnSetConvolutionGroupCount(s.conv, i(c.groups)),
                "group count",
            )?;
            let math = if float == DType::F16 || self.tf32 {
                // For FP32 data, tensor-op math is TF32 (as PyTorch's default for cuDNN).
                dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            } else {
                // Strict FP32: what the CPU engine computes (parity tests hold it to 1e-4).
                dnn::cudnnMathType_t::CUDNN_FMA_MATH
            };
            dnn_ok(dnn::cudnnSetConvolutionMathType(s.conv, math), "math type")?;
            let mut perf: Vec<dnn::cudnnConvolutionFwdAlgoPerf_t> = vec![std::mem::zeroed(); 8];
            let mut got = 0i32;
            dnn_ok(
                dnn::cudnnFindConvolutionForwardAlgorithmEx(
                    self.dev.cudnn,
                    s.x,
                    x_ptr as *const c_void,
                    s.w_desc,
                    s.w.ptr as *const c_void,
                    s.conv,
                    s.y,
                    self.raw_ptr() as *mut c_void,
                    8,
                    &mut got,
                    perf.as_mut_ptr(),
                    self.ws_ptr() as *mut c_void,
                    LIB_WORKSPACE_BYTES,
                ),
                "cudnnFindConvolutionForwardAlgorithmEx",
            )?;
            s.algos = perf
                .iter()
                .take(got.max(0) as usize)
                .filter(|p| {
                    p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                        && p.memory <= LIB_WORKSPACE_BYTES
                        && (float == DType::F16
                            || self.tf32
                            || p.mathType != dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
                })
                .map(|p| (p.algo as i32, p.memory))
                .collect();
        }
        if s.algos.is_empty() {
            return Err("cuDNN found no algorithm".into());
        }
        Ok(s)
    }

    /// Milliseconds per launch of step `si`, averaged over enough back-to-back launches to fill
    /// about [`CHOICE_BATCH_MS`] (at most [`CHOICE_MAX_LAUNCHES`]) after one warm-up launch.
    /// The launches are captured in a CUDA graph and timed as one, because the engine runs as
    /// a graph: timed as eager launches, a small layer's host-side cost (a cuDNN call's most)
    /// counted as its time, which favoured the cheapest-to-launch kernel over the fastest (on
    /// an H200, EfficientNet-B0's layers at batch 32 timed that way summed 1.05 ms more than
    /// its whole FP16 graph took, 0.57 ms more than its INT8 one). A step the graph capture
    /// refuses is timed eagerly.
    fn time_launches(&self, si: usize) -> DevResult<f64> {
        let ctx = &self.dev.ctx;
        let st = &self.dev.stream;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (e0, e1) = (
            drv(ctx.new_event(flags), "event")?,
            drv(ctx.new_event(flags), "event")?,
        );
        let timed = |launch: &dyn Fn() -> DevResult<()>, n: usize| -> DevResult<f64> {
            drv(e0.record(st), "event record")?;
            launch()?;
            drv(e1.record(st), "event record")?;
            Ok(drv(e0.elapsed_ms(&e1), "event elapsed")? as f64 / n as f64)
        };
        let once = timed(&|| self.run_step(si), 1)?;
        let n = ((CHOICE_BATCH_MS / once.max(1e-4)) as usize).clamp(1, CHOICE_MAX_LAUNCHES);
        let eager = || (0..n).try_for_each(|_| self.run_step(si));
        match self.capture_graph(eager) {
            Ok(g) => {
                drv(g.launch(), "graph launch")?;
                timed(&|| drv(g.launch(), "graph launch"), n)
            }
            Err(_) => timed(&eager, n),
        }
    }

    /// Each step timed alone, with what ran it and in which precision (an int8 layer the
    /// builder ran in FP16, or a layer the Q/DQ plan leaves in float, says so).
    fn profile_layers(&self, engine: Precision) -> DevResult<Vec<LayerTime>> {
        let mut out = vec![];
        let float_name = match float_type(engine) {
            DType::F16 => "fp16",
            _ if self.tf32 => "fp32 (tf32)",
            _ => "fp32",
        };
        for (si, s) in self.plan.steps.iter().enumerate() {
            let t = self.time_launches(si)?;
            let precision = match (s, self.convs.get(&si)) {
                (Step::Conv(c), Some(rt)) => match (&c.quant, &rt.chosen) {
                    (Some(q), ConvImpl::AsF16(_)) => {
                        format!("fp16, timed faster than {}", quant_name(q.dtype))
                    }
                    (Some(q), ConvImpl::Direct | ConvImpl::Depthwise) if !q.is_int8() => {
                        "fp8 data, fp32 arithmetic (no fp8 kernel for this layer)".to_string()
                    }
                    (Some(q), _) => quant_name(q.dtype).to_string(),
                    (None, _) if engine.is_quantized() => {
                        format!("{float_name}, float in the Q/DQ plan")
                    }
                    (None, _) => float_name.to_string(),
                },
                // Other steps compute in f32 registers; their data is in the output's type.
                _ => match self.plan.tensors[s.output()].dtype {
                    DType::I8 => "int8 data".to_string(),
                    DType::F8 => "fp8 data".to_string(),
                    DType::F16 => "fp16 data".to_string(),
                    DType::F32 => "fp32 data".to_string(),
                },
            };
            let kernel = match (s, self.convs.get(&si)) {
                (Step::Conv(c), Some(rt)) => {
                    let p = c.quant.as_ref().map_or("float", |q| quant_name(q.dtype));
                    let what = rt.chosen.describe();
                    let out = match self.plan.tensors[c.out].dtype {
                        DType::I8 => " -> int8",
                        DType::F8 => " -> fp8",
                        _ => "",
                    };
                    format!("{p} {what}{out}")
                }
                _ => format!("nvrtc {}", s.kind()),
            };
            let kernel = match self.schedule.as_ref().map_or(0, |sch| sch.stream[si]) {
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
                time_ms: t,
                precision: Some(precision),
            });
        }
        Ok(out)
    }

    fn capture(&mut self) -> DevResult<()> {
        let g = self.capture_graph(|| self.run_steps())?;
        drv(g.launch(), "graph launch")?;
        drv(self.dev.stream.synchronize(), "graph run")?;
        self.graph = Some(g);
        Ok(())
    }

    /// What `launches` puts on the stream, captured as an instantiated, uploaded CUDA graph.
    fn capture_graph(
        &self,
        launches: impl FnOnce() -> DevResult<()>,
    ) -> DevResult<cudarc::driver::CudaGraph> {
        let st = &self.dev.stream;
        drv(st.synchronize(), "synchronize")?;
        drv(
            st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "begin capture",
        )?;
        let r = launches();
        let g = drv(
            st.end_capture(sys::CUgraphInstantiate_flags(0)),
            "end capture",
        );
        r?;
        let g = g?.ok_or("empty graph")?;
        drv(g.upload(), "graph upload")?;
        Ok(g)
    }

    /// Every step, in plan order, each on its stream: the auxiliary streams fork from the main
    /// one first and join it at the end, so that the run (and a captured graph) starts and ends
    /// on the main stream.
    fn run_steps(&self) -> DevResult<()> {
        let step_err = |si: usize, e: String| format!("step `{}`: {e}", self.plan.steps[si].name());
        let Some(sch) = &self.schedule else {
            for si in 0..self.plan.steps.len() {
                self.run_step(si).map_err(|e| step_err(si, e))?;
            }
            return Ok(());
        };
        let main = &self.dev.stream;
        let run = || -> DevResult<()> {
            for a in &self.aux {
                drv(a.fork.record(main), "event record")?;
                drv(a.stream.wait(&a.fork), "stream wait")?;
            }
            for si in 0..self.plan.steps.len() {
                self.set_lane(sch.stream[si])?;
                for &w in &sch.waits[si] {
                    let e = self.events[w].as_ref().ok_or("missing event")?;
                    drv(self.stream().wait(e), "stream wait")?;
                }
                self.run_step(si).map_err(|e| step_err(si, e))?;
                if let Some(e) = &self.events[si] {
                    drv(e.record(self.stream()), "event record")?;
                }
            }
            for a in &self.aux {
                drv(a.join.record(&a.stream), "event record")?;
                drv(main.wait(&a.join), "stream wait")?;
            }
            Ok(())
        };
        let r = run();
        self.set_lane(0)?;
        r
    }

    fn launch_all(&self) -> DevResult<()> {
        match &self.graph {
            Some(g) => drv(g.launch(), "graph launch"),
            None => self.run_steps(),
        }
    }

    /// Device pointer of constant `idx` of step `si` (`Step::constants()` order); 0 (null)
    /// for an empty constant.
    fn const_ptr(&self, si: usize, idx: usize) -> DevResult<u64> {
        let c = self
            .consts
            .get(&si)
            .and_then(|v| v.get(idx))
            .ok_or_else(|| format!("constant {idx} was not uploaded"))?;
        Ok(c.as_ref().map_or(0, |b| b.ptr))
    }

    /// (pointer, dtype code, scale) of an operand; constant `ci` of step `si` is an f32
    /// buffer, dtype -1.
    fn operand(&self, si: usize, o: &Operand, ci: usize) -> DevResult<(u64, i32, f32)> {
        Ok(match o {
            Operand::Tensor(t) => {
                let d = &self.plan.tensors[*t];
                (self.ptr(*t), d.dtype.code(), d.scale)
            }
            Operand::Const(..) => (self.const_ptr(si, ci)?, -1, 1.0),
        })
    }

    fn run_step(&self, si: usize) -> DevResult<()> {
        let s = &self.plan.steps[si];
        let plan = &self.plan;
        let st = self.stream();
        let k = &self.dev.k;
        let td = |t: usize| &plan.tensors[t];
        let code = |t: usize| td(t).dtype.code();
        let sc = |t: usize| td(t).scale;
        let u = |v: usize| v as i32;
        if td(s.output()).numel() == 0 {
            // Nothing to write (a zero-sized launch is an error).
            return Ok(());
        }
        match s {
            Step::Conv(_) => self.run_conv(si),
            Step::Unary {
                input, out, act, ..
            } => {
                let (a, a0, a1) = act.code();
                let n = td(*out).numel();
                if n.is_multiple_of(4) {
                    launch!(st, k.unary4, n / 4; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out), (n / 4) as i64, a, a0, a1)
                } else {
                    launch!(st, k.unary, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out), n as i64, a, a0, a1)
                }
            }
            Step::View {
                input,
                out,
                dims,
                strides,
                offset,
                ..
            } => {
                let a = view_args(plan, *input, *out, dims, strides, *offset)?;
                let n = td(*out).numel();
                launch!(st, k.view, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out), n as i64, a)
            }
            Step::Nary {
                op,
                inputs,
                strides,
                dims,
                out,
                act,
                ..
            } => {
                let mut a = nary_args(plan, inputs, strides, dims, *out)?;
                let mut ci = 0;
                for (j, o) in inputs.iter().enumerate() {
                    a.ptrs[j] = self.operand(si, o, ci)?.0;
                    ci += matches!(o, Operand::Const(..)) as usize;
                }
                let (ac, a0, a1) = act.code();
                let n = td(*out).numel();
                // A group of the output's type in one 16-byte word where the shapes allow and
                // the bases are 16-byte aligned (arena offsets are); else groups of 4.
                let (width, wide) = match td(*out).dtype {
                    DType::F32 => (4, &k.nary4),
                    DType::F16 => (8, &k.nary8),
                    DType::I8 | DType::F8 => (16, &k.nary16),
                };
                let aligned = |g: &NaryArgs, vec: i32| {
                    self.ptr(*out).is_multiple_of(16)
                        && (0..g.nin as usize)
                            .all(|j| vec >> j & 1 == 0 || g.ptrs[j].is_multiple_of(16))
                };
                let grouped = nary_groups(&a, width).filter(|(g, v)| aligned(g, *v));
                if let Some((aw, vec)) = grouped {
                    launch!(st, *wide, n / width as usize; aw, self.ptr(*out), code(*out), sc(*out), n as i64 / width, op.code(), ac, a0, a1, vec)
                } else if let Some((a4, vec)) = nary_groups(&a, 4) {
                    launch!(st, k.nary4, n / 4; a4, self.ptr(*out), code(*out), sc(*out), (n / 4) as i64, op.code(), ac, a0, a1, vec)
                } else {
                    launch!(st, k.nary, n; a, self.ptr(*out), code(*out), sc(*out), n as i64, op.code(), ac, a0, a1)
                }
            }
            Step::Reduce {
                input,
                out,
                outer,
                len,
                inner,
                op,
                ..
            } => {
                let opc = *op as i32;
                if *inner == 1 {
                    launch!(st, k.reduce_rows, cfg rows_cfg(*outer, *len); self.ptr(*input), code(*input), sc(*input),
                        self.ptr(*out), code(*out), sc(*out), *outer as i64, *len as i64, opc)
                } else {
                    let n = outer * inner;
                    launch!(st, k.reduce, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                        *outer as i64, *len as i64, *inner as i64, opc)
                }
            }
            Step::Norm {
                input,
                out,
                rows,
                len,
                eps,
                gamma,
                ..
            } => {
                let (g, b) = if gamma.is_empty() {
                    (0u64, 0u64)
                } else {
                    (self.const_ptr(si, 0)?, self.const_ptr(si, 1)?)
                };
                launch!(st, k.norm_rows, cfg rows_cfg(*rows, *len); self.ptr(*input), code(*input), sc(*input),
                    self.ptr(*out), code(*out), sc(*out), *rows as i64, *len as i64, *eps, g, b)
            }
            Step::MatMul {
                a,
                b,
                out,
                batch,
                m,
                n,
                k: kd,
                a_stride,
                b_stride,
                trans_b,
                ..
            } => {
                let (bp, bt, bs) = self.operand(si, b, 0)?;
                let cfg = LaunchConfig {
                    grid_dim: (
                        n.div_ceil(32) as u32,
                        m.div_ceil(32).min(65_535) as u32,
                        (*batch).clamp(1, 65_535) as u32,
                    ),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                };
                launch!(st, k.matmul, cfg cfg; self.ptr(*a), code(*a), sc(*a), bp, bt, bs, self.ptr(*out), code(*out), sc(*out),
                    *batch as i64, u(*m), u(*n), u(*kd), *a_stride as i64, *b_stride as i64, *trans_b as i32)
            }
            Step::Gather {
                input,
                indices,
                out,
                outer,
                axis_len,
                count,
                inner,
                ..
            } => {
                let (ip, it, is) = self.operand(si, indices, 0)?;
                let n = td(*out).numel();
                launch!(st, k.gather, n; self.ptr(*input), code(*input), sc(*input), ip, it, is, self.ptr(*out), code(*out), sc(*out),
                    *outer as i64, *axis_len as i64, *count as i64, *inner as i64)
            }
            Step::Pool {
                input,
                out,
                max,
                k: kk,
                stride,
                dilation,
                pads,
                count_include_pad,
                ..
            } => {
                let (i, o) = (td(*input), td(*out));
                // Max of raw 16-byte vectors where the output takes the input's type (and
                // scale, but for int8's requantizing), else four channels per thread where the
                // channels allow (vector accesses), else one.
                let bytes = i.dtype.bytes();
                let raw_max = *max
                    && i.dtype == o.dtype
                    && (i.scale == o.scale || i.dtype == DType::I8)
                    && i.dtype != DType::F8
                    && (i.shape[1] * bytes).is_multiple_of(16)
                    && i.numel().max(o.numel()) * bytes / 16 < i32::MAX as usize;
                if raw_max {
                    let cv = i.shape[1] * bytes / 16;
                    return launch!(st, k.max_pool16, o.numel() * bytes / 16; self.ptr(*input), i.dtype.code(), i.scale,
                        self.ptr(*out), o.scale,
                        u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(cv), u(o.shape[2]), u(o.shape[3]),
                        u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]),
                        u(dilation[0]), u(dilation[1]));
                }
                let (f, n) = if i.shape[1] % 4 == 0 {
                    (&k.pool4, o.numel() / 4)
                } else {
                    (&k.pool, o.numel())
                };
                launch!(st, f, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
                    u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]), u(pads[2]), u(pads[3]),
                    u(dilation[0]), u(dilation[1]), if *max { 0i32 } else { 1i32 }, *count_include_pad as i32)
            }
            Step::GlobalAvgPool { input, out, .. } => {
                let i = td(*input);
                let (n, c, hw) = i.nchw();
                let splits = gap_splits(n, c, hw, i.dtype.bytes());
                let cfg = LaunchConfig {
                    grid_dim: (c.div_ceil(32) as u32, n as u32, splits as u32),
                    block_dim: (32 * gap_lanes(hw.div_ceil(splits)) as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // Split sums go to the raw scratch, which `build` sized for them.
                launch!(st, k.gap, cfg cfg; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    n as i32, hw as i64, c as i32, splits as i32, self.raw_ptr())?;
                if splits > 1 {
                    launch!(st, k.gap_finish, n * c; self.raw_ptr(), splits as i32, self.ptr(*out), code(*out), sc(*out),
                        n as i32, hw as i64, c as i32)?;
                }
                Ok(())
            }
            Step::Concat {
                inputs,
                out,
                outer,
                inner,
                ..
            } => {
                let o = td(*out);
                let axis_total: usize = o.numel() / (outer * inner);
                let mut off = 0usize;
                for &t in inputs {
                    let len = td(t).numel() / (outer * inner);
                    let n = td(t).numel();
                    if n > 0 {
                        launch!(st, k.concat, n; self.ptr(t), code(t), sc(t), self.ptr(*out), code(*out), sc(*out),
                            *outer as i64, len as i64, axis_total as i64, off as i64, *inner as i64)?;
                    }
                    off += len;
                }
                Ok(())
            }
            Step::Resize {
                input,
                out,
                mode,
                coord,
                nearest,
                scale_hw,
                cubic_a,
                exclude_outside,
                ..
            } => {
                let (i, o) = (td(*input), td(*out));
                let n = o.numel();
                launch!(st, k.resize, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
                    scale_hw[0], scale_hw[1], *mode, *coord, *nearest, *cubic_a, *exclude_outside as i32)
            }
            Step::Softmax {
                input,
                out,
                outer,
                len,
                inner,
                log,
                ..
            } => {
                if *inner == 1 {
                    launch!(st, k.softmax_rows, cfg rows_cfg(*outer, *len); self.ptr(*input), code(*input), sc(*input),
                        self.ptr(*out), code(*out), sc(*out), *outer as i64, *len as i64, *log as i32)
                } else {
                    let n = outer * inner;
                    launch!(st, k.softmax, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                        *outer as i64, *len as i64, *inner as i64, *log as i32)
                }
            }
            Step::Pad {
                input,
                out,
                in_dims,
                begin,
                mode,
                value,
                ..
            } => {
                let a = pad_args(plan, *input, *out, in_dims, begin, *mode)?;
                let n = td(*out).numel();
                launch!(st, k.pad_nd, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    n as i64, a, *value)
            }
            Step::SpaceToDepth {
                input,
                out,
                block,
                pads,
                ..
            } => {
                let (xd, od) = (td(*input), td(*out));
                let [_, c, h, w] = [xd.shape[0], xd.shape[1], xd.shape[2], xd.shape[3]];
                // (b, c, h, w) element strides of the input as stored.
                let s: [i64; 4] = if xd.layout == Layout::Nhwc {
                    [h * w * c, 1, w * c, c]
                } else {
                    [c * h * w, h * w, w, 1]
                }
                .map(|v| v as i64);
                let (nb, c2, hs, ws) = (od.shape[0], od.shape[1], od.shape[2], od.shape[3]);
                let i = |v: usize| v as i32;
                // The int8 16-byte-tap regrouping (2 x 2 cells of four channels): a thread a
                // pixel.
                if od.dtype == DType::I8
                    && *block == 2
                    && c2 == 16
                    && c <= 4
                    && nb * hs * ws < i32::MAX as usize
                {
                    return launch!(st, k.space_to_depth16, nb * hs * ws; self.ptr(*input), code(*input), sc(*input),
                        s[0], s[1], s[2], s[3], i(h), i(w), i(c), self.ptr(*out), sc(*out),
                        i(nb), i(hs), i(ws), i(pads[0]), i(pads[1]));
                }
                launch!(st, k.space_to_depth, nb * hs * ws * c2 / 4; self.ptr(*input), code(*input), sc(*input),
                    s[0], s[1], s[2], s[3], i(h), i(w), i(c), self.ptr(*out), code(*out), sc(*out),
                    i(nb), i(hs), i(ws), i(*block), i(c2 / (block * block)), i(pads[0]), i(pads[1]))
            }
            Step::ConvTranspose {
                input,
                out,
                groups,
                k: kk,
                stride,
                pads,
                dilation,
                act,
                ..
            } => {
                let (i, o) = (td(*input), td(*out));
                let (w, bias) = (self.const_ptr(si, 0)?, self.const_ptr(si, 1)?);
                let (ac, a0, a1) = act.code();
                let n = o.numel();
                launch!(st, k.conv_transpose, n; self.ptr(*input), code(*input), sc(*input), w, bias,
                    self.ptr(*out), code(*out), sc(*out),
                    u(i.shape[0]), u(i.shape[1]), u(i.shape[2]), u(i.shape[3]), u(o.shape[1]), u(o.shape[2]), u(o.shape[3]),
                    u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]),
                    u(dilation[0]), u(dilation[1]), u(*groups), ac, a0, a1)
            }
        }
    }

    fn run_conv(&self, si: usize) -> DevResult<()> {
        let rt = &self.convs[&si];
        let c = &rt.step;
        let xd = &self.plan.tensors[c.input];
        match &rt.chosen {
            ConvImpl::AsF16(inner) => {
                let f = rt.f16.as_deref().ok_or("FP16 way missing")?;
                let n = xd.numel();
                let (st, k) = (self.stream(), &self.dev.k);
                launch!(st, k.unary, n; self.ptr(c.input), xd.dtype.code(), xd.scale,
                    self.f16_in_ptr(), DType::F16.code(), 1.0f32, n as i64, 0i32, 0.0f32, 0.0f32)?;
                let way = ConvWay {
                    input: self.f16_in_ptr(),
                    in_t: DType::F16,
                    in_scale: 1.0,
                    gemm: f.gemm.as_ref(),
                    cudnn: f.cudnn.as_ref(),
                    alpha: f.ones.ptr,
                };
                self.run_conv_as(rt, inner, &way)
            }
            imp => {
                let gemm = if matches!(imp, ConvImpl::GemmFused { .. }) {
                    rt.gemm_fused.as_ref()
                } else {
                    rt.gemm.as_ref()
                };
                let way = ConvWay {
                    input: self.ptr(c.input),
                    in_t: xd.dtype,
                    in_scale: xd.scale,
                    gemm,
                    cudnn: rt.cudnn.as_ref(),
                    alpha: rt.alpha.ptr,
                };
                self.run_conv_as(rt, imp, &way)
            }
        }
    }

    /// Runs conv `rt` with implementation `imp` on the input and setups of `way`.
    fn run_conv_as(&self, rt: &ConvRt, imp: &ConvImpl, way: &ConvWay) -> DevResult<()> {
        let c = &rt.step;
        let st = self.stream();
        let k = &self.dev.k;
        let xd = &self.plan.tensors[c.input];
        let od = &self.plan.tensors[c.out];
        let (res_p, res_t, res_s) = match c.residual {
            Some(r) => (
                self.ptr(r),
                self.plan.tensors[r].dtype.code(),
                self.plan.tensors[r].scale,
            ),
            None => (0u64, -1i32, 1.0f32),
        };
        let (act, a0, a1) = c.act.code();
        let (h, w) = if xd.shape.len() == 4 {
            (xd.shape[2], xd.shape[3])
        } else {
            (1, 1)
        };
        let u = |v: usize| v as i32;
        let n_out = od.numel();
        // Raw output type of the float library paths.
        let float_raw = way.in_t.code();
        // The epilogue kernel over the raw output [m, raw_ld] (four channels a thread where
        // channels and rows are whole groups of 4).
        let epilogue_of = |raw_t: i32, raw_ld: usize, alpha: u64, bias: u64| -> DevResult<()> {
            let vec4 = c.cout.is_multiple_of(4) && raw_ld.is_multiple_of(4);
            let threads = if vec4 { n_out / 4 } else { n_out };
            launch!(st, k.epilogue, threads; self.raw_ptr(), raw_t, raw_ld as i64, alpha, bias,
                res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale, rt.m as i64, c.cout as i64,
                act, a0, a1, vec4 as i32)
        };
        let epilogue =
            |raw_t: i32, raw_ld: usize| epilogue_of(raw_t, raw_ld, way.alpha, rt.bias.ptr);
        match imp {
            ConvImpl::Direct => {
                let w_p = rt.direct_w.as_ref().ok_or("direct weights missing")?.ptr;
                launch!(st, k.conv_direct, n_out; way.input, way.in_t.code(), way.in_scale, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(xd.shape[0]), u(h), u(w), u(c.cin), u(rt.oh), u(rt.ow), u(c.cout),
                    u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
                    u(c.dilation[0]), u(c.dilation[1]), u(c.groups), act, a0, a1)
            }
            ConvImpl::Depthwise => {
                let w_p = rt.kernel_w.as_ref().ok_or("depthwise weights missing")?.ptr;
                // Threads: four channels of DW_PX (4) adjacent outputs along x each.
                let threads = n_out / rt.ow / 4 * rt.ow.div_ceil(4);
                launch!(st, k.conv_dw4, threads; way.input, way.in_t.code(), w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(xd.shape[0]), u(h), u(w), u(c.cin), u(rt.oh), u(rt.ow),
                    u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
                    u(c.dilation[0]), u(c.dilation[1]), act, a0, a1)
            }
            ConvImpl::DepthwiseRows { kernel } => {
                let w_p = rt
                    .rows_w
                    .as_ref()
                    .ok_or("depthwise row weights missing")?
                    .ptr;
                // Threads as conv_dw4's: four channels of DW_PX (4) adjacent outputs along x.
                let threads = n_out / rt.ow / 4 * rt.ow.div_ceil(4);
                launch!(st, k.conv_dw_i8[*kernel], threads; way.input, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(xd.shape[0]), u(h), u(w), u(c.cin), u(rt.oh), u(rt.ow),
                    u(c.pads[0]), u(c.pads[1]), act, a0, a1)
            }
            ConvImpl::Pointwise => {
                let w_p = rt.kernel_w.as_ref().ok_or("pointwise weights missing")?.ptr;
                // x: pixels; y: blocks of PW_CO output channels.
                let cfg = LaunchConfig {
                    grid_dim: (
                        rt.m.div_ceil(PW_THREADS) as u32,
                        c.cout.div_ceil(PW_CO) as u32,
                        1,
                    ),
                    block_dim: (PW_THREADS as u32, 1, 1),
                    shared_mem_bytes: (PW_CO * c.cin) as u32,
                };
                launch!(st, k.conv_pw_i8, cfg cfg; way.input, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(rt.m), u(c.cin), u(c.cout), act, a0, a1)
            }
            ConvImpl::PointwiseWord => {
                let w_p = rt.kernel_w.as_ref().ok_or("pointwise weights missing")?.ptr;
                // One thread per output word (four channels of a pixel).
                let words = rt.m * c.cout / 4;
                let per_px = FastDiv::of(&[(c.cout / 4) as i64]);
                launch!(st, k.conv_pw_i8_word, words; way.input, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(rt.m), u(c.cin), u(c.cout), act, a0, a1, per_px.magic[0], per_px.shift[0])
            }
            ConvImpl::Mma { bm } => {
                let w_p = rt.mma_w.as_ref().ok_or("tensor-core weights missing")?.ptr;
                // Rows of a Gemm / MatMul are 1x1 images.
                let (oh, ow) = if xd.shape.len() == 4 {
                    (rt.oh, rt.ow)
                } else {
                    (1, 1)
                };
                // x: tiles of output channels (the blocks sharing a tile of pixels run
                // together); y: tiles of pixels.
                let cfg = LaunchConfig {
                    grid_dim: (c.cout.div_ceil(MMA_BN) as u32, rt.m.div_ceil(*bm) as u32, 1),
                    block_dim: (MMA_THREADS as u32, 1, 1),
                    shared_mem_bytes: mma_smem_bytes(*bm, self.dev.mma_residual) as u32,
                };
                // Row -> (image, output row): divisions by oh * ow and ow.
                let div = FastDiv::of(&[(oh * ow) as i64, ow as i64]);
                let f = if *bm == MMA_BM {
                    &k.conv_i8_mma
                } else {
                    &k.conv_i8_mma64
                };
                launch!(st, f, cfg cfg; way.input, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(rt.m), u(c.cin), u(round_up(c.reduction(), MMA_BK)), u(c.cout), act, a0, a1,
                    u(h), u(w), u(oh), u(ow), u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]),
                    u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]),
                    div.magic[0], div.shift[0], div.magic[1], div.shift[1])
            }
            ConvImpl::MmaStream { bm } => {
                let w_p = rt.mma_w.as_ref().ok_or("tensor-core weights missing")?.ptr;
                let kpad = round_up(c.reduction(), MMA_BK);
                let smem = mmas_smem_bytes(*bm, kpad);
                let f = if *bm == MMA_BM {
                    &k.conv_i8_mmas
                } else {
                    &k.conv_i8_mmas64
                };
                // As many blocks as run at once (shared memory, and the launch bounds' blocks
                // an SM, which the registers allow), each stepping over pixel tiles: x tiles
                // of output channels (the blocks sharing a tile of pixels run together).
                let bound = MMA_OCCUPANCY
                    .iter()
                    .find(|&&(h, _)| h == *bm)
                    .map_or(1, |&(_, b)| b);
                let per_sm = self.dev.resident_blocks(smem).min(bound);
                let col_tiles = c.cout.div_ceil(MMA_BN);
                let blocks = (per_sm * self.dev.sms / col_tiles).clamp(1, rt.m.div_ceil(*bm));
                let cfg = LaunchConfig {
                    grid_dim: (col_tiles as u32, blocks.min(u16::MAX as usize) as u32, 1),
                    block_dim: (MMA_THREADS as u32, 1, 1),
                    shared_mem_bytes: smem as u32,
                };
                launch!(st, f, cfg cfg; way.input, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale, u(c.cout),
                    act, a0, a1, u(rt.m), u(c.cin), u(kpad))
            }
            ConvImpl::MmaRows => {
                let w_p = rt.mma_w.as_ref().ok_or("tensor-core weights missing")?.ptr;
                let kpad = round_up(c.reduction(), MMA_BK);
                let smem = rows_smem_bytes(
                    kpad,
                    c.k[0],
                    c.k[1],
                    rt.ow,
                    rows_codes(od.dtype, c.residual.is_some(), c.act),
                );
                // Blocks step over the output rows: as many as fit the SMs at once, so that
                // each reads its weights once.
                let rows = xd.shape[0] * rt.oh;
                let per_sm = self.dev.resident_blocks(smem);
                let cfg = LaunchConfig {
                    grid_dim: (
                        c.cout.div_ceil(MMA_BN) as u32,
                        rows.min(per_sm * self.dev.sms).min(u16::MAX as usize) as u32,
                        1,
                    ),
                    block_dim: (MMA_THREADS as u32, 1, 1),
                    shared_mem_bytes: smem as u32,
                };
                launch!(st, k.conv_i8_rows, cfg cfg; way.input, w_p, way.alpha, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale, u(c.cout),
                    act, a0, a1, u(rows), u(h), u(w), u(rt.oh), u(rt.ow), u(c.k[0]), u(c.k[1]),
                    u(c.pads[0]), u(c.pads[1]), u(kpad))
            }
            ConvImpl::Gemm { algo, im2col } | ConvImpl::GemmFused { algo, im2col } => {
                let g = way.gemm.ok_or("GEMM setup missing")?;
                let b_ptr = if *im2col {
                    let esz = way.in_t.bytes();
                    if (c.cin * esz).is_multiple_of(16) && g.kpad == c.reduction() {
                        // 16-byte vectors: a row of the columns is whole pixels of whole taps.
                        let cin_v = c.cin * esz / 16;
                        let n = rt.m * c.k[0] * c.k[1] * cin_v;
                        launch!(st, k.im2col_v16, n; way.input, self.col_ptr(),
                            u(xd.shape[0]), u(h), u(w), u(cin_v), u(rt.oh), u(rt.ow), u(c.k[0]), u(c.k[1]),
                            u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]))?;
                    } else {
                        let n = rt.m * g.kpad;
                        launch!(st, k.im2col, n; way.input, self.col_ptr(), esz as i32,
                            u(xd.shape[0]), u(h), u(w), u(c.cin), u(rt.oh), u(rt.ow), u(c.k[0]), u(c.k[1]),
                            u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]), g.kpad as i64)?;
                    }
                    self.col_ptr()
                } else {
                    way.input
                };
                let (one_f, zero_f, one_i, zero_i) = (1.0f32, 0.0f32, 1i32, 0i32);
                let h = &g.algos[*algo];
                // Fused int8 output: alpha is the device vector, beta the residual weight and
                // C the residual (ignored in beta-zero mode), D the output itself.
                let (al, be, c_ptr, d_ptr): (*const c_void, *const c_void, u64, u64);
                let beta_f;
                if let Some(f) = &g.fused {
                    beta_f = f.beta.unwrap_or(0.0);
                    al = match &f.alpha {
                        Some(a) => a.ptr as *const c_void,
                        None => &one_f as *const f32 as _,
                    };
                    be = &beta_f as *const f32 as _;
                    d_ptr = self.ptr(c.out);
                    c_ptr = if c.residual.is_some() { res_p } else { d_ptr };
                } else if g.int8 {
                    (al, be) = (&one_i as *const _ as _, &zero_i as *const _ as _);
                    (c_ptr, d_ptr) = (self.raw_ptr(), self.raw_ptr());
                } else {
                    (al, be) = (&one_f as *const _ as _, &zero_f as *const _ as _);
                    (c_ptr, d_ptr) = (self.raw_ptr(), self.raw_ptr());
                }
                lt_ok(
                    unsafe {
                        lt::cublasLtMatmul(
                            self.dev.lt,
                            g.desc,
                            al,
                            g.w.ptr as *const c_void,
                            g.a,
                            b_ptr as *const c_void,
                            g.b,
                            be,
                            c_ptr as *const c_void,
                            g.d,
                            d_ptr as *mut c_void,
                            g.d,
                            &h.algo,
                            self.ws().0 as *mut c_void,
                            self.ws().1,
                            st.cu_stream() as _,
                        )
                    },
                    "cublasLtMatmul",
                )?;
                if g.fused.is_some() {
                    return Ok(());
                }
                epilogue(if g.int8 { 3 } else { float_raw }, g.cout_pad)
            }
            ConvImpl::Cudnn { algo } => {
                let cd = way.cudnn.ok_or("cuDNN setup missing")?;
                let (one, zero) = (1.0f32, 0.0f32);
                let algo_e: dnn::cudnnConvolutionFwdAlgo_t =
                    unsafe { std::mem::transmute(*algo as u32) };
                dnn_ok(
                    unsafe {
                        dnn::cudnnConvolutionForward(
                            self.dev.cudnn,
                            &one as *const _ as *const c_void,
                            cd.x,
                            way.input as *const c_void,
                            cd.w_desc,
                            cd.w.ptr as *const c_void,
                            cd.conv,
                            algo_e,
                            self.ws().0 as *mut c_void,
                            self.ws().1,
                            &zero as *const _ as *const c_void,
                            cd.y,
                            self.raw_ptr() as *mut c_void,
                        )
                    },
                    "cudnnConvolutionForward",
                )?;
                epilogue(float_raw, c.cout)
            }
            ConvImpl::CudnnGraph { plan } => {
                let d = rt.dnn.as_ref().ok_or("cuDNN graph missing")?;
                let mut x = way.input;
                if d.cin_pad != c.cin {
                    // [pixels, cin] -> [pixels, cin_pad], zeros after.
                    let pixels = (xd.numel() / c.cin) as i64;
                    let mut a = PadArgs {
                        rank: 2,
                        ..Default::default()
                    };
                    a.out_dims[..2].copy_from_slice(&[pixels, d.cin_pad as i64]);
                    a.in_dims[..2].copy_from_slice(&[pixels, c.cin as i64]);
                    a.div = FastDiv::of(&a.out_dims[..2]);
                    let n = pixels * d.cin_pad as i64;
                    let (t, sc) = (way.in_t.code(), way.in_scale);
                    launch!(st, k.pad_nd, n as usize; x, t, sc, self.f16_in_ptr(), t, sc, n, a, 0.0f32)?;
                    x = self.f16_in_ptr();
                }
                let p = Ptrs {
                    x,
                    w: d.w.ptr,
                    y: if d.split.is_some() {
                        self.raw_ptr()
                    } else {
                        self.ptr(c.out)
                    },
                    scale: d.scale.as_ref().map_or(0, |s| s.ptr),
                    bias: d.bias.ptr,
                    z: res_p,
                    workspace: self.ws_ptr(),
                };
                d.graph.execute(self.dev.cudnn, *plan, &p)?;
                match &d.split {
                    Some((ones, zeros)) => {
                        epilogue_of(DType::F16.code(), c.cout, ones.ptr, zeros.ptr)
                    }
                    None => Ok(()),
                }
            }
            ConvImpl::AsF16(_) => Err("nested FP16 way".into()),
        }
    }

    fn upload_input(&self, input: &[f32]) -> Result<(), BackendError> {
        let want = self.plan.tensors[self.plan.input].numel();
        if input.len() != want {
            return Err(BackendError::Run(format!(
                "input holds {} values, the engine takes {want}",
                input.len()
            )));
        }
        let p = self.ptr(self.plan.input);
        unsafe { result::memcpy_htod_async(p, input, self.dev.stream.cu_stream()) }
            .map_err(|e| BackendError::Run(format!("copying the input: {e:?}")))
    }
}

/// Whether kernels launch as programmatic dependent launches where the GPU has them
/// (`Kernel`): `QUANTSCOPE_CUDA_PDL=off` (or 0) launches them plainly, to compare.
fn pdl_enabled() -> bool {
    !matches!(
        std::env::var("QUANTSCOPE_CUDA_PDL").as_deref(),
        Ok("off" | "0")
    )
}

/// Prints `msg` on stderr when `QUANTSCOPE_CUDA_VERBOSE` is set (the builder's candidate times
/// and phases).
pub(crate) fn log_msg(msg: &str) {
    if std::env::var_os("QUANTSCOPE_CUDA_VERBOSE").is_some() {
        eprintln!("quantscope cuda: {msg}");
    }
}

impl Engine for CudaEngine {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn run(&mut self, input: &[f32]) -> Result<Output, BackendError> {
        let run_err = |e: String| BackendError::Run(e);
        drv(self.dev.ctx.bind_to_thread(), "bind").map_err(run_err)?;
        self.upload_input(input)?;
        self.launch_all().map_err(run_err)?;
        let n = self.plan.tensors[self.plan.output].numel();
        let mut out = vec![0f32; n];
        unsafe {
            result::memcpy_dtoh_async(
                &mut out,
                self.ptr(self.plan.output),
                self.dev.stream.cu_stream(),
            )
        }
        .map_err(|e| BackendError::Run(format!("copying the output: {e:?}")))?;
        drv(self.dev.stream.synchronize(), "synchronize").map_err(run_err)?;
        Ok(Output {
            shape: self.out_shape.clone(),
            data: out,
        })
    }
    fn timed_run(&mut self, input: &[f32]) -> Result<f64, BackendError> {
        let run_err = |e: String| BackendError::Run(e);
        drv(self.dev.ctx.bind_to_thread(), "bind").map_err(run_err)?;
        self.upload_input(input)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let e0 = drv(self.dev.ctx.new_event(flags), "event").map_err(run_err)?;
        let e1 = drv(self.dev.ctx.new_event(flags), "event").map_err(run_err)?;
        drv(e0.record(&self.dev.stream), "event").map_err(run_err)?;
        self.launch_all().map_err(run_err)?;
        drv(e1.record(&self.dev.stream), "event").map_err(run_err)?;
        let ms = drv(e0.elapsed_ms(&e1), "event elapsed").map_err(run_err)?;
        Ok(ms as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::plan::{EwOp, ReduceOp};

    fn tensor(name: &str, shape: &[usize], layout: Layout) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            shape: shape.to_vec(),
            layout,
            dtype: DType::F32,
            scale: 1.0,
            alias_of: None,
        }
    }

    fn plan_of(tensors: Vec<TensorDesc>) -> Plan {
        Plan {
            tensors,
            ..Default::default()
        }
    }

    /// The kernels compile under NVRTC for Hopper and for the oldest supported GPU, without a
    /// warning, and export every kernel the engine loads. Needs no GPU: NVRTC alone (the
    /// `nvidia-cuda-nvrtc` and `nvidia-cuda-runtime` wheels for CUDA 13, with
    /// QUANTSCOPE_CUDA_LIB_DIRS naming the folder that holds libnvrtc.so.13; .ci/run does this).
    /// Skips when NVRTC is missing, unless QUANTSCOPE_REQUIRE_NVRTC is set.
    #[test]
    fn kernels_compile_with_nvrtc() {
        let _ = super::super::libs::preload();
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            // CI installs the wheels and sets this, so a broken install fails instead of skipping.
            assert!(
                std::env::var_os("QUANTSCOPE_REQUIRE_NVRTC").is_none(),
                "QUANTSCOPE_REQUIRE_NVRTC is set but libnvrtc.so.13 cannot be loaded"
            );
            eprintln!(
                "skipped: NVRTC (libnvrtc.so.13) cannot be loaded; install the nvidia-cuda-nvrtc \
                 wheel and set {} to its lib folder",
                super::super::libs::ENV_DIRS
            );
            return;
        }
        for arch in ["compute_90", "compute_75"] {
            let (ptx, log) = compile_kernels(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(log.trim().is_empty(), "{arch}: NVRTC warnings:\n{log}");
            for name in KERNEL_NAMES {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{arch}: kernel `{name}` missing from the PTX"
                );
            }
            // Every kernel launches as a programmatic dependent launch on sm_90 (`Kernel`), which
            // is safe only if each waits for the kernel before it: each entry's code has the
            // wait (none on older GPUs, whose PTX has no such instruction).
            let entries: Vec<&str> = ptx.split(".entry ").skip(1).collect();
            assert_eq!(entries.len(), KERNEL_NAMES.len(), "{arch}");
            for body in entries {
                let name = body.split('(').next().unwrap_or_default();
                assert_eq!(
                    body.contains("griddepcontrol.wait"),
                    arch == "compute_90",
                    "{arch}: kernel `{name}` and griddepcontrol.wait"
                );
            }
            eprintln!(
                "{arch}: {} kernels, {} bytes of PTX",
                KERNEL_NAMES.len(),
                ptx.len()
            );
        }
    }

    /// A global average pool's pixels are split across blocks only where a block per image
    /// and 32 channels would leave most of the GPU idle, and never into splits of less than
    /// GAP_SPLIT_BYTES.
    #[test]
    fn global_average_pools_split_their_pixels_where_blocks_are_few() {
        // EfficientNet-B0's first squeeze-excite pool at batch 32 (FP16): 32 blocks of 784 KB.
        assert_eq!(gap_splits(32, 32, 112 * 112, 2), 12);
        // ... in int8: half the bytes, half the splits.
        assert_eq!(gap_splits(32, 32, 112 * 112, 1), 6);
        // ResNet-50's final pool at batch 32: 2,048 blocks already.
        assert_eq!(gap_splits(32, 2048, 49, 2), 1);
        // The ../shared DeepLab's ASPP pool at batch 8 in int8: 80 blocks of 35 KB.
        assert_eq!(gap_splits(8, 320, 33 * 33, 1), 1);
        // DeepLabV3-ResNet50's at batch 1: 64 blocks of 270 KB.
        assert_eq!(gap_splits(1, 2048, 65 * 65, 2), 4);
        // Lanes: 8 over ResNet-50's 49 pixels, all 32 over 12,544 / 12, one over 1 pixel.
        assert_eq!(gap_lanes(49), 8);
        assert_eq!(gap_lanes(112 * 112 / 12), 32);
        assert_eq!(gap_lanes(1), 1);
    }

    #[test]
    fn argument_structs_match_kernels_cu() {
        // i64 arrays then ints, padded to 8 bytes, then the FastDiv's two u32 arrays, as the
        // C++ compiler lays them out.
        let div = 2 * 4 * 8;
        assert_eq!(std::mem::size_of::<FastDiv>(), div);
        assert_eq!(std::mem::size_of::<ViewArgs>(), 8 * 8 * 2 + 8 + 8 + div);
        assert_eq!(
            std::mem::size_of::<NaryArgs>(),
            8 * 8 * 4 + 3 * 8 + 3 * 4 * 2 + 8 + div
        );
        assert_eq!(std::mem::size_of::<PadArgs>(), 8 * 8 * 3 + 8 + div);
        for src in [
            "struct ViewArgs",
            "struct NaryArgs",
            "struct PadArgs",
            "struct FastDiv",
            "  FastDiv div;\n};",
        ] {
            assert!(KERNELS.contains(src), "{src}");
        }
        assert!(KERNELS.contains(&format!("#define QS_MAX_RANK {MAX_RANK}")));
    }

    /// The host's copies of the tensor-core kernel's tile constants and launch bounds are the
    /// kernel's: the launch's dynamic shared memory (`mma_smem_bytes`) is sized from them (a
    /// smaller size than the kernel's layout would let its copies write past the block's
    /// share), and whether the residual tile gets room from the blocks an SM they ask for.
    #[test]
    fn tensor_core_tile_constants_match_the_kernels() {
        for (name, v) in [
            ("MMA_BM", MMA_BM),
            ("MMA_BN", MMA_BN),
            ("MMA_BK", MMA_BK),
            ("MMA_STAGES", MMA_STAGES),
            ("MMA_THREADS", MMA_THREADS),
        ] {
            assert!(
                KERNELS.contains(&format!("#define {name} {v}\n")),
                "{name} {v}"
            );
        }
        assert!(KERNELS.contains("#define MMA_LD (MMA_BK + 16)\n"));
        assert!(KERNELS.contains(&format!("#define ROWS_MAX_OW {ROWS_MAX_OW}\n")));
        assert!(KERNELS.contains("#define ROWS_CODE_LD (MMA_BN + 16)\n"));
        assert_eq!(ROWS_CODE_LD, MMA_BN + 16);
        // The host's `epi_i8_ok` (and `rows_codes`, which sizes the row kernel's shared memory)
        // against the kernel's `epi_i8_ok`: the same outputs, residuals and activations.
        assert!(
            KERNELS.contains(
                "return y_t == 2 && (res_t < 0 || res_t == 2) && (act <= 2 || act == 24);"
            )
        );
        for act in [
            Act::None,
            Act::Relu,
            Act::Clip(0.0, 6.0),
            Act::Silu,
            Act::Sigmoid,
            Act::HardSwish,
            Act::LeakyRelu(0.1),
            Act::Gelu,
        ] {
            let code = act.code().0;
            for out in [DType::I8, DType::F16, DType::F32] {
                for residual in [false, true] {
                    assert_eq!(
                        rows_codes(out, residual, act),
                        out == DType::I8 && !residual && (code <= 2 || code == 24),
                        "{act:?} {out:?} {residual}"
                    );
                }
                // The streaming 1x1 kernels' condition, residual types as the kernel's codes.
                for res in [None, Some(DType::I8), Some(DType::F16), Some(DType::F32)] {
                    let res_t = res.map_or(-1, |d| d.code());
                    assert_eq!(
                        epi_i8_ok(out, res, act),
                        out.code() == 2 && (res_t < 0 || res_t == 2) && (code <= 2 || code == 24),
                        "{act:?} {out:?} {res:?}"
                    );
                }
            }
        }
        // ResNet-50's regrouped stem (4x4 taps of 16 channels, rows of 112 pixels): five
        // blocks an sm_90 SM with the int8 epilogue in registers, three staging int32 sums.
        for (codes, blocks) in [(true, 5), (false, 3)] {
            let stem = rows_smem_bytes(256, 4, 4, 112, codes);
            assert!(
                stem <= ROWS_MAX_SMEM && blocks * (stem + 1024) <= 228 << 10,
                "{stem}"
            );
        }
        for (bm, blocks) in MMA_OCCUPANCY {
            let bounds = format!("__launch_bounds__(MMA_THREADS, {blocks})");
            let body = format!(
                "conv_i8_mma_body<{}>",
                if bm == MMA_BM { "MMA_BM" } else { "MMA_BM / 2" }
            );
            // The kernel with those bounds runs that tile height.
            let at = KERNELS.find(&bounds).unwrap_or_else(|| panic!("{bounds}"));
            let end = at + KERNELS[at..].find("\n}\n").expect("kernel end");
            assert!(KERNELS[at..end].contains(&body), "{bounds} {body}");
        }
        // An sm_90 SM (228 KiB) keeps the launch bounds' occupancy with the residual tile; the
        // 100 KiB of sm_86 / sm_89 do without it (two 128-pixel blocks, three 64-pixel ones).
        assert!(mma_residual_fits(228 << 10));
        assert!(!mma_residual_fits(100 << 10));
        assert!(2 * (mma_smem_bytes(MMA_BM, false) + 1024) <= 100 << 10);
        assert!(3 * (mma_smem_bytes(MMA_BM / 2, false) + 1024) <= 100 << 10);
        // The streaming 1x1 kernels: the kernel finds its alphas past the weights and the two
        // x and code tiles, as `mmas_smem_bytes` counts them; at reduction 64 an sm_90 SM
        // holds the blocks their launch bounds ask for (four 128-pixel, six 64-pixel); within
        // MMAS_MAX_SMEM the 128-pixel tiles run up to reduction 128, the 64-pixel ones to 256.
        assert!(KERNELS.contains("(smem + MMA_BN * ld + 2 * BM * (ld + ROWS_CODE_LD))"));
        for ((bm, blocks), kernel) in MMA_OCCUPANCY
            .into_iter()
            .zip(["conv_i8_mmas", "conv_i8_mmas64"])
        {
            let decl = format!("__launch_bounds__(MMA_THREADS, {blocks}) {kernel}(");
            assert!(KERNELS.contains(&decl), "{decl}");
            assert!(
                blocks * (mmas_smem_bytes(bm, 64) + 1024) <= 228 << 10,
                "{bm}"
            );
        }
        for (bm, kpad, fits) in [
            (MMA_BM, 128, true),
            (MMA_BM, 256, false),
            (MMA_BM / 2, 256, true),
        ] {
            assert_eq!(
                mmas_smem_bytes(bm, kpad) <= MMAS_MAX_SMEM,
                fits,
                "{bm} {kpad}"
            );
        }
        assert_eq!(MMAS_KPADS.map(|k| MMA_THREADS % (k / 16)), [0; 3]);
    }

    /// `nary4`, `nary8` and `nary16` take an NHWC tensor times a per-channel gate (one vector
    /// read each per group, the gate's too) and a per-pixel scalar operand (one read a group),
    /// and leave a channel count that is not whole groups, an input whose rows do not start on
    /// a group, or an input that steps across the innermost dim, to a narrower kernel or `nary`.
    #[test]
    fn nary_groups_only_where_every_input_reads_whole_groups() {
        let args = |dims: &[i64], strides: &[&[i64]]| {
            let mut a = NaryArgs {
                rank: dims.len() as i32,
                nin: strides.len() as i32,
                ..Default::default()
            };
            a.dims[..dims.len()].copy_from_slice(dims);
            for (k, s) in strides.iter().enumerate() {
                a.strides[k][..s.len()].copy_from_slice(s);
            }
            a.div = FastDiv::of(&a.dims[..dims.len()]);
            a
        };
        let gated = args(&[2, 36, 32], &[&[1152, 32, 1], &[32, 0, 1]]);
        for (width, groups) in [(4, 8), (8, 4), (16, 2)] {
            let (g, vec) = nary_groups(&gated, width).expect("grouped");
            assert_eq!(vec, 0b11);
            assert_eq!(&g.dims[..3], &[2, 36, groups]);
            assert_eq!(
                (&g.strides[0][..3], &g.strides[1][..3]),
                (&[1152, 32, width][..], &[32, 0, width][..])
            );
            assert_eq!(
                fast_quotient(&g.div, 2, 7),
                7 / groups as u32,
                "divides by the group count"
            );
        }
        let (_, vec) =
            nary_groups(&args(&[2, 36, 8], &[&[288, 8, 1], &[36, 1, 0]]), 4).expect("grouped");
        assert_eq!(vec, 0b01, "the per-pixel operand is read once per group");
        assert!(
            nary_groups(&args(&[2, 36, 8], &[&[288, 8, 1]]), 16).is_none(),
            "8 channels"
        );
        assert!(
            nary_groups(&args(&[2, 36, 16], &[&[580, 16, 1]]), 16).is_none(),
            "images 580 elements apart"
        );
        assert!(nary_groups(&args(&[2, 36, 6], &[&[216, 6, 1]]), 4).is_none());
        assert!(nary_groups(&args(&[8, 36], &[&[1, 8]]), 4).is_none());
        assert!(
            nary_groups(&args(&[3, 8], &[&[10, 1]]), 4).is_none(),
            "rows of 10"
        );
    }

    /// The kernels' `next_idx_fast`: umulhi(n, magic) >> shift, on the host.
    fn fast_quotient(f: &FastDiv, k: usize, n: u32) -> u32 {
        if f.magic[k] == 0 {
            n
        } else {
            ((n as u64 * f.magic[k] as u64) >> 32) as u32 >> f.shift[k]
        }
    }

    #[test]
    fn fast_division_is_exact_below_2_pow_31() {
        let divisors: Vec<i64> = (1..=300)
            .chain([511, 512, 513, 3 * 224 * 224, 12544, 65535, 65536, 1 << 20])
            .chain([(1 << 30) + 1, (1 << 31) - 1, 1 << 31])
            .collect();
        let mut seed = 1u64;
        for chunk in divisors.chunks(MAX_RANK) {
            let f = FastDiv::of(chunk);
            for (k, &d) in chunk.iter().enumerate() {
                assert_eq!(f.magic[k] == 0, d == 1, "divisor {d}");
                // Edges (0, multiples of d and their neighbours, the top) and random values.
                let mut ns = vec![0u32, 1, (1 << 31) - 1, (1 << 31) - 2];
                for m in [1i64, 2, 3, (((1i64 << 31) - 1) / d).max(1)] {
                    for delta in [-1i64, 0, 1] {
                        let v = m * d + delta;
                        if (0..1 << 31).contains(&v) {
                            ns.push(v as u32);
                        }
                    }
                }
                for _ in 0..2000 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ns.push((seed >> 33) as u32);
                }
                for n in ns {
                    assert_eq!(fast_quotient(&f, k, n) as i64, n as i64 / d, "{n} / {d}");
                }
            }
        }
    }

    #[test]
    fn collapse_merges_contiguous_runs_and_drops_unit_dims() {
        // A contiguous copy of [1, 8, 4, 4] is one run.
        let (d, s) = collapse(&[1, 8, 4, 4], &[&[128, 16, 4, 1]]);
        assert_eq!((d, s), (vec![128], vec![vec![1]]));
        // NCHW -> NHWC of [2, 3, 4, 5]: out dims [2, 4, 5, 3], H and W merge.
        let (d, s) = collapse(&[2, 4, 5, 3], &[&[60, 5, 1, 20]]);
        assert_eq!((d, s), (vec![2, 20, 3], vec![vec![60, 1, 20]]));
        // A [1, C, 1, 1] scale over [1, C, H, W] next to a full operand: C and H*W stay apart.
        let (d, s) = collapse(&[1, 3, 4, 4], &[&[48, 16, 4, 1], &[3, 1, 0, 0]]);
        assert_eq!(d, vec![3, 16]);
        assert_eq!(s, vec![vec![16, 1], vec![1, 0]]);
        // Rank 0.
        assert_eq!(collapse(&[], &[&[]]), (vec![], vec![vec![]]));
    }

    #[test]
    fn steps_with_bad_sizes_are_errors_before_any_launch() {
        let plan = plan_of(vec![
            tensor("x", &[2, 3, 4], Layout::Plain),
            tensor("y", &[2, 4, 3], Layout::Plain),
            tensor("s", &[3], Layout::Plain),
        ]);
        let view = |strides: Vec<i64>, offset| Step::View {
            name: "t".into(),
            input: 0,
            out: 1,
            dims: vec![2, 4, 3],
            strides,
            offset,
        };
        assert_eq!(check_step(&plan, &view(vec![12, 1, 4], 0)), Ok(()));
        let e = check_step(&plan, &view(vec![12, 1, 4], 1)).expect_err("past the end");
        assert!(e.contains("0..=24 of 24") || e.contains("of 24"), "{e}");
        assert!(check_step(&plan, &view(vec![12, 1], 0)).is_err());
        // A broadcast row over [2, 4, 3] and a constant of the wrong size.
        let nary = |b: Operand| Step::Nary {
            name: "add".into(),
            op: EwOp::Add,
            inputs: vec![Operand::Tensor(1), b],
            strides: vec![vec![12, 3, 1], vec![0, 0, 1]],
            dims: vec![2, 4, 3],
            out: 1,
            act: Act::None,
        };
        assert_eq!(check_step(&plan, &nary(Operand::Tensor(2))), Ok(()));
        assert!(check_step(&plan, &nary(Operand::Const(vec![1.0; 3], vec![3]))).is_ok());
        let e = check_step(&plan, &nary(Operand::Const(vec![1.0; 2], vec![2]))).expect_err("short");
        assert!(e.contains("input 1"), "{e}");
        let reduce = Step::Reduce {
            name: "r".into(),
            input: 0,
            out: 2,
            outer: 1,
            len: 8,
            inner: 3,
            op: ReduceOp::Mean,
        };
        assert_eq!(check_step(&plan, &reduce), Ok(()));
        let gather = |idx: Vec<f32>| Step::Gather {
            name: "g".into(),
            input: 0,
            indices: Operand::Const(idx, vec![1]),
            out: 2,
            outer: 1,
            axis_len: 2,
            count: 1,
            inner: 12,
        };
        assert!(
            check_step(&plan, &gather(vec![-2.0])).is_err(),
            "3 of 12 outputs"
        );
        let missing = Step::Unary {
            name: "u".into(),
            input: 7,
            out: 1,
            act: Act::Relu,
        };
        assert!(
            check_step(&plan, &missing)
                .unwrap_err()
                .contains("tensor 7")
        );
    }

    #[test]
    fn pad_args_follow_stored_dims() {
        // NHWC tensors pad in stored order: [N, H, W, C].
        let plan = plan_of(vec![
            tensor("x", &[1, 3, 4, 4], Layout::Nhwc),
            tensor("y", &[1, 3, 6, 5], Layout::Nhwc),
        ]);
        let a = pad_args(&plan, 0, 1, &[1, 4, 4, 3], &[0, 1, 0, 0], PadMode::Reflect)
            .expect("pad args");
        assert_eq!(&a.out_dims[..4], &[1, 6, 5, 3]);
        assert_eq!(&a.begin[..4], &[0, 1, 0, 0]);
        assert_eq!((a.rank, a.mode), (4, 1));
        assert!(pad_args(&plan, 0, 1, &[1, 3, 4, 4], &[0, 1, 0, 0], PadMode::Edge).is_ok());
        assert!(pad_args(&plan, 0, 1, &[1, 4, 4], &[0, 1, 0], PadMode::Edge).is_err());
    }
}
