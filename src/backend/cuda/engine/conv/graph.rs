//! Convs on cuDNN's graph API (`dnn_graph`) with the epilogue fused: int8 with the
//! requantization, FP8, or FP16; scale, bias, residual, ReLU / clip / SiLU and the output
//! conversion in one launch.

use std::rc::Rc;

use cudarc::cudnn::sys as dnn;

use super::super::LIB_WORKSPACE_BYTES;
use super::super::args::{FastDiv, PadArgs};
use super::super::device::{DevBuf, Device, Launch, SharedGraph};
use super::super::kernels::{launch, round_up};
use super::{ConvFamily, ConvImpl, ConvLayer, ConvSetup, ConvWay, epilogue, halves, padded_rows};
use crate::backend::cuda::dnn_graph::{ConvGraph, ConvSpec, Geometry, GraphAct, PlanPick, Ptrs};
use crate::backend::cuda::error::{CudaError, CudaResult};
use crate::backend::cuda::plan::{Act, ConvStep, DType};

/// cuDNN graph-API execution plans a conv's candidates include, best heuristic first. All of
/// the (at most 8) configs the heuristics return made ResNet-50's INT8 graph at batch 32 on an
/// H200 0.8 % faster (0.756 ms against 0.762) and its eval's build five times as long (53 s
/// against 9 to 10 s for the other warm runs of that call): each plan is finalized, and
/// timed, on every conv.
const DNN_PLANS: usize = 3;

pub(super) struct Graph;

pub(super) const GRAPH: Graph = Graph;

impl ConvFamily for Graph {
    fn name(&self) -> &'static str {
        "cuDNN graph conv"
    }
    fn optional(&self) -> bool {
        true
    }
    fn tokens(&self) -> &'static [&'static str] {
        &["cudnng"]
    }
    /// An int8 layer (int8 or FP16 output), an FP8 one (FP8 or FP16 output) or an FP16 one
    /// (FP16 output), ReLU, clip, SiLU or no activation, a residual of int8 or FP16 (or FP8,
    /// in an FP8 layer), and 16-byte aligned output rows (input channels are padded where
    /// they are not). FP32 layers keep the legacy path: its algorithm list is what
    /// `--fp32-math strict` can hold to IEEE FP32.
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool {
        let c = &l.step;
        let t = |x: usize| cx.td(x).dtype;
        let io = |x: usize| matches!(t(x), DType::I8 | DType::F16);
        let fp8 = c.quant.as_ref().is_some_and(|q| q.dtype == DType::F8);
        let out_ok = if let Some(q) = &c.quant {
            t(c.input) == q.dtype && (t(c.out) == q.dtype || t(c.out) == DType::F16)
        } else {
            t(c.input) == DType::F16 && t(c.out) == DType::F16
        };
        // An FP16 layer with its residual fused, at batch 1: the plan cuDNN 9.14 offered for
        // GhostNet's 1x1 shortcut conv (40 -> 80 channels at 14x14, the block's output added)
        // wrote values unrelated to the conv (0.92 relative error against the CPU), where the
        // same layer at batch 2, and every other implementation, matched
        // (tests/cuda_conv_choice.rs, the ghost block). Those layers take the other families.
        let fp16_residual_batch1 =
            c.quant.is_none() && c.residual.is_some() && cx.td(c.out).shape.first() == Some(&1);
        c.groups == 1
            && out_ok
            && graph_act(cx, c).is_some()
            && c.cout.is_multiple_of(16)
            && c.residual
                .is_none_or(|r| io(r) || (fp8 && t(r) == DType::F8))
            && !fp16_residual_batch1
    }
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>> {
        // Untimed (fast effort), the heuristic's first plan is the one taken.
        let pick = match l.graph_pick {
            Some(p) => p,
            None if l.untimed => PlanPick::First(1),
            None => PlanPick::First(DNN_PLANS),
        };
        Ok(Some(Box::new(setup(cx, &l.step, pick)?)))
    }
}

/// The activation a cuDNN graph conv ends with, in output units; `None` when the graph has
/// none for this layer's.
fn graph_act(cx: &Launch, c: &ConvStep) -> Option<GraphAct> {
    let od = cx.td(c.out);
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

/// Channels a cuDNN graph conv of input type `t` reads: 16 bytes' worth at least.
pub(in super::super) fn graph_cin(cin: usize, t: DType) -> usize {
    round_up(cin, 16 / t.bytes())
}

/// A cuDNN graph conv with its weights (KRSC) and scale (int8 layers) and bias, in output
/// units.
struct DnnConv {
    /// Shared with the engine's other convs of the same geometry and epilogue.
    graph: Rc<ConvGraph>,
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

/// The cuDNN graph conv of a layer: the execution plans `pick` says, weights as they are (OHWI is cuDNN's
/// KRSC; FP16 for a float layer), and for an int8 layer the scale; scale and bias in output
/// units (a float output's unit is 1).
fn setup(cx: &Launch, c: &ConvStep, pick: PlanPick) -> CudaResult<DnnConv> {
    let (xd, od) = (cx.td(c.input), cx.td(c.out));
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
    let split = c.residual.is_some_and(|r| cx.td(r).dtype == DType::F8);
    let unit = if split { 1.0 } else { od.unit() };
    let residual = c.residual.filter(|_| !split).map(|r| {
        let rd = cx.td(r);
        (rd.unit() / unit, dt(rd.dtype))
    });
    let act = if split {
        GraphAct::None
    } else {
        graph_act(cx, c).ok_or_else(|| CudaError::Unsupported("activation not fusable".into()))?
    };
    let spec = ConvSpec {
        input: dt(xd.dtype),
        scale: c.quant.is_some(),
        residual,
        act,
        out: dt(if split { DType::F16 } else { od.dtype }),
    };
    let graph = shared_graph(cx.dev, g, spec, pick)?;
    let bias: Vec<f32> = c.bias.iter().map(|b| b / unit).collect();
    let (w, scale) = match &c.quant {
        Some(q) => {
            let scale: Vec<f32> = q.w_scales.iter().map(|s| s * q.x_scale / unit).collect();
            let w = padded_rows(&q.w, taps, c.cin, taps, cin_pad);
            (DevBuf::from_slice(&w)?, Some(DevBuf::from_slice(&scale)?))
        }
        None => {
            let h = halves(&padded_rows(&c.w, taps, c.cin, taps, cin_pad));
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

/// The engine's graph for `g` and `spec` holding the plans `pick` asks for: the one finalized
/// for an earlier conv of the same geometry, types and epilogue where there is one (a plan
/// executes on whatever pointers it is given), else a new one, kept for the convs after it.
/// Finalizing compiles cuDNN's fused kernel, most of a conv's set-up: ResNet-50's 3x3 convs
/// repeat in every stage.
fn shared_graph(
    dev: &Device,
    g: Geometry,
    spec: ConvSpec,
    pick: PlanPick,
) -> CudaResult<Rc<ConvGraph>> {
    let key = format!("{g:?} {spec:?}");
    let mut graphs = dev.conv_graphs.borrow_mut();
    let holds = |built: PlanPick, graph: &ConvGraph| match pick {
        PlanPick::Only(i) => graph.plans.iter().any(|p| p.0 == i),
        PlanPick::First(_) => built == pick,
    };
    if let Some(shared) = graphs
        .iter()
        .find(|s| s.key == key && holds(s.pick, &s.graph))
    {
        return Ok(shared.graph.clone());
    }
    let graph = Rc::new(ConvGraph::new(
        dev.cudnn,
        g,
        spec,
        LIB_WORKSPACE_BYTES,
        pick,
    )?);
    graphs.push(SharedGraph {
        key,
        pick,
        graph: graph.clone(),
    });
    Ok(graph)
}

impl ConvSetup for DnnConv {
    fn candidates(&self, _l: &ConvLayer) -> Vec<ConvImpl> {
        self.graph
            .plans
            .iter()
            .map(|&(plan, _, _)| ConvImpl::CudnnGraph { plan })
            .collect()
    }

    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()> {
        let ConvImpl::CudnnGraph { plan } = imp else {
            return Err(CudaError::Internal(format!(
                "a cuDNN graph asked for {}",
                imp.key()
            )));
        };
        let c = &l.step;
        let mut x = way.input;
        if self.cin_pad != c.cin {
            // [pixels, cin] -> [pixels, cin_pad], zeros after.
            let pixels = (cx.td(c.input).numel() / c.cin) as i64;
            let mut a = PadArgs {
                rank: 2,
                ..Default::default()
            };
            a.out_dims[..2].copy_from_slice(&[pixels, self.cin_pad as i64]);
            a.in_dims[..2].copy_from_slice(&[pixels, c.cin as i64]);
            a.div = FastDiv::of(&a.out_dims[..2]);
            let n = pixels * self.cin_pad as i64;
            let (t, sc) = (way.in_t.code(), way.in_scale);
            launch!(cx.stream, cx.dev.k.pad_nd, n as usize; x, t, sc, cx.f16_in_ptr(), t, sc, n, a, 0.0f32)?;
            x = cx.f16_in_ptr();
        }
        let p = Ptrs {
            x,
            w: self.w.ptr,
            y: if self.split.is_some() {
                cx.raw_ptr()
            } else {
                cx.ptr(c.out)
            },
            scale: self.scale.as_ref().map_or(0, |s| s.ptr),
            bias: self.bias.ptr,
            z: c.residual.map_or(0, |r| cx.ptr(r)),
            workspace: cx.ws().0,
        };
        self.graph.execute(cx.dev.cudnn, *plan, &p)?;
        match &self.split {
            Some((ones, zeros)) => epilogue(cx, l, DType::F16.code(), c.cout, ones.ptr, zeros.ptr),
            None => Ok(()),
        }
    }

    fn weights_bytes(&self) -> u64 {
        self.w.bytes as u64
    }

    fn workspace_bytes(&self, imp: &ConvImpl) -> usize {
        match imp {
            ConvImpl::CudnnGraph { plan } => self.graph.plan(*plan).map_or(0, |p| p.1),
            _ => 0,
        }
    }
}
