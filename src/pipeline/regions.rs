//! An INT8 row's engines on the GPU, precision per region: at batch 1 and at the run's batch,
//! the all-INT8 engine's layer times in the run are set against FP16's
//! ([`crate::fp16_regions`]); where a region is slower in INT8, an engine with that region in
//! FP16 is built and timed too, and where INT8 still loses so is the FP16 engine (the whole
//! network as the region); the fastest engine is the one the row evaluates and times.
//! The Q/DQ export stays all-INT8: TensorRT makes its own choice.

use super::quantized::{Int8Variant, place_int8};
use super::*;
use crate::backend::LayerTime;
use crate::fp16_regions::{Kept, RegionChoice};

impl Rows<'_> {
    /// Whether INT8 rows choose precision per region: on the CUDA backend, for a model this
    /// run calibrates, unless the experiment turns it off (`--fp16-regions off`).
    pub(super) fn regions_apply(&self) -> bool {
        self.exp.fp16_regions
            && self.exp.backend == backend::BackendKind::Cuda
            && !self.ctx.p.model.info.prequantized
    }

    /// The row of INT8 variant `v` (its all-INT8 build input `int8`), its engines chosen per
    /// region at each batch size. The Layers rows of a region that ran in FP16 say so, the
    /// row lists each choice, and the log and the report's notes describe it.
    pub(super) fn int8_row_by_region(
        &mut self,
        v: &Int8Variant,
        int8: BuildInput<'_>,
        reference: &Reference,
        label: &str,
    ) -> Evaluated {
        let t = Instant::now();
        self.ctx.sink.progress(&format!("building {label}"), 0, 1);
        let Ok(first) = self.ctx.build(int8, 1, label) else {
            // The row's own build says why.
            return self.ctx.row(int8, Some(reference), &mut None, label);
        };
        let mut choices = vec![];
        let batch1 = self.faster_of(first, 1, v, int8, label, &mut choices);
        let build_ms = t.elapsed().as_secs_f64() * 1e3;
        let b = self.ctx.bench_spec.batch;
        let batch = match b > 1 && !self.ctx.cancel.is_cancelled() {
            true => self
                .ctx
                .build_batch(int8, label)
                .map(|e| self.faster_of(e, b, v, int8, label, &mut choices)),
            false => None,
        };
        let built = BuiltEngines {
            precision: int8.precision(),
            batch1,
            build_ms,
            batch,
        };
        let mut ev = self
            .ctx
            .row_with(RowEngines::Built(built), Some(reference), &mut None, label);
        let quantized = match int8 {
            BuildInput::Quantized { qdq, .. } => qdq.plan.quantized_nodes.as_slice(),
            BuildInput::Float { .. } => &[],
        };
        for c in &choices {
            let line = c.describe(label);
            self.ctx.sink.log(&line);
            if c.ran_fp16() {
                self.report.notes.push(line);
            }
            match c.batch {
                1 => c.annotate(&mut ev.row.layer_times, quantized),
                _ => c.annotate(&mut ev.row.layer_times_batch, quantized),
            }
        }
        ev.row.fp16_regions = choices;
        ev
    }

    /// The fastest of the all-INT8 engine `int8_engine` (built at `batch`), one with its slower
    /// regions in FP16 and, where both are still slower than FP16's profile, the FP16 engine (the
    /// whole network as the region), each built and timed here only when FP16's layer times
    /// say it could win; what was chosen goes to `choices`. The INT8 engine stands where there
    /// is nothing to compare (a profile is not in the run) or another engine cannot be placed
    /// or built (logged).
    fn faster_of(
        &mut self,
        int8_engine: Box<dyn Engine>,
        batch: usize,
        v: &Int8Variant,
        int8: BuildInput<'_>,
        label: &str,
        choices: &mut Vec<RegionChoice>,
    ) -> Box<dyn Engine> {
        let BuildInput::Quantized { qdq, keep_fp32, .. } = int8 else {
            return int8_engine;
        };
        let info = int8_engine.info();
        if !info.layer_times_in_run {
            return int8_engine;
        }
        let Some(fp16) = self.fp16_times(batch) else {
            return int8_engine;
        };
        let mut choice =
            RegionChoice::new(batch, &info.layer_times, &fp16, &qdq.plan.quantized_nodes);
        let mut kept = int8_engine;
        if choice.worth_trying() && !self.ctx.cancel.is_cancelled() {
            let what = format!("{label} with {} FP16 region(s)", choice.regions.len());
            if let Some((e, ms)) = self.timed(
                self.mixed_engine(&choice, v, keep_fp32, batch, &what),
                &what,
            ) {
                choice.timed_mixed(ms);
                if choice.kept == Kept::Regions {
                    kept = e;
                }
            }
        }
        if choice.fp16_worth_trying() && !self.ctx.cancel.is_cancelled() {
            let what = format!("{label} in FP16 throughout");
            let built = self.fp16_engine(batch, &what);
            if let Some((e, ms)) = self.timed(built, &what) {
                choice.timed_fp16_engine(ms);
                if choice.kept == Kept::Fp16 {
                    kept = e;
                }
            }
        }
        choices.push(choice);
        kept
    }

    /// An engine with `choice`'s regions in FP16: Q/DQ placed again with their nodes in float.
    fn mixed_engine(
        &self,
        choice: &RegionChoice,
        v: &Int8Variant,
        keep_fp32: &[crate::fp16_guard::KeptFp32],
        batch: usize,
        what: &str,
    ) -> Result<Box<dyn Engine>, String> {
        let mut kept = v.kept_float.clone();
        kept.extend(choice.regions.iter().flat_map(|r| r.nodes()));
        let p = self.ctx.p;
        let (model, qdq) = place_int8(
            &p.model,
            &self.float_weights,
            &self.exp.exclude,
            &kept,
            v.ranges.as_ref(),
        )
        .map_err(|e| e.to_string())?;
        let input = BuildInput::Quantized {
            model: &model,
            qdq: &qdq,
            keep_fp32,
        };
        self.ctx.build(input, batch, what).map_err(|e| e.message)
    }

    /// A built engine with its run's milliseconds (the sum of its in-run layer times); None,
    /// logged, where it did not build, or has no profile in the run to compare.
    fn timed(
        &self,
        built: Result<Box<dyn Engine>, String>,
        what: &str,
    ) -> Option<(Box<dyn Engine>, f64)> {
        match built {
            Ok(e) if e.info().layer_times_in_run => {
                let ms = e.info().layer_times.iter().map(|t| t.time_ms).sum();
                Some((e, ms))
            }
            Ok(_) => {
                self.ctx
                    .sink
                    .log(&format!("{what}: no profile in the run to compare"));
                None
            }
            Err(e) => {
                self.ctx.sink.log(&format!("{what}: not built ({e})"));
                None
            }
        }
    }

    /// FP16's layer times in the run at `batch`: the FP16 row's, else those of an FP16 engine
    /// built for them once per batch size (None where neither has a profile in the run).
    fn fp16_times(&mut self, batch: usize) -> Option<Vec<LayerTime>> {
        let from_row =
            self.report.rows.iter().find(|r| {
                r.precision == Some(Precision::Fp16) && !r.failed() && r.layer_times_in_run
            });
        match from_row {
            Some(r) if batch == 1 => return Some(r.layer_times.clone()),
            Some(r) if r.batch == Some(batch) => return Some(r.layer_times_batch.clone()),
            _ => {}
        }
        if let Some(t) = self.fp16_profiles.get(&batch) {
            return t.clone();
        }
        let times = self
            .fp16_engine(batch, "FP16 (to compare INT8's regions with)")
            .ok()
            .filter(|e| e.info().layer_times_in_run)
            .map(|e| e.info().layer_times.clone());
        self.fp16_profiles.insert(batch, times.clone());
        times
    }

    /// The FP16 engine at `batch` as the FP16 row builds it: from the model as given, not
    /// INT8's preparation, with FP16's own overflow guard, so that its convs come from the
    /// choice cache as the FP16 row's did. On an H200 the FP16 engines so built for
    /// RegNetY-400MF's and LeViT-128S's INT8 rows ran the FP16 rows' kernels, layer for layer.
    fn fp16_engine(&mut self, batch: usize, what: &str) -> Result<Box<dyn Engine>, String> {
        let float = self.float;
        let guard = self.fp16_guard(float, super::guard::GuardFor::Float);
        let model = crate::quant::carried::float_model(&float.model);
        let input = BuildInput::Float {
            model: &model,
            precision: Precision::Fp16,
            keep_fp32: &guard,
        };
        self.ctx.build(input, batch, what).map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    //! The choice end to end on a backend of the test's own: real CPU engines (so the rows
    //! evaluate and time) whose layer times in the run are scripted, with one quantized layer
    //! slower in INT8 than in FP16.
    use super::*;
    use crate::backend::{BackendError, BackendKind, BuildSpec, EngineInfo, Output};
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Milliseconds each conv layer takes in the scripted engines' runs.
    #[derive(Clone, Copy)]
    struct Script {
        /// Every quantized layer but the slow one, in INT8 (FP16 layers take 1 ms).
        int8_ms: f64,
        /// The slow quantized layer in INT8.
        slow_int8_ms: f64,
        /// What the slow layer costs in FP16 inside an otherwise INT8 engine, over 1 ms: its
        /// region's edges.
        edge_ms: f64,
    }

    /// A CPU engine that reports the scripted layer times as times in the run.
    struct Scripted {
        inner: Box<dyn Engine>,
        info: EngineInfo,
    }

    impl Engine for Scripted {
        fn info(&self) -> &EngineInfo {
            &self.info
        }
        fn batch(&self) -> usize {
            self.inner.batch()
        }
        fn run(&mut self, input: &[f32]) -> Result<Output, BackendError> {
            self.inner.run(input)
        }
    }

    /// Builds CPU engines, says it is CUDA, and records what it built: "fp32", "fp16", "int8"
    /// or "mixed" (an INT8 engine with the slow layer in float), with the batch.
    struct ScriptedBackend {
        script: Script,
        slow: RefCell<Option<String>>,
        built: Rc<RefCell<Vec<(&'static str, usize)>>>,
    }

    impl backend::Backend for ScriptedBackend {
        fn kind(&self) -> BackendKind {
            BackendKind::Cuda
        }
        fn check(&self) -> Result<String, String> {
            Ok("scripted".into())
        }
        fn build(
            &self,
            input: BuildInput<'_>,
            spec: BuildSpec,
        ) -> Result<Box<dyn Engine>, BackendError> {
            let inner = backend::backend(BackendKind::Cpu).build(input, spec)?;
            let convs: Vec<String> = input
                .model()
                .proto
                .graph
                .as_ref()
                .map(|g| {
                    g.node
                        .iter()
                        .filter(|n| matches!(n.op_type.as_str(), "Conv" | "Gemm"))
                        .map(|n| n.name.clone())
                        .collect()
                })
                .unwrap_or_default();
            let quantized: Vec<String> = match input {
                BuildInput::Quantized { qdq, .. } => qdq.plan.quantized_nodes.clone(),
                BuildInput::Float { .. } => vec![],
            };
            let kind = match input {
                BuildInput::Float {
                    precision: Precision::Fp16,
                    ..
                } => "fp16",
                BuildInput::Float { .. } => "fp32",
                BuildInput::Quantized { .. } => {
                    let mut slow = self.slow.borrow_mut();
                    let s = slow.get_or_insert_with(|| quantized[0].clone());
                    if quantized.contains(s) {
                        "int8"
                    } else {
                        "mixed"
                    }
                }
            };
            let slow = self.slow.borrow().clone().unwrap_or_default();
            let s = self.script;
            let layer_times = convs
                .iter()
                .map(|c| LayerTime {
                    layer: c.clone(),
                    kernel: "scripted".into(),
                    time_ms: match (quantized.contains(c), *c == slow) {
                        (true, true) => s.slow_int8_ms,
                        (true, false) => s.int8_ms,
                        (false, true) if kind == "mixed" => 1.0 + s.edge_ms,
                        (false, _) => 1.0,
                    },
                    precision: None,
                })
                .collect();
            self.built.borrow_mut().push((kind, spec.batch));
            let info = EngineInfo {
                layer_times,
                layer_times_in_run: true,
                ..inner.info().clone()
            };
            Ok(Box::new(Scripted { inner, info }))
        }
    }

    struct Quiet;
    impl Sink for Quiet {
        fn progress(&self, _: &str, _: usize, _: usize) {}
        fn log(&self, _: &str) {}
    }

    /// The bundled classifier's INT8 row (and FP16's, where `fp16_row`) at batch 1 and 2, on
    /// the scripted backend.
    fn run_scripted(
        script: Script,
        fp16_row: bool,
    ) -> (Report, Vec<(&'static str, usize)>, String) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_resnet.ron");
        let mut exp = Experiment::load(&path).expect("bundled experiment");
        exp.precisions = match fp16_row {
            true => vec![Precision::Fp16, Precision::Int8],
            false => vec![Precision::Int8],
        };
        exp.methods = vec![Method::Max];
        exp.backend = BackendKind::Cuda;
        exp.evaluation.count = Some(8);
        exp.weight_rounding = crate::prepare::gptq::WeightRounding::Nearest;
        exp.bias_correction = false;
        exp.bench.warmup_runs = 0;
        exp.bench.min_runs = 1;
        exp.bench.min_time_ms = 0.0;
        exp.bench.batch = 2;
        let dir = std::env::temp_dir().join(format!(
            "qs-regions-{}-{}",
            std::process::id(),
            script.edge_ms
        ));
        let cache = StatsCache { dir };
        let built = Rc::new(RefCell::new(vec![]));
        let b = ScriptedBackend {
            script,
            slow: RefCell::new(None),
            built: built.clone(),
        };
        let out = run_on(
            &exp,
            &cache,
            |_| Ok(Box::new(b) as Box<dyn backend::Backend>),
            &Quiet,
            &CancelToken::default(),
        )
        .expect("run");
        let slow = out
            .report
            .rows
            .iter()
            .find_map(|r| r.fp16_regions.first())
            .and_then(|c| c.regions.first())
            .map(|r| r.layers.join(","))
            .unwrap_or_default();
        let built = built.borrow().clone();
        (out.report, built, slow)
    }

    fn int8_row(r: &Report) -> &Row {
        r.rows
            .iter()
            .find(|r| r.precision == Some(Precision::Int8))
            .expect("INT8 row")
    }

    fn precision_of<'a>(times: &'a [LayerTime], layer: &str) -> Option<&'a str> {
        times
            .iter()
            .find(|t| t.layer == layer)
            .and_then(|t| t.precision.as_deref())
    }

    #[test]
    fn a_slow_region_runs_in_fp16_where_the_trial_engine_is_faster() {
        let script = Script {
            int8_ms: 1.0,
            slow_int8_ms: 3.0,
            edge_ms: 0.0,
        };
        let (report, built, slow) = run_scripted(script, true);
        let row = int8_row(&report);
        assert!(row.error.is_none() && row.top1.is_some(), "{:?}", row.error);
        assert_eq!(row.fp16_regions.len(), 2, "one choice per batch size");
        for c in &row.fp16_regions {
            assert_eq!(c.kept, Kept::Regions, "{c:?}");
            assert_eq!(c.regions.len(), 1);
            assert_eq!(c.regions[0].layers, vec![slow.clone()]);
        }
        let marked = "fp16 region: INT8 was 3.00x slower for this region";
        assert_eq!(precision_of(&row.layer_times, &slow), Some(marked));
        assert_eq!(precision_of(&row.layer_times_batch, &slow), Some(marked));
        assert!(
            row.kept_float.is_empty(),
            "regions are not a mixed-precision plan"
        );
        assert!(report.notes.iter().any(|n| n.contains("ran in FP16")));
        assert_eq!(
            built,
            [
                ("fp32", 1),
                ("fp32", 2),
                ("fp16", 1),
                ("fp16", 2),
                ("int8", 1),
                ("mixed", 1),
                ("int8", 2),
                ("mixed", 2)
            ],
            "the FP32 reference, FP16's row (which gives the layer times: no FP16 engine is \
             built for them), then each batch's INT8 and trial engines"
        );
    }

    #[test]
    fn a_slower_trial_engine_leaves_all_int8() {
        // INT8's other layers are fast enough that the engine runs in 0.95x FP16's time (21
        // layers at 0.85 ms and the slow one at 3, against 22 at 1): a trial, but no FP16
        // engine.
        let script = Script {
            int8_ms: 0.85,
            slow_int8_ms: 3.0,
            edge_ms: 5.0,
        };
        let (report, built, slow) = run_scripted(script, true);
        let row = int8_row(&report);
        assert!(row.error.is_none());
        for c in &row.fp16_regions {
            assert!(c.int8_ms < c.fp16_ms && c.worth_trying(), "{c:?}");
            assert_eq!(c.kept, Kept::Int8);
            assert!(c.mixed_ms.is_some() && c.fp16_engine_ms.is_none());
        }
        assert_eq!(precision_of(&row.layer_times, &slow), None);
        assert!(!report.notes.iter().any(|n| n.contains("ran in FP16")));
        assert_eq!(built.iter().filter(|(k, _)| *k == "mixed").count(), 2);
    }

    #[test]
    fn where_int8_loses_even_with_its_regions_in_fp16_the_row_runs_fp16() {
        // All-INT8 24 ms, the trial 27 ms, FP16 22 ms: the whole network is the region.
        let script = Script {
            int8_ms: 1.0,
            slow_int8_ms: 3.0,
            edge_ms: 5.0,
        };
        let (report, built, slow) = run_scripted(script, true);
        let row = int8_row(&report);
        assert!(row.error.is_none() && row.top1.is_some(), "{:?}", row.error);
        for c in &row.fp16_regions {
            assert_eq!(c.kept, Kept::Fp16, "{c:?}");
            assert!(c.mixed_ms.is_some_and(|m| m > c.int8_ms));
            assert!(c.fp16_engine_ms.is_some_and(|m| m < c.int8_ms));
        }
        // Every quantized layer says so, with INT8's slowdown over the whole network.
        let marked = "fp16 region: INT8 was 1.09x slower for the whole network";
        assert_eq!(precision_of(&row.layer_times, &slow), Some(marked));
        let marked_rows = row
            .layer_times_batch
            .iter()
            .filter(|t| t.precision.as_deref() == Some(marked))
            .count();
        assert_eq!(
            marked_rows,
            row.layer_times_batch.len(),
            "every layer (all quantized here) is marked"
        );
        assert_eq!(
            row.int8_nodes,
            Some(0),
            "the row says its engine has no int8 layer"
        );
        assert!(
            row.note()
                .contains("batch 1: ran in FP16 throughout (INT8 was 1.09x slower)"),
            "{}",
            row.note()
        );
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("ran in FP16 throughout"))
        );
        assert_eq!(
            &built[4..],
            [
                ("int8", 1),
                ("mixed", 1),
                ("fp16", 1),
                ("int8", 2),
                ("mixed", 2),
                ("fp16", 2)
            ],
            "each batch's INT8 engine, the trial, then the FP16 engine for the row"
        );
    }

    #[test]
    fn an_int8_engine_well_ahead_of_fp16_is_kept_untried() {
        let script = Script {
            int8_ms: 0.5,
            slow_int8_ms: 1.5,
            edge_ms: 0.0,
        };
        // No FP16 row: an FP16 engine is built per batch size for its layer times.
        let (report, built, _) = run_scripted(script, false);
        let row = int8_row(&report);
        assert!(row.error.is_none());
        assert_eq!(row.fp16_regions.len(), 2);
        for c in &row.fp16_regions {
            assert_eq!(c.regions.len(), 1, "the slow layer is still found");
            assert!(!c.worth_trying() && c.mixed_ms.is_none() && c.kept == Kept::Int8);
        }
        assert_eq!(
            built,
            [
                ("fp32", 1),
                ("fp32", 2),
                ("int8", 1),
                ("fp16", 1),
                ("int8", 2),
                ("fp16", 2)
            ]
        );
    }
}
