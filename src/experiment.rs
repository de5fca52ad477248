//! `Experiment`: what to run, saved as human-readable RON. The CLI and the GUI both describe
//! their work as one and hand it to the same pipeline. Missing fields take defaults, so older
//! files open; unknown (misspelt) fields are refused with their position and the nearest known
//! name, since a setting silently ignored is a setting the user believes changed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::{BackendKind, Precision};
use crate::bench::BenchSpec;
use crate::calib::Method;
use crate::data::{Preprocess, Selection};
use crate::model::Task;

pub const EXPERIMENT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("{path}: cannot read")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid experiment: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{path}: cannot write: {reason}")]
    Write { path: PathBuf, reason: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TaskChoice {
    /// From the model's output shape (and the evaluation folder's layout).
    #[default]
    Auto,
    Classification,
    Segmentation,
}

impl TaskChoice {
    pub fn fixed(self) -> Option<Task> {
        match self {
            TaskChoice::Auto => None,
            TaskChoice::Classification => Some(Task::Classification),
            TaskChoice::Segmentation => Some(Task::Segmentation),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct CalibSpec {
    /// Folder of calibration images, searched recursively.
    pub dir: Option<PathBuf>,
    pub select: Selection,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// ImageFolder (`<class>/<image>`) or `images/` + `masks/` folder.
    pub dir: Option<PathBuf>,
    pub task: TaskChoice,
    /// Evaluate on at most this many images (balanced over classes for ImageFolder).
    pub count: Option<usize>,
    /// Leave out images that are also calibration images.
    pub skip_calibration_images: bool,
    /// Class names, one per line, in model output order (default: `labels.txt` in `dir`, or
    /// the ImageFolder's folder names).
    pub labels: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    pub report_json: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// Classifiers: every engine's confusion matrix against FP32's, as CSV (long form).
    pub confusion_csv: Option<PathBuf>,
    /// Classifiers: the images each engine flips against FP32, with top-3s, as CSV.
    pub gallery_csv: Option<PathBuf>,
    /// Writes `<model>_int8_<method>.onnx` and `.cache` (TensorRT calibration cache) here.
    pub qdq_dir: Option<PathBuf>,
    /// Which models go into `qdq_dir`: INT8 Q/DQ + cache, strongly typed FP16, mixed INT8/FP16.
    pub export_precisions: Vec<crate::export::ExportPrecision>,
    /// Writes mask overlays of the first `mask_count` images here.
    pub masks_dir: Option<PathBuf>,
    pub mask_count: usize,
}

impl OutputSpec {
    /// The report files asked for (JSON, Markdown, CSV, confusion and gallery CSV), in that
    /// order.
    pub fn report_files(&self) -> impl Iterator<Item = &PathBuf> {
        [
            &self.report_json,
            &self.markdown,
            &self.csv,
            &self.confusion_csv,
            &self.gallery_csv,
        ]
        .into_iter()
        .flatten()
    }
}

impl Default for OutputSpec {
    fn default() -> Self {
        OutputSpec {
            report_json: None,
            markdown: None,
            csv: None,
            confusion_csv: None,
            gallery_csv: None,
            qdq_dir: None,
            export_precisions: vec![crate::export::ExportPrecision::Int8],
            masks_dir: None,
            mask_count: 8,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub version: u32,
    pub name: String,
    pub model: PathBuf,
    pub calibration: CalibSpec,
    pub evaluation: EvalSpec,
    pub preprocess: Preprocess,
    pub methods: Vec<Method>,
    /// p for the percentile method.
    pub percentile: f64,
    pub precisions: Vec<Precision>,
    pub backend: BackendKind,
    /// How the GPU's FP32 engines compute: TF32 tensor cores (default, as PyTorch and
    /// TensorRT) or strict FP32 (`--fp32-math`). The CPU's FP32 is always strict.
    pub fp32_math: crate::backend::Fp32Math,
    /// How hard the GPU builder searches each conv's implementation (`--build-effort`):
    /// fast (untimed, by rule), default (timed once per conv shape) or exhaustive.
    pub build_effort: crate::backend::BuildEffort,
    /// INT8 on the GPU: where a region of the INT8 engine runs slower than the same layers in
    /// FP16, the builder times an engine with that region in FP16 and keeps the faster, and
    /// where that still loses, FP16 throughout (`--fp16-regions`, on by default;
    /// [`crate::fp16_regions`]).
    pub fp16_regions: bool,
    pub bench: BenchSpec,
    /// Threads the CPU engines (and the calibration and layer passes) use; 0 = every core.
    pub threads: usize,
    /// Which CPU engine runs the CPU rows and the statistics passes: auto (ONNX Runtime where
    /// its library is found, else tract), ort (or an error) or tract (`--cpu-engine`).
    pub cpu_engine: crate::backend::cpu::CpuEngineChoice,
    /// Node names or op types kept in float in the INT8 engines.
    pub exclude: Vec<String>,
    /// Empirical bias correction: shift each quantized layer's float bias so its output keeps
    /// the FP32 mean per channel, measured in the whole quantized model (full, the default) or
    /// per layer where that is clearly closer to FP32 (the Q/DQ model stays TensorRT-ready:
    /// biases are float). On by default (the best recipe, [`crate::prepare::Recipe`]).
    pub bias_correction: bool,
    /// Cross-layer equalization of the model the INT8 engines are built from (the FP32 rows
    /// keep the original): auto, on or off (`--cle`).
    pub cle: crate::prepare::cle::CleSetting,
    /// What CLE does with a Clip (ReLU6) between two convs: rewrite it per channel (exact) or
    /// skip the pair.
    pub cle_clip: crate::prepare::cle::ClipPolicy,
    /// How CLE picks each channel's scale: from the calibration images' activation ranges
    /// (default) or from weight ranges only (the paper's data-free rule).
    pub cle_scales: crate::prepare::cle::ScaleRule,
    /// Activation centering of the model the INT8 engines are built from: non-negative
    /// activations read by unpadded or depthwise convs shifted by half their range, so symmetric
    /// int8 uses all its steps on them (`--center-activations`; exact in float, padded
    /// depthwise readers through a Pad).
    pub center: crate::prepare::center::CenterSetting,
    /// How the INT8 engines' weights are rounded: nearest, or GPTQ (`--weight-rounding`; GPTQ
    /// by default, the best recipe).
    pub weight_rounding: crate::prepare::gptq::WeightRounding,
    /// GPTQ and bias correction measure each layer on the first this-many calibration images
    /// (`--correction-images`).
    pub correction_images: usize,
    /// A mixed-precision plan (from `quantscope sensitivity` or `--budget-*`): built as one
    /// more INT8 engine next to the plain ones.
    pub mixed_precision: Option<MixedPrecision>,
    pub output: OutputSpec,
}

/// Layers kept in float on top of `exclude`, and the calibration that goes with them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct MixedPrecision {
    pub keep_float: Vec<String>,
    pub method: Option<Method>,
    /// Per activation tensor, a method overriding `method` (a per-tensor choice).
    pub per_tensor: std::collections::BTreeMap<String, Method>,
    /// The accuracy budget the plan was searched for (`--budget-*`, the Layers tab): the
    /// mixed row is checked against it on the evaluation images, and says whether it holds.
    pub budget: Option<Budget>,
}

/// An accuracy budget against FP32, for automatic mixed precision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Budget {
    /// At most this many points of top-1 lost (0.5 = half a percentage point).
    Top1Points(f64),
    /// At most this relative mIoU loss, in percent (1 = keep 99 % of FP32's mIoU).
    MiouRelativePercent(f64),
}

impl Budget {
    /// The least metric (top-1 or mIoU as a fraction) within budget of `fp32`.
    pub fn target(&self, fp32: f64) -> f64 {
        match *self {
            Budget::Top1Points(pt) => fp32 - pt / 100.0,
            Budget::MiouRelativePercent(pct) => fp32 * (1.0 - pct / 100.0),
        }
    }

    /// Whether `metric` (top-1 or mIoU as a fraction) is within budget of `fp32`: at least
    /// [`Budget::target`], give or take float rounding (a top-1 of 47/50 against a target
    /// of 0.94 computed as 0.95 - 0.01 must count as met).
    pub fn met(&self, fp32: f64, metric: f64) -> bool {
        metric >= self.target(fp32) - 1e-9
    }

    pub fn describe(&self) -> String {
        match *self {
            Budget::Top1Points(pt) => format!("at most {pt} pt top-1 below FP32"),
            Budget::MiouRelativePercent(p) => format!("at most {p} % relative mIoU below FP32"),
        }
    }
}

impl Default for Experiment {
    fn default() -> Self {
        Experiment {
            version: EXPERIMENT_VERSION,
            name: String::new(),
            model: PathBuf::new(),
            calibration: CalibSpec::default(),
            evaluation: EvalSpec::default(),
            preprocess: Preprocess::default(),
            methods: Method::ALL.to_vec(),
            percentile: 99.99,
            // FP16 on the CPU is a simulation that costs many times FP32: opt in.
            precisions: vec![Precision::Fp32, Precision::Int8],
            backend: BackendKind::Cpu,
            fp32_math: Default::default(),
            build_effort: Default::default(),
            fp16_regions: true,
            bench: BenchSpec::default(),
            threads: 0,
            cpu_engine: Default::default(),
            exclude: vec![],
            // The best recipe (GPTQ + bias correction) unless a user asks for the fast one.
            bias_correction: true,
            cle: Default::default(),
            cle_clip: Default::default(),
            cle_scales: Default::default(),
            center: Default::default(),
            weight_rounding: crate::prepare::gptq::WeightRounding::Gptq,
            correction_images: 32,
            mixed_precision: None,
            output: OutputSpec::default(),
        }
    }
}

/// A RON error in words: where it is, and for a misspelt field the nearest known one.
fn parse_error(e: &ron::error::SpannedError) -> String {
    let at = format!("line {}, column {}", e.span.start.line, e.span.start.col);
    match &e.code {
        ron::Error::NoSuchStructField {
            expected,
            found,
            outer,
        } => {
            let within = outer
                .as_ref()
                .map(|o| format!(" in `{o}`"))
                .unwrap_or_default();
            let nearest = expected
                .iter()
                .map(|k| (strsim::jaro_winkler(k, found), k))
                .filter(|(score, _)| *score > 0.8)
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, k)| format!(" did you mean `{k}`?"))
                .unwrap_or_default();
            format!(
                "{at}: unknown field `{found}`{within};{nearest} The fields here are: {}",
                expected.join(", ")
            )
        }
        code => format!("{at}: {code}"),
    }
}

fn resolve(base: &Path, p: &mut PathBuf) {
    if !p.as_os_str().is_empty() && p.is_relative() {
        *p = base.join(&*p);
    }
}

impl Experiment {
    /// Reads a `.ron` file; relative paths in it are taken relative to the file's folder.
    pub fn load(path: &Path) -> Result<Experiment, ExperimentError> {
        let read_err = |source| ExperimentError::Read {
            path: path.into(),
            source,
        };
        let bytes = crate::files::read_input(path, 16 << 20).map_err(read_err)?;
        let text = String::from_utf8(bytes).map_err(|_| ExperimentError::Parse {
            path: path.into(),
            reason: "not UTF-8 text".into(),
        })?;
        let mut e = Self::from_ron(&text).map_err(|reason| ExperimentError::Parse {
            path: path.into(),
            reason,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        e.resolve_paths(base);
        Ok(e)
    }

    /// Parses an experiment; a file from a newer quantscope (a higher `version`) is refused
    /// rather than run with fields it would silently ignore.
    pub fn from_ron(text: &str) -> Result<Experiment, String> {
        let e: Experiment = ron::from_str(text).map_err(|e| parse_error(&e))?;
        if e.version == 0 || e.version > EXPERIMENT_VERSION {
            return Err(format!(
                "version {} is not one this quantscope reads (it reads version 1 to {EXPERIMENT_VERSION}); \
                 it was written by another quantscope: upgrade, or re-create the experiment",
                e.version
            ));
        }
        Ok(e)
    }

    /// The class-name file in force: the experiment's own, else `<model>.labels.txt` beside
    /// the model (the convention of the bundled samples and of many model zoos).
    pub fn labels_file(&self) -> Option<PathBuf> {
        self.evaluation.labels.clone().or_else(|| {
            let stem = self.model.file_stem()?.to_str()?;
            let beside = self.model.with_file_name(format!("{stem}.labels.txt"));
            beside.is_file().then_some(beside)
        })
    }

    /// Checks every setting that does not need the model: preprocessing values, the percentile,
    /// timing and selection settings, budgets. The message names the setting and its CLI flag.
    pub fn validate(&self) -> Result<(), String> {
        self.preprocess.validate()?;
        self.calibration.select.validate()?;
        if !(self.percentile > 0.0 && self.percentile <= 100.0) {
            return Err(format!(
                "percentile {} must be in (0, 100] (--percentile; 99.99 is usual)",
                self.percentile
            ));
        }
        self.bench.validate()?;
        if self.correction_images == 0 {
            return Err(
                "--correction-images must be ≥ 1 (GPTQ and bias correction measure layers on that many calibration images; 32 is the default)".into(),
            );
        }
        if self.threads > 1024 {
            return Err(format!(
                "{} threads is more than this machine can start (--threads; 0 uses every core)",
                self.threads
            ));
        }
        if self.evaluation.count == Some(0) {
            return Err("the evaluation image count must be ≥ 1 (--eval-count)".into());
        }
        if self.precisions.is_empty() {
            return Err(
                "no precision to build: name at least one (--precisions fp32,fp16,int8)".into(),
            );
        }
        if self.precisions.contains(&Precision::Int8)
            && self.methods.is_empty()
            && self.mixed_precision.is_none()
        {
            return Err(
                "INT8 needs at least one calibration method (--methods max,percentile,mse,entropy)"
                    .into(),
            );
        }
        Ok(())
    }

    pub fn to_ron(&self) -> String {
        let cfg = ron::ser::PrettyConfig::new().struct_names(true);
        ron::ser::to_string_pretty(self, cfg).unwrap_or_default()
    }

    /// Writes the experiment. Relative paths (taken relative to the working directory, as
    /// the CLI gives them) are made absolute, since `load` reads them relative to the file.
    pub fn save(&self, path: &Path) -> Result<(), ExperimentError> {
        let mut e = self.clone();
        if let Ok(cwd) = std::env::current_dir() {
            e.resolve_paths(&cwd);
        }
        crate::files::write(path, e.to_ron()).map_err(|e| ExperimentError::Write {
            path: path.into(),
            reason: e.to_string(),
        })
    }

    pub fn resolve_paths(&mut self, base: &Path) {
        resolve(base, &mut self.model);
        for p in [
            &mut self.calibration.dir,
            &mut self.evaluation.dir,
            &mut self.evaluation.labels,
            &mut self.output.report_json,
            &mut self.output.markdown,
            &mut self.output.csv,
            &mut self.output.qdq_dir,
            &mut self.output.masks_dir,
        ]
        .into_iter()
        .flatten()
        {
            resolve(base, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ron_round_trip_missing_and_unknown_fields() {
        let mut e = Experiment {
            name: "x".into(),
            ..Default::default()
        };
        e.model = "m.onnx".into();
        let text = e.to_ron();
        assert_eq!(Experiment::from_ron(&text).ok(), Some(e));
        // Missing fields take their defaults (older files open)...
        let older = "(version: 1, model: \"a.onnx\")";
        let parsed = Experiment::from_ron(older).expect("missing fields default");
        assert_eq!(parsed.model, PathBuf::from("a.onnx"));
        assert_eq!(parsed.percentile, 99.99);
        // ...but a field nobody reads is refused: a misspelt setting would be ignored.
        let typo = "(version: 1, model: \"a.onnx\", percentil: 99.9)";
        let e = Experiment::from_ron(typo).unwrap_err();
        assert!(
            e.contains("line 1") && e.contains("did you mean `percentile`"),
            "{e}"
        );
    }

    #[test]
    fn newer_versions_and_bad_settings_are_refused() {
        let e = Experiment::from_ron("(version: 99, model: \"a.onnx\")").unwrap_err();
        assert!(e.contains("version 99"), "{e}");
        let mut x = Experiment::default();
        assert_eq!(x.validate(), Ok(()));
        x.percentile = 150.0;
        assert!(x.validate().unwrap_err().contains("--percentile"));
        x.percentile = 99.9;
        x.bench.min_runs = 0;
        assert!(x.validate().unwrap_err().contains("--min-runs"));
    }

    #[test]
    fn saved_relative_paths_reload_from_anywhere() {
        let dir = std::env::temp_dir().join(format!("qs-exp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let e = Experiment {
            model: "models/m.onnx".into(),
            ..Default::default()
        };
        let file = dir.join("e.ron");
        e.save(&file).expect("save");
        let back = Experiment::load(&file).expect("load");
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(
            back.model,
            cwd.join("models/m.onnx"),
            "relative to where the CLI ran, not to the file"
        );
    }
}
