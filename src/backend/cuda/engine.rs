//! Device side of the CUDA backend: allocates the plan's buffers and weights, picks each
//! convolution's implementation by timing the candidates (cuDNN's algorithms through
//! `cudnnFindConvolutionForwardAlgorithmEx`, cuBLASLt GEMM over NHWC rows (with im2col for
//! k x k and int8), the direct NVRTC kernel), captures the whole run in a CUDA graph, and
//! times it with CUDA events.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::cublaslt::sys as lt;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, result, sys,
};

use super::cache::Choices;
use super::plan::{ConvStep, DType, Layout, Operand, Plan, Step, assign_buffers};
use crate::backend::{BackendError, Engine, EngineInfo, LayerTime, Output, Precision};

const KERNELS: &str = include_str!("kernels.cu");
/// Workspace offered to cuDNN and cuBLASLt.
const LIB_WORKSPACE_BYTES: usize = 64 << 20;
/// Direct kernel is only timed below this many MACs (it is a correctness fallback).
const DIRECT_MAX_MACS: f64 = 2e8;

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

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Perm {
    out_dims: [i64; 6],
    in_strides: [i64; 6],
    rank: i32,
}
unsafe impl DeviceRepr for Perm {}

struct Kernels {
    epilogue: CudaFunction,
    conv_direct: CudaFunction,
    im2col: CudaFunction,
    unary: CudaFunction,
    binary: CudaFunction,
    transpose: CudaFunction,
    pool: CudaFunction,
    gap: CudaFunction,
    concat: CudaFunction,
    resize: CudaFunction,
    softmax: CudaFunction,
    pad: CudaFunction,
}

/// PTX of `kernels.cu`, compiled once per process (per compute capability).
fn ptx(arch: &str) -> DevResult<String> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        // cuda_fp16.h: NVRTC ships it, but older releases need the toolkit's include folder.
        let include_paths: Vec<String> = super::libs::include_dirs()
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
            include_paths,
            ..Default::default()
        };
        cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts)
            .map(|p| p.to_src())
            .map_err(|e| format!("NVRTC: {e:?}"))
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

macro_rules! launch {
    ($stream:expr, $f:expr, $n:expr; $($a:expr),* $(,)?) => {{
        let cfg = elems_cfg($n);
        let args = ($($a,)*);
        let mut b = $stream.launch_builder(&$f);
        push_args!(b, args; (0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35); $($a),*);
        drv(unsafe { b.launch(cfg) }, "kernel launch").map(|_| ())
    }};
}

macro_rules! push_args {
    ($b:ident, $args:ident; ($($idx:tt)*); ) => {};
    ($b:ident, $args:ident; ($i0:tt $($idx:tt)*); $a0:expr $(, $a:expr)*) => {
        $b.arg(&$args.$i0);
        push_args!($b, $args; ($($idx)*); $($a),*);
    };
}

/// Shared handles: context, stream, kernels, cuDNN and cuBLASLt.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    k: Kernels,
    cudnn: dnn::cudnnHandle_t,
    lt: lt::cublasLtHandle_t,
    pub name: String,
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
        let f = |n: &str| drv(module.load_function(n), n);
        let k = Kernels {
            epilogue: f("epilogue")?,
            conv_direct: f("conv_direct")?,
            im2col: f("im2col")?,
            unary: f("unary")?,
            binary: f("binary")?,
            transpose: f("transpose")?,
            pool: f("pool")?,
            gap: f("global_avg_pool")?,
            concat: f("concat_part")?,
            resize: f("resize")?,
            softmax: f("softmax")?,
            pad: f("pad_nhwc")?,
        };
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
        })
    }
}

/// How one convolution runs.
#[derive(Clone, Debug, PartialEq)]
pub enum ConvImpl {
    Direct,
    /// cuBLASLt GEMM: `algo` is the index in the heuristic list; `im2col` when not pointwise.
    Gemm {
        algo: usize,
        im2col: bool,
    },
    Cudnn {
        algo: i32,
    },
}

impl ConvImpl {
    pub fn key(&self) -> String {
        match self {
            ConvImpl::Direct => "direct".into(),
            ConvImpl::Gemm { algo, im2col } => {
                format!("gemm:{algo}:{}", if *im2col { "im2col" } else { "rows" })
            }
            ConvImpl::Cudnn { algo } => format!("cudnn:{algo}"),
        }
    }
    pub fn parse(s: &str) -> Option<ConvImpl> {
        let p: Vec<&str> = s.split(':').collect();
        match p.as_slice() {
            ["direct"] => Some(ConvImpl::Direct),
            ["gemm", a, m] => Some(ConvImpl::Gemm {
                algo: a.parse().ok()?,
                im2col: *m == "im2col",
            }),
            ["cudnn", a] => Some(ConvImpl::Cudnn {
                algo: a.parse().ok()?,
            }),
            _ => None,
        }
    }
}

struct GemmSetup {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    algos: Vec<lt::cublasLtMatmulHeuristicResult_t>,
    w: DevBuf,
    kpad: usize,
    cout_pad: usize,
    int8: bool,
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
    gemm: Option<GemmSetup>,
    cudnn: Option<CudnnSetup>,
    chosen: ConvImpl,
    m: usize,
    oh: usize,
    ow: usize,
}

pub struct CudaEngine {
    dev: Device,
    plan: Plan,
    bufs: Vec<DevBuf>,
    slot_of: Vec<usize>,
    convs: HashMap<usize, ConvRt>,
    consts: HashMap<usize, DevBuf>,
    scratch: DevBuf,
    raw_off: usize,
    col_off: usize,
    ws_off: usize,
    graph: Option<cudarc::driver::CudaGraph>,
    info: EngineInfo,
    batch: usize,
    out_shape: Vec<usize>,
}

// The raw cuDNN / cuBLASLt handles are only used from the thread that owns the engine.
unsafe impl Send for CudaEngine {}

fn round_up(v: usize, m: usize) -> usize {
    v.div_ceil(m) * m
}

impl CudaEngine {
    fn ptr(&self, t: usize) -> u64 {
        self.bufs[self.slot_of[t]].ptr
    }

    /// Builds the engine: buffers, weights, per-conv choice (timed, or from `cached`).
    pub fn build(
        dev: Device,
        plan: Plan,
        precision: Precision,
        batch: usize,
        cached: &Choices,
    ) -> DevResult<(CudaEngine, Choices)> {
        drv(dev.ctx.bind_to_thread(), "binding the context")?;
        let (free_before, _) = drv(result::mem_get_info(), "cuMemGetInfo")?;
        let (slot_of, sizes) = assign_buffers(&plan);
        let mut bufs = vec![];
        for &s in &sizes {
            bufs.push(DevBuf::new(s)?);
        }
        let float = if precision == Precision::Fp16 {
            DType::F16
        } else {
            DType::F32
        };
        // Scratch: raw conv output + im2col columns + library workspace.
        let (mut raw_max, mut col_max) = (0usize, 0usize);
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
                let esz = if c.int8.is_some() { 1 } else { float.bytes() };
                if c.groups == 1 && (c.int8.is_some() || m * kpad * esz <= 256 << 20) {
                    col_max = col_max.max(m * kpad * esz);
                }
                let alpha: Vec<f32> = match &c.int8 {
                    Some(q) => q.w_scales.iter().map(|s| s * q.x_scale).collect(),
                    None => vec![1.0; c.cout],
                };
                let rt = ConvRt {
                    step: c.clone(),
                    alpha: DevBuf::from_slice(&alpha)?,
                    bias: DevBuf::from_slice(&c.bias)?,
                    direct_w: None,
                    gemm: None,
                    cudnn: None,
                    chosen: ConvImpl::Direct,
                    m,
                    oh,
                    ow,
                };
                weights_bytes += 8 * c.cout as u64;
                convs.insert(si, rt);
            }
        }
        let raw_off = 0;
        let col_off = round_up(raw_max, 256);
        let ws_off = col_off + round_up(col_max, 256);
        let scratch = DevBuf::new(ws_off + LIB_WORKSPACE_BYTES)?;
        let mut consts = HashMap::new();
        for (si, s) in plan.steps.iter().enumerate() {
            if let Step::Binary {
                b: Operand::Const(v, _),
                ..
            } = s
            {
                weights_bytes += 4 * v.len() as u64;
                consts.insert(si, DevBuf::from_slice(v)?);
            }
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
            ws_off,
            graph: None,
            info: EngineInfo::default(),
            batch,
        };
        // Choose each conv's implementation, in execution order (inputs exist by then).
        let mut choices = Choices::default();
        let conv_ids: Vec<usize> = {
            let mut v: Vec<usize> = eng.convs.keys().copied().collect();
            v.sort();
            v
        };
        for si in conv_ids {
            let chosen = eng.choose_conv(si, float, cached)?;
            choices
                .convs
                .insert(eng.convs[&si].step.name.clone(), chosen.key());
        }
        for rt in eng.convs.values() {
            weights_bytes += rt.direct_w.as_ref().map_or(0, |b| b.bytes as u64)
                + rt.gemm.as_ref().map_or(0, |g| g.w.bytes as u64)
                + rt.cudnn.as_ref().map_or(0, |g| g.w.bytes as u64);
        }
        drv(eng.dev.stream.synchronize(), "synchronize")?;
        // Per-layer times, then the graph.
        eng.run_steps()?;
        drv(eng.dev.stream.synchronize(), "first run")?;
        let layer_times = eng.profile_layers()?;
        let graph_note = match eng.capture() {
            Ok(()) => "CUDA graph".to_string(),
            Err(e) => format!("eager launches (graph capture failed: {e})"),
        };
        let (free_after, _) = drv(result::mem_get_info(), "cuMemGetInfo")?;
        eng.info = EngineInfo {
            backend: "cuda".into(),
            device: format!("{} ({graph_note})", eng.dev.name),
            simulated: false,
            int8_nodes: eng.plan.int8_nodes.len(),
            float_nodes: eng.plan.float_nodes.clone(),
            weights_bytes,
            activations_bytes: eng.bufs.iter().map(|b| b.bytes as u64).sum(),
            workspace_bytes: eng.scratch.bytes as u64,
            device_mem_bytes: Some(free_before.saturating_sub(free_after) as u64),
            layer_times,
        };
        Ok((eng, choices))
    }

    fn raw_ptr(&self) -> u64 {
        self.scratch.ptr + self.raw_off as u64
    }
    fn col_ptr(&self) -> u64 {
        self.scratch.ptr + self.col_off as u64
    }
    fn ws_ptr(&self) -> u64 {
        self.scratch.ptr + self.ws_off as u64
    }

    fn choose_conv(&mut self, si: usize, float: DType, cached: &Choices) -> DevResult<ConvImpl> {
        let (step, m) = {
            let rt = &self.convs[&si];
            (rt.step.clone(), rt.m)
        };
        let in_t = self.plan.tensors[step.input].dtype;
        let int8 = step.int8.is_some();
        // Set up every applicable implementation.
        let macs = (m * step.cout * step.reduction()) as f64;
        let gemm_ok = step.groups == 1
            && (int8
                || step.is_pointwise()
                || m * round_up(step.reduction(), 16) * float.bytes() <= 256 << 20);
        if gemm_ok {
            match self.setup_gemm(&step, m, float) {
                Ok(g) => self.convs.get_mut(&si).expect("conv").gemm = Some(g),
                Err(e) => log(&format!("{}: no cuBLASLt GEMM ({e})", step.name)),
            }
        }
        if !int8 && step.pads[0] == step.pads[2] && step.pads[1] == step.pads[3] {
            match self.setup_cudnn(si, &step, float) {
                Ok(c) => self.convs.get_mut(&si).expect("conv").cudnn = Some(c),
                Err(e) => log(&format!("{}: no cuDNN conv ({e})", step.name)),
            }
        }
        let mut cands: Vec<ConvImpl> = vec![];
        {
            let rt = &self.convs[&si];
            if let Some(g) = &rt.gemm {
                let im2col = !(step.is_pointwise() && g.kpad == step.cin);
                for a in 0..g.algos.len().min(3) {
                    cands.push(ConvImpl::Gemm { algo: a, im2col });
                }
            }
            if let Some(c) = &rt.cudnn {
                for &(a, _) in c.algos.iter().take(3) {
                    cands.push(ConvImpl::Cudnn { algo: a });
                }
            }
        }
        if cands.is_empty() || macs < DIRECT_MAX_MACS {
            let w = match &step.int8 {
                Some(q) => DevBuf::from_slice(&q.w)?,
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
        let _ = in_t;
        let pick = if let Some(c) = cached
            .convs
            .get(&step.name)
            .and_then(|k| ConvImpl::parse(k))
            .filter(|c| cands.contains(c))
        {
            c
        } else if cands.len() == 1 {
            cands[0].clone()
        } else {
            let mut best = (f64::INFINITY, cands[0].clone());
            for c in &cands {
                self.convs.get_mut(&si).expect("conv").chosen = c.clone();
                let t = match self.time_step(si, 5) {
                    Ok(t) => t,
                    Err(e) => {
                        log(&format!("{}: candidate {} failed: {e}", step.name, c.key()));
                        continue;
                    }
                };
                if t < best.0 {
                    best = (t, c.clone());
                }
            }
            best.1
        };
        let rt = self.convs.get_mut(&si).expect("conv");
        rt.chosen = pick.clone();
        // Keep only what the choice needs.
        if !matches!(pick, ConvImpl::Gemm { .. }) {
            rt.gemm = None;
        }
        if !matches!(pick, ConvImpl::Cudnn { .. }) {
            rt.cudnn = None;
        }
        if pick != ConvImpl::Direct {
            rt.direct_w = None;
        }
        Ok(pick)
    }

    fn setup_gemm(&self, c: &ConvStep, m: usize, float: DType) -> DevResult<GemmSetup> {
        let int8 = c.int8.is_some();
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
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType_t::CUDA_R_32F,
            )
        };
        // Weights [cout_pad, kpad], zero padded.
        let w = if let Some(q) = &c.int8 {
            let mut v = vec![0i8; cout_pad * kpad];
            for o in 0..c.cout {
                v[o * kpad..o * kpad + k].copy_from_slice(&q.w[o * k..(o + 1) * k]);
            }
            DevBuf::from_slice(&v)?
        } else {
            let mut v = vec![0f32; cout_pad * kpad];
            for o in 0..c.cout {
                v[o * kpad..o * kpad + k].copy_from_slice(&c.w[o * k..(o + 1) * k]);
            }
            if float == DType::F16 {
                let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                DevBuf::from_slice(&h)?
            } else {
                DevBuf::from_slice(&v)?
            }
        };
        use cudarc::cublaslt::result as r;
        let e = |x: r::CublasError| format!("{x}");
        let desc = r::create_matmul_desc(compute, scale_t).map_err(e)?;
        let ta: i32 = 1; // CUBLAS_OP_T
        let tb: i32 = 0; // CUBLAS_OP_N
        unsafe {
            r::set_matmul_desc_attribute(
                desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &ta as *const _ as *const c_void,
                std::mem::size_of_val(&ta),
            )
            .map_err(e)?;
            r::set_matmul_desc_attribute(
                desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &tb as *const _ as *const c_void,
                std::mem::size_of_val(&tb),
            )
            .map_err(e)?;
        }
        let a =
            r::create_matrix_layout(ab_t, kpad as u64, cout_pad as u64, kpad as i64).map_err(e)?;
        let b = r::create_matrix_layout(ab_t, kpad as u64, m as u64, kpad as i64).map_err(e)?;
        let d =
            r::create_matrix_layout(d_t, cout_pad as u64, m as u64, cout_pad as i64).map_err(e)?;
        let pref = r::create_matmul_pref().map_err(e)?;
        let ws = LIB_WORKSPACE_BYTES as u64;
        unsafe {
            r::set_matmul_pref_attribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const _ as *const c_void,
                8,
            )
            .map_err(e)?;
        }
        let mut heur: Vec<lt::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; 8];
        let mut count = 0i32;
        let st = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                self.dev.lt,
                desc,
                a,
                b,
                d,
                d,
                pref,
                8,
                heur.as_mut_ptr(),
                &mut count,
            )
        };
        unsafe {
            r::destroy_matmul_pref(pref).map_err(e)?;
        }
        let mut setup = GemmSetup {
            desc,
            a,
            b,
            d,
            algos: vec![],
            w,
            kpad,
            cout_pad,
            int8,
        };
        lt_ok(st, "cublasLtMatmulAlgoGetHeuristic")?;
        let algos: Vec<_> = heur
            .into_iter()
            .take(count.max(0) as usize)
            .filter(|h| h.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .collect();
        if algos.is_empty() {
            return Err("no cuBLASLt algorithm for this shape".into());
        }
        setup.algos = algos;
        Ok(setup)
    }

    fn setup_cudnn(&self, si: usize, c: &ConvStep, float: DType) -> DevResult<CudnnSetup> {
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
            let math = if float == DType::F16 {
                dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            } else {
                // No TF32: FP32 engines are compared with the CPU at 1e-3.
                dnn::cudnnMathType_t::CUDNN_FMA_MATH
            };
            dnn_ok(dnn::cudnnSetConvolutionMathType(s.conv, math), "math type")?;
            let mut perf: Vec<dnn::cudnnConvolutionFwdAlgoPerf_t> = vec![std::mem::zeroed(); 8];
            let mut got = 0i32;
            let _ = si;
            dnn_ok(
                dnn::cudnnFindConvolutionForwardAlgorithmEx(
                    self.dev.cudnn,
                    s.x,
                    self.ptr(c.input) as *const c_void,
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

    /// Times step `si` alone (median of `reps` runs, ms).
    fn time_step(&self, si: usize, reps: usize) -> DevResult<f64> {
        let ctx = &self.dev.ctx;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (e0, e1) = (
            drv(ctx.new_event(flags), "event")?,
            drv(ctx.new_event(flags), "event")?,
        );
        self.run_step(si)?;
        let mut ts = vec![];
        for _ in 0..reps {
            drv(e0.record(&self.dev.stream), "event record")?;
            self.run_step(si)?;
            drv(e1.record(&self.dev.stream), "event record")?;
            ts.push(drv(e0.elapsed_ms(&e1), "event elapsed")? as f64);
        }
        ts.sort_by(f64::total_cmp);
        Ok(ts[ts.len() / 2])
    }

    fn profile_layers(&self) -> DevResult<Vec<LayerTime>> {
        let mut out = vec![];
        for (si, s) in self.plan.steps.iter().enumerate() {
            let t = self.time_step(si, 3)?;
            let kernel = match (s, self.convs.get(&si)) {
                (Step::Conv(c), Some(rt)) => {
                    let p = if c.int8.is_some() { "int8" } else { "float" };
                    let what = match &rt.chosen {
                        ConvImpl::Direct => "direct kernel".to_string(),
                        ConvImpl::Gemm { im2col, .. } => {
                            format!("cuBLASLt GEMM{}", if *im2col { " + im2col" } else { "" })
                        }
                        ConvImpl::Cudnn { algo } => format!("cuDNN algo {algo}"),
                    };
                    let out = if self.plan.tensors[c.out].dtype == DType::I8 {
                        " -> int8"
                    } else {
                        ""
                    };
                    format!("{p} {what}{out}")
                }
                _ => format!("nvrtc {}", s.kind()),
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
            });
        }
        Ok(out)
    }

    fn capture(&mut self) -> DevResult<()> {
        let st = self.dev.stream.clone();
        drv(st.synchronize(), "synchronize")?;
        drv(
            st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "begin capture",
        )?;
        let r = self.run_steps();
        let g = drv(
            st.end_capture(sys::CUgraphInstantiate_flags(0)),
            "end capture",
        );
        r?;
        let g = g?.ok_or("empty graph")?;
        drv(g.upload(), "graph upload")?;
        drv(g.launch(), "graph launch")?;
        drv(st.synchronize(), "graph run")?;
        self.graph = Some(g);
        Ok(())
    }

    fn run_steps(&self) -> DevResult<()> {
        for si in 0..self.plan.steps.len() {
            self.run_step(si)
                .map_err(|e| format!("step `{}`: {e}", self.plan.steps[si].name()))?;
        }
        Ok(())
    }

    fn launch_all(&self) -> DevResult<()> {
        match &self.graph {
            Some(g) => drv(g.launch(), "graph launch"),
            None => self.run_steps(),
        }
    }

    fn run_step(&self, si: usize) -> DevResult<()> {
        let s = &self.plan.steps[si];
        let st = &self.dev.stream;
        let k = &self.dev.k;
        let td = |t: usize| &self.plan.tensors[t];
        let code = |t: usize| td(t).dtype.code();
        let sc = |t: usize| td(t).scale;
        match s {
            Step::Conv(_) => self.run_conv(si),
            Step::Unary {
                input, out, act, ..
            } => {
                let (a, a0, a1) = act.code();
                let n = td(*out).numel();
                launch!(st, k.unary, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out), n as i64, a, a0, a1)
            }
            Step::Binary {
                a,
                b,
                mode,
                op,
                out,
                act,
                ..
            } => {
                let (ac, a0, a1) = act.code();
                let d = td(*out);
                let (_, c, hw) = d.nchw();
                let layout = if d.layout == Layout::Nhwc && d.shape.len() == 4 {
                    0
                } else {
                    1
                };
                let (bp, bt, bs) = match b {
                    Operand::Tensor(t) => (self.ptr(*t), code(*t), sc(*t)),
                    Operand::Const(..) => (self.consts[&si].ptr, -1, 1.0),
                };
                let n = d.numel();
                launch!(st, k.binary, n; self.ptr(*a), code(*a), sc(*a), bp, bt, bs, *mode, self.ptr(*out), code(*out), sc(*out), n as i64, c as i64, hw as i64, layout, *op, ac, a0, a1)
            }
            Step::Transpose {
                input,
                out,
                in_dims,
                perm,
                ..
            } => {
                let mut p = Perm {
                    rank: perm.len() as i32,
                    ..Default::default()
                };
                let mut strides = vec![1i64; in_dims.len()];
                for d in (0..in_dims.len().saturating_sub(1)).rev() {
                    strides[d] = strides[d + 1] * in_dims[d + 1] as i64;
                }
                for (o, &pi) in perm.iter().enumerate() {
                    p.out_dims[o] = in_dims[pi] as i64;
                    p.in_strides[o] = strides[pi];
                }
                let n = td(*out).numel();
                launch!(st, k.transpose, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out), n as i64, p)
            }
            Step::Pool {
                input,
                out,
                max,
                k: kk,
                stride,
                pads,
                count_include_pad,
                ..
            } => {
                let (i, o) = (td(*input), td(*out));
                let n = o.numel();
                let u = |v: usize| v as i32;
                launch!(st, k.pool, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
                    u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]), if *max { 0i32 } else { 1i32 }, *count_include_pad as i32)
            }
            Step::GlobalAvgPool { input, out, .. } => {
                let i = td(*input);
                let n = i.shape[0] * i.shape[1];
                launch!(st, k.gap, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    i.shape[0] as i32, (i.shape[2] * i.shape[3]) as i64, i.shape[1] as i32)
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
                    launch!(st, k.concat, n; self.ptr(t), code(t), sc(t), self.ptr(*out), code(*out), sc(*out),
                        *outer as i64, len as i64, axis_total as i64, off as i64, *inner as i64)?;
                    off += len;
                }
                Ok(())
            }
            Step::Resize {
                input,
                out,
                linear,
                coord,
                nearest,
                scale_hw,
                ..
            } => {
                let (i, o) = (td(*input), td(*out));
                let n = o.numel();
                let u = |v: usize| v as i32;
                launch!(st, k.resize, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
                    scale_hw[0], scale_hw[1], *linear as i32, *coord, *nearest)
            }
            Step::Softmax {
                input,
                out,
                outer,
                len,
                inner,
                ..
            } => {
                let n = outer * inner;
                launch!(st, k.softmax, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    *outer as i64, *len as i64, *inner as i64)
            }
            Step::Pad {
                input,
                out,
                top_left,
                value,
                ..
            } => {
                let (i, o) = (td(*input), td(*out));
                let n = o.numel();
                let u = |v: usize| v as i32;
                launch!(st, k.pad, n; self.ptr(*input), code(*input), sc(*input), self.ptr(*out), code(*out), sc(*out),
                    u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
                    u(top_left[0]), u(top_left[1]), *value)
            }
        }
    }

    fn run_conv(&self, si: usize) -> DevResult<()> {
        let rt = &self.convs[&si];
        let c = &rt.step;
        let st = &self.dev.stream;
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
        // Raw output type of the library paths.
        let float_raw = if xd.dtype == DType::F16 { 1 } else { 0 };
        let epilogue = |raw_t: i32, raw_ld: usize| -> DevResult<()> {
            launch!(st, k.epilogue, n_out; self.raw_ptr(), raw_t, raw_ld as i64, rt.alpha.ptr, rt.bias.ptr,
                res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale, rt.m as i64, c.cout as i64, act, a0, a1)
        };
        match &rt.chosen {
            ConvImpl::Direct => {
                let w_p = rt.direct_w.as_ref().ok_or("direct weights missing")?.ptr;
                launch!(st, k.conv_direct, n_out; self.ptr(c.input), xd.dtype.code(), xd.scale, w_p, rt.alpha.ptr, rt.bias.ptr,
                    res_p, res_t, res_s, self.ptr(c.out), od.dtype.code(), od.scale,
                    u(xd.shape[0]), u(h), u(w), u(c.cin), u(rt.oh), u(rt.ow), u(c.cout),
                    u(c.k[0]), u(c.k[1]), u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]),
                    u(c.dilation[0]), u(c.dilation[1]), u(c.groups), act, a0, a1)
            }
            ConvImpl::Gemm { algo, im2col } => {
                let g = rt.gemm.as_ref().ok_or("GEMM setup missing")?;
                let b_ptr = if *im2col {
                    let n = rt.m * g.kpad;
                    launch!(st, k.im2col, n; self.ptr(c.input), self.col_ptr(), xd.dtype.bytes() as i32,
                        u(xd.shape[0]), u(h), u(w), u(c.cin), u(rt.oh), u(rt.ow), u(c.k[0]), u(c.k[1]),
                        u(c.stride[0]), u(c.stride[1]), u(c.pads[0]), u(c.pads[1]), u(c.dilation[0]), u(c.dilation[1]), g.kpad as i64)?;
                    self.col_ptr()
                } else {
                    self.ptr(c.input)
                };
                let (one_f, zero_f, one_i, zero_i) = (1.0f32, 0.0f32, 1i32, 0i32);
                let (al, be): (*const c_void, *const c_void) = if g.int8 {
                    (&one_i as *const _ as _, &zero_i as *const _ as _)
                } else {
                    (&one_f as *const _ as _, &zero_f as *const _ as _)
                };
                let h = &g.algos[*algo];
                let raw = self.raw_ptr();
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
                            raw as *const c_void,
                            g.d,
                            raw as *mut c_void,
                            g.d,
                            &h.algo,
                            self.ws_ptr() as *mut c_void,
                            LIB_WORKSPACE_BYTES,
                            st.cu_stream() as _,
                        )
                    },
                    "cublasLtMatmul",
                )?;
                epilogue(if g.int8 { 3 } else { float_raw }, g.cout_pad)
            }
            ConvImpl::Cudnn { algo } => {
                let cd = rt.cudnn.as_ref().ok_or("cuDNN setup missing")?;
                let (one, zero) = (1.0f32, 0.0f32);
                let algo_e: dnn::cudnnConvolutionFwdAlgo_t =
                    unsafe { std::mem::transmute(*algo as u32) };
                dnn_ok(
                    unsafe {
                        dnn::cudnnConvolutionForward(
                            self.dev.cudnn,
                            &one as *const _ as *const c_void,
                            cd.x,
                            self.ptr(c.input) as *const c_void,
                            cd.w_desc,
                            cd.w.ptr as *const c_void,
                            cd.conv,
                            algo_e,
                            self.ws_ptr() as *mut c_void,
                            LIB_WORKSPACE_BYTES,
                            &zero as *const _ as *const c_void,
                            cd.y,
                            self.raw_ptr() as *mut c_void,
                        )
                    },
                    "cudnnConvolutionForward",
                )?;
                epilogue(float_raw, c.cout)
            }
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

fn log(msg: &str) {
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
