//! An INT8 row's engines on the GPU, precision per region: at batch 1 and at the run's batch,
//! the all-INT8 engine's layer times in the run are set against FP16's
//! ([`crate::fp16_regions`]); where a region is slower in INT8, an engine with that region in
//! FP16 is built and timed too, and the faster engine is the one the row evaluates and times.
//! The Q/DQ export stays all-INT8: TensorRT makes its own choice.

use super::quantized::{Int8Variant, place_int8};
use super::*;
use crate::backend::LayerTime;
use crate::fp16_regions::{self, RegionChoice};

/// The engine with the regions in FP16 is kept when its run is at least this much faster:
/// two builds of one engine profile within about 1 % of each other.
const KEEP_MIXED_GAIN: f64 = 0.01;

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
            batch1: Some(batch1),
            build_ms,
            batch,
        };
        let mut ev = self
            .ctx
            .row_with(RowEngines::Built(built), Some(reference), &mut None, label);
        for c in &choices {
            let line = c.describe(label);
            self.ctx.sink.log(&line);
            if c.kept_mixed {
                self.report.notes.push(line);
            }
            match c.batch {
                1 => c.annotate(&mut ev.row.layer_times),
                _ => c.annotate(&mut ev.row.layer_times_batch),
            }
        }
        ev.row.fp16_regions = choices;
        ev
    }

    /// The faster of the all-INT8 engine `int8_engine` (built at `batch`) and one with its
    /// slower regions in FP16, built and timed here; what was chosen goes to `choices`. The
    /// INT8 engine stands where there is nothing to compare: no region is slower, a profile
    /// is not in the run, or the other engine cannot be placed or built (logged).
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
        let regions =
            fp16_regions::slower_regions(&info.layer_times, &fp16, &qdq.plan.quantized_nodes);
        let mut choice = RegionChoice {
            batch,
            int8_ms: info.layer_times.iter().map(|t| t.time_ms).sum(),
            fp16_ms: fp16.iter().map(|t| t.time_ms).sum(),
            regions,
            mixed_ms: None,
            kept_mixed: false,
        };
        if !choice.worth_trying() || self.ctx.cancel.is_cancelled() {
            choices.push(choice);
            return int8_engine;
        }
        let mut kept = v.kept_float.clone();
        kept.extend(choice.regions.iter().flat_map(|r| r.layers.clone()));
        let (exp, p) = (self.exp, self.ctx.p);
        let what = format!("{label} with {} FP16 region(s)", choice.regions.len());
        let mixed = place_int8(
            &p.model,
            &self.float_weights,
            &exp.exclude,
            &kept,
            v.ranges.as_ref(),
        )
        .map_err(|e| e.to_string())
        .and_then(|(model, qdq)| {
            let input = BuildInput::Quantized {
                model: &model,
                qdq: &qdq,
                keep_fp32,
            };
            self.ctx.build(input, batch, &what).map_err(|e| e.message)
        });
        match mixed {
            Ok(e) if e.info().layer_times_in_run => {
                let mixed_ms: f64 = e.info().layer_times.iter().map(|t| t.time_ms).sum();
                choice.mixed_ms = Some(mixed_ms);
                choice.kept_mixed = mixed_ms < choice.int8_ms * (1.0 - KEEP_MIXED_GAIN);
                let kept_mixed = choice.kept_mixed;
                choices.push(choice);
                match kept_mixed {
                    true => e,
                    false => int8_engine,
                }
            }
            Ok(_) => {
                choices.push(choice);
                int8_engine
            }
            Err(e) => {
                self.ctx
                    .sink
                    .log(&format!("{what}: not built ({e}); all INT8 kept"));
                choices.push(choice);
                int8_engine
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
        let guard = self.fp16_guard(self.ctx.p, guard::GuardFor::Float);
        let float = quant::carried::float_model(&self.ctx.p.model);
        let input = BuildInput::Float {
            model: float.as_ref(),
            precision: Precision::Fp16,
            keep_fp32: &guard,
        };
        let times = self
            .ctx
            .build(input, batch, "FP16 (to compare INT8's regions with)")
            .ok()
            .filter(|e| e.info().layer_times_in_run)
            .map(|e| e.info().layer_times.clone());
        self.fp16_profiles.insert(batch, times.clone());
        times
    }
}
