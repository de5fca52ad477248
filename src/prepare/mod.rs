//! The INT8 preparation: the model the INT8 engines are built from (cross-layer equalization →
//! activation centering → GPTQ weight rounding, [`for_int8`]) and the bias correction of their
//! ranges ([`correct_biases`], [`correct_mixed_biases`]). The FP32 rows keep the original model.
//!
//! Every step that needs activations reads them through the reference interpreter
//! ([`crate::backend::reference`]), on the calibration images of a [`Source`]; the pipeline
//! hands the pieces in and copies what comes back (model, summaries, notes) into the report.
//! This module never reaches back into the pipeline.
//!
//! | file | owns |
//! |---|---|
//! | [`cle`] | cross-layer equalization (an exact FP32 rewrite) |
//! | [`center`] | activation centering (an exact FP32 rewrite) |
//! | [`gptq`] | GPTQ weight rounding: input moments and the column-by-column rounding |
//! | [`bias`] | empirical bias correction (per-layer or full, chosen by output SQNR) |
//! | `steps.rs` | each step run on the calibration images, its failure said in its note |

use std::path::PathBuf;

use crate::calib::{Method, Ranges};
use crate::data::{self, DataError};
use crate::model::Model;
use crate::quant::QuantPlan;

pub mod bias;
pub mod center;
pub mod cle;
pub mod gptq;
mod steps;

/// The INT8 preparation in one word, as the CLI's `--recipe` and the GUI's combo offer it:
/// the two settings that cost time beyond calibration, set together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Nearest weight rounding, no bias correction: calibration only (ONNX Runtime's and
    /// TensorRT's quantizers).
    Fast,
    /// GPTQ weight rounding + bias correction (full, as NNCF, unless another correction is
    /// clearly closer to FP32): the default, the most accurate measured here (DeepLabV3 coco96
    /// 99.6 % of FP32 mIoU against 95.9 % fast, README's accuracy table).
    Best,
}

impl Recipe {
    pub const ALL: [Recipe; 2] = [Recipe::Fast, Recipe::Best];

    pub fn name(self) -> &'static str {
        match self {
            Recipe::Fast => "fast",
            Recipe::Best => "best",
        }
    }

    /// Sets the settings the recipe stands for.
    pub fn apply(self, weight_rounding: &mut gptq::WeightRounding, bias_correction: &mut bool) {
        (*weight_rounding, *bias_correction) = match self {
            Recipe::Fast => (gptq::WeightRounding::Nearest, false),
            Recipe::Best => (gptq::WeightRounding::Gptq, true),
        };
    }

    /// The recipe these settings make, None where they were set apart (a custom recipe).
    pub fn of(weight_rounding: gptq::WeightRounding, bias_correction: bool) -> Option<Recipe> {
        match (weight_rounding, bias_correction) {
            (gptq::WeightRounding::Nearest, false) => Some(Recipe::Fast),
            (gptq::WeightRounding::Gptq, true) => Some(Recipe::Best),
            _ => None,
        }
    }

    /// The report's line on the recipe these settings make.
    pub fn line(weight_rounding: gptq::WeightRounding, bias_correction: bool) -> String {
        let steps = match (weight_rounding, bias_correction) {
            (gptq::WeightRounding::Gptq, true) => "GPTQ weight rounding + bias correction",
            (gptq::WeightRounding::Gptq, false) => "GPTQ weight rounding, no bias correction",
            (gptq::WeightRounding::Nearest, true) => "nearest weight rounding + bias correction",
            (gptq::WeightRounding::Nearest, false) => "nearest weight rounding, no bias correction",
        };
        match Recipe::of(weight_rounding, bias_correction) {
            Some(Recipe::Best) => format!(
                "INT8 recipe: best, the default ({steps}, the most accurate measured; --recipe \
                 fast skips both and saves their time, logged above)"
            ),
            Some(Recipe::Fast) => format!(
                "INT8 recipe: fast ({steps}; the default --recipe best is more accurate and \
                 takes longer)"
            ),
            None => format!("INT8 recipe: custom ({steps})"),
        }
    }
}

/// Where the preparation says what it is doing. The pipeline's `Sink` is one.
pub trait Progress {
    fn progress(&self, stage: &str, done: usize, total: usize);
    fn log(&self, line: &str);
}

/// What the preparation reads: a model, its input size and the calibration images, decoded
/// and preprocessed as every other stage does.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub model: &'a Model,
    pub hw: [usize; 2],
    pub images: &'a [PathBuf],
    pub preprocess: &'a data::Preprocess,
}

impl<'a> Source<'a> {
    /// The same images around another model (the one the previous step made).
    pub fn with_model<'b>(&self, model: &'b Model) -> Source<'b>
    where
        'a: 'b,
    {
        Source { model, ..*self }
    }

    /// The model's input for `img`.
    pub fn input_of(&self, img: &image::RgbImage) -> Vec<f32> {
        self.preprocess.apply(
            img,
            self.hw,
            self.model.info.input_chw[0],
            self.model.info.layout,
        )
    }

    /// Inputs for passes that hold their activations: the first `n` calibration images (at
    /// least one).
    pub fn inputs(&self, n: usize) -> Result<Vec<Vec<f32>>, DataError> {
        self.images
            .iter()
            .take(n.max(1))
            .map(|f| data::open_rgb(f).map(|img| self.input_of(&img)))
            .collect()
    }
}

/// The experiment's choices the preparation follows.
#[derive(Clone, Copy, Debug)]
pub struct Settings<'a> {
    pub cle: cle::CleSetting,
    pub cle_clip: cle::ClipPolicy,
    pub cle_scales: cle::ScaleRule,
    pub center: center::CenterSetting,
    pub weight_rounding: gptq::WeightRounding,
    /// Node names or op types kept in float: GPTQ leaves them as they are.
    pub exclude: &'a [String],
    /// GPTQ and bias correction measure each layer on the first this-many calibration images.
    pub correction_images: usize,
    /// Bias correction follows (on the ranges): said with GPTQ's images in one note.
    pub bias_correction: bool,
}

/// The model the INT8 engines are built from, and what the report says about how it was made.
pub struct Int8Model {
    pub model: Model,
    /// The report's `equalization` (None when CLE failed and the model was kept).
    pub equalization: Option<cle::CleSummary>,
    /// The report's `centering` (None when centering failed and the model was kept).
    pub centering: Option<center::CenterSummary>,
    /// Lines for the report's notes, in order; each was logged as it came.
    pub notes: Vec<String>,
    /// The float weights GPTQ replaced (empty with nearest rounding): a layer a
    /// mixed-precision plan keeps in float gets them back ([`gptq::FloatWeights::for_plan`]).
    pub float_weights: gptq::FloatWeights,
}

/// CLE → centering → GPTQ, each on the model the previous step made. A step that fails keeps
/// the model it was given and says why in its note, rather than losing the run.
pub fn for_int8(src: &Source, s: &Settings, sink: &(impl Progress + ?Sized)) -> Int8Model {
    let mut notes = vec![];
    let mut say = |note: String| {
        sink.log(&note);
        notes.push(note);
    };
    say(Recipe::line(s.weight_rounding, s.bias_correction));
    let (equalized, equalization, note) = steps::equalize(src, s);
    // A model with nothing to equalize gets no note (the report's field still says so).
    let nothing = equalization
        .as_ref()
        .is_some_and(|e| e.pairs.is_empty() && e.skipped.is_empty());
    if !nothing {
        say(note);
    }
    let (centered, centering, note) = steps::center(&src.with_model(&equalized), s);
    if centering.as_ref().is_some_and(|c| c.applied()) {
        say(note);
    }
    if let Some(note) = correction_images_note(src, s) {
        say(note);
    }
    let (model, float_weights) = match s.weight_rounding {
        gptq::WeightRounding::Nearest => (centered, gptq::FloatWeights::default()),
        gptq::WeightRounding::Gptq => {
            let (rounded, originals, note) =
                steps::round_weights(&src.with_model(&centered), s, sink);
            say(note);
            (rounded, originals)
        }
    };
    Int8Model {
        model,
        equalization,
        centering,
        notes,
        float_weights,
    }
}

/// Which steps measure layers on fewer images than the ranges use, and how many (None when
/// neither GPTQ nor bias correction runs).
fn correction_images_note(src: &Source, s: &Settings) -> Option<String> {
    let gptq = s.weight_rounding == gptq::WeightRounding::Gptq;
    let what = match (gptq, s.bias_correction) {
        (true, true) => "GPTQ and bias correction",
        (true, false) => "GPTQ",
        (false, true) => "bias correction",
        (false, false) => return None,
    };
    Some(format!(
        "{what} measured each layer on the first {} of the {} calibration images (--correction-images; the ranges use them all)",
        s.correction_images.min(src.images.len()),
        src.images.len()
    ))
}

/// Fills the bias correction of each of `all`'s ranges whose method is in `used`, measured on
/// the first `images` calibration images (one FP32 pass shared by all); returns, per method,
/// the line saying which correction was kept (each logged).
pub fn correct_biases(
    src: &Source,
    plan: &QuantPlan,
    all: &mut [Ranges],
    used: &[Method],
    images: usize,
    sink: &(impl Progress + ?Sized),
) -> Result<Vec<String>, String> {
    let inputs = src.inputs(images).map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    let todo: Vec<&mut Ranges> = all
        .iter_mut()
        .filter(|r| used.contains(&r.method))
        .collect();
    let n = todo.len();
    let mut notes = vec![];
    let reference = bias::Fp32Reference::new(src.model, src.hw, plan, &inputs)?;
    for (i, r) in todo.into_iter().enumerate() {
        sink.progress("bias correction", i, n);
        let bc = bias::bias_correction(&reference, plan, r)?;
        let note = bc.summary(r.method.name(), inputs.len());
        sink.log(&note);
        notes.push(note);
        r.bias_correction = bc.shifts;
    }
    sink.log(&format!(
        "bias correction for {n} method(s) in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    ));
    Ok(notes)
}

/// The bias correction of a mixed-precision plan's ranges, whose per-tensor methods differ
/// from its base method's (so the base method's correction does not fit them); returns the
/// line saying which correction was kept (logged).
pub fn correct_mixed_biases(
    src: &Source,
    plan: &QuantPlan,
    ranges: &mut Ranges,
    images: usize,
    sink: &(impl Progress + ?Sized),
) -> Result<String, String> {
    let inputs = src.inputs(images).map_err(|e| e.to_string())?;
    let reference = bias::Fp32Reference::new(src.model, src.hw, plan, &inputs)?;
    let bc = bias::bias_correction(&reference, plan, ranges)?;
    let note = bc.summary("mixed precision", inputs.len());
    sink.log(&note);
    ranges.bias_correction = bc.shifts;
    Ok(note)
}
