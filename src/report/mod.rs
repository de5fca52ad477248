//! The report: one row per (precision, method) with accuracy, agreement, SQNR, latency and
//! memory; written as JSON, Markdown and CSV; and mask overlays as PNG.

mod classes;
mod masks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::{FloatNode, LayerTime, Precision};
use crate::bench::Latency;
use crate::calib::Method;
use crate::data::Preprocess;
use crate::experiment::Budget;
use crate::model::{Task, TensorInfo};

pub use classes::{
    Confusion, Flip, GALLERY_MAX_IMAGES, GRID_MAX_CLASSES, GalleryImage, ImageTop, TOP_K, gallery,
    probabilities,
};
pub use masks::{class_color, overlay_png, write_mask_overlays};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBytes {
    pub weights: u64,
    pub activations: u64,
    /// What the engine adds to the process's resident memory: growth over its build plus the
    /// peak growth while it is timed (evaluation buffers are not counted).
    pub peak_rss: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub precision: Option<Precision>,
    /// Calibration method (INT8 only).
    pub method: Option<Method>,
    /// Layers kept in float by a mixed-precision plan (empty for plain engines).
    pub kept_float: Vec<String>,
    pub backend: String,
    /// Threads the engine ran on (CPU backend).
    #[serde(default)]
    pub threads: Option<usize>,
    /// True where the precision is emulated (FP16 on the CPU backend).
    pub simulated: bool,
    /// An FP32 engine on TF32 tensor cores (GPU, `--fp32-math tf32`).
    #[serde(default)]
    pub tf32: bool,
    pub top1: Option<f64>,
    pub top5: Option<f64>,
    pub per_class_accuracy: Option<Vec<Option<f64>>>,
    /// Classifiers: the confusion matrix over the evaluation images (true × predicted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confusion: Option<Confusion>,
    pub miou: Option<f64>,
    pub per_class_iou: Option<Vec<Option<f64>>>,
    pub pixel_acc: Option<f64>,
    /// Top-1 agreement or argmax-pixel agreement with FP32.
    pub agreement: Option<f64>,
    pub sqnr_db: Option<f64>,
    /// Images the SQNR was computed over (FP32 outputs kept in memory).
    pub sqnr_images: Option<usize>,
    pub latency_ms: Option<Latency>,
    pub throughput_ips: Option<f64>,
    pub batch: Option<usize>,
    pub latency_batch_ms: Option<Latency>,
    pub throughput_batch_ips: Option<f64>,
    pub memory_bytes: Option<MemoryBytes>,
    pub build_ms: Option<f64>,
    pub int8_nodes: Option<usize>,
    pub float_nodes: Vec<FloatNode>,
    /// Layers the engine kept in FP32 where it computes the rest in FP16, and why: the FP16
    /// overflow guard ([`crate::fp16_guard`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fp32_layers: Vec<crate::fp16_guard::KeptFp32>,
    /// Per-layer times of the batch-1 engine (backends that measure them).
    pub layer_times: Vec<LayerTime>,
    /// Per-layer times of the batch-N engine, when one was timed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_times_batch: Vec<LayerTime>,
    /// The layer times are each layer's share of the whole run (they sum to its latency), not
    /// each layer timed alone.
    #[serde(default)]
    pub layer_times_in_run: bool,
    /// INT8 on the GPU: per engine (batch size), the regions that ran slower in INT8 than in
    /// FP16, and whether the engine timed and evaluated runs them in FP16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fp16_regions: Vec<crate::fp16_regions::RegionChoice>,
    /// Per evaluation image: its mIoU (segmentation) or 1/0 for a correct top-1.
    pub per_image: Vec<f64>,
    pub error: Option<String>,
    /// The runtime that ran the row and the form it ran ("onnxruntime 1.32.0; INT8 form: ...").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// NaN or ±Inf in the engine's outputs (or in the FP32 reference it is compared with). Any at
    /// all makes the row's metrics void: they are left empty, and the run exits 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_finite: Option<NonFinite>,
    /// Other processes ready to run when this row's timing started (on `cores` cores): where
    /// they were, its latency competed with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_load: Option<TimingLoad>,
    /// The mixed-precision plan's row: whether it meets the budget it was searched for, on
    /// the evaluation images, against this run's FP32 row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetCheck>,
}

/// An engine's task metric against an accuracy budget: the metrics are fractions (top-1 or
/// mIoU), `target` the least metric within budget of `fp32`, and `met` says `achieved` reaches
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetCheck {
    pub budget: Budget,
    pub fp32: f64,
    pub target: f64,
    pub achieved: f64,
    pub met: bool,
}

impl BudgetCheck {
    pub fn of(budget: Budget, fp32: f64, achieved: f64) -> BudgetCheck {
        BudgetCheck {
            budget,
            fp32,
            target: budget.target(fp32),
            achieved,
            met: budget.met(fp32, achieved),
        }
    }

    /// "budget met: 41.66 % ≥ 41.49 % (99.90 % of FP32 41.70 %; at most 0.5 % relative mIoU
    /// below FP32)", or "budget NOT met: …".
    pub fn describe(&self) -> String {
        format!(
            "budget {}: {:.2} % {} {:.2} % ({:.2} % of FP32 {:.2} %; {})",
            if self.met { "met" } else { "NOT met" },
            self.achieved * 100.0,
            if self.met { "≥" } else { "<" },
            self.target * 100.0,
            self.achieved / self.fp32.max(1e-12) * 100.0,
            self.fp32 * 100.0,
            self.budget.describe()
        )
    }
}

/// The machine's load when an engine's timing started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimingLoad {
    pub other_runnable: usize,
    pub cores: usize,
}

impl TimingLoad {
    /// A warning for a row timed while others competed; `None` on a quiet machine.
    pub fn warning(&self, label: &str) -> Option<String> {
        (self.other_runnable > 0).then(|| {
            format!(
                "{label} was timed while {} other process{} ready to run on {} cores: its latency may read high. Re-time it on a quiet machine, or with --until-stable (GUI: Re-time)",
                self.other_runnable,
                if self.other_runnable == 1 { " was" } else { "es were" },
                self.cores
            )
        })
    }
}

/// Non-finite values an engine produced over the evaluation set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NonFinite {
    /// Evaluation images whose output held at least one NaN or ±Inf.
    pub images: usize,
    /// Images evaluated.
    pub of_images: usize,
    /// NaN and ±Inf values over all outputs.
    pub values: u64,
    /// True where this engine's outputs were finite but the FP32 reference's were not, so
    /// agreement and SQNR against it mean nothing.
    #[serde(default)]
    pub in_reference_only: bool,
}

impl NonFinite {
    /// Why the row's metrics are void, in words.
    pub fn reason(&self) -> String {
        if self.in_reference_only {
            return "metrics void: the FP32 reference output NaN/Inf, so agreement and SQNR against it mean nothing".into();
        }
        format!(
            "metrics void: {} of {} images gave NaN/Inf outputs ({} values); an overflow or a bad weight, see the Layers tab",
            self.images, self.of_images, self.values
        )
    }
}

impl Row {
    pub fn label(&self) -> String {
        match (self.precision, self.method) {
            // A plan that keeps nothing in float is still the plan's row, not the method's.
            (Some(p), Some(m)) if !self.kept_float.is_empty() || self.budget.is_some() => {
                format!("{p} {m} + {} float", self.kept_float.len())
            }
            (Some(p), Some(m)) => format!("{p} {m}"),
            (Some(p), None) if self.tf32 => format!("{p} (tf32)"),
            (Some(p), None) => p.to_string(),
            _ => "?".into(),
        }
    }

    /// The task metric: mIoU or top-1.
    pub fn metric(&self) -> Option<f64> {
        self.miou.or(self.top1)
    }

    /// A row that produced no usable result: its engine failed, or its outputs held NaN/Inf.
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.non_finite.is_some()
    }

    /// What the note column says: the error, the void metrics, or that the precision is
    /// simulated, and a mixed-precision row's budget check.
    pub fn note(&self) -> String {
        let base = match (&self.error, &self.non_finite, self.simulated) {
            (Some(e), _, _) => format!("error: {e}"),
            (None, Some(n), _) => n.reason(),
            (None, None, true) => "simulated on CPU".into(),
            _ => String::new(),
        };
        // A fast GPU build's convs were chosen untimed: its latency is not the engine's best.
        let fast_build = self
            .engine
            .as_deref()
            .is_some_and(|e| e.contains("build effort fast"))
            .then(|| {
                "built at --build-effort fast: convs chosen untimed (on an H200 such engines \
                 ran 1.08-1.31x the latency of timed ones)"
                    .to_string()
            });
        let parts: Vec<String> = [
            Some(base),
            self.budget.as_ref().map(|b| b.describe()),
            self.fp32_layers_note(),
            fast_build,
            self.fp16_regions_note(),
        ]
        .into_iter()
        .flatten()
        .filter(|p| !p.is_empty())
        .collect();
        parts.join("; ")
    }

    /// "batch 1: ran in FP16 throughout (INT8 was 1.10x slower)", per batch size where precision
    /// per region put layers of this INT8 row in FP16: its time and values are not all INT8's.
    pub fn fp16_regions_note(&self) -> Option<String> {
        let parts: Vec<String> = self.fp16_regions.iter().filter_map(|c| c.short()).collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// "3 layers kept in FP32 (overflow guard)", where the FP16 overflow guard kept any.
    pub fn fp32_layers_note(&self) -> Option<String> {
        let n = self.fp32_layers.len();
        (n > 0).then(|| {
            format!(
                "{n} layer{} kept in FP32 (overflow guard)",
                if n == 1 { "" } else { "s" }
            )
        })
    }
}

/// Which INT8 row is best on the task metric, and whether its lead over the runner-up is
/// beyond the evaluation set's noise (paired per-image metric difference against twice its
/// standard error, as [`crate::decide::Paired`]): a lead of 0.3 pt on 96 images is a draw, and
/// the report says so rather than crown a method (None with fewer than two INT8 rows).
pub fn int8_ranking_note(rows: &[Row]) -> Option<String> {
    let mut int8: Vec<&Row> = rows
        .iter()
        .filter(|r| r.precision == Some(Precision::Int8) && !r.failed() && r.metric().is_some())
        .collect();
    if int8.len() < 2 {
        return None;
    }
    int8.sort_by(|a, b| {
        b.metric()
            .unwrap_or(0.0)
            .total_cmp(&a.metric().unwrap_or(0.0))
    });
    let (best, next) = (int8[0], int8[1]);
    let pt = |r: &Row| r.metric().unwrap_or(0.0) * 100.0;
    let what = if best.miou.is_some() { "mIoU" } else { "top-1" };
    let lead = pt(best) - pt(next);
    let paired = crate::decide::Paired::of(&next.per_image, &best.per_image);
    let noise_pt = 2.0 * paired.stderr * 100.0;
    let verdict = if paired.samples < 2 || best.per_image.len() != next.per_image.len() {
        "per-image results missing, so no noise estimate".to_string()
    } else if paired.clearly_better(0.0) {
        format!(
            "beyond the noise of the {} evaluation images (per-image {what} {:+.2} ± {noise_pt:.2} pt, 2 standard errors)",
            paired.samples,
            paired.mean * 100.0
        )
    } else {
        format!(
            "within the noise of the {} evaluation images (per-image {what} {:+.2} ± {noise_pt:.2} pt, 2 standard errors): treat them as tied",
            paired.samples,
            paired.mean * 100.0
        )
    };
    Some(format!(
        "best INT8 row: {} at {:.2} % {what}, {lead:.2} pt ahead of {} ({:.2} %); {verdict}",
        best.label(),
        pt(best),
        next.label(),
        pt(next)
    ))
}

/// Notes for the INT8 and FP8 engines that ran slower than the same run's FP16 engine, at
/// batch 1 or at the timed batch, where both ran on a device (a simulated latency says nothing
/// about one). "INT8 is not faster than FP16" is the complaint users file most often against INT8
/// engines: the report says so in words, not only in the table, and says where to look.
/// Differences under 2 % are left to the table (timing noise).
pub fn slower_quantized_notes(rows: &[Row]) -> Vec<String> {
    let ok = |r: &&Row, p: Precision| r.precision == Some(p) && r.error.is_none();
    let Some(f) = rows.iter().find(|r| ok(r, Precision::Fp16) && !r.simulated) else {
        return vec![];
    };
    let slower = |a: &Option<Latency>, b: &Option<Latency>| match (a, b) {
        (Some(a), Some(b)) if a.median > b.median * 1.02 => Some((a.median, b.median)),
        _ => None,
    };
    rows.iter()
        .filter(|r| {
            r.precision.is_some_and(|p| p.is_quantized())
                && r.error.is_none()
                && !r.simulated
                && r.backend == f.backend
        })
        .filter_map(|r| {
            let mut at = vec![];
            if let Some((a, b)) = slower(&r.latency_ms, &f.latency_ms) {
                at.push(format!("{a:.3} against {b:.3} ms at batch 1"));
            }
            if let (Some((a, b)), Some(n)) = (slower(&r.latency_batch_ms, &f.latency_batch_ms), r.batch)
                && f.batch == r.batch
            {
                at.push(format!("{a:.3} against {b:.3} ms at batch {n}"));
            }
            (!at.is_empty()).then(|| {
                format!(
                    "{} on {} ran slower than FP16: {}. The Layers tab shows which precision each layer ran in, and why.",
                    r.label(),
                    r.backend,
                    at.join(", ")
                )
            })
        })
        .collect()
}

/// Images a classifier's FP32 top-1 must be measured on before it is called near chance.
const CHANCE_MIN_IMAGES: usize = 20;

/// A warning when the FP32 row's top-1 is near chance (at most twice 1 / classes, over at
/// least CHANCE_MIN_IMAGES images): on a trained classifier that means the evaluation itself
/// is wrong, and every Δ and agreement beside it is noise. It names what to check.
pub fn near_chance_note(rows: &[Row]) -> Option<String> {
    let r = rows
        .iter()
        .find(|r| r.precision == Some(Precision::Fp32) && r.error.is_none())?;
    let (top1, classes) = (r.top1?, r.per_class_accuracy.as_ref()?.len());
    let chance = 1.0 / classes.max(1) as f64;
    (classes >= 2 && r.per_image.len() >= CHANCE_MIN_IMAGES && top1 <= 2.0 * chance).then(|| {
        format!(
            "fp32 top-1 is {:.1} % over {} images, about chance for {classes} classes ({:.1} %): \
             the evaluation is likely wrong, not the model. Check that the labels file lists the \
             classes in the model's output order, that the evaluation folders are named by class, \
             and that the preprocessing is the one the model was trained with (--preset, --mean / \
             --std or --scale / --offset, --bgr, --resize).",
            top1 * 100.0,
            r.per_image.len(),
            chance * 100.0
        )
    })
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSummary {
    pub file: PathBuf,
    pub task: Option<Task>,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    pub params: u64,
    pub param_bytes: u64,
    pub op_census: BTreeMap<String, usize>,
}

/// A histogram downsampled for display, with each method's amax.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorRanges {
    pub tensor: String,
    pub bin_width: f32,
    pub counts: Vec<u64>,
    pub amax: BTreeMap<Method, f32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CalibSummary {
    pub images: usize,
    pub cache_hit: bool,
    pub pass_ms: f64,
    /// Time to compute all methods' ranges from the statistics.
    pub ranges_ms: f64,
    pub tensors: Vec<TensorRanges>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    pub dir: Option<PathBuf>,
    pub task: Option<Task>,
    pub images: usize,
    pub classes: Vec<String>,
    /// The evaluation images, in the order of each row's `per_image`.
    pub image_files: Vec<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub quantscope_version: String,
    pub experiment: String,
    pub model: ModelSummary,
    pub preprocess: Preprocess,
    pub input_hw: [usize; 2],
    pub calibration: Option<CalibSummary>,
    pub evaluation: EvalSummary,
    pub rows: Vec<Row>,
    /// The run was stopped (Cancel, Ctrl-C) before every requested row was produced.
    #[serde(default)]
    pub incomplete: bool,
    /// What the run decided on the user's behalf and why (e.g. a batch the model cannot run).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Cross-layer equalization of the INT8 engines' model: pairs equalized, skipped and why.
    #[serde(default)]
    pub equalization: Option<crate::prepare::cle::CleSummary>,
    /// Activation centering of the INT8 engines' model: tensors shifted, left alone and why.
    #[serde(default)]
    pub centering: Option<crate::prepare::center::CenterSummary>,
    /// The FP16 overflow guard's lists (layers kept in FP32, and why) as the run measured them.
    #[serde(default, skip_serializing_if = "crate::fp16_guard::Guards::is_empty")]
    pub fp16_guard: crate::fp16_guard::Guards,
    /// With an FP8 row: each quantized layer's rounding SQNR in int8 and FP8
    /// ([`crate::quant::rounding`]), what the FP8 row's note sums up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fp8_rounding: Vec<crate::quant::rounding::LayerRounding>,
    /// Models written for deployment (`--export`), with their trtexec lines and ORT checks.
    #[serde(default)]
    pub exports: Vec<crate::export::ExportedModel>,
    /// The CPU engine that ran the CPU rows and the statistics passes: name, version, library
    /// path, the CPU's instruction set, and why where there was a choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_engine: Option<crate::backend::cpu::CpuEngineInfo>,
    /// Classifiers: the evaluation images some engine flips against FP32 (right to wrong or
    /// the reverse), with every engine's top-3 and probabilities (see `classes.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gallery: Vec<GalleryImage>,
}

/// A fraction as a percentage with two decimals, "–" when absent (tables in reports and UI).
pub fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{:.2}", v * 100.0))
        .unwrap_or_else(|| "–".into())
}

/// A number with `digits` decimals, "–" when absent.
pub fn num(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / (1024.0 * 1024.0))
}

/// The error of a row whose evaluation was stopped by Cancel or Ctrl-C.
pub const CANCELLED: &str = "cancelled";

impl Report {
    /// Rows that ran to the end (with a result or an error of their own), not cut short by a
    /// cancel.
    pub fn finished_rows(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.error.as_deref() != Some(CANCELLED))
            .count()
    }

    pub fn fp32(&self) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.precision == Some(Precision::Fp32) && !r.failed())
    }

    /// Task metric of `row` minus FP32's, in points (percentage points for top-1/mIoU).
    pub fn delta_vs_fp32(&self, row: &Row) -> Option<f64> {
        Some((row.metric()? - self.fp32()?.metric()?) * 100.0)
    }

    /// The classes each engine loses most on against FP32, at most `n` an engine, largest drop
    /// first: (engine, class name, FP32's, the engine's), per-class accuracy for a classifier,
    /// IoU for segmentation. Engines whose metrics are void are left out.
    pub fn class_drops(&self, n: usize) -> Vec<(String, String, f64, f64)> {
        let seg = self.model.task == Some(Task::Segmentation);
        let per_class = |r: &Row| {
            if seg {
                r.per_class_iou.clone()
            } else {
                r.per_class_accuracy.clone()
            }
        };
        let Some(base) = self.fp32().and_then(per_class) else {
            return vec![];
        };
        let name = |c: usize| {
            self.evaluation
                .classes
                .get(c)
                .cloned()
                .unwrap_or_else(|| format!("class {c}"))
        };
        let mut out = vec![];
        for r in self.rows.iter().filter(|r| {
            r.precision.is_some_and(|p| p != Precision::Fp32)
                && r.error.is_none()
                && r.non_finite.is_none()
        }) {
            let Some(own) = per_class(r) else { continue };
            let mut drops: Vec<(usize, f64, f64)> = base
                .iter()
                .zip(&own)
                .enumerate()
                .filter_map(|(c, (a, b))| Some((c, (*a)?, (*b)?)))
                .filter(|(_, a, b)| b < a)
                .collect();
            drops.sort_by(|x, y| (x.2 - x.1).total_cmp(&(y.2 - y.1)));
            out.extend(
                drops
                    .into_iter()
                    .take(n)
                    .map(|(c, a, b)| (r.label(), name(c), a, b)),
            );
        }
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The Markdown report, with a classifier's confusion matrices and flipped images.
    pub fn to_markdown(&self) -> String {
        self.markdown(true)
    }

    /// The Markdown report for a terminal: a classifier's matrices and flipped images (dozens
    /// of lines per engine) are replaced by a line saying where they are.
    pub fn to_terminal_markdown(&self) -> String {
        self.markdown(false)
    }

    fn markdown(&self, with_classes: bool) -> String {
        let seg = self.model.task == Some(Task::Segmentation);
        let metric = if seg { "mIoU %" } else { "top-1 %" };
        let threads = self
            .rows
            .iter()
            .find_map(|r| r.threads)
            .map(|t| format!(" ({t} thread{})", if t == 1 { "" } else { "s" }))
            .unwrap_or_default();
        let mut s = format!(
            "# quantscope report\n\nModel: `{}` ({} parameters), input {}x{}, backend {}{threads}.\n\n",
            self.model.file.display(),
            self.model.params,
            self.input_hw[0],
            self.input_hw[1],
            self.rows.first().map(|r| r.backend.as_str()).unwrap_or("-"),
        );
        if let Some(e) = &self.cpu_engine {
            s.push_str(&format!("CPU engine: {}.\n\n", e.summary()));
        }
        if let Some(c) = &self.calibration {
            s.push_str(&format!(
                "Calibration: {} images ({}; pass {:.0} ms, every method's ranges {:.0} ms).\n\n",
                c.images,
                if c.cache_hit {
                    "statistics from cache"
                } else {
                    "statistics collected"
                },
                c.pass_ms,
                c.ranges_ms
            ));
        }
        s.push_str(&format!(
            "Evaluation: {} images.\n\n",
            self.evaluation.images
        ));
        let batch = self
            .rows
            .iter()
            .find_map(|r| r.batch)
            .map(|b| b.to_string())
            .unwrap_or_else(|| "N".into());
        s.push_str(&format!(
            "| engine | {metric} | Δ vs FP32 (pt) | agreement % | SQNR dB | latency median ms | p99 ms | img/s batch 1 | img/s batch {batch} | weights MiB | activations MiB | peak RSS growth MiB | quantized nodes | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        ));
        for r in &self.rows {
            let mem = r.memory_bytes.clone().unwrap_or_default();
            let note = r.note();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.label(),
                pct(r.metric()),
                num(self.delta_vs_fp32(r), 2),
                pct(r.agreement),
                num(r.sqnr_db, 1),
                num(r.latency_ms.map(|l| l.median), 2),
                num(r.latency_ms.map(|l| l.p99), 2),
                num(r.throughput_ips, 1),
                num(r.throughput_batch_ips, 1),
                mib(mem.weights),
                mib(mem.activations),
                mib(mem.peak_rss),
                r.int8_nodes
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "–".into()),
                note.replace('|', "/"),
            ));
        }
        for n in &self.notes {
            s.push_str(&format!("\nNote: {n}\n"));
        }
        let drops = self.class_drops(5);
        if !drops.is_empty() {
            let what = if seg { "IoU %" } else { "accuracy %" };
            s.push_str(&format!(
                "\n## Classes that lost most against FP32\n\n| engine | class | FP32 {what} | engine {what} | Δ pt |\n|---|---|---|---|---|\n"
            ));
            for (e, c, a, b) in drops {
                s.push_str(&format!(
                    "| {e} | {} | {:.2} | {:.2} | {:+.2} |\n",
                    c.replace('|', "/"),
                    a * 100.0,
                    b * 100.0,
                    (b - a) * 100.0
                ));
            }
        }
        match with_classes {
            true => s.push_str(&self.classes_markdown()),
            false if self.rows.iter().any(|r| r.confusion.is_some()) => s.push_str(
                "\nConfusion matrices and the images each engine flips against FP32: in the Markdown and JSON reports (--md, --report), as CSV with --confusion-csv and --gallery-csv, and in the window's Classes tab.\n",
            ),
            false => {}
        }
        if self.incomplete {
            s.push_str("\nIncomplete: the run was stopped; these are the rows that finished.\n");
        }
        s.push_str(&crate::export::markdown(&self.exports));
        s
    }

    pub fn to_csv(&self) -> String {
        let mut s = String::from(
            "precision,method,backend,threads,simulated,top1,top5,miou,pixel_acc,agreement,sqnr_db,latency_median_ms,latency_p90_ms,latency_p99_ms,throughput_ips,throughput_batch_ips,weights_bytes,activations_bytes,peak_rss_bytes,build_ms,int8_nodes,error\n",
        );
        let o = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        for r in &self.rows {
            let mem = r.memory_bytes.clone().unwrap_or_default();
            s.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"\n",
                r.precision.map(|p| p.to_string()).unwrap_or_default(),
                r.method.map(|m| m.to_string()).unwrap_or_default(),
                r.backend,
                r.threads.map(|t| t.to_string()).unwrap_or_default(),
                r.simulated,
                o(r.top1),
                o(r.top5),
                o(r.miou),
                o(r.pixel_acc),
                o(r.agreement),
                o(r.sqnr_db),
                o(r.latency_ms.map(|l| l.median)),
                o(r.latency_ms.map(|l| l.p90)),
                o(r.latency_ms.map(|l| l.p99)),
                o(r.throughput_ips),
                o(r.throughput_batch_ips),
                mem.weights,
                mem.activations,
                mem.peak_rss,
                o(r.build_ms),
                r.int8_nodes.map(|n| n.to_string()).unwrap_or_default(),
                r.error
                    .clone()
                    .or(r.non_finite.as_ref().map(NonFinite::reason))
                    .unwrap_or_default()
                    .replace('"', "'"),
            ));
        }
        s
    }

    /// Writes whichever of the three formats have a path, each atomically (a temporary file
    /// renamed into place), and says which could not be written; the others are still written.
    pub fn write(
        &self,
        json: Option<&Path>,
        md: Option<&Path>,
        csv: Option<&Path>,
    ) -> Vec<crate::files::OutputError> {
        let formats: [(Option<&Path>, fn(&Report) -> String); 3] = [
            (json, Report::to_json),
            (md, Report::to_markdown),
            (csv, Report::to_csv),
        ];
        formats
            .into_iter()
            .filter_map(|(p, text)| p.map(|p| crate::files::write(p, text(self))))
            .filter_map(Result::err)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each engine's largest per-class drops against FP32 are listed by class name, largest
    /// first, gains left out; a void engine is not listed.
    #[test]
    fn classes_that_lost_most_are_listed() {
        let row = |p: Precision, acc: &[f64]| Row {
            precision: Some(p),
            method: (p == Precision::Int8).then_some(Method::Max),
            top1: Some(0.5),
            per_class_accuracy: Some(acc.iter().map(|&a| Some(a)).collect()),
            ..Default::default()
        };
        let mut r = Report {
            rows: vec![
                row(Precision::Fp32, &[0.9, 0.8, 0.7]),
                row(Precision::Int8, &[0.9, 0.5, 0.75]),
            ],
            ..Default::default()
        };
        r.model.task = Some(Task::Classification);
        r.evaluation.classes = vec!["cat".into(), "dog".into(), "bird".into()];
        let drops = r.class_drops(5);
        assert_eq!(drops.len(), 1, "{drops:?}");
        assert_eq!(
            (drops[0].1.as_str(), drops[0].2, drops[0].3),
            ("dog", 0.8, 0.5)
        );
        let md = r.to_markdown();
        assert!(
            md.contains("| int8 max | dog | 80.00 | 50.00 | -30.00 |"),
            "{md}"
        );
        r.rows[1].non_finite = Some(NonFinite::default());
        assert!(r.class_drops(5).is_empty());
    }

    /// A budget check is met exactly when the metric reaches the budget's target (float
    /// rounding of an exact hit included), and the plan's row says so in its note and the
    /// Markdown table.
    #[test]
    fn a_budget_check_says_whether_the_metric_reaches_its_target() {
        let b = Budget::MiouRelativePercent(0.5);
        let met = BudgetCheck::of(b, 0.4170, 0.4166);
        assert!((met.target - 0.4170 * 0.995).abs() < 1e-12, "{met:?}");
        assert!(met.met);
        assert_eq!(
            met.describe(),
            "budget met: 41.66 % ≥ 41.49 % (99.90 % of FP32 41.70 %; at most 0.5 % relative mIoU below FP32)"
        );
        let missed = BudgetCheck::of(b, 0.4170, 0.4140);
        assert!(!missed.met);
        assert!(
            missed
                .describe()
                .starts_with("budget NOT met: 41.40 % < 41.49 %")
        );
        // 47 of 50 against 95 % with a 1 pt budget is exactly on target.
        assert!(BudgetCheck::of(Budget::Top1Points(1.0), 0.95, 47.0 / 50.0).met);
        assert!(!BudgetCheck::of(Budget::Top1Points(1.0), 0.95, 46.0 / 50.0).met);

        let row = Row {
            precision: Some(Precision::Int8),
            method: Some(Method::Entropy),
            miou: Some(0.4140),
            budget: Some(missed),
            ..Default::default()
        };
        assert_eq!(row.label(), "int8 entropy + 0 float", "the plan's row");
        assert_eq!(row.note(), missed.describe());
        let simulated = Row {
            simulated: true,
            ..row.clone()
        };
        assert_eq!(
            simulated.note(),
            format!("simulated on CPU; {}", missed.describe())
        );
        let mut r = Report {
            rows: vec![row],
            ..Default::default()
        };
        r.model.task = Some(Task::Segmentation);
        assert!(r.to_markdown().contains("| budget NOT met: 41.40 %"));
        assert!(r.to_json().contains("\"budget\""));
    }

    /// A classifier evaluated at chance gets a note naming what to check; one evaluated well,
    /// or on too few images to tell, does not.
    #[test]
    fn top1_near_chance_is_said() {
        let fp32 = |top1: f64, classes: usize, images: usize| Row {
            precision: Some(Precision::Fp32),
            top1: Some(top1),
            per_class_accuracy: Some(vec![Some(top1); classes]),
            per_image: vec![0.0; images],
            ..Default::default()
        };
        let note = near_chance_note(&[fp32(0.11, 10, 100)]).expect("10 classes at 11 %");
        assert!(
            note.contains("fp32 top-1 is 11.0 % over 100 images"),
            "{note}"
        );
        assert!(
            note.contains("about chance for 10 classes (10.0 %)"),
            "{note}"
        );
        assert!(
            note.contains("labels file") && note.contains("--mean"),
            "{note}"
        );
        assert_eq!(near_chance_note(&[fp32(0.91, 10, 100)]), None);
        assert_eq!(
            near_chance_note(&[fp32(0.1, 10, 8)]),
            None,
            "too few images"
        );
        assert!(near_chance_note(&[fp32(0.001, 1000, 500)]).is_some());
        // No FP32 row (or a segmentation run): nothing to judge.
        let int8 = Row {
            precision: Some(Precision::Int8),
            ..fp32(0.1, 10, 100)
        };
        assert_eq!(near_chance_note(&[int8]), None);
    }

    #[test]
    fn a_fast_gpu_build_says_so_in_its_note() {
        let row = |engine: &str| Row {
            precision: Some(Precision::Int8),
            backend: "cuda".into(),
            engine: Some(engine.into()),
            ..Default::default()
        };
        let fast = row("quantscope cuda, build effort fast: convs 54 by the fast order, untimed");
        assert!(
            fast.note().contains("--build-effort fast"),
            "{}",
            fast.note()
        );
        let timed = row("quantscope cuda, build effort default: convs 35 timed");
        assert!(!timed.note().contains("build-effort"), "{}", timed.note());
    }

    #[test]
    fn int8_slower_than_device_fp16_is_said() {
        let lat = |ms: f64| {
            Some(Latency {
                median: ms,
                p90: ms,
                p99: ms,
                runs: 10,
                ..Default::default()
            })
        };
        let row = |p: Precision, simulated: bool, b1: f64, b8: f64| Row {
            precision: Some(p),
            method: (p == Precision::Int8).then_some(Method::Max),
            backend: "cuda".into(),
            simulated,
            latency_ms: lat(b1),
            latency_batch_ms: lat(b8),
            batch: Some(8),
            ..Default::default()
        };
        let fp16 = row(Precision::Fp16, false, 0.403, 1.039);
        let notes =
            slower_quantized_notes(&[fp16.clone(), row(Precision::Int8, false, 0.425, 1.181)]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("int8 max on cuda ran slower than FP16: 0.425 against 0.403 ms at batch 1, 1.181 against 1.039 ms at batch 8."), "{}", notes[0]);
        // Faster, or within 2 %: nothing said.
        let faster = row(Precision::Int8, false, 0.30, 1.04);
        assert!(slower_quantized_notes(&[fp16.clone(), faster]).is_empty());
        // A simulated FP16 (the CPU's) is no measure of a device's.
        let cpu = row(Precision::Fp16, true, 0.1, 0.5);
        assert!(slower_quantized_notes(&[cpu, row(Precision::Int8, false, 9.0, 9.0)]).is_empty());
        // FP8 is held to the same rule; a simulated FP8 (the CPU's) is not.
        let fp8 = row(Precision::Fp8, false, 0.64, 2.1);
        let notes = slower_quantized_notes(&[fp16.clone(), fp8]);
        assert!(
            notes.len() == 1 && notes[0].starts_with("fp8 on cuda"),
            "{notes:?}"
        );
        let sim = row(Precision::Fp8, true, 9.0, 9.0);
        assert!(slower_quantized_notes(&[fp16, sim]).is_empty());
    }

    /// A lead on a few images is a tie; a lead on every image is not.
    #[test]
    fn the_best_int8_row_is_named_with_its_noise() {
        let row = |m: Method, per_image: Vec<f64>| Row {
            precision: Some(Precision::Int8),
            method: Some(m),
            miou: Some(per_image.iter().sum::<f64>() / per_image.len() as f64),
            per_image,
            ..Default::default()
        };
        // max ahead by 1 pt on average, all of it from 2 of 20 images.
        let base: Vec<f64> = (0..20).map(|i| 0.3 + 0.01 * i as f64).collect();
        let lucky: Vec<f64> = base
            .iter()
            .enumerate()
            .map(|(i, v)| if i < 2 { v + 0.1 } else { *v })
            .collect();
        let note = int8_ranking_note(&[row(Method::Mse, base.clone()), row(Method::Max, lucky)])
            .expect("two INT8 rows");
        assert!(note.starts_with("best INT8 row: int8 max"), "{note}");
        assert!(note.contains("treat them as tied"), "{note}");
        // 1 pt ahead on every image: real.
        let steady: Vec<f64> = base.iter().map(|v| v + 0.01).collect();
        let note = int8_ranking_note(&[row(Method::Mse, base.clone()), row(Method::Max, steady)])
            .expect("two INT8 rows");
        assert!(note.contains("beyond the noise of the 20"), "{note}");
        assert!(int8_ranking_note(&[row(Method::Max, base)]).is_none());
    }
}
