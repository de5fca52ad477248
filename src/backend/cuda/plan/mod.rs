//! What the CUDA engine runs: typed, laid-out device tensors and the steps between them
//! (`Step`), as the planner (`ops`) emits them and the engine (`engine`) launches them, plus
//! buffer sharing between tensors whose lifetimes do not overlap. Rank-4 activations live in
//! NHWC; everything else is plain row-major. Nothing here touches a GPU. The rewrites of a
//! lowered plan (dead steps, folded casts and pads, fused pools) are in `folds`.

mod folds;

use std::collections::HashSet;

use crate::backend::{FloatNode, Precision};

pub use folds::{fold_casts, fold_pads_into_depthwise, fuse_global_pools_into_convs, prune_dead};

/// Element type of a device tensor; the codes are the kernels' `dtype` arguments (3 is the
/// kernels' int32, which no planned tensor has).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    I8 = 2,
    /// FP8 E4M3 (`float8e4m3fn`) with a scale, as I8 has one.
    F8 = 4,
}

impl DType {
    pub fn code(self) -> i32 {
        self as i32
    }
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::I8 | DType::F8 => 1,
        }
    }
    /// A quantized type: values are stored steps of the tensor's scale.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::I8 | DType::F8)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Rank-4 tensor stored `[N, H, W, C]`; `shape` stays NCHW.
    Nhwc,
    /// Stored in the order of `shape` (row-major).
    Plain,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    /// Logical (ONNX) shape.
    pub shape: Vec<usize>,
    pub layout: Layout,
    pub dtype: DType,
    /// Quantization scale for int8 and FP8 tensors (1.0 otherwise).
    pub scale: f32,
    /// Tensor this one is a view of (reshape/flatten): shares its buffer.
    pub alias_of: Option<usize>,
}

impl TensorDesc {
    /// What one stored step is worth: the scale of an int8 or FP8 tensor, 1 for a float one
    /// (the units a fused epilogue computes in when it writes or reads this tensor).
    pub fn unit(&self) -> f32 {
        if self.dtype.is_quantized() {
            self.scale
        } else {
            1.0
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.bytes()
    }
    /// (N, C, H*W) of a rank-4 (or rank-2 as [N, C, 1]) tensor.
    pub fn nchw(&self) -> (usize, usize, usize) {
        match self.shape.len() {
            4 => (self.shape[0], self.shape[1], self.shape[2] * self.shape[3]),
            2 => (self.shape[0], self.shape[1], 1),
            1 => (1, self.shape[0], 1),
            _ => (1, self.numel(), 1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    None,
    Relu,
    Clip(f32, f32),
    Sigmoid,
    HardSwish,
    HardSigmoid(f32, f32),
    Tanh,
    Erf,
    /// x * Phi(x) (erf form).
    Gelu,
    /// The tanh approximation of GELU.
    GeluTanh,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Neg,
    Abs,
    Softplus,
    LeakyRelu(f32),
    Elu(f32),
    /// 1 where x == 0, else 0 (logical not on 0/1 floats).
    Not,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    Sign,
    /// x * sigmoid(x).
    Silu,
    Sin,
    Cos,
    /// gamma * (x > 0 ? x : alpha * (exp(x) - 1)).
    Selu(f32, f32),
    Softsign,
    Mish,
}

impl Act {
    /// (code, a0, a1) as the kernels take it (`act_f` in kernels/common.cuh).
    pub fn code(self) -> (i32, f32, f32) {
        match self {
            Act::None => (0, 0.0, 0.0),
            Act::Relu => (1, 0.0, 0.0),
            Act::Clip(a, b) => (2, a, b),
            Act::Sigmoid => (3, 0.0, 0.0),
            Act::HardSwish => (4, 0.0, 0.0),
            Act::HardSigmoid(a, b) => (5, a, b),
            Act::Tanh => (6, 0.0, 0.0),
            Act::Erf => (7, 0.0, 0.0),
            Act::Gelu => (8, 0.0, 0.0),
            Act::GeluTanh => (9, 0.0, 0.0),
            Act::Exp => (10, 0.0, 0.0),
            Act::Log => (11, 0.0, 0.0),
            Act::Sqrt => (12, 0.0, 0.0),
            Act::Reciprocal => (13, 0.0, 0.0),
            Act::Neg => (14, 0.0, 0.0),
            Act::Abs => (15, 0.0, 0.0),
            Act::Softplus => (16, 0.0, 0.0),
            Act::LeakyRelu(a) => (17, a, 0.0),
            Act::Elu(a) => (18, a, 0.0),
            Act::Not => (19, 0.0, 0.0),
            Act::Floor => (20, 0.0, 0.0),
            Act::Ceil => (21, 0.0, 0.0),
            Act::Round => (22, 0.0, 0.0),
            Act::Sign => (23, 0.0, 0.0),
            Act::Silu => (24, 0.0, 0.0),
            Act::Sin => (25, 0.0, 0.0),
            Act::Cos => (26, 0.0, 0.0),
            Act::Selu(a, g) => (27, a, g),
            Act::Softsign => (28, 0.0, 0.0),
            Act::Mish => (29, 0.0, 0.0),
        }
    }

    /// The activation applied on the host (constant folding, tests); the kernels' `act_f`.
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Act::None => v,
            Act::Relu => v.max(0.0),
            Act::Clip(a, b) => v.max(a).min(b),
            Act::Sigmoid => 1.0 / (1.0 + (-v).exp()),
            Act::HardSwish => v * (v + 3.0).clamp(0.0, 6.0) / 6.0,
            Act::HardSigmoid(a, b) => (a * v + b).clamp(0.0, 1.0),
            Act::Tanh => v.tanh(),
            Act::Erf => erf(v),
            Act::Gelu => 0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2)),
            Act::GeluTanh => 0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh()),
            Act::Exp => v.exp(),
            Act::Log => v.ln(),
            Act::Sqrt => v.sqrt(),
            Act::Reciprocal => 1.0 / v,
            Act::Neg => -v,
            Act::Abs => v.abs(),
            Act::Softplus => {
                if v > 20.0 {
                    v
                } else {
                    v.exp().ln_1p()
                }
            }
            Act::LeakyRelu(a) => {
                if v >= 0.0 {
                    v
                } else {
                    a * v
                }
            }
            Act::Elu(a) => {
                if v >= 0.0 {
                    v
                } else {
                    a * (v.exp() - 1.0)
                }
            }
            Act::Not => (v == 0.0) as i32 as f32,
            Act::Floor => v.floor(),
            Act::Ceil => v.ceil(),
            Act::Round => v.round_ties_even(),
            Act::Sign => {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            Act::Silu => v / (1.0 + (-v).exp()),
            Act::Sin => v.sin(),
            Act::Cos => v.cos(),
            Act::Selu(a, g) => g * if v > 0.0 { v } else { a * (v.exp() - 1.0) },
            Act::Softsign => v / (1.0 + v.abs()),
            Act::Mish => v * (if v > 20.0 { v } else { v.exp().ln_1p() }).tanh(),
        }
    }
}

fn erf(x: f32) -> f32 {
    libm::erff(x)
}

/// Elementwise operation of a `Step::Nary` (codes are the `nary` kernel's `op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EwOp {
    Add = 0,
    Mul = 1,
    Sub = 2,
    Div = 3,
    Pow = 4,
    Max = 5,
    Min = 6,
    Equal = 7,
    Less = 8,
    Greater = 9,
    LessOrEqual = 10,
    GreaterOrEqual = 11,
    And = 12,
    Or = 13,
    Xor = 14,
    /// C fmod (ONNX Mod with fmod = 1).
    Fmod = 15,
    /// Python-style modulo (ONNX Mod with fmod = 0): the result takes the divisor's sign.
    Mod = 16,
    /// inputs (cond, a, b): cond != 0 ? a : b.
    Where = 17,
    /// inputs (x, slope): x >= 0 ? x : x * slope.
    PRelu = 18,
    /// One input: y = act(x).
    Copy = 19,
}

impl EwOp {
    pub fn code(self) -> i32 {
        self as i32
    }
    /// Number of inputs the op reads.
    pub fn arity(self) -> usize {
        match self {
            EwOp::Copy => 1,
            EwOp::Where => 3,
            _ => 2,
        }
    }
    /// The op on the host (constant folding and tests), before the activation.
    pub fn apply(self, v: &[f32]) -> f32 {
        let b = |x: bool| x as i32 as f32;
        match self {
            EwOp::Add => v[0] + v[1],
            EwOp::Mul => v[0] * v[1],
            EwOp::Sub => v[0] - v[1],
            EwOp::Div => v[0] / v[1],
            EwOp::Pow => v[0].powf(v[1]),
            EwOp::Max => v[0].max(v[1]),
            EwOp::Min => v[0].min(v[1]),
            EwOp::Equal => b(v[0] == v[1]),
            EwOp::Less => b(v[0] < v[1]),
            EwOp::Greater => b(v[0] > v[1]),
            EwOp::LessOrEqual => b(v[0] <= v[1]),
            EwOp::GreaterOrEqual => b(v[0] >= v[1]),
            EwOp::And => b(v[0] != 0.0 && v[1] != 0.0),
            EwOp::Or => b(v[0] != 0.0 || v[1] != 0.0),
            EwOp::Xor => b((v[0] != 0.0) != (v[1] != 0.0)),
            EwOp::Fmod => v[0] % v[1],
            EwOp::Mod => {
                let r = v[0] % v[1];
                if r != 0.0 && (r < 0.0) != (v[1] < 0.0) {
                    r + v[1]
                } else {
                    r
                }
            }
            EwOp::Where => {
                if v[0] != 0.0 {
                    v[1]
                } else {
                    v[2]
                }
            }
            EwOp::PRelu => {
                if v[0] >= 0.0 {
                    v[0]
                } else {
                    v[0] * v[1]
                }
            }
            EwOp::Copy => v[0],
        }
    }
}

/// Reduction of a `Step::Reduce` (codes are the `reduce` kernel's `op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Mean = 0,
    Sum = 1,
    Max = 2,
    Min = 3,
    /// sqrt(sum x^2)
    L2 = 4,
    SumSquare = 5,
    Prod = 6,
    /// sum |x|
    L1 = 7,
    /// log(sum exp(x))
    LogSumExp = 8,
}

/// Border handling of a `Step::Pad` (codes are the `pad_nd` kernel's `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    Constant = 0,
    Reflect = 1,
    Edge = 2,
    Wrap = 3,
}

/// Most dimensions a strided kernel (`view`, `nary`, `pad_nd`) takes.
pub const MAX_RANK: usize = 8;

/// Quantized form of a convolution: 8-bit weights (OHWI), per-output-channel scales, and
/// the input's scale. `dtype` says what the bytes are: int8 values (I8), or E4M3 codes
/// (F8, the codes' bit patterns held as i8).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantWeights {
    pub x_scale: f32,
    pub w: Vec<i8>,
    pub w_scales: Vec<f32>,
    pub dtype: DType,
}

impl QuantWeights {
    /// The weights' unscaled values (what a step is worth before `w_scales`).
    pub fn values(&self) -> Vec<f32> {
        match self.dtype {
            DType::F8 => self
                .w
                .iter()
                .map(|&v| crate::quant::fp8::e4m3_to_f32(v as u8))
                .collect(),
            _ => self.w.iter().map(|&v| v as f32).collect(),
        }
    }
    /// Int8 weights, which the integer kernels (cuBLASLt int8, cuDNN int8, `__dp4a`) take.
    pub fn is_int8(&self) -> bool {
        self.dtype == DType::I8
    }
}

/// A convolution (or Gemm/MatMul as a 1x1 convolution) with its fused epilogue.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvStep {
    /// Name of the conv node; the fused nodes follow in `fused`.
    pub name: String,
    pub fused: Vec<String>,
    pub input: usize,
    pub out: usize,
    /// Float weights, OHWI `[cout, kh, kw, cin / groups]`.
    pub w: Vec<f32>,
    pub bias: Vec<f32>,
    /// The quantized weights of a layer the Q/DQ plan quantizes (int8 or FP8).
    pub quant: Option<QuantWeights>,
    pub cin: usize,
    pub cout: usize,
    pub k: [usize; 2],
    pub stride: [usize; 2],
    /// top, left, bottom, right.
    pub pads: [usize; 4],
    /// The int8 code the padding reads: 0 (zero padding), or the code of activation
    /// centering's pad value, which `fold_pads_into_depthwise` moves into the conv.
    pub pad_code: i8,
    pub dilation: [usize; 2],
    pub groups: usize,
    pub residual: Option<usize>,
    pub act: Act,
    /// `Some([oh, ow])`: a global average pool is fused into the conv
    /// (`fuse_global_pools_into_convs`). The conv's own output, `oh` x `ow` pixels an image, is
    /// never stored; `out` is its average over those pixels, `[n, cout, 1, 1]`.
    pub pool_hw: Option<[usize; 2]>,
}

impl ConvStep {
    /// 1x1, stride 1, no padding, one group: a plain GEMM over NHWC rows.
    pub fn is_pointwise(&self) -> bool {
        self.k == [1, 1] && self.stride == [1, 1] && self.pads == [0; 4] && self.groups == 1
    }
    pub fn reduction(&self) -> usize {
        self.k[0] * self.k[1] * self.cin / self.groups
    }
    /// Output height and width of the conv itself: its output tensor's (`out_shape`, `[n,
    /// cout, h, w]` or a Gemm's rows), or the pixels a fused global pool averages.
    pub fn out_hw(&self, out_shape: &[usize]) -> (usize, usize) {
        match (self.pool_hw, out_shape) {
            (Some([h, w]), _) => (h, w),
            (None, [_, _, h, w]) => (*h, *w),
            _ => (1, 1),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Tensor(usize),
    /// f32 constant with its dims (the strides of the step that reads it index into it).
    Const(Vec<f32>, Vec<usize>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Conv(ConvStep),
    /// y = act(x), same stored order, with dtype conversion (quantize, dequantize, cast, copy).
    Unary {
        name: String,
        input: usize,
        out: usize,
        act: Act,
    },
    /// Strided read (transpose, slice, expand, tile, layout change, depth-to-space):
    /// `out[i] = in[offset + sum_d idx_d * strides[d]]` where `idx` is `i` unravelled over
    /// `dims` (the output's stored dims, rank <= MAX_RANK); strides may be 0 or negative.
    View {
        name: String,
        input: usize,
        out: usize,
        dims: Vec<usize>,
        strides: Vec<i64>,
        offset: i64,
    },
    /// `out = act(op(inputs))` with NumPy broadcasting: `dims` are the output's stored dims and
    /// `strides[k]` input k's element strides over them (0 where it broadcasts). A constant
    /// operand is uploaded once; its strides index the constant's own data.
    Nary {
        name: String,
        op: EwOp,
        inputs: Vec<Operand>,
        strides: Vec<Vec<i64>>,
        dims: Vec<usize>,
        out: usize,
        act: Act,
    },
    /// Reduces the middle axis of a contiguous `[outer, len, inner]` view into `[outer, inner]`.
    Reduce {
        name: String,
        input: usize,
        out: usize,
        outer: usize,
        len: usize,
        inner: usize,
        op: ReduceOp,
    },
    /// Normalises each contiguous row of `len` elements to zero mean and unit variance
    /// (`rows` rows), then `y = x_hat * gamma[j] + beta[j]` when `gamma` is not empty (`j` the
    /// position in the row; LayerNormalization's scale and bias).
    Norm {
        name: String,
        input: usize,
        out: usize,
        rows: usize,
        len: usize,
        eps: f32,
        gamma: Vec<f32>,
        beta: Vec<f32>,
    },
    /// Batched matrix product, row-major: `out[b] = a[b] (m x k) * B[b]` where B is `k x n`,
    /// or `n x k` when `trans_b`. `a_stride` / `b_stride` are element strides between batches
    /// (0 broadcasts one matrix over the batch). Int8 operands are read with their scales.
    MatMul {
        name: String,
        a: usize,
        b: Operand,
        out: usize,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        a_stride: usize,
        b_stride: usize,
        trans_b: bool,
    },
    /// `out[o, j, i] = in[o, idx[j], i]` over a contiguous `[outer, axis_len, inner]` view;
    /// negative indices count from the end; indices out of range read 0 (checked at plan time
    /// for constant indices).
    Gather {
        name: String,
        input: usize,
        indices: Operand,
        out: usize,
        outer: usize,
        axis_len: usize,
        count: usize,
        inner: usize,
    },
    /// Pooling over NHWC; `pads` top, left, bottom, right; windows that run past the padded
    /// input (ceil mode) are clipped.
    Pool {
        name: String,
        input: usize,
        out: usize,
        max: bool,
        k: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        pads: [usize; 4],
        count_include_pad: bool,
    },
    GlobalAvgPool {
        name: String,
        input: usize,
        out: usize,
    },
    Concat {
        name: String,
        inputs: Vec<usize>,
        out: usize,
        outer: usize,
        inner: usize,
    },
    /// Resize over NHWC. mode 0 nearest, 1 linear, 2 cubic (`cubic_a`, `exclude_outside`).
    Resize {
        name: String,
        input: usize,
        out: usize,
        mode: i32,
        coord: i32,
        nearest: i32,
        scale_hw: [f32; 2],
        cubic_a: f32,
        exclude_outside: bool,
    },
    /// Softmax (or LogSoftmax) over the middle axis of `[outer, len, inner]`.
    Softmax {
        name: String,
        input: usize,
        out: usize,
        outer: usize,
        len: usize,
        inner: usize,
        log: bool,
    },
    /// N-d pad in stored order: `in_dims` the input's stored dims, `begin` the pads before each
    /// (negative crops); the output's dims are its tensor's stored dims.
    Pad {
        name: String,
        input: usize,
        out: usize,
        in_dims: Vec<usize>,
        begin: Vec<i64>,
        mode: PadMode,
        value: f32,
    },
    /// A stem conv's input regrouped into `block` x `block` pixel blocks: out (NHWC, `[N,
    /// block^2 * cp, Hs, Ws]`) at (j, i), channel (bh * block + bw) * cp + c, holds the input
    /// (any layout) at (c, block * j + bh - pads[0], block * i + bw - pads[1]), zero outside it
    /// and for c at or past the input's channels.
    SpaceToDepth {
        name: String,
        input: usize,
        out: usize,
        block: usize,
        /// top, left.
        pads: [usize; 2],
    },
    /// 2-D transposed convolution, input and output plain NCHW, weights `[cin, cout / groups,
    /// kh, kw]` as in ONNX; `pads` top, left, bottom, right.
    ConvTranspose {
        name: String,
        input: usize,
        out: usize,
        w: Vec<f32>,
        bias: Vec<f32>,
        groups: usize,
        k: [usize; 2],
        stride: [usize; 2],
        pads: [usize; 4],
        dilation: [usize; 2],
        act: Act,
    },
}

impl Step {
    pub fn name(&self) -> &str {
        match self {
            Step::Conv(c) => &c.name,
            Step::Unary { name, .. }
            | Step::View { name, .. }
            | Step::Nary { name, .. }
            | Step::Reduce { name, .. }
            | Step::Norm { name, .. }
            | Step::MatMul { name, .. }
            | Step::Gather { name, .. }
            | Step::Pool { name, .. }
            | Step::GlobalAvgPool { name, .. }
            | Step::Concat { name, .. }
            | Step::Resize { name, .. }
            | Step::Softmax { name, .. }
            | Step::Pad { name, .. }
            | Step::SpaceToDepth { name, .. }
            | Step::ConvTranspose { name, .. } => name,
        }
    }
    pub fn inputs(&self) -> Vec<usize> {
        let tensor = |o: &Operand| match o {
            Operand::Tensor(t) => Some(*t),
            Operand::Const(..) => None,
        };
        match self {
            Step::Conv(c) => std::iter::once(c.input).chain(c.residual).collect(),
            Step::Nary { inputs, .. } => inputs.iter().filter_map(tensor).collect(),
            Step::MatMul { a, b, .. } => std::iter::once(*a).chain(tensor(b)).collect(),
            Step::Gather { input, indices, .. } => {
                std::iter::once(*input).chain(tensor(indices)).collect()
            }
            Step::Concat { inputs, .. } => inputs.clone(),
            Step::Unary { input, .. }
            | Step::View { input, .. }
            | Step::Reduce { input, .. }
            | Step::Norm { input, .. }
            | Step::Pool { input, .. }
            | Step::GlobalAvgPool { input, .. }
            | Step::Resize { input, .. }
            | Step::Softmax { input, .. }
            | Step::Pad { input, .. }
            | Step::SpaceToDepth { input, .. }
            | Step::ConvTranspose { input, .. } => vec![*input],
        }
    }
    pub fn output(&self) -> usize {
        match self {
            Step::Conv(c) => c.out,
            Step::Unary { out, .. }
            | Step::View { out, .. }
            | Step::Nary { out, .. }
            | Step::Reduce { out, .. }
            | Step::Norm { out, .. }
            | Step::MatMul { out, .. }
            | Step::Gather { out, .. }
            | Step::Pool { out, .. }
            | Step::GlobalAvgPool { out, .. }
            | Step::Concat { out, .. }
            | Step::Resize { out, .. }
            | Step::Softmax { out, .. }
            | Step::Pad { out, .. }
            | Step::SpaceToDepth { out, .. }
            | Step::ConvTranspose { out, .. } => *out,
        }
    }
    /// Makes the step write `out` instead, its name extended by `+also` (a folded step).
    fn retarget(&mut self, to: usize, also: &str) {
        let (name, out) = match self {
            Step::Conv(c) => (&mut c.name, &mut c.out),
            Step::Unary { name, out, .. }
            | Step::View { name, out, .. }
            | Step::Nary { name, out, .. }
            | Step::Reduce { name, out, .. }
            | Step::Norm { name, out, .. }
            | Step::MatMul { name, out, .. }
            | Step::Gather { name, out, .. }
            | Step::Pool { name, out, .. }
            | Step::GlobalAvgPool { name, out, .. }
            | Step::Concat { name, out, .. }
            | Step::Resize { name, out, .. }
            | Step::Softmax { name, out, .. }
            | Step::Pad { name, out, .. }
            | Step::SpaceToDepth { name, out, .. }
            | Step::ConvTranspose { name, out, .. } => (name, out),
        };
        *out = to;
        name.push('+');
        name.push_str(also);
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Conv(_) => "conv",
            Step::Unary { .. } => "unary",
            Step::View { .. } => "view",
            Step::Nary { .. } => "elementwise",
            Step::Reduce { .. } => "reduce",
            Step::Norm { .. } => "norm",
            Step::MatMul { .. } => "matmul",
            Step::Gather { .. } => "gather",
            Step::Pool { .. } => "pool",
            Step::GlobalAvgPool { .. } => "global_avg_pool",
            Step::Concat { .. } => "concat",
            Step::Resize { .. } => "resize",
            Step::Softmax { .. } => "softmax",
            Step::Pad { .. } => "pad",
            Step::SpaceToDepth { .. } => "space_to_depth",
            Step::ConvTranspose { .. } => "conv_transpose",
        }
    }
    /// The constants the step reads on the device, in the order the engine uploads and passes
    /// them: Nary constant operands in input order, MatMul's constant B, Gather's constant
    /// indices, Norm's gamma then beta (when present), ConvTranspose's weights then bias.
    pub fn constants(&self) -> Vec<&[f32]> {
        fn c(o: &Operand) -> Option<&[f32]> {
            match o {
                Operand::Const(v, _) => Some(v.as_slice()),
                Operand::Tensor(_) => None,
            }
        }
        match self {
            Step::Nary { inputs, .. } => inputs.iter().filter_map(c).collect(),
            Step::MatMul { b, .. } => c(b).into_iter().collect(),
            Step::Gather { indices, .. } => c(indices).into_iter().collect(),
            Step::Norm { gamma, beta, .. } if !gamma.is_empty() => {
                vec![gamma.as_slice(), beta.as_slice()]
            }
            Step::ConvTranspose { w, bias, .. } => vec![w.as_slice(), bias.as_slice()],
            _ => vec![],
        }
    }
}

/// The lowered engine: tensors, steps in execution order, and what precision each node got.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub tensors: Vec<TensorDesc>,
    pub steps: Vec<Step>,
    /// The f32 NCHW host input as a device tensor (Plain, f32).
    pub input: usize,
    /// The f32 output in ONNX order (Plain, f32).
    pub output: usize,
    /// Tensors the host reads after a run besides the output, each f32 in ONNX order (Plain):
    /// a statistics engine's requested tensors. Each keeps a buffer of its own, as the output.
    pub taps: Vec<usize>,
    pub int8_nodes: Vec<String>,
    pub float_nodes: Vec<FloatNode>,
    /// Nodes lowered in FP32 in an FP16 engine: the overflow guard's, as it gave them.
    pub fp32_layers: Vec<crate::fp16_guard::KeptFp32>,
}

impl Plan {
    /// The tensors the host reads after a run: the output, then the taps.
    pub fn host_read(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.output).chain(self.taps.iter().copied())
    }

    /// The tensor that `t` is a view of (`alias_of`), or `t` itself.
    pub fn root(&self, t: usize) -> usize {
        self.tensors[t].alias_of.unwrap_or(t)
    }

    /// How many step inputs read each tensor, a view's reads counted at the tensor it views
    /// (the host's reads not included): what the rewrites of `folds` ask before they move a
    /// tensor's writer or drop it.
    pub fn step_reads(&self) -> Vec<usize> {
        let mut reads = vec![0usize; self.tensors.len()];
        for t in self.steps.iter().flat_map(|s| s.inputs()) {
            reads[self.root(t)] += 1;
        }
        reads
    }
}

pub type PlanResult<T> = Result<T, String>;

/// Type of the float layers: FP16 in FP16 and INT8 engines (as TensorRT builds with both its
/// INT8 and FP16 flags), FP32 in FP32 engines.
pub fn float_type(precision: Precision) -> DType {
    if precision == Precision::Fp32 {
        DType::F32
    } else {
        DType::F16
    }
}

/// OIHW -> OHWI.
pub fn oihw_to_ohwi<T: Copy + Default>(w: &[T], o: usize, i: usize, h: usize, wd: usize) -> Vec<T> {
    let mut out = vec![T::default(); w.len()];
    for a in 0..o {
        for c in 0..i {
            for y in 0..h {
                for x in 0..wd {
                    out[((a * h + y) * wd + x) * i + c] = w[((a * i + c) * h + y) * wd + x];
                }
            }
        }
    }
    out
}

/// ONNX Reshape semantics (0 copies the input dim, -1 is inferred).
pub fn reshape_dims(input: &[usize], spec: &[i64]) -> Option<Vec<usize>> {
    let total: usize = input.iter().product();
    let mut out: Vec<usize> = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (k, &s) in spec.iter().enumerate() {
        match s {
            0 => out.push(*input.get(k)?),
            -1 => {
                if infer.is_some() {
                    return None;
                }
                infer = Some(k);
                out.push(1);
            }
            s if s > 0 => out.push(s as usize),
            _ => return None,
        }
    }
    let known: usize = out.iter().product();
    if let Some(k) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return None;
        }
        out[k] = total / known;
    }
    (out.iter().product::<usize>() == total).then_some(out)
}

pub fn squeeze_dims(input: &[usize], axes: &[i64], squeeze: bool) -> Option<Vec<usize>> {
    if squeeze {
        let r = input.len() as i64;
        let ax: HashSet<usize> = axes
            .iter()
            .map(|&a| (if a < 0 { a + r } else { a }) as usize)
            .collect();
        Some(
            input
                .iter()
                .enumerate()
                .filter(|(k, d)| !(ax.contains(k) && **d == 1))
                .map(|(_, &d)| d)
                .collect(),
        )
    } else {
        let r = (input.len() + axes.len()) as i64;
        let ax: HashSet<usize> = axes
            .iter()
            .map(|&a| (if a < 0 { a + r } else { a }) as usize)
            .collect();
        let mut it = input.iter();
        (0..r as usize)
            .map(|k| {
                if ax.contains(&k) {
                    Some(1)
                } else {
                    it.next().copied()
                }
            })
            .collect()
    }
}

/// Buffer assignment: tensors whose lifetimes do not overlap share a buffer. Returns the slot
/// of every tensor (aliases share their root's) and each slot's size in bytes. `pinned`
/// tensors (the host input, output and taps) get slots of their own for the whole run.
///
/// `ordered(a, b)`: step `a` (before `b` in plan order) finishes before step `b` starts. On one
/// stream that always holds; where steps run on several (`streams::schedule`), a buffer goes
/// to step `b` only once every step that wrote or read its last tensor is ordered before `b`.
pub fn assign_buffers(
    plan: &Plan,
    ordered: impl Fn(usize, usize) -> bool,
) -> (Vec<usize>, Vec<usize>) {
    let nt = plan.tensors.len();
    let root = |t: usize| plan.root(t);
    // Last step reading each root, and every step writing or reading it.
    let mut last_use = vec![None::<usize>; nt];
    let mut users: Vec<Vec<usize>> = vec![vec![]; nt];
    for (s, step) in plan.steps.iter().enumerate() {
        for t in step.inputs() {
            last_use[root(t)] = Some(s);
            users[root(t)].push(s);
        }
        users[root(step.output())].push(s);
    }
    let pinned: Vec<usize> = std::iter::once(plan.input)
        .chain(plan.host_read())
        .map(root)
        .collect();
    let mut slot_of = vec![usize::MAX; nt];
    let mut sizes: Vec<usize> = vec![];
    // Free slots, with the steps that used the tensor they last held.
    let mut free: Vec<(usize, Vec<usize>)> = vec![];
    for &p in &pinned {
        if slot_of[p] == usize::MAX {
            slot_of[p] = sizes.len();
            sizes.push(plan.tensors[p].bytes());
        }
    }
    for (s, step) in plan.steps.iter().enumerate() {
        let o = root(step.output());
        if slot_of[o] == usize::MAX {
            let need = plan.tensors[o].bytes();
            let usable: Vec<usize> = (0..free.len())
                .filter(|&k| free[k].1.iter().all(|&u| ordered(u, s)))
                .collect();
            // Best fit among usable slots, else grow the largest, else a new one.
            let pick = usable
                .iter()
                .filter(|&&k| sizes[free[k].0] >= need)
                .min_by_key(|&&k| sizes[free[k].0])
                .or_else(|| usable.iter().max_by_key(|&&k| sizes[free[k].0]))
                .copied();
            let sl = match pick {
                Some(k) => free.swap_remove(k).0,
                None => {
                    sizes.push(0);
                    sizes.len() - 1
                }
            };
            sizes[sl] = sizes[sl].max(need);
            slot_of[o] = sl;
        }
        // Free roots whose last reader is this step (not the pinned ones, not this output).
        let mut seen = HashSet::new();
        for t in step.inputs() {
            let r = root(t);
            if last_use[r] == Some(s) && !pinned.contains(&r) && r != o && seen.insert(r) {
                free.push((slot_of[r], std::mem::take(&mut users[r])));
            }
        }
    }
    for t in 0..nt {
        let r = root(t);
        if slot_of[r] == usize::MAX {
            slot_of[r] = sizes.len();
            sizes.push(plan.tensors[r].bytes());
        }
        slot_of[t] = slot_of[r];
    }
    (slot_of, sizes)
}
