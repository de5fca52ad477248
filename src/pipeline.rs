//! Runs an `Experiment` from model to report: load, prepare data, calibrate (or take the
//! cached statistics), place Q/DQ, build each engine, evaluate it against FP32, time it.
//! Each finished row is handed to the `Sink` at once, so a cancelled run keeps what it has.

use std::collections::HashSet;
use std::path::PathBuf;
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
    pub qdq: Vec<(Method, QdqModel)>,
}

pub struct RunOutput {
    pub report: Report,
    pub artifacts: Artifacts,
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
}

pub fn prepare(exp: &Experiment) -> Result<Prepared, PipelineError> {
    let model = Model::load(&exp.model)?;
    model.check_supported()?;
    let hw = model.input_hw(exp.preprocess.size)?;
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
            let mut set = EvalSet::open(d, &exclude)?;
            if let Some(n) = exp.evaluation.count {
                set.items.truncate(n);
            }
            if let Some(l) = &exp.evaluation.labels {
                set.classes = data::read_labels(l).ok_or_else(|| {
                    PipelineError::Config(format!(
                        "{}: cannot read class names (one per line)",
                        l.display()
                    ))
                })?;
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
    if let (Some(t), Some(e)) = (task, &eval)
        && t != e.kind
    {
        return Err(PipelineError::Config(format!(
            "{}: the evaluation folder is laid out for {:?} but the model's task is {:?}",
            e.root.display(),
            e.kind,
            t
        )));
    }
    Ok(Prepared {
        model,
        hw,
        task,
        eval,
        calib_images,
    })
}

pub fn load_samples(
    p: &Prepared,
    exp: &Experiment,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<Vec<Sample>, PipelineError> {
    let Some(set) = &p.eval else {
        return Ok(vec![]);
    };
    let channels = p.model.info.input_chw[0];
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
            input: exp
                .preprocess
                .apply(&img, p.hw, channels, p.model.info.layout),
            label: it.label.clone(),
            gt,
            geometry: Geometry {
                orig_hw: [img.height() as usize, img.width() as usize],
                input_hw: p.hw,
                resize: exp.preprocess.resize,
            },
        });
    }
    Ok(out)
}

/// Collects (or loads) calibration statistics for the plan's tensors.
pub fn calibrate(
    p: &Prepared,
    exp: &Experiment,
    plan: &QuantPlan,
    cache: &StatsCache,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<(Stats, bool, f64), PipelineError> {
    let tensors = plan.tensors();
    let prep = format!(
        "{}|{:?}",
        ron::to_string(&exp.preprocess).unwrap_or_default(),
        p.hw
    );
    let key = calib::cache_key(&p.model.fingerprint(), &tensors, &p.calib_images, &prep);
    if let Some(s) = cache.load(&key) {
        sink.log(&format!(
            "calibration statistics from cache ({} images, key {key})",
            s.images
        ));
        return Ok((s, true, 0.0));
    }
    if p.calib_images.is_empty() {
        return Err(PipelineError::Config(
            "INT8 needs calibration images: set a calibration folder (--calib DIR)".into(),
        ));
    }
    let t0 = Instant::now();
    let probe = backend::cpu::Probe::new(&p.model, p.hw, &tensors)
        .map_err(|e| PipelineError::Config(format!("{e}")))?;
    let mut stats = Stats::new(key, &tensors);
    let channels = p.model.info.input_chw[0];
    let n = p.calib_images.len();
    // Histograms are filled on a second thread while the next image runs.
    let (tx, rx) = crossbeam_channel::bounded::<Vec<backend::cpu::Activation>>(2);
    let result = std::thread::scope(|s| -> Result<(), PipelineError> {
        let names = &tensors;
        let stats = &mut stats;
        let filler = std::thread::Builder::new()
            .name("quantscope-histograms".into())
            .spawn_scoped(s, move || {
                for acts in rx {
                    stats.add(names, &acts);
                }
            })
            .map_err(|e| PipelineError::Config(e.to_string()))?;
        for (i, path) in p.calib_images.iter().enumerate() {
            if cancel.is_cancelled() {
                break;
            }
            sink.progress("calibrating (FP32 pass)", i, n);
            let img = data::open_rgb(path)?;
            let input = exp
                .preprocess
                .apply(&img, p.hw, channels, p.model.info.layout);
            let (_, acts) = probe
                .run(&input)
                .map_err(|e| PipelineError::Config(format!("{}: {e}", path.display())))?;
            if tx.send(acts).is_err() {
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
    sink.log(&format!("calibration pass: {n} images in {ms:.0} ms"));
    Ok((stats, false, ms))
}

/// The result of evaluating one engine.
pub struct Evaluated {
    pub row: Row,
    pub predictions: Vec<Vec<u8>>,
}

/// FP32 reference kept while the other engines run.
#[derive(Default)]
pub struct Reference {
    pub predictions: Vec<Vec<u8>>,
    pub outputs: Vec<Vec<f32>>,
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
    let mut kept_bytes = 0usize;
    for (i, s) in samples.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err("cancelled".into());
        }
        sink.progress(stage, i, samples.len());
        let out = engine.run(&s.input).map_err(|e| e.to_string())?;
        let pred: Vec<u8> = match task {
            Task::Classification => {
                let Label::Class(label) = s.label else {
                    return Err("classification needs class labels".into());
                };
                let p = class.add(&out.data, label);
                row.per_image.push((p == label) as u8 as f64);
                vec![p.min(255) as u8]
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
            if let Some(rp) = r.predictions.get(i) {
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
    Ok(Evaluated { row, predictions })
}

/// Builds an engine, evaluates and benchmarks it; errors land in the row.
#[allow(clippy::too_many_arguments)]
fn run_row(
    backend: &dyn backend::Backend,
    input: BuildInput<'_>,
    p: &Prepared,
    samples: &[Sample],
    classes: usize,
    bench_spec: &BenchSpec,
    bench_input: &[f32],
    reference: Option<&Reference>,
    keep_outputs: &mut Option<Vec<Vec<f32>>>,
    sink: &dyn Sink,
    cancel: &CancelToken,
    label: &str,
) -> Evaluated {
    let mut row = Row {
        backend: backend.kind().name().into(),
        ..Default::default()
    };
    // Engine memory = growth over the build + peak growth while timing. Evaluation is left
    // out: it holds the FP32 outputs kept for SQNR, which are not the engine's.
    let (rss_before, _) = bench::rss_bytes();
    let t = Instant::now();
    let spec = BuildSpec { batch: 1, hw: p.hw };
    let precision = input.precision();
    sink.progress(&format!("building {label}"), 0, 1);
    let mut engine = match backend.build(input, spec) {
        Ok(e) => e,
        Err(e) => {
            row.error = Some(e.to_string());
            return Evaluated {
                row,
                predictions: vec![],
            };
        }
    };
    row.build_ms = Some(t.elapsed().as_secs_f64() * 1e3);
    let built_growth = bench::rss_bytes().0.saturating_sub(rss_before);
    let mut predictions = vec![];
    if let Some(task) = p.task.filter(|_| !samples.is_empty()) {
        match evaluate(
            engine.as_mut(),
            samples,
            task,
            classes,
            reference,
            sink,
            &format!("evaluating {label}"),
            cancel,
            keep_outputs,
        ) {
            Ok(ev) => {
                let build_ms = row.build_ms;
                let backend_name = row.backend.clone();
                row = ev.row;
                row.build_ms = build_ms;
                row.backend = backend_name;
                predictions = ev.predictions;
            }
            Err(e) => {
                row.error = Some(e);
                return Evaluated { row, predictions };
            }
        }
    }
    let keep_going = || !cancel.is_cancelled();
    sink.progress(&format!("timing {label}"), 0, 1);
    bench::reset_peak_rss();
    let (rss_timing, _) = bench::rss_bytes();
    let timed = bench::measure(engine.as_mut(), bench_input, bench_spec, &keep_going);
    let peak_rss = built_growth + bench::rss_bytes().1.saturating_sub(rss_timing);
    match timed {
        Ok(l) => {
            row.throughput_ips = (l.median > 0.0).then(|| 1e3 / l.median);
            row.latency_ms = Some(l);
        }
        Err(e) => row.error = Some(format!("timing: {e}")),
    }
    let info = engine.info().clone();
    drop(engine);
    if bench_spec.batch > 1 && !cancel.is_cancelled() {
        let b = bench_spec.batch;
        let batched: Vec<f32> = bench_input
            .iter()
            .copied()
            .cycle()
            .take(bench_input.len() * b)
            .collect();
        sink.progress(&format!("timing {label} at batch {b}"), 0, 1);
        match backend.build(input, BuildSpec { batch: b, hw: p.hw }) {
            Ok(mut e) => {
                if let Ok(l) = bench::measure(e.as_mut(), &batched, bench_spec, &keep_going) {
                    row.throughput_batch_ips = (l.median > 0.0).then(|| b as f64 * 1e3 / l.median);
                    row.latency_batch_ms = Some(l);
                    row.batch = Some(b);
                    row.layer_times_batch = e.info().layer_times.clone();
                }
            }
            Err(e) => sink.log(&format!("{label}: batch {b} engine: {e}")),
        }
    }
    row.memory_bytes = Some(MemoryBytes {
        weights: info.weights_bytes,
        activations: info.activations_bytes,
        peak_rss,
    });
    row.simulated = info.simulated;
    if precision == Precision::Int8 {
        row.int8_nodes = Some(info.int8_nodes);
        row.float_nodes = info.float_nodes;
    }
    row.layer_times = info.layer_times;
    Evaluated { row, predictions }
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

pub fn run_with_cache(
    exp: &Experiment,
    cache: &StatsCache,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<RunOutput, PipelineError> {
    let p = prepare(exp)?;
    let backend = backend::backend(exp.backend);
    if let Err(why) = backend.check() {
        return Err(PipelineError::Config(format!(
            "backend `{}` cannot run here: {why}",
            exp.backend.name()
        )));
    }
    let samples = load_samples(&p, exp, sink, cancel)?;
    let classes = match (&p.eval, p.task) {
        (Some(e), _) if !e.classes.is_empty() && e.kind == Task::Classification => e.classes.len(),
        _ => output_channels(&p).unwrap_or(0),
    };
    let channels = p.model.info.input_chw[0];
    let bench_input = match (samples.first(), p.calib_images.first()) {
        (Some(s), _) => s.input.clone(),
        (None, Some(path)) => {
            exp.preprocess
                .apply(&data::open_rgb(path)?, p.hw, channels, p.model.info.layout)
        }
        (None, None) => vec![0.5; p.model.input_shape(1, p.hw).iter().product()],
    };
    let mut report = Report {
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
        preprocess: exp.preprocess.clone(),
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
    };
    let mut artifacts = Artifacts {
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
    let push =
        |report: &mut Report, artifacts: &mut Artifacts, mut ev: Evaluated, precision, method| {
            ev.row.precision = Some(precision);
            ev.row.method = method;
            sink.row(&ev.row);
            if let Some(e) = &ev.row.error {
                sink.log(&format!("{}: {e}", ev.row.label()));
            }
            report.rows.push(ev.row);
            artifacts.predictions.push(ev.predictions);
        };

    // FP32 first: the reference for agreement and SQNR.
    let mut reference = Reference::default();
    let wants = |pr: Precision| exp.precisions.contains(&pr);
    let needs_reference = exp.precisions.iter().any(|&p| p != Precision::Fp32);
    if wants(Precision::Fp32) || needs_reference {
        let mut keep = needs_reference.then(Vec::new);
        let ev = run_row(
            backend.as_ref(),
            BuildInput::Float {
                model: &p.model,
                precision: Precision::Fp32,
            },
            &p,
            &samples,
            classes,
            &exp.bench,
            &bench_input,
            None,
            &mut keep,
            sink,
            cancel,
            "FP32",
        );
        reference = Reference {
            predictions: ev.predictions.clone(),
            outputs: keep.unwrap_or_default(),
        };
        push(&mut report, &mut artifacts, ev, Precision::Fp32, None);
    }
    if cancel.is_cancelled() {
        return Ok(RunOutput { report, artifacts });
    }
    if wants(Precision::Fp16) {
        let ev = run_row(
            backend.as_ref(),
            BuildInput::Float {
                model: &p.model,
                precision: Precision::Fp16,
            },
            &p,
            &samples,
            classes,
            &exp.bench,
            &bench_input,
            Some(&reference),
            &mut None,
            sink,
            cancel,
            "FP16",
        );
        push(&mut report, &mut artifacts, ev, Precision::Fp16, None);
    }
    if wants(Precision::Int8) && !cancel.is_cancelled() {
        let plan = quant::plan(&p.model, &exp.exclude);
        let methods: Vec<Method> = if p.model.info.prequantized {
            vec![]
        } else {
            exp.methods.clone()
        };
        let stats = if methods.is_empty() {
            None
        } else {
            match calibrate(&p, exp, &plan, cache, sink, cancel) {
                Ok(s) => Some(s),
                Err(PipelineError::Cancelled) => return Ok(RunOutput { report, artifacts }),
                Err(e) => {
                    for &m in &methods {
                        let row = Row {
                            backend: exp.backend.name().into(),
                            error: Some(e.to_string()),
                            ..Default::default()
                        };
                        push(
                            &mut report,
                            &mut artifacts,
                            Evaluated {
                                row,
                                predictions: vec![],
                            },
                            Precision::Int8,
                            Some(m),
                        );
                    }
                    None
                }
            }
        };
        let mut runs: Vec<(Option<Method>, Option<Ranges>, Vec<String>)> = vec![];
        if let Some((stats, hit, pass_ms)) = &stats {
            let t = Instant::now();
            let mut all: Vec<Ranges> = Method::ALL
                .iter()
                .map(|&m| stats.ranges(m, exp.percentile))
                .collect();
            let ranges_ms = t.elapsed().as_secs_f64() * 1e3;
            sink.log(&format!(
                "ranges for all four methods computed in {ranges_ms:.0} ms"
            ));
            report.calibration = Some(calib_summary(stats, &all, *hit, *pass_ms, ranges_ms));
            if exp.bias_correction {
                let used: Vec<Method> = methods
                    .iter()
                    .copied()
                    .chain(exp.mixed_precision.as_ref().and_then(|m| m.method))
                    .collect();
                correct_biases(&p, exp, &plan, &mut all, &used, sink)?;
            }
            for &m in &methods {
                runs.push((Some(m), all.iter().find(|r| r.method == m).cloned(), vec![]));
            }
            if let Some(mp) = &exp.mixed_precision {
                let m = mp
                    .method
                    .or(methods.first().copied())
                    .unwrap_or(Method::Max);
                let mut r = mixed_ranges(&all, m, &mp.per_tensor);
                if exp.bias_correction && !mp.per_tensor.is_empty() {
                    // The per-tensor ranges differ from the base method's: correct for them.
                    let inputs = probe_inputs(&p, exp, 32)?;
                    r.bias_correction =
                        crate::sensitivity::bias_corrections(&p, &plan, &r, &inputs)?;
                }
                runs.push((Some(m), Some(r), mp.keep_float.clone()));
            }
        } else if p.model.info.prequantized {
            runs.push((None, None, vec![]));
        }
        for (method, ranges, kept_float) in runs {
            if cancel.is_cancelled() {
                break;
            }
            let label = match (method, kept_float.len()) {
                (Some(m), 0) => format!("INT8 {m}"),
                (Some(m), k) => format!("INT8 {m} + {k} float"),
                (None, _) => "INT8 (Q/DQ from the model)".into(),
            };
            let run_plan = if kept_float.is_empty() {
                plan.clone()
            } else {
                let excl: Vec<String> = exp.exclude.iter().chain(&kept_float).cloned().collect();
                quant::plan(&p.model, &excl)
            };
            let push = |report: &mut Report,
                        artifacts: &mut Artifacts,
                        mut ev: Evaluated,
                        precision,
                        method| {
                ev.row.kept_float = kept_float.clone();
                push(report, artifacts, ev, precision, method)
            };
            let qdq = match quant::build_qdq(&p.model, &run_plan, ranges.as_ref()) {
                Ok(q) => q,
                Err(e) => {
                    let row = Row {
                        backend: exp.backend.name().into(),
                        error: Some(e.to_string()),
                        ..Default::default()
                    };
                    push(
                        &mut report,
                        &mut artifacts,
                        Evaluated {
                            row,
                            predictions: vec![],
                        },
                        Precision::Int8,
                        method,
                    );
                    continue;
                }
            };
            if let Some(dir) = &exp.output.qdq_dir {
                let suffix = if kept_float.is_empty() { "" } else { "_mixed" };
                if let Err(e) = export_qdq(dir, &p.model, &qdq, method, suffix) {
                    sink.log(&format!("{label}: {e}"));
                }
            }
            let ev = run_row(
                backend.as_ref(),
                BuildInput::Int8 {
                    model: &p.model,
                    qdq: &qdq,
                },
                &p,
                &samples,
                classes,
                &exp.bench,
                &bench_input,
                Some(&reference),
                &mut None,
                sink,
                cancel,
                &label,
            );
            push(&mut report, &mut artifacts, ev, Precision::Int8, method);
            if let (Some(m), true) = (method, kept_float.is_empty()) {
                artifacts.qdq.push((m, qdq));
            }
        }
    }
    write_outputs(exp, &report, &artifacts, sink);
    Ok(RunOutput { report, artifacts })
}

pub fn output_channels(p: &Prepared) -> Option<usize> {
    let s = &p.model.info.outputs.first()?.shape;
    s.get(1).copied().flatten().map(|v| v as usize).or_else(|| {
        let shapes = crate::model::infer_shapes(&p.model, p.hw).ok()?;
        shapes.get(p.model.output_name())?.get(1).copied()
    })
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

pub fn export_qdq(
    dir: &std::path::Path,
    model: &Model,
    qdq: &QdqModel,
    method: Option<Method>,
    suffix: &str,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let stem = model
        .path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model");
    let m = method.map(|m| m.name()).unwrap_or("qat");
    let base = format!("{stem}_int8_{m}{suffix}");
    qdq.save(&dir.join(format!("{base}.onnx")))
        .map_err(|e| e.to_string())?;
    qdq.save_calibration_cache(&dir.join(format!("{base}.cache")))
        .map_err(|e| e.to_string())
}

/// Probe inputs for passes that need activations: the first 32 calibration images.
pub fn probe_inputs(
    p: &Prepared,
    exp: &Experiment,
    n: usize,
) -> Result<Vec<Vec<f32>>, PipelineError> {
    p.calib_images
        .iter()
        .take(n.max(1))
        .map(|f| {
            data::open_rgb(f).map(|img| {
                exp.preprocess
                    .apply(&img, p.hw, p.model.info.input_chw[0], p.model.info.layout)
            })
        })
        .collect::<Result<_, _>>()
        .map_err(PipelineError::from)
}

/// Fills each used method's empirical bias correction (one pass over 32 calibration images).
fn correct_biases(
    p: &Prepared,
    exp: &Experiment,
    plan: &QuantPlan,
    all: &mut [Ranges],
    used: &[Method],
    sink: &dyn Sink,
) -> Result<(), PipelineError> {
    let inputs = probe_inputs(p, exp, 32)?;
    let t = Instant::now();
    let todo: Vec<&mut Ranges> = all
        .iter_mut()
        .filter(|r| used.contains(&r.method))
        .collect();
    let n = todo.len();
    for (i, r) in todo.into_iter().enumerate() {
        sink.progress("bias correction", i, n);
        r.bias_correction = crate::sensitivity::bias_corrections(p, plan, r, &inputs)?;
    }
    sink.log(&format!(
        "bias correction for {n} method(s) in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    ));
    Ok(())
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

fn write_outputs(exp: &Experiment, report: &Report, artifacts: &Artifacts, sink: &dyn Sink) {
    let o = &exp.output;
    if let Err(e) = report.write(
        o.report_json.as_deref(),
        o.markdown.as_deref(),
        o.csv.as_deref(),
    ) {
        sink.log(&format!("writing the report: {e}"));
    }
    if let Some(dir) = &o.masks_dir {
        if report.model.task != Some(Task::Segmentation) {
            sink.log("--save-masks applies to segmentation models only");
            return;
        }
        match save_masks(dir, report, artifacts, o.mask_count) {
            Ok(n) => sink.log(&format!("wrote {n} mask overlays to {}", dir.display())),
            Err(e) => sink.log(&format!("writing mask overlays: {e}")),
        }
    }
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
        .position(|r| r.precision == Some(Precision::Fp32) && r.error.is_none())
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
            .filter(|(_, r)| r.precision == Some(Precision::Int8) && r.error.is_none())
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
