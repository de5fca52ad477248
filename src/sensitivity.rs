//! Per-layer sensitivity and automatic mixed precision: the error each quantized layer adds
//! (SQNR of its output when only it is quantized, and when everything up to it is), which
//! layers cost the task metric, and the fewest layers to keep in float to meet a budget.
//!
//! Everything is measured on the model the INT8 engines are built from (`prepare::for_int8`:
//! CLE, centering, GPTQ; the same bias correction), and every plan is placed as the pipeline
//! places it (`pipeline::place_int8`: layers kept in float get their float weights back), so
//! the plan chosen here is the engine the run builds, and its metric the one the run reports.
//!
//! Layer-wise SQNR takes three passes over a small probe set (FP32, the Q/DQ simulation, and a
//! graph where every quantized layer has a quantized twin fed by FP32 inputs). Only the layers
//! SQNR flags are then evaluated on the task metric, one engine each.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tract_onnx::pb;

use crate::backend::reference;
use crate::backend::{self, Backend, BuildInput, BuildSpec, Precision};
use crate::calib::{Method, Ranges, StatsCache};
use crate::eval::Sqnr;
use crate::experiment::Experiment;
use crate::layerwise::{isolated_model_from, outputs_of};
use crate::model::{Graph, Model, Task};
use crate::pipeline::{self, CancelToken, PipelineError, Prepared, Sample, Sink};
use crate::prepare::gptq::FloatWeights;
use crate::quant::{self, QdqModel, QuantPlan};

pub use crate::experiment::Budget;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SensitivityOptions {
    /// Calibration images used as the probe set for SQNR.
    pub probe_images: usize,
    /// Layers (lowest isolated SQNR first) whose metric effect is measured; 0 = all.
    pub candidates: usize,
    /// Evaluation images used to rank candidates (the budget is checked on all of them).
    pub probe_eval_images: usize,
    pub budget: Option<Budget>,
    /// Calibration method; `None` tries all four and a per-tensor choice and keeps the best.
    pub method: Option<Method>,
}

impl Default for SensitivityOptions {
    fn default() -> Self {
        SensitivityOptions {
            probe_images: 32,
            candidates: 8,
            probe_eval_images: 128,
            budget: None,
            method: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerReport {
    pub node: String,
    pub op: String,
    /// SQNR of the layer's output when only this layer is quantized.
    pub sqnr_isolated_db: Option<f64>,
    /// SQNR of the layer's output with everything up to it quantized.
    pub sqnr_accumulated_db: Option<f64>,
    /// Task metric gained (points, on the probe evaluation subset) by keeping this layer in
    /// float with the rest INT8; `None` for layers SQNR did not flag.
    pub metric_gain_pt: Option<f64>,
    /// fp32 (or fp16) when mixed precision keeps it in float, else int8.
    pub precision: Option<Precision>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MethodResult {
    /// `max`, `percentile`, `mse`, `entropy`, or `per-tensor` (best method per tensor).
    pub method: String,
    pub metric: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AmpResult {
    pub budget: Option<Budget>,
    pub met: bool,
    pub kept_float: Vec<String>,
    pub metric: f64,
    pub note: String,
}

impl AmpResult {
    /// One line for people: "2 layer(s) in float, 41.67 %, budget met (note)".
    pub fn summary(&self) -> String {
        format!(
            "{} layer(s) in float, {:.2} %, budget {}{}",
            self.kept_float.len(),
            self.metric * 100.0,
            if self.met { "met" } else { "not met" },
            if self.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.note)
            }
        )
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SensitivityReport {
    pub model: std::path::PathBuf,
    pub task: Option<Task>,
    pub probe_images: usize,
    pub eval_images: usize,
    pub fp32_metric: f64,
    pub methods: Vec<MethodResult>,
    /// The calibration that won (`methods` entry name).
    pub chosen: String,
    /// Per activation tensor, the method chosen when `chosen` is `per-tensor`.
    pub per_tensor_methods: BTreeMap<String, Method>,
    pub int8_metric: f64,
    pub layers: Vec<LayerReport>,
    pub amp: Option<AmpResult>,
    pub elapsed_ms: f64,
}

fn err(e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Config(e.to_string())
}

/// Per quantized layer (by node), the SQNR of its output in dB: (isolated, accumulated).
pub type LayerSqnr = BTreeMap<String, (Option<f64>, Option<f64>)>;

/// SQNR per quantized layer: (isolated, accumulated), over `inputs`, on the INT8 path's
/// prepared model `q`. The reference is `fp32`, the same graph computing FP32 (`q`'s model
/// with its float weights back); each isolated twin computes its layer as the INT8 engine does
/// (`q`'s weights), the accumulated pass is `qdq`.
pub fn layer_sqnr(
    q: &Prepared,
    fp32: &Model,
    plan: &QuantPlan,
    ranges: &Ranges,
    qdq: &QdqModel,
    inputs: &[Vec<f32>],
    sink: &dyn Sink,
) -> Result<LayerSqnr, PipelineError> {
    let (iso, pairs) = isolated_model_from(fp32, &q.model, plan, ranges).map_err(err)?;
    let shape = q.model.input_shape(1, q.hw);
    let fp_names: Vec<String> = pairs.iter().map(|x| x.1.clone()).collect();
    let iso_names: Vec<String> = pairs.iter().map(|x| x.2.clone()).collect();
    let fixed = |proto: pb::ModelProto| {
        Model {
            proto,
            ..q.model.clone()
        }
        .with_fixed_input(1, q.hw)
    };
    let open = |proto: &pb::ModelProto, names: &[String]| {
        reference::open(proto, shape, names).map_err(|e| err(e.to_string()))
    };
    let fp32 = open(&fp32.with_fixed_input(1, q.hw), &fp_names)?;
    let isolated = open(&fixed(iso), &iso_names)?;
    let accumulated = open(&fixed(qdq.proto.clone()), &fp_names)?;
    let mut iso_s = vec![Sqnr::default(); pairs.len()];
    let mut acc_s = vec![Sqnr::default(); pairs.len()];
    for (i, x) in inputs.iter().enumerate() {
        sink.progress("layer-wise SQNR", i, inputs.len());
        let f = outputs_of(fp32.as_ref(), x).map_err(err)?;
        let is = outputs_of(isolated.as_ref(), x).map_err(err)?;
        let ac = outputs_of(accumulated.as_ref(), x).map_err(err)?;
        for k in 0..pairs.len() {
            iso_s[k].add(&f[k], &is[k]);
            acc_s[k].add(&f[k], &ac[k]);
        }
    }
    Ok(pairs
        .iter()
        .enumerate()
        .map(|(k, (node, _, _))| (node.clone(), (iso_s[k].db(), acc_s[k].db())))
        .collect())
}

/// What every evaluation in a sensitivity run shares.
struct Ctx<'a> {
    backend: &'a dyn Backend,
    /// The experiment's model as loaded: the FP32 row's.
    p: &'a Prepared,
    /// The INT8 path's model (`prepare::for_int8`) and the float weights GPTQ replaced in it.
    q: &'a Prepared,
    float_weights: &'a FloatWeights,
    exp: &'a Experiment,
    classes: usize,
    sink: &'a dyn Sink,
    cancel: &'a CancelToken,
}

impl Ctx<'_> {
    /// Builds an engine and returns its task metric on `samples`.
    fn metric(
        &self,
        input: BuildInput<'_>,
        samples: &[Sample],
        stage: &str,
    ) -> Result<f64, PipelineError> {
        let task = self
            .p
            .task
            .ok_or_else(|| err("the task is unknown: give an evaluation set"))?;
        let mut e = self
            .backend
            .build(
                input,
                BuildSpec {
                    batch: 1,
                    hw: self.p.hw,
                },
            )
            .map_err(err)?;
        let ev = pipeline::evaluate(
            e.as_mut(),
            samples,
            task,
            self.classes,
            None,
            self.sink,
            stage,
            self.cancel,
            &mut None,
        )
        .map_err(err)?;
        ev.row.metric().ok_or_else(|| err("no metric"))
    }

    /// The metric of the INT8 engine with `ranges` and `keep_float` layers left in float (on
    /// top of the experiment's exclusions), placed as the pipeline places it, and the Q/DQ
    /// model it was built from.
    fn int8(
        &self,
        ranges: &Ranges,
        keep_float: &[String],
        samples: &[Sample],
        stage: &str,
    ) -> Result<(f64, QdqModel), PipelineError> {
        let (model, q) = pipeline::place_int8(
            &self.q.model,
            self.float_weights,
            &self.exp.exclude,
            keep_float,
            Some(ranges),
        )
        .map_err(err)?;
        let m = self.metric(
            BuildInput::Quantized {
                model: &model,
                qdq: &q,
                keep_fp32: &[],
            },
            samples,
            stage,
        )?;
        Ok((m, q))
    }
}

/// Per activation tensor, the method whose range gives its reading layers the best isolated
/// SQNR (summed over readers).
fn per_tensor_choice(
    plan: &QuantPlan,
    all: &[Ranges],
    sqnr_by_method: &[LayerSqnr],
    model: &Model,
) -> BTreeMap<String, Method> {
    let g = Graph::new(model.graph());
    let mut chosen = BTreeMap::new();
    for a in &plan.activations {
        let readers: Vec<&str> = a
            .uses
            .iter()
            .map(|&(i, _)| g.node(i).name.as_str())
            .collect();
        let score = |k: usize| -> f64 {
            readers
                .iter()
                .filter_map(|r| sqnr_by_method[k].get(*r).and_then(|s| s.0))
                .map(|v| v.min(80.0))
                .sum()
        };
        let best = (0..all.len())
            .max_by(|&x, &y| score(x).total_cmp(&score(y)))
            .unwrap_or(0);
        chosen.insert(a.tensor.clone(), all[best].method);
    }
    chosen
}

/// Runs the analysis (and mixed precision when `opts.budget` is set) for `exp`.
/// Returns the report and the winning Q/DQ model (with the kept layers in float).
pub fn run(
    exp: &Experiment,
    opts: &SensitivityOptions,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<(SensitivityReport, QdqModel), PipelineError> {
    run_with_cache(
        exp,
        opts,
        &StatsCache {
            dir: StatsCache::default_dir(),
        },
        sink,
        cancel,
    )
}

/// [`run`] with the statistics cache in `cache`.
pub fn run_with_cache(
    exp: &Experiment,
    opts: &SensitivityOptions,
    cache: &StatsCache,
    sink: &dyn Sink,
    cancel: &CancelToken,
) -> Result<(SensitivityReport, QdqModel), PipelineError> {
    let t0 = Instant::now();
    let p = pipeline::prepare(exp)?;
    let cpu_engine = crate::backend::cpu::set_engine(exp.cpu_engine).map_err(err)?;
    sink.log(&format!("CPU engine: {}", cpu_engine.summary()));
    crate::backend::cpu::set_threads(exp.threads);
    let backend = backend::backend_with(exp.backend, exp.fp32_math, exp.build_effort);
    backend.check().map_err(|why| {
        err(format!(
            "backend `{}` cannot run here: {why}",
            exp.backend.name()
        ))
    })?;
    let samples = pipeline::load_samples(&p, sink, cancel)?;
    if samples.is_empty() {
        return Err(err("sensitivity needs an evaluation set (--data DIR)"));
    }
    // The model the INT8 engines are built from, as the pipeline prepares it: ranking the
    // original instead chose plans that missed their budget once built (issue 43).
    let int8 = crate::prepare::for_int8(&p.source(), &pipeline::int8_settings(exp), sink);
    let q = p.with_model(int8.model);
    let float_weights = int8.float_weights;
    // The FP32 model in the INT8 path's graph: what its tensors are measured against.
    let fp32_model = float_weights.restore_all(&q.model);
    let classes = pipeline::classes_of(&p);
    let cx = Ctx {
        backend: backend.as_ref(),
        p: &p,
        q: &q,
        float_weights: &float_weights,
        exp,
        classes,
        sink,
        cancel,
    };
    let probe_eval = &samples[..opts.probe_eval_images.min(samples.len())];
    let plan = quant::plan(&q.model, &exp.exclude);
    let (stats, _, _) = pipeline::calibrate(&q, &plan, backend.as_ref(), cache, sink, cancel)?;
    let probe_inputs = q.source().inputs(opts.probe_images)?;

    let fp32 = cx.metric(
        BuildInput::Float {
            model: &p.model,
            precision: Precision::Fp32,
            keep_fp32: &[],
        },
        &samples,
        "evaluating FP32",
    )?;
    let mut all: Vec<Ranges> = Method::ALL
        .iter()
        .map(|&m| stats.ranges(m, exp.percentile))
        .collect();
    let used: Vec<Method> = Method::ALL
        .into_iter()
        .filter(|&m| opts.method.is_none_or(|o| o == m))
        .collect();
    if exp.bias_correction {
        crate::prepare::correct_biases(
            &q.source(),
            &plan,
            &mut all,
            &used,
            exp.correction_images,
            sink,
        )
        .map_err(err)?;
    }

    // Every method (or the one asked for), then a per-tensor choice among them.
    let mut results = vec![];
    let mut sqnr_by_method = vec![];
    let mut best_ranges = all[0].clone();
    for r in all.iter().filter(|r| used.contains(&r.method)) {
        let (m, qdq) = cx.int8(r, &[], &samples, &format!("evaluating INT8 {}", r.method))?;
        sink.log(&format!("INT8 {}: {:.2} %", r.method, m * 100.0));
        if results.iter().all(|x: &MethodResult| m > x.metric) {
            best_ranges = r.clone();
        }
        results.push(MethodResult {
            method: r.method.name().into(),
            metric: m,
        });
        if opts.method.is_none() {
            let sqnr = layer_sqnr(&q, &fp32_model, &plan, r, &qdq, &probe_inputs, sink)?;
            sqnr_by_method.push(sqnr);
        }
    }
    let mut per_tensor_methods = BTreeMap::new();
    if opts.method.is_none() {
        let chosen = per_tensor_choice(&plan, &all, &sqnr_by_method, &q.model);
        // As the pipeline makes the plan's ranges: the best single method's, each tensor's
        // own method's amax over them, and a bias correction for those ranges.
        let mut combo = pipeline::mixed_ranges(&all, best_ranges.method, &chosen);
        if exp.bias_correction {
            crate::prepare::correct_mixed_biases(
                &q.source(),
                &plan,
                &mut combo,
                exp.correction_images,
                sink,
            )
            .map_err(err)?;
        }
        let (m, _) = cx.int8(&combo, &[], &samples, "evaluating INT8 per-tensor methods")?;
        sink.log(&format!(
            "INT8 per-tensor method choice: {:.2} %",
            m * 100.0
        ));
        if results.iter().all(|r| m > r.metric) {
            best_ranges = combo;
            per_tensor_methods = chosen;
        }
        results.push(MethodResult {
            method: "per-tensor".into(),
            metric: m,
        });
    }
    // The first of equals, as `best_ranges` was kept.
    let best = first_best(results.iter()).cloned().unwrap_or_default();
    let (_, base_qdq) = pipeline::place_int8(
        &q.model,
        &float_weights,
        &exp.exclude,
        &[],
        Some(&best_ranges),
    )
    .map_err(err)?;
    let sqnr = layer_sqnr(
        &q,
        &fp32_model,
        &plan,
        &best_ranges,
        &base_qdq,
        &probe_inputs,
        sink,
    )?;

    // Rank: SQNR first, then the metric for the lowest-SQNR candidates.
    let op_of: HashMap<&str, &str> = q
        .model
        .graph()
        .node
        .iter()
        .map(|n| (n.name.as_str(), n.op_type.as_str()))
        .collect();
    let mut layers: Vec<LayerReport> = sqnr
        .iter()
        .map(|(n, (i, a))| LayerReport {
            node: n.clone(),
            op: op_of.get(n.as_str()).copied().unwrap_or("?").into(),
            sqnr_isolated_db: *i,
            sqnr_accumulated_db: *a,
            metric_gain_pt: None,
            precision: Some(Precision::Int8),
        })
        .collect();
    let sqnr_order = |x: &LayerReport| x.sqnr_isolated_db.unwrap_or(f64::INFINITY);
    layers.sort_by(|a, b| sqnr_order(a).total_cmp(&sqnr_order(b)));
    let (int8_probe, _) = cx.int8(&best_ranges, &[], probe_eval, "ranking: all INT8")?;
    // 0 candidates = measure every layer (slower, but the metric, not SQNR, decides).
    let n_candidates = if opts.candidates == 0 {
        layers.len()
    } else {
        opts.candidates
    };
    for (k, l) in layers.iter_mut().take(n_candidates).enumerate() {
        if cancel.is_cancelled() {
            return Err(PipelineError::Cancelled);
        }
        let stage = format!("ranking candidate {}/{}", k + 1, n_candidates);
        let (m, _) = cx.int8(
            &best_ranges,
            std::slice::from_ref(&l.node),
            probe_eval,
            &stage,
        )?;
        l.metric_gain_pt = Some((m - int8_probe) * 100.0);
    }
    // Most sensitive first: measured metric gain, then lowest SQNR.
    let gain = |x: &LayerReport| x.metric_gain_pt.unwrap_or(f64::NEG_INFINITY);
    layers.sort_by(|a, b| {
        gain(b)
            .total_cmp(&gain(a))
            .then(sqnr_order(a).total_cmp(&sqnr_order(b)))
    });

    let mut final_qdq = base_qdq;
    let mut amp = None;
    if let Some(budget) = opts.budget {
        let mut metric = best.metric;
        let mut kept: Vec<String> = vec![];
        for node in layers.iter().map(|l| l.node.clone()) {
            if budget.met(fp32, metric) {
                break;
            }
            if cancel.is_cancelled() {
                return Err(PipelineError::Cancelled);
            }
            kept.push(node);
            let (m, qdq) = cx.int8(
                &best_ranges,
                &kept,
                &samples,
                &format!("mixed precision: {} layers in float", kept.len()),
            )?;
            sink.log(&format!(
                "keeping {} in float: {:.2} %",
                kept.join(", "),
                m * 100.0
            ));
            // Greedy with verification: a layer that does not strictly help is put back to
            // INT8, so noise-level "gains" do not spend the float budget.
            if m <= metric + 1e-12 {
                kept.pop();
                continue;
            }
            metric = m;
            final_qdq = qdq;
        }
        let mut met = budget.met(fp32, metric);
        let note = if !met {
            // No subset the search tried reaches it: every quantized layer in float, measured
            // as well, so `met` says what that engine does.
            kept = layers.iter().map(|l| l.node.clone()).collect();
            let (m, qdq) = cx.int8(
                &best_ranges,
                &kept,
                &samples,
                "mixed precision: every layer in float",
            )?;
            (metric, final_qdq) = (m, qdq);
            met = budget.met(fp32, metric);
            if met {
                format!(
                    "no smaller set of layers in float met the budget ({}): all {} quantized layers are kept in float",
                    budget.describe(),
                    kept.len()
                )
            } else {
                format!(
                    "the budget ({}) cannot be met: even with all {} quantized layers in float the metric is {:.2} % against FP32 {:.2} %",
                    budget.describe(),
                    kept.len(),
                    metric * 100.0,
                    fp32 * 100.0
                )
            }
        } else if kept.is_empty() {
            "all-INT8 already meets the budget: no layer kept in float".into()
        } else {
            String::new()
        };
        for l in layers.iter_mut().filter(|l| kept.contains(&l.node)) {
            // The CPU backend has no FP16 kernels: layers kept out of INT8 run in FP32.
            l.precision = Some(Precision::Fp32);
        }
        amp = Some(AmpResult {
            budget: Some(budget),
            met,
            kept_float: kept,
            metric,
            note,
        });
    }
    let report = SensitivityReport {
        model: p.model.path.clone(),
        task: p.task,
        probe_images: probe_inputs.len(),
        eval_images: samples.len(),
        fp32_metric: fp32,
        chosen: best.method.clone(),
        methods: results,
        per_tensor_methods,
        int8_metric: best.metric,
        layers,
        amp,
        elapsed_ms: t0.elapsed().as_secs_f64() * 1e3,
    };
    Ok((report, final_qdq))
}

/// The method with the highest metric, the first of equals (the one the analysis kept).
fn first_best<'a>(methods: impl Iterator<Item = &'a MethodResult>) -> Option<&'a MethodResult> {
    methods.fold(None, |best, m| match best {
        Some(b) if b.metric >= m.metric => Some(b),
        _ => Some(m),
    })
}

impl SensitivityReport {
    /// The experiment setting that reproduces this run's mixed-precision plan: the ranges the
    /// analysis measured it with (the best single method, the per-tensor choice over it when
    /// that won), the layers it keeps in float and the budget they were chosen for.
    pub fn mixed_precision(&self) -> crate::experiment::MixedPrecision {
        let best_single = first_best(self.methods.iter().filter(|m| m.method != "per-tensor"));
        crate::experiment::MixedPrecision {
            keep_float: self
                .amp
                .as_ref()
                .map(|a| a.kept_float.clone())
                .unwrap_or_default(),
            method: best_single.and_then(|m| m.method.parse().ok()),
            per_tensor: self.per_tensor_methods.clone(),
            budget: self.amp.as_ref().and_then(|a| a.budget),
        }
    }

    pub fn to_markdown(&self) -> String {
        let name = if self.task == Some(Task::Segmentation) {
            "mIoU"
        } else {
            "top-1"
        };
        let mut s = format!(
            "# quantscope sensitivity\n\nModel `{}`; {} probe images for SQNR, {} evaluation images.\n\nFP32 {name}: {:.2} %\n\n| calibration | {name} % |\n|---|---|\n",
            self.model.display(),
            self.probe_images,
            self.eval_images,
            self.fp32_metric * 100.0
        );
        for m in &self.methods {
            s.push_str(&format!("| {} | {:.2} |\n", m.method, m.metric * 100.0));
        }
        s.push_str(&format!("\nChosen: {}.\n\n", self.chosen));
        if let Some(a) = &self.amp {
            s.push_str(&format!(
                "Mixed precision ({}): {} layers kept in float, {name} {:.2} % ({:.2} % of FP32); budget {}.{}\n\n",
                a.budget.map(|b| b.describe()).unwrap_or_default(),
                a.kept_float.len(),
                a.metric * 100.0,
                a.metric / self.fp32_metric.max(1e-12) * 100.0,
                if a.met { "met" } else { "NOT met" },
                if a.note.is_empty() { String::new() } else { format!(" {}", a.note) }
            ));
        }
        s.push_str("| layer | op | SQNR isolated dB | SQNR accumulated dB | gain in float (pt) | precision |\n|---|---|---|---|---|---|\n");
        let f = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "–".into());
        for l in &self.layers {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                l.node,
                l.op,
                f(l.sqnr_isolated_db),
                f(l.sqnr_accumulated_db),
                l.metric_gain_pt
                    .map(|v| format!("{v:+.2}"))
                    .unwrap_or_else(|| "–".into()),
                l.precision.map(|p| p.to_string()).unwrap_or_default()
            ));
        }
        s
    }
}
