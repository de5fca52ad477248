//! Convs as cuBLASLt GEMMs over NHWC rows (im2col columns for a k x k conv): `GEMM` writes a
//! raw output that the epilogue kernel finishes (int8, FP8 E4M3 on GPUs with FP8 tensor
//! cores, FP16 and FP32 layers); `GEMM_FUSED` writes the layer's output from cuBLASLt's own
//! epilogue (bias, ReLU, the residual as beta * C; an int8 layer's per-channel scale as an
//! alpha vector), so there is no raw pass.

use std::ffi::c_void;

use cudarc::cublaslt::result as r;
use cudarc::cublaslt::sys as lt;

use super::super::LIB_WORKSPACE_BYTES;
use super::super::device::{DevBuf, Launch};
use super::super::kernels::{launch, round_up};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, epilogue, halves, padded_rows};
use crate::backend::cuda::error::{CudaError, CudaResult, have, lt_err, lt_ok};
use crate::backend::cuda::plan::{Act, ConvStep, DType};

/// cuBLASLt GEMM into the raw scratch, then the epilogue kernel.
pub(super) struct Gemm {
    fused: bool,
}

pub(super) const GEMM: Gemm = Gemm { fused: false };
pub(super) const GEMM_FUSED: Gemm = Gemm { fused: true };

impl ConvFamily for Gemm {
    fn name(&self) -> &'static str {
        if self.fused {
            "fused-epilogue cuBLASLt GEMM"
        } else {
            "cuBLASLt GEMM"
        }
    }
    fn optional(&self) -> bool {
        true
    }
    fn tokens(&self) -> &'static [&'static str] {
        if self.fused { &["gemmf"] } else { &["gemm"] }
    }
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        let c = &l.step;
        // A GEMM that is not a plain 1x1 reads im2col columns from the scratch, which the
        // engine sized for float columns up to COL_MAX_BYTES only (quantized ones always).
        let cols_fit = c.quant.is_some() || l.cols_fit(l.float.bytes());
        if self.fused {
            cols_fit && fused_ok(cx, c, l.float)
        } else {
            let typed = match &c.quant {
                None => true,
                Some(q) => q.is_int8() || cx.dev.compute >= crate::backend::cuda::FP8_COMPUTE,
            };
            c.groups == 1 && typed && cols_fit
        }
    }
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let s = if self.fused {
            setup_fused(cx, &l.step, l.m, l.float, l.tf32)?
        } else {
            setup(cx, &l.step, l.m, l.float, l.tf32)?
        };
        Ok(Some(Box::new(s)))
    }
}

/// Whether cuBLASLt can write this layer's output itself: the output in the GEMM's type
/// (int8 for an int8 layer, else the engine's float type), ReLU or no activation, a
/// residual of the output's type, and output channels that keep the rows 16-byte aligned.
fn fused_ok(cx: &Launch, c: &ConvStep, float: DType) -> bool {
    let od = cx.td(c.out);
    let out_t = if c.quant.is_some() { DType::I8 } else { float };
    c.quant.as_ref().is_none_or(|q| q.is_int8())
        && c.groups == 1
        && od.dtype == out_t
        && matches!(c.act, Act::None | Act::Relu)
        && (c.cout * out_t.bytes()).is_multiple_of(16)
        && c.residual.is_none_or(|r| cx.td(r).dtype == out_t)
}

/// A conv set up as a cuBLASLt GEMM: descriptors, heuristic algorithms, padded weights.
pub(super) struct GemmSetup {
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
    /// Integer alpha and beta (an int8 GEMM's scale type).
    int8: bool,
    /// The kernels' type code of D, the raw output the epilogue kernel reads.
    raw_t: i32,
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
    fn new(compute: lt::cublasComputeType_t, scale: lt::cudaDataType_t) -> CudaResult<GemmDesc> {
        let desc =
            r::create_matmul_desc(compute, scale).map_err(lt_err("cublasLtMatmulDescCreate"))?;
        let d = GemmDesc(desc);
        use lt::cublasLtMatmulDescAttributes_t as A;
        d.set(A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
        d.set(A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
        Ok(d)
    }
    fn set<T>(&self, attr: lt::cublasLtMatmulDescAttributes_t, v: &T) -> CudaResult<()> {
        unsafe {
            r::set_matmul_desc_attribute(
                self.0,
                attr,
                v as *const T as *const c_void,
                std::mem::size_of::<T>(),
            )
        }
        .map_err(lt_err(&format!("{attr:?}")))
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

/// The float compute type of a GEMM in `float`: FP32 accumulation, TF32 tensor cores for
/// FP32 data where allowed.
fn float_compute(float: DType, tf32: bool) -> lt::cublasComputeType_t {
    use lt::cublasComputeType_t as C;
    match float {
        DType::F16 => C::CUBLAS_COMPUTE_32F,
        _ if tf32 => C::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => C::CUBLAS_COMPUTE_32F,
    }
}

/// cuBLASLt's FP8 GEMM scales A and B per tensor only (sm_90); an FP8 layer's per-channel
/// weight scales go in the epilogue kernel's alpha, so its GEMM is the raw-output one.
fn no_fp8(c: &ConvStep) -> CudaResult<()> {
    match &c.quant {
        Some(q) if !q.is_int8() => Err(CudaError::Unsupported(
            "no fused-epilogue cuBLASLt GEMM for FP8 layers (per-tensor scales only)".into(),
        )),
        _ => Ok(()),
    }
}

/// The raw-output GEMM of conv `c` (`m` output pixels) in `float`, or in the layer's type
/// for a quantized one: weights `[cout_pad, kpad]`, zero padded. Int8 accumulates in int32;
/// FP8 E4M3 (A transposed, B not: the TN layout cuBLASLt's FP8 GEMM asks for) accumulates
/// in FP32 and writes FP32, since a sum of E4M3 products can pass FP16's 65504 (unit scales:
/// the epilogue's alpha is the input scale times the channel's weight scale). The FP16 way
/// sets up its own on the dequantized layer.
pub(super) fn setup(
    cx: &Launch,
    c: &ConvStep,
    m: usize,
    float: DType,
    tf32: bool,
) -> CudaResult<GemmSetup> {
    use lt::cudaDataType_t as T;
    let k = c.reduction();
    let kpad = round_up(k, 16);
    let cout_pad = round_up(c.cout, 16);
    let (ab_t, d_t, compute, scale_t) = match (&c.quant, float) {
        (Some(q), _) if !q.is_int8() => (
            T::CUDA_R_8F_E4M3,
            T::CUDA_R_32F,
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            T::CUDA_R_32F,
        ),
        (Some(_), _) => (
            T::CUDA_R_8I,
            T::CUDA_R_32I,
            lt::cublasComputeType_t::CUBLAS_COMPUTE_32I,
            T::CUDA_R_32I,
        ),
        (None, DType::F16) => (
            T::CUDA_R_16F,
            T::CUDA_R_16F,
            float_compute(float, tf32),
            T::CUDA_R_32F,
        ),
        (None, _) => (
            T::CUDA_R_32F,
            T::CUDA_R_32F,
            float_compute(float, tf32),
            T::CUDA_R_32F,
        ),
    };
    let w = if let Some(q) = &c.quant {
        DevBuf::from_slice(&padded_rows(&q.w, c.cout, k, cout_pad, kpad))?
    } else {
        let v = padded_rows(&c.w, c.cout, k, cout_pad, kpad);
        if float == DType::F16 {
            DevBuf::from_slice(&halves(&v))?
        } else {
            DevBuf::from_slice(&v)?
        }
    };
    let desc = GemmDesc::new(compute, scale_t)?;
    finish(cx, desc, [ab_t, d_t], w, kpad, cout_pad, m, None)
}

/// The GEMM that writes the layer's output from its own epilogue (`ConvImpl::GemmFused`):
/// the bias and ReLU as cuBLASLt epilogues, the residual as beta * C. An int8 layer's
/// per-channel alpha is a device vector and everything is in the output's int8 units; a
/// float layer's bias is in the output's type (cuBLASLt's default for FP16 / FP32 D).
fn setup_fused(
    cx: &Launch,
    c: &ConvStep,
    m: usize,
    float: DType,
    tf32: bool,
) -> CudaResult<GemmSetup> {
    use lt::cublasLtMatmulDescAttributes_t as A;
    use lt::cublasLtPointerMode_t as M;
    use lt::cudaDataType_t as T;
    no_fp8(c)?;
    let unit = cx.td(c.out).unit();
    let k = c.reduction();
    let kpad = round_up(k, 16);
    let beta = c.residual.map(|r| cx.td(r).unit() / unit);
    let bias: Vec<f32> = c.bias.iter().map(|b| b / unit).collect();
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
        let (ab_t, w, bias_buf) = if float == DType::F16 {
            (
                T::CUDA_R_16F,
                DevBuf::from_slice(&halves(&rows))?,
                DevBuf::from_slice(&halves(&bias))?,
            )
        } else {
            (
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
        let desc = GemmDesc::new(float_compute(float, tf32), T::CUDA_R_32F)?;
        (desc, ab_t, w, fused, ab_t)
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
    finish(cx, desc, [ab_t, ab_t], w, kpad, c.cout, m, Some(fused))
}

/// Matrix layouts (A = weights [rows, kpad] transposed, B = columns [m, kpad], C = D =
/// [m, rows]; `types` of A and B, and of D) and cuBLASLt's heuristic algorithms for them.
#[allow(clippy::too_many_arguments)]
fn finish(
    cx: &Launch,
    desc: GemmDesc,
    types: [lt::cudaDataType_t; 2],
    w: DevBuf,
    kpad: usize,
    rows: usize,
    m: usize,
    fused: Option<FusedOut>,
) -> CudaResult<GemmSetup> {
    use lt::cudaDataType_t as T;
    let [ab_t, d_t] = types;
    let raw_t = match d_t {
        T::CUDA_R_32I => 3,
        T::CUDA_R_16F => DType::F16.code(),
        T::CUDA_R_32F => DType::F32.code(),
        // A fused GEMM's D is the layer's output, which no epilogue kernel reads.
        _ => -1,
    };
    let e = lt_err("cublasLtMatrixLayoutCreate");
    let a = r::create_matrix_layout(ab_t, kpad as u64, rows as u64, kpad as i64).map_err(&e)?;
    let b = r::create_matrix_layout(ab_t, kpad as u64, m as u64, kpad as i64).map_err(&e)?;
    let d = r::create_matrix_layout(d_t, rows as u64, m as u64, rows as i64).map_err(&e)?;
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
        int8: ab_t == T::CUDA_R_8I,
        raw_t,
        fused,
    };
    let pref = r::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
    let ws = LIB_WORKSPACE_BYTES as u64;
    let mut heur: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; 8];
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
                cx.dev.lt,
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
        return Err(CudaError::Unsupported(
            "no cuBLASLt algorithm for this shape".into(),
        ));
    }
    Ok(setup)
}

impl GemmSetup {
    /// The candidates it offers: its three best heuristic algorithms, wrapped by `imp`.
    pub(super) fn offer(
        &self,
        c: &ConvStep,
        imp: impl Fn(usize, bool) -> ConvImpl,
    ) -> Vec<ConvImpl> {
        let im2col = !(c.is_pointwise() && self.kpad == c.cin);
        (0..self.algos.len().min(3))
            .map(|a| imp(a, im2col))
            .collect()
    }
}

impl ConvSetup for GemmSetup {
    fn candidates(&self, l: &ConvLayer) -> Vec<ConvImpl> {
        if self.fused.is_some() {
            self.offer(&l.step, |algo, im2col| ConvImpl::GemmFused { algo, im2col })
        } else {
            self.offer(&l.step, |algo, im2col| ConvImpl::Gemm { algo, im2col })
        }
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let (ConvImpl::Gemm { algo, im2col } | ConvImpl::GemmFused { algo, im2col }) = imp else {
            return Err(CudaError::Internal(format!(
                "a GEMM setup asked for {}",
                imp.key()
            )));
        };
        let c = &l.step;
        let b_ptr = if *im2col {
            self.im2col(cx, l, way)?
        } else {
            way.input
        };
        let (one_f, zero_f, one_i, zero_i) = (1.0f32, 0.0f32, 1i32, 0i32);
        let h = have(self.algos.get(*algo), "cuBLASLt algorithm")?;
        // Fused int8 output: alpha is the device vector, beta the residual weight and C the
        // residual (ignored in beta-zero mode), D the output itself.
        let (al, be, c_ptr, d_ptr): (*const c_void, *const c_void, u64, u64);
        let beta_f;
        if let Some(f) = &self.fused {
            beta_f = f.beta.unwrap_or(0.0);
            al = match &f.alpha {
                Some(a) => a.ptr as *const c_void,
                None => &one_f as *const f32 as _,
            };
            be = &beta_f as *const f32 as _;
            d_ptr = cx.ptr(c.out);
            c_ptr = c.residual.map_or(d_ptr, |r| cx.ptr(r));
        } else if self.int8 {
            (al, be) = (&one_i as *const _ as _, &zero_i as *const _ as _);
            (c_ptr, d_ptr) = (cx.raw_ptr(), cx.raw_ptr());
        } else {
            (al, be) = (&one_f as *const _ as _, &zero_f as *const _ as _);
            (c_ptr, d_ptr) = (cx.raw_ptr(), cx.raw_ptr());
        }
        let (ws, ws_bytes) = cx.ws();
        lt_ok(
            unsafe {
                lt::cublasLtMatmul(
                    cx.dev.lt,
                    self.desc,
                    al,
                    self.w.ptr as *const c_void,
                    self.a,
                    b_ptr as *const c_void,
                    self.b,
                    be,
                    c_ptr as *const c_void,
                    self.d,
                    d_ptr as *mut c_void,
                    self.d,
                    &h.algo,
                    ws as *mut c_void,
                    ws_bytes,
                    cx.stream.cu_stream() as _,
                )
            },
            "cublasLtMatmul",
        )?;
        if self.fused.is_some() {
            return Ok(());
        }
        epilogue(cx, l, self.raw_t, self.cout_pad, way.alpha, l.bias.ptr)
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }

    fn workspace_bytes(&self, imp: &ConvImpl) -> usize {
        match imp {
            ConvImpl::Gemm { algo, .. } | ConvImpl::GemmFused { algo, .. } => {
                self.algos.get(*algo).map_or(0, |a| a.workspaceSize)
            }
            _ => 0,
        }
    }
}

impl GemmSetup {
    /// Writes the im2col columns of `way`'s input to the scratch; returns their pointer.
    fn im2col(&self, cx: &Launch, l: &ConvLayer, way: &ConvWay) -> CudaResult<u64> {
        let c = &l.step;
        let k = &cx.dev.k;
        let u = |v: usize| v as i32;
        let (h, w) = l.in_hw(cx.plan);
        let n = cx.td(c.input).shape[0];
        let esz = way.in_t.bytes();
        if (c.cin * esz).is_multiple_of(16) && self.kpad == c.reduction() {
            // 16-byte vectors: a row of the columns is whole pixels of whole taps.
            let cin_v = c.cin * esz / 16;
            let threads = l.m * c.k[0] * c.k[1] * cin_v;
            launch!(cx.stream, k.im2col_v16, threads; way.input, cx.col_ptr(),
                u(n), u(h), u(w), u(cin_v), u(l.oh), u(l.ow), u(c.k[0]), u(c.k[1]),
                u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]))?;
        } else {
            let threads = l.m * self.kpad;
            launch!(cx.stream, k.im2col, threads; way.input, cx.col_ptr(), esz as i32,
                u(n), u(h), u(w), u(c.cin), u(l.oh), u(l.ow), u(c.k[0]), u(c.k[1]),
                u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]), self.kpad as i64)?;
        }
        Ok(cx.col_ptr())
    }
}
