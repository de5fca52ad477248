//! The command line's flags: clap's `Cli`, each command's arguments, and how they become an
//! [`Experiment`] (an experiment file first, the flags on top).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::backend::{BackendKind, Precision};
use crate::calib::Method;
use crate::data::{ChannelOrder, Interpolation, Normalize, Preset, ResizeMode, Selection};
use crate::experiment::{Experiment, TaskChoice};

const EXIT_CODES_HELP: &str = "Exit codes:
  0    every requested engine produced its row and every output was written
  1    quantscope itself failed (a bug; please report it)
  2    bad input, refused before any engine ran (flag, model, data or experiment file)
  3    some engines failed (their rows carry the error) or output NaN/Inf (their metrics are
       void and say so); the other rows are in the report
       (inspect --backend cuda: some nodes cannot be built by that backend)
  4    an output (report, experiment, Q/DQ export, mask overlays) could not be written
  130  interrupted (Ctrl-C); the finished rows were written, marked incomplete";

#[derive(Parser, Debug)]
#[command(
    name = "quantscope",
    version,
    about = "Calibrate, quantize and compare FP32 / FP16 / INT8 engines for ONNX vision models",
    long_about = "quantscope calibrates an ONNX image model (max, percentile, MSE or entropy), writes a \
TensorRT-ready Q/DQ ONNX model and calibration cache, builds FP32, FP16 and INT8 engines on the CPU \
(ONNX Runtime, or tract where it is not installed) or an NVIDIA GPU (cuda), and compares their accuracy or mIoU, agreement with FP32, SQNR, \
latency and memory.\n\nWith no command it opens the desktop workbench on the bundled segmentation sample.",
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a model's inputs, outputs, op census, parameters and detected task.
    Inspect {
        model: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also list, per precision, the nodes this backend cannot take (no GPU needed: it
        /// plans the engine without building it). `cpu` runs every op tract runs.
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
        /// Input size for `--backend`, HxW (default: the model's own, else 224x224).
        #[arg(long, value_parser = parse_hw)]
        size: Option<[usize; 2]>,
    },
    /// Run an experiment file (.ron), as saved by the app or `eval --save-experiment`.
    Run {
        experiment: PathBuf,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Calibrate, build and compare engines, with everything given as flags.
    Eval(Box<EvalArgs>),
    /// Per-layer sensitivity: which layers INT8 hurts (SQNR, then the task metric), measured on
    /// the model the INT8 engines are built from (the same recipe), and with --budget-top1 /
    /// --budget-miou-rel the fewest layers to keep in float to meet a budget.
    Sensitivity(Box<SensitivityArgs>),
    /// Open the desktop workbench on an experiment (.ron) or a model (.onnx).
    Gui { path: Option<PathBuf> },
}

#[derive(Args, Debug, Default)]
pub struct OutputArgs {
    /// Write the JSON report here; `-` writes it to stdout (the table then goes to stderr).
    /// A FIFO or a device such as /dev/null is written through, never replaced.
    #[arg(long, value_name = "OUT.json")]
    pub report: Option<PathBuf>,
    /// Write a Markdown table here (`-`: stdout).
    #[arg(long, value_name = "OUT.md")]
    pub md: Option<PathBuf>,
    /// Write a CSV table here (`-`: stdout).
    #[arg(long, value_name = "OUT.csv")]
    pub csv: Option<PathBuf>,
    /// Classifiers: write every engine's confusion matrix here as CSV, one line per cell
    /// (engine, true class, predicted class, images, FP32's images, difference).
    #[arg(long, value_name = "OUT.csv")]
    pub confusion_csv: Option<PathBuf>,
    /// Classifiers: write the images each engine flips against FP32 (right to wrong and the
    /// reverse) here as CSV, with the true class's probability and each top-3.
    #[arg(long, value_name = "OUT.csv")]
    pub gallery_csv: Option<PathBuf>,
    /// Write each method's Q/DQ ONNX model and TensorRT calibration cache to this folder.
    #[arg(long, value_name = "DIR")]
    pub export_qdq: Option<PathBuf>,
    /// Write deployable models to this folder, each with its ready trtexec line in the report:
    /// the strongly typed FP16 model, each method's INT8 Q/DQ model + calibration cache, the
    /// mixed INT8/FP16 model, and the FP8 Q/DQ model when `--precisions` has fp8
    /// (`--export-precisions` picks; `--export-qdq` writes INT8 only).
    #[arg(long, value_name = "DIR", conflicts_with = "export_qdq")]
    pub export: Option<PathBuf>,
    /// Which models `--export` / `--export-qdq` write: fp16, int8, mixed, fp8 (comma-separated).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub export_precisions: Option<Vec<crate::export::ExportPrecision>>,
    /// Write mask overlays (image, FP32, each INT8 engine, disagreement) to this folder.
    #[arg(long, value_name = "DIR")]
    pub save_masks: Option<PathBuf>,
    /// How many images get mask overlays.
    #[arg(long, default_value_t = 8)]
    pub mask_count: usize,
    /// Cap the number of evaluation images.
    #[arg(long)]
    pub eval_count: Option<usize>,
    /// Backend: cpu (ONNX Runtime where it is found, else tract: runs everywhere) or cuda
    /// (NVIDIA GPU; the calibration statistics pass then runs on the GPU too, in strict FP32,
    /// sharing the statistics cache with CPU runs).
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// How the GPU's FP32 engines compute: tf32 (TF32 tensor cores on compute capability 8.0+,
    /// as PyTorch's cuDNN convolutions and TensorRT do; the row reads `fp32 (tf32)`) or strict
    /// (IEEE FP32, what the CPU computes) [default: tf32]. The CPU backend is always strict.
    #[arg(long, value_enum)]
    pub fp32_math: Option<crate::backend::Fp32Math>,
    /// How hard the GPU builder searches each conv's implementation, as TensorRT's builder
    /// optimization level: fast (nothing timed: each conv takes the first implementation a
    /// fixed order offers, cuDNN's heuristic pick where cuDNN runs it; on an H200 ResNet-50
    /// built in 1-2.3 s instead of 4.4-6.2 s, and ran 1.08-1.10x slower), default (every
    /// candidate timed once per conv shape; a conv shaped like one already timed takes its
    /// choice) or exhaustive (every candidate of every conv timed) [default: default]. Timed
    /// choices are cached per model, GPU, precision, batch and size, so a second build of the
    /// same engine skips the timing (fast and default; exhaustive ignores the cache). The CPU
    /// backend has nothing to search.
    #[arg(long, value_enum)]
    pub build_effort: Option<crate::backend::BuildEffort>,
    /// INT8 on the GPU: where a run of the INT8 engine's layers is slower in the run than the
    /// same layers in FP16 (the FP16 row's per-layer times, or an FP16 engine built to get
    /// them), and the INT8 engine is not already under 0.9x FP16's time, the builder builds
    /// and times an engine with those layers in FP16 (float at the region's edges, no Q/DQ
    /// inside) and keeps the faster one, per batch size. Where that is still slower than
    /// FP16, the whole network is the region: the FP16 engine is built and kept if faster
    /// (the row then computes FP16's values). The Layers tab and the report name the regions;
    /// each candidate adds a build [default: on]. Off: every quantized layer runs in INT8.
    #[arg(long, value_enum, value_name = "on|off")]
    pub fp16_regions: Option<OnOffArg>,
    /// Threads for the CPU engines and the calibration passes [default: every core]. An engine
    /// that runs faster on one thread (timed when it is built; tract threads small int8
    /// products at a loss) keeps one; each row says the threads it ran on.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// CPU engine for the CPU rows and every statistics pass (calibration, GPTQ, bias
    /// correction, sensitivity): auto = ONNX Runtime where its library is found (ORT_DYLIB_PATH,
    /// the `onnxruntime` Python package, system paths), else tract; ort = ONNX Runtime or an
    /// error (exit 2); tract = the built-in engine, 2-7x slower [default: auto].
    /// `pip install onnxruntime` enables the fast engine.
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub cpu_engine: Option<crate::backend::cpu::CpuEngineChoice>,
}

fn parse_triplet(s: &str) -> Result<[f32; 3], String> {
    let v: Vec<f32> = s
        .split(',')
        .map(|x| x.trim().parse::<f32>().map_err(|e| format!("`{x}`: {e}")))
        .collect::<Result<_, _>>()?;
    match v.as_slice() {
        [a] => Ok([*a; 3]),
        [a, b, c] => Ok([*a, *b, *c]),
        _ => Err("expected one value or three comma-separated values".into()),
    }
}

fn parse_hw(s: &str) -> Result<[usize; 2], String> {
    let v: Vec<usize> = s
        .split([',', 'x'])
        .map(|x| x.trim().parse::<usize>().map_err(|e| format!("`{x}`: {e}")))
        .collect::<Result<_, _>>()?;
    match v.as_slice() {
        [a] => Ok([*a, *a]),
        [h, w] => Ok([*h, *w]),
        _ => Err("expected H,W".into()),
    }
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The ONNX model.
    #[arg(long)]
    pub model: PathBuf,
    /// Folder of calibration images (searched recursively).
    #[arg(long, value_name = "DIR")]
    pub calib: Option<PathBuf>,
    /// Evaluation set: ImageFolder (<class>/<image>) or images/ + masks/.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    pub task: TaskArg,
    /// Calibration methods, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "max,percentile,mse,entropy"
    )]
    pub methods: Vec<Method>,
    /// p for the percentile method.
    #[arg(long, default_value_t = 99.99)]
    pub percentile: f64,
    /// Precisions, comma separated: fp32, fp16, int8, fp8 [default: fp32,int8 on the CPU,
    /// where FP16 and FP8 give their numerics simulated (accuracy is real, latency is not such
    /// a device's); fp32,fp16,int8 on cuda]. fp8 is E4M3 (amax / 448 from max calibration,
    /// weights per channel): on cuda it needs compute capability 8.9 or newer.
    #[arg(long, value_delimiter = ',')]
    pub precisions: Option<Vec<Precision>>,
    /// Use the first N calibration images (sorted by path).
    #[arg(long)]
    pub calib_count: Option<usize>,
    /// Use every k-th calibration image instead.
    #[arg(long, conflicts_with = "calib_count")]
    pub calib_every: Option<usize>,
    /// Leave calibration images out of the evaluation.
    #[arg(long)]
    pub eval_skip_calib: bool,
    /// Class names, one per line, in model output order.
    #[arg(long, value_name = "FILE")]
    pub labels: Option<PathBuf>,
    /// Preprocessing convention; sets resize, crop, interpolation, channel order and
    /// normalisation (flags given with it override its fields).
    #[arg(long, value_enum)]
    pub preset: Option<PresetArg>,
    /// stretch: resize to the input size; crop: resize the short side, cut the centre;
    /// letterbox: keep the aspect, pad [default: stretch, crop with --crop-pct/--resize-short,
    /// or the preset's].
    #[arg(long, value_enum)]
    pub resize: Option<ResizeArg>,
    /// Crop: share of the resized image the centre crop keeps (timm's crop_pct): the short
    /// side goes to floor(input / crop_pct), so 0.875 at 224 is 256 → 224 [default: 1].
    #[arg(long, value_name = "RATIO")]
    pub crop_pct: Option<f64>,
    /// Crop: resize the short side to this many pixels, then cut the input size from the
    /// centre (torchvision's Resize(N) + CenterCrop).
    #[arg(long, value_name = "PX", conflicts_with = "crop_pct")]
    pub resize_short: Option<usize>,
    /// Resampling filter [default: bilinear, or the preset's].
    #[arg(long, value_enum)]
    pub interpolation: Option<InterpolationArg>,
    /// Letterbox: raw 0..255 value of the padding [default: 114, as ultralytics].
    #[arg(long, value_name = "0..255")]
    pub pad_value: Option<u8>,
    /// Input height,width when the model's is dynamic.
    #[arg(long, value_parser = parse_hw)]
    pub size: Option<[usize; 2]>,
    /// Per-channel mean for (x/255 - mean)/std. Without --mean/--std, --scale or --preset,
    /// the normalisation comes from the model's metadata (mean/std, image_mean/image_std),
    /// else ImageNet mean/std is assumed; the run says which.
    #[arg(long, value_parser = parse_triplet, requires = "std", allow_hyphen_values = true)]
    pub mean: Option<[f32; 3]>,
    #[arg(long, value_parser = parse_triplet, requires = "mean")]
    pub std: Option<[f32; 3]>,
    /// x*scale + offset on raw 0..255 values (--scale 1 --offset 0 keeps raw pixels).
    #[arg(long, conflicts_with_all = ["mean", "std"])]
    pub scale: Option<f32>,
    #[arg(long, requires = "scale", allow_hyphen_values = true)]
    pub offset: Option<f32>,
    /// Feed channels as BGR.
    #[arg(long)]
    pub bgr: bool,
    /// The INT8 preparation: best (GPTQ weight rounding + bias correction, the most accurate
    /// measured; on DeepLabV3 it adds about 1 minute on 2 cores) or fast (calibration only).
    /// --weight-rounding and --bias-correction override its parts.
    #[arg(long, value_enum, default_value_t = RecipeArg::Best)]
    pub recipe: RecipeArg,
    /// Empirical bias correction of the INT8 engines (on in the best recipe): float biases
    /// absorb each layer's mean shift, measured in the whole quantized model (full, as NNCF) or
    /// per layer, or none; full unless another brings the output closer to FP32 on the
    /// calibration images by more than the noise margin (2 standard errors over the images,
    /// at least 2 dB). The log says which, the SQNR of each and the margin. Given alone, on.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on", value_name = "on|off")]
    pub bias_correction: Option<OnOffArg>,
    /// Cross-layer equalization of the model the INT8 engines are built from (FP32 rows keep
    /// the original); auto = on where a depthwise conv is in a pair with no Clip (ReLU6) between.
    #[arg(long, value_enum, default_value_t = CleArg::Auto)]
    pub cle: CleArg,
    /// How CLE picks channel scales: activations (calibration images' per-channel ranges) or
    /// weights (the paper's data-free rule).
    #[arg(long, value_enum, default_value_t = CleScalesArg::Activations)]
    pub cle_scales: CleScalesArg,
    /// What CLE does with a Clip (ReLU6) between two convs: per-channel (rewrite it as
    /// per-channel Max/Min, exact) or skip (leave such pairs alone).
    #[arg(long, value_enum, default_value_t = CleClipArg::PerChannel)]
    pub cle_clip: CleClipArg,
    /// Activation centering of the model the INT8 engines are built from: each ReLU/ReLU6
    /// output read only by unpadded or depthwise convs is shifted by half its calibration
    /// range, so symmetric int8 spends all 255 steps on it instead of 128 (exact in float: the
    /// convs' biases absorb the shift, and a depthwise conv with zero padding reads a Pad node
    /// that pads with minus the shift, which the engines fold back into the conv; FP32 rows
    /// keep the original). off = quantize them as they are.
    #[arg(long, value_enum, default_value_t = CenterArg::On)]
    pub center_activations: CenterArg,
    /// How the INT8 engines' weights are rounded: nearest (each weight to its nearest int8
    /// step), or gptq (GPTQ: rounded together so each layer's output on the calibration images
    /// stays closest to FP32; same scales, same Q/DQ format; best with --bias-correction)
    /// [default: the recipe's: gptq in best, nearest in fast].
    #[arg(long, value_enum)]
    pub weight_rounding: Option<WeightRoundingArg>,
    /// GPTQ and bias correction measure each layer on the first N calibration images (the
    /// ranges use them all; the report says how many). More images cost time in proportion.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub correction_images: usize,
    /// Node names or op types to keep in float in the INT8 engines.
    #[arg(long, value_delimiter = ',')]
    pub exclude: Vec<String>,
    /// Timed runs: at least this many ...
    #[arg(long, default_value_t = 10)]
    pub min_runs: usize,
    /// ... and at least this long (ms).
    #[arg(long, default_value_t = 1000.0)]
    pub min_time_ms: f64,
    /// Then keep timing until the median is known to ±2 % (its 95 % confidence interval), or
    /// --max-time-ms has passed: for a busy machine. The report gives each row's interval.
    #[arg(long)]
    pub until_stable: bool,
    /// The most time --until-stable spends timing one engine (ms).
    #[arg(long, default_value_t = 20_000.0)]
    pub max_time_ms: f64,
    /// Batch size for the throughput measurement (1 = skip).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Also save the equivalent experiment file (with the mixed-precision plan, if any).
    #[arg(long, value_name = "FILE.ron")]
    pub save_experiment: Option<PathBuf>,
    /// Automatic mixed precision: keep the fewest layers in float so that top-1 drops by at
    /// most this many points against FP32; adds that engine to the report, whose note says
    /// whether it meets the budget on the evaluation images (JSON: the row's `budget`).
    #[arg(long, value_name = "POINTS", conflicts_with = "budget_miou_rel")]
    pub budget_top1: Option<f64>,
    /// Automatic mixed precision with a relative mIoU budget in percent (1 = keep 99 %); the
    /// mixed row says whether it holds, as with --budget-top1.
    #[arg(long, value_name = "PERCENT")]
    pub budget_miou_rel: Option<f64>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Args, Debug)]
pub struct SensitivityArgs {
    #[command(flatten)]
    pub eval: EvalArgs,
    /// Layers (lowest SQNR first) whose effect on the metric is measured (0 = every layer).
    #[arg(long, default_value_t = 8)]
    pub candidates: usize,
    /// Calibration images used as the SQNR probe set.
    #[arg(long, default_value_t = 32)]
    pub probe_images: usize,
    /// Evaluation images used to rank candidates (budgets are checked on all of them).
    #[arg(long, default_value_t = 128)]
    pub probe_eval_images: usize,
    /// Use this calibration method only (default: try all four and a per-tensor choice).
    #[arg(long)]
    pub method: Option<Method>,
}

impl EvalArgs {
    /// Refuses preprocessing flags that the chosen resize mode would silently ignore.
    pub fn check_preprocess_flags(&self) -> Result<()> {
        let mode = self.resize.filter(|r| *r != ResizeArg::Crop);
        let crop_flag = match (self.crop_pct, self.resize_short) {
            (Some(_), _) => Some("--crop-pct"),
            (None, Some(_)) => Some("--resize-short"),
            _ => None,
        };
        if let (Some(mode), Some(flag)) = (mode, crop_flag) {
            anyhow::bail!(
                "{flag} applies to --resize crop, but --resize is {}; drop one of them",
                format!("{mode:?}").to_lowercase()
            );
        }
        if self.pad_value.is_some() && self.resize.is_some_and(|r| r != ResizeArg::Letterbox) {
            anyhow::bail!(
                "--pad-value applies to --resize letterbox only; drop it or use letterbox"
            );
        }
        for (flag, v) in [
            ("--budget-top1", self.budget_top1),
            ("--budget-miou-rel", self.budget_miou_rel),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && (0.0..=100.0).contains(&v))
            {
                anyhow::bail!(
                    "{flag}: {v} is not a budget; give points between 0 and 100 (1 is usual)"
                );
            }
        }
        Ok(())
    }

    pub fn budget(&self) -> Option<crate::sensitivity::Budget> {
        use crate::sensitivity::Budget;
        self.budget_top1
            .map(Budget::Top1Points)
            .or(self.budget_miou_rel.map(Budget::MiouRelativePercent))
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum TaskArg {
    #[default]
    Auto,
    Classification,
    Segmentation,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum CenterArg {
    #[default]
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum WeightRoundingArg {
    #[default]
    Nearest,
    Gptq,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecipeArg {
    /// Calibration only: nearest weight rounding, no bias correction.
    Fast,
    /// GPTQ weight rounding + bias correction.
    #[default]
    Best,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOffArg {
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum CleClipArg {
    #[default]
    PerChannel,
    Skip,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum CleScalesArg {
    #[default]
    Activations,
    Weights,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum CleArg {
    #[default]
    Auto,
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResizeArg {
    #[default]
    Stretch,
    Crop,
    Letterbox,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum InterpolationArg {
    /// Pillow's NEAREST.
    Nearest,
    /// Triangle filter, antialiased when shrinking (Pillow's / torchvision's BILINEAR).
    Bilinear,
    /// Catmull-Rom, a = -0.5 (Pillow's BICUBIC, timm's bicubic).
    Bicubic,
}

/// The presets of `--preset`, in `data::Preset` order.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PresetArg {
    /// RGB, ImageNet mean/std, short side 256 → centre 224 (crop-pct 0.875), bilinear.
    Torchvision,
    /// RGB, (x − 127.5) / 127.5, crop-pct 0.875, bicubic.
    TimmInception,
    /// Raw 0..255 RGB values, stretched, bilinear.
    Raw,
    /// BGR, x − (103.939, 116.779, 123.68), no std, crop-pct 0.875, bilinear.
    Caffe,
}

impl PresetArg {
    fn preset(self) -> Preset {
        match self {
            PresetArg::Torchvision => Preset::TorchvisionImagenet,
            PresetArg::TimmInception => Preset::TimmInception,
            PresetArg::Raw => Preset::Raw,
            PresetArg::Caffe => Preset::CaffeBgr,
        }
    }
}

impl EvalArgs {
    pub fn to_experiment(&self) -> Experiment {
        let mut e = Experiment {
            name: self
                .model
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("experiment")
                .into(),
            model: self.model.clone(),
            methods: self.methods.clone(),
            percentile: self.percentile,
            precisions: self
                .precisions
                .clone()
                .unwrap_or_else(|| vec![Precision::Fp32, Precision::Int8]),
            exclude: self.exclude.clone(),
            ..Default::default()
        };
        e.calibration.dir = self.calib.clone();
        e.calibration.select = match (self.calib_count, self.calib_every) {
            (Some(n), _) => Selection::First(n),
            (None, Some(k)) => Selection::EveryNth(k),
            _ => Selection::All,
        };
        e.evaluation.dir = self.data.clone();
        e.evaluation.task = match self.task {
            TaskArg::Auto => TaskChoice::Auto,
            TaskArg::Classification => TaskChoice::Classification,
            TaskArg::Segmentation => TaskChoice::Segmentation,
        };
        e.evaluation.skip_calibration_images = self.eval_skip_calib;
        e.evaluation.labels = self.labels.clone();
        let recipe = match self.recipe {
            RecipeArg::Fast => crate::prepare::Recipe::Fast,
            RecipeArg::Best => crate::prepare::Recipe::Best,
        };
        recipe.apply(&mut e.weight_rounding, &mut e.bias_correction);
        if let Some(b) = self.bias_correction {
            e.bias_correction = b == OnOffArg::On;
        }
        e.correction_images = self.correction_images;
        e.cle = match self.cle {
            CleArg::Auto => crate::prepare::cle::CleSetting::Auto,
            CleArg::On => crate::prepare::cle::CleSetting::On,
            CleArg::Off => crate::prepare::cle::CleSetting::Off,
        };
        e.cle_scales = match self.cle_scales {
            CleScalesArg::Activations => crate::prepare::cle::ScaleRule::Activations,
            CleScalesArg::Weights => crate::prepare::cle::ScaleRule::Weights,
        };
        e.center = match self.center_activations {
            CenterArg::On => crate::prepare::center::CenterSetting::On,
            CenterArg::Off => crate::prepare::center::CenterSetting::Off,
        };
        e.weight_rounding = match self.weight_rounding {
            None => e.weight_rounding,
            Some(WeightRoundingArg::Nearest) => crate::prepare::gptq::WeightRounding::Nearest,
            Some(WeightRoundingArg::Gptq) => crate::prepare::gptq::WeightRounding::Gptq,
        };
        e.cle_clip = match self.cle_clip {
            CleClipArg::PerChannel => crate::prepare::cle::ClipPolicy::PerChannel,
            CleClipArg::Skip => crate::prepare::cle::ClipPolicy::Skip,
        };
        // The preset first; each flag given overrides its field.
        if let Some(p) = self.preset {
            p.preset().apply(&mut e.preprocess);
        }
        let crop_flags = self.crop_pct.is_some() || self.resize_short.is_some();
        match self.resize {
            Some(ResizeArg::Stretch) => e.preprocess.resize = ResizeMode::Stretch,
            Some(ResizeArg::Crop) => e.preprocess.resize = ResizeMode::Crop,
            Some(ResizeArg::Letterbox) => e.preprocess.resize = ResizeMode::Letterbox,
            None if crop_flags => e.preprocess.resize = ResizeMode::Crop,
            None => {}
        }
        if let Some(pct) = self.crop_pct {
            e.preprocess.crop_pct = pct;
            e.preprocess.resize_short_px = None;
        }
        if let Some(n) = self.resize_short {
            e.preprocess.resize_short_px = Some(n);
        }
        if let Some(i) = self.interpolation {
            e.preprocess.interpolation = match i {
                InterpolationArg::Nearest => Interpolation::Nearest,
                InterpolationArg::Bilinear => Interpolation::Bilinear,
                InterpolationArg::Bicubic => Interpolation::Bicubic,
            };
        }
        if let Some(v) = self.pad_value {
            e.preprocess.pad_value = v;
        }
        e.preprocess.size = self.size;
        if self.bgr {
            e.preprocess.channel_order = ChannelOrder::Bgr;
        }
        if let (Some(mean), Some(std)) = (self.mean, self.std) {
            e.preprocess.normalize = Normalize::MeanStd { mean, std };
            e.preprocess.auto_normalize = false;
        }
        if let Some(scale) = self.scale {
            e.preprocess.normalize = Normalize::ScaleOffset {
                scale,
                offset: self.offset.unwrap_or(0.0),
            };
            e.preprocess.auto_normalize = false;
        }
        e.bench.min_runs = self.min_runs;
        e.bench.min_time_ms = self.min_time_ms;
        e.bench.until_stable = self.until_stable;
        e.bench.max_time_ms = self.max_time_ms;
        e.bench.batch = self.batch;
        self.out.apply(&mut e);
        if self.precisions.is_none() && e.backend == BackendKind::Cuda {
            e.precisions = vec![Precision::Fp32, Precision::Fp16, Precision::Int8];
        }
        e
    }
}

impl OutputArgs {
    pub fn apply(&self, e: &mut Experiment) {
        let o = &mut e.output;
        for (flag, field) in [
            (&self.report, &mut o.report_json),
            (&self.md, &mut o.markdown),
            (&self.csv, &mut o.csv),
            (&self.confusion_csv, &mut o.confusion_csv),
            (&self.gallery_csv, &mut o.gallery_csv),
            (&self.export_qdq, &mut o.qdq_dir),
            (&self.save_masks, &mut o.masks_dir),
        ] {
            if flag.is_some() {
                field.clone_from(flag);
            }
        }
        if let Some(d) = &self.export {
            o.qdq_dir = Some(d.clone());
            o.export_precisions = crate::export::ExportPrecision::ALL.to_vec();
        }
        if let Some(p) = &self.export_precisions {
            o.export_precisions.clone_from(p);
        }
        if self.save_masks.is_some() {
            o.mask_count = self.mask_count;
        }
        if self.eval_count.is_some() {
            e.evaluation.count = self.eval_count;
        }
        if let Some(b) = self.backend {
            e.backend = b;
        }
        if let Some(m) = self.fp32_math {
            e.fp32_math = m;
        }
        if let Some(b) = self.build_effort {
            e.build_effort = b;
        }
        if let Some(r) = self.fp16_regions {
            e.fp16_regions = r == OnOffArg::On;
        }
        if let Some(t) = self.threads {
            e.threads = t;
        }
        if let Some(c) = self.cpu_engine {
            e.cpu_engine = c;
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::backend::BuildEffort;

    /// `--build-effort` reaches the experiment (and its file); without it, the default.
    #[test]
    fn build_effort_flag_reaches_the_experiment() {
        let effort = |flags: &[&str]| {
            let argv = ["quantscope", "eval", "--model", "m.onnx"]
                .iter()
                .chain(flags);
            let Some(Command::Eval(a)) = Cli::try_parse_from(argv).expect("flags").command else {
                panic!("not eval");
            };
            let e = a.to_experiment();
            let back = Experiment::from_ron(&e.to_ron()).expect("round trip");
            assert_eq!(back.build_effort, e.build_effort);
            e.build_effort
        };
        assert_eq!(effort(&[]), BuildEffort::Default);
        assert_eq!(effort(&["--build-effort", "fast"]), BuildEffort::Fast);
        assert_eq!(
            effort(&["--build-effort", "exhaustive"]),
            BuildEffort::Exhaustive
        );
        assert!(
            Cli::try_parse_from(["quantscope", "eval", "--build-effort", "quick"]).is_err(),
            "an unknown effort is refused"
        );
    }
}
