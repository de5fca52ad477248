//! Runs an `Experiment` from model to report: load, prepare data, calibrate (or take the
//! cached statistics), place Q/DQ, build each engine, evaluate it against FP32, time it.
//! Each finished row is handed to the `Sink` at once, so a cancelled run keeps what it has.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::backend::{self, BuildInput, BuildSpec, Engine, Precision};
use crate::bench::{self, BenchSpec};
use crate::calib::{self, Method, Ranges, Stats, StatsCache};
use crate::data::{self, EvalSet, Geometry, Label};
use crate::eval::{self, ClassTally, SegTally, Sqnr};
use crate::experiment::Experiment;
use crate::model::{Model, Task};
use crate::quant::{self, QdqModel, QuantPlan};
use crate::report::{
    CalibSummary, EvalSummary, MemoryBytes, ModelSummary, Report, Row, TensorRanges,
};

/// The mask value that marks a pixel as not counted (VOC's convention).
pub const IGNORE_LABEL: u8 = 255;

/// FP32 outputs kept in memory for SQNR; past this, SQNR covers the first images only.
const SQNR_BUDGET_BYTES: usize = 256 << 20;

/// Shared flag that stops a run between images.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed)
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where a run reports what it is doing. The CLI prints; the worker forwards to the UI.
pub trait Sink: Sync {
    fn progress(&self, stage: &str, done: usize, total: usize);
    fn log(&self, line: &str);
    fn row(&self, _row: &Row) {}
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error("{0}")]
    Config(String),
    #[error("cancelled")]
    Cancelled,
}

/// What a run leaves besides the report: predictions to draw (not serialized).
#[derive(Clone, Debug, Default)]
pub struct Artifacts {
    /// Per row (same order as `Report::rows`): argmax masks at mask resolution per image,
    /// or predicted classes, for the evaluation images.
    pub predictions: Vec<Vec<Vec<u8>>>,
    pub mask_hw: Vec<[usize; 2]>,
    pub ground_truth: Vec<Vec<u8>>,
    /// The Q/DQ models the run built, to export from the window.
    pub qdq: Vec<QdqArtifact>,
}

/// A Q/DQ model a run built: its method, the file-name suffix it exports under (`_mixed` for
/// the mixed-precision plan) and the model.
#[derive(Clone, Debug)]
pub struct QdqArtifact {
    pub method: Option<Method>,
    pub suffix: &'static str,
    pub model: QdqModel,
}

pub struct RunOutput {
    pub report: Report,
    pub artifacts: Artifacts,
    /// Outputs (report files, masks, Q/DQ exports) that could not be written, each naming its
    /// file. The run's results are in `report` all the same.
    pub output_errors: Vec<String>,
}

/// One evaluation image, preprocessed once for every engine.
pub struct Sample {
    input: Vec<f32>,
    label: Label,
    gt: Option<(Vec<u8>, [usize; 2])>,
    geometry: Geometry,
}

/// Everything prepared before engines are built.
pub struct Prepared {
    pub model: Model,
    pub hw: [usize; 2],
    pub task: Option<Task>,
    pub eval: Option<EvalSet>,
    pub calib_images: Vec<PathBuf>,
    /// Calibration images left out because they do not decode, with why (the message names
    /// the file).
    pub unreadable_calib: Vec<(PathBuf, String)>,
    /// The model's output channels (its class count), from the file or inferred once here.
    pub output_channels: Option<usize>,
    /// The preprocessing every stage uses: the experiment's, with the normalisation resolved
    /// (the model's metadata, or ImageNet mean/std assumed) where nobody set it.
    pub preprocess: data::Preprocess,
    pub normalize_source: data::NormalizeSource,
}

impl Prepared {
    /// The same preparation around another model (the INT8 engines' equalized or rounded one).
    fn with_model(&self, model: Model) -> Prepared {
        Prepared {
            model,
            hw: self.hw,
            task: self.task,
            eval: self.eval.clone(),
            calib_images: self.calib_images.clone(),
            unreadable_calib: self.unreadable_calib.clone(),
            output_channels: self.output_channels,
            preprocess: self.preprocess.clone(),
            normalize_source: self.normalize_source.clone(),
        }
    }

    /// The preprocessed input for `img`.
    pub fn input_of(&self, img: &image::RgbImage) -> Vec<f32> {
        self.preprocess.apply(
            img,
            self.hw,
            self.model.info.input_chw[0],
            self.model.info.layout,
        )
    }

    /// Where the evaluation's class order and the input normalisation came from: said in the
    /// log and the report, because either, when wrong, gives a plausible wrong score.
    pub fn assumptions(&self) -> Vec<String> {
        let mut v = vec![self.normalize_source.describe(&self.preprocess.normalize)];
        if let Some(e) = self
            .eval
            .as_ref()
            .filter(|e| e.kind == Task::Classification)
        {
            v.push(e.classes_from.describe());
        }
        if !self.unreadable_calib.is_empty() {
            let list: Vec<String> = self
                .unreadable_calib
                .iter()
                .map(|(_, why)| why.clone())
                .collect();
            v.push(format!(
                "warning: left out {} calibration image(s) that cannot be decoded: {}",
                list.len(),
                list.join("; ")
            ));
        }
        v
    }
}

/// Load → validate → list the data: everything that can be refused before an engine exists.
/// The model's own validation runs inside [`Model::load`]; the experiment's settings, the
/// exclusion names, the memory a run needs and the evaluation labels are checked here.
pub fn prepare(exp: &Experiment) -> Result<Prepared, PipelineError> {
    exp.validate().map_err(PipelineError::Config)?;
    let model = Model::load(&exp.model)?;
    model.check_supported()?;
    quant::check_exclusions(&model, &exp.exclude, "--exclude").map_err(PipelineError::Config)?;
    if let Some(mp) = &exp.mixed_precision {
        quant::check_exclusions(&model, &mp.keep_float, "mixed_precision.keep_float")
            .map_err(PipelineError::Config)?;
        let tensors: Vec<String> = mp.per_tensor.keys().cloned().collect();
        quant::check_tensor_names(&model, &tensors, "mixed_precision.per_tensor")
            .map_err(PipelineError::Config)?;
    }
    let hw = model.input_hw(exp.preprocess.size)?;
    let max = data::MAX_IMAGE_SIDE_PX as usize;
    if hw.iter().any(|&v| v > max) {
        return Err(PipelineError::Config(format!(
            "{}: the input is fixed at {}x{} pixels, more than the {max} per side quantscope evaluates (every image would be resized to it); re-export the model at the size you deploy",
            model.path.display(),
            hw[0],
            hw[1]
        )));
    }
    exp.preprocess
        .check_input_hw(hw)
        .map_err(PipelineError::Config)?;
    // Shapes at this input size, inferred once for the memory check and the class count. An
    // op tract lacks fails inference too (ONNX Runtime may still run the model), but two shapes
    // that contradict each other fail every engine: refused here, in words, before any runs.
    let shapes = match crate::guard::catch("inferring shapes", || {
        crate::model::infer_shapes(&model, hw)
    }) {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) if format!("{e:#}").contains("Impossible to unify") => {
            check_shapes_in_ort(&model, hw, exp.cpu_engine, &format!("{e:#}"))?;
            None
        }
        _ => None,
    };
    check_memory(&model, hw, exp.bench.batch, shapes.as_ref())?;
    let channels = output_channels(&model, shapes.as_ref());
    let mut unreadable_calib = vec![];
    let calib_images = match &exp.calibration.dir {
        Some(d) => {
            let (imgs, skipped) = data::list_images(d)?;
            let imgs = exp.calibration.select.pick(imgs);
            if imgs.is_empty() {
                return Err(data::DataError::NoImages {
                    path: d.clone(),
                    skipped,
                }
                .into());
            }
            // One damaged file must not sink the INT8 engines: it is left out and named.
            let (imgs, bad) = readable_images(imgs);
            if imgs.is_empty() {
                return Err(PipelineError::Config(format!(
                    "{}: none of the {} calibration images can be decoded ({})",
                    d.display(),
                    bad.len(),
                    bad[0].1
                )));
            }
            unreadable_calib = bad;
            imgs
        }
        None => vec![],
    };
    let eval = match &exp.evaluation.dir {
        Some(d) => {
            let exclude: HashSet<PathBuf> = if exp.evaluation.skip_calibration_images {
                calib_images.iter().map(|p| data::canonical(p)).collect()
            } else {
                HashSet::new()
            };
            let labels_file = exp.labels_file();
            let labels = labels_file.as_deref().map(|path| data::LabelsFile {
                path,
                explicit: exp.evaluation.labels.is_some(),
            });
            let mut set = EvalSet::open_labelled(d, &exclude, labels)?;
            if let Some(n) = exp.evaluation.count {
                set.items.truncate(n);
            }
            // The layout is checked against the task first: a segmenter given class folders
            // needs masks, not the labels.txt a class-count check would ask for.
            check_layout(exp.evaluation.task.fixed().or(model.info.task), &set)?;
            set.check_labels(channels.unwrap_or(0), IGNORE_LABEL)?;
            // Masks hold output indices, so a segmentation class-name file only names them:
            // it must name each of the model's classes.
            if let (Task::Segmentation, data::ClassSource::File(l), Some(want)) =
                (set.kind, &set.classes_from, channels)
                && set.classes.len() != want
            {
                if exp.evaluation.labels.is_some() {
                    return Err(PipelineError::Config(format!(
                        "{}: lists {} class names but the model has {want} classes; list one name per class, in output order",
                        l.display(),
                        set.classes.len()
                    )));
                }
                set.classes.clear();
                set.classes_from = data::ClassSource::Folders;
            }
            Some(set)
        }
        None => None,
    };
    let task = exp
        .evaluation
        .task
        .fixed()
        .or(model.info.task)
        .or(eval.as_ref().map(|e| e.kind));
    if let Some(e) = &eval {
        check_layout(task, e)?;
    }
    let (preprocess, normalize_source) = exp.preprocess.resolved(model.info.normalization.as_ref());
    Ok(Prepared {
        model,
        hw,
        task,
        eval,
        calib_images,
        unreadable_calib,
        output_channels: channels,
        preprocess,
        normalize_source,
    })
}

/// Tract found two shapes that contradict each other (`tract_says`). tract's inference is not
/// the last word where ONNX Runtime runs the CPU engine: the model is refused only when ORT
/// cannot load it at this size either (or tract is the engine), with ORT's words where it has
/// them, since they name the node in ONNX terms.
fn check_shapes_in_ort(
    model: &Model,
    hw: [usize; 2],
    choice: backend::cpu::CpuEngineChoice,
    tract_says: &str,
) -> Result<(), PipelineError> {
    use backend::cpu::onnxruntime::{self as ort_engine, Optimisation, Use};
    let why = match ort_engine::runtime::resolve(choice) {
        Ok((backend::cpu::CpuEngineKind::Ort, _)) => {
            let bytes = prost::Message::encode_to_vec(&model.with_fixed_input(1, hw));
            match ort_engine::session(&bytes, Optimisation::Exact, 1, Use::Statistics, None) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            }
        }
        _ => tract_says.replace("Failed analyse for node", "node"),
    };
    Err(PipelineError::Config(format!(
        "{}: the model's shapes do not fit together at a {}x{} input: {why}. The file is damaged or was edited; re-export it (or give the --size it was exported for)",
        model.path.display(),
        hw[0],
        hw[1],
    )))
}

/// The resize / crop / pad the evaluation images went through, in words: the geometry moves a
/// metric by points (2.7 on one ImageNet model), so the run says what it applied.
fn geometry_note(p: &Prepared, samples: &[Sample]) -> Option<String> {
    let first = samples.first()?;
    let same = samples
        .iter()
        .all(|s| s.geometry.orig_hw == first.geometry.orig_hw);
    Some(format!(
        "input geometry ({}): {}, {} interpolation",
        if same {
            "every evaluation image".to_string()
        } else {
            "the first evaluation image; sizes differ".to_string()
        },
        first.geometry.describe(p.preprocess.resize),
        format!("{:?}", p.preprocess.interpolation).to_lowercase()
    ))
}

/// Refuses an evaluation folder laid out for another task than the model's, saying what the
/// folder must hold instead.
fn check_layout(task: Option<Task>, set: &EvalSet) -> Result<(), PipelineError> {
    match task {
        Some(t) if t != set.kind => Err(PipelineError::Config(format!(
            "{}: the evaluation folder is laid out for {:?} but the model's task is {:?}; {}",
            set.root.display(),
            set.kind,
            t,
            match t {
                Task::Segmentation =>
                    "a segmentation folder holds images/ and masks/ (one PNG of class ids per image, same file stem)",
                Task::Classification =>
                    "a classification folder holds one sub-folder of images per class (ImageFolder)",
            }
        ))),
        _ => Ok(()),
    }
}

/// Splits `paths` into the images that decode and (file, why) for those that do not, decoding
/// them in parallel.
fn readable_images(paths: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
    use rayon::prelude::*;
    let checked: Vec<(PathBuf, Option<String>)> = paths
        .into_par_iter()
        .map(|p| {
            let why = data::open_rgb(&p).err().map(|e| e.to_string());
            (p, why)
        })
        .collect();
    let mut ok = vec![];
    let mut bad = vec![];
    for (p, why) in checked {
        match why {
            None => ok.push(p),
            Some(w) => bad.push((p, w)),
        }
    }
    (ok, bad)
}

pub fn load_samples(
    p: &Prepared,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<Vec<Sample>, PipelineError> {
    let Some(set) = &p.eval else {
        return Ok(vec![]);
    };
    let mut out = Vec::with_capacity(set.items.len());
    for (i, it) in set.items.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(PipelineError::Cancelled);
        }
        sink.progress("loading evaluation images", i, set.items.len());
        let img = data::open_rgb(&it.image)?;
        let gt = match &it.label {
            Label::Mask(m) => Some(data::read_mask(m)?),
            Label::Class(_) => None,
        };
        out.push(Sample {
            input: p.input_of(&img),
            label: it.label.clone(),
            gt,
            geometry: p
                .preprocess
                .geometry([img.height() as usize, img.width() as usize], p.hw),
        });
    }
    Ok(out)
}

/// Collects (or loads) calibration statistics for the plan's tensors.
pub fn calibrate(
    p: &Prepared,
    plan: &QuantPlan,
    cache: &StatsCache,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<(Stats, bool, f64), PipelineError> {
    let tensors = plan.tensors();
    let prep = format!(
        "{}|{:?}",
        ron::to_string(&p.preprocess).unwrap_or_default(),
        p.hw
    );
    let key = calib::cache_key(&p.model.fingerprint(), &tensors, &p.calib_images, &prep);
    match cache.load(&key) {
        Ok(Some(s)) => {
            sink.log(&format!(
                "calibration statistics from cache ({} images, key {key})",
                s.images
            ));
            return Ok((s, true, 0.0));
        }
        Ok(None) => {}
        Err(why) => sink.log(&why),
    }
    if p.calib_images.is_empty() {
        return Err(PipelineError::Config(
            "INT8 needs calibration images: set a calibration folder (--calib DIR)".into(),
        ));
    }
    let t0 = Instant::now();
    let probe = backend::reference::open_model(&p.model, p.hw, &tensors).map_err(|e| {
        PipelineError::Config(format!(
            "{}: cannot run the model for calibration: {e}. `quantscope inspect` lists its ops; \
             --exclude keeps a failing layer in float",
            p.model.path.display()
        ))
    })?;
    let mut stats = Stats::new(key, &tensors);
    let n = p.calib_images.len();
    // Histograms are filled on a second thread while the next batch runs. Each image is added
    // on its own, in order, so the statistics do not depend on the batch size.
    let (tx, rx) = crossbeam_channel::bounded::<(Vec<backend::reference::Activation>, usize)>(2);
    let result = std::thread::scope(|s| -> Result<(), PipelineError> {
        let names = &tensors;
        let stats = &mut stats;
        let filler = std::thread::Builder::new()
            .name("quantscope-histograms".into())
            .spawn_scoped(s, move || {
                for (acts, images) in rx {
                    for k in 0..images {
                        let one: Vec<&[f32]> = acts.iter().map(|a| a.image(k, images)).collect();
                        stats.add(names, &one);
                    }
                }
            })
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        // The first image runs alone; what its tensors take sizes the batches after it.
        let mut batch = 1;
        let mut done = 0;
        while done < n {
            if cancel.is_cancelled() {
                break;
            }
            sink.progress("calibrating (FP32 pass)", done, n);
            let paths = &p.calib_images[done..(done + batch).min(n)];
            let input = decode_batch(p, paths)?;
            let (acts, images) = match probe.run_batch(&input, paths.len()) {
                Ok((_, acts)) => (acts, paths.len()),
                // A graph that fixes its batch (a Reshape to [1, ...]) runs one image at a time.
                Err(_) if paths.len() > 1 => {
                    batch = 1;
                    continue;
                }
                Err(e) => {
                    return Err(PipelineError::Config(format!(
                        "{}: {e}",
                        paths[0].display()
                    )));
                }
            };
            if done == 0 {
                let bytes: usize = acts.iter().map(|a| a.as_ref().len() * 4).sum();
                batch = backend::reference::batch_for(probe.as_ref(), bytes);
            }
            done += images;
            if tx.send((acts, images)).is_err() {
                break;
            }
        }
        drop(tx);
        filler
            .join()
            .map_err(|_| PipelineError::Config("histogram thread panicked".into()))?;
        Ok(())
    });
    result?;
    if cancel.is_cancelled() {
        return Err(PipelineError::Cancelled);
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    sink.progress("calibrating (FP32 pass)", n, n);
    if let Err(e) = cache.store(&stats) {
        sink.log(&format!(
            "could not write the statistics cache in {}: {e}",
            cache.dir.display()
        ));
    }
    sink.log(&format!(
        "calibration pass: {n} images in {ms:.0} ms on {} ({:.1} images/s)",
        probe.engine(),
        n as f64 / (ms / 1e3).max(1e-9)
    ));
    Ok((stats, false, ms))
}

/// The result of evaluating one engine.
pub struct Evaluated {
    pub row: Row,
    /// Segmentation: the argmax mask of each image at mask resolution (empty for classifiers).
    pub predictions: Vec<Vec<u8>>,
    /// Classification: the predicted class index of each image, in full (1000-class models
    /// too), for agreement with FP32.
    pub classes: Vec<usize>,
}

impl Evaluated {
    /// A row with no predictions (the engine failed before or while evaluating).
    fn failed(row: Row) -> Evaluated {
        Evaluated {
            row,
            predictions: vec![],
            classes: vec![],
        }
    }
}

/// FP32 reference kept while the other engines run.
#[derive(Default)]
pub struct Reference {
    pub predictions: Vec<Vec<u8>>,
    pub classes: Vec<usize>,
    pub outputs: Vec<Vec<f32>>,
    /// The FP32 engine output NaN/Inf: nothing can be compared with it.
    pub non_finite: bool,
}

#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    engine: &mut dyn Engine,
    samples: &[Sample],
    task: Task,
    classes: usize,
    reference: Option<&Reference>,
    sink: &dyn Sink,
    stage: &str,
    cancel: &CancelToken,
    keep_outputs: &mut Option<Vec<Vec<f32>>>,
) -> Result<Evaluated, String> {
    let mut row = Row::default();
    let mut class = ClassTally::default();
    let mut seg = SegTally::new(classes.max(1));
    let mut sqnr = Sqnr::default();
    let mut sqnr_images = 0;
    let mut agree = (0u64, 0u64);
    let mut predictions = vec![];
    let mut classes_pred = vec![];
    let mut kept_bytes = 0usize;
    let mut non_finite = crate::report::NonFinite {
        of_images: samples.len(),
        ..Default::default()
    };
    for (i, s) in samples.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(crate::report::CANCELLED.into());
        }
        sink.progress(stage, i, samples.len());
        let out = engine.run(&s.input).map_err(|e| e.to_string())?;
        let bad = out.data.iter().filter(|v| !v.is_finite()).count() as u64;
        non_finite.values += bad;
        non_finite.images += (bad > 0) as usize;
        let pred: Vec<u8> = match task {
            Task::Classification => {
                let Label::Class(label) = s.label else {
                    return Err("classification needs class labels".into());
                };
                let p = class.add(&out.data, label);
                row.per_image.push((p == label) as u8 as f64);
                if let Some(&rp) = reference.and_then(|r| r.classes.get(i)) {
                    agree.0 += (rp == p) as u64;
                    agree.1 += 1;
                }
                classes_pred.push(p);
                vec![]
            }
            Task::Segmentation => {
                if out.shape.len() != 4 {
                    return Err(format!(
                        "segmentation expects an [N, C, H, W] output, got {:?}",
                        out.shape
                    ));
                }
                let (c, oh, ow) = (out.shape[1], out.shape[2], out.shape[3]);
                let am = eval::argmax_chw(&out.data, c, oh * ow);
                let Some((gt, mhw)) = &s.gt else {
                    return Err("segmentation needs masks".into());
                };
                let map = s.geometry.pixel_map(*mhw, [oh, ow]);
                let at_mask: Vec<u8> = map
                    .iter()
                    .map(|m| m.map(|j| am[j as usize]).unwrap_or(255))
                    .collect();
                let gt_cropped: Vec<u8> = gt
                    .iter()
                    .zip(&map)
                    .map(|(&g, m)| if m.is_some() { g } else { 255 })
                    .collect();
                row.per_image.push(seg.add(&at_mask, &gt_cropped));
                at_mask
            }
        };
        if let Some(r) = reference {
            // Classifiers counted their agreement above; masks count pixels, ignoring 255.
            if let Some(rp) = r.predictions.get(i).filter(|_| task == Task::Segmentation) {
                agree.0 += pred
                    .iter()
                    .zip(rp)
                    .filter(|(a, b)| a == b && **a != 255)
                    .count() as u64;
                agree.1 += rp.iter().filter(|&&v| v != 255).count() as u64;
            }
            if let Some(ro) = r.outputs.get(i) {
                sqnr.add(ro, &out.data);
                sqnr_images += 1;
            }
        }
        if let Some(k) = keep_outputs.as_mut()
            && kept_bytes + out.data.len() * 4 <= SQNR_BUDGET_BYTES
        {
            kept_bytes += out.data.len() * 4;
            k.push(out.data.clone());
        }
        predictions.push(pred);
    }
    match task {
        Task::Classification => {
            row.top1 = Some(class.top1());
            row.top5 = Some(class.top5());
            row.per_class_accuracy = Some(class.per_class_accuracy());
        }
        Task::Segmentation => {
            row.miou = Some(seg.miou());
            row.per_class_iou = Some(seg.per_class_iou());
            row.pixel_acc = Some(seg.pixel_accuracy());
        }
    }
    if reference.is_some() {
        row.agreement = (agree.1 > 0).then(|| agree.0 as f64 / agree.1 as f64);
        row.sqnr_db = sqnr
            .db()
            .or((sqnr_images > 0).then_some(f64::INFINITY))
            .filter(|v| v.is_finite());
        row.sqnr_images = Some(sqnr_images);
    }
    non_finite.in_reference_only =
        non_finite.values == 0 && reference.is_some_and(|r| r.non_finite);
    if non_finite.values > 0 || non_finite.in_reference_only {
        // A metric computed from NaN/Inf (an argmax over NaN picks class 0) reads as a result
        // and is not one: every metric of the row is left empty and the row says why.
        void_metrics(&mut row);
        row.non_finite = Some(non_finite);
    }
    Ok(Evaluated {
        row,
        predictions,
        classes: classes_pred,
    })
}

/// Empties every accuracy metric of `row`, for outputs that held NaN/Inf.
fn void_metrics(row: &mut Row) {
    row.top1 = None;
    row.top5 = None;
    row.per_class_accuracy = None;
    row.miou = None;
    row.per_class_iou = None;
    row.pixel_acc = None;
    row.agreement = None;
    row.sqnr_db = None;
    row.per_image.clear();
}

/// What every engine row of a run shares: the backend, the prepared model and data, the input
/// that is timed, and where progress goes.
struct RowCtx<'a> {
    backend: &'a dyn backend::Backend,
    p: &'a Prepared,
    samples: &'a [Sample],
    classes: usize,
    bench_spec: &'a BenchSpec,
    bench_input: Vec<f32>,
    sink: &'a dyn Sink,
    cancel: &'a CancelToken,
    /// Set when the first engine could not be built at the experiment's batch: the model
    /// cannot run it (a batch-1 export's reshapes say 1), so no later engine tries.
    batch_refused: std::cell::RefCell<Option<String>>,
    /// Some engine did run at the batch: a later failure is that engine's own.
    batch_ok: std::cell::Cell<bool>,
    /// Threads the CPU engines run on (None on other backends).
    threads: Option<usize>,
}

impl RowCtx<'_> {
    /// Builds an engine; an error or a panic inside the backend becomes a message naming the
    /// model and the engine.
    fn build(
        &self,
        input: BuildInput<'_>,
        batch: usize,
        label: &str,
    ) -> Result<Box<dyn Engine>, BuildFailure> {
        let spec = BuildSpec {
            batch,
            hw: self.p.hw,
        };
        let file = self.p.model.path.display();
        let what = format!("building the {label} engine for {file}");
        match crate::guard::catch(&what, || self.backend.build(input, spec)) {
            Ok(Ok(engine)) => Ok(engine),
            Ok(Err(e)) => Err(BuildFailure {
                cause: e.to_string(),
                message: format!(
                    "cannot build the {label} engine for {file}: {e}. `quantscope inspect {file}` \
                     lists the model's ops; try --backend cpu or keep the failing layer in float \
                     (--exclude)"
                ),
            }),
            Err(panic) => Err(BuildFailure {
                cause: panic.clone(),
                message: panic,
            }),
        }
    }

    /// Builds an engine, evaluates and benchmarks it; errors (and panics inside the backend)
    /// land in the row, so the run goes on with the next one.
    fn row(
        &self,
        input: BuildInput<'_>,
        reference: Option<&Reference>,
        keep_outputs: &mut Option<Vec<Vec<f32>>>,
        label: &str,
    ) -> Evaluated {
        let mut row = Row {
            backend: self.backend.kind().name().into(),
            threads: self.threads,
            ..Default::default()
        };
        // Engine memory = growth over the build + peak growth while timing. Evaluation is left
        // out: it holds the FP32 outputs kept for SQNR, which are not the engine's.
        let (rss_before, _) = bench::rss_bytes();
        let t = Instant::now();
        let precision = input.precision();
        self.sink.progress(&format!("building {label}"), 0, 1);
        let mut engine = match self.build(input, 1, label) {
            Ok(e) => e,
            Err(e) => {
                row.error = Some(e.message);
                return Evaluated::failed(row);
            }
        };
        row.build_ms = Some(t.elapsed().as_secs_f64() * 1e3);
        let built_growth = bench::rss_bytes().0.saturating_sub(rss_before);
        let (mut predictions, mut classes) = (vec![], vec![]);
        if let Some(task) = self.p.task.filter(|_| !self.samples.is_empty()) {
            let evaluated = crate::guard::catch(&format!("evaluating {label}"), || {
                evaluate(
                    engine.as_mut(),
                    self.samples,
                    task,
                    self.classes,
                    reference,
                    self.sink,
                    &format!("evaluating {label}"),
                    self.cancel,
                    keep_outputs,
                )
            });
            match evaluated.and_then(|r| r) {
                Ok(ev) => {
                    let (build_ms, threads) = (row.build_ms, row.threads);
                    let backend_name = row.backend.clone();
                    row = ev.row;
                    row.build_ms = build_ms;
                    row.threads = threads;
                    row.backend = backend_name;
                    predictions = ev.predictions;
                    classes = ev.classes;
                }
                Err(e) => {
                    row.error = Some(e);
                    return Evaluated::failed(row);
                }
            }
        }
        let keep_going = || !self.cancel.is_cancelled();
        self.sink.progress(&format!("timing {label}"), 0, 1);
        // Threads are settled by timing just before the latency runs, under their conditions
        // (choices made while the engine was built disagreed with its latency runs).
        if let Err(e) = crate::guard::catch(&format!("choosing threads for {label}"), || {
            engine.choose_threads().map_err(|e| e.to_string())
        })
        .and_then(|r| r)
        {
            self.sink.log(&format!("{label}: threads not chosen: {e}"));
        }
        row.timing_load =
            crate::host::other_runnable_processes().map(|n| crate::report::TimingLoad {
                other_runnable: n,
                cores: crate::host::cores(),
            });
        if let Some(w) = row.timing_load.and_then(|l| l.warning(label)) {
            self.sink.log(&format!("warning: {w}"));
        }
        bench::reset_peak_rss();
        let (rss_timing, _) = bench::rss_bytes();
        let timed = crate::guard::catch(&format!("timing {label}"), || {
            bench::measure(
                engine.as_mut(),
                &self.bench_input,
                self.bench_spec,
                &keep_going,
            )
            .map_err(|e| format!("timing: {e}"))
        });
        let peak_rss = built_growth + bench::rss_bytes().1.saturating_sub(rss_timing);
        match timed.and_then(|r| r) {
            Ok(l) => {
                row.throughput_ips = (l.median > 0.0).then(|| 1e3 / l.median);
                row.latency_ms = Some(l);
            }
            Err(e) => row.error = Some(e),
        }
        let mut info = engine.info().clone();
        if let (Some(t), Some(n)) = (info.threads, row.threads)
            && t != n
        {
            self.sink.log(&format!(
                "{label}: runs on {t} thread{} (faster than {n} for this engine, timed before its latency)",
                if t == 1 { "" } else { "s" }
            ));
        }
        row.threads = info.threads.or(row.threads);
        // The CUDA engine times its layers while it is built; the CPU engine is profiled here
        // (a few runs on the timing input), so every row says where its time goes.
        if info.layer_times.is_empty() && !self.cancel.is_cancelled() {
            self.sink.progress(&format!("profiling {label}"), 0, 1);
            let profiled = crate::guard::catch(&format!("profiling {label}"), || {
                engine.profile(&self.bench_input)
            });
            match profiled {
                Ok(Ok(times)) => info.layer_times = times,
                Ok(Err(e)) => self.sink.log(&format!("{label}: no per-layer times: {e}")),
                Err(e) => self.sink.log(&format!("{label}: no per-layer times: {e}")),
            }
        }
        drop(engine);
        if self.bench_spec.batch > 1 && !self.cancel.is_cancelled() {
            self.time_batch(input, &mut row, label);
        }
        row.memory_bytes = Some(MemoryBytes {
            weights: info.weights_bytes,
            activations: info.activations_bytes,
            peak_rss,
        });
        row.simulated = info.simulated;
        row.tf32 = info.tf32;
        row.engine = info.engine.clone();
        if precision.is_quantized() {
            row.int8_nodes = Some(info.int8_nodes);
            row.float_nodes = info.float_nodes;
        }
        row.layer_times = info.layer_times;
        Evaluated {
            row,
            predictions,
            classes,
        }
    }

    /// Throughput at the experiment's batch size, on an engine built for it. A failure here is
    /// logged and leaves the batch-1 results standing.
    fn time_batch(&self, input: BuildInput<'_>, row: &mut Row, label: &str) {
        let b = self.bench_spec.batch;
        let batched: Vec<f32> = self
            .bench_input
            .iter()
            .copied()
            .cycle()
            .take(self.bench_input.len() * b)
            .collect();
        self.sink
            .progress(&format!("timing {label} at batch {b}"), 0, 1);
        let keep_going = || !self.cancel.is_cancelled();
        if self.batch_refused.borrow().is_some() {
            return;
        }
        let built = self.build(input, b, &format!("{label} batch-{b}"));
        if let Err(e) = &built
            && !self.batch_ok.get()
        {
            let declared = self.p.model.info.inputs[0]
                .shape
                .first()
                .copied()
                .flatten()
                .filter(|&d| d != b as i64)
                .map(|d| {
                    format!(
                        " Its input declares batch {d}: if the batch is what failed, export the \
                         model with a dynamic batch to measure larger batches."
                    )
                })
                .unwrap_or_default();
            let note = format!(
                "{}: no engine at batch {b} (the backend said: {}), so throughput is measured \
                 at batch 1 only.{declared}",
                self.p.model.path.display(),
                e.cause.lines().next().unwrap_or_default()
            );
            self.sink.log(&note);
            *self.batch_refused.borrow_mut() = Some(note);
            return;
        }
        let timed = built.map_err(|e| e.message).and_then(|mut e| {
            crate::guard::catch(&format!("timing {label} at batch {b}"), || {
                e.choose_threads()
                    .map_err(|err| format!("timing {label} at batch {b}: {err}"))?;
                bench::measure(e.as_mut(), &batched, self.bench_spec, &keep_going)
                    .map(|l| (l, e.info().layer_times.clone()))
                    .map_err(|err| format!("timing {label} at batch {b}: {err}"))
            })?
        });
        match timed {
            Ok((l, layers)) => {
                self.batch_ok.set(true);
                row.throughput_batch_ips = (l.median > 0.0).then(|| b as f64 * 1e3 / l.median);
                row.latency_batch_ms = Some(l);
                row.batch = Some(b);
                row.layer_times_batch = layers;
            }
            Err(e) => self.sink.log(&format!("{label}: batch {b}: {e}")),
        }
    }
}

/// Why an engine could not be built: the backend's own words, and the message for the row
/// (which names the model and what to try).
struct BuildFailure {
    cause: String,
    message: String,
}

/// One INT8 engine to build: a method's calibrated ranges, maybe with layers kept in float.
struct Int8Variant {
    method: Option<Method>,
    ranges: Option<Ranges>,
    kept_float: Vec<String>,
}

impl Int8Variant {
    fn label(&self) -> String {
        match (self.method, self.kept_float.len()) {
            (Some(m), 0) => format!("INT8 {m}"),
            (Some(m), k) => format!("INT8 {m} + {k} float"),
            (None, _) => "INT8 (Q/DQ from the model)".into(),
        }
    }
}

/// A run in progress: the rows produced so far, what they predicted, and the outputs that could
/// not be written. Every stage appends to it, so a cancelled or failing stage keeps the rest.
struct Rows<'a> {
    exp: &'a Experiment,
    ctx: RowCtx<'a>,
    report: Report,
    artifacts: Artifacts,
    output_errors: Vec<String>,
}

impl<'a> Rows<'a> {
    fn new(exp: &'a Experiment, ctx: RowCtx<'a>) -> Self {
        let (p, samples) = (ctx.p, ctx.samples);
        let report = Report {
            quantscope_version: env!("CARGO_PKG_VERSION").into(),
            experiment: exp.name.clone(),
            model: ModelSummary {
                file: p.model.path.clone(),
                task: p.task,
                inputs: p.model.info.inputs.clone(),
                outputs: p.model.info.outputs.clone(),
                params: p.model.info.params,
                param_bytes: p.model.info.param_bytes,
                op_census: p.model.info.op_census.clone(),
            },
            preprocess: p.preprocess.clone(),
            input_hw: p.hw,
            calibration: None,
            evaluation: EvalSummary {
                dir: p.eval.as_ref().map(|e| e.root.clone()),
                task: p.task,
                images: samples.len(),
                classes: p
                    .eval
                    .as_ref()
                    .map(|e| e.classes.clone())
                    .unwrap_or_default(),
                image_files: p
                    .eval
                    .as_ref()
                    .map(|e| e.items.iter().map(|i| i.image.clone()).collect())
                    .unwrap_or_default(),
            },
            rows: vec![],
            incomplete: false,
            notes: vec![],
            equalization: None,
            centering: None,
            exports: vec![],
            cpu_engine: Some(backend::cpu::engine().1),
        };
        let artifacts = Artifacts {
            mask_hw: samples
                .iter()
                .filter_map(|s| s.gt.as_ref().map(|g| g.1))
                .collect(),
            ground_truth: samples
                .iter()
                .filter_map(|s| s.gt.as_ref().map(|g| g.0.clone()))
                .collect(),
            ..Default::default()
        };
        Rows {
            exp,
            ctx,
            report,
            artifacts,
            output_errors: vec![],
        }
    }

    fn push(
        &mut self,
        mut ev: Evaluated,
        precision: Precision,
        method: Option<Method>,
        kept_float: &[String],
    ) {
        ev.row.precision = Some(precision);
        ev.row.method = method;
        ev.row.kept_float = kept_float.to_vec();
        self.ctx.sink.row(&ev.row);
        if let Some(e) = &ev.row.error {
            self.ctx.sink.log(&format!("{}: {e}", ev.row.label()));
        }
        self.report.rows.push(ev.row);
        self.artifacts.predictions.push(ev.predictions);
    }

    /// A row for an engine that could not be made at all (calibration or placement failed).
    fn error_row(&mut self, precision: Precision, method: Option<Method>, error: String) {
        let row = Row {
            backend: self.exp.backend.name().into(),
            error: Some(error),
            ..Default::default()
        };
        self.push(Evaluated::failed(row), precision, method, &[]);
    }

    /// FP32 first (the reference for agreement and SQNR), then FP16.
    fn float_rows(&mut self) -> Reference {
        let wants = |pr: Precision| self.exp.precisions.contains(&pr);
        // Agreement and SQNR need FP32's outputs on the evaluation images; with none (a
        // re-time) there is nothing to compare and FP32 is not built for it.
        let needs_reference = self.exp.precisions.iter().any(|&p| p != Precision::Fp32)
            && !self.ctx.samples.is_empty();
        let model = &self.ctx.p.model;
        let mut reference = Reference::default();
        if wants(Precision::Fp32) || needs_reference {
            let mut keep = needs_reference.then(Vec::new);
            let input = BuildInput::Float {
                model,
                precision: Precision::Fp32,
            };
            let ev = self.ctx.row(input, None, &mut keep, "FP32");
            reference = Reference {
                predictions: ev.predictions.clone(),
                classes: ev.classes.clone(),
                outputs: keep.unwrap_or_default(),
                non_finite: ev.row.non_finite.is_some(),
            };
            self.push(ev, Precision::Fp32, None, &[]);
        }
        if wants(Precision::Fp16) && !self.ctx.cancel.is_cancelled() {
            let input = BuildInput::Float {
                model,
                precision: Precision::Fp16,
            };
            let ev = self.ctx.row(input, Some(&reference), &mut None, "FP16");
            self.push(ev, Precision::Fp16, None, &[]);
        }
        reference
    }

    /// Calibrate, place Q/DQ, then build and evaluate one INT8 engine per variant. A stage that
    /// fails leaves an error row per method it would have produced.
    fn int8_rows(&mut self, cache: &StatsCache, reference: &Reference) {
        let plan = quant::plan(&self.ctx.p.model, &self.exp.exclude);
        let variants = crate::guard::catch("calibrating", || self.int8_variants(&plan, cache))
            .map_err(PipelineError::Config)
            .and_then(|r| r);
        let variants = match variants {
            Ok(v) => v,
            Err(PipelineError::Cancelled) => vec![],
            Err(e) => {
                for m in self.exp.methods.clone() {
                    self.error_row(Precision::Int8, Some(m), e.to_string());
                }
                vec![]
            }
        };
        for v in variants {
            if self.ctx.cancel.is_cancelled() {
                break;
            }
            self.int8_row(&plan, v, reference);
        }
    }

    /// Statistics → ranges for every method (with bias correction when asked) → the engines the
    /// experiment wants: one per method, plus the mixed-precision plan.
    fn int8_variants(
        &mut self,
        plan: &QuantPlan,
        cache: &StatsCache,
    ) -> Result<Vec<Int8Variant>, PipelineError> {
        let (exp, p, sink) = (self.exp, self.ctx.p, self.ctx.sink);
        if p.model.info.prequantized {
            return Ok(vec![Int8Variant {
                method: None,
                ranges: None,
                kept_float: vec![],
            }]);
        }
        if exp.methods.is_empty() {
            return Ok(vec![]);
        }
        let (stats, hit, pass_ms) = calibrate(p, plan, cache, sink, self.ctx.cancel)?;
        let t = Instant::now();
        let mut all: Vec<Ranges> = Method::ALL
            .iter()
            .map(|&m| stats.ranges(m, exp.percentile))
            .collect();
        let ranges_ms = t.elapsed().as_secs_f64() * 1e3;
        let asked: Vec<&str> = exp.methods.iter().map(|m| m.name()).collect();
        sink.log(&format!(
            "ranges for {} computed in {ranges_ms:.0} ms (every method's, for the Calibration tab's histograms)",
            asked.join(", ")
        ));
        self.report.calibration = Some(calib_summary(&stats, &all, hit, pass_ms, ranges_ms));
        if exp.bias_correction {
            let used: Vec<Method> = exp
                .methods
                .iter()
                .copied()
                .chain(exp.mixed_precision.as_ref().and_then(|m| m.method))
                .collect();
            let notes = correct_biases(p, plan, &mut all, &used, exp.correction_images, sink)?;
            self.report.notes.extend(notes);
        }
        let mut variants: Vec<Int8Variant> = exp
            .methods
            .iter()
            .map(|&m| Int8Variant {
                method: Some(m),
                ranges: all.iter().find(|r| r.method == m).cloned(),
                kept_float: vec![],
            })
            .collect();
        if let Some(mp) = &exp.mixed_precision {
            let m = mp
                .method
                .or(exp.methods.first().copied())
                .unwrap_or(Method::Max);
            let mut r = mixed_ranges(&all, m, &mp.per_tensor);
            if exp.bias_correction && !mp.per_tensor.is_empty() {
                // The per-tensor ranges differ from the base method's: correct for them.
                let inputs = probe_inputs(p, exp.correction_images)?;
                let reference = crate::layerwise::Fp32Reference::new(&p.model, p.hw, plan, &inputs)
                    .map_err(PipelineError::Config)?;
                let bc = crate::layerwise::bias_correction(&reference, plan, &r)
                    .map_err(PipelineError::Config)?;
                let note = bc.summary("mixed precision", inputs.len());
                sink.log(&note);
                self.report.notes.push(note);
                r.bias_correction = bc.shifts;
            }
            variants.push(Int8Variant {
                method: Some(m),
                ranges: Some(r),
                kept_float: mp.keep_float.clone(),
            });
        }
        Ok(variants)
    }

    /// Places Q/DQ for one variant, exports it when asked, then builds and evaluates its engine.
    fn int8_row(&mut self, plan: &QuantPlan, v: Int8Variant, reference: &Reference) {
        let (exp, p) = (self.exp, self.ctx.p);
        let label = v.label();
        let run_plan = if v.kept_float.is_empty() {
            plan.clone()
        } else {
            let excl: Vec<String> = exp.exclude.iter().chain(&v.kept_float).cloned().collect();
            quant::plan(&p.model, &excl)
        };
        let placed = crate::guard::catch(&format!("placing Q/DQ for {label}"), || {
            quant::build_qdq(&p.model, &run_plan, v.ranges.as_ref()).map_err(|e| e.to_string())
        });
        let qdq = match placed.and_then(|r| r) {
            Ok(q) => q,
            Err(e) => {
                self.error_row(Precision::Int8, v.method, e);
                return;
            }
        };
        let suffix = if v.kept_float.is_empty() {
            ""
        } else {
            "_mixed"
        };
        if let Some(dir) = &exp.output.qdq_dir {
            self.export_int8(dir, &qdq, &v, suffix);
        }
        let input = BuildInput::Quantized {
            model: &p.model,
            qdq: &qdq,
        };
        let ev = self.ctx.row(input, Some(reference), &mut None, &label);
        self.push(ev, Precision::Int8, v.method, &v.kept_float);
        self.artifacts.qdq.push(QdqArtifact {
            method: v.method,
            suffix,
            model: qdq,
        });
    }

    /// The FP8 E4M3 engine: the INT8 placement, activation scales amax / 448 from max
    /// calibration (FP8's range makes clipping methods tuned to int8's uniform grid needless),
    /// weights per channel, nearest rounding. Exported when the experiment's exports ask.
    fn fp8_row(&mut self, cache: &StatsCache, reference: &Reference) {
        let (exp, p) = (self.exp, self.ctx.p);
        let plan = quant::plan(&p.model, &exp.exclude);
        let (sink, cancel) = (self.ctx.sink, self.ctx.cancel);
        let made = crate::guard::catch("calibrating for FP8", || {
            let (stats, _, _) = calibrate(p, &plan, cache, sink, cancel)?;
            let ranges = stats.ranges(Method::Max, exp.percentile);
            quant::build_qdq_as(&p.model, &plan, Some(&ranges), quant::QFormat::Fp8E4M3)
                .map_err(|e| PipelineError::Config(e.to_string()))
        })
        .map_err(PipelineError::Config)
        .and_then(|r| r);
        let qdq = match made {
            Ok(q) => q,
            Err(PipelineError::Cancelled) => return,
            Err(e) => {
                self.error_row(Precision::Fp8, Some(Method::Max), e.to_string());
                return;
            }
        };
        let wants = exp
            .output
            .export_precisions
            .contains(&crate::export::ExportPrecision::Fp8);
        if let (Some(dir), true) = (&exp.output.qdq_dir, wants) {
            let input = self.ctx.bench_input.clone();
            let written = crate::export::export_fp8(
                dir,
                &exp.model,
                &p.model,
                &qdq,
                p.hw,
                self.ctx.backend,
                &input,
            );
            self.record_export(written);
        }
        let input = BuildInput::Quantized {
            model: &p.model,
            qdq: &qdq,
        };
        let ev = self.ctx.row(input, Some(reference), &mut None, "FP8 max");
        self.push(ev, Precision::Fp8, Some(Method::Max), &[]);
        self.artifacts.qdq.push(QdqArtifact {
            method: Some(Method::Max),
            suffix: "",
            model: qdq,
        });
    }

    /// Writes the INT8 Q/DQ model and cache (as `export_qdq` always has) and the mixed
    /// INT8/FP16 model, as the experiment's export precisions ask. The mixed model comes from
    /// the mixed-precision plan, or from the first method when there is no plan.
    fn export_int8(&mut self, dir: &Path, qdq: &QdqModel, v: &Int8Variant, suffix: &str) {
        use crate::export::{self, ExportPrecision};
        let (exp, p) = (self.exp, self.ctx.p);
        let wants = |e: ExportPrecision| exp.output.export_precisions.contains(&e);
        if wants(ExportPrecision::Int8) {
            // The cache's ranges belong to the prepared graph when a rewrite changed it.
            let rewritten = self.report.equalization.as_ref().is_some_and(|e| e.applied)
                || self.report.centering.as_ref().is_some_and(|c| c.applied());
            let written = export_qdq(dir, &exp.model, qdq, v.method, suffix).and_then(|files| {
                let fp32 = export::fp32_for_cache(dir, &exp.model, &p.model, rewritten)?;
                let spec = crate::quant::trtexec::InputSpec::new(
                    &p.model.info,
                    &p.model.input_shape(1, p.hw),
                );
                Ok(export::int8_entry(&files, qdq, &fp32, &spec))
            });
            self.record_export(written);
        }
        let is_plan = !v.kept_float.is_empty();
        let first_without_plan =
            exp.mixed_precision.is_none() && !self.report.exports.iter().any(|e| e.kind == "mixed");
        if wants(ExportPrecision::Mixed) && (is_plan || first_without_plan) {
            let input = self.ctx.bench_input.clone();
            let written = export::export_mixed(
                dir,
                &exp.model,
                &p.model,
                qdq,
                p.hw,
                self.ctx.backend,
                &input,
            );
            self.record_export(written);
        }
    }

    /// Writes the strongly typed FP16 model when the experiment's exports ask for it.
    fn export_fp16(&mut self) {
        let (exp, p) = (self.exp, self.ctx.p);
        let Some(dir) = &exp.output.qdq_dir else {
            return;
        };
        if !exp
            .output
            .export_precisions
            .contains(&crate::export::ExportPrecision::Fp16)
        {
            return;
        }
        let input = self.ctx.bench_input.clone();
        let written = crate::export::export_fp16(dir, &p.model, p.hw, self.ctx.backend, &input);
        self.record_export(written);
    }

    /// Logs an export and adds it to the report, or records why it failed.
    fn record_export(&mut self, written: Result<crate::export::ExportedModel, String>) {
        match written {
            Ok(e) => {
                self.ctx.sink.log(&e.summary());
                self.report.exports.push(e);
            }
            Err(e) => {
                self.ctx.sink.log(&format!("export: {e}"));
                self.output_errors.push(e);
            }
        }
    }

    /// Marks a stopped run as incomplete and writes every output it asks for.
    fn finish(mut self) -> RunOutput {
        self.report.incomplete = self.ctx.cancel.is_cancelled();
        self.report
            .notes
            .extend(self.ctx.batch_refused.borrow_mut().take());
        self.report.notes.extend(self.ctx.p.assumptions());
        self.report
            .notes
            .extend(geometry_note(self.ctx.p, self.ctx.samples));
        let busy: Vec<String> = self
            .report
            .rows
            .iter()
            .filter_map(|r| r.timing_load.and_then(|l| l.warning(&r.label())))
            .collect();
        self.report.notes.extend(busy);
        for note in crate::report::slower_quantized_notes(&self.report.rows) {
            self.ctx.sink.log(&note);
            self.report.notes.push(note);
        }
        if self.report.incomplete && self.report.finished_rows() == 0 {
            // A report of nothing would replace a complete one from an earlier run.
            self.ctx.sink.log(
                "stopped before any row finished: no output written, existing files left as they were",
            );
        } else {
            let errors = write_outputs(self.exp, &self.report, &self.artifacts, self.ctx.sink);
            self.output_errors.extend(errors);
        }
        RunOutput {
            report: self.report,
            artifacts: self.artifacts,
            output_errors: self.output_errors,
        }
    }
}

/// Runs the whole experiment.
pub fn run(
    exp: &Experiment,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<RunOutput, PipelineError> {
    let cache = StatsCache {
        dir: StatsCache::default_dir(),
    };
    run_with_cache(exp, &cache, sink, cancel)
}

/// The stages, top-down: load and validate the model, list the data (`prepare`); check the
/// backend; preprocess the evaluation images; FP32 and FP16 rows; calibrate, place Q/DQ and run
/// the INT8 rows; write the report. Once rows exist, failures become error rows and cancelling
/// keeps what is finished (marked incomplete), so the report is always written.
pub fn run_with_cache(
    exp: &Experiment,
    cache: &StatsCache,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<RunOutput, PipelineError> {
    check_outputs(exp, &[], &[])?;
    let p = prepare(exp)?;
    // The CPU engine runs the statistics passes on every backend, so it is settled first.
    let cpu_engine = backend::cpu::set_engine(exp.cpu_engine).map_err(PipelineError::Config)?;
    let backend = usable_backend(exp)?;
    let threads = backend::cpu::set_threads(exp.threads);
    sink.log(&format!("CPU engine: {}", cpu_engine.summary()));
    if exp.backend == backend::BackendKind::Cpu {
        sink.log(&format!(
            "CPU engines run on {threads} thread{}",
            if threads == 1 { "" } else { "s" }
        ));
    }
    let samples = load_samples(&p, sink, cancel)?;
    let ctx = RowCtx {
        backend: backend.as_ref(),
        p: &p,
        samples: &samples,
        classes: classes_of(&p),
        bench_spec: &exp.bench,
        bench_input: bench_input(&p, &samples)?,
        sink,
        cancel,
        batch_refused: Default::default(),
        batch_ok: Default::default(),
        threads: (exp.backend == backend::BackendKind::Cpu).then_some(threads),
    };
    // Declared before `rows`, which borrows it for the INT8 rows.
    let int8_prepared: Prepared;
    let mut rows = Rows::new(exp, ctx);
    // Said at once; the report lists them after the run's own notes (see `finish`).
    for line in p.assumptions() {
        sink.log(&line);
    }
    if let Some(g) = geometry_note(&p, &samples) {
        sink.log(&g);
    }
    let reference = rows.float_rows();
    if !cancel.is_cancelled() {
        rows.export_fp16();
    }
    if exp.precisions.contains(&Precision::Int8) && !cancel.is_cancelled() {
        let (equalized, summary) = equalize_for_int8(&p, exp);
        // A model with nothing to equalize gets no note (the report's field still says so).
        let nothing = equalized
            .1
            .as_ref()
            .is_some_and(|e| e.pairs.is_empty() && e.skipped.is_empty());
        if !nothing {
            sink.log(&summary);
            rows.report.notes.push(summary);
        }
        rows.report.equalization = equalized.1;
        let (centered, summary) = center_for_int8(&equalized.0, exp);
        if centered.1.as_ref().is_some_and(|c| c.applied()) {
            sink.log(&summary);
            rows.report.notes.push(summary);
        }
        rows.report.centering = centered.1;
        let gptq = exp.weight_rounding == quant::gptq::WeightRounding::Gptq;
        if gptq || exp.bias_correction {
            let note = format!(
                "{} measured each layer on the first {} of the {} calibration images (--correction-images; the ranges use them all)",
                match (gptq, exp.bias_correction) {
                    (true, true) => "GPTQ and bias correction",
                    (true, false) => "GPTQ",
                    _ => "bias correction",
                },
                exp.correction_images.min(p.calib_images.len()),
                p.calib_images.len()
            );
            sink.log(&note);
            rows.report.notes.push(note);
        }
        int8_prepared = match exp.weight_rounding {
            quant::gptq::WeightRounding::Nearest => centered.0,
            quant::gptq::WeightRounding::Gptq => {
                let (rounded, note) = round_weights_for_int8(&centered.0, exp, sink);
                sink.log(&note);
                rows.report.notes.push(note);
                rounded
            }
        };
        rows.ctx.p = &int8_prepared;
        rows.int8_rows(cache, &reference);
    }
    if exp.precisions.contains(&Precision::Fp8) && !cancel.is_cancelled() {
        // From the model as prepared: equalization and GPTQ rounding are INT8's.
        rows.ctx.p = &p;
        rows.fp8_row(cache, &reference);
    }
    Ok(rows.finish())
}

/// Input moments held at once; layers past it wait for another FP32 pass.
const GPTQ_PASS_BYTES: usize = 512 << 20;

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
fn gptq_model(
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
fn cle_activation_ranges(
    p: &Prepared,
    exp: &Experiment,
) -> Result<HashMap<String, Vec<f32>>, String> {
    channel_maxima(p, &quant::cle::between_tensors(&p.model, exp.cle_clip))
}

/// Per channel, max |x| over the calibration images (an FP32 pass of `p`'s model) of each
/// (NCHW tensor, channel count); one channel gives the tensor's max |x|.
fn channel_maxima(
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

/// Refuses, before the run, an output that would destroy an input (the model, the labels, the
/// experiment file, a data folder's masks), an output that is a folder, and two outputs that
/// are one file. `more_inputs` and `more_outputs` are the caller's own (the CLI's experiment
/// file and `--save-experiment`).
pub fn check_outputs(
    exp: &Experiment,
    more_inputs: &[(&Path, &str)],
    more_outputs: &[&Path],
) -> Result<(), PipelineError> {
    let o = &exp.output;
    let files: Vec<&Path> = [&o.report_json, &o.markdown, &o.csv]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .chain(more_outputs.iter().copied())
        .collect();
    let err = |e: crate::files::OutputError| PipelineError::Config(e.to_string());
    crate::files::check_outputs(files.iter().copied()).map_err(err)?;
    let mut inputs: Vec<(&Path, &str)> = vec![(exp.model.as_path(), "the model")];
    inputs.extend(
        exp.evaluation
            .labels
            .as_deref()
            .map(|l| (l, "the labels file")),
    );
    inputs.extend_from_slice(more_inputs);
    crate::files::refuse_inputs(files.iter().copied(), &inputs).map_err(err)?;
    for (i, f) in files.iter().enumerate() {
        crate::files::refuse_inputs(
            files[i + 1..].iter().copied(),
            &[(f, "another output of this run")],
        )
        .map_err(err)?;
    }
    // Overlays are named after the images: written into a data folder they would replace the
    // ground-truth masks.
    let mut data_dirs: Vec<(PathBuf, &str)> = vec![];
    if let Some(d) = &exp.evaluation.dir {
        data_dirs.push((d.clone(), "the evaluation folder"));
        data_dirs.push((d.join("masks"), "the evaluation masks"));
        data_dirs.push((d.join("images"), "the evaluation images"));
    }
    if let Some(d) = &exp.calibration.dir {
        data_dirs.push((d.clone(), "the calibration folder"));
    }
    let data_refs: Vec<(&Path, &str)> = data_dirs.iter().map(|(p, w)| (p.as_path(), *w)).collect();
    let dirs: Vec<&Path> = [&o.masks_dir, &o.qdq_dir]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .collect();
    crate::files::refuse_inputs(dirs.iter().copied(), &data_refs).map_err(err)?;
    // Nothing goes inside a data folder either: a report or an overlay there would be read as
    // data by the next run (and the folder is the user's, not ours).
    crate::files::refuse_inside(files.iter().chain(&dirs).copied(), &data_refs).map_err(err)
}

/// The experiment's backend, if it can run on this machine.
fn usable_backend(exp: &Experiment) -> Result<Box<dyn backend::Backend>, PipelineError> {
    let backend = backend::backend_with(exp.backend, exp.fp32_math);
    match backend.check() {
        Ok(_) => Ok(backend),
        Err(why) => Err(PipelineError::Config(format!(
            "backend `{}` cannot run here: {why}. Use --backend cpu, which runs everywhere",
            exp.backend.name()
        ))),
    }
}

/// How many classes the metrics count: the evaluation set's names for a classifier, else the
/// model's output channels.
pub fn classes_of(p: &Prepared) -> usize {
    match &p.eval {
        Some(e) if !e.classes.is_empty() && e.kind == Task::Classification => e.classes.len(),
        _ => p.output_channels.unwrap_or(0),
    }
}

/// The input every engine is timed on: the first evaluation image, else the first calibration
/// image, else a constant tensor.
fn bench_input(p: &Prepared, samples: &[Sample]) -> Result<Vec<f32>, PipelineError> {
    Ok(match (samples.first(), p.calib_images.first()) {
        (Some(s), _) => s.input.clone(),
        (None, Some(path)) => p.input_of(&data::open_rgb(path)?),
        (None, None) => vec![0.5; p.model.input_shape(1, p.hw).iter().product()],
    })
}

/// The model's class count: its output's channel dimension, from the file or from `shapes`
/// (inferred at the experiment's input size).
fn output_channels(model: &Model, shapes: Option<&HashMap<String, Vec<usize>>>) -> Option<usize> {
    let s = &model.info.outputs.first()?.shape;
    s.get(1)
        .copied()
        .flatten()
        .map(|v| v as usize)
        .or_else(|| shapes?.get(model.output_name())?.get(1).copied())
}

/// Refuses a run whose tensors cannot fit in memory (`--size 30000,30000`, `--batch 100000`)
/// before anything allocates them: an allocation failure aborts the process, which no error
/// handling can catch. The estimate is every activation at once, times the batch.
fn check_memory(
    model: &Model,
    hw: [usize; 2],
    batch: usize,
    shapes: Option<&HashMap<String, Vec<usize>>>,
) -> Result<(), PipelineError> {
    let Some(available) = bench::available_memory_bytes() else {
        return Ok(());
    };
    let input: u64 = model
        .input_shape(1, hw)
        .iter()
        .fold(4u64, |a, &d| a.saturating_mul(d as u64));
    // Without shapes (tract could not infer them), assume activations 16x the input.
    let activations: u64 = match shapes {
        Some(s) => s
            .values()
            .map(|d| d.iter().fold(4u64, |a, &v| a.saturating_mul(v as u64)))
            .fold(0u64, u64::saturating_add),
        None => input.saturating_mul(16),
    };
    let need = input
        .saturating_add(activations)
        .saturating_mul(batch.max(1) as u64);
    if need > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(PipelineError::Config(format!(
            "{}: at {}x{} and batch {batch} the engines need about {:.1} GiB of activations, but {:.1} GiB \
             of memory is available; use a smaller --size or --batch",
            model.path.display(),
            hw[0],
            hw[1],
            gib(need),
            gib(available)
        )));
    }
    Ok(())
}

fn calib_summary(
    stats: &Stats,
    all: &[Ranges],
    cache_hit: bool,
    pass_ms: f64,
    ranges_ms: f64,
) -> CalibSummary {
    let tensors = stats
        .tensors
        .iter()
        .map(|(name, h)| {
            let (bin_width, counts) = h.downsampled(256);
            TensorRanges {
                tensor: name.clone(),
                bin_width,
                counts,
                amax: all
                    .iter()
                    .filter_map(|r| r.amax.get(name).map(|a| (r.method, *a)))
                    .collect(),
            }
        })
        .collect();
    CalibSummary {
        images: stats.images,
        cache_hit,
        pass_ms,
        ranges_ms,
        tensors,
    }
}

/// Writes `<model>_int8_<method><suffix>.onnx` and its TensorRT calibration cache into `dir`;
/// returns both paths.
pub fn export_qdq(
    dir: &std::path::Path,
    model_path: &Path,
    qdq: &QdqModel,
    method: Option<Method>,
    suffix: &str,
) -> Result<[PathBuf; 2], String> {
    let stem = model_path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model");
    let m = method.map(|m| m.name()).unwrap_or("qat");
    let base = format!("{stem}_int8_{m}{suffix}");
    let (onnx, cache) = (
        dir.join(format!("{base}.onnx")),
        dir.join(format!("{base}.cache")),
    );
    let err = |e: crate::files::OutputError| e.to_string();
    crate::files::refuse_inputs([onnx.as_path()], &[(model_path, "the model")]).map_err(err)?;
    qdq.save(&onnx).map_err(err)?;
    qdq.save_calibration_cache(&cache).map_err(err)?;
    Ok([onnx, cache])
}

/// The inputs of `paths`, back to back, decoded and preprocessed on the thread pool.
fn decode_batch(p: &Prepared, paths: &[PathBuf]) -> Result<Vec<f32>, PipelineError> {
    use rayon::prelude::*;
    let inputs: Vec<Vec<f32>> = paths
        .par_iter()
        .map(|f| data::open_rgb(f).map(|img| p.input_of(&img)))
        .collect::<Result<_, _>>()?;
    Ok(inputs.concat())
}

/// Probe inputs for passes that need activations: the first 32 calibration images.
pub fn probe_inputs(p: &Prepared, n: usize) -> Result<Vec<Vec<f32>>, PipelineError> {
    p.calib_images
        .iter()
        .take(n.max(1))
        .map(|f| data::open_rgb(f).map(|img| p.input_of(&img)))
        .collect::<Result<_, _>>()
        .map_err(PipelineError::from)
}

/// Fills each used method's bias correction (passes over the first `images` calibration
/// images); returns, per method, the line saying which correction was kept.
fn correct_biases(
    p: &Prepared,
    plan: &QuantPlan,
    all: &mut [Ranges],
    used: &[Method],
    images: usize,
    sink: &dyn Sink,
) -> Result<Vec<String>, PipelineError> {
    let inputs = probe_inputs(p, images)?;
    let t = Instant::now();
    let todo: Vec<&mut Ranges> = all
        .iter_mut()
        .filter(|r| used.contains(&r.method))
        .collect();
    let n = todo.len();
    let mut notes = vec![];
    let reference = crate::layerwise::Fp32Reference::new(&p.model, p.hw, plan, &inputs)
        .map_err(PipelineError::Config)?;
    for (i, r) in todo.into_iter().enumerate() {
        sink.progress("bias correction", i, n);
        let bc = crate::layerwise::bias_correction(&reference, plan, r)
            .map_err(PipelineError::Config)?;
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

/// Ranges of `method`, with per-tensor overrides from a mixed-precision plan.
pub fn mixed_ranges(
    all: &[Ranges],
    method: Method,
    per_tensor: &std::collections::BTreeMap<String, Method>,
) -> Ranges {
    let of = |m: Method| all.iter().find(|r| r.method == m);
    let mut r = of(method).cloned().unwrap_or_else(|| all[0].clone());
    for (t, m) in per_tensor {
        if let Some(a) = of(*m).and_then(|x| x.amax.get(t)) {
            r.amax.insert(t.clone(), *a);
        }
    }
    r
}

/// Writes the report files and mask overlays the experiment asks for; returns what failed.
fn write_outputs(
    exp: &Experiment,
    report: &Report,
    artifacts: &Artifacts,
    sink: &dyn Sink,
) -> Vec<String> {
    let o = &exp.output;
    let mut failed: Vec<String> = report
        .write(
            o.report_json.as_deref(),
            o.markdown.as_deref(),
            o.csv.as_deref(),
        )
        .into_iter()
        .map(|e| e.to_string())
        .collect();
    if let Some(dir) = &o.masks_dir {
        if report.model.task != Some(Task::Segmentation) {
            sink.log("--save-masks applies to segmentation models only");
        } else {
            match save_masks(dir, report, artifacts, o.mask_count) {
                Ok(n) => sink.log(&format!("wrote {n} mask overlays to {}", dir.display())),
                Err(e) => failed.push(format!("mask overlays in {}: {e}", dir.display())),
            }
        }
    }
    for e in &failed {
        sink.log(&format!("could not write an output: {e}"));
    }
    failed
}

/// Writes overlays for the first `count` images: FP32 and every INT8 row.
pub fn save_masks(
    dir: &std::path::Path,
    report: &Report,
    artifacts: &Artifacts,
    count: usize,
) -> Result<usize, String> {
    let Some(fp32_i) = report
        .rows
        .iter()
        .position(|r| r.precision == Some(Precision::Fp32) && !r.failed())
    else {
        return Err("no FP32 result to compare with".into());
    };
    let mut n = 0;
    for (i, file) in report.evaluation.image_files.iter().enumerate().take(count) {
        let Some(fp32) = artifacts.predictions[fp32_i].get(i) else {
            continue;
        };
        let hw = artifacts.mask_hw[i];
        let img = data::open_rgb(file).map_err(|e| e.to_string())?;
        let img = image::imageops::resize(
            &img,
            hw[1] as u32,
            hw[0] as u32,
            image::imageops::FilterType::Triangle,
        );
        let others: Vec<(String, &[u8])> = report
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.precision == Some(Precision::Int8) && !r.failed())
            .filter_map(|(k, r)| {
                artifacts.predictions[k]
                    .get(i)
                    .map(|m| (r.label(), m.as_slice()))
            })
            .collect();
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("image");
        crate::report::write_mask_overlays(dir, stem, &img, fp32, &others)
            .map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendError, EngineInfo, Output};

    /// Answers image k with a one-hot logit at `classes[k]`.
    struct OneHot {
        info: EngineInfo,
        classes: Vec<usize>,
        width: usize,
        next: usize,
    }

    impl Engine for OneHot {
        fn info(&self) -> &EngineInfo {
            &self.info
        }
        fn batch(&self) -> usize {
            1
        }
        fn run(&mut self, _input: &[f32]) -> Result<Output, BackendError> {
            let mut data = vec![0.0; self.width];
            data[self.classes[self.next]] = 1.0;
            self.next += 1;
            Ok(Output {
                shape: vec![1, self.width],
                data,
            })
        }
    }

    struct Quiet;
    impl Sink for Quiet {
        fn progress(&self, _: &str, _: usize, _: usize) {}
        fn log(&self, _: &str) {}
    }

    fn sample(label: usize) -> Sample {
        Sample {
            input: vec![0.0],
            label: Label::Class(label),
            gt: None,
            geometry: Geometry {
                orig_hw: [1, 1],
                input_hw: [1, 1],
                resized_hw: [1, 1],
                origin: [0, 0],
            },
        }
    }

    fn run(classes: &[usize], reference: Option<&Reference>) -> Evaluated {
        let mut e = OneHot {
            info: EngineInfo::default(),
            classes: classes.to_vec(),
            width: 1000,
            next: 0,
        };
        let samples: Vec<Sample> = classes.iter().map(|&c| sample(c)).collect();
        evaluate(
            &mut e,
            &samples,
            Task::Classification,
            1000,
            reference,
            &Quiet,
            "test",
            &CancelToken::default(),
            &mut None,
        )
        .expect("evaluate")
    }

    /// Agreement of a 1000-class model counts every image, with the full class index (it used
    /// to keep `min(class, 255)` in a byte and skip 255, so most ImageNet classes fell out).
    #[test]
    fn classifier_agreement_counts_every_class_index() {
        let fp32 = run(&[700, 300, 999, 12], None);
        assert_eq!(fp32.classes, [700, 300, 999, 12]);
        let reference = Reference {
            predictions: fp32.predictions,
            classes: fp32.classes,
            outputs: vec![],
            non_finite: false,
        };
        // 300 → 301 and 999 → 998 both sit above 255 and differ; 700 and 12 agree.
        let int8 = run(&[700, 301, 998, 12], Some(&reference));
        assert_eq!(int8.row.agreement, Some(0.5));
        let same = run(&[700, 300, 999, 12], Some(&reference));
        assert_eq!(same.row.agreement, Some(1.0));
    }
}
