//! Runs an `Experiment` from model to report: load, prepare data, calibrate (or take the
//! cached statistics), place Q/DQ, build each engine, evaluate it against FP32, time it.
//! Each finished row is handed to the `Sink` at once, so a cancelled run keeps what it has.

use std::borrow::Cow;
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
use crate::experiment::{Budget, Experiment};
use crate::model::{Model, Task};
use crate::prepare::gptq::FloatWeights;
use crate::quant::{self, QdqModel, QuantPlan};
use crate::report::{
    BudgetCheck, CalibSummary, Confusion, EvalSummary, ImageTop, MemoryBytes, ModelSummary, Report,
    Row, TensorRanges,
};

mod evaluate;
mod guard;
mod outputs;
mod prepare;
mod quantized;
mod regions;
mod side_by_side;

pub use evaluate::*;
pub use guard::tensor_peaks;
pub use outputs::*;
pub use prepare::*;
pub use quantized::{mixed_ranges, place_int8};

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

/// The INT8 preparation's progress and log lines go where the run's do.
impl<S: Sink + ?Sized> crate::prepare::Progress for S {
    fn progress(&self, stage: &str, done: usize, total: usize) {
        Sink::progress(self, stage, done, total)
    }
    fn log(&self, line: &str) {
        Sink::log(self, line)
    }
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
    /// Classification: per row, each evaluation image's top-3 with probabilities (empty for
    /// a row with no result); the report's gallery is made from them.
    pub tops: Vec<Vec<ImageTop>>,
    /// Classification: the true class of each evaluation image.
    pub labels: Vec<usize>,
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

/// Collects (or loads) calibration statistics for the plan's tensors, on `backend`'s device
/// where it has a statistics engine (CUDA), else on the CPU's reference interpreter. Either
/// way the statistics are the same FP32 values, cached under one key.
pub fn calibrate(
    p: &Prepared,
    plan: &QuantPlan,
    backend: &dyn backend::Backend,
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
    let on_cpu = || {
        backend::reference::open_model(&p.model, p.hw, &tensors).map_err(|e| {
            PipelineError::Config(format!(
                "{}: cannot run the model for calibration: {e}. `quantscope inspect` lists its \
                 ops; --exclude keeps a failing layer in float",
                p.model.path.display()
            ))
        })
    };
    sink.progress("calibrating (FP32 pass)", 0, p.calib_images.len());
    let probe = match backend.statistics_probe(&p.model, p.hw, &tensors) {
        Some(Ok(probe)) => probe,
        Some(Err(e)) => {
            sink.log(&format!(
                "the calibration pass runs on the CPU: the {} backend's FP32 engine cannot \
                 read the tensors it needs ({e})",
                backend.kind().name()
            ));
            on_cpu()?
        }
        None => on_cpu()?,
    };
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
    /// The timed engines kept to be timed again side by side once every row is done.
    side_by_side: std::cell::RefCell<side_by_side::SideBySide>,
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
        // A GPU build reports each conv chosen: the bar moves through a build of a minute.
        let stage = format!("building {label}");
        let progress = |done: usize, total: usize| self.sink.progress(&stage, done, total);
        match crate::guard::catch(&what, || {
            self.backend.build_with_progress(input, spec, &progress)
        }) {
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
        self.row_with(RowEngines::Build(input), reference, keep_outputs, label)
    }

    /// [`RowCtx::row`] with its engines built from `engines`.
    fn row_with(
        &self,
        engines: RowEngines<'_>,
        reference: Option<&Reference>,
        keep_outputs: &mut Option<Vec<Vec<f32>>>,
        label: &str,
    ) -> Evaluated {
        let mut row = Row {
            backend: self.backend.kind().name().into(),
            threads: self.threads,
            ..Default::default()
        };
        self.side_by_side.borrow_mut().begin_row();
        // Engine memory = growth over the build + peak growth while timing. Evaluation is left
        // out: it holds the FP32 outputs kept for SQNR, which are not the engine's.
        let (rss_before, _) = bench::rss_bytes();
        let t = Instant::now();
        let (precision, mut engine, batch_source) = match engines {
            RowEngines::Build(input) => {
                self.sink.progress(&format!("building {label}"), 0, 1);
                match self.build(input, 1, label) {
                    Ok(e) => {
                        row.build_ms = Some(t.elapsed().as_secs_f64() * 1e3);
                        (input.precision(), e, BatchSource::Build(input))
                    }
                    Err(e) => {
                        row.error = Some(e.message);
                        return Evaluated::failed(row);
                    }
                }
            }
            RowEngines::Built(b) => {
                row.build_ms = Some(b.build_ms);
                (b.precision, b.batch1, BatchSource::Built(b.batch))
            }
        };
        let built_growth = bench::rss_bytes().0.saturating_sub(rss_before);
        let (mut predictions, mut classes, mut tops) = (vec![], vec![], vec![]);
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
                    tops = ev.tops;
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
        match row.latency_ms {
            Some(_) => self.side_by_side.borrow_mut().keep(engine, 1),
            None => drop(engine),
        }
        if self.bench_spec.batch > 1 && !self.cancel.is_cancelled() {
            match batch_source {
                BatchSource::Build(input) => self.time_batch(input, &mut row, label),
                BatchSource::Built(Some(e)) => self.time_built_batch(e, &mut row, label),
                BatchSource::Built(None) => {}
            }
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
        row.fp32_layers = info.fp32_layers;
        row.layer_times = info.layer_times;
        row.layer_times_in_run = info.layer_times_in_run;
        Evaluated {
            row,
            predictions,
            classes,
            tops,
        }
    }

    /// Throughput at the experiment's batch size, on an engine built for it. A failure here is
    /// logged and leaves the batch-1 results standing.
    fn time_batch(&self, input: BuildInput<'_>, row: &mut Row, label: &str) {
        if let Some(e) = self.build_batch(input, label) {
            self.time_built_batch(e, row, label);
        }
    }

    /// The engine at the experiment's batch size, or None (logged) where it could not be
    /// built. The first engine the model cannot take at that batch (a batch-1 export's
    /// reshapes say 1) stops later ones from trying.
    fn build_batch(&self, input: BuildInput<'_>, label: &str) -> Option<Box<dyn Engine>> {
        let b = self.bench_spec.batch;
        self.sink
            .progress(&format!("timing {label} at batch {b}"), 0, 1);
        if self.batch_refused.borrow().is_some() {
            return None;
        }
        let built = self.build(input, b, &format!("{label} batch-{b}"));
        match built {
            Ok(e) => Some(e),
            Err(e) if !self.batch_ok.get() => {
                let declared = self.p.model.info.inputs[0]
                    .shape
                    .first()
                    .copied()
                    .flatten()
                    .filter(|&d| d != b as i64)
                    .map(|d| {
                        format!(
                            " Its input declares batch {d}: if the batch is what failed, export \
                             the model with a dynamic batch to measure larger batches."
                        )
                    })
                    .unwrap_or_default();
                let note = format!(
                    "{}: no engine at batch {b} (the backend said: {}), so throughput is \
                     measured at batch 1 only.{declared}",
                    self.p.model.path.display(),
                    e.cause.lines().next().unwrap_or_default()
                );
                self.sink.log(&note);
                *self.batch_refused.borrow_mut() = Some(note);
                None
            }
            Err(e) => {
                self.sink.log(&format!("{label}: batch {b}: {}", e.message));
                None
            }
        }
    }

    /// The timing input at the experiment's batch size: the timed image, repeated.
    fn batched_input(&self) -> Vec<f32> {
        let n = self.bench_input.len() * self.bench_spec.batch;
        self.bench_input.iter().copied().cycle().take(n).collect()
    }

    /// Times `engine` (built at the experiment's batch size) into `row`.
    fn time_built_batch(&self, mut engine: Box<dyn Engine>, row: &mut Row, label: &str) {
        let b = self.bench_spec.batch;
        let batched = self.batched_input();
        let keep_going = || !self.cancel.is_cancelled();
        let timed = crate::guard::catch(&format!("timing {label} at batch {b}"), || {
            engine
                .choose_threads()
                .map_err(|err| format!("timing {label} at batch {b}: {err}"))?;
            bench::measure(engine.as_mut(), &batched, self.bench_spec, &keep_going)
                .map(|l| (l, engine.info().layer_times.clone()))
                .map_err(|err| format!("timing {label} at batch {b}: {err}"))
        })
        .and_then(|r| r);
        match timed {
            Ok((l, layers)) => {
                self.batch_ok.set(true);
                row.layer_times_in_run &= engine.info().layer_times_in_run;
                row.throughput_batch_ips = (l.median > 0.0).then(|| b as f64 * 1e3 / l.median);
                row.latency_batch_ms = Some(l);
                row.batch = Some(b);
                row.layer_times_batch = layers;
                self.side_by_side.borrow_mut().keep(engine, b);
            }
            Err(e) => self.sink.log(&format!("{label}: batch {b}: {e}")),
        }
    }
}

/// Where a row's engines come from.
pub(super) enum RowEngines<'a> {
    /// Built from one input, at batch 1 and at the experiment's batch.
    Build(BuildInput<'a>),
    /// Built already: an INT8 row whose regions were timed, each batch's engine maybe from its
    /// own Q/DQ placement ([`crate::fp16_regions`]).
    Built(BuiltEngines),
}

pub(super) struct BuiltEngines {
    pub precision: Precision,
    pub batch1: Box<dyn Engine>,
    /// Milliseconds the batch-1 engine took to build, trial engines included.
    pub build_ms: f64,
    /// The engine at the experiment's batch, where one was built.
    pub batch: Option<Box<dyn Engine>>,
}

/// Where a row's engine at the experiment's batch comes from, once its batch-1 engine is made.
enum BatchSource<'a> {
    Build(BuildInput<'a>),
    Built(Option<Box<dyn Engine>>),
}

/// Why an engine could not be built: the backend's own words, and the message for the row
/// (which names the model and what to try).
struct BuildFailure {
    cause: String,
    message: String,
}

/// A run in progress: the rows produced so far, what they predicted, and the outputs that could
/// not be written. Every stage appends to it, so a cancelled or failing stage keeps the rest.
struct Rows<'a> {
    exp: &'a Experiment,
    ctx: RowCtx<'a>,
    /// The model as given, which the float rows run; `ctx.p` moves on to INT8's preparation
    /// (equalized, centered, its weights rounded) for the INT8 rows.
    float: &'a Prepared,
    /// The float weights GPTQ replaced in the INT8 path's model, for layers a
    /// mixed-precision plan keeps in float.
    float_weights: FloatWeights,
    report: Report,
    artifacts: Artifacts,
    output_errors: Vec<String>,
    /// FP16's in-run layer times by batch size, from an FP16 engine built for INT8's regions
    /// where the run has no FP16 row (None: it could not be had).
    fp16_profiles: HashMap<usize, Option<Vec<backend::LayerTime>>>,
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
            fp16_guard: Default::default(),
            fp8_rounding: vec![],
            exports: vec![],
            cpu_engine: Some(backend::cpu::engine().1),
            gallery: vec![],
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
            labels: samples
                .iter()
                .filter_map(|s| match &s.label {
                    Label::Class(c) => Some(*c),
                    _ => None,
                })
                .collect(),
            ..Default::default()
        };
        Rows {
            exp,
            float: ctx.p,
            ctx,
            float_weights: FloatWeights::default(),
            report,
            artifacts,
            output_errors: vec![],
            fp16_profiles: HashMap::new(),
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
        self.ctx
            .side_by_side
            .borrow_mut()
            .row_pushed(self.report.rows.len(), ev.row.error.is_some());
        if let Some(e) = &ev.row.error {
            self.ctx.sink.log(&format!("{}: {e}", ev.row.label()));
        }
        self.report.rows.push(ev.row);
        self.artifacts.predictions.push(ev.predictions);
        self.artifacts.tops.push(ev.tops);
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
        // A pre-quantized model's float rows run the float model it carries: the reference
        // its own quantized row is compared with.
        let float = quant::carried::float_model(&self.ctx.p.model);
        let model = float.as_ref();
        let mut reference = Reference::default();
        if wants(Precision::Fp32) || needs_reference {
            let mut keep = needs_reference.then(Vec::new);
            let input = BuildInput::Float {
                model,
                precision: Precision::Fp32,
                keep_fp32: &[],
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
            let guard = self.fp16_guard(self.ctx.p, guard::GuardFor::Float);
            let input = BuildInput::Float {
                model,
                precision: Precision::Fp16,
                keep_fp32: &guard,
            };
            let ev = self.ctx.row(input, Some(&reference), &mut None, "FP16");
            self.push(ev, Precision::Fp16, None, &[]);
        }
        reference
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
        let guard = self.fp16_guard(p, guard::GuardFor::Float);
        let written =
            crate::export::export_fp16(dir, &p.model, p.hw, self.ctx.backend, &input, &guard);
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
        self.time_side_by_side();
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
        if let Some(f) = self.report.fp32_index() {
            self.report.gallery =
                crate::report::gallery(f, &self.artifacts.tops, &self.artifacts.labels);
        }
        let chance = crate::report::near_chance_note(&self.report.rows);
        for note in chance
            .into_iter()
            .chain(crate::report::slower_quantized_notes(&self.report.rows))
            .chain(crate::report::int8_ranking_note(&self.report.rows))
        {
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
    run_on(exp, cache, usable_backend, sink, cancel)
}

/// [`run_with_cache`] on the backend `backend_for` gives for the experiment (the tests give
/// one of their own).
fn run_on(
    exp: &Experiment,
    cache: &StatsCache,
    backend_for: impl FnOnce(&Experiment) -> Result<Box<dyn backend::Backend>, PipelineError>,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<RunOutput, PipelineError> {
    check_outputs(exp, &[], &[])?;
    let p = prepare(exp)?;
    // The CPU engine runs the statistics passes on every backend, so it is settled first.
    let cpu_engine = backend::cpu::set_engine(exp.cpu_engine).map_err(PipelineError::Config)?;
    let backend = backend_for(exp)?;
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
        side_by_side: Default::default(),
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
        let int8 = crate::prepare::for_int8(&p.source(), &int8_settings(exp), sink);
        rows.report.notes.extend(int8.notes);
        rows.report.equalization = int8.equalization;
        rows.report.centering = int8.centering;
        int8_prepared = p.with_model(int8.model);
        rows.ctx.p = &int8_prepared;
        rows.float_weights = int8.float_weights;
        rows.int8_rows(cache, &reference);
    }
    if exp.precisions.contains(&Precision::Fp8) && !cancel.is_cancelled() {
        // From the model as prepared: equalization and GPTQ rounding are INT8's.
        rows.ctx.p = &p;
        rows.fp8_row(cache, &reference);
    }
    Ok(rows.finish())
}

/// The experiment's choices for the INT8 preparation.
pub fn int8_settings(exp: &Experiment) -> crate::prepare::Settings<'_> {
    crate::prepare::Settings {
        cle: exp.cle,
        cle_clip: exp.cle_clip,
        cle_scales: exp.cle_scales,
        center: exp.center,
        weight_rounding: exp.weight_rounding,
        exclude: &exp.exclude,
        correction_images: exp.correction_images,
        bias_correction: exp.bias_correction,
    }
}

/// The experiment's backend, if it can run on this machine.
fn usable_backend(exp: &Experiment) -> Result<Box<dyn backend::Backend>, PipelineError> {
    let backend = backend::backend_with(exp.backend, exp.fp32_math, exp.build_effort);
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

/// The inputs of `paths`, back to back, decoded and preprocessed on the thread pool.
fn decode_batch(p: &Prepared, paths: &[PathBuf]) -> Result<Vec<f32>, PipelineError> {
    use rayon::prelude::*;
    let inputs: Vec<Vec<f32>> = paths
        .par_iter()
        .map(|f| data::open_rgb(f).map(|img| p.input_of(&img)))
        .collect::<Result<_, _>>()?;
    Ok(inputs.concat())
}

#[cfg(test)]
mod tests;
