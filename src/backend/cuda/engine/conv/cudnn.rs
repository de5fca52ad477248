//! Float convs on cuDNN's legacy convolution (`cudnnConvolutionForward`), its algorithms found
//! by timing them (`cudnnFindConvolutionForwardAlgorithmEx`), then the epilogue kernel: the
//! path whose algorithm list `--fp32-math strict` can hold to IEEE FP32.

use std::ffi::c_void;

use cudarc::cudnn::sys as dnn;

use super::super::LIB_WORKSPACE_BYTES;
use super::super::device::{DevBuf, Launch};
use super::{
    ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, epilogue, halves, symmetric_pads,
};
use crate::backend::cuda::error::{CudaError, CudaResult, dnn_ok};
use crate::backend::cuda::plan::{ConvStep, DType, Layout};

pub(super) struct Cudnn;

pub(super) const CUDNN: Cudnn = Cudnn;

impl ConvFamily for Cudnn {
    fn name(&self) -> &'static str {
        "cuDNN conv"
    }
    fn optional(&self) -> bool {
        true
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["cudnn"]
    }
    fn applies(&self, _cx: &Launch, l: &ConvLayer) -> bool {
        l.step.quant.is_none() && symmetric_pads(&l.step)
    }
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        let s = setup(
            cx,
            &l.step,
            l.float,
            l.tf32,
            cx.ptr(l.step.input),
            !l.untimed,
        )?;
        Ok(Some(Box::new(s)))
    }
}

/// A conv set up on cuDNN's legacy API: descriptors, weights and the algorithms that ran.
pub(super) struct CudnnSetup {
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

/// cuDNN convolution of `c` in `float` (FP32 or FP16), its algorithms found by timing them on
/// the input at `x_ptr` (`find`), or in the order cuDNN's heuristics rank them, untimed. The
/// FP16 way sets up its own on the dequantized layer.
pub(super) fn setup(
    cx: &Launch,
    c: &ConvStep,
    float: DType,
    tf32: bool,
    x_ptr: u64,
    find: bool,
) -> CudaResult<CudnnSetup> {
    let t = if float == DType::F16 {
        dnn::cudnnDataType_t::CUDNN_DATA_HALF
    } else {
        dnn::cudnnDataType_t::CUDNN_DATA_FLOAT
    };
    let (xd, od) = (cx.td(c.input), cx.td(c.out));
    if xd.shape.len() != 4 || xd.layout != Layout::Nhwc {
        return Err(CudaError::Unsupported("input is not NHWC rank 4".into()));
    }
    let nhwc = dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
    let i = |v: usize| v as i32;
    let mut s = CudnnSetup {
        x: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        w_desc: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
        w: if float == DType::F16 {
            DevBuf::from_slice(&halves(&c.w))?
        } else {
            DevBuf::from_slice(&c.w)?
        },
        algos: vec![],
    };
    let dims = |d: &[usize]| [i(d[0]), i(d[1]), i(d[2]), i(d[3])];
    unsafe {
        dnn_ok(dnn::cudnnCreateTensorDescriptor(&mut s.x), "create x")?;
        dnn_ok(dnn::cudnnCreateTensorDescriptor(&mut s.y), "create y")?;
        dnn_ok(dnn::cudnnCreateFilterDescriptor(&mut s.w_desc), "create w")?;
        dnn_ok(
            dnn::cudnnCreateConvolutionDescriptor(&mut s.conv),
            "create conv",
        )?;
        let [n, ch, h, w] = dims(&xd.shape);
        dnn_ok(
            dnn::cudnnSetTensor4dDescriptor(s.x, nhwc, t, n, ch, h, w),
            "x descriptor",
        )?;
        let [n, ch, h, w] = dims(&od.shape);
        dnn_ok(
            dnn::cudnnSetTensor4dDescriptor(s.y, nhwc, t, n, ch, h, w),
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
        let math = if float == DType::F16 || tf32 {
            // For FP32 data, tensor-op math is TF32 (as PyTorch's default for cuDNN).
            dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        } else {
            // Strict FP32: what the CPU engine computes (parity tests hold it to 1e-4).
            dnn::cudnnMathType_t::CUDNN_FMA_MATH
        };
        dnn_ok(dnn::cudnnSetConvolutionMathType(s.conv, math), "math type")?;
        let mut perf: Vec<dnn::cudnnConvolutionFwdAlgoPerf_t> = vec![std::mem::zeroed(); 8];
        let mut got = 0i32;
        if find {
            dnn_ok(
                dnn::cudnnFindConvolutionForwardAlgorithmEx(
                    cx.dev.cudnn,
                    s.x,
                    x_ptr as *const c_void,
                    s.w_desc,
                    s.w.ptr as *const c_void,
                    s.conv,
                    s.y,
                    cx.raw_ptr() as *mut c_void,
                    8,
                    &mut got,
                    perf.as_mut_ptr(),
                    cx.ws().0 as *mut c_void,
                    LIB_WORKSPACE_BYTES,
                ),
                "cudnnFindConvolutionForwardAlgorithmEx",
            )?;
        } else {
            dnn_ok(
                dnn::cudnnGetConvolutionForwardAlgorithm_v7(
                    cx.dev.cudnn,
                    s.x,
                    s.w_desc,
                    s.conv,
                    s.y,
                    8,
                    &mut got,
                    perf.as_mut_ptr(),
                ),
                "cudnnGetConvolutionForwardAlgorithm_v7",
            )?;
        }
        s.algos = perf
            .iter()
            .take(got.max(0) as usize)
            .filter(|p| {
                p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && p.memory <= LIB_WORKSPACE_BYTES
                    && (float == DType::F16
                        || tf32
                        || p.mathType != dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
            })
            .map(|p| (p.algo as i32, p.memory))
            .collect();
    }
    if s.algos.is_empty() {
        return Err(CudaError::Unsupported("cuDNN found no algorithm".into()));
    }
    Ok(s)
}

impl CudnnSetup {
    /// The candidates it offers: its three fastest algorithms, wrapped by `imp`.
    pub(super) fn offer(&self, imp: impl Fn(i32) -> ConvImpl) -> Vec<ConvImpl> {
        self.algos
            .iter()
            .take(3)
            .map(|&(algo, _)| imp(algo))
            .collect()
    }
}

impl ConvSetup for CudnnSetup {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        self.offer(|algo| ConvImpl::Cudnn { algo })
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let ConvImpl::Cudnn { algo } = imp else {
            return Err(CudaError::Internal(format!(
                "a cuDNN setup asked for {}",
                imp.key()
            )));
        };
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: `algo` came from cuDNN's own list for these descriptors.
        let algo_e: dnn::cudnnConvolutionFwdAlgo_t = unsafe { std::mem::transmute(*algo as u32) };
        let (ws, ws_bytes) = cx.ws();
        dnn_ok(
            unsafe {
                dnn::cudnnConvolutionForward(
                    cx.dev.cudnn,
                    &one as *const _ as *const c_void,
                    self.x,
                    way.input as *const c_void,
                    self.w_desc,
                    self.w.ptr as *const c_void,
                    self.conv,
                    algo_e,
                    ws as *mut c_void,
                    ws_bytes,
                    &zero as *const _ as *const c_void,
                    self.y,
                    cx.raw_ptr() as *mut c_void,
                )
            },
            "cudnnConvolutionForward",
        )?;
        epilogue(cx, l, way.in_t.code(), l.step.cout, way.alpha, l.bias.ptr)
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }

    fn workspace_bytes(&self, _imp: &ConvImpl) -> usize {
        LIB_WORKSPACE_BYTES
    }
}
