//! Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization Through Weight
//! Equalization and Bias Correction"; as in AIMET and NNCF): a float-exact rewrite of the FP32
//! model, applied before calibration and Q/DQ placement, that rescales the channels between two
//! consecutive convolutions so that both layers' per-channel weight ranges (and the activation
//! between them) are even, which per-tensor activation quantization needs on depthwise layers.

use std::collections::{BTreeMap, HashMap};

use prost::Message;
use serde::{Deserialize, Serialize};
use tract_onnx::pb::{self, tensor_proto::DataType};

use crate::model::{Graph, Model, ModelError, proto};

/// The experiment's choice (`--cle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CleSetting {
    /// On where a depthwise conv is in an equalizable pair with no Clip between (see [`decide`]).
    #[default]
    Auto,
    On,
    Off,
}

impl CleSetting {
    pub const ALL: [CleSetting; 3] = [CleSetting::Auto, CleSetting::On, CleSetting::Off];

    pub fn name(self) -> &'static str {
        match self {
            CleSetting::Auto => "auto",
            CleSetting::On => "on",
            CleSetting::Off => "off",
        }
    }
}

impl std::fmt::Display for CleSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What to do with a Clip (ReLU6) between two equalized convolutions. Scaling a channel by
/// 1/s moves where Clip(0, 6) clips it to 6/s, so the clip cannot stay as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClipPolicy {
    /// Keep the function exact: the Clip becomes Max(x, lo/s) then Min(x, hi/s) with one bound
    /// per channel.
    #[default]
    PerChannel,
    /// Leave pairs with a Clip between them alone (the paper's conservative option).
    Skip,
}

/// How each channel's scale s_i is chosen (the rescaling itself is the same, and exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRule {
    /// From the calibration images' per-channel activation ranges A_i of the tensor between
    /// the two convs: s_i = A_i / mean(A) where conv2 is depthwise (its per-channel weight
    /// quantization does not see s, so the activation is made even), else
    /// s_i = sqrt(A_i / r2_i), balancing the activation against conv2's input-channel weight
    /// range. Pairs without activation ranges fall back to `Weights`.
    #[default]
    Activations,
    /// The paper's data-free rule from weight ranges only: s_i = sqrt(r1_i / r2_i).
    Weights,
}

#[derive(Debug, thiserror::Error)]
pub enum CleError {
    #[error("{path}: cross-layer equalization produced a model that does not load again: {source}")]
    Reload {
        path: String,
        #[source]
        source: Box<ModelError>,
    },
}

/// A pair left alone, and why (shown in the report so a user sees what CLE did not touch).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SkippedPair {
    pub conv1: String,
    pub conv2: String,
    pub reason: String,
}

/// What equalization did to one model (the report's `equalization`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CleSummary {
    pub setting: CleSetting,
    pub clip_policy: ClipPolicy,
    pub scale_rule: ScaleRule,
    /// Pairs whose scales came from activation ranges (the rest used weight ranges).
    pub activation_scaled: usize,
    /// Whether the INT8 engines were built from the equalized model.
    pub applied: bool,
    /// Why `auto` decided as it did (empty for on/off).
    pub decision: String,
    /// Equalized conv pairs, as (conv1, conv2) node names.
    pub pairs: Vec<(String, String)>,
    /// Clip nodes rewritten as per-channel Max/Min.
    pub clips_rewritten: usize,
    /// Passes over all pairs until the scales converged.
    pub passes: usize,
    /// Over the equalized pairs, the mean of (largest / smallest per-channel weight range)
    /// of conv1's output channels, before and after: how uneven the channels were.
    pub spread_before: f64,
    pub spread_after: f64,
    pub skipped: Vec<SkippedPair>,
}

impl CleSummary {
    /// One line for the report's notes and the CLI.
    pub fn note(&self) -> String {
        let why = if self.decision.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.decision)
        };
        if !self.applied {
            return format!(
                "cross-layer equalization ({}) not applied{why}; {} equalizable pairs, {} skipped",
                self.setting,
                self.pairs.len(),
                self.skipped.len()
            );
        }
        format!(
            "cross-layer equalization ({}){why}: {} conv pairs equalized in {} passes \
             ({} scaled from calibration activation ranges, the rest from weight ranges; \
             {} Clip rewritten per channel), mean conv1 channel-range spread {:.1}x -> {:.1}x; \
             {} pairs skipped; the FP32 rows use the original model",
            self.setting,
            self.pairs.len(),
            self.passes,
            self.activation_scaled,
            self.clips_rewritten,
            self.spread_before,
            self.spread_after,
            self.skipped.len()
        )
    }
}

/// The activation between the two convolutions of a pair.
#[derive(Clone, Debug, PartialEq)]
enum Act {
    /// conv1 feeds conv2 directly, or through Identity.
    None,
    /// Relu, LeakyRelu, PRelu: f(x / s) = f(x) / s for s > 0, so nothing to rewrite.
    Homogeneous,
    /// Clip(lo, hi) at node index `node`; rewritten per channel.
    Clip { node: usize, lo: f32, hi: f32 },
}

#[derive(Clone, Debug)]
struct Pair {
    conv1: usize,
    act: Act,
    conv2: usize,
    /// The tensor conv2 reads (after the activation): the one quantized per tensor.
    between: String,
}

const MAX_PASSES: usize = 20;
/// Passes stop when no scale moves more than this (relative).
const CONVERGED: f32 = 1e-4;
/// A channel whose weight range is below this fraction of the tensor's largest is dead.
const DEAD: f32 = 1e-4;
/// Scales are kept in this range so a dead channel (range 0 on one side) cannot blow up.
const SCALE_LIMITS: (f32, f32) = (1e-4, 1e4);

pub(super) fn is_conv(n: &pb::NodeProto) -> bool {
    n.op_type == "Conv" && n.domain.is_empty()
}

fn group(n: &pb::NodeProto) -> usize {
    proto::attr_i(n, "group").unwrap_or(1).max(1) as usize
}

/// A float32 initializer read by exactly one node input (so rescaling it changes that node only).
pub(super) fn private_f32<'a>(g: &Graph<'a>, name: &str) -> Result<&'a pb::TensorProto, String> {
    let t = g
        .initializer(name)
        .ok_or_else(|| format!("`{name}` is not a constant"))?;
    if t.data_type != DataType::Float as i32 {
        return Err(format!("`{name}` is not float32"));
    }
    if g.consumers(name).len() != 1 || g.is_graph_output(name) {
        return Err(format!("`{name}` is shared with other nodes"));
    }
    Ok(t)
}

fn scalar_of(g: &Graph<'_>, name: &str) -> Option<f32> {
    if name.is_empty() {
        return None;
    }
    let t = proto::tensor_f32(g.initializer(name)?)?;
    (t.data.len() == 1).then(|| t.data[0])
}

/// Clip's bounds, from its inputs (opset ≥ 11) or attributes (older). `None` when a bound is
/// not a constant.
pub(super) fn clip_bounds(g: &Graph<'_>, n: &pb::NodeProto) -> Option<(f32, f32)> {
    let from_input = |slot: usize, default: f32| match n.input.get(slot) {
        None => Some(default),
        Some(s) if s.is_empty() => Some(default),
        Some(s) => scalar_of(g, s),
    };
    let lo = proto::attr_f(n, "min")
        .map(Some)
        .unwrap_or_else(|| from_input(1, f32::NEG_INFINITY))?;
    let hi = proto::attr_f(n, "max")
        .map(Some)
        .unwrap_or_else(|| from_input(2, f32::INFINITY))?;
    Some((lo, hi))
}

/// Pairs conv1 → (homogeneous activation) → conv2 where conv1's output reaches conv2 only, and
/// the candidates left alone with the reason.
fn find_pairs(g: &Graph<'_>, clip: ClipPolicy) -> (Vec<Pair>, Vec<SkippedPair>) {
    let mut pairs = vec![];
    let mut skipped = vec![];
    let nodes = &g.proto.node;
    for (i, n) in nodes.iter().enumerate() {
        if !is_conv(n) || n.output.first().is_none_or(|o| o.is_empty()) {
            continue;
        }
        let only_reader = |t: &str| match g.consumers(t) {
            [one] if !g.is_graph_output(t) => Some(*one),
            _ => None,
        };
        let out = &n.output[0];
        let Some((next, _)) = only_reader(out) else {
            continue;
        };
        let m = &nodes[next];
        // The activation (if any) and the node after it.
        let (act, after) = match m.op_type.as_str() {
            "Conv" => (Act::None, Some(next)),
            "Identity" | "Relu" | "LeakyRelu" | "PRelu" | "Clip" => {
                let reader = m.output.first().and_then(|o| only_reader(o));
                let act = match m.op_type.as_str() {
                    "Identity" => Act::None,
                    "Clip" => match clip_bounds(g, m) {
                        Some((lo, hi)) => Act::Clip { node: next, lo, hi },
                        None => continue,
                    },
                    _ => Act::Homogeneous,
                };
                // PRelu's slope must not be rescaled with the channel: it is not, since
                // PRelu(x / s) = PRelu(x) / s for s > 0 (same slope), so it qualifies as is.
                (act, reader.map(|r| r.0).filter(|_| m.input[0] == *out))
            }
            _ => continue,
        };
        let Some(j) = after.filter(|&j| is_conv(&nodes[j])) else {
            continue;
        };
        let conv2 = &nodes[j];
        let skip = |reason: String| SkippedPair {
            conv1: n.name.clone(),
            conv2: conv2.name.clone(),
            reason,
        };
        let via = match &act {
            Act::Clip { node, .. } => nodes[*node].output[0].clone(),
            _ if next == j => out.clone(),
            _ => m.output[0].clone(),
        };
        if conv2.input.first() != Some(&via) {
            skipped.push(skip("conv1 feeds conv2's weight, not its data".into()));
            continue;
        }
        if matches!(act, Act::Clip { .. }) && clip == ClipPolicy::Skip {
            skipped.push(skip(format!(
                "`{}` (Clip) between them: scaling would move where it clips",
                m.name
            )));
            continue;
        }
        if let Err(e) = check_tensors(g, n, conv2) {
            skipped.push(skip(e));
            continue;
        }
        pairs.push(Pair {
            conv1: i,
            act,
            conv2: j,
            between: via,
        });
    }
    (pairs, skipped)
}

/// The weights and biases a pair rescales are private float32 constants whose channel counts
/// line up.
fn check_tensors(
    g: &Graph<'_>,
    conv1: &pb::NodeProto,
    conv2: &pb::NodeProto,
) -> Result<(), String> {
    let w1 = private_f32(g, conv1.input.get(1).map_or("", |s| s))?;
    if let Some(b) = conv1.input.get(2).filter(|b| !b.is_empty()) {
        private_f32(g, b)?;
    }
    let w2 = private_f32(g, conv2.input.get(1).map_or("", |s| s))?;
    if w1.dims.len() < 3 || w2.dims.len() != w1.dims.len() {
        return Err("weights of unexpected rank".into());
    }
    let cout1 = w1.dims[0] as usize;
    let cin2 = w2.dims[1] as usize * group(conv2);
    if cout1 != cin2 || w2.dims[0] as usize % group(conv2) != 0 {
        return Err(format!(
            "conv1 has {cout1} output channels but conv2 reads {cin2}"
        ));
    }
    Ok(())
}

/// Per output channel, max |w| of conv1's weight `[Cout, Cin/g, k...]`.
fn out_ranges(w: &proto::F32Tensor) -> Vec<f32> {
    let c = w.dims[0];
    let inner = w.data.len() / c.max(1);
    (0..c)
        .map(|o| {
            w.data[o * inner..(o + 1) * inner]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()))
        })
        .collect()
}

/// For weight `[Cout, Cin/g, k...]` with `groups`, calls `f(input channel, index)` for every
/// element: input channel = group * (Cin/g) + local input index.
fn for_each_in_channel(w: &proto::F32Tensor, groups: usize, mut f: impl FnMut(usize, usize)) {
    let (cout, cin_g) = (w.dims[0], w.dims[1]);
    let k: usize = w.dims[2..].iter().product();
    let out_per_group = cout / groups.max(1);
    for o in 0..cout {
        let grp = o / out_per_group.max(1);
        for ci in 0..cin_g {
            let channel = grp * cin_g + ci;
            let base = (o * cin_g + ci) * k;
            for idx in base..base + k {
                f(channel, idx);
            }
        }
    }
}

/// Per input channel, max |w| of conv2's weight.
fn in_ranges(w: &proto::F32Tensor, groups: usize) -> Vec<f32> {
    let mut r = vec![0f32; w.dims[1] * groups];
    for_each_in_channel(w, groups, |c, i| r[c] = r[c].max(w.data[i].abs()));
    r
}

fn max_of(r: &[f32]) -> f32 {
    r.iter().fold(0f32, |m, &v| m.max(v))
}

/// Largest over smallest live channel range.
fn spread(r: &[f32]) -> f64 {
    let max = max_of(r);
    let min = r
        .iter()
        .copied()
        .filter(|&v| v > DEAD * max)
        .fold(f32::INFINITY, f32::min);
    if min.is_finite() && min > 0.0 {
        (max / min) as f64
    } else {
        1.0
    }
}

/// The tensors between equalizable pairs (conv2's data inputs), whose per-channel |x| maxima
/// over the calibration images [`ScaleRule::Activations`] needs; the caller measures them
/// (this module runs nothing).
/// Each with its channel count (conv1's output channels; the tensor is NCHW).
pub fn between_tensors(model: &Model, clip: ClipPolicy) -> Vec<(String, usize)> {
    let g = Graph::new(model.graph());
    let channels = |p: &Pair| {
        g.node(p.conv1)
            .input
            .get(1)
            .and_then(|w| g.initializer(w))
            .and_then(|w| w.dims.first())
            .map_or(0, |&d| d.max(0) as usize)
    };
    find_pairs(&g, clip)
        .0
        .iter()
        .map(|p| (p.between.clone(), channels(p)))
        .collect()
}

/// Per channel, the running max |x| of a batch-1 NCHW activation with `channels` channels.
pub fn channel_max(x: &[f32], channels: usize, into: &mut Vec<f32>) {
    into.resize(channels, 0.0);
    let plane = (x.len() / channels.max(1)).max(1);
    for (c, chunk) in x.chunks(plane).enumerate().take(channels) {
        into[c] = chunk.iter().fold(into[c], |m, v| m.max(v.abs()));
    }
}

/// Whether `auto` equalizes this model, and why. Measured (README, "Cross-layer
/// equalization"): with per-channel weight quantization, equalizing pairs with a Clip (ReLU6)
/// between them lowered DeepLabV3-MobileNetV2's INT8 SQNR (paper's rule: 24.4 -> 20.7 dB with
/// max calibration) or left it level (activation rule), and plain conv pairs without a
/// depthwise conv (the bundled ResNet-style samples) moved by noise only, while the same
/// DeepLab with ReLU in place of ReLU6 went from 9.8 to 18.7 dB (max). So `auto` equalizes only
/// the case the method was made for: a depthwise conv in a pair with no Clip between
/// (MobileNet-style blocks with ReLU), and never a model whose pairs are all of the other kinds.
pub fn decide(model: &Model) -> (bool, String) {
    let gp = model.graph();
    let g = Graph::new(gp);
    let (pairs, _) = find_pairs(&g, ClipPolicy::PerChannel);
    let depthwise = |i: usize| {
        let n = &gp.node[i];
        let w = n.input.get(1).and_then(|w| g.initializer(w));
        group(n) > 1 && w.is_some_and(|w| w.dims.get(1) == Some(&1))
    };
    let dw: Vec<&Pair> = pairs
        .iter()
        .filter(|p| depthwise(p.conv1) || depthwise(p.conv2))
        .collect();
    let unclipped = dw
        .iter()
        .filter(|p| !matches!(p.act, Act::Clip { .. }))
        .count();
    match (dw.len(), unclipped) {
        (0, _) => (
            false,
            format!(
                "no depthwise conv in its {} equalizable pairs; CLE is measured neutral \
                 there, use --cle on to try it",
                pairs.len()
            ),
        ),
        (n, 0) => (
            false,
            format!(
                "all {n} depthwise pairs have a Clip (ReLU6) between them, where CLE \
                 measured worse (lower INT8 SQNR); use --cle on to try it"
            ),
        ),
        (n, u) => (
            true,
            format!("{u} of {n} depthwise pairs have no Clip between them"),
        ),
    }
}

/// Equalizes the model per `setting` and returns the model the INT8 path uses (the same model
/// when CLE is off or finds nothing) with what was done.
pub fn apply(
    model: &Model,
    setting: CleSetting,
    clip: ClipPolicy,
    rule: ScaleRule,
    act_ranges: &HashMap<String, Vec<f32>>,
) -> Result<(Model, CleSummary), CleError> {
    let mut summary = CleSummary {
        setting,
        clip_policy: clip,
        scale_rule: rule,
        ..Default::default()
    };
    let on = match setting {
        CleSetting::Off => false,
        CleSetting::On => true,
        CleSetting::Auto => {
            let (on, why) = decide(model);
            summary.decision = why;
            on
        }
    };
    if !on || model.info.prequantized {
        if model.info.prequantized {
            summary.decision = "the model already holds Q/DQ".into();
        }
        let g = Graph::new(model.graph());
        let (pairs, skipped) = find_pairs(&g, clip);
        summary.pairs = pairs
            .iter()
            .map(|p| (g.node(p.conv1).name.clone(), g.node(p.conv2).name.clone()))
            .collect();
        summary.skipped = skipped;
        return Ok((model.clone(), summary));
    }
    let mut proto = model.proto.clone();
    equalize_graph(
        proto.graph.as_mut().expect("a loaded model has a graph"),
        clip,
        rule,
        act_ranges,
        &mut summary,
    );
    summary.applied = !summary.pairs.is_empty();
    if !summary.applied {
        return Ok((model.clone(), summary));
    }
    let reloaded =
        Model::from_bytes(&model.path, &proto.encode_to_vec()).map_err(|e| CleError::Reload {
            path: model.path.display().to_string(),
            source: Box::new(e),
        })?;
    Ok((reloaded, summary))
}

/// The transform itself, on a graph: finds the pairs, iterates the scales to convergence,
/// writes the rescaled weights and the per-channel clips back.
pub fn equalize_graph(
    gp: &mut pb::GraphProto,
    clip: ClipPolicy,
    rule: ScaleRule,
    act_ranges: &HashMap<String, Vec<f32>>,
    summary: &mut CleSummary,
) {
    let (pairs, skipped) = {
        let g = Graph::new(gp);
        find_pairs(&g, clip)
    };
    summary.skipped = skipped;
    if pairs.is_empty() {
        return;
    }
    // Working copies of every weight and bias involved, by initializer name.
    let mut tensors: HashMap<String, proto::F32Tensor> = HashMap::new();
    {
        let g = Graph::new(gp);
        for p in &pairs {
            for (node, slots) in [(p.conv1, &[1usize, 2][..]), (p.conv2, &[1][..])] {
                for &s in slots {
                    if let Some(name) = g.node(node).input.get(s).filter(|n| !n.is_empty())
                        && let Some(t) = g.initializer(name).and_then(proto::tensor_f32)
                    {
                        tensors.insert(name.clone(), t);
                    }
                }
            }
        }
    }
    let name = |i: usize, slot: usize| {
        gp.node[i]
            .input
            .get(slot)
            .filter(|n| !n.is_empty())
            .cloned()
    };
    let names: Vec<(String, Option<String>, String, usize)> = pairs
        .iter()
        .filter_map(|p| {
            Some((
                name(p.conv1, 1)?,
                name(p.conv1, 2),
                name(p.conv2, 1)?,
                group(&gp.node[p.conv2]),
            ))
        })
        .collect();
    // Cumulative scale of each pair's channels (conv1's outputs are divided by it).
    let mut total: Vec<Vec<f32>> = Vec::with_capacity(pairs.len());
    let mut before = 0.0;
    for (w1, _, _, _) in &names {
        let r = out_ranges(&tensors[w1]);
        before += spread(&r);
        total.push(vec![1.0; r.len()]);
    }
    summary.spread_before = before / names.len() as f64;
    // Current per-channel activation range of each pair's tensor (divided by the scale as it
    // is applied), where the rule uses them and the calibration pass measured them.
    let mut acts: Vec<Option<Vec<f32>>> = pairs
        .iter()
        .zip(&total)
        .map(|(p, t)| {
            act_ranges
                .get(&p.between)
                .filter(|a| rule == ScaleRule::Activations && a.len() == t.len())
                .cloned()
        })
        .collect();
    summary.activation_scaled = acts.iter().filter(|a| a.is_some()).count();
    let depthwise: Vec<bool> = pairs
        .iter()
        .map(|p| {
            let n = &gp.node[p.conv2];
            let w = n.input.get(1).and_then(|w| tensors.get(w));
            group(n) > 1 && w.is_some_and(|w| w.dims.get(1) == Some(&1))
        })
        .collect();
    for pass in 1..=MAX_PASSES {
        summary.passes = pass;
        let mut moved = 0f32;
        for (k, (w1, b1, w2, g2)) in names.iter().enumerate() {
            let r1 = out_ranges(&tensors[w1]);
            let r2 = in_ranges(&tensors[w2], *g2);
            let s: Vec<f32> = pair_scales(&r1, &r2, acts[k].as_deref(), depthwise[k])
                .iter()
                .map(|v| v.clamp(SCALE_LIMITS.0, SCALE_LIMITS.1))
                .collect();
            // The cumulative scale stays within SCALE_LIMITS; this pass applies what is left.
            let step: Vec<f32> = s
                .iter()
                .zip(&total[k])
                .map(|(&v, &t)| (t * v).clamp(SCALE_LIMITS.0, SCALE_LIMITS.1) / t)
                .collect();
            for (t, &v) in total[k].iter_mut().zip(&step) {
                *t *= v;
                moved = moved.max((v - 1.0).abs());
            }
            if let Some(a) = &mut acts[k] {
                a.iter_mut().zip(&step).for_each(|(x, v)| *x /= v);
            }
            scale_pair(&mut tensors, w1, b1.as_deref(), w2, *g2, &step);
        }
        if moved < CONVERGED {
            break;
        }
    }
    summary.spread_after = names
        .iter()
        .map(|(w1, _, _, _)| spread(&out_ranges(&tensors[w1])))
        .sum::<f64>()
        / names.len() as f64;
    // Write the tensors back (names unchanged: each is private to its node).
    for t in gp.initializer.iter_mut() {
        if let Some(v) = tensors.get(&t.name) {
            *t = proto::f32_tensor(&t.name, &v.dims, &v.data);
        }
    }
    summary.pairs = pairs
        .iter()
        .map(|p| (gp.node[p.conv1].name.clone(), gp.node[p.conv2].name.clone()))
        .collect();
    rewrite_clips(gp, &pairs, &names, &total, &tensors, summary);
}

/// One pair's scales s_i, one per channel between the convs: conv1's channel i is divided by
/// s_i and conv2's input channel i multiplied by it. From weight ranges only (`act` None),
/// s_i = sqrt(r1_i / r2_i) = (1 / r2_i) sqrt(r1_i r2_i), so both ranges become
/// sqrt(r1_i r2_i); from the activation ranges `act`, s_i = sqrt(a_i / r2_i), or a_i / mean(a)
/// where conv2 is depthwise.
fn pair_scales(r1: &[f32], r2: &[f32], act: Option<&[f32]>, depthwise: bool) -> Vec<f32> {
    // A channel whose weights are (near) zero on either side outputs only its bias or
    // is not read: rescaling it gains nothing, and dividing a dead conv1 channel by a
    // tiny s would multiply its bias into a huge constant that sets the per-tensor
    // activation range (measured on DeepLabV3-MobileNetV2's first block).
    let (dead1, dead2) = (DEAD * max_of(r1), DEAD * max_of(r2));
    let live = |c: usize| r1[c] > dead1 && r2[c] > dead2;
    match act {
        None => (0..r1.len())
            .map(|c| match live(c) {
                true => (r1[c] / r2[c]).sqrt(),
                false => 1.0,
            })
            .collect(),
        Some(a) => {
            let dead_a = DEAD * max_of(a);
            let live = |c: usize| live(c) && a[c] > dead_a;
            let n = (0..a.len()).filter(|&c| live(c)).count().max(1);
            let mean = (0..a.len()).filter(|&c| live(c)).map(|c| a[c]).sum::<f32>() / n as f32;
            (0..a.len())
                .map(|c| match (live(c), depthwise) {
                    (false, _) => 1.0,
                    (true, true) => a[c] / mean,
                    (true, false) => (a[c] / r2[c]).sqrt(),
                })
                .collect()
        }
    }
}

/// Writes each pair's Clip as per-channel Max/Min bounds divided by the pair's cumulative
/// scale `total`.
fn rewrite_clips(
    gp: &mut pb::GraphProto,
    pairs: &[Pair],
    names: &[(String, Option<String>, String, usize)],
    total: &[Vec<f32>],
    tensors: &HashMap<String, proto::F32Tensor>,
    summary: &mut CleSummary,
) {
    // Clips become per-channel Max/Min; their output keeps its name so plans keyed by tensor
    // name (per-tensor methods, exclusions) still apply.
    let mut replace: BTreeMap<usize, Vec<pb::NodeProto>> = BTreeMap::new();
    for (k, p) in pairs.iter().enumerate() {
        let Act::Clip { node, lo, hi } = p.act else {
            continue;
        };
        let rank = tensors.get(&names[k].0).map(|w| w.dims.len()).unwrap_or(4);
        // Per-channel constant shaped [C, 1, ...] to broadcast over NC(spatial).
        let mut dims = vec![total[k].len()];
        dims.extend(std::iter::repeat_n(1, rank - 2));
        let n = &gp.node[node];
        let (x, y) = (n.input[0].clone(), n.output[0].clone());
        let mut out = vec![];
        let mut cur = x;
        if lo.is_finite() {
            let c_name = format!("{}_cle_lo", n.name);
            let v: Vec<f32> = total[k].iter().map(|s| lo / s).collect();
            gp.initializer.push(proto::f32_tensor(&c_name, &dims, &v));
            let o = if hi.is_finite() {
                format!("{}_cle_max", n.name)
            } else {
                y.clone()
            };
            out.push(proto::node(
                "Max",
                &format!("{}_max", n.name),
                &[&cur, &c_name],
                &[&o],
                vec![],
            ));
            cur = o;
        }
        if hi.is_finite() {
            let c_name = format!("{}_cle_hi", n.name);
            let v: Vec<f32> = total[k].iter().map(|s| hi / s).collect();
            gp.initializer.push(proto::f32_tensor(&c_name, &dims, &v));
            out.push(proto::node(
                "Min",
                &format!("{}_min", n.name),
                &[&cur, &c_name],
                &[&y],
                vec![],
            ));
        }
        if out.is_empty() {
            out.push(proto::node("Identity", &n.name, &[&cur], &[&y], vec![]));
        }
        replace.insert(node, out);
        summary.clips_rewritten += 1;
    }
    if !replace.is_empty() {
        let nodes = std::mem::take(&mut gp.node);
        for (i, n) in nodes.into_iter().enumerate() {
            match replace.remove(&i) {
                Some(v) => gp.node.extend(v),
                None => gp.node.push(n),
            }
        }
        crate::model::drop_unused_initializers(gp);
    }
}

/// Divides conv1's output channel i (weight and bias) by s_i and multiplies conv2's input
/// channel i by s_i.
fn scale_pair(
    tensors: &mut HashMap<String, proto::F32Tensor>,
    w1: &str,
    b1: Option<&str>,
    w2: &str,
    g2: usize,
    s: &[f32],
) {
    if let Some(w) = tensors.get_mut(w1) {
        let inner = w.data.len() / s.len().max(1);
        for (c, &v) in s.iter().enumerate() {
            for x in &mut w.data[c * inner..(c + 1) * inner] {
                *x /= v;
            }
        }
    }
    if let Some(b) = b1.and_then(|b| tensors.get_mut(b)) {
        for (x, &v) in b.data.iter_mut().zip(s) {
            *x /= v;
        }
    }
    if let Some(w) = tensors.get_mut(w2) {
        let mut data = std::mem::take(&mut w.data);
        for_each_in_channel(w, g2, |c, i| data[i] *= s[c]);
        w.data = data;
    }
}

#[cfg(test)]
mod tests;
