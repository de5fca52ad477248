//! Precision per region: the runs of an INT8 engine's layers that took longer in its run than
//! the same layers in the FP16 engine's, so that the builder can time an engine with those
//! layers in FP16 (float at the region's edges, no Q/DQ inside), and the FP16 engine where
//! that still loses, and keep the fastest engine.
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
/// Another engine is kept over the one kept so far when its run is at least this much faster:
/// two builds of one engine mostly profile within about 1 % of each other (on an H200, RegNetY's
/// and LeViT's FP16 engines built twice in one run; ShuffleNetV2's and MobileNetV3-Small's
/// differed by 3.5 %, for reasons not found).
const KEEP_GAIN: f64 = 0.01;

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

/// The engine a row ran, of those timed for one batch size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kept {
    /// The all-INT8 engine.
    #[default]
    Int8,
    /// The engine with the slower regions in FP16.
    Regions,
    /// The FP16 engine: the whole network is the region. INT8 lost to FP16 even with its
    /// slower regions in FP16, as TensorRT's builder with FP16 allowed beside INT8 would find,
    /// and keep FP16 for. On an H200, RegNetY-400MF's engine with 83 of its layers in FP16 still
    /// took 1.084 ms at batch 32 against FP16's 1.068: its edges cost more than its int8
    /// layers gained.
    Fp16,
}

/// What the builder chose for one engine (one batch size).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionChoice {
    pub batch: usize,
    /// The regions that were slower in INT8 (empty: none was).
    pub regions: Vec<Region>,
    /// Milliseconds a run of the all-INT8 engine took, of the FP16 engine the regions were
    /// found with, of the engine with the regions in FP16 (when one was built), and of the FP16
    /// engine built for the row (when neither INT8 engine beat FP16's time).
    pub int8_ms: f64,
    pub fp16_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp16_engine_ms: Option<f64>,
    /// The engine the row ran.
    #[serde(default)]
    pub kept: Kept,
}

/// Whether an engine that took `ms` is faster than one that took `than` by more than two builds
/// of one engine differ (about 1 % on an H200), so that a choice is not a coin toss.
fn clearly_faster(ms: f64, than: f64) -> bool {
    ms < than * (1.0 - KEEP_GAIN)
}

impl RegionChoice {
    /// The choice before any other engine is built: the all-INT8 engine, its regions found
    /// against FP16's layer times.
    pub fn new(batch: usize, int8: &[LayerTime], fp16: &[LayerTime], quantized: &[String]) -> Self {
        RegionChoice {
            batch,
            regions: slower_regions(int8, fp16, quantized),
            int8_ms: int8.iter().map(|t| t.time_ms).sum(),
            fp16_ms: fp16.iter().map(|t| t.time_ms).sum(),
            mixed_ms: None,
            fp16_engine_ms: None,
            kept: Kept::Int8,
        }
    }

    /// Whether an engine with the regions in FP16 is worth building: some region was slower,
    /// and the all-INT8 engine is not clearly faster than FP16 already. On an H200 the trial
    /// engines of ResNet-50 and MobileNetV2 (INT8 at 0.69-0.76x FP16) were 2-17 % slower than
    /// all-INT8 at batch 1 and 32, and cost ResNet-50's row 13 s of build; those of
    /// EfficientNet-B0 (INT8 at 1.02-1.04x FP16) were 3 % faster.
    pub fn worth_trying(&self) -> bool {
        !self.regions.is_empty() && self.int8_ms >= TRY_BELOW_FP16 * self.fp16_ms
    }

    /// Milliseconds a run of the engine kept so far takes.
    pub fn kept_ms(&self) -> f64 {
        match self.kept {
            Kept::Int8 => self.int8_ms,
            Kept::Regions => self.mixed_ms.unwrap_or(self.int8_ms),
            Kept::Fp16 => self.fp16_engine_ms.unwrap_or(self.fp16_ms),
        }
    }

    /// Records the engine with the regions in FP16, timed at `ms`; it is kept if clearly faster.
    pub fn timed_mixed(&mut self, ms: f64) {
        self.mixed_ms = Some(ms);
        if clearly_faster(ms, self.kept_ms()) {
            self.kept = Kept::Regions;
        }
    }

    /// Whether the FP16 engine is worth building for the row: FP16's layer times sum to less
    /// than the kept engine's, whether or not any single region was slower (the cost can be all
    /// edges).
    pub fn fp16_worth_trying(&self) -> bool {
        self.fp16_ms < self.kept_ms()
    }

    /// Records the FP16 engine built for the row, timed at `ms`; it is kept if faster at all.
    /// Unlike a trial engine, it needs no margin: within noise of the kept engine it is as
    /// fast, and its values are FP16's. On an H200, ShuffleNetV2's engine with its regions
    /// in FP16 profiled 0.95 % behind FP16's, inside the margin, and its row then timed 1.4 %
    /// behind FP16's.
    pub fn timed_fp16_engine(&mut self, ms: f64) {
        self.fp16_engine_ms = Some(ms);
        if ms < self.kept_ms() {
            self.kept = Kept::Fp16;
        }
    }

    /// Whether the engine the row ran has layers in FP16 (the report's notes say so).
    pub fn ran_fp16(&self) -> bool {
        self.kept != Kept::Int8
    }

    /// A few words for the row's note where layers ran in FP16: "batch 32: 51 layer(s) in FP16
    /// regions", "batch 1: ran in FP16 throughout (INT8 was 1.10x slower)".
    pub fn short(&self) -> Option<String> {
        let b = self.batch;
        match self.kept {
            Kept::Int8 => None,
            Kept::Regions => Some(format!(
                "batch {b}: {} layer(s) in FP16 regions",
                self.regions.iter().map(|r| r.layers.len()).sum::<usize>()
            )),
            Kept::Fp16 => Some(format!(
                "batch {b}: ran in FP16 throughout (INT8 was {:.2}x slower)",
                self.int8_ms / self.fp16_ms.max(1e-9)
            )),
        }
    }

    /// One line for the log and the report's notes.
    pub fn describe(&self, label: &str) -> String {
        let b = self.batch;
        let layers: usize = self.regions.iter().map(|r| r.layers.len()).sum();
        let n = self.regions.len();
        let ratio = self.int8_ms / self.fp16_ms.max(1e-9);
        let tried = match self.mixed_ms {
            Some(m) => format!(
                "; with its {n} slower region(s) ({}) in FP16, {m:.3} ms",
                self.slowdowns()
            ),
            None if n > 0 => format!("; {n} region(s) were slower ({})", self.slowdowns()),
            None => String::new(),
        };
        match self.kept {
            Kept::Fp16 => format!(
                "{label} batch {b}: ran in FP16 throughout: the INT8 engine took {:.3} ms \
                 ({ratio:.2}x FP16's time){tried}; the FP16 engine {:.3} ms",
                self.int8_ms,
                self.kept_ms()
            ),
            Kept::Regions => format!(
                "{label} batch {b}: {n} region(s), {layers} layer(s), ran in FP16: INT8 was \
                 slower for them ({}); the engine takes {:.3} ms instead of {:.3}",
                self.slowdowns(),
                self.kept_ms(),
                self.int8_ms
            ),
            Kept::Int8 if n == 0 && self.fp16_engine_ms.is_none() => format!(
                "{label} batch {b}: no layer ran slower in INT8 than in FP16 ({ratio:.2}x \
                 FP16's time)"
            ),
            Kept::Int8 if self.mixed_ms.is_none() && self.fp16_engine_ms.is_none() => format!(
                "{label} batch {b}: {n} region(s) were slower in INT8 ({}), not tried: the \
                 INT8 engine already runs in {ratio:.2}x FP16's time",
                self.slowdowns()
            ),
            Kept::Int8 => format!(
                "{label} batch {b}: all INT8 kept ({:.3} ms, {ratio:.2}x FP16's time){tried}{}",
                self.int8_ms,
                self.fp16_engine_ms
                    .map_or(String::new(), |m| format!("; the FP16 engine {m:.3} ms"))
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

    /// Marks the kept engine's Layers rows of the layers that ran in FP16 for INT8's sake: "fp16
    /// region: INT8 was 1.31x slower for this region" (the Layers tab sums by the words before
    /// the colon). For the FP16 engine that is every quantized layer (`quantized`), the whole
    /// network being the region.
    pub fn annotate(&self, times: &mut [LayerTime], quantized: &[String]) {
        let of: HashMap<&str, f64> = match self.kept {
            Kept::Int8 => return,
            Kept::Regions => self
                .regions
                .iter()
                .flat_map(|r| r.layers.iter().map(move |l| (l.as_str(), r.slowdown())))
                .collect(),
            Kept::Fp16 => {
                let whole = self.int8_ms / self.fp16_ms.max(1e-9);
                quantized.iter().map(|l| (l.as_str(), whole)).collect()
            }
        };
        let what = match self.kept {
            Kept::Fp16 => "the whole network",
            _ => "this region",
        };
        for t in times {
            if let Some(x) = of.get(step_layer(&t.layer)) {
                t.precision = Some(format!("fp16 region: INT8 was {x:.2}x slower for {what}"));
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
        let region = Region {
            layers: names(&["b"]),
            fused: names(&["add"]),
            int8_ms: 0.013,
            fp16_ms: 0.010,
        };
        let int8 = [t("a", 0.5), t("b+add", 0.55)];
        let fp16 = [t("a", 0.5), t("b", 0.5)];
        let q = names(&["a", "b"]);
        let mut choice = RegionChoice::new(32, &int8, &fp16, &q);
        assert!((choice.int8_ms - 1.05).abs() < 1e-12 && (choice.fp16_ms - 1.0).abs() < 1e-12);
        assert_eq!(choice.regions.len(), 1);
        assert!(choice.worth_trying());
        choice.regions = vec![region];
        choice.timed_mixed(0.9);
        assert_eq!(choice.kept, Kept::Regions);
        assert!(!choice.fp16_worth_trying(), "0.9 ms beats FP16's 1.0");
        let mut rows = [t("a", 0.01), t("b+add", 0.01)];
        choice.annotate(&mut rows, &q);
        assert_eq!(rows[0].precision, None);
        assert_eq!(
            rows[1].precision.as_deref(),
            Some("fp16 region: INT8 was 1.30x slower for this region")
        );
        // The trial engine keeps the layer and what was fused into it in float.
        let nodes: Vec<String> = choice.regions.iter().flat_map(Region::nodes).collect();
        assert_eq!(nodes, names(&["b", "add"]));
        assert!(choice.describe("INT8 max").contains("ran in FP16"));

        // A trial within 1 % of all-INT8 is not kept; FP16, 5 % faster, is tried and kept.
        let mut slower = RegionChoice {
            mixed_ms: None,
            kept: Kept::Int8,
            ..choice.clone()
        };
        slower.timed_mixed(1.045);
        assert_eq!(slower.kept, Kept::Int8);
        assert!(!slower.ran_fp16());
        let mut rows = [t("a", 0.01), t("b+add", 0.01)];
        slower.annotate(&mut rows, &q);
        assert!(rows.iter().all(|r| r.precision.is_none()));
        assert!(slower.describe("INT8 max").contains("all INT8 kept"));
        assert!(slower.fp16_worth_trying());
        let mut whole = slower.clone();
        whole.timed_fp16_engine(1.0);
        assert_eq!(whole.kept, Kept::Fp16);
        assert!(
            whole
                .describe("INT8 max")
                .contains("ran in FP16 throughout")
        );
        let mut rows = [t("a", 0.01), t("b+add", 0.01), t("pool", 0.01)];
        whole.annotate(&mut rows, &q);
        let marked = Some("fp16 region: INT8 was 1.05x slower for the whole network");
        assert_eq!(rows[0].precision.as_deref(), marked);
        assert_eq!(rows[1].precision.as_deref(), marked);
        assert_eq!(rows[2].precision, None, "not a quantized layer");
        // An FP16 engine a little faster is kept; one that builds slower than FP16's
        // profile said, beyond the kept engine's time, is not.
        let mut close = slower.clone();
        close.timed_fp16_engine(1.045);
        assert_eq!(close.kept, Kept::Fp16);
        let mut noisy = slower.clone();
        noisy.timed_fp16_engine(1.06);
        assert_eq!(noisy.kept, Kept::Int8);

        // INT8 already well ahead of FP16: no trial engine, no FP16 engine.
        let ahead = RegionChoice {
            fp16_ms: 1.5,
            ..slower
        };
        assert!(!ahead.worth_trying() && !ahead.fp16_worth_trying());
        assert!(ahead.describe("INT8 max").contains("0.70x FP16's time"));
    }
}
