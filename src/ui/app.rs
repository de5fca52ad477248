//! Commands and the one place that applies them; worker events and the one place that takes
//! them (stale job ids are dropped); keyboard shortcuts, dropped files, the menu bar and the
//! status bar.

use eframe::egui;
use std::path::{Path, PathBuf};
use std::time::Instant;

use egui::{Key, KeyboardShortcut, Modifiers};

use super::{
    DialogPurpose, LayerSort, MAX_RECENT, MaskViewState, PAST_RUNS_KEPT, Results, RunState, Scan,
    Tab, Workbench, theme,
};
use crate::backend::Precision;
use crate::calib::Method;
use crate::experiment::Experiment;
use crate::model::Task;
use crate::report::Report;
use crate::sensitivity::{Budget, SensitivityOptions, SensitivityReport};
use crate::worker::{DialogKind, Event, FileDialog, IoRequest, JobId};

pub const SC_OPEN: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::O);
pub const SC_SAVE: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::S);
pub const SC_RUN: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::R);
pub const SC_CANCEL: KeyboardShortcut = KeyboardShortcut::new(Modifiers::NONE, Key::Escape);

/// Events taken per frame at most, so a burst never makes a long frame.
const MAX_EVENTS_PER_FRAME: usize = 256;
/// How long a cancelled job may take to stop before the window lets go of it.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);
/// A dialog that answers `None` faster than this had no portal to show it.
const NO_DIALOG_MS: f64 = 250.0;

/// What a report or view can be exported as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportKind {
    Json,
    Markdown,
    Csv,
    /// The central area as shown (viewport screenshot).
    ViewPng,
    /// Image, FP32 and the chosen INT8 masks side by side, rendered with the image crate.
    MaskPng,
    /// Each method's Q/DQ ONNX model and TensorRT calibration cache, into a folder.
    Qdq,
}

impl ExportKind {
    pub fn extension(self) -> &'static str {
        match self {
            ExportKind::Json => "json",
            ExportKind::Markdown => "md",
            ExportKind::Csv => "csv",
            ExportKind::ViewPng | ExportKind::MaskPng => "png",
            ExportKind::Qdq => "onnx",
        }
    }
}

/// Everything the UI can ask for. Drawing code pushes these; `Workbench::apply` runs them.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Open an experiment (.ron) or a model (.onnx).
    Open(PathBuf),
    OpenDialog,
    Save,
    SaveAs,
    SaveTo(PathBuf),
    /// Replace the experiment with an edited copy; what changed decides what is refreshed.
    SetExperiment(Box<Experiment>),
    ChooseCalibDir,
    ChooseEvalDir,
    ChooseLabels,
    /// Show the window where a path can be typed (for desktops without a file dialog).
    ShowOpenPath,
    /// Clears the data settings (folders, labels, preprocessing) and keeps the model.
    ResetDataSettings,
    /// Builds the engine of results row `i` again and times it until its median is stable.
    RetimeRow(usize),
    /// Open the experiment the window autosaved (after a crash, say).
    RestoreAutosave,
    Rescan,
    Run,
    Cancel,
    /// Per-layer sensitivity of the current experiment (and a mixed-precision search when
    /// the Layers tab asks for one), on the worker thread.
    AnalyseSensitivity,
    /// Sort the Layers table by a column; the same column again flips the order.
    SortLayers(LayerSort),
    /// Keep a layer (node name) in float in the mixed-precision engine, or quantize it again.
    ToggleLayerFloat(String),
    SetTab(Tab),
    SelectImage(usize),
    NextImage,
    PrevImage,
    SetEngine {
        slot: usize,
        row: Option<usize>,
    },
    Export(ExportKind),
    ExportTo(ExportKind, PathBuf),
    SetLightTheme(bool),
    CheckBackends,
    ClearRecent,
}

pub(crate) fn is_model(p: &Path) -> bool {
    p.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// An evaluation set's layout: `images/` + `masks/`, or class folders holding files.
fn looks_like_eval_set(dir: &Path) -> bool {
    if dir.join("images").is_dir() && dir.join("masks").is_dir() {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let (mut folders, mut files) = (0, 0);
    for e in entries.flatten().take(10_000) {
        match e.file_type() {
            Ok(t) if t.is_dir() => folders += 1,
            Ok(_) => files += 1,
            Err(_) => {}
        }
    }
    folders >= 2 && files <= folders
}

impl Workbench {
    /// Applies the commands pushed this frame, in order.
    pub fn apply_pending(&mut self) {
        let cmds = std::mem::take(&mut self.pending);
        // Commands change what the window shows after this frame was drawn: draw another.
        if let (false, Some(ctx)) = (cmds.is_empty(), &self.ctx) {
            ctx.request_repaint();
        }
        for c in cmds {
            self.apply(c);
        }
    }

    /// The one place a command changes state.
    pub fn apply(&mut self, c: Command) {
        self.history.push(c.clone());
        if self.history.len() > 200 {
            self.history.drain(..100);
        }
        match c {
            Command::Open(p) => self.open(&p),
            Command::OpenDialog => self.dialog(
                DialogPurpose::Open,
                DialogKind::OpenFile,
                "Open an experiment or a model",
                &[("experiment or model", &["ron", "onnx"])],
                None,
            ),
            Command::Save => {
                match self.exp_path.clone() {
                    Some(p) if !is_bundled_sample(&p) => self.save_to(&p),
                    Some(_) => {
                        self.log_info("the bundled samples are never overwritten: choose where to save your copy");
                        self.apply(Command::SaveAs)
                    }
                    None => self.apply(Command::SaveAs),
                }
            }
            Command::SaveAs => {
                let name = format!("{}.ron", self.experiment_stem());
                self.dialog(
                    DialogPurpose::SaveExperiment,
                    DialogKind::SaveFile,
                    "Save the experiment",
                    &[("experiment", &["ron"])],
                    Some(name),
                )
            }
            Command::SaveTo(p) => self.save_to(&p),
            Command::SetExperiment(e) => self.set_experiment(*e),
            Command::ChooseCalibDir => self.dialog(
                DialogPurpose::CalibDir,
                DialogKind::PickFolder,
                "Calibration images",
                &[],
                None,
            ),
            Command::ChooseLabels => self.dialog(
                DialogPurpose::Labels,
                DialogKind::OpenFile,
                "Class names, one per line",
                &[("labels", &["txt"])],
                None,
            ),
            Command::ShowOpenPath => self.path_window = Some(DialogPurpose::Open),
            Command::ResetDataSettings => {
                let e = Experiment {
                    name: self.exp.name.clone(),
                    model: self.exp.model.clone(),
                    ..Default::default()
                };
                self.banner = None;
                self.log_info("data settings reset: no calibration or evaluation folder, labels or preprocessing");
                self.set_experiment(e);
            }
            Command::RestoreAutosave => self.restore_autosave(),
            Command::ChooseEvalDir => self.dialog(
                DialogPurpose::EvalDir,
                DialogKind::PickFolder,
                "Evaluation set (ImageFolder or images/ + masks/)",
                &[],
                None,
            ),
            Command::Rescan => {
                self.scan_calib();
                self.scan_eval();
            }
            Command::Run => self.start_run(),
            Command::RetimeRow(i) => self.start_retime(i),
            Command::Cancel => {
                if let Some(run) = &mut self.run {
                    run.cancelling = true;
                    run.cancelled_at.get_or_insert_with(Instant::now);
                    if let Some(w) = &mut self.worker {
                        w.cancel();
                    }
                    self.log_info("cancel requested; keeping the rows already finished");
                }
            }
            Command::AnalyseSensitivity => self.start_sensitivity(),
            Command::SortLayers(col) => {
                if self.layers.sort == col {
                    self.layers.descending = !self.layers.descending;
                } else {
                    self.layers.sort = col;
                    // Worst first for the measures, A to Z for names.
                    self.layers.descending =
                        matches!(col, LayerSort::MetricGain | LayerSort::Precision);
                }
            }
            Command::ToggleLayerFloat(node) => self.toggle_layer_float(node),
            Command::SetTab(t) => self.tab = t,
            Command::SelectImage(i) => {
                self.masks.image = i;
                self.masks.textures.clear();
            }
            Command::NextImage | Command::PrevImage => {
                let order = self.image_order();
                if order.is_empty() {
                    return;
                }
                let pos = order
                    .iter()
                    .position(|&i| i == self.masks.image)
                    .unwrap_or(0);
                let next = if c == Command::NextImage {
                    (pos + 1).min(order.len() - 1)
                } else {
                    pos.saturating_sub(1)
                };
                self.masks.image = order[next];
                self.masks.textures.clear();
            }
            Command::SetEngine { slot, row } => {
                if let Some(s) = self.masks.engines.get_mut(slot) {
                    *s = row;
                    self.masks.textures.clear();
                }
            }
            Command::Export(ExportKind::Qdq) => self.dialog(
                DialogPurpose::Export(ExportKind::Qdq),
                DialogKind::PickFolder,
                "Folder for the Q/DQ ONNX models and TensorRT calibration caches",
                &[],
                None,
            ),
            Command::Export(kind) => {
                let name = self.export_name(kind);
                let ext = kind.extension();
                self.dialog(
                    DialogPurpose::Export(kind),
                    DialogKind::SaveFile,
                    "Export",
                    &[(ext, &[ext])],
                    Some(name),
                )
            }
            Command::ExportTo(kind, path) => self.export_to(kind, &path),
            Command::SetLightTheme(light) => {
                self.settings.light_theme = light;
                if let Some(ctx) = &self.ctx {
                    theme::apply(ctx, light);
                }
            }
            Command::CheckBackends => {
                if let Some(w) = &mut self.worker {
                    self.backend_job = w.request(IoRequest::CheckBackends).ok();
                }
            }
            Command::ClearRecent => self.settings.recent.clear(),
        }
    }

    /// The file name an export is offered under.
    fn export_name(&self, kind: ExportKind) -> String {
        let stem = self.experiment_stem();
        match kind {
            ExportKind::ViewPng => format!("{stem}_{}.png", self.tab.name()),
            ExportKind::MaskPng => format!("{stem}_masks_{}.png", self.masks.image),
            ExportKind::Qdq => format!("{stem}_exports"),
            k => format!("{stem}_report.{}", k.extension()),
        }
    }

    fn experiment_stem(&self) -> String {
        let from_path = self
            .exp_path
            .as_ref()
            .and_then(|p| p.file_stem())
            .or_else(|| self.exp.model.file_stem())
            .and_then(|s| s.to_str());
        match (self.exp.name.as_str(), from_path) {
            ("", Some(s)) => s.to_string(),
            ("", None) => "experiment".into(),
            (n, _) => n.replace(['/', '\\', ' '], "_"),
        }
    }

    fn dialog(
        &mut self,
        purpose: DialogPurpose,
        kind: DialogKind,
        title: &str,
        filters: &[(&str, &[&str])],
        file_name: Option<String>,
    ) {
        let directory = self
            .exp_path
            .as_ref()
            .and_then(|p| p.parent())
            .map(Path::to_path_buf);
        let req = IoRequest::Dialog(FileDialog {
            kind,
            title: title.into(),
            filters: filters
                .iter()
                .map(|(n, e)| (n.to_string(), e.iter().map(|s| s.to_string()).collect()))
                .collect(),
            directory,
            file_name,
        });
        let Some(w) = &mut self.worker else {
            self.log_error("no worker thread: file dialogs are unavailable");
            return;
        };
        match w.request(req) {
            Ok(job) => {
                self.dialogs.insert(job, purpose);
            }
            Err(e) => self.log_error(format!("file dialog: {e:#}")),
        }
    }

    fn open(&mut self, p: &Path) {
        let labels = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("txt"));
        if p.is_dir() || labels {
            self.route_path(p.to_path_buf());
            return;
        }
        if is_model(p) {
            let stem = p
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("model")
                .to_string();
            let mut exp = Experiment {
                name: stem,
                model: p.to_path_buf(),
                ..Default::default()
            };
            // Keep the data setup when swapping the model inside an experiment, and say so:
            // the experiment is now the new model's (its name, no file yet), and settings that
            // name the old model's layers go.
            let mut kept = None;
            if !self.exp.model.as_os_str().is_empty() {
                exp = Experiment {
                    name: exp.name,
                    model: p.to_path_buf(),
                    exclude: vec![],
                    mixed_precision: None,
                    output: Default::default(),
                    ..self.exp.clone()
                };
                kept = Some(self.exp.model.clone());
                self.exp_path = None;
            }
            self.banner = kept.map(|old| {
                (
                    format!(
                        "Opened {}: the calibration and evaluation folders, labels and preprocessing of {} are kept; File > Reset data settings clears them.",
                        p.display(),
                        old.display()
                    ),
                    false,
                )
            });
            self.log_info(format!("opened model {}", p.display()));
            self.set_experiment(exp);
            return;
        }
        match Experiment::load(p) {
            Ok(e) => {
                self.banner = None;
                self.exp_path = Some(p.to_path_buf());
                self.saved = e.clone();
                self.primary_method = e.methods.first().copied().unwrap_or(Method::Entropy);
                self.remember(p);
                self.log_info(format!("opened experiment {}", p.display()));
                self.exp = Experiment::default();
                self.set_experiment(e);
            }
            Err(err) => {
                let msg = format!(
                    "Could not open {}: {err:#}. Open an experiment or a model with File > Open (Ctrl+O), type a path in the File menu, or drop an .onnx file on the window.",
                    p.display()
                );
                self.log_error(format!("{err:#}"));
                self.banner = Some((msg, true));
            }
        }
    }

    fn remember(&mut self, p: &Path) {
        let p = crate::data::canonical(p);
        self.settings.recent.retain(|r| r != &p);
        self.settings.recent.insert(0, p.clone());
        self.settings.recent.truncate(MAX_RECENT);
        self.settings.last_experiment = Some(p);
    }

    fn save_to(&mut self, p: &Path) {
        if is_bundled_sample(p) {
            let msg = format!(
                "{} is a bundled sample and is never overwritten: save your copy elsewhere (File > Save as…)",
                p.display()
            );
            self.log_error(msg.clone());
            self.banner = Some((msg, true));
            return;
        }
        match self.exp.save(p) {
            Ok(()) => {
                self.exp_path = Some(p.to_path_buf());
                self.saved = self.exp.clone();
                self.remember(p);
                self.log_info(format!("saved {}", p.display()));
            }
            Err(err) => {
                self.log_error(format!("{err:#}"));
                self.banner = Some((format!("{err:#}"), true));
            }
        }
    }

    /// Takes an edited experiment; refreshes what depends on the parts that changed.
    fn set_experiment(&mut self, new: Experiment) {
        let old = std::mem::replace(&mut self.exp, new);
        if old.model != self.exp.model {
            // Results of another model are stale: stop the job, drop them.
            if let Some(w) = &mut self.worker {
                w.cancel();
            }
            self.run = None;
            // The old model's results stay in the history, to compare with the new model's.
            let previous = std::mem::take(&mut self.results);
            self.keep_in_history(previous);
            self.masks = MaskViewState::default();
            self.layers.report = None;
            self.inspect_model();
        }
        let calib_changed = old.calibration != self.exp.calibration;
        if calib_changed {
            self.scan_calib();
        }
        // The class names shown come from the labels file in force too: a new one (or a new
        // model with its own beside it) rescans, or the panel keeps the old count.
        if old.evaluation.dir != self.exp.evaluation.dir
            || old.evaluation.task != self.exp.evaluation.task
            || old.labels_file() != self.exp.labels_file()
        {
            self.scan_eval();
        }
        if old.preprocess != self.exp.preprocess && !calib_changed {
            self.request_preview();
        }
    }

    fn inspect_model(&mut self) {
        self.model.info = None;
        self.model.error = None;
        self.model.loading = None;
        self.model.cuda.clear();
        if self.exp.model.as_os_str().is_empty() {
            return;
        }
        let Some(w) = &mut self.worker else { return };
        match w.request(IoRequest::Inspect {
            path: self.exp.model.clone(),
        }) {
            Ok(job) => self.model.loading = Some(job),
            Err(e) => self.model.error = Some(format!("{e:#}")),
        }
        // Planning the CUDA engines takes longer than the description: its own request, so
        // the Model panel fills in at once and the GPU coverage line follows.
        let _ = w.request(IoRequest::CudaCoverage {
            path: self.exp.model.clone(),
        });
    }

    fn scan_calib(&mut self) {
        self.data.thumbs.clear();
        let Some(dir) = self.exp.calibration.dir.clone() else {
            self.data.calib = Scan::None;
            return;
        };
        let Some(w) = &mut self.worker else { return };
        self.data.calib = match w.request(IoRequest::ScanCalib {
            dir,
            select: self.exp.calibration.select,
            thumbs: 12,
            thumb_px: 64,
        }) {
            Ok(job) => Scan::Loading(job),
            Err(e) => Scan::Failed(format!("{e:#}")),
        };
    }

    fn scan_eval(&mut self) {
        let Some(dir) = self.exp.evaluation.dir.clone() else {
            self.data.eval = Scan::None;
            return;
        };
        let Some(w) = &mut self.worker else { return };
        self.data.eval = match w.request(IoRequest::ScanEval {
            dir,
            task: self.exp.evaluation.task.fixed(),
            labels: self
                .exp
                .labels_file()
                .map(|l| (l, self.exp.evaluation.labels.is_some())),
        }) {
            Ok(job) => Scan::Loading(job),
            Err(e) => Scan::Failed(format!("{e:#}")),
        };
    }

    /// The model input's height and width for the preview: the experiment's size, else the
    /// model's own, else 224 x 224.
    pub fn input_hw(&self) -> [usize; 2] {
        if let Some(s) = self.exp.preprocess.size {
            return s;
        }
        match &self.model.info {
            Some(i) if i.input_chw[1] > 0 && i.input_chw[2] > 0 => [i.input_chw[1], i.input_chw[2]],
            _ => [224, 224],
        }
    }

    fn request_preview(&mut self) {
        let image = match (&self.data.calib, &self.data.eval) {
            (Scan::Done(c), _) if c.first.is_some() => c.first.clone(),
            (_, Scan::Done(e)) => e.first.clone(),
            _ => None,
        };
        let Some(image) = image else { return };
        let hw = self.input_hw();
        let (channels, layout) = self
            .model
            .info
            .as_ref()
            .map(|i| (i.input_chw[0].max(1), i.layout))
            .unwrap_or((3, Default::default()));
        // The preview shows what a run feeds: auto normalisation resolved as the run will.
        let meta = self
            .model
            .info
            .as_ref()
            .and_then(|i| i.normalization.as_ref());
        let preprocess = self.exp.preprocess.resolved(meta).0;
        let Some(w) = &mut self.worker else { return };
        self.data.preview = match w.request(IoRequest::Preview {
            image,
            preprocess,
            hw,
            channels,
            layout,
        }) {
            Ok(job) => Scan::Loading(job),
            Err(e) => Scan::Failed(format!("{e:#}")),
        };
    }

    /// Rows the experiment will produce.
    pub fn rows_expected(&self) -> usize {
        let e = &self.exp;
        let mut n = 0;
        if e.precisions.contains(&Precision::Fp32) {
            n += 1;
        }
        if e.precisions.contains(&Precision::Fp16) {
            n += 1;
        }
        if e.precisions.contains(&Precision::Int8) {
            n += e.methods.len().max(1);
            if e.mixed_precision.is_some() {
                n += 1;
            }
        }
        if e.precisions.contains(&Precision::Fp8) {
            n += 1;
        }
        n
    }

    /// The model's task, from the last results, the model or the experiment.
    pub fn task(&self) -> Option<Task> {
        self.layers
            .report
            .as_ref()
            .and_then(|r| r.task)
            .or(self.results.report.as_ref().and_then(|r| r.model.task))
            .or(self.model.info.as_ref().and_then(|i| i.task))
            .or(self.exp.evaluation.task.fixed())
    }

    /// The accuracy budget the Layers tab's fields describe, for this model's task.
    pub fn layers_budget(&self) -> Budget {
        match self.task() {
            Some(Task::Classification) => Budget::Top1Points(self.layers.budget_top1_pt),
            _ => Budget::MiouRelativePercent(self.layers.budget_miou_pct),
        }
    }

    fn start_sensitivity(&mut self) {
        if self.exp.model.as_os_str().is_empty() {
            self.log_error("nothing to analyse: open a model or an experiment first");
            return;
        }
        if self.is_running() {
            self.log_error("a job is running: cancel it or wait before analysing layers");
            return;
        }
        let budget = self.layers.find_mixed.then(|| self.layers_budget());
        let options = SensitivityOptions {
            budget,
            ..Default::default()
        };
        let Some(w) = &mut self.worker else {
            self.log_error("no worker thread: cannot analyse layers");
            return;
        };
        let job = w.submit_sensitivity(self.exp.clone(), options);
        self.run = Some(RunState {
            sensitivity: true,
            ..RunState::new(job, "sensitivity", 0)
        });
        self.log_info(format!(
            "sensitivity #{job}: {}{}",
            self.exp.model.display(),
            budget
                .map(|b| format!(", mixed precision with {}", b.describe()))
                .unwrap_or_default()
        ));
    }

    /// Takes a finished sensitivity report; an AMP plan in it becomes the experiment's
    /// mixed-precision engine.
    pub(super) fn take_sensitivity(&mut self, report: SensitivityReport) {
        if let Some(amp) = &report.amp {
            let mut e = self.exp.clone();
            e.mixed_precision = Some(report.mixed_precision());
            let msg = format!(
                "Mixed precision: {}. It is now the experiment's mixed-precision engine: press Run to compare it.",
                amp.summary()
            );
            self.log_info(msg.clone());
            self.banner = Some((msg, false));
            self.set_experiment(e);
        }
        self.layers.report = Some(report);
    }

    fn toggle_layer_float(&mut self, node: String) {
        let mut e = self.exp.clone();
        let mut mp = match e.mixed_precision.take() {
            Some(mp) => mp,
            None => {
                let mut mp = match &self.layers.report {
                    Some(r) => r.mixed_precision(),
                    None => Default::default(),
                };
                mp.keep_float.clear();
                mp.method = mp.method.or(Some(self.primary_method));
                mp
            }
        };
        if let Some(i) = mp.keep_float.iter().position(|n| *n == node) {
            mp.keep_float.remove(i);
            self.log_info(format!("{node}: back to int8"));
        } else {
            mp.keep_float.push(node.clone());
            self.log_info(format!(
                "{node}: kept in float in the mixed-precision engine"
            ));
        }
        e.mixed_precision = (!mp.keep_float.is_empty()).then_some(mp);
        self.set_experiment(e);
    }

    /// Why Run cannot start now, in words for its disabled tooltip; `None` when it can.
    pub fn run_blocker(&self) -> Option<String> {
        let e = &self.exp;
        if self.is_running() {
            Some("a run is in progress".into())
        } else if e.model.as_os_str().is_empty() {
            Some("open a model or an experiment first".into())
        } else if let Some(field) = self.unusable_paths.first() {
            Some(format!(
                "the {field} field shows a path that cannot be used; fix it (Run would otherwise use {})",
                match field.as_str() {
                    "File" => self.exp.model.display().to_string(),
                    _ => "the previous one".to_string(),
                }
            ))
        } else if let Some(err) = &self.model.error {
            Some(format!("the model cannot be used: {err}"))
        } else if e.precisions.is_empty() {
            Some("choose at least one precision".into())
        } else {
            e.validate().err()
        }
    }

    fn start_run(&mut self) {
        if let Some(why) = self.run_blocker() {
            self.log_error(format!("nothing to run: {why}"));
            return;
        }
        let rows_expected = self.rows_expected();
        let Some(w) = &mut self.worker else {
            self.log_error("no worker thread: cannot run");
            return;
        };
        let job = w.submit(self.exp.clone());
        self.keep_autosave(true);
        let previous = std::mem::take(&mut self.results);
        self.keep_in_history(previous);
        let methods: Vec<&str> = self.exp.methods.iter().map(|m| m.name()).collect();
        self.results.title = format!(
            "run #{job} · {} · {} · {} · {}",
            self.experiment_stem(),
            if methods.is_empty() {
                "no INT8".to_string()
            } else {
                methods.join("+")
            },
            self.exp.backend.name(),
            clock_utc()
        );
        self.results.job = Some(job);
        self.masks = MaskViewState::default();
        self.run = Some(RunState::new(job, "starting", rows_expected));
        self.log_info(format!(
            "run #{job}: {} on {}, precisions {:?}, methods {:?}",
            self.exp.model.display(),
            self.exp.backend.name(),
            self.exp.precisions,
            self.exp.methods
        ));
    }

    /// Re-times results row `i`: the same experiment narrowed to that row's engine, with no
    /// evaluation, no outputs and "time until stable" on. Its latency then replaces the row's.
    fn start_retime(&mut self, i: usize) {
        let Some(row) = self.results.rows.get(i).cloned() else {
            return;
        };
        if let Some(why) = self.run_blocker() {
            self.log_error(format!("cannot re-time: {why}"));
            return;
        }
        let (Some(precision), None) = (row.precision, &row.error) else {
            self.log_error(format!(
                "{}: nothing to re-time (the row failed)",
                row.label()
            ));
            return;
        };
        let mut e = self.exp.clone();
        e.precisions = vec![precision];
        e.methods = row.method.into_iter().collect();
        if row.kept_float.is_empty() {
            e.mixed_precision = None;
        }
        e.evaluation = Default::default();
        e.output = Default::default();
        e.bench.until_stable = true;
        let Some(w) = &mut self.worker else {
            self.log_error("no worker thread: cannot re-time");
            return;
        };
        let job = w.submit(e);
        self.run = Some(RunState {
            retime: Some((self.results.job, i)),
            ..RunState::new(job, "starting", 1)
        });
        self.log_info(format!(
            "re-timing {} until its median is known to ±{:.0} % (at most {:.0} s)",
            row.label(),
            crate::bench::STABLE_CI_REL * 100.0,
            self.exp.bench.max_time_ms / 1e3
        ));
    }

    /// Puts a re-timed row's latency (and the load it was timed under) into row `i` of the
    /// results of run `of`, wherever the history picker has put them.
    fn take_retimed(&mut self, of: Option<JobId>, i: usize, report: &Report) {
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

    fn export_to(&mut self, kind: ExportKind, path: &Path) {
        let result: Result<(), String> = match kind {
            ExportKind::Json | ExportKind::Markdown | ExportKind::Csv => {
                let report = match &self.results.report {
                    Some(r) => r.clone(),
                    None if !self.results.rows.is_empty() => Report {
                        experiment: self.exp.name.clone(),
                        rows: self.results.rows.clone(),
                        ..Default::default()
                    },
                    None => {
                        self.log_error("nothing to export yet: run the experiment first");
                        return;
                    }
                };
                let (j, m, c) = match kind {
                    ExportKind::Json => (Some(path), None, None),
                    ExportKind::Markdown => (None, Some(path), None),
                    _ => (None, None, Some(path)),
                };
                match report.write(j, m, c).into_iter().next() {
                    Some(e) => Err(e.to_string()),
                    None => Ok(()),
                }
            }
            ExportKind::ViewPng => self.screenshot(path),
            ExportKind::MaskPng => super::results::masks::export_png(self, path),
            ExportKind::Qdq => self.export_qdq(path),
        };
        match result {
            Ok(()) if matches!(kind, ExportKind::ViewPng | ExportKind::Qdq) => {
                self.log_info(format!("export requested: {}", path.display()))
            }
            Ok(()) => self.notify(format!("Exported {}", path.display())),
            Err(e) => {
                let msg = format!("export to {}: {e}", path.display());
                self.log_error(msg.clone());
                self.banner = Some((msg, true));
            }
        }
    }

    /// Shows an earlier run (index into `past_runs`) in the Results area; the one shown
    /// until now takes its place in the history.
    pub fn show_past_run(&mut self, k: usize) {
        if k >= self.past_runs.len() {
            return;
        }
        // A run in flight keeps filling its own results wherever they sit (see `results_of`).
        std::mem::swap(&mut self.results, &mut self.past_runs[k]);
        self.compare_with = None;
        self.masks = MaskViewState::default();
        self.pick_default_engines();
    }

    /// The results of run `job`: the ones shown, or one in the history.
    fn results_of(&mut self, job: JobId) -> Option<&mut Results> {
        if self.results.job == Some(job) {
            return Some(&mut self.results);
        }
        self.past_runs.iter_mut().find(|r| r.job == Some(job))
    }

    /// Puts `r` at the head of the run history (when it has rows), keeping the newest
    /// [`PAST_RUNS_KEPT`].
    fn keep_in_history(&mut self, r: Results) {
        if r.rows().is_empty() {
            return;
        }
        self.past_runs.insert(0, r);
        self.past_runs.truncate(PAST_RUNS_KEPT);
        self.compare_with = None;
    }

    /// Says where files went: in the log and in the banner above the results.
    fn notify(&mut self, text: String) {
        self.log_info(text.clone());
        self.banner = Some((text, false));
    }

    /// Hands the finished run's Q/DQ models to the I/O thread, which writes them into `dir`.
    fn export_qdq(&mut self, dir: &Path) -> Result<(), String> {
        let qdq = self
            .results
            .artifacts
            .as_ref()
            .map(|a| a.qdq.clone())
            .filter(|q| !q.is_empty())
            .ok_or("no INT8 engine in the results: run an experiment with INT8 first")?;
        let model = self
            .results
            .report
            .as_ref()
            .map(|r| r.model.file.clone())
            .unwrap_or_else(|| self.exp.model.clone());
        let report = self.results.report.as_ref();
        let check = crate::worker::ExportCheck {
            hw: report.map(|r| r.input_hw).unwrap_or([224, 224]),
            image: report.and_then(|r| r.evaluation.image_files.first().cloned()),
            preprocess: report
                .map(|r| r.preprocess.clone())
                .unwrap_or_else(|| self.exp.preprocess.clone()),
        };
        let w = self.worker.as_mut().ok_or("no worker thread")?;
        w.request(IoRequest::ExportQdq {
            dir: dir.to_path_buf(),
            model,
            qdq,
            check,
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        let Some(ctx) = self.ctx.clone() else {
            return Err("no window to take a screenshot of".into());
        };
        let rect = self.central_rect;
        let ppp = ctx.pixels_per_point();
        let path = path.to_path_buf();
        let tx = self.notes_tx.clone();
        ctx.request_screenshot(move |img| {
            let [iw, ih] = img.size;
            let x0 = ((rect.min.x * ppp).max(0.0) as usize).min(iw);
            let y0 = ((rect.min.y * ppp).max(0.0) as usize).min(ih);
            let x1 = ((rect.max.x * ppp).max(0.0) as usize).clamp(x0, iw);
            let y1 = ((rect.max.y * ppp).max(0.0) as usize).clamp(y0, ih);
            let region = if x1 > x0 && y1 > y0 {
                img.region_by_pixels([x0, y0], [x1 - x0, y1 - y0])
            } else {
                (*img).clone()
            };
            let [w, h] = region.size;
            let bytes: Vec<u8> = region.pixels.iter().flat_map(|c| c.to_array()).collect();
            let note = match image::RgbaImage::from_raw(w as u32, h as u32, bytes) {
                Some(buf) => crate::files::write_png(&path, &buf.into())
                    .map(|_| format!("saved screenshot {}", path.display()))
                    .map_err(|e| format!("screenshot: {e}")),
                None => Err("screenshot: unexpected image size".into()),
            };
            let _ = tx.try_send(note);
        });
        ctx.request_repaint();
        Ok(())
    }

    /// Chooses the mask views' engines: the first INT8 row, and the FP8 row where the run has
    /// one (INT8 against FP8 side by side), else the second INT8 row; and the worst image.
    pub fn pick_default_engines(&mut self) {
        let rows = self.results.rows();
        let of = |p: Precision| -> Vec<usize> {
            rows.iter()
                .enumerate()
                .filter(|(_, r)| r.precision == Some(p) && !r.failed())
                .map(|(i, _)| i)
                .collect()
        };
        let (int8, fp8) = (of(Precision::Int8), of(Precision::Fp8));
        let mut picks = int8.iter().take(1).chain(&fp8).chain(int8.iter().skip(1));
        self.masks.engines = [picks.next().copied(), picks.next().copied()];
        self.masks.image = self.image_order().first().copied().unwrap_or(0);
    }

    /// Evaluation images ordered by the largest mIoU drop (FP32 minus the worst chosen
    /// engine) first.
    pub fn image_order(&self) -> Vec<usize> {
        let rows = self.results.rows();
        let Some(fp32) = rows
            .iter()
            .find(|r| r.precision == Some(Precision::Fp32) && !r.failed())
        else {
            return vec![];
        };
        let n = self
            .results
            .artifacts
            .as_ref()
            .map(|a| a.ground_truth.len())
            .unwrap_or(0)
            .min(fp32.per_image.len());
        let engines: Vec<usize> = self.masks.engines.iter().flatten().copied().collect();
        let drop = |i: usize| -> f64 {
            engines
                .iter()
                .filter_map(|&k| rows.get(k)?.per_image.get(i))
                .map(|v| fp32.per_image[i] - v)
                .fold(f64::NEG_INFINITY, f64::max)
        };
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| drop(b).total_cmp(&drop(a)).then(a.cmp(&b)));
        order
    }

    /// Takes worker events (at most a frame's worth); drops those of stale jobs; lets go of a
    /// cancelled job that does not stop.
    pub fn poll_events(&mut self, ctx: &egui::Context) {
        self.ctx = Some(ctx.clone());
        while let Ok(note) = self.notes_rx.try_recv() {
            match note {
                Ok(t) => self.log_info(t),
                Err(t) => self.log_error(t),
            }
        }
        self.abandon_stuck_run();
        self.keep_autosave(false);
        for _ in 0..MAX_EVENTS_PER_FRAME {
            let Some(w) = self.worker.as_ref() else { break };
            match w.events.try_recv() {
                Ok(ev) => self.take_event(ctx, ev),
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    self.restart_worker();
                    break;
                }
            }
        }
    }

    /// Writes the experiment to the autosave file when it changed (at once when `now`).
    fn keep_autosave(&mut self, now: bool) {
        // Called every frame: borrow the experiment, do not copy it.
        let exp = &self.exp;
        if let Some(Err(e)) = self.autosave.as_mut().map(|a| a.keep(exp, now)) {
            self.log_error(e);
            self.autosave = None;
        }
    }

    /// Opens the autosaved experiment as a new, unsaved one.
    fn restore_autosave(&mut self) {
        let Some(path) = self.autosave.as_ref().map(|a| a.path.clone()) else {
            return;
        };
        match Experiment::load(&path) {
            Ok(e) => {
                self.log_info(format!(
                    "restored the autosaved experiment from {}",
                    path.display()
                ));
                self.exp_path = None;
                self.set_experiment(e);
            }
            Err(e) => self.log_error(format!("{e:#}")),
        }
    }

    /// A cancelled job that has not answered within [`CANCEL_GRACE`] is stuck in one long
    /// step (a large model's build, say): the window goes back to idle with the rows it has,
    /// the job's late answer is dropped as stale, and the next Run queues behind it.
    fn abandon_stuck_run(&mut self) {
        let stuck = self
            .run
            .as_ref()
            .and_then(|r| r.cancelled_at)
            .is_some_and(|t| t.elapsed() > CANCEL_GRACE);
        if let Some(run) = stuck.then(|| self.run.take()).flatten() {
            self.results.partial = true;
            self.log_error(format!(
                "run #{} did not stop within {} s of Cancel (it is inside one long step); \
                 it finishes in the background and its results are dropped. Kept {} rows",
                run.job,
                CANCEL_GRACE.as_secs(),
                self.results.rows.len()
            ));
        }
    }

    /// The worker's threads ended (they catch panics, so this should not happen): the job in
    /// flight is lost, the rows already shown are kept, and a new worker takes the next Run.
    fn restart_worker(&mut self) {
        let lost = self.run.take().map(|r| r.job);
        self.worker = None;
        self.log_error(match lost {
            Some(job) => format!("the worker stopped during run #{job}; its finished rows are kept. Starting a new worker"),
            None => "the worker stopped; starting a new worker".into(),
        });
        match crate::worker::Worker::spawn() {
            Ok(w) => self.worker = Some(w),
            Err(e) => self.log_error(format!("cannot start the worker thread: {e:#}")),
        }
    }

    fn take_event(&mut self, ctx: &egui::Context, ev: Event) {
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
            | Event::CalibScanned { .. }
            | Event::EvalScanned { .. }
            | Event::Preview { .. }
            | Event::Backends { .. } => {} // superseded by a newer request
        }
    }

    fn picked(&mut self, purpose: DialogPurpose, path: Option<PathBuf>, dialog_ms: f64) {
        let no_portal = path.is_none() && dialog_ms < NO_DIALOG_MS;
        let Some(path) = path else {
            if no_portal {
                // No file dialog on this desktop: the same choice, typed. A save or an export
                // is offered a place in the home folder, never the install's folders.
                self.log_info("no file dialog on this desktop (no xdg-desktop-portal or zenity): type the path");
                self.open_path_text = match purpose {
                    DialogPurpose::SaveExperiment => {
                        suggested_output(&format!("{}.ron", self.experiment_stem()))
                    }
                    DialogPurpose::Export(kind) => suggested_output(&self.export_name(kind)),
                    _ => String::new(),
                };
                self.path_window = Some(purpose);
            }
            return;
        };
        match purpose {
            DialogPurpose::Open => self.apply(Command::Open(path)),
            DialogPurpose::SaveExperiment => {
                let path = if path.extension().is_none() {
                    path.with_extension("ron")
                } else {
                    path
                };
                self.apply(Command::SaveTo(path))
            }
            DialogPurpose::CalibDir => {
                let mut e = self.exp.clone();
                e.calibration.dir = Some(path);
                self.apply(Command::SetExperiment(Box::new(e)));
            }
            DialogPurpose::EvalDir => {
                let mut e = self.exp.clone();
                e.evaluation.dir = Some(path);
                self.apply(Command::SetExperiment(Box::new(e)));
            }
            DialogPurpose::Labels => {
                let mut e = self.exp.clone();
                e.evaluation.labels = Some(path);
                self.apply(Command::SetExperiment(Box::new(e)));
            }
            DialogPurpose::Export(kind) => self.apply(Command::ExportTo(kind, path)),
        }
    }

    /// Asks the I/O thread for an evaluation image, once.
    pub fn want_image(&mut self, path: &Path) {
        if self.masks.images.contains_key(path)
            || self.masks.image_errors.contains_key(path)
            || self.masks.image_loading.values().any(|p| p == path)
        {
            return;
        }
        let Some(w) = &mut self.worker else { return };
        if let Ok(job) = w.request(IoRequest::Image {
            path: path.to_path_buf(),
            max_side: 1024,
        }) {
            self.masks.image_loading.insert(job, path.to_path_buf());
        }
    }

    /// Shortcuts and dropped files.
    pub(super) fn input_ui(&mut self, ctx: &egui::Context) {
        let typing = ctx.egui_wants_keyboard_input();
        let (open, save, run, cancel) = ctx.input_mut(|i| {
            (
                i.consume_shortcut(&SC_OPEN),
                i.consume_shortcut(&SC_SAVE),
                i.consume_shortcut(&SC_RUN),
                !typing && i.consume_shortcut(&SC_CANCEL),
            )
        });
        if open {
            self.push(Command::OpenDialog);
        }
        if save {
            self.push(Command::Save);
        }
        if run && !self.is_running() {
            self.push(Command::Run);
        }
        if cancel && self.is_running() {
            self.push(Command::Cancel);
        }
        if self.tab == Tab::Masks && !typing {
            let (next, prev) = ctx.input(|i| {
                (
                    i.key_pressed(Key::ArrowRight) || i.key_pressed(Key::ArrowDown),
                    i.key_pressed(Key::ArrowLeft) || i.key_pressed(Key::ArrowUp),
                )
            });
            if next {
                self.push(Command::NextImage);
            }
            if prev {
                self.push(Command::PrevImage);
            }
        }
        // Dropped paths wait for the frame: a path field under the pointer claims them, the
        // rest are routed by what they are when the frame ends.
        let (dropped, pos): (Vec<PathBuf>, _) = ctx.input(|i| {
            (
                i.raw
                    .dropped_files
                    .iter()
                    .map(|f| f.path().to_path_buf())
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect(),
                i.pointer.latest_pos(),
            )
        });
        self.drops = dropped;
        self.drop_pos = pos;
    }

    /// A dropped path, if the drop landed inside `rect` (a path field's row).
    pub fn claim_drop(&mut self, rect: egui::Rect) -> Option<PathBuf> {
        let inside = self.drop_pos.is_some_and(|p| rect.contains(p));
        (inside && !self.drops.is_empty()).then(|| self.drops.remove(0))
    }

    /// Where a path goes when it is dropped on the window or typed into File > Open path:
    /// experiments and models open, a folder becomes the evaluation set when it is laid out as
    /// one (images/ + masks/, or class folders) and the calibration folder otherwise, a .txt
    /// file becomes the labels. Says what it did.
    pub fn route_path(&mut self, p: PathBuf) {
        let ext = p
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        let mut e = self.exp.clone();
        let what = if p.is_dir() {
            if looks_like_eval_set(&p) {
                e.evaluation.dir = Some(p.clone());
                "the evaluation set"
            } else {
                e.calibration.dir = Some(p.clone());
                "the calibration folder"
            }
        } else if ext == "txt" && p.is_file() {
            e.evaluation.labels = Some(p.clone());
            "the class names"
        } else if ext == "onnx" || ext == "ron" {
            self.apply(Command::Open(p));
            return;
        } else {
            self.log_error(format!(
                "{}: not a model (.onnx), an experiment (.ron), a labels file (.txt) or a folder",
                p.display()
            ));
            return;
        };
        self.log_info(format!("{}: used as {what}", p.display()));
        self.apply(Command::SetExperiment(Box::new(e)));
    }

    /// The `trtexec` line for each exported file: strongly typed for the ONNX models, the
    /// TensorRT 8.6–10 implicit-INT8 line for a calibration cache.
    fn trt_commands_for(&self, files: &[PathBuf]) -> Vec<(String, String)> {
        use crate::quant::trtexec;
        let Some(info) = &self.model.info else {
            return vec![];
        };
        let [h, w] = self.input_hw();
        let input = trtexec::InputSpec::new(info, &[1, info.input_chw[0].max(1), h, w]);
        let fp32_for_cache = files
            .iter()
            .find(|f| f.to_string_lossy().ends_with("_fp32_for_cache.onnx"))
            .cloned()
            .unwrap_or_else(|| self.exp.model.clone());
        files
            .iter()
            .filter_map(|f| {
                let name = f.file_name()?.to_string_lossy().into_owned();
                let cmd = match f.extension()?.to_str()? {
                    "onnx" if !name.ends_with("_fp32_for_cache.onnx") => {
                        trtexec::strongly_typed(f, &input)
                    }
                    "cache" => trtexec::implicit_int8(&fp32_for_cache, f, &input),
                    _ => return None,
                };
                Some((name, cmd))
            })
            .collect()
    }

    /// After an export: the ready TensorRT commands, each with a Copy button. Commands keep
    /// their lines (a horizontal scroll, not a wrap at every `--`), the window fits in the
    /// app, and Export > TensorRT commands… opens it again after it is closed.
    pub(super) fn trt_commands_window_ui(&mut self, ctx: &egui::Context) {
        if self.trt_commands.is_empty() || !self.trt_window {
            return;
        }
        let mut open = true;
        let max = ctx.content_rect().size() * 0.8;
        egui::Window::new("TensorRT commands")
            .open(&mut open)
            .resizable(true)
            .default_width(640.0_f32.min(max.x))
            .max_width(max.x)
            .max_height(max.y)
            .show(ctx, |ui| {
                ui.label(
                    "TensorRT 10/11: build the strongly typed files (precision is in the model). \
                     The .cache line is TensorRT 8.6–10's implicit INT8, removed in TensorRT 11.",
                );
                egui::ScrollArea::both().show(ui, |ui| {
                    for (file, cmd) in &self.trt_commands {
                        ui.separator();
                        ui.horizontal(|ui| {
                            ui.strong(file);
                            if ui
                                .button("Copy")
                                .on_hover_text("Copy this command to the clipboard")
                                .clicked()
                            {
                                ui.ctx().copy_text(cmd.clone());
                            }
                        });
                        ui.add(egui::Label::new(egui::RichText::new(cmd).monospace()).extend());
                    }
                });
            });
        if !open {
            self.trt_window = false;
        }
    }

    /// The window for typing a path: File > Open path…, or a save or an export when no file
    /// dialog exists. What it checks and does follows its purpose.
    pub(super) fn open_path_window_ui(&mut self, ctx: &egui::Context) {
        let Some(purpose) = self.path_window else {
            return;
        };
        let (title, what, button) = match purpose {
            DialogPurpose::SaveExperiment => (
                "Save the experiment to",
                "The experiment file (.ron) to write:",
                "Save",
            ),
            DialogPurpose::Export(ExportKind::Qdq) => (
                "Export to",
                "The folder for the Q/DQ models and calibration caches (created if missing):",
                "Export",
            ),
            DialogPurpose::Export(_) => ("Export to", "The file to write:", "Export"),
            _ => (
                "Open a path",
                "An experiment (.ron), a model (.onnx), a data folder or a labels file (.txt):",
                "Open",
            ),
        };
        let writes = matches!(
            purpose,
            DialogPurpose::SaveExperiment | DialogPurpose::Export(_)
        );
        let mut open = true;
        let mut go = false;
        egui::Window::new(title)
            .open(&mut open)
            .collapsible(false)
            .resizable(false)
            .show(ctx, |ui| {
                ui.label(what);
                let r = ui
                    .horizontal(|ui| {
                        let name = ui.label("Path:");
                        ui.add(
                            egui::TextEdit::singleline(&mut self.open_path_text)
                                .hint_text(if writes {
                                    "/path/to/output"
                                } else {
                                    "/path/to/model.onnx"
                                })
                                .desired_width(360.0),
                        )
                        .labelled_by(name.id)
                    })
                    .inner;
                let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                let t = self.open_path_text.trim();
                let problem = match (t.is_empty(), writes) {
                    (true, _) => Some(""),
                    (false, false) if !Path::new(t).exists() => Some("no such file or folder"),
                    (false, true) if is_bundled_sample(Path::new(t)) => {
                        Some("a bundled sample: never overwritten")
                    }
                    (false, true)
                        if Path::new(t).is_dir()
                            && purpose != DialogPurpose::Export(ExportKind::Qdq) =>
                    {
                        Some("a folder: add a file name")
                    }
                    _ => None,
                };
                if let Some(p) = problem.filter(|p| !p.is_empty()) {
                    ui.colored_label(theme::ERROR, p);
                }
                ui.horizontal(|ui| {
                    go = ui
                        .add_enabled(problem.is_none(), egui::Button::new(button))
                        .clicked()
                        || (enter && problem.is_none());
                });
            });
        if go {
            let p = PathBuf::from(self.open_path_text.trim());
            self.path_window = None;
            match purpose {
                DialogPurpose::Open => self.route_path(p),
                other => self.picked(other, Some(p), NO_DIALOG_MS),
            }
        } else if !open {
            self.path_window = None;
        }
    }

    pub(super) fn menu_ui(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        egui::MenuBar::new().ui(ui, |ui| {
            ui.menu_button("File", |ui| {
                if ui
                    .add(egui::Button::new("Open…").shortcut_text(ctx.format_shortcut(&SC_OPEN)))
                    .on_hover_text("Open an experiment (.ron) or an ONNX model")
                    .clicked()
                {
                    self.push(Command::OpenDialog);
                    ui.close();
                }
                if ui
                    .button("Open path…")
                    .on_hover_text("Type the path of an experiment, a model, a folder or a labels file")
                    .clicked()
                {
                    self.push(Command::ShowOpenPath);
                    ui.close();
                }
                if ui
                    .button("Reset data settings")
                    .on_hover_text("Clear the calibration and evaluation folders, labels and preprocessing; keep the model")
                    .clicked()
                {
                    self.push(Command::ResetDataSettings);
                    ui.close();
                }
                let autosaved = self.autosave.as_ref().is_some_and(|a| a.path.is_file());
                if ui
                    .add_enabled(autosaved, egui::Button::new("Restore autosaved experiment"))
                    .on_hover_text(
                        "The experiment as it was last edited or run in this window (kept in case of a crash)",
                    )
                    .on_disabled_hover_text("Nothing autosaved yet")
                    .clicked()
                {
                    self.push(Command::RestoreAutosave);
                    ui.close();
                }
                ui.menu_button("Recent", |ui| {
                    if self.settings.recent.is_empty() {
                        ui.label("No recent experiments");
                    }
                    for p in self.settings.recent.clone() {
                        if ui
                            .button(p.display().to_string())
                            .on_hover_text("Open this experiment")
                            .clicked()
                        {
                            self.push(Command::Open(p));
                            ui.close();
                        }
                    }
                    ui.separator();
                    if ui
                        .button("Clear recent")
                        .on_hover_text("Forget the recent experiments")
                        .clicked()
                    {
                        self.push(Command::ClearRecent);
                    }
                });
                ui.separator();
                if ui
                    .add(egui::Button::new("Save").shortcut_text(ctx.format_shortcut(&SC_SAVE)))
                    .on_hover_text("Save the experiment (.ron)")
                    .clicked()
                {
                    self.push(Command::Save);
                    ui.close();
                }
                if ui
                    .button("Save as…")
                    .on_hover_text("Save the experiment under a new name")
                    .clicked()
                {
                    self.push(Command::SaveAs);
                    ui.close();
                }
                ui.separator();
                let has_rows = !self.results.rows().is_empty();
                ui.menu_button("Export report", |ui| {
                    for (label, kind) in [
                        ("JSON…", ExportKind::Json),
                        ("Markdown…", ExportKind::Markdown),
                        ("CSV…", ExportKind::Csv),
                    ] {
                        if ui
                            .add_enabled(has_rows, egui::Button::new(label))
                            .on_hover_text("Write the report in this format")
                            .on_disabled_hover_text("Run the experiment first")
                            .clicked()
                        {
                            self.push(Command::Export(kind));
                            ui.close();
                        }
                    }
                });
                if ui
                    .button("Export view as PNG…")
                    .on_hover_text("Save the results area (chart, masks, …) as shown")
                    .clicked()
                {
                    self.push(Command::Export(ExportKind::ViewPng));
                    ui.close();
                }
                let has_qdq = self
                    .results
                    .artifacts
                    .as_ref()
                    .is_some_and(|a| !a.qdq.is_empty());
                if ui
                    .add_enabled(
                        has_qdq,
                        egui::Button::new("Export Q/DQ ONNX + TensorRT cache…"),
                    )
                    .on_hover_text(
                        "Each INT8 engine's Q/DQ model (for trtexec --stronglyTyped) and calibration cache, the mixed-precision plan's too, into a folder you choose",
                    )
                    .on_disabled_hover_text("Run an experiment with INT8 first")
                    .clicked()
                {
                    self.push(Command::Export(ExportKind::Qdq));
                    ui.close();
                }
                if ui
                    .add_enabled(
                        !self.trt_commands.is_empty(),
                        egui::Button::new("TensorRT commands…"),
                    )
                    .on_hover_text("The trtexec lines for the last export, with Copy buttons")
                    .on_disabled_hover_text("Export the Q/DQ models first")
                    .clicked()
                {
                    self.trt_window = true;
                    ui.close();
                }
                let has_masks = self.results.artifacts.is_some();
                if ui
                    .add_enabled(
                        has_masks,
                        egui::Button::new("Export mask composite as PNG…"),
                    )
                    .on_hover_text(
                        "Image, FP32 and the chosen INT8 masks side by side, at full resolution",
                    )
                    .on_disabled_hover_text("Run a segmentation experiment first")
                    .clicked()
                {
                    self.push(Command::Export(ExportKind::MaskPng));
                    ui.close();
                }
                ui.separator();
                if ui
                    .button("Quit")
                    .on_hover_text("Close the window")
                    .clicked()
                {
                    ctx.send_viewport_cmd(egui::ViewportCommand::Close);
                }
            });
            ui.menu_button("View", |ui| {
                let mut light = self.settings.light_theme;
                if ui
                    .radio_value(&mut light, false, "Dark")
                    .on_hover_text("Dark theme")
                    .clicked()
                    | ui.radio_value(&mut light, true, "Light")
                        .on_hover_text("Light theme")
                        .clicked()
                {
                    self.push(Command::SetLightTheme(light));
                }
                ui.separator();
                for t in Tab::ALL {
                    if ui
                        .selectable_label(self.tab == t, t.title())
                        .on_hover_text("Show this tab")
                        .clicked()
                    {
                        self.push(Command::SetTab(t));
                        ui.close();
                    }
                }
            });
            ui.menu_button("Run", |ui| {
                if ui
                    .add_enabled(
                        self.run_blocker().is_none(),
                        egui::Button::new("Run").shortcut_text(ctx.format_shortcut(&SC_RUN)),
                    )
                    .on_hover_text("Build and compare the engines")
                    .on_disabled_hover_text(self.run_blocker().unwrap_or_default())
                    .clicked()
                {
                    self.push(Command::Run);
                    ui.close();
                }
                if ui
                    .add_enabled(
                        self.is_running(),
                        egui::Button::new("Cancel").shortcut_text("Esc"),
                    )
                    .on_hover_text("Stop the run and keep the rows already finished")
                    .clicked()
                {
                    self.push(Command::Cancel);
                    ui.close();
                }
            });
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                let dirty = self.exp != self.saved;
                let name = self
                    .exp_path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "unsaved experiment".into());
                ui.label(format!("{name}{}", if dirty { " •" } else { "" }))
                    .on_hover_text(if dirty {
                        "The experiment has unsaved changes (Ctrl+S saves)"
                    } else {
                        "The experiment file"
                    });
            });
        });
    }

    pub(super) fn status_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let kind = self.exp.backend;
            let dev = match self.backend_status(kind) {
                Some(Ok(d)) => d.clone(),
                Some(Err(why)) => format!("unavailable: {why}"),
                None => "checking…".into(),
            };
            let threads = match (kind, self.exp.threads) {
                (crate::backend::BackendKind::Cpu, 0) => {
                    format!(", all {} threads", crate::backend::cpu::all_threads())
                }
                (crate::backend::BackendKind::Cpu, 1) => ", 1 thread".to_string(),
                (crate::backend::BackendKind::Cpu, n) => format!(", {n} threads"),
                _ => String::new(),
            };
            let cpu_engine = match (self.exp.cpu_engine, &self.ort) {
                (crate::backend::cpu::CpuEngineChoice::Tract, _) => "tract".to_string(),
                (_, Some(Ok(o))) => format!("ONNX Runtime {}", o.version),
                (crate::backend::cpu::CpuEngineChoice::Ort, Some(Err(_))) => {
                    "ONNX Runtime (not found)".to_string()
                }
                (_, Some(Err(_))) => "tract (no ONNX Runtime)".to_string(),
                (_, None) => "…".to_string(),
            };
            ui.label(format!(
                "Backend: {} — {dev}{threads} · CPU engine: {cpu_engine}",
                kind.name().to_uppercase()
            ))
            .on_hover_text(format!(
                "The backend engines are built on, its device, and the threads the CPU engines \
                 use.{}",
                match &self.ort {
                    Some(Ok(o)) => format!(
                        " The CPU engine (CPU rows and every statistics pass): ONNX Runtime {} \
                         ({})",
                        o.version,
                        o.path.display()
                    ),
                    Some(Err(why)) => format!(" The CPU engine is tract: {why}"),
                    None => String::new(),
                }
            ));
            ui.separator();
            match &self.run {
                Some(run) => {
                    progress_ui(ui, run, self.results.rows.len(), 260.0);
                }
                None => {
                    let rows = self.results.rows();
                    let text = if rows.is_empty() {
                        "Idle".to_string()
                    } else {
                        format!(
                            "{} rows{}",
                            rows.len(),
                            if self.results.partial {
                                " (cancelled run)"
                            } else {
                                ""
                            }
                        )
                    };
                    ui.label(text).on_hover_text("State of the last run");
                }
            }
            if let Some(task) = self
                .results
                .report
                .as_ref()
                .and_then(|r| r.model.task)
                .or(self.model.info.as_ref().and_then(|i| i.task))
            {
                ui.separator();
                ui.label(match task {
                    Task::Classification => "classification",
                    Task::Segmentation => "segmentation",
                })
                .on_hover_text("The model's task");
            }
        });
    }
}

/// Progress bar with stage, count and ETA.
pub fn progress_ui(ui: &mut egui::Ui, run: &RunState, rows_done: usize, width: f32) {
    let frac = if run.total > 0 {
        run.done as f32 / run.total as f32
    } else {
        0.0
    };
    let eta = run
        .eta_s()
        .map(|s| format!(", ETA {s:.0} s"))
        .unwrap_or_default();
    let text = format!(
        "{}{} {}/{}{eta}",
        if run.cancelling {
            "cancelling — "
        } else {
            ""
        },
        run.stage,
        run.done,
        run.total
    );
    let quiet = if run.is_timing() {
        "\nWhile an engine is timed the window redraws once a second, so it does not compete \
         with the benchmark for the CPU"
    } else {
        ""
    };
    ui.add(egui::ProgressBar::new(frac).desired_width(width).text(text))
        .on_hover_text(format!(
            "Rows finished: {rows_done} of {}; running for {:.0} s{quiet}",
            run.rows_expected,
            run.started.elapsed().as_secs_f64()
        ));
}

/// Uploads an RGB image as a texture.
pub fn texture(ctx: &egui::Context, name: &str, img: &image::RgbImage) -> egui::TextureHandle {
    let (w, h) = img.dimensions();
    let ci = egui::ColorImage::from_rgb([w as usize, h as usize], img.as_raw());
    ctx.load_texture(name, ci, egui::TextureOptions::LINEAR)
}

/// True for a file inside the bundled sample folder, which quantscope never writes into.
fn is_bundled_sample(p: &Path) -> bool {
    let samples =
        crate::data::canonical(&Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models"));
    let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let dir = p.parent().map(crate::data::canonical).unwrap_or_default();
    dir.starts_with(&samples)
}

/// Where a save or an export is offered when it must be typed: `~/quantscope/<name>` (the
/// working folder where there is no home).
fn suggested_output(name: &str) -> String {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join("quantscope"))
        .unwrap_or_else(|| PathBuf::from("."))
        .join(name)
        .display()
        .to_string()
}

/// The time of day in UTC, "14:02 UTC", for run names (the standard library knows no zone).
fn clock_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60)
}
