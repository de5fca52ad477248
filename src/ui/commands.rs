//! Commands and the one place that applies them (`apply`, as rerun's `command_handling.rs`):
//! opening and saving, starting runs, analyses and re-times, routing dropped paths. The frame
//! that pushes them (keyboard shortcuts, dropped files, layout) is `app.rs`; worker events are
//! taken in `events.rs`, the menu bar, status bar and windows drawn in `chrome.rs`.

use eframe::egui;
use std::path::{Path, PathBuf};
use std::time::Instant;

use egui::{Key, KeyboardShortcut, Modifiers};

use super::{
    ClassViewState, DialogPurpose, LayerSort, MAX_RECENT, MaskViewState, PAST_RUNS_KEPT, Results,
    RunState, Scan, Tab, Workbench, theme,
};
use crate::backend::Precision;
use crate::calib::Method;
use crate::experiment::Experiment;
use crate::model::Task;
use crate::sensitivity::{Budget, SensitivityOptions, SensitivityReport};
use crate::worker::{DialogKind, FileDialog, IoRequest};

pub const SC_OPEN: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::O);
pub const SC_SAVE: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::S);
pub const SC_RUN: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::R);
pub const SC_CANCEL: KeyboardShortcut = KeyboardShortcut::new(Modifiers::NONE, Key::Escape);

/// A dialog that answers `None` faster than this had no portal to show it.
pub(super) const NO_DIALOG_MS: f64 = 250.0;

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
    /// Every engine's confusion matrix with FP32's and the difference, one line per cell.
    ConfusionCsv,
    /// The images each engine flips against FP32, with the top-3s.
    GalleryCsv,
}

impl ExportKind {
    pub fn extension(self) -> &'static str {
        match self {
            ExportKind::Json => "json",
            ExportKind::Markdown => "md",
            ExportKind::Csv | ExportKind::ConfusionCsv | ExportKind::GalleryCsv => "csv",
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
    /// Select a node (ONNX name) in the Graph tab and the Layers table alike, bringing it into
    /// view in both.
    SelectNode(String),
    /// Draw the model's graph: built and laid out on the worker.
    DrawGraph,
    SelectImage(usize),
    NextImage,
    PrevImage,
    SetEngine {
        slot: usize,
        row: Option<usize>,
    },
    /// The Classes tab: the engine whose confusion matrix is compared with FP32's.
    SetClassesEngine(usize),
    /// The Classes tab: narrow the gallery to one confusion cell (true, predicted), or not.
    SetConfusionCell(Option<(usize, usize)>),
    /// The Classes tab: show this evaluation image large.
    SelectGalleryImage(usize),
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
            Command::SelectNode(n) => {
                self.selected_node = Some(n);
                self.graph.reveal = true;
                self.layers.reveal = true;
            }
            Command::DrawGraph => self.request_diagram(),
            Command::SelectImage(i) => {
                self.masks.image = i;
                self.masks.textures.clear();
            }
            Command::NextImage | Command::PrevImage if self.tab == Tab::Classes => {
                let order = self.gallery_order();
                let Some(last) = order.len().checked_sub(1) else {
                    return;
                };
                // Nothing selected means the first image is shown.
                let pos = self
                    .classes
                    .image
                    .and_then(|i| order.iter().position(|&o| o == i))
                    .unwrap_or(0);
                let next = if c == Command::NextImage {
                    (pos + 1).min(last)
                } else {
                    pos.saturating_sub(1)
                };
                self.classes.image = Some(order[next]);
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
            Command::SetClassesEngine(row) => {
                self.classes.engine = Some(row);
                self.classes.image = None;
            }
            Command::SetConfusionCell(cell) => {
                self.classes.cell = cell;
                self.classes.image = None;
            }
            Command::SelectGalleryImage(i) => self.classes.image = Some(i),
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

    pub(super) fn experiment_stem(&self) -> String {
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
            self.classes = ClassViewState::default();
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
        self.model.diagram = None;
        self.model.diagram_error = None;
        self.model.diagram_job = None;
        self.selected_node = None;
        self.graph = Default::default();
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

    /// Asks the worker for the model's drawing, laid out (once per model).
    fn request_diagram(&mut self) {
        if self.model.diagram.is_some()
            || self.model.diagram_job.is_some()
            || self.model.diagram_error.is_some()
            || self.exp.model.as_os_str().is_empty()
        {
            return;
        }
        let Some(w) = &mut self.worker else {
            // Asked once: the tab shows why instead of asking again every frame.
            self.model.diagram_error = Some("no worker thread to lay the graph out".into());
            return;
        };
        match w.request(IoRequest::Diagram {
            path: self.exp.model.clone(),
        }) {
            Ok(job) => self.model.diagram_job = Some(job),
            Err(e) => self.model.diagram_error = Some(format!("{e:#}")),
        }
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

    pub(super) fn request_preview(&mut self) {
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
        self.classes = ClassViewState::default();
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
        self.classes = ClassViewState::default();
        self.pick_default_engines();
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

    /// Writes the experiment to the autosave file when it changed (at once when `now`).
    pub(super) fn keep_autosave(&mut self, now: bool) {
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

    pub(super) fn picked(&mut self, purpose: DialogPurpose, path: Option<PathBuf>, dialog_ms: f64) {
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

    /// The row the Classes tab compares with FP32: the one chosen, else the first INT8 row,
    /// else the first other engine, else FP32 itself (rows with a confusion matrix only).
    pub fn classes_engine(&self) -> Option<usize> {
        let rows = self.results.rows();
        let usable = |k: usize| {
            rows.get(k)
                .is_some_and(|r| !r.failed() && r.confusion.is_some())
        };
        let first = |want: &dyn Fn(&crate::report::Row) -> bool| {
            (0..rows.len()).find(|&k| usable(k) && want(&rows[k]))
        };
        self.classes
            .engine
            .filter(|&k| usable(k))
            .or_else(|| first(&|r| r.precision == Some(Precision::Int8)))
            .or_else(|| first(&|r| r.precision != Some(Precision::Fp32)))
            .or_else(|| first(&|_| true))
    }

    /// The Classes tab's gallery as shown: the images the chosen engine flips against FP32,
    /// narrowed to the chosen confusion cell.
    pub fn gallery_order(&self) -> Vec<usize> {
        let (Some(report), Some(k)) = (&self.results.report, self.classes_engine()) else {
            return vec![];
        };
        report
            .flips_in(k, self.classes.cell)
            .iter()
            .map(|f| f.0.image)
            .collect()
    }

    /// Asks the I/O thread for a gallery thumbnail, once.
    pub fn want_thumb(&mut self, path: &Path) {
        let c = &self.classes;
        if c.thumbs.contains_key(path)
            || c.thumb_errors.contains_key(path)
            || c.thumb_loading.values().any(|p| p == path)
        {
            return;
        }
        let Some(w) = &mut self.worker else { return };
        // A full queue answers Busy: the next frame asks again.
        if let Ok(job) = w.request(IoRequest::Image {
            path: path.to_path_buf(),
            max_side: 96,
        }) {
            self.classes.thumb_loading.insert(job, path.to_path_buf());
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
}

/// True for a file inside the bundled sample folder, which quantscope never writes into.
pub(super) fn is_bundled_sample(p: &Path) -> bool {
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
