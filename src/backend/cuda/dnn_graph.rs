//! cuDNN graph-API convolution with its epilogue fused into one kernel: conv -> (per-channel
//! scale) -> bias -> (+ weighted residual) -> (ReLU or clip) -> output.
//! - int8: int8 conv (int32 accumulation), the per-channel scale, int8 or FP16 output. The
//!   legacy API's int8 convolution takes a single alpha, which per-channel weight scales do
//!   not fit; the graph API takes the scale as a tensor. Everything is in units of the output
//!   scale, so the conversion to int8 at the end is the requantization.
//! - FP16: half conv (float accumulation), no scale. The legacy path wrote the raw conv output
//!   and read it back in a separate epilogue kernel; fused, the output is written once.

use std::ffi::c_void;

use cudarc::cudnn::sys as dnn;
use dnn::cudnnBackendAttributeName_t as N;
use dnn::cudnnBackendAttributeType_t as T;
use dnn::cudnnBackendDescriptorType_t as D;
use dnn::cudnnDataType_t as Dt;
use dnn::cudnnPointwiseMode_t as P;

use super::error::{CudaError, CudaResult, dnn_ok};

type Desc = dnn::cudnnBackendDescriptor_t;

/// Unique ids of the graph's real tensors (the variant pack names them).
const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;
const S: i64 = 4;
const B: i64 = 5;
const Z: i64 = 6;

/// A conv's geometry, NHWC activations and KRSC weights.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    /// (top, left) and (bottom, right).
    pub pads_pre: [usize; 2],
    pub pads_post: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
}

/// Device pointers one execution reads and writes.
pub struct Ptrs {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    /// Per-channel scale; unused by graphs without one.
    pub scale: u64,
    pub bias: u64,
    /// Residual; 0 when the graph has none.
    pub z: u64,
    pub workspace: u64,
}

/// The activation the graph ends with (in output units).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GraphAct {
    None,
    Relu,
    /// min(max(x, lo), hi): cuDNN's ReLU with a lower and an upper clip (ReLU6, Clip).
    Clip(f32, f32),
    /// x * sigmoid(beta * x): SiLU of values in output units `u` is Swish with beta = u
    /// (silu(u x) / u = x sigmoid(u x)).
    Swish(f32),
}

/// What one graph computes around its convolution.
#[derive(Clone, Copy, Debug)]
pub struct ConvSpec {
    /// Type of x and w: int8 (int32 accumulation, then `scale`), FP8 E4M3 (float
    /// accumulation, then `scale`; Hopper and Ada) or half (float accumulation).
    pub input: Dt,
    /// Multiply by a per-channel scale tensor after the conv (int8 and FP8 graphs).
    pub scale: bool,
    /// The residual's weight in output units and its type.
    pub residual: Option<(f32, Dt)>,
    pub act: GraphAct,
    /// The output type (int8, FP8, half or float).
    pub out: Dt,
}

/// Which execution plans a conv's graph finalizes, by their index in the heuristic's list.
/// Each finalize compiles cuDNN's fused kernel (tens of ms on an H200, more where the driver
/// has not compiled it before): most of a conv's set-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PlanPick {
    /// The first `n` that finalize.
    First(usize),
    /// Index `k` alone (a choice already known).
    Only(usize),
}

/// Every descriptor built for one conv, destroyed together (plans refer to the others).
pub struct ConvGraph {
    owned: Vec<Desc>,
    /// Finalized execution plans, best heuristic first: each one's index in the heuristic's
    /// list (what `cudnng:<i>` names), the plan, and its workspace bytes.
    pub plans: Vec<(usize, Desc, usize)>,
    residual: bool,
    scale: bool,
}

impl Drop for ConvGraph {
    fn drop(&mut self) {
        for &d in self.owned.iter().rev() {
            unsafe {
                dnn::cudnnBackendDestroyDescriptor(d);
            }
        }
    }
}

fn ok(s: dnn::cudnnStatus_t, what: &str) -> CudaResult<()> {
    dnn_ok(s, what)
}

fn set<V>(d: Desc, name: N, ty: T, vals: &[V]) -> CudaResult<()> {
    ok(
        unsafe {
            dnn::cudnnBackendSetAttribute(
                d,
                name,
                ty,
                vals.len() as i64,
                vals.as_ptr() as *const c_void,
            )
        },
        &format!("{name:?}"),
    )
}

/// Sets attributes that each hold one descriptor.
fn set_descs(d: Desc, attrs: &[(N, Desc)]) -> CudaResult<()> {
    attrs
        .iter()
        .try_for_each(|&(n, v)| set(d, n, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &[v]))
}

/// Sets attributes that each hold int64 values.
fn set_i64s(d: Desc, attrs: &[(N, &[i64])]) -> CudaResult<()> {
    attrs
        .iter()
        .try_for_each(|&(n, v)| set(d, n, T::CUDNN_TYPE_INT64, v))
}

fn finalize(d: Desc, what: &str) -> CudaResult<()> {
    ok(unsafe { dnn::cudnnBackendFinalize(d) }, what)
}

impl ConvGraph {
    fn make(&mut self, t: D) -> CudaResult<Desc> {
        let mut d: Desc = std::ptr::null_mut();
        ok(
            unsafe { dnn::cudnnBackendCreateDescriptor(t, &mut d) },
            &format!("create {t:?}"),
        )?;
        self.owned.push(d);
        Ok(d)
    }

    /// A tensor of logical dims `[n, c, h, w]` stored NHWC.
    fn tensor(&mut self, id: i64, dims: [usize; 4], dt: Dt, virt: bool) -> CudaResult<Desc> {
        let [_, c, h, w] = dims.map(|v| v as i64);
        let d = self.make(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        set(
            d,
            N::CUDNN_ATTR_TENSOR_DATA_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[dt],
        )?;
        set_i64s(
            d,
            &[
                (N::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims.map(|v| v as i64)),
                (N::CUDNN_ATTR_TENSOR_STRIDES, &[h * w * c, 1, w * c, c]),
                (N::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[id]),
                (N::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16]),
            ],
        )?;
        set(
            d,
            N::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
            T::CUDNN_TYPE_BOOLEAN,
            &[virt],
        )?;
        finalize(d, "tensor")?;
        Ok(d)
    }

    /// A pointwise op `y = mode(x[, b])` (ADD weighs b by `alpha2`); `act` gives RELU_FWD's
    /// clips and SWISH_FWD's beta.
    fn pointwise(
        &mut self,
        mode: dnn::cudnnPointwiseMode_t,
        x: Desc,
        b: Option<Desc>,
        y: Desc,
        alpha2: f32,
        act: GraphAct,
    ) -> CudaResult<Desc> {
        let pw = self.make(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        set(
            pw,
            N::CUDNN_ATTR_POINTWISE_MODE,
            T::CUDNN_TYPE_POINTWISE_MODE,
            &[mode],
        )?;
        set(
            pw,
            N::CUDNN_ATTR_POINTWISE_MATH_PREC,
            T::CUDNN_TYPE_DATA_TYPE,
            &[Dt::CUDNN_DATA_FLOAT],
        )?;
        let d = T::CUDNN_TYPE_DOUBLE;
        match act {
            GraphAct::Clip(lo, hi) => {
                // y = x > lo ? min(x, hi) : lo (the lower clip's slope is 0 by default).
                set(pw, N::CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, d, &[lo as f64])?;
                set(pw, N::CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, d, &[hi as f64])?;
            }
            GraphAct::Swish(beta) => {
                set(pw, N::CUDNN_ATTR_POINTWISE_SWISH_BETA, d, &[beta as f64])?;
            }
            GraphAct::None | GraphAct::Relu => {}
        }
        finalize(pw, "pointwise descriptor")?;
        let op = self.make(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        set_descs(
            op,
            &[
                (N::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw),
                (N::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x),
            ],
        )?;
        if let Some(b) = b {
            set_descs(op, &[(N::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b)])?;
            if alpha2 != 1.0 {
                set(
                    op,
                    N::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2,
                    T::CUDNN_TYPE_FLOAT,
                    &[alpha2],
                )?;
            }
        }
        set_descs(op, &[(N::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)])?;
        finalize(op, "pointwise op")?;
        Ok(op)
    }

    /// Builds the graph of `spec` for `g` and finalizes the execution plans `pick` says that
    /// need at most `max_workspace` bytes.
    pub fn new(
        handle: dnn::cudnnHandle_t,
        g: Geometry,
        spec: ConvSpec,
        max_workspace: usize,
        pick: PlanPick,
    ) -> CudaResult<ConvGraph> {
        let mut s = ConvGraph {
            owned: vec![],
            plans: vec![],
            residual: spec.residual.is_some(),
            scale: spec.scale,
        };
        let out = [g.n, g.k, g.oh, g.ow];
        let acc_t = if spec.input == Dt::CUDNN_DATA_INT8 {
            Dt::CUDNN_DATA_INT32
        } else {
            Dt::CUDNN_DATA_FLOAT
        };
        let x = s.tensor(X, [g.n, g.c, g.h, g.w], spec.input, false)?;
        let w = s.tensor(W, [g.k, g.c, g.kh, g.kw], spec.input, false)?;
        let bi = s.tensor(B, [1, g.k, 1, 1], Dt::CUDNN_DATA_FLOAT, false)?;
        let acc = s.tensor(100, out, acc_t, true)?;
        let y = s.tensor(Y, out, spec.out, false)?;
        let conv = s.make(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        let two = |a: [usize; 2]| a.map(|v| v as i64);
        set(
            conv,
            N::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[acc_t],
        )?;
        set(
            conv,
            N::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?;
        set_i64s(
            conv,
            &[
                (N::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2]),
                (N::CUDNN_ATTR_CONVOLUTION_DILATIONS, &two(g.dilation)),
                (N::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &two(g.stride)),
                (N::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &two(g.pads_pre)),
                (N::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &two(g.pads_post)),
            ],
        )?;
        finalize(conv, "convolution descriptor")?;
        let op_conv = s.make(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
        set_descs(
            op_conv,
            &[
                (N::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x),
                (N::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w),
                (N::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, acc),
                (N::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv),
            ],
        )?;
        set(
            op_conv,
            N::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            T::CUDNN_TYPE_FLOAT,
            &[1.0f32],
        )?;
        set(
            op_conv,
            N::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            T::CUDNN_TYPE_FLOAT,
            &[0.0f32],
        )?;
        finalize(op_conv, "convolution op")?;
        let mut ops = vec![op_conv];
        // The chain after the conv: (scale), bias, (residual), (ReLU / clip). Its last op
        // writes y, the ones before write virtual float tensors.
        type Link = (P, Option<(Desc, f32)>, GraphAct);
        let mut tail: Vec<Link> = vec![];
        if spec.scale {
            let sc = s.tensor(S, [1, g.k, 1, 1], Dt::CUDNN_DATA_FLOAT, false)?;
            tail.push((P::CUDNN_POINTWISE_MUL, Some((sc, 1.0)), GraphAct::None));
        }
        tail.push((P::CUDNN_POINTWISE_ADD, Some((bi, 1.0)), GraphAct::None));
        if let Some((alpha, z_type)) = spec.residual {
            let z = s.tensor(Z, out, z_type, false)?;
            tail.push((P::CUDNN_POINTWISE_ADD, Some((z, alpha)), GraphAct::None));
        }
        match spec.act {
            GraphAct::None => {}
            GraphAct::Relu | GraphAct::Clip(..) => {
                tail.push((P::CUDNN_POINTWISE_RELU_FWD, None, spec.act))
            }
            GraphAct::Swish(_) => tail.push((P::CUDNN_POINTWISE_SWISH_FWD, None, spec.act)),
        }
        let mut cur = acc;
        for (i, &(mode, b, act)) in tail.iter().enumerate() {
            let dst = if i + 1 == tail.len() {
                y
            } else {
                s.tensor(101 + i as i64, out, Dt::CUDNN_DATA_FLOAT, true)?
            };
            let alpha2 = b.map_or(1.0, |b| b.1);
            ops.push(s.pointwise(mode, cur, b.map(|b| b.0), dst, alpha2, act)?);
            cur = dst;
        }
        let bd = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        let graph = s.make(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        set(
            graph,
            N::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        set(graph, N::CUDNN_ATTR_OPERATIONGRAPH_OPS, bd, &ops)?;
        finalize(graph, "operation graph")?;
        let heur = s.make(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        set_descs(heur, &[(N::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)])?;
        set(
            heur,
            N::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_INSTANT],
        )?;
        finalize(heur, "engine heuristics")?;
        let mut count = 0i64;
        ok(
            unsafe {
                dnn::cudnnBackendGetAttribute(
                    heur,
                    N::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                    bd,
                    0,
                    &mut count,
                    std::ptr::null_mut(),
                )
            },
            "heuristic count",
        )?;
        let want = count.clamp(0, 8) as usize;
        let mut cfgs = vec![];
        for _ in 0..want {
            cfgs.push(s.make(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?);
        }
        let mut got = 0i64;
        ok(
            unsafe {
                dnn::cudnnBackendGetAttribute(
                    heur,
                    N::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                    bd,
                    want as i64,
                    &mut got,
                    cfgs.as_mut_ptr() as *mut c_void,
                )
            },
            "heuristic results",
        )?;
        let mut last_err = CudaError::Unsupported(format!(
            "no engine for this graph ({count} heuristic results)"
        ));
        for (i, &cfg) in cfgs.iter().enumerate().take(got.max(0) as usize) {
            match pick {
                PlanPick::First(n) if s.plans.len() >= n => break,
                PlanPick::Only(k) if i != k => continue,
                _ => {}
            }
            let plan = s.make(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            let r = set(
                plan,
                N::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[handle],
            )
            .and_then(|()| set_descs(plan, &[(N::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg)]))
            .and_then(|()| finalize(plan, "execution plan"));
            if let Err(e) = r {
                last_err = e;
                continue;
            }
            let mut ws = 0i64;
            let mut n = 0i64;
            ok(
                unsafe {
                    dnn::cudnnBackendGetAttribute(
                        plan,
                        N::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                        T::CUDNN_TYPE_INT64,
                        1,
                        &mut n,
                        &mut ws as *mut i64 as *mut c_void,
                    )
                },
                "workspace size",
            )?;
            if ws as usize <= max_workspace {
                s.plans.push((i, plan, ws as usize));
            }
        }
        if s.plans.is_empty() {
            return Err(last_err);
        }
        Ok(s)
    }

    /// The finalized plan of heuristic index `i` and its workspace bytes.
    pub fn plan(&self, i: usize) -> Option<(Desc, usize)> {
        self.plans
            .iter()
            .find(|(k, _, _)| *k == i)
            .map(|&(_, plan, ws)| (plan, ws))
    }

    /// Runs the plan of heuristic index `i` on the stream bound to `handle`.
    pub fn execute(&self, handle: dnn::cudnnHandle_t, i: usize, p: &Ptrs) -> CudaResult<()> {
        let (plan, _) = self
            .plan(i)
            .ok_or_else(|| CudaError::Internal("no such cuDNN plan".into()))?;
        let mut ids = vec![X, W, Y, B];
        let mut ptrs = vec![p.x, p.w, p.y, p.bias];
        if self.scale {
            ids.push(S);
            ptrs.push(p.scale);
        }
        if self.residual {
            ids.push(Z);
            ptrs.push(p.z);
        }
        let ptrs: Vec<*mut c_void> = ptrs.into_iter().map(|v| v as *mut c_void).collect();
        let mut pack: Desc = std::ptr::null_mut();
        ok(
            unsafe {
                dnn::cudnnBackendCreateDescriptor(
                    D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
                    &mut pack,
                )
            },
            "variant pack",
        )?;
        let r = set(
            pack,
            N::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            T::CUDNN_TYPE_INT64,
            &ids,
        )
        .and_then(|()| {
            set(
                pack,
                N::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                T::CUDNN_TYPE_VOID_PTR,
                &ptrs,
            )
        })
        .and_then(|()| {
            set(
                pack,
                N::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                T::CUDNN_TYPE_VOID_PTR,
                &[p.workspace as *mut c_void],
            )
        })
        .and_then(|()| finalize(pack, "variant pack"))
        .and_then(|()| {
            ok(
                unsafe { dnn::cudnnBackendExecute(handle, plan, pack) },
                "cudnnBackendExecute",
            )
        });
        unsafe {
            dnn::cudnnBackendDestroyDescriptor(pack);
        }
        r
    }
}
