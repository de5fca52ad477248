//! The quantized rows of a run: calibrate, place Q/DQ and build one INT8 engine per method
//! (with bias correction and a mixed-precision plan's variant, checked against its budget),
//! then the FP8 engine; and their exports. `place_int8` and `mixed_ranges` are shared with
//! sensitivity, so the plans it measures are the engines the run builds.

use super::*;

/// One INT8 engine to build: a method's calibrated ranges, maybe with layers kept in float.
pub(super) struct Int8Variant {
    pub method: Option<Method>,
    pub ranges: Option<Ranges>,
    pub kept_float: Vec<String>,
    /// The mixed-precision plan's budget: its row is checked against FP32 on it.
    budget: Option<Budget>,
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

impl Rows<'_> {
    /// Calibrate, place Q/DQ, then build and evaluate one INT8 engine per variant. A stage that
    /// fails leaves an error row per method it would have produced.
    pub(super) fn int8_rows(&mut self, cache: &StatsCache, reference: &Reference) {
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
            self.int8_row(v, reference);
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
                budget: None,
            }]);
        }
        if exp.methods.is_empty() {
            return Ok(vec![]);
        }
        let (stats, hit, pass_ms) =
            calibrate(p, plan, self.ctx.backend, cache, sink, self.ctx.cancel)?;
        let t = Instant::now();
        let mut all: Vec<Ranges> = Method::ALL
            .iter()
            .map(|&m| stats.ranges(m, exp.percentile))
            .collect();
        let ranges_ms = t.elapsed().as_secs_f64() * 1e3;
        let asked: Vec<&str> = exp.methods.iter().map(|m| m.name()).collect();
        // Every method's ranges are computed (the Calibration tab draws them all); the line
        // names the ones the engines use.
        let others = if asked.len() < Method::ALL.len() {
            " (the other methods' too, for the Calibration tab's histograms)"
        } else {
            ""
        };
        sink.log(&format!(
            "ranges for {} computed in {ranges_ms:.0} ms{others}",
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
            let notes = crate::prepare::correct_biases(
                &p.source(),
                plan,
                &mut all,
                &used,
                exp.correction_images,
                sink,
            )
            .map_err(PipelineError::Config)?;
            self.report.notes.extend(notes);
        }
        let mut variants: Vec<Int8Variant> = exp
            .methods
            .iter()
            .map(|&m| Int8Variant {
                method: Some(m),
                ranges: all.iter().find(|r| r.method == m).cloned(),
                kept_float: vec![],
                budget: None,
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
                let note = crate::prepare::correct_mixed_biases(
                    &p.source(),
                    plan,
                    &mut r,
                    exp.correction_images,
                    sink,
                )
                .map_err(PipelineError::Config)?;
                self.report.notes.push(note);
            }
            variants.push(Int8Variant {
                method: Some(m),
                ranges: Some(r),
                kept_float: mp.keep_float.clone(),
                budget: mp.budget,
            });
        }
        Ok(variants)
    }

    /// Places Q/DQ for one variant, exports it when asked, then builds and evaluates its engine
    /// (and checks a mixed-precision plan's row against its budget).
    fn int8_row(&mut self, v: Int8Variant, reference: &Reference) {
        let (exp, p) = (self.exp, self.ctx.p);
        let label = v.label();
        let placed = crate::guard::catch(&format!("placing Q/DQ for {label}"), || {
            place_int8(
                &p.model,
                &self.float_weights,
                &exp.exclude,
                &v.kept_float,
                v.ranges.as_ref(),
            )
            .map_err(|e| e.to_string())
        });
        let (model, qdq) = match placed.and_then(|r| r) {
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
        let guard = self.quantized_guard(p, guard::GuardFor::Int8);
        let input = BuildInput::Quantized {
            model: &model,
            qdq: &qdq,
            keep_fp32: &guard,
        };
        let mut ev = match self.regions_apply() {
            true => self.int8_row_by_region(&v, input, reference, &label),
            false => self.ctx.row(input, Some(reference), &mut None, &label),
        };
        if let Some(budget) = v.budget {
            self.check_budget(&mut ev.row, budget, &label);
        }
        self.push(ev, Precision::Int8, v.method, &v.kept_float);
        self.artifacts.qdq.push(QdqArtifact {
            method: v.method,
            suffix,
            model: qdq,
        });
    }

    /// Checks the mixed-precision plan's row against its budget on the evaluation images (the
    /// plan was searched on them, but this is the engine that was built): the row carries
    /// the check, the log says it, and a miss becomes a note of the report.
    fn check_budget(&mut self, row: &mut Row, budget: Budget, label: &str) {
        if row.failed() {
            return; // The row says why it has no metric.
        }
        let fp32 = self.report.fp32().and_then(Row::metric);
        let (Some(fp32), Some(achieved)) = (fp32, row.metric()) else {
            self.ctx.sink.log(&format!(
                "{label}: budget not checked ({}): no FP32 or no mixed metric",
                budget.describe()
            ));
            return;
        };
        let check = BudgetCheck::of(budget, fp32, achieved);
        let line = format!("{label}: {}", check.describe());
        self.ctx.sink.log(&line);
        if !check.met {
            self.report.notes.push(line);
        }
        row.budget = Some(check);
    }

    /// The FP8 E4M3 engine: the INT8 placement, activation scales amax / 448 from max
    /// calibration (FP8's range makes clipping methods tuned to int8's uniform grid needless),
    /// weights per channel, nearest rounding. Exported when the experiment's exports ask.
    pub(super) fn fp8_row(&mut self, cache: &StatsCache, reference: &Reference) {
        let (exp, p) = (self.exp, self.ctx.p);
        let plan = quant::plan(&p.model, &exp.exclude);
        let (sink, cancel) = (self.ctx.sink, self.ctx.cancel);
        // A pre-quantized FP8 model runs its own scales: no calibration method to name.
        let prequantized = p.model.info.prequantized;
        let method = (!prequantized).then_some(Method::Max);
        let mut rounding = vec![];
        let made = crate::guard::catch("calibrating for FP8", || {
            if prequantized {
                // Its own Q/DQ, when they are FP8 (else build_qdq_as says why not).
                return quant::build_qdq_as(&p.model, &plan, None, quant::QFormat::Fp8E4M3)
                    .map_err(|e| PipelineError::Config(e.to_string()));
            }
            let (stats, _, _) = calibrate(p, &plan, self.ctx.backend, cache, sink, cancel)?;
            let ranges = stats.ranges(Method::Max, exp.percentile);
            rounding = quant::rounding::per_layer(&p.model, &plan, &stats);
            quant::build_qdq_as(&p.model, &plan, Some(&ranges), quant::QFormat::Fp8E4M3)
                .map_err(|e| PipelineError::Config(e.to_string()))
        })
        .map_err(PipelineError::Config)
        .and_then(|r| r);
        // Why FP8 reads below INT8 on most CNNs: the format's own rounding, layer by layer.
        if let Some(note) = quant::rounding::describe(&rounding) {
            self.ctx.sink.log(&note);
            self.report.notes.push(note);
        }
        self.report.fp8_rounding = rounding;
        let qdq = match made {
            Ok(q) => q,
            Err(PipelineError::Cancelled) => return,
            Err(e) => {
                self.error_row(Precision::Fp8, method, e.to_string());
                return;
            }
        };
        let wants = exp
            .output
            .export_precisions
            .contains(&crate::export::ExportPrecision::Fp8);
        // A pre-quantized model is written as repaired (it is exported whenever a folder is
        // given, as its INT8 counterpart is); a calibrated one when FP8 exports are asked for.
        let export = if prequantized {
            crate::export::export_prequantized
        } else {
            crate::export::export_fp8
        };
        if let (Some(dir), true) = (&exp.output.qdq_dir, prequantized || wants) {
            let input = self.ctx.bench_input.clone();
            let written = export(
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
        let guard = self.quantized_guard(p, guard::GuardFor::Float);
        let input = BuildInput::Quantized {
            model: &p.model,
            qdq: &qdq,
            keep_fp32: &guard,
        };
        let label = if prequantized { "FP8" } else { "FP8 max" };
        let ev = self.ctx.row(input, Some(reference), &mut None, label);
        self.push(ev, Precision::Fp8, method, &[]);
        self.artifacts.qdq.push(QdqArtifact {
            method,
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
        if p.model.info.prequantized {
            // Its own Q/DQ as the load normalised them, with no cache (nothing was calibrated).
            let input = self.ctx.bench_input.clone();
            let written = export::export_prequantized(
                dir,
                &exp.model,
                &p.model,
                qdq,
                p.hw,
                self.ctx.backend,
                &input,
            );
            self.record_export(written);
            return;
        }
        if wants(ExportPrecision::Int8) {
            // The cache's ranges belong to the prepared graph when a rewrite changed it.
            let rewritten = self.report.equalization.as_ref().is_some_and(|e| e.applied)
                || self.report.centering.as_ref().is_some_and(|c| c.applied());
            let written = export_qdq(dir, &exp.model, qdq, v.method, suffix).and_then(|files| {
                let fp32 = export::fp32_for_cache(dir, &exp.model, &p.model, rewritten)?;
                let spec = crate::export::trtexec::InputSpec::new(
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
            let guard = self.fp16_guard(p, guard::GuardFor::Int8);
            let written = export::export_mixed(
                dir,
                &exp.model,
                &p.model,
                qdq,
                p.hw,
                self.ctx.backend,
                &input,
                &guard,
            );
            self.record_export(written);
        }
    }
}

/// The Q/DQ model of an INT8 engine on the INT8 path's `model`, `keep_float` (a
/// mixed-precision plan's layers) left in float on top of `exclude` and given back their
/// float weights (`float_weights`: what GPTQ replaced), with the model it was placed on.
/// Sensitivity measures its plans through this too, so the plan it picks is the engine built.
pub fn place_int8<'m>(
    model: &'m Model,
    float_weights: &FloatWeights,
    exclude: &[String],
    keep_float: &[String],
    ranges: Option<&Ranges>,
) -> Result<(Cow<'m, Model>, QdqModel), quant::QuantError> {
    let model = float_weights.for_plan(model, keep_float);
    let excl: Vec<String> = exclude.iter().chain(keep_float).cloned().collect();
    let qdq = quant::build_qdq(&model, &quant::plan(&model, &excl), ranges)?;
    Ok((model, qdq))
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
