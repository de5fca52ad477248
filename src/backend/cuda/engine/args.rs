//! The argument structs of the strided kernels (`view`, `nary*`, `pad_nd`), field for field
//! as kernels/common.cuh declares them, built from a step's dims and strides with every read checked
//! against the tensor or constant it reads: the kernels trust them.

use cudarc::driver::DeviceRepr;

use crate::backend::cuda::error::{CudaResult, drv, ensure};
use crate::backend::cuda::plan::{Layout, MAX_RANK, Operand, PadMode, Plan, TensorDesc};

/// `ViewArgs` of kernels/common.cuh (the `view` kernel's strided read), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ViewArgs {
    pub(super) dims: [i64; MAX_RANK],
    pub(super) strides: [i64; MAX_RANK],
    pub(super) offset: i64,
    pub(super) rank: i32,
    pub(super) pad: i32,
    pub(super) div: FastDiv,
}
unsafe impl DeviceRepr for ViewArgs {}

/// `NaryArgs` of kernels/common.cuh: the output's dims, each input's strides over them, its device
/// pointer, dtype code (-1: f32 constant buffer) and scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct NaryArgs {
    pub(super) dims: [i64; MAX_RANK],
    pub(super) strides: [[i64; MAX_RANK]; 3],
    pub(super) ptrs: [u64; 3],
    pub(super) t: [i32; 3],
    pub(super) scale: [f32; 3],
    pub(super) rank: i32,
    pub(super) nin: i32,
    pub(super) div: FastDiv,
}
unsafe impl DeviceRepr for NaryArgs {}

/// `PadArgs` of kernels/common.cuh (the `pad_nd` kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct PadArgs {
    pub(super) out_dims: [i64; MAX_RANK],
    pub(super) in_dims: [i64; MAX_RANK],
    pub(super) begin: [i64; MAX_RANK],
    pub(super) rank: i32,
    pub(super) mode: i32,
    pub(super) div: FastDiv,
}
unsafe impl DeviceRepr for PadArgs {}

/// `FastDiv` of kernels/common.cuh: per dim, the multiplier and shift that divide an index below 2^31
/// by the dim as `umulhi(n, magic) >> shift` (magic 0: a dim of 1, or one no fast index meets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct FastDiv {
    pub(super) magic: [u32; MAX_RANK],
    pub(super) shift: [u32; MAX_RANK],
}
unsafe impl DeviceRepr for FastDiv {}

impl FastDiv {
    /// With l = ceil(log2 d) and magic = ceil(2^(31 + l) / d) < 2^32 (e = magic * d -
    /// 2^(31 + l) < d), n * magic / 2^(31 + l) exceeds n / d by n * e / (d * 2^(31 + l)),
    /// below 2^-l <= 1 / d for n < 2^31: the floor is n / d's (Granlund and Montgomery 1994,
    /// for 31-bit dividends). The shift is l - 1 because umulhi already drops 32 bits.
    pub(super) fn of(dims: &[i64]) -> FastDiv {
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

/// Product that saturates instead of overflowing (a saturated size never matches a tensor).
pub(super) fn prod(v: &[usize]) -> usize {
    v.iter().fold(1usize, |a, &b| a.saturating_mul(b))
}

/// Dims in stored order: `[N, H, W, C]` for an NHWC rank-4 tensor, else its shape.
pub(super) fn stored_dims(t: &TensorDesc) -> Vec<usize> {
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
pub(super) fn collapse(dims: &[usize], strides: &[&[i64]]) -> (Vec<i64>, Vec<Vec<i64>>) {
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
pub(super) fn in_bounds(
    what: &str,
    dims: &[i64],
    strides: &[i64],
    offset: i64,
    len: usize,
) -> CudaResult<()> {
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

pub(super) fn operand_len(plan: &Plan, o: &Operand) -> usize {
    match o {
        Operand::Tensor(t) => plan.tensors[*t].numel(),
        Operand::Const(v, _) => v.len(),
    }
}

/// The `view` kernel's arguments for a `Step::View`, its read checked against the input.
pub(super) fn view_args(
    plan: &Plan,
    input: usize,
    out: usize,
    dims: &[usize],
    strides: &[i64],
    offset: i64,
) -> CudaResult<ViewArgs> {
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
pub(super) fn nary_args(
    plan: &Plan,
    inputs: &[Operand],
    strides: &[Vec<i64>],
    dims: &[usize],
    out: usize,
) -> CudaResult<NaryArgs> {
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
pub(super) fn nary_groups(a: &NaryArgs, width: i64) -> Option<(NaryArgs, i32)> {
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
/// The `pad_nd` kernel's arguments for a `Step::Pad`.
pub(super) fn pad_args(
    plan: &Plan,
    input: usize,
    out: usize,
    in_dims: &[usize],
    begin: &[i64],
    mode: PadMode,
) -> CudaResult<PadArgs> {
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

/// `TmaMap` of kernels/conv_i8_wgmma.cu: a tensor map (`CUtensorMap`, which the driver
/// encodes and the tensor memory accelerator reads its copies' shape from), passed by value.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorMap([u64; 16]);

unsafe impl DeviceRepr for TensorMap {}

/// How a tensor map lays a box's rows out in shared memory: each 16-byte piece of a row moved
/// by the row's place in a 512-byte (64-byte rows) or 1024-byte (128-byte rows) period.
#[derive(Clone, Copy, Debug)]
pub enum Swizzle {
    B64,
    B128,
}

impl TensorMap {
    /// The map of `rows` rows of `row_bytes` int8 values at device address `ptr`, row r at
    /// `ptr + r * stride` (rows may overlap: a stem's windows), copied in boxes of `[bytes,
    /// rows]` laid out with `swizzle`, zero-filled past the rows and columns. The rows start
    /// 16-byte aligned, in whole 16-byte pieces, as the driver requires; a box's row is at
    /// most its swizzle's period.
    pub fn rows(
        ptr: u64,
        [row_bytes, stride]: [usize; 2],
        rows: usize,
        [box_bytes, box_rows]: [usize; 2],
        swizzle: Swizzle,
    ) -> CudaResult<TensorMap> {
        use cudarc::driver::sys;
        let (mode, period) = match swizzle {
            Swizzle::B64 => (sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B, 64),
            Swizzle::B128 => (sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B, 128),
        };
        ensure(
            ptr.is_multiple_of(16)
                && row_bytes.is_multiple_of(16)
                && stride.is_multiple_of(16)
                && stride > 0
                && rows > 0
                && box_bytes <= period
                && box_rows <= 256,
            || {
                format!(
                    "tensor map of {rows} rows of {row_bytes} bytes {stride} apart, boxes \
                     {box_bytes} x {box_rows}"
                )
            },
        )?;
        let mut map = TensorMap::default();
        let dims = [row_bytes as u64, rows as u64];
        let strides = [stride as u64];
        let boxes = [box_bytes as u32, box_rows as u32];
        let steps = [1u32, 1];
        // Safety: `map` is a CUtensorMap's 128 bytes, 64-byte aligned; the arrays are the
        // rank-2 shapes the call reads (one stride: the outer dim's).
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                (&mut map as *mut TensorMap).cast(),
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                2,
                ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                mode,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        drv(status.result(), "cuTensorMapEncodeTiled")?;
        Ok(map)
    }
}
