//! The one place that takes worker events: rows, finished and failed runs, analyses, scans,
//! exports and dialogs (stale job ids are dropped), and a re-timed row's merge.

use eframe::egui;
use std::time::Instant;

use super::app::texture;
use super::{MaskViewState, Results, Scan, Workbench};
use crate::report::Report;
use crate::worker::{Event, JobId};

impl Workbench {
    /// Puts a re-timed row's latency (and the load it was timed under) into row `i` of the
    /// results of run `of`, wherever the history picker has put them.
    pub(super) fn take_retimed(&mut self, of: Option<JobId>, i: usize, report: &Report) {
        let results = if self.results.job == of {
            &mut self.results
        } else {
            match self.past_runs.iter_mut().find(|r| r.job == of) {
                Some(r) => r,
                None => return,
            }
        };
        let Some(old) = results.rows.get(i) else {
            return;
        };
        let label = old.label();
        let Some(new) = report
            .rows
            .iter()
            .find(|r| r.label() == label && r.error.is_none())
        else {
            let why = report
                .rows
                .iter()
                .find_map(|r| r.error.clone())
                .unwrap_or_else(|| "no row came back".into());
            self.log_error(format!("re-timing {label} failed: {why}"));
            return;
        };
        let update = |r: &mut crate::report::Row| {
            r.latency_ms = new.latency_ms;
            r.throughput_ips = new.throughput_ips;
            r.latency_batch_ms = new.latency_batch_ms;
            r.throughput_batch_ips = new.throughput_batch_ips;
            r.timing_load = new.timing_load;
        };
        update(&mut results.rows[i]);
        if let Some(r) = results.report.as_mut().and_then(|r| r.rows.get_mut(i)) {
            update(r);
        }
        let l = new.latency_ms.unwrap_or_default();
        self.log_info(format!(
            "re-timed {label}: median {:.3} ms over {} runs{}",
            l.median,
            l.runs,
            l.ci95_rel
                .map(|c| format!(", ±{:.1} % (95 %)", c * 100.0))
                .unwrap_or_default()
        ));
    }

    /// The results of run `job`: the ones shown, or one in the history.
    pub(super) fn results_of(&mut self, job: JobId) -> Option<&mut Results> {
        if self.results.job == Some(job) {
            return Some(&mut self.results);
        }
        self.past_runs.iter_mut().find(|r| r.job == Some(job))
    }

    pub(super) fn take_event(&mut self, ctx: &egui::Context, ev: Event) {
        let job = ev.job();
        let run_job = self.run.as_ref().map(|r| r.job);
        match ev {
            Event::Progress {
                stage, done, total, ..
            } if run_job == Some(job) => {
                if let Some(run) = &mut self.run {
                    if run.stage != stage {
                        run.stage = stage;
                        run.stage_started = Instant::now();
                    }
                    run.done = done;
                    run.total = total;
                }
            }
            Event::Log { line, .. } if run_job == Some(job) => self.log_info(line),
            Event::Row { row, .. } if run_job == Some(job) => {
                let lat = row
                    .latency_ms
                    .map(|l| format!(", median {:.2} ms", l.median))
                    .unwrap_or_default();
                let build = row
                    .build_ms
                    .map(|b| format!(", built in {b:.0} ms"))
                    .unwrap_or_default();
                if self.run.as_ref().is_some_and(|r| r.retime.is_some()) {
                    return; // said when the re-time finishes
                }
                match (&row.error, &row.non_finite) {
                    (Some(e), _) => self.log_error(format!("{}: {e}", row.label())),
                    (None, Some(n)) => self.log_error(format!("{}: {}", row.label(), n.reason())),
                    (None, None) => self.log_info(format!("row done: {}{build}{lat}", row.label())),
                }
                if let Some(r) = self.results_of(job) {
                    r.rows.push(*row);
                }
            }
            Event::Finished {
                report, artifacts, ..
            } if run_job == Some(job) => {
                let run = self.run.take();
                if let Some((of, i)) = run.as_ref().and_then(|r| r.retime) {
                    self.take_retimed(of, i, &report);
                    return;
                }
                let secs = run.as_ref().map(|r| r.started.elapsed().as_secs_f64());
                let cancelled = run.as_ref().is_some_and(|r| r.cancelling);
                self.log_info(format!(
                    "run #{job} {} in {:.1} s: {} rows",
                    if cancelled { "cancelled" } else { "finished" },
                    secs.unwrap_or(0.0),
                    report.rows.len()
                ));
                let shown = self.results.job == Some(job);
                let Some(slot) = self.results_of(job) else {
                    return;
                };
                *slot = Results {
                    title: std::mem::take(&mut slot.title),
                    rows: report.rows.clone(),
                    report: Some(*report),
                    artifacts: Some(*artifacts),
                    partial: cancelled,
                    job: Some(job),
                };
                let (title, report) = (slot.title.clone(), slot.report.clone());
                let kept = match (&self.autosave, &report) {
                    (Some(a), Some(r)) => a.keep_run(&title, r).err(),
                    _ => None,
                };
                if let Some(e) = kept {
                    self.log_error(e);
                }
                if !shown {
                    return; // the user is browsing an earlier run; this one waits in the picker
                }
                self.masks = MaskViewState::default();
                // Thumbnails are of files, still good for the new results; the choices are not.
                (self.classes.engine, self.classes.cell, self.classes.image) = (None, None, None);
                self.pick_default_engines();
                // An earlier run's failure no longer describes what is on screen.
                if self.banner.as_ref().is_some_and(|(_, error)| *error) {
                    self.banner = None;
                }
                let void: Vec<String> = self
                    .results
                    .rows
                    .iter()
                    .filter(|r| r.non_finite.is_some())
                    .map(|r| r.label())
                    .collect();
                if !void.is_empty() {
                    self.banner = Some((
                        format!(
                            "{} output NaN/Inf: {} metrics are void (see the note column).",
                            void.join(", "),
                            if void.len() == 1 { "its" } else { "their" }
                        ),
                        true,
                    ));
                } else if let Some(note) = crate::report::near_chance_note(&self.results.rows) {
                    // An evaluation at chance makes every comparison on screen noise.
                    self.banner = Some((note, true));
                }
            }
            Event::Failed { error, .. } if run_job == Some(job) => {
                let run = self.run.take();
                if run.as_ref().is_some_and(|r| r.retime.is_some()) {
                    self.log_error(format!("re-timing stopped: {error}"));
                    return;
                }
                if run.is_some_and(|r| r.cancelling) {
                    let kept = self.results_of(job).map(|r| {
                        r.partial = true;
                        r.rows.len()
                    });
                    self.log_info(format!(
                        "run #{job} cancelled ({error}); kept {} rows",
                        kept.unwrap_or(0)
                    ));
                } else {
                    self.log_error(format!("run #{job} failed: {error}"));
                    self.banner = Some((format!("The run failed: {error}"), true));
                }
            }
            Event::Sensitivity { result, .. } if run_job == Some(job) => {
                let run = self.run.take();
                let secs = run.as_ref().map(|r| r.started.elapsed().as_secs_f64());
                let cancelled = run.as_ref().is_some_and(|r| r.cancelling);
                match result {
                    Ok(report) => {
                        self.log_info(format!(
                            "sensitivity #{job} finished in {:.1} s: {} layers",
                            secs.unwrap_or(0.0),
                            report.layers.len()
                        ));
                        self.take_sensitivity(*report);
                    }
                    Err(error) if cancelled => {
                        self.log_info(format!("sensitivity #{job} cancelled ({error})"))
                    }
                    Err(error) => {
                        self.log_error(format!("sensitivity #{job} failed: {error}"));
                        self.banner = Some((format!("The layer analysis failed: {error}"), true));
                    }
                }
            }
            Event::Progress { .. }
            | Event::Log { .. }
            | Event::Row { .. }
            | Event::Finished { .. }
            | Event::Failed { .. }
            | Event::Sensitivity { .. } => {} // a stale job's
            Event::CudaCoverage { path, coverage, .. } => {
                if path == self.exp.model {
                    self.model.cuda = coverage;
                }
            }
            Event::Inspected { path, result, .. } if self.model.loading == Some(job) => {
                self.model.loading = None;
                match result {
                    Ok(info) => {
                        self.log_info(format!(
                            "model {}: opset {}, {} nodes, {} parameters",
                            path.display(),
                            info.opset,
                            info.nodes,
                            info.params
                        ));
                        self.model.info = Some(*info);
                        self.model.error = None;
                    }
                    Err(e) => {
                        self.log_error(e.clone());
                        self.model.error = Some(e);
                    }
                }
                self.request_preview();
            }
            Event::Diagram { path, result, .. } if self.model.diagram_job == Some(job) => {
                self.model.diagram_job = None;
                match result {
                    Ok(d) => {
                        self.log_info(format!(
                            "graph of {}: {} boxes, {} edges laid out",
                            path.display(),
                            d.nodes.len(),
                            d.edges.len()
                        ));
                        self.model.diagram = Some(d);
                    }
                    Err(e) => {
                        self.log_error(format!("graph of {}: {e}", path.display()));
                        self.model.diagram_error = Some(e);
                    }
                }
            }
            Event::CalibScanned { result, .. } if self.data.calib.loading_job() == Some(job) => {
                match result {
                    Ok(scan) => {
                        self.data.thumbs = scan
                            .thumbs
                            .iter()
                            .enumerate()
                            .map(|(i, (p, img))| {
                                (p.clone(), texture(ctx, &format!("thumb{i}"), img))
                            })
                            .collect();
                        self.data.calib = Scan::Done(scan);
                    }
                    Err(e) => self.data.calib = Scan::Failed(e),
                }
                self.request_preview();
            }
            Event::EvalScanned { result, .. } if self.data.eval.loading_job() == Some(job) => {
                let had_preview_source =
                    matches!(&self.data.calib, Scan::Done(c) if c.first.is_some());
                self.data.eval = match result {
                    Ok(s) => Scan::Done(s),
                    Err(e) => Scan::Failed(e),
                };
                if !had_preview_source {
                    self.request_preview();
                }
            }
            Event::Preview { result, .. } if self.data.preview.loading_job() == Some(job) => {
                match result {
                    Ok(p) => {
                        self.data.preview_tex = Some([
                            texture(ctx, "preview.resized", &p.resized),
                            texture(ctx, "preview.tensor", &p.tensor_view),
                        ]);
                        self.data.preview = Scan::Done(p);
                    }
                    Err(e) => self.data.preview = Scan::Failed(e),
                }
            }
            Event::Image { path, result, .. }
                if self.classes.thumb_loading.remove(&job).is_some() =>
            {
                match result {
                    Ok(img) => {
                        // Thumbnails are small (96 px): a few hundred cost a few MiB.
                        if self.classes.thumbs.len() > 512 {
                            self.classes.thumbs.clear();
                        }
                        let t = texture(ctx, &format!("thumb {}", path.display()), &img);
                        self.classes.thumbs.insert(path, t);
                    }
                    Err(e) => {
                        self.classes.thumb_errors.insert(path, e);
                    }
                }
            }
            Event::Image { path, result, .. } => {
                if self.masks.image_loading.remove(&job).is_some() {
                    match result {
                        Ok(img) => {
                            if self.masks.images.len() > 16 {
                                self.masks.images.clear();
                            }
                            let t = texture(ctx, &path.display().to_string(), &img);
                            self.masks.images.insert(path, t);
                        }
                        Err(e) => {
                            self.masks.image_errors.insert(path, e);
                        }
                    }
                }
            }
            Event::Backends { status, ort, .. } if self.backend_job == Some(job) => {
                match &ort {
                    Ok(o) => self.log_info(format!(
                        "CPU engine: ONNX Runtime {} ({})",
                        o.version,
                        o.path.display()
                    )),
                    Err(why) => self.log_info(format!("CPU engine: tract ({why})")),
                }
                self.ort = Some(ort);
                for (k, s) in &status {
                    match s {
                        Ok(dev) => self.log_info(format!("backend {}: {dev}", k.name())),
                        Err(why) => {
                            self.log_info(format!("backend {}: unavailable: {why}", k.name()))
                        }
                    }
                }
                self.backends = status;
            }
            Event::Picked {
                path, dialog_ms, ..
            } => {
                let Some(purpose) = self.dialogs.remove(&job) else {
                    return;
                };
                self.picked(purpose, path, dialog_ms);
            }
            Event::Exported { result, checks, .. } => match result {
                Ok(files) => {
                    for c in &checks {
                        if c.contains("OUTSIDE") {
                            self.log_error(c.clone());
                        } else {
                            self.log_info(c.clone());
                        }
                    }
                    let dir = files
                        .first()
                        .and_then(|f| f.parent())
                        .map(|d| d.display().to_string())
                        .unwrap_or_default();
                    let names: Vec<String> = files
                        .iter()
                        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                        .collect();
                    self.notify(format!(
                        "Wrote {} files to {dir}: {}",
                        files.len(),
                        names.join(", ")
                    ));
                    self.trt_commands = self.trt_commands_for(&files);
                    self.trt_window = true;
                }
                Err(e) => {
                    let msg = format!("Q/DQ export failed: {e}");
                    self.log_error(msg.clone());
                    self.banner = Some((msg, true));
                }
            },
            Event::Inspected { .. }
            | Event::Diagram { .. }
            | Event::CalibScanned { .. }
            | Event::EvalScanned { .. }
            | Event::Preview { .. }
            | Event::Backends { .. } => {} // superseded by a newer request
        }
    }
}
