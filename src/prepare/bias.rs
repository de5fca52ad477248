//! Empirical bias correction: each quantized layer's float bias shifted so that its quantized
//! output keeps FP32's mean, measured per layer (with only that layer quantized, through
//! [`crate::layerwise`]'s twin model) or in the whole quantized model, whichever brings the
//! output closer to FP32.

use std::collections::{BTreeMap, HashMap};

use tract_onnx::prelude::TValue;

use crate::backend::cpu::{TractModel, lower_qdq};
use crate::backend::reference::{self, Activation};
use crate::calib::Ranges;
use crate::layerwise::{isolated_model, outputs_of};
use crate::model::{Model, proto};
use crate::quant::{self, QuantPlan};

/// One output's values, as f32.
fn values_of(v: &TValue) -> Result<Vec<f32>, String> {
    let v = v.cast_to::<f32>().map_err(|e| format!("{e:#}"))?;
    let s = v
        .try_as_plain_ram()
        .map_err(|e| format!("{e:#}"))?
        .as_slice::<f32>()
        .map_err(|e| format!("{e:#}"))?
        .to_vec();
    Ok(s)
}

/// Per-layer ("isolated") bias correction: per quantized layer and output channel, the mean of
/// (FP32 output - output with only this layer quantized) over `inputs`, from one pass of the
/// twin model of [`isolated_model`].
fn per_layer_shifts(
    model: &Model,
    hw: [usize; 2],
    plan: &QuantPlan,
    ranges: &Ranges,
    inputs: &[Vec<f32>],
) -> Result<BTreeMap<String, Vec<f64>>, String> {
    let (iso, pairs) = isolated_model(model, plan, ranges)?;
    let mut names: Vec<String> = pairs.iter().map(|x| x.1.clone()).collect();
    names.extend(pairs.iter().map(|x| x.2.clone()));
    let m = reference::open(
        &Model {
            proto: iso,
            ..model.clone()
        }
        .with_fixed_input(1, hw),
        model.input_shape(1, hw),
        &names,
    )
    .map_err(|e| e.to_string())?;
    let n = pairs.len();
    let mut layouts: Vec<ChannelLayout> = vec![];
    let mut sums: Vec<Vec<f64>> = vec![];
    for x in inputs {
        let outs = outputs_of(m.as_ref(), x)?;
        if layouts.is_empty() {
            layouts = pairs
                .iter()
                .zip(&outs)
                .map(|((node, _, _), o)| ChannelLayout::of(model, node, o.len()))
                .collect();
            sums = layouts.iter().map(|l| vec![0.0; l.channels]).collect();
        }
        for (k, l) in layouts.iter().enumerate() {
            let diff: Vec<f32> = outs[k]
                .iter()
                .zip(&outs[n + k])
                .map(|(a, b)| a - b)
                .collect();
            for (s, v) in sums[k].iter_mut().zip(l.means(&diff)) {
                *s += v / inputs.len() as f64;
            }
        }
    }
    Ok(pairs
        .iter()
        .zip(sums)
        .map(|((node, _, _), s)| (node.clone(), s))
        .collect())
}

/// How a node's output (one image of it: `len` values) is laid out by output channel.
struct ChannelLayout {
    channels: usize,
    /// Values per channel per image (H x W for a conv; 1 where the channel is the last axis).
    per: usize,
    /// MatMul: the channel is the last axis.
    last_axis: bool,
}

impl ChannelLayout {
    /// Conv / ConvTranspose: NCHW, channel-major blocks; Gemm [N, C]; MatMul: channel last.
    fn of(model: &Model, node: &str, len: usize) -> ChannelLayout {
        let n = model.graph().node.iter().find(|x| x.name == node);
        let w = n
            .and_then(|x| x.input.get(1))
            .and_then(|w| model.initializer(w));
        let channels = match (n.map(|x| x.op_type.as_str()), w) {
            (Some("Gemm"), Some(w)) if n.and_then(|x| proto::attr_i(x, "transB")) == Some(1) => {
                w.dims[0]
            }
            (Some("Gemm"), Some(w)) | (Some("MatMul"), Some(w)) => *w.dims.last().unwrap_or(&len),
            (Some("ConvTranspose"), Some(w)) => {
                w.dims[1] * n.and_then(|x| proto::attr_i(x, "group")).unwrap_or(1) as usize
            }
            (_, Some(w)) => w.dims[0],
            _ => len,
        }
        .clamp(1, len.max(1));
        let last_axis = n.is_some_and(|x| x.op_type == "MatMul");
        ChannelLayout {
            channels,
            per: if last_axis {
                1
            } else {
                (len / channels).max(1)
            },
            last_axis,
        }
    }

    /// The channel of value `i` of a batch of such outputs.
    fn channel(&self, i: usize) -> usize {
        if self.last_axis {
            i % self.channels
        } else {
            (i / self.per) % self.channels
        }
    }

    /// Per-channel means of `values` (any whole number of images).
    fn means(&self, values: &[f32]) -> Vec<f64> {
        let mut sums = vec![0.0f64; self.channels];
        for (i, v) in values.iter().enumerate() {
            sums[self.channel(i)] += *v as f64;
        }
        let count = (values.len() / self.channels).max(1) as f64;
        sums.iter().map(|s| s / count).collect()
    }
}

/// Most bytes of corrected layer outputs one batch of sequential bias correction may hold:
/// they are the tensors read while the batch flows through, and all of them stay alive.
const SEQUENTIAL_BATCH_BYTES: usize = 1 << 30;

/// The smallest SQNR gain (dB, mean over the calibration images) for which per-layer or no
/// correction replaces the full one, the default; the margin is wider where the images
/// disagree (see [`crate::decide::Paired::margin`]). Below 2 dB the output's SQNR did not
/// predict the task metric: on DeepLabV3 (coco96, GPTQ, max ranges) per-layer read +1.2 dB
/// (±0.45) over full and lost 0.58 pt mIoU to it; the gains that were real, on the bundled
/// classifier, were 4 to 6 dB.
pub const CHOICE_FLOOR_DB: f64 = 2.0;

/// Which bias correction an engine got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CorrectionKind {
    /// None helped: the biases stay as trained.
    #[default]
    None,
    /// Each layer's shift with only that layer quantized ([`isolated_model`]).
    PerLayer,
    /// Each layer's shift in the whole quantized model, layers above already corrected.
    Full,
}

impl CorrectionKind {
    pub fn name(self) -> &'static str {
        match self {
            CorrectionKind::None => "none",
            CorrectionKind::PerLayer => "per-layer",
            CorrectionKind::Full => "full",
        }
    }
}

/// What bias correction chose for one set of ranges.
#[derive(Clone, Debug, Default)]
pub struct BiasCorrection {
    /// Per corrected node, the shift added to its float bias, per output channel (empty for
    /// [`CorrectionKind::None`]).
    pub shifts: BTreeMap<String, Vec<f32>>,
    pub kind: CorrectionKind,
    /// Images per batch of the full correction: all of them (exact), or fewer (running mean).
    pub batch: usize,
    /// SQNR (dB) of the int8 graph's output against FP32 on the correction's own images with
    /// no correction, the per-layer one and the full one: the mean over the images of each
    /// image's SQNR (None: identical to FP32).
    pub sqnr_db: [Option<f64>; 3],
    /// How the kept correction was chosen (None where nothing was measured).
    pub decision: Option<Decision>,
}

impl BiasCorrection {
    /// One line for the log, naming the ranges' method.
    pub fn summary(&self, method: &str, images: usize) -> String {
        let db = |v: Option<f64>| v.map_or("inf".to_string(), |v| format!("{v:.1}"));
        let batches = if self.batch >= images {
            String::new()
        } else {
            format!(
                "; full correction in batches of {} (the model's batch limit or the memory \
                 budget), each shift averaged over the batches",
                self.batch
            )
        };
        let decided = self
            .decision
            .map(|d| format!("; {}", d.describe(self.kind)))
            .unwrap_or_default();
        format!(
            "bias correction {method}: {} ({} layers); int8 output SQNR on the {images} \
             calibration images (mean per image): none {}, per-layer {}, full {} dB{decided}{batches}",
            self.kind.name(),
            self.shifts.len(),
            db(self.sqnr_db[0]),
            db(self.sqnr_db[1]),
            db(self.sqnr_db[2]),
        )
    }
}

/// Empirical bias correction: a shift per quantized Conv / ConvTranspose / Gemm and output
/// channel, added to its float bias, so that the quantized layer's output keeps the FP32
/// output's mean on the reference's inputs (`plan`'s layers, `ranges`' scales). Two ways to
/// measure the shift, and no correction at all, are tried on the int8 graph; full is kept
/// unless another brings the output closer to FP32 by a margin beyond noise ([`choose`]):
///
/// - per-layer: each layer with only itself quantized (its inputs FP32);
/// - full (sequential, as NNCF's "full" mode): each layer in the *whole* quantized model, every
///   layer above it quantized and already corrected, so that the shifts upstream layers pass
///   down do not add up in depth. The inputs flow through the int8 graph as one batch and
///   each layer's output is corrected the moment it is computed, before any later layer reads
///   it: exact in one pass. Where the batch's layer outputs would pass
///   [`SEQUENTIAL_BATCH_BYTES`], or the model only runs at batch 1 (many exporters fix it),
///   the inputs go in smaller batches and each shift is averaged over the batches.
///
/// Why choose: matching each layer's mean is not the same as bringing the output closer.
/// Measured on the bundled classifier with entropy ranges, full correction moved the output
/// far further from FP32 (5.7 dB with none, 0.2 with full). Why full by default: on
/// DeepLabV3-MobileNetV2 (coco96) per-layer read up to 1.2 dB higher on the calibration
/// images, yet full gave the better mIoU with every method (max 41.54 against 40.96 %).
pub fn bias_correction(
    reference: &Fp32Reference,
    plan: &QuantPlan,
    ranges: &Ranges,
) -> Result<BiasCorrection, String> {
    correct_in_batches(reference, plan, ranges, None)
}

/// What bias correction compares with, for one model and one set of inputs: the FP32
/// per-channel means of every layer it may correct and the FP32 graph output. The same for
/// every set of ranges, so it is computed once for all calibration methods.
pub struct Fp32Reference<'a> {
    model: &'a Model,
    hw: [usize; 2],
    inputs: &'a [Vec<f32>],
    /// (node name, output tensor) of each quantizable Conv / ConvTranspose / Gemm.
    nodes: Vec<(String, String)>,
    layouts: Vec<ChannelLayout>,
    /// [image][node][channel] means.
    target: Vec<Vec<Vec<f64>>>,
    /// The graph's first output, every image in turn.
    output: Vec<f32>,
    /// Bytes of the corrected layers' outputs for one image.
    image_bytes: usize,
}

impl<'a> Fp32Reference<'a> {
    /// One FP32 pass over `inputs` for the layers `plan` quantizes.
    pub fn new(
        model: &'a Model,
        hw: [usize; 2],
        plan: &QuantPlan,
        inputs: &'a [Vec<f32>],
    ) -> Result<Fp32Reference<'a>, String> {
        let nodes: Vec<(String, String)> = model
            .graph()
            .node
            .iter()
            .filter(|n| plan.quantized_nodes.contains(&n.name))
            .filter(|n| matches!(n.op_type.as_str(), "Conv" | "ConvTranspose" | "Gemm"))
            .map(|n| (n.name.clone(), n.output[0].clone()))
            .collect();
        let mut r = Fp32Reference {
            model,
            hw,
            inputs,
            nodes,
            layouts: vec![],
            target: vec![],
            output: vec![],
            image_bytes: 0,
        };
        if r.nodes.is_empty() {
            return Ok(r);
        }
        let fp32 = reference::open_model(model, hw, &r.outputs()).map_err(|e| e.to_string())?;
        for x in inputs {
            let (first, rest) = fp32.run(x).map_err(|e| e.to_string())?;
            r.output.extend(first.data);
            let outs: Vec<Vec<f32>> = rest.into_iter().map(Activation::into_vec).collect();
            if r.layouts.is_empty() {
                r.layouts = r
                    .nodes
                    .iter()
                    .zip(&outs)
                    .map(|((name, _), o)| ChannelLayout::of(model, name, o.len()))
                    .collect();
                r.image_bytes = outs.iter().map(|o| o.len() * 4).sum();
            }
            let means = outs.iter().zip(&r.layouts).map(|(o, l)| l.means(o));
            r.target.push(means.collect());
        }
        Ok(r)
    }

    fn outputs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.1.clone()).collect()
    }
}

/// [`bias_correction`] with at most `max_batch` images per batch of the full correction (None:
/// as many as fit [`SEQUENTIAL_BATCH_BYTES`]).
fn correct_in_batches(
    reference: &Fp32Reference,
    plan: &QuantPlan,
    ranges: &Ranges,
    max_batch: Option<usize>,
) -> Result<BiasCorrection, String> {
    let Fp32Reference {
        model,
        hw,
        inputs,
        nodes,
        layouts,
        target,
        output: fp32_out,
        image_bytes,
    } = reference;
    let (model, hw, inputs) = (*model, *hw, *inputs);
    if nodes.is_empty() || inputs.is_empty() {
        return Ok(BiasCorrection {
            batch: 1,
            ..Default::default()
        });
    }
    let outputs = reference.outputs();
    let err = |e: anyhow::Error| format!("{e:#}");

    // The int8 graph the CPU engine runs, with no correction yet.
    let uncorrected = Ranges {
        bias_correction: BTreeMap::new(),
        ..ranges.clone()
    };
    let qdq = quant::build_qdq(model, plan, Some(&uncorrected)).map_err(|e| e.to_string())?;
    let qdq = Model {
        proto: qdq.proto,
        ..model.clone()
    };
    let engine = |batch: usize| -> Result<TractModel, String> {
        let lowered = lower_qdq(&qdq.with_fixed_input(batch, hw))?.proto;
        TractModel::new(&lowered, model.input_shape(batch, hw), &outputs).map_err(err)
    };
    let fits = (SEQUENTIAL_BATCH_BYTES / (*image_bytes).max(1)).clamp(1, inputs.len());
    let batches = inputs
        .len()
        .div_ceil(max_batch.unwrap_or(fits).clamp(1, fits));
    let mut per_batch = inputs.len().div_ceil(batches);
    let mut engines: HashMap<usize, TractModel> = HashMap::new();
    if per_batch > 1 {
        match engine(per_batch) {
            Ok(m) => {
                engines.insert(per_batch, m);
            }
            // The graph fixes its batch (a Reshape to [1, ...], say): one image at a time.
            Err(_) => per_batch = 1,
        }
    }
    for chunk in inputs.chunks(per_batch) {
        if !engines.contains_key(&chunk.len()) {
            engines.insert(chunk.len(), engine(chunk.len())?);
        }
    }

    // The full correction's pass over every batch: each batch first moves `shift` by its own
    // correction (the running mean), then each layer's output is shifted by it as it is
    // computed. Returns the graph's output for every image.
    let mut shift: Vec<Vec<f64>> = layouts.iter().map(|l| vec![0.0; l.channels]).collect();
    let pass = |shift: &mut Vec<Vec<f64>>| -> Result<Vec<f32>, String> {
        let mut out = vec![];
        for (j, chunk) in inputs.chunks(per_batch).enumerate() {
            let (first, batch) = (j * per_batch, chunk.len());
            let outs = engines[&batch]
                .run_adjusting(&chunk.concat(), |k, t| {
                    let l = &layouts[k];
                    let mut view = t.try_as_plain_ram_mut()?;
                    let v = view.as_slice_mut::<f32>()?;
                    // This batch's own correction, every layer above already corrected,
                    // folded into the running mean over batches.
                    let mut got = l.means(v);
                    for (c, g) in got.iter_mut().enumerate() {
                        *g += shift[k][c];
                    }
                    for (c, s) in shift[k].iter_mut().enumerate() {
                        let want = (first..first + batch).map(|i| target[i][k][c]).sum::<f64>()
                            / batch as f64;
                        *s += (want - got[c]) * batch as f64 / (first + batch) as f64;
                    }
                    for (i, x) in v.iter_mut().enumerate() {
                        *x += shift[k][l.channel(i)] as f32;
                    }
                    Ok(())
                })
                .map_err(err)?;
            out.extend(values_of(outs.first().ok_or("the model gave no output")?)?);
        }
        Ok(out)
    };
    let images = inputs.len();
    let sqnr = |q: &[f32]| crate::decide::per_sample_sqnr_db(fp32_out, q, images);
    // Passes that only read the output run the Q/DQ model with the shifts in its biases (the
    // model that is built) on the reference interpreter: ONNX Runtime where loaded, which
    // took DeepLabV3's correction from 26.4 to 16.1 s per method on a 2-core EPYC.
    let output_with = |shift: &[Vec<f64>]| -> Result<Vec<f32>, String> {
        let corrected = Ranges {
            bias_correction: shifts_by_node(nodes, shift),
            ..uncorrected.clone()
        };
        let q = quant::build_qdq(model, plan, Some(&corrected)).map_err(|e| e.to_string())?;
        let q = Model {
            proto: q.proto,
            ..model.clone()
        };
        let interp = reference::open_model(&q, hw, &[]).map_err(|e| e.to_string())?;
        // One image at a time, as the FP32 reference ran: many exported graphs fix their
        // batch inside (a Resize to [1, ...]).
        let mut out = Vec::with_capacity(fp32_out.len());
        for x in inputs {
            out.extend(interp.run(x).map_err(|e| e.to_string())?.0.data);
        }
        Ok(out)
    };
    let none = sqnr(&output_with(&shift)?);
    let learned = pass(&mut shift)?;
    // In one batch every layer was shifted by its final correction as it ran: that output is
    // the corrected one. Over several, the early batches ran with shifts since refined.
    // (Passes that add each layer's remaining gap, measured over all images with the upstream
    // shifts held, do not make it exact: every layer also answers its upstream layers' gaps,
    // which are corrected in the same step, so the error overshoots in depth. Two such passes
    // took DeepLabV3's full correction from 28.8 to 14.2 dB.)
    let full_sqnr = if per_batch >= images {
        sqnr(&learned)
    } else {
        sqnr(&output_with(&shift)?)
    };
    let full = shift;
    let per_layer = per_layer_shifts(model, hw, plan, &uncorrected, inputs)?;
    let shift: Vec<Vec<f64>> = nodes
        .iter()
        .zip(layouts.iter())
        .map(|((name, _), l)| {
            per_layer
                .get(name)
                .filter(|s| s.len() == l.channels)
                .cloned()
                .unwrap_or_else(|| vec![0.0; l.channels])
        })
        .collect();
    let per_layer_sqnr = sqnr(&output_with(&shift)?);
    let measured = [none, per_layer_sqnr, full_sqnr];
    let (kind, chosen, decision) = choose(&measured, full, shift);
    // What the log shows: each correction's mean over the images of their own SQNR (the
    // values the margin compares); None where every image matched FP32 exactly.
    let sqnr_db = measured.each_ref().map(|v| {
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        (mean < crate::decide::IDENTICAL_DB).then_some(mean)
    });
    let shifts = chosen
        .map(|c| shifts_by_node(nodes, &c))
        .unwrap_or_default();
    Ok(BiasCorrection {
        shifts,
        kind,
        batch: per_batch,
        sqnr_db,
        decision: Some(decision),
    })
}

/// Per node, its shift per output channel, as [`Ranges::bias_correction`] holds them.
fn shifts_by_node(nodes: &[(String, String)], shift: &[Vec<f64>]) -> BTreeMap<String, Vec<f32>> {
    nodes
        .iter()
        .zip(shift)
        .map(|((name, _), s)| (name.clone(), s.iter().map(|&v| v as f32).collect()))
        .collect()
}

/// Full correction (NNCF's default, and the best on DeepLabV3's mIoU), unless per-layer or no
/// correction brings the output closer to FP32 by more than the margin over the per-image
/// SQNR (`measured`: none, per-layer, full; dB per image); of two such, the larger gain.
/// Returns the kind, its shifts and the comparison that decided.
fn choose(
    measured: &[Vec<f64>; 3],
    full: Vec<Vec<f64>>,
    per_layer: Vec<Vec<f64>>,
) -> (CorrectionKind, Option<Vec<Vec<f64>>>, Decision) {
    use crate::decide::Paired;
    let [none, per_layer_db, full_db] = measured;
    let vs_full = |alt: &[f64]| Paired::of(full_db, alt);
    let (over_none, over_per_layer) = (vs_full(none), vs_full(per_layer_db));
    // The closer alternative is the one to beat the margin (none where they tie).
    let (kind, gain) = if over_per_layer.mean > over_none.mean {
        (CorrectionKind::PerLayer, over_per_layer)
    } else {
        (CorrectionKind::None, over_none)
    };
    let decision = Decision {
        challenger: kind,
        gain,
    };
    if !gain.clearly_better(CHOICE_FLOOR_DB) {
        return (CorrectionKind::Full, Some(full), decision);
    }
    match kind {
        CorrectionKind::PerLayer => (kind, Some(per_layer), decision),
        _ => (CorrectionKind::None, None, decision),
    }
}

/// How full correction's closest alternative compared with it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub challenger: CorrectionKind,
    /// The challenger's SQNR minus full's, per image.
    pub gain: crate::decide::Paired,
}

impl Decision {
    /// "per-layer +1.2 dB over full, within the margin of 1.5 dB: full kept (the default)".
    pub fn describe(&self, kept: CorrectionKind) -> String {
        let margin = self.gain.margin(CHOICE_FLOOR_DB);
        let verdict = if kept == CorrectionKind::Full {
            "full kept (the default)".to_string()
        } else {
            format!("{} kept", kept.name())
        };
        format!(
            "{} {:+.2} dB over full (±{:.2} dB standard error over the images); margin {:.2} dB \
             (2 standard errors, at least {CHOICE_FLOOR_DB} dB): {verdict}",
            self.challenger.name(),
            self.gain.mean,
            self.gain.stderr,
            margin
        )
    }
}

#[cfg(test)]
mod tests;
