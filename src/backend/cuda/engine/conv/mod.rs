//! Convolutions (and Gemm / MatMul with constant weights, lowered to 1x1 convs): the ways of
//! running one, each a `ConvFamily` in its own file (cuDNN's graph API, cuDNN's legacy
//! convolution, cuBLASLt, and the NVRTC kernel families), with `applies`, `prepare` and the
//! prepared setup's `launch`. `choose` times the candidates every applicable family offers and
//! keeps the fastest; `ConvRt` then launches it.
//!
//! To add a way of running convs: a file here with a `ConvFamily` and its `ConvSetup`, a
//! variant of `ConvImpl` (its cache key and its name in the Layers tab), and an entry in
//! `FAMILIES`, whose order is the order candidates are timed and cached keys are matched.

mod cudnn;
mod depthwise;
mod direct;
mod f16;
mod gemm;
mod gemv;
mod graph;
mod mma;
mod pointwise;

use super::device::{DevBuf, Launch};
use super::kernels::{MMA_BM, MMA_BN, WG_BM, WGS_BM, launch, round_up};
use crate::backend::cuda::error::{CudaResult, have};
use crate::backend::cuda::plan::{ConvStep, DType, Plan};

pub(super) use direct::{DIRECT, DIRECT_MAX_MACS};
pub(super) use graph::graph_cin;

/// Largest im2col buffer a float GEMM candidate may ask for (int8 GEMMs always get theirs).
pub(super) const COL_MAX_BYTES: usize = 256 << 20;

/// The families in the order their candidates are timed (the direct kernel, the fallback,
/// is `DIRECT`, outside the list).
pub(super) const FAMILIES: [&dyn ConvFamily; 10] = [
    &gemm::GEMM,
    &gemm::GEMM_FUSED,
    &cudnn::CUDNN,
    &graph::GRAPH,
    &depthwise::DEPTHWISE,
    &depthwise::DEPTHWISE_ROWS,
    &depthwise::DEPTHWISE_TILE,
    &pointwise::POINTWISE,
    &gemv::GEMV,
    &mma::MMA,
];

/// The FP16 way of int8 and FP8 layers, timed after every family above.
pub(super) const F16_WAY: &dyn ConvFamily = &f16::F16_WAY;

/// The fast build effort's order, by key family (`family_token`): each conv takes the first
/// candidate of the first family here that offers one, untimed (the direct kernel where none
/// does). Chosen on the candidate times of exhaustive builds of ResNet-50, EfficientNet-B0,
/// SqueezeNet 1.1 and MaxViT-T on an H200 (FP16 and INT8, batch 1): of the orders tried, this
/// one's picks summed closest to the fastest candidates' (the int8 depthwise and tensor-core
/// kernels where they apply, then cuBLASLt's fused GEMM, which wins most FP16 layers, then
/// cuDNN's graph conv, which wins most int8 ones cuBLASLt cannot take). cuBLASLt and the
/// kernels set up in milliseconds; a cuDNN graph plan takes tens. The int8 GEMV, which only
/// takes layers of at most 4 rows, comes first: it ran ResNet-50's fc at batch 1 in 2.7 us on
/// an H200, against 5.1 for the fastest other candidate.
pub(super) const FAST_ORDER: [&str; 12] = [
    "pwv", "dwr", "dw", "mmas", "mmar", "gemmf", "cudnng", "mma", "cudnn", "gemm", "pww", "pw",
];

/// The family whose candidates have keys of family `token`.
pub(super) fn family_of(token: &str) -> Option<&'static dyn ConvFamily> {
    FAMILIES
        .iter()
        .copied()
        .chain([F16_WAY, &DIRECT as &dyn ConvFamily])
        .find(|f| f.tokens().contains(&token))
}

/// The family part of a choice key, which one family's `tokens` hold: what comes before a
/// `+` (`f16` of `f16+cudnn:1`, the FP16 way), else the letters before the algorithm or
/// the tile size (`gemmf` of `gemmf:0:rows`, `mmas` of `mmas64`).
pub(super) fn family_token(key: &str) -> &str {
    if let Some((way, _)) = key.split_once('+') {
        return way;
    }
    let end = key
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(key.len());
    &key[..end]
}

/// One way of running convolutions: a library or a kernel family.
pub(super) trait ConvFamily: Sync {
    /// What the builder's log calls it where it cannot set a layer up.
    fn name(&self) -> &'static str;
    /// Whether failing to set a layer up skips the family for that layer (a library with no
    /// algorithm for the shape) instead of failing the build (a kernel family's weights that
    /// cannot be uploaded: the device is out of memory).
    fn optional(&self) -> bool;
    /// The family parts of the keys its candidates have (`family_token`), so that a known
    /// key sets up its family alone.
    fn tokens(&self) -> &'static [&'static str];
    /// Whether it can run layer `l` at all: its types, shape, activation, the GPU.
    fn applies(&self, cx: &Launch, l: &ConvLayer) -> bool;
    /// Whether its kernels pad with `ConvStep::pad_code` (the others pad with zeros).
    fn takes_pad_code(&self) -> bool {
        false
    }
    /// Whether its kernels run a conv with a global average pool fused in
    /// (`ConvStep::pool_hw`): the tensor-core implicit GEMMs alone.
    fn fuses_pool(&self) -> bool {
        false
    }
    /// Its setup for `l` (weights in its layout, descriptors, algorithms); `None` where it
    /// turns out to offer nothing.
    fn prepare(&self, cx: &Launch, l: &ConvLayer) -> CudaResult<Option<Box<dyn ConvSetup>>>;
}

/// A family set up for one layer.
pub(super) trait ConvSetup {
    /// The implementations it offers, in the order they are timed.
    fn candidates(&self, l: &ConvLayer) -> Vec<ConvImpl>;
    /// Runs `l` as `imp` (one of `candidates`), reading its input as `way` says.
    fn launch(&self, cx: &Launch, l: &ConvLayer, imp: &ConvImpl, way: &ConvWay) -> CudaResult<()>;
    /// Bytes of its weights on the device.
    fn weights_bytes(&self) -> u64;
    /// Library workspace bytes `imp` needs.
    fn workspace_bytes(&self, _imp: &ConvImpl) -> usize {
        0
    }
    /// Drops what `imp` does not need, once it is chosen.
    fn keep_only(&mut self, _imp: &ConvImpl) {}
}

/// A convolution on the device: the step, its epilogue constants and its output geometry.
pub(super) struct ConvLayer {
    pub step: ConvStep,
    /// Per-channel factor the epilogue applies to the raw output: weight scale times input
    /// scale for a quantized layer, 1 for a float one.
    pub alpha: DevBuf,
    pub bias: DevBuf,
    /// Output pixels (rows of the GEMM) and output height and width.
    pub m: usize,
    pub oh: usize,
    pub ow: usize,
    /// The engine's float type, and whether its FP32 convs may use TF32 tensor cores.
    pub float: DType,
    pub tf32: bool,
    /// The builder takes a family's first candidate untimed (fast effort): families that
    /// find or finalize several library algorithms set up only their heuristic first.
    pub untimed: bool,
    /// cuDNN graph execution plans to finalize where not the family's default: plan k alone
    /// where a known key (`cudnng:k`) names it.
    pub graph_pick: Option<crate::backend::cuda::dnn_graph::PlanPick>,
}

impl ConvLayer {
    pub(super) fn new(
        plan: &Plan,
        c: &ConvStep,
        float: DType,
        tf32: bool,
    ) -> CudaResult<ConvLayer> {
        let od = &plan.tensors[c.out];
        let (oh, ow) = c.out_hw(&od.shape);
        let n = od.nchw().0;
        let alpha: Vec<f32> = match &c.quant {
            Some(q) => q.w_scales.iter().map(|s| s * q.x_scale).collect(),
            None => vec![1.0; c.cout],
        };
        Ok(ConvLayer {
            step: c.clone(),
            alpha: DevBuf::from_slice(&alpha)?,
            bias: DevBuf::from_slice(&c.bias)?,
            m: n * oh * ow,
            oh,
            ow,
            float,
            tf32,
            untimed: false,
            graph_pick: None,
        })
    }

    /// Whether a float GEMM's im2col columns fit the scratch (`COL_MAX_BYTES`; int8
    /// columns and plain 1x1 rows always do): the engine sizes it so.
    pub(super) fn cols_fit(&self, esize: usize) -> bool {
        let c = &self.step;
        c.is_pointwise() || self.m * round_up(c.reduction(), 16) * esize <= COL_MAX_BYTES
    }

    /// Input height and width (1 x 1 for the rows of a Gemm / MatMul).
    pub(super) fn in_hw(&self, plan: &Plan) -> (usize, usize) {
        let xd = &plan.tensors[self.step.input];
        if xd.shape.len() == 4 {
            (xd.shape[2], xd.shape[3])
        } else {
            (1, 1)
        }
    }
}

/// Where a conv reads its input and the per-channel factor of its raw output: the layer's
/// own, or the FP16 copy of the FP16 way (`ConvImpl::AsF16`).
pub(super) struct ConvWay {
    pub input: u64,
    pub in_t: DType,
    pub in_scale: f32,
    pub alpha: u64,
}

/// What the fused epilogues read and write: the residual (pointer, type code, scale; null
/// and -1 when none), the output (pointer, type code, scale) and the activation's code.
pub(super) struct Epi {
    pub res: (u64, i32, f32),
    pub out: (u64, i32, f32),
    pub act: (i32, f32, f32),
}

impl Epi {
    pub(super) fn of(cx: &Launch, c: &ConvStep) -> Epi {
        Epi {
            res: c.residual.map_or((0, -1, 1.0), |r| cx.tensor(r)),
            out: cx.tensor(c.out),
            act: c.act.code(),
        }
    }
}

/// The epilogue kernel over the raw output `[m, raw_ld]` of type code `raw_t` in the
/// scratch: `out = act(raw * alpha[c] + bias[c] + residual)`, four channels a thread where
/// channels and rows are whole groups of 4.
pub(super) fn epilogue(
    cx: &Launch,
    l: &ConvLayer,
    raw_t: i32,
    raw_ld: usize,
    alpha: u64,
    bias: u64,
) -> CudaResult<()> {
    let c = &l.step;
    let e = Epi::of(cx, c);
    let n_out = cx.td(c.out).numel();
    let vec4 = c.cout.is_multiple_of(4) && raw_ld.is_multiple_of(4);
    let threads = if vec4 { n_out / 4 } else { n_out };
    launch!(cx.stream, cx.dev.k.epilogue, threads; cx.raw_ptr(), raw_t, raw_ld as i64, alpha, bias,
        e.res.0, e.res.1, e.res.2, e.out.0, e.out.1, e.out.2, l.m as i64, c.cout as i64,
        e.act.0, e.act.1, e.act.2, vec4 as i32)
}

/// A conv layer and the way it runs: while the builder chooses, every family's setup; then,
/// where candidates tie alone, the setups of those contenders until the run settles them;
/// afterwards only the chosen one's.
pub(super) struct ConvRt {
    pub layer: ConvLayer,
    setups: Vec<Box<dyn ConvSetup>>,
    /// The implementation that runs: which setup offers it, and which of its candidates.
    chosen: Option<(usize, ConvImpl)>,
    /// The candidates the builder times again in the engine's run (`settle`), the fastest
    /// alone first; empty once one is kept.
    contenders: Vec<(usize, ConvImpl)>,
}

impl ConvRt {
    pub(super) fn new(layer: ConvLayer) -> ConvRt {
        ConvRt {
            layer,
            setups: vec![],
            chosen: None,
            contenders: vec![],
        }
    }

    /// Adds a family's setup; returns its index.
    pub(super) fn add(&mut self, s: Box<dyn ConvSetup>) -> usize {
        self.setups.push(s);
        self.setups.len() - 1
    }

    /// Each setup's candidates, tagged with its index, in order.
    pub(super) fn candidates(&self) -> Vec<(usize, ConvImpl)> {
        self.setups
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.candidates(&self.layer).into_iter().map(move |c| (i, c)))
            .collect()
    }

    /// Makes `imp` of setup `setup` the one that runs (while timing candidates too).
    pub(super) fn set(&mut self, setup: usize, imp: ConvImpl) {
        self.chosen = Some((setup, imp));
    }

    /// Keeps `imp` of setup `setup` for good, dropping every other setup.
    pub(super) fn keep(&mut self, setup: usize, imp: ConvImpl) {
        let mut kept = self.setups.swap_remove(setup);
        kept.keep_only(&imp);
        self.setups = vec![kept];
        self.chosen = Some((0, imp));
        self.contenders.clear();
    }

    /// Keeps the setups of `picks` (candidates as `candidates` tags them, the fastest alone
    /// first, which runs until the run settles them), dropping every other setup.
    pub(super) fn keep_contenders(&mut self, picks: Vec<(usize, ConvImpl)>) {
        if let [(setup, imp)] = picks.as_slice() {
            return self.keep(*setup, imp.clone());
        }
        let mut old: Vec<Option<Box<dyn ConvSetup>>> = std::mem::take(&mut self.setups)
            .into_iter()
            .map(Some)
            .collect();
        let mut new_index: Vec<Option<usize>> = vec![None; old.len()];
        let mut kept = vec![];
        for (setup, imp) in picks {
            let i = match new_index[setup] {
                Some(i) => i,
                None => {
                    self.setups
                        .push(old[setup].take().expect("a setup kept once"));
                    new_index[setup] = Some(self.setups.len() - 1);
                    self.setups.len() - 1
                }
            };
            kept.push((i, imp));
        }
        self.chosen = kept.first().cloned();
        self.contenders = kept;
    }

    /// The candidates still to be settled in the run (none, or two and more).
    pub(super) fn contenders(&self) -> &[(usize, ConvImpl)] {
        &self.contenders
    }

    pub(super) fn chosen(&self) -> Option<&ConvImpl> {
        self.chosen.as_ref().map(|(_, imp)| imp)
    }

    /// Runs the layer as chosen.
    pub(super) fn run(&self, cx: &Launch) -> CudaResult<()> {
        let (i, imp) = have(self.chosen.as_ref(), "conv implementation")?;
        let c = &self.layer.step;
        let xd = cx.td(c.input);
        let way = ConvWay {
            input: cx.ptr(c.input),
            in_t: xd.dtype,
            in_scale: xd.scale,
            alpha: self.layer.alpha.ptr,
        };
        self.setups[*i].launch(cx, &self.layer, imp, &way)
    }

    /// Bytes of the kept setups' weights, and of the epilogue's alphas and biases.
    pub(super) fn weights_bytes(&self) -> u64 {
        8 * self.layer.step.cout as u64 + self.setups.iter().map(|s| s.weights_bytes()).sum::<u64>()
    }

    /// Library workspace bytes the chosen implementation needs.
    pub(super) fn workspace_bytes(&self) -> usize {
        self.chosen
            .as_ref()
            .map_or(0, |(i, imp)| self.setups[*i].workspace_bytes(imp))
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
    /// conversion fused (`dnn_graph`); `plan` is the execution plan's index in cuDNN's
    /// heuristic list (the same for every conv of the same graph).
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
    /// Int8 depthwise conv on the kernel that copies each tile's input window and weights
    /// into shared memory once (`conv_dw_i8_tile`, any kernel size, stride and dilation).
    DepthwiseTile,
    /// Int8 1x1 conv (or Gemm / MatMul) on the `__dp4a` kernel (`conv_pw_i8`), epilogue fused.
    Pointwise,
    /// The same on `conv_pw_i8_word`: a thread per four output channels of a pixel, so that
    /// the output is written in whole lines (expansion layers).
    PointwiseWord,
    /// Int8 1x1 conv (or Gemm / MatMul) of at most `GV_MAX_M` rows on the weight-streaming
    /// `__dp4a` GEMV (`conv_pw_i8_gemv`): a warp per four output channels.
    Gemv,
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
    /// Int8 conv (or Gemm / MatMul) as the same implicit GEMM on Hopper's warpgroup
    /// instructions, wgmma m64n64k32 (m64n128k32 in 128-channel tiles) reading the tiles from
    /// shared memory (compute capability 9.0), the same epilogue, in tiles of `bm` output
    /// pixels by `bn` channels:
    /// WG_BM x 64 (`conv_i8_wgmma`), half that (`conv_i8_wgmma64`) or WG_BM x 128
    /// (`conv_i8_wgmma_wide`, two warpgroups). With `splits` > 1 the reduction is split over
    /// a cluster of that many blocks a tile, which add up their sums in distributed shared
    /// memory: for layers of fewer tiles than the SMs hold (`mma::wgmma_splits`).
    Wgmma {
        bm: usize,
        bn: usize,
        splits: usize,
    },
    /// Int8 1x1 conv (or Gemm / MatMul) with an int8 output on Hopper's warpgroup
    /// instructions, each block keeping its MMA_BN channels' weights in shared memory and
    /// streaming tiles of WGS_BM output pixels through `stages` copy stages, `blocks` blocks
    /// an SM (`conv_i8_wgmma_stream`; `kernels::wgs_plans`).
    WgmmaStream {
        blocks: usize,
        stages: usize,
    },
    /// A layer the Q/DQ plan lets run in int8 (or FP8), run in FP16 because that timed faster:
    /// the quantized input is dequantized into a scratch FP16 copy, the inner float
    /// implementation runs on dequantized weights, and the epilogue writes the planned output
    /// type.
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
            ConvImpl::DepthwiseTile => "dwt".into(),
            ConvImpl::Pointwise => "pw".into(),
            ConvImpl::PointwiseWord => "pww".into(),
            ConvImpl::Gemv => "pwv".into(),
            ConvImpl::Mma { bm } if *bm == MMA_BM => "mma".into(),
            ConvImpl::Mma { bm } => format!("mma{bm}"),
            ConvImpl::MmaStream { bm } if *bm == MMA_BM => "mmas".into(),
            ConvImpl::MmaStream { bm } => format!("mmas{bm}"),
            ConvImpl::MmaRows => "mmar".into(),
            // A split reduction after a colon, so that the tile's key alone (how the tests
            // force a kernel) picks its first candidate, the unsplit one, and `wgmma64:k`
            // any split.
            ConvImpl::Wgmma { bm, bn, splits } => {
                let tile = match (*bm, *bn) {
                    (_, bn) if bn > MMA_BN => "wgmmaw".to_string(),
                    (WG_BM, _) => "wgmma".to_string(),
                    (bm, _) => format!("wgmma{bm}"),
                };
                if *splits > 1 {
                    format!("{tile}:k:{splits}")
                } else {
                    tile
                }
            }
            ConvImpl::WgmmaStream { blocks, stages } => format!("wgs:{blocks}:{stages}"),
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
    pub(super) fn describe(&self) -> String {
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
            ConvImpl::DepthwiseTile => "depthwise kernel, a tile's window in shared memory".into(),
            ConvImpl::Pointwise => "pointwise dp4a kernel".into(),
            ConvImpl::PointwiseWord => "pointwise dp4a kernel, 4 channels a thread".into(),
            ConvImpl::Gemv => "int8 GEMV dp4a kernel, 4 channels a warp".into(),
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
            ConvImpl::Wgmma { bm, bn, splits: 1 } => {
                format!("int8 Hopper wgmma implicit GEMM kernel, {bm} x {bn} tiles")
            }
            ConvImpl::Wgmma { bm, bn, splits } => format!(
                "int8 Hopper wgmma implicit GEMM kernel, {bm} x {bn} tiles, reduction split \
                 over {splits} blocks"
            ),
            ConvImpl::WgmmaStream { blocks, stages } => format!(
                "int8 Hopper wgmma streaming kernel, weights resident, {WGS_BM}-pixel tiles \
                 streamed through {stages} stages, {blocks} block(s) an SM"
            ),
            ConvImpl::AsF16(inner) => format!("run in fp16 (timed faster): {}", inner.describe()),
        }
    }
}

/// `rows` rows of `k` values, zero padded to `[rows_pad, kpad]` (GEMM operands keep 16-element
/// alignment).
pub(super) fn padded_rows<T: Copy + Default>(
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

/// `v` as FP16 values.
pub(super) fn halves(v: &[f32]) -> Vec<half::f16> {
    v.iter().map(|&x| half::f16::from_f32(x)).collect()
}

/// cuDNN's 2-D convolution takes one padding per axis.
pub(super) fn symmetric_pads(c: &ConvStep) -> bool {
    c.pads[0] == c.pads[2] && c.pads[1] == c.pads[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A known key sets up its family alone: each key family belongs to one family, and the
    /// fast order names only families that exist.
    #[test]
    fn key_families_name_one_family_each() {
        let all: Vec<&dyn ConvFamily> = FAMILIES
            .iter()
            .copied()
            .chain([F16_WAY, &DIRECT as &dyn ConvFamily])
            .collect();
        let mut tokens: Vec<&str> = all
            .iter()
            .flat_map(|f| f.tokens().iter().copied())
            .collect();
        let n = tokens.len();
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), n, "a key family claimed twice: {tokens:?}");
        for t in FAST_ORDER {
            assert!(family_of(t).is_some(), "fast order names {t}");
        }
        let keys = [
            (
                ConvImpl::GemmFused {
                    algo: 2,
                    im2col: false,
                },
                "gemmf",
                "fused-epilogue cuBLASLt GEMM",
            ),
            (
                ConvImpl::Gemm {
                    algo: 0,
                    im2col: true,
                },
                "gemm",
                "cuBLASLt GEMM",
            ),
            (
                ConvImpl::MmaStream { bm: 64 },
                "mmas",
                "int8 tensor-core kernel",
            ),
            (
                ConvImpl::Mma { bm: MMA_BM },
                "mma",
                "int8 tensor-core kernel",
            ),
            (
                ConvImpl::Wgmma {
                    bm: 64,
                    bn: 64,
                    splits: 1,
                },
                "wgmma",
                "int8 tensor-core kernel",
            ),
            (
                ConvImpl::Wgmma {
                    bm: 64,
                    bn: 64,
                    splits: 8,
                },
                "wgmma",
                "int8 tensor-core kernel",
            ),
            (
                ConvImpl::Wgmma {
                    bm: 128,
                    bn: 128,
                    splits: 2,
                },
                "wgmmaw",
                "int8 tensor-core kernel",
            ),
            (
                ConvImpl::CudnnGraph { plan: 1 },
                "cudnng",
                "cuDNN graph conv",
            ),
            (ConvImpl::Cudnn { algo: 1 }, "cudnn", "cuDNN conv"),
            (
                ConvImpl::DepthwiseRows { kernel: 0 },
                "dwr",
                "row-window depthwise kernel",
            ),
            (
                ConvImpl::DepthwiseTile,
                "dwt",
                "shared-memory tile depthwise kernel",
            ),
            (ConvImpl::PointwiseWord, "pww", "pointwise kernel"),
            (
                ConvImpl::AsF16(Box::new(ConvImpl::Cudnn { algo: 1 })),
                "f16",
                "FP16 way",
            ),
            (ConvImpl::Direct, "direct", "direct kernel"),
        ];
        for (imp, token, family) in keys {
            let key = imp.key();
            assert_eq!(family_token(&key), token, "{key}");
            assert_eq!(family_of(token).map(|f| f.name()), Some(family), "{key}");
        }
    }

    /// A split wgmma kernel's key names its tile, then the split: the tile's key alone (a
    /// forced family, an older cache) also answers for it, but the builder's candidates list
    /// the unsplit kernel first; `wgmma64:k` answers for any split of 64 x 64 tiles alone.
    #[test]
    fn split_wgmma_keys_answer_for_their_tile_and_split() {
        let wg = |bm, bn, splits| ConvImpl::Wgmma { bm, bn, splits };
        assert_eq!(wg(64, 64, 8).key(), "wgmma64:k:8");
        assert_eq!(wg(128, 64, 2).key(), "wgmma:k:2");
        assert_eq!(wg(128, 128, 4).key(), "wgmmaw:k:4");
        assert_eq!(wg(64, 64, 1).key(), "wgmma64");
        assert!(wg(64, 64, 8).answers("wgmma64:k"));
        assert!(wg(64, 64, 8).answers("wgmma64:k:8"));
        assert!(!wg(64, 64, 8).answers("wgmma64:k:4"));
        assert!(!wg(64, 64, 1).answers("wgmma64:k"));
        assert!(!wg(128, 64, 2).answers("wgmma64:k"));
    }
}
