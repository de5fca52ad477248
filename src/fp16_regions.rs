//! Precision per region: the runs of an INT8 engine's layers that took longer in its run than
//! the same layers in the FP16 engine's, so that the builder can time an engine with those
//! layers in FP16 (float at the region's edges, no Q/DQ inside) and keep the faster engine.
//! On an H200, EfficientNet-B0's INT8 engine at batch 32 ran its 24- to 80-channel blocks'
//! int8 kernels slower than cuDNN's FP16 convs, and the whole engine no faster than FP16.
//!
//! Pure arithmetic on two engines' per-layer times in the run
//! ([`crate::backend::EngineInfo::layer_times_in_run`]): the pipeline builds and times; this
//! decides which layers and says why.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::backend::LayerTime;

/// A region must save at least this much (the in-run increments are noisy at about a
/// microsecond) ...
const MIN_GAIN_MS: f64 = 0.002;
/// ... and this share of its INT8 time.
const MIN_GAIN_FRACTION: f64 = 0.05;
/// An all-INT8 engine that runs in less than this share of FP16's time is kept without trying
/// regions in FP16 ([`RegionChoice::worth_trying`]).
const TRY_BELOW_FP16: f64 = 0.9;

/// Consecutive quantized layers that, together, took longer in the INT8 engine's run than in
/// the FP16 engine's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// The quantized layers (Conv/Gemm/MatMul nodes), in plan order.
    pub layers: Vec<String>,
    /// The other nodes the INT8 engine fused into those layers' steps (a residual Add, an
    /// activation). They go float with their layer: a conv + residual add + ReLU then runs
    /// fused in FP16 as the FP16 engine runs it. Left quantized, the Add's Q/DQ keeps its
    /// shortcut in int8, which splits it from the conv and adds a requantize step at every
    /// block; on an H200 that cost RegNetY-400MF's trial engine 31 µs of its 44 µs gap to FP16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused: Vec<String>,
    /// Milliseconds the region's steps took in each engine's run: each layer's step and the
    /// steps after it up to the next quantized layer's (its pools, multiplies and casts).
    pub int8_ms: f64,
    pub fp16_ms: f64,
}

impl Region {
    /// The nodes an engine with this region in FP16 keeps in float: its layers and what
    /// was fused into them.
    pub fn nodes(&self) -> impl Iterator<Item = String> + '_ {
        self.layers.iter().chain(&self.fused).cloned()
    }

    /// How much slower INT8 was: "1.3x".
    pub fn slowdown(&self) -> f64 {
        self.int8_ms / self.fp16_ms.max(1e-9)
    }
}

/// What the builder chose for one engine (one batch size).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionChoice {
    pub batch: usize,
    /// The regions that were slower in INT8 (empty: none was, and no other engine was built).
    pub regions: Vec<Region>,
    /// Milliseconds a run of the all-INT8 engine took, of the FP16 engine, and of the engine
    /// with the regions in FP16 (when one was built), from their in-run profiles.
    pub int8_ms: f64,
    pub fp16_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_ms: Option<f64>,
    /// The engine the row ran has the regions in FP16.
    pub kept_mixed: bool,
}

impl RegionChoice {
    /// Whether an engine with the regions in FP16 is worth building: some region was slower,
    /// and the all-INT8 engine is not clearly faster than FP16 already. On an H200 the trial
    /// engines of ResNet-50 and MobileNetV2 (INT8 at 0.69-0.76x FP16) were 2-17 % slower than
    /// all-INT8 at batch 1 and 32, and cost ResNet-50's row 13 s of build; those of
    /// EfficientNet-B0 (INT8 at 1.02-1.04x FP16) were 3 % faster.
    pub fn worth_trying(&self) -> bool {
        !self.regions.is_empty() && self.int8_ms >= TRY_BELOW_FP16 * self.fp16_ms
    }

    /// One line for the log and the report's notes.
    pub fn describe(&self, label: &str) -> String {
        let layers: usize = self.regions.iter().map(|r| r.layers.len()).sum();
        match (self.kept_mixed, self.mixed_ms) {
            _ if self.regions.is_empty() => format!(
                "{label} batch {}: no layer ran slower in INT8 than in FP16",
                self.batch
            ),
            _ if !self.worth_trying() => format!(
                "{label} batch {}: {} region(s) were slower in INT8 ({}), not tried: the INT8 \
                 engine already runs in {:.2}x FP16's time",
                self.batch,
                self.regions.len(),
                self.slowdowns(),
                self.int8_ms / self.fp16_ms.max(1e-9)
            ),
            (true, Some(m)) => format!(
                "{label} batch {}: {} region(s), {layers} layer(s), ran in FP16: INT8 was \
                 slower for them ({}); the engine takes {m:.3} ms instead of {:.3}",
                self.batch,
                self.regions.len(),
                self.slowdowns(),
                self.int8_ms
            ),
            (_, mixed) => format!(
                "{label} batch {}: {} region(s), {layers} layer(s), were slower in INT8 ({}), \
                 but the engine with them in FP16 {}: all INT8 kept",
                self.batch,
                self.regions.len(),
                self.slowdowns(),
                mixed.map_or("has no profile in the run".into(), |m| format!(
                    "took {m:.3} ms against {:.3}",
                    self.int8_ms
                ))
            ),
        }
    }

    fn slowdowns(&self) -> String {
        let mut s: Vec<String> = self
            .regions
            .iter()
            .take(4)
            .map(|r| format!("{:.2}x", r.slowdown()))
            .collect();
        if self.regions.len() > 4 {
            s.push("...".into());
        }
        s.join(", ")
    }

    /// Marks the kept engine's Layers rows of the regions' layers: "fp16 region: INT8 was
    /// 1.31x slower for this region" (the Layers tab sums by the words before the colon).
    pub fn annotate(&self, times: &mut [LayerTime]) {
        if !self.kept_mixed {
            return;
        }
        let of: HashMap<&str, &Region> = self
            .regions
            .iter()
            .flat_map(|r| r.layers.iter().map(move |l| (l.as_str(), r)))
            .collect();
        for t in times {
            if let Some(r) = of.get(step_layer(&t.layer)) {
                t.precision = Some(format!(
                    "fp16 region: INT8 was {:.2}x slower for this region",
                    r.slowdown()
                ));
            }
        }
    }
}

/// The layer a step belongs to: a conv step with fused ops is named "conv+relu+...".
fn step_layer(step: &str) -> &str {
    step.split('+').next().unwrap_or(step)
}

/// The nodes fused into each quantized layer's step ("conv+add+relu": add and relu).
fn fused_into<'a>(
    times: &'a [LayerTime],
    quantized: &HashSet<&str>,
) -> HashMap<&'a str, Vec<String>> {
    times
        .iter()
        .filter(|t| quantized.contains(step_layer(&t.layer)))
        .map(|t| {
            let mut parts = t.layer.split('+');
            let layer = parts.next().unwrap_or(&t.layer);
            (layer, parts.map(str::to_string).collect())
        })
        .collect()
}

/// Milliseconds per quantized layer, in plan order: its step's time and that of the steps
/// after it up to the next quantized layer's. Steps before the first are left out.
pub fn per_layer(times: &[LayerTime], quantized: &HashSet<&str>) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = vec![];
    for t in times {
        let layer = step_layer(&t.layer);
        if quantized.contains(layer) {
            out.push((layer.to_string(), t.time_ms));
        } else if let Some(last) = out.last_mut() {
            last.1 += t.time_ms;
        }
    }
    out
}

/// The regions of the INT8 engine (`int8`, its in-run layer times) that took longer than the
/// FP16 engine's same layers (`fp16`). A region grows over consecutive layers while INT8's
/// excess over them stays positive and ends where it was largest, so that a block whose
/// layers mostly lose to FP16 goes whole (one FP16 edge in, one out) rather than in pieces;
/// it is kept when it saves more than the noise. A layer the FP16 engine has no step for
/// ends a region.
pub fn slower_regions(int8: &[LayerTime], fp16: &[LayerTime], quantized: &[String]) -> Vec<Region> {
    let q: HashSet<&str> = quantized.iter().map(String::as_str).collect();
    let fused = fused_into(int8, &q);
    let a = per_layer(int8, &q);
    let b: HashMap<String, f64> = per_layer(fp16, &q).into_iter().collect();
    let pairs: Vec<(&str, f64, Option<f64>)> = a
        .iter()
        .map(|(l, t8)| (l.as_str(), *t8, b.get(l).copied()))
        .collect();
    let mut regions = vec![];
    let mut i = 0;
    while i < pairs.len() {
        let starts = matches!(pairs[i], (_, t8, Some(t16)) if t8 > t16);
        if !starts {
            i += 1;
            continue;
        }
        let (mut excess, mut best, mut end) = (0.0, 0.0, i);
        for (j, &(_, t8, t16)) in pairs.iter().enumerate().skip(i) {
            let Some(t16) = t16 else { break };
            excess += t8 - t16;
            if excess > best {
                (best, end) = (excess, j);
            }
            if excess < 0.0 {
                break;
            }
        }
        let span = &pairs[i..=end];
        let int8_ms: f64 = span.iter().map(|p| p.1).sum();
        let fp16_ms: f64 = span.iter().filter_map(|p| p.2).sum();
        if best > MIN_GAIN_MS.max(MIN_GAIN_FRACTION * int8_ms) {
            regions.push(Region {
                layers: span.iter().map(|p| p.0.to_string()).collect(),
                fused: span
                    .iter()
                    .flat_map(|p| fused.get(p.0).cloned().unwrap_or_default())
                    .collect(),
                int8_ms,
                fp16_ms,
            });
        }
        i = end + 1;
    }
    regions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(layer: &str, ms: f64) -> LayerTime {
        LayerTime {
            layer: layer.into(),
            kernel: String::new(),
            time_ms: ms,
            precision: None,
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn steps_after_a_layer_count_as_its_own_and_fused_names_match() {
        let times = [
            t("stem.space_to_depth", 0.5),
            t("a+relu", 1.0),
            t("pool", 0.25),
            t("b", 2.0),
            t("mul", 0.5),
        ];
        let q: HashSet<&str> = ["a", "b"].into();
        assert_eq!(
            per_layer(&times, &q),
            vec![("a".to_string(), 1.25), ("b".to_string(), 2.5)]
        );
    }

    #[test]
    fn a_block_that_mostly_loses_goes_whole_and_a_winning_layer_ends_it() {
        // a, b, c lose to FP16 (c's small win is inside the block: b and d outweigh it); e wins
        // by more than the block's remaining excess, so the region ends at d.
        let q = names(&["a", "b", "c", "d", "e", "f"]);
        let int8 = [
            t("a", 0.010),
            t("b", 0.020),
            t("c", 0.009),
            t("d+add+relu", 0.012),
            t("e", 0.005),
            t("f+add2", 0.030),
        ];
        let fp16 = [
            t("a", 0.008),
            t("b", 0.015),
            t("c", 0.010),
            t("d", 0.009),
            t("e", 0.020),
            t("f", 0.031),
        ];
        let r = slower_regions(&int8, &fp16, &q);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].layers, names(&["a", "b", "c", "d"]));
        // d's residual add and ReLU go float with it (f's add is outside the region).
        assert_eq!(r[0].fused, names(&["add", "relu"]));
        assert!((r[0].int8_ms - 0.051).abs() < 1e-12);
        assert!((r[0].fp16_ms - 0.042).abs() < 1e-12);
    }

    #[test]
    fn noise_sized_losses_and_layers_fp16_lacks_make_no_region() {
        let q = names(&["a", "b", "c"]);
        // a: 1 us slower (below the noise floor); b: 30 us slower but FP16 has no step for it.
        let int8 = [t("a", 0.011), t("b", 0.040), t("c", 0.010)];
        let fp16 = [t("a", 0.010), t("c", 0.012)];
        assert!(slower_regions(&int8, &fp16, &q).is_empty());
    }

    #[test]
    fn the_kept_engine_rows_say_their_region_ran_in_fp16() {
        let choice = RegionChoice {
            batch: 32,
            regions: vec![Region {
                layers: names(&["b"]),
                fused: names(&["add"]),
                int8_ms: 0.013,
                fp16_ms: 0.010,
            }],
            int8_ms: 1.0,
            fp16_ms: 1.05,
            mixed_ms: Some(0.9),
            kept_mixed: true,
        };
        let mut rows = [t("a", 0.01), t("b+add", 0.01)];
        choice.annotate(&mut rows);
        assert_eq!(rows[0].precision, None);
        assert_eq!(
            rows[1].precision.as_deref(),
            Some("fp16 region: INT8 was 1.30x slower for this region")
        );
        // The trial engine keeps the layer and what was fused into it in float.
        let nodes: Vec<String> = choice.regions.iter().flat_map(Region::nodes).collect();
        assert_eq!(nodes, names(&["b", "add"]));
        assert!(choice.describe("INT8 max").contains("ran in FP16"));
        let kept_int8 = RegionChoice {
            kept_mixed: false,
            mixed_ms: Some(1.1),
            ..choice
        };
        // Not kept: no row says it ran in FP16.
        let mut rows = [t("a", 0.01), t("b+add", 0.01)];
        kept_int8.annotate(&mut rows);
        assert!(rows.iter().all(|r| r.precision.is_none()));
        assert!(kept_int8.describe("INT8 max").contains("all INT8 kept"));
        // INT8 already well ahead of FP16: no trial engine.
        let ahead = RegionChoice {
            fp16_ms: 1.4,
            mixed_ms: None,
            ..kept_int8
        };
        assert!(!ahead.worth_trying());
        assert!(ahead.describe("INT8 max").contains("0.71x FP16's time"));
    }
}
