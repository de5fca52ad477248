//! The steps of the INT8 preparation, each run on the calibration images through the reference
//! interpreter: cross-layer equalization, activation centering and GPTQ weight rounding, each
//! exact in float or said in a note. A step that fails returns the model it was given.

use std::collections::HashMap;
use std::time::Instant;

use super::{Progress, Settings, Source, center, cle, gptq};
use crate::backend::reference;
use crate::data;
use crate::model::Model;
use crate::quant;

/// Input moments held at once; layers past it wait for another FP32 pass.
const GPTQ_PASS_BYTES: usize = 512 << 20;

/// The cross-layer-equalized model when the settings' `cle` applies, else a copy of the
/// original, with what was done and the line for the report's notes. A failed transform falls
/// back to the original model and says so.
pub(super) fn equalize(src: &Source, s: &Settings) -> (Model, Option<cle::CleSummary>, String) {
    use cle::{CleSetting, ScaleRule};
    let wants_ranges = s.cle_scales == ScaleRule::Activations
        && match s.cle {
            CleSetting::Off => false,
            CleSetting::On => true,
            CleSetting::Auto => cle::decide(src.model).0,
        };
    // Per-channel max |x| of the tensors between CLE's conv pairs, for its activation rule.
    let (ranges, ranges_failed) = match wants_ranges {
        true => match channel_maxima(src, &cle::between_tensors(src.model, s.cle_clip)) {
            Ok(r) => (r, None),
            Err(e) => (HashMap::new(), Some(e)),
        },
        false => (HashMap::new(), None),
    };
    match cle::apply(src.model, s.cle, s.cle_clip, s.cle_scales, &ranges) {
        Ok((m, summary)) => {
            let note = match ranges_failed {
                Some(e) => format!("{}; activation ranges unavailable ({e})", summary.note()),
                None => summary.note(),
            };
            (m, Some(summary), note)
        }
        Err(e) => (
            src.model.clone(),
            None,
            format!("{e:#}; the INT8 engines use the model without equalization"),
        ),
    }
}

/// The model after activation centering (per the settings' `center`), with what was done and
/// the line for the report's notes. The shifts come from each tensor's largest value on the
/// calibration images; a failure keeps the model as it came and says so.
pub(super) fn center(src: &Source, s: &Settings) -> (Model, Option<center::CenterSummary>, String) {
    use center::CenterSetting;
    let maxima = match s.center {
        CenterSetting::Off => Ok(HashMap::new()),
        CenterSetting::On => {
            let tensors: Vec<(String, usize)> = center::tensors(src.model)
                .into_iter()
                .map(|t| (t, 1))
                .collect();
            channel_maxima(src, &tensors).map(|m| {
                m.into_iter()
                    .map(|(t, v)| (t, v.first().copied().unwrap_or(0.0)))
                    .collect()
            })
        }
    };
    let applied = maxima
        .map_err(|e| format!("activation centering: calibration pass failed ({e})"))
        .and_then(|m| center::apply(src.model, s.center, &m).map_err(|e| format!("{e:#}")));
    match applied {
        Ok((m, summary)) => {
            let note = summary.note();
            (m, Some(summary), note)
        }
        Err(e) => (
            src.model.clone(),
            None,
            format!("{e}; the INT8 engines use the model without centering"),
        ),
    }
}

/// GPTQ weight rounding: FP32 passes over the first `correction_images` calibration images
/// collect each layer's input moments, as many layers per pass as fit in 512 MiB, then each
/// layer is rounded. Returns the rounded model, the float weights it replaced and the note. On
/// failure the model is returned as it was (nothing replaced), and the note says why.
pub(super) fn round_weights(
    src: &Source,
    s: &Settings,
    sink: &(impl Progress + ?Sized),
) -> (Model, gptq::FloatWeights, String) {
    let t = Instant::now();
    match gptq_model(src, s, sink) {
        Ok(Rounded {
            model,
            originals,
            rounded,
            kept,
        }) => {
            let mut note = format!(
                "GPTQ weight rounding: {rounded} layers rounded in {:.0} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            if !kept.is_empty() {
                let shown: Vec<String> = kept
                    .iter()
                    .take(3)
                    .map(|(n, why)| format!("{n}: {why}"))
                    .collect();
                note.push_str(&format!(
                    "; {} kept round-to-nearest ({}{})",
                    kept.len(),
                    shown.join("; "),
                    if kept.len() > 3 { "; …" } else { "" }
                ));
            }
            (model, originals, note)
        }
        Err(e) => (
            src.model.clone(),
            gptq::FloatWeights::default(),
            format!("GPTQ weight rounding failed ({e}); the INT8 engines round to nearest"),
        ),
    }
}

/// What GPTQ made of a model.
struct Rounded {
    model: Model,
    /// The float weights it replaced, by node.
    originals: gptq::FloatWeights,
    /// Layers rounded.
    rounded: usize,
    /// Layers kept round-to-nearest, and why.
    kept: Vec<(String, String)>,
}

/// The rounded model (see [`Rounded`]).
fn gptq_model(
    src: &Source,
    s: &Settings,
    sink: &(impl Progress + ?Sized),
) -> Result<Rounded, String> {
    let plan = quant::plan(src.model, s.exclude);
    let shapes = crate::model::infer_shapes(src.model, src.hw).map_err(|e| format!("{e:#}"))?;
    let (layers, mut kept) = gptq::layers(src.model, &plan, &shapes);
    let inputs = src
        .inputs(s.correction_images)
        .map_err(|e| format!("{e:#}"))?;
    let graph_input = src
        .model
        .graph()
        .input
        .first()
        .map(|i| i.name.clone())
        .unwrap_or_default();
    let mut proto = src.model.proto.clone();
    let mut originals = gptq::FloatWeights::default();
    let mut rounded = 0;
    let mut rest = &layers[..];
    while !rest.is_empty() {
        // As many layers as fit in the budget (at least one).
        let mut bytes = 0;
        let take = rest
            .iter()
            .take_while(|l| {
                bytes += l.h_bytes();
                bytes <= GPTQ_PASS_BYTES
            })
            .count()
            .max(1);
        let (pass, next) = rest.split_at(take);
        rest = next;
        let mut names: Vec<String> = pass
            .iter()
            .map(|l| l.input.clone())
            .filter(|n| *n != graph_input)
            .collect();
        names.sort();
        names.dedup();
        let probe = reference::open_model(src.model, src.hw, &names).map_err(|e| e.to_string())?;
        let mut moments: Vec<gptq::Moments> = pass.iter().map(gptq::Moments::new).collect();
        for (i, x) in inputs.iter().enumerate() {
            sink.progress("GPTQ: input moments", i, inputs.len());
            let (_, acts) = probe.run(x).map_err(|e| e.to_string())?;
            for (l, m) in pass.iter().zip(&mut moments) {
                let act = match names.binary_search(&l.input) {
                    Ok(k) => acts.get(k).map(|a| a.as_ref()).unwrap_or(&[]),
                    Err(_) => x.as_slice(),
                };
                m.add(l, act, inputs.len());
            }
        }
        for (i, (l, m)) in pass.iter().zip(moments).enumerate() {
            sink.progress("GPTQ: rounding", i, pass.len());
            match gptq::round_layer(&mut proto, l, m, &mut originals) {
                Ok(()) => rounded += 1,
                Err(e) => kept.push((l.node.clone(), e)),
            }
        }
    }
    Ok(Rounded {
        model: Model {
            proto,
            ..src.model.clone()
        },
        originals,
        rounded,
        kept,
    })
}

/// Per channel, max |x| over the calibration images (an FP32 pass of `src`'s model) of each
/// (NCHW tensor, channel count); one channel gives the tensor's max |x|.
fn channel_maxima(
    src: &Source,
    between: &[(String, usize)],
) -> Result<HashMap<String, Vec<f32>>, String> {
    if between.is_empty() || src.images.is_empty() {
        return Ok(HashMap::new());
    }
    let names: Vec<String> = between.iter().map(|b| b.0.clone()).collect();
    let probe = reference::open_model(src.model, src.hw, &names).map_err(|e| e.to_string())?;
    let mut ranges: HashMap<String, Vec<f32>> = HashMap::new();
    for path in src.images {
        let img = data::open_rgb(path).map_err(|e| e.to_string())?;
        let input = src.input_of(&img);
        let (_, acts) = probe
            .run(&input)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for ((name, c), a) in between.iter().zip(&acts) {
            cle::channel_max(a.as_ref(), *c, ranges.entry(name.clone()).or_default());
        }
    }
    Ok(ranges)
}
