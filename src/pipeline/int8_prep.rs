//! The model the INT8 engines are built from: cross-layer equalization, activation
//! centering and GPTQ weight rounding, each exact in float or said in a note.

use super::*;

/// Input moments held at once; layers past it wait for another FP32 pass.
pub(super) const GPTQ_PASS_BYTES: usize = 512 << 20;

/// GPTQ weight rounding of the model the INT8 engines are built from (the FP32 rows keep the
/// original): FP32 passes over up to 32 calibration images collect each layer's input moments,
/// as many layers per pass as fit in 512 MiB, then each layer is rounded. On failure the
/// model is returned as it was, and the note says why.
pub fn round_weights_for_int8(
    p: &Prepared,
    exp: &Experiment,
    sink: &dyn Sink,
) -> (Prepared, String) {
    let t = Instant::now();
    match gptq_model(p, exp, sink) {
        Ok((model, rounded, kept)) => {
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
            (p.with_model(model), note)
        }
        Err(e) => (
            p.with_model(p.model.clone()),
            format!("GPTQ weight rounding failed ({e}); the INT8 engines round to nearest"),
        ),
    }
}

/// The rounded model, the number of layers rounded and those kept round-to-nearest (why).
pub(super) fn gptq_model(
    p: &Prepared,
    exp: &Experiment,
    sink: &dyn Sink,
) -> Result<(Model, usize, Vec<(String, String)>), String> {
    use quant::gptq;
    let plan = quant::plan(&p.model, &exp.exclude);
    let shapes = crate::model::infer_shapes(&p.model, p.hw).map_err(|e| format!("{e:#}"))?;
    let (layers, mut kept) = gptq::layers(&p.model, &plan, &shapes);
    let inputs = probe_inputs(p, exp.correction_images).map_err(|e| format!("{e:#}"))?;
    let graph_input = p
        .model
        .graph()
        .input
        .first()
        .map(|i| i.name.clone())
        .unwrap_or_default();
    let mut proto = p.model.proto.clone();
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
        let probe =
            backend::reference::open_model(&p.model, p.hw, &names).map_err(|e| e.to_string())?;
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
            match gptq::round_layer(&mut proto, l, m) {
                Ok(()) => rounded += 1,
                Err(e) => kept.push((l.node.clone(), e)),
            }
        }
    }
    Ok((
        Model {
            proto,
            ..p.model.clone()
        },
        rounded,
        kept,
    ))
}

/// Per-channel max |x| over the calibration images of the tensors between CLE's conv pairs
/// (an FP32 pass of the original model), for CLE's activation scale rule.
pub(super) fn cle_activation_ranges(
    p: &Prepared,
    exp: &Experiment,
) -> Result<HashMap<String, Vec<f32>>, String> {
    channel_maxima(p, &quant::cle::between_tensors(&p.model, exp.cle_clip))
}

/// Per channel, max |x| over the calibration images (an FP32 pass of `p`'s model) of each
/// (NCHW tensor, channel count); one channel gives the tensor's max |x|.
pub(super) fn channel_maxima(
    p: &Prepared,
    between: &[(String, usize)],
) -> Result<HashMap<String, Vec<f32>>, String> {
    if between.is_empty() || p.calib_images.is_empty() {
        return Ok(HashMap::new());
    }
    let names: Vec<String> = between.iter().map(|b| b.0.clone()).collect();
    let probe =
        backend::reference::open_model(&p.model, p.hw, &names).map_err(|e| e.to_string())?;
    let mut ranges: HashMap<String, Vec<f32>> = HashMap::new();
    for path in &p.calib_images {
        let img = data::open_rgb(path).map_err(|e| e.to_string())?;
        let input = p.input_of(&img);
        let (_, acts) = probe
            .run(&input)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        for ((name, c), a) in between.iter().zip(&acts) {
            quant::cle::channel_max(a.as_ref(), *c, ranges.entry(name.clone()).or_default());
        }
    }
    Ok(ranges)
}

/// The prepared model the INT8 path (calibration, Q/DQ, bias correction, exports) uses: the
/// cross-layer-equalized one when the experiment's `cle` applies, else a copy of the original.
/// Also returns the line for the report's notes. A failed transform falls back to the original
/// model and says so, rather than losing the run.
pub fn equalize_for_int8(
    p: &Prepared,
    exp: &Experiment,
) -> ((Prepared, Option<quant::cle::CleSummary>), String) {
    use quant::cle::{CleSetting, ScaleRule};
    let wants_ranges = exp.cle_scales == ScaleRule::Activations
        && match exp.cle {
            CleSetting::Off => false,
            CleSetting::On => true,
            CleSetting::Auto => quant::cle::decide(&p.model).0,
        };
    let (ranges, ranges_failed) = match wants_ranges {
        true => match cle_activation_ranges(p, exp) {
            Ok(r) => (r, None),
            Err(e) => (HashMap::new(), Some(e)),
        },
        false => (HashMap::new(), None),
    };
    let applied = quant::cle::apply(&p.model, exp.cle, exp.cle_clip, exp.cle_scales, &ranges);
    let (model, summary, note) = match applied {
        Ok((m, s)) => {
            let note = match ranges_failed {
                Some(e) => format!("{}; activation ranges unavailable ({e})", s.note()),
                None => s.note(),
            };
            (m, Some(s), note)
        }
        Err(e) => (
            p.model.clone(),
            None,
            format!("{e:#}; the INT8 engines use the model without equalization"),
        ),
    };
    ((p.with_model(model), summary), note)
}

/// The INT8 path's model after activation centering (per the experiment's `center`), with
/// what was done and the line for the report's notes. The shifts come from each tensor's
/// largest value on the calibration images; a failure keeps the model as it came and says so.
pub fn center_for_int8(
    p: &Prepared,
    exp: &Experiment,
) -> ((Prepared, Option<quant::center::CenterSummary>), String) {
    use quant::center::{self, CenterSetting};
    let maxima = match exp.center {
        CenterSetting::Off => Ok(HashMap::new()),
        CenterSetting::On => {
            let tensors: Vec<(String, usize)> = center::tensors(&p.model)
                .into_iter()
                .map(|t| (t, 1))
                .collect();
            channel_maxima(p, &tensors).map(|m| {
                m.into_iter()
                    .map(|(t, v)| (t, v.first().copied().unwrap_or(0.0)))
                    .collect()
            })
        }
    };
    let applied = maxima
        .map_err(|e| format!("activation centering: calibration pass failed ({e})"))
        .and_then(|m| center::apply(&p.model, exp.center, &m).map_err(|e| format!("{e:#}")));
    match applied {
        Ok((m, s)) => {
            let note = s.note();
            ((p.with_model(m), Some(s)), note)
        }
        Err(e) => (
            (p.with_model(p.model.clone()), None),
            format!("{e}; the INT8 engines use the model without centering"),
        ),
    }
}
