//! How finely int8 and FP8 E4M3 round each quantized layer: the rounding SQNR of its weights
//! (per output channel, as the engines quantize them) and of its input activation (max
//! ranges, from the calibration histograms), in both formats. The FP8 row's report note names
//! the layers where FP8 rounds furthest below int8: E4M3 keeps 3 mantissa bits, a relative step
//! of 1/16 to 1/8 wherever a value sits, where int8's uniform grid steps amax / 127, so on the
//! bounded, evenly spread values of CNN weights and ReLU6 activations FP8 rounds about 10 dB
//! coarser on every layer (DeepLabV3-MobileNetV2: weights median 32.5 dB against 44.3).

use serde::{Deserialize, Serialize};

use super::{QuantPlan, fp8};
use crate::calib::{Histogram, Stats};
use crate::model::{Model, proto};

/// One quantized layer's rounding SQNR (dB) in int8 and in FP8 E4M3; None where it was not
/// measured (no weight initializer, no histogram) or the rounding is exact.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerRounding {
    pub node: String,
    pub weights_int8_db: Option<f64>,
    pub weights_fp8_db: Option<f64>,
    pub input_int8_db: Option<f64>,
    pub input_fp8_db: Option<f64>,
}

impl LayerRounding {
    /// How far FP8 rounds below int8 on this layer: the larger of the weights' and the
    /// input's gaps (dB), where both formats were measured.
    pub fn gap_db(&self) -> Option<f64> {
        let gap = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        match (
            gap(self.weights_int8_db, self.weights_fp8_db),
            gap(self.input_int8_db, self.input_fp8_db),
        ) {
            (Some(w), Some(i)) => Some(w.max(i)),
            (w, i) => w.or(i),
        }
    }
}

/// Every quantized layer of `plan` in `model`, in graph order, with the weights' rounding
/// computed exactly and the input's estimated from `stats`' histogram (each bin's centre
/// stands for its values; the histograms are fine next to int8's steps, and FP8's finer steps
/// near zero carry little of the signal).
pub fn per_layer(model: &Model, plan: &QuantPlan, stats: &Stats) -> Vec<LayerRounding> {
    let g = model.graph();
    let mut out = vec![];
    for n in g
        .node
        .iter()
        .filter(|n| plan.quantized_nodes.contains(&n.name))
    {
        let weight = n.input.get(1).and_then(|w| {
            let axis = plan.weights.iter().find(|q| &q.tensor == w)?.axis;
            Some((model.initializer(w)?, axis))
        });
        let (weights_int8_db, weights_fp8_db) = match &weight {
            Some((w, axis)) => (int8_weights_db(w, *axis), fp8_weights_db(w, *axis)),
            None => (None, None),
        };
        let hist = n.input.first().and_then(|x| stats.tensors.get(x));
        out.push(LayerRounding {
            node: n.name.clone(),
            weights_int8_db,
            weights_fp8_db,
            input_int8_db: hist.and_then(|h| {
                let scale = (h.amax / 127.0) as f64;
                hist_sqnr_db(h, |x| (x / scale).round_ties_even().min(127.0) * scale)
            }),
            input_fp8_db: hist.and_then(|h| {
                let scale = fp8::act_scale(h.amax) as f64;
                hist_sqnr_db(h, |x| fp8::round_e4m3((x / scale) as f32) as f64 * scale)
            }),
        });
    }
    out
}

/// The report's note for an FP8 row: medians over the layers in both formats and the layers
/// where FP8 falls furthest below int8. None when nothing was measured.
pub fn describe(layers: &[LayerRounding]) -> Option<String> {
    let median = |f: fn(&LayerRounding) -> Option<f64>| {
        let mut v: Vec<f64> = layers.iter().filter_map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let (wi, wf) = (median(|l| l.weights_int8_db), median(|l| l.weights_fp8_db));
    let (ii, if_) = (median(|l| l.input_int8_db), median(|l| l.input_fp8_db));
    if wi.is_none() && ii.is_none() {
        return None;
    }
    let pair = |f: Option<f64>, i: Option<f64>| match (f, i) {
        (Some(f), Some(i)) => format!("{f:.1} vs int8 {i:.1} dB"),
        _ => "–".to_string(),
    };
    let mut worst: Vec<&LayerRounding> = layers.iter().filter(|l| l.gap_db().is_some()).collect();
    worst.sort_by(|a, b| {
        b.gap_db()
            .unwrap_or(0.0)
            .total_cmp(&a.gap_db().unwrap_or(0.0))
    });
    let worst: Vec<String> = worst
        .iter()
        .take(3)
        .map(|l| {
            format!(
                "{} (weights {}, input {})",
                l.node,
                pair(l.weights_fp8_db, l.weights_int8_db),
                pair(l.input_fp8_db, l.input_int8_db)
            )
        })
        .collect();
    Some(format!(
        "FP8 E4M3 keeps 3 mantissa bits (a step of 1/16 to 1/8 of each value; int8 steps \
         amax / 127): rounding SQNR per layer, median of {}: weights {}, inputs {} (max ranges; \
         inputs from the calibration histograms). Furthest below int8: {}. Every layer: the \
         JSON's `fp8_rounding`",
        layers.len(),
        pair(wf, wi),
        pair(if_, ii),
        worst.join(", ")
    ))
}

/// Per-channel int8 weights, as the INT8 engines quantize them.
fn int8_weights_db(w: &proto::F32Tensor, axis: usize) -> Option<f64> {
    let (q, s) = super::quantize_weight(w, axis);
    weights_db(w, axis, q.iter().map(|&v| v as f32).collect(), &s)
}

/// Per-channel FP8 E4M3 weights, as the FP8 engines quantize them.
fn fp8_weights_db(w: &proto::F32Tensor, axis: usize) -> Option<f64> {
    let (codes, s) = fp8::quantize_weight(w, axis);
    weights_db(
        w,
        axis,
        codes.iter().map(|&c| fp8::e4m3_to_f32(c)).collect(),
        &s,
    )
}

/// SQNR (dB) of `w` against its quantized `values` times the per-channel `scales`; None where
/// exact.
fn weights_db(w: &proto::F32Tensor, axis: usize, values: Vec<f32>, scales: &[f32]) -> Option<f64> {
    let rounded = super::dequantize_per_axis(&values, &w.dims, axis, scales)?;
    let mut s = crate::eval::Sqnr::default();
    s.add(&w.data, &rounded);
    s.db()
}

/// SQNR (dB) of the values `h` counted, each bin's values taken at its centre, rounded by
/// `round`; None where empty or exact.
fn hist_sqnr_db(h: &Histogram, round: impl Fn(f64) -> f64) -> Option<f64> {
    if h.amax <= 0.0 || h.bin_width <= 0.0 {
        return None;
    }
    let mut s = crate::eval::Sqnr::default();
    for (i, &c) in h.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
        let x = ((i as f64 + 0.5) * h.bin_width as f64).min(h.amax as f64);
        let e = x - round(x);
        s.signal += c as f64 * x * x;
        s.noise += c as f64 * e * e;
    }
    s.db()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evenly spread values (a ReLU6 output, weights of one channel): int8's grid of 127 steps
    /// rounds them near 48 dB (uniform error over a uniform signal: 10 log10(4 × 127²)),
    /// E4M3 near 31 dB, and a histogram estimate agrees with the exact values.
    #[test]
    fn fp8_rounds_evenly_spread_values_coarser_than_int8() {
        let n = 100_000;
        let values: Vec<f32> = (0..n).map(|i| 6.0 * (i as f32 + 0.5) / n as f32).collect();
        let w = proto::F32Tensor {
            dims: vec![1, n],
            data: values.clone(),
        };
        let (i8db, f8db) = (
            int8_weights_db(&w, 0).expect("int8"),
            fp8_weights_db(&w, 0).expect("fp8"),
        );
        assert!((i8db - 48.1).abs() < 0.5, "int8 {i8db}");
        assert!((29.0..34.0).contains(&f8db), "fp8 {f8db}");
        let mut h = Histogram::default();
        h.add(&values);
        let hi = hist_sqnr_db(&h, |x| {
            let s = (h.amax / 127.0) as f64;
            (x / s).round_ties_even() * s
        })
        .expect("int8 from the histogram");
        let hf = hist_sqnr_db(&h, |x| {
            let s = fp8::act_scale(h.amax) as f64;
            fp8::round_e4m3((x / s) as f32) as f64 * s
        })
        .expect("fp8 from the histogram");
        assert!(
            (hi - i8db).abs() < 1.5,
            "int8: histogram {hi} vs exact {i8db}"
        );
        assert!(
            (hf - f8db).abs() < 1.5,
            "fp8: histogram {hf} vs exact {f8db}"
        );
    }

    #[test]
    fn the_note_names_the_layers_fp8_rounds_furthest_below_int8() {
        let l = |node: &str, w8: f64, wf: f64| LayerRounding {
            node: node.into(),
            weights_int8_db: Some(w8),
            weights_fp8_db: Some(wf),
            input_int8_db: Some(45.0),
            input_fp8_db: Some(31.0),
        };
        let layers = [l("a", 44.0, 32.0), l("b", 50.0, 31.0), l("c", 40.0, 38.0)];
        assert_eq!(layers[1].gap_db(), Some(19.0));
        let note = describe(&layers).expect("a note");
        assert!(note.contains("weights 32.0 vs int8 44.0 dB"), "{note}");
        assert!(
            note.contains("Furthest below int8: b (weights 31.0 vs int8 50.0 dB"),
            "{note}"
        );
        assert!(describe(&[]).is_none());
    }
}
