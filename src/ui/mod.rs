//! The desktop workbench (eframe/egui). `run` opens the window; `Workbench` holds the saved
//! `Experiment` apart from runtime state (textures, the worker, results). Panels and tabs
//! draw from the state and push `Command`s; `commands.rs` is the one place that applies them,
//! `events.rs` the one place that takes worker events (dropping stale ones by job id), and
//! `app.rs` the frame that lays the window out and opens it.

use eframe::egui;
mod app;
mod chrome;
mod commands;
mod events;
mod exports;
mod panels;
mod results;
#[doc(hidden)]
pub mod testing;
mod theme;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::calib::Method;
use crate::experiment::Experiment;
use crate::model::ModelInfo;
use crate::pipeline::Artifacts;
use crate::report::{Report, Row};
use crate::sensitivity::SensitivityReport;
use crate::worker::{CalibScan, EvalScan, JobId, PreviewImage, Worker};

pub use app::run;
pub use commands::{Command, ExportKind};

pub use results::Tab;
pub use results::graph::{GraphViewState, Overlay};

/// What the window remembers between sessions (eframe storage).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub recent: Vec<PathBuf>,
    pub last_experiment: Option<PathBuf>,
    pub light_theme: bool,
}

const MAX_RECENT: usize = 8;

/// The model panel's runtime state.
#[derive(Default)]
pub struct ModelState {
    pub info: Option<ModelInfo>,
    /// Nodes the CUDA backend cannot take, per precision (see `backend::cuda::coverage`).
    pub cuda: crate::backend::cuda::Coverage,
    pub error: Option<String>,
    pub loading: Option<JobId>,
    /// The Graph tab's drawing, laid out on the worker when the tab first asks for it.
    pub diagram: Option<std::sync::Arc<crate::model::diagram::Diagram>>,
    pub diagram_error: Option<String>,
    pub diagram_job: Option<JobId>,
}

/// A folder scan: in flight, done or failed.
pub enum Scan<T> {
    None,
    Loading(JobId),
    Done(T),
    Failed(String),
}

impl<T> Scan<T> {
    pub fn loading_job(&self) -> Option<JobId> {
        match self {
            Scan::Loading(j) => Some(*j),
            _ => None,
        }
    }
}

/// The data panel's runtime state.
pub struct DataState {
    pub calib: Scan<CalibScan>,
    pub eval: Scan<EvalScan>,
    pub preview: Scan<PreviewImage>,
    pub thumbs: Vec<(PathBuf, egui::TextureHandle)>,
    pub preview_tex: Option<[egui::TextureHandle; 2]>,
}

impl Default for DataState {
    fn default() -> Self {
        DataState {
            calib: Scan::None,
            eval: Scan::None,
            preview: Scan::None,
            thumbs: vec![],
            preview_tex: None,
        }
    }
}

/// The build job in flight.
pub struct RunState {
    pub job: JobId,
    pub started: Instant,
    pub stage: String,
    pub stage_started: Instant,
    pub done: usize,
    pub total: usize,
    pub rows_expected: usize,
    pub cancelling: bool,
    /// When Cancel was pressed: a job that has not stopped a few seconds later (stuck in one
    /// long step) is abandoned, so the window never waits on it.
    pub cancelled_at: Option<Instant>,
    /// A per-layer sensitivity analysis rather than a build of the engines.
    pub sensitivity: bool,
    /// Re-timing one row: (the job of the results it belongs to, its index). The run's latency
    /// replaces that row's, and nothing else changes.
    pub retime: Option<(Option<JobId>, usize)>,
}

impl RunState {
    /// A job just submitted, at its first stage, expecting `rows_expected` rows.
    pub fn new(job: JobId, stage: &str, rows_expected: usize) -> RunState {
        RunState {
            job,
            started: Instant::now(),
            stage: stage.into(),
            stage_started: Instant::now(),
            done: 0,
            total: 0,
            rows_expected,
            cancelling: false,
            cancelled_at: None,
            sensitivity: false,
            retime: None,
        }
    }

    /// An engine is being timed: the window keeps quiet.
    pub fn is_timing(&self) -> bool {
        self.stage.starts_with("timing")
    }

    /// Seconds left in the current stage, from its pace so far.
    pub fn eta_s(&self) -> Option<f64> {
        if self.done == 0 || self.total <= self.done {
            return None;
        }
        let per_item_s = self.stage_started.elapsed().as_secs_f64() / self.done as f64;
        Some(per_item_s * (self.total - self.done) as f64)
    }
}

/// Results of the last job: rows as they arrive, then the full report and predictions.
/// How many earlier runs the history keeps.
pub const PAST_RUNS_KEPT: usize = 8;

#[derive(Default)]
pub struct Results {
    /// Which run these are, for the run-history picker ("run #3 · model · max · cpu · 14:02").
    pub title: String,
    /// The worker job that produces (or produced) them: rows arriving from a run land in its
    /// own results, wherever the history picker has put them.
    pub job: Option<JobId>,
    pub rows: Vec<Row>,
    pub report: Option<Report>,
    pub artifacts: Option<Artifacts>,
    /// True when the job was cancelled: rows are what finished before.
    pub partial: bool,
}

impl Results {
    pub fn rows(&self) -> &[Row] {
        match &self.report {
            Some(r) => &r.rows,
            None => &self.rows,
        }
    }
}

/// A column of the Layers table to sort by; `Graph` is the model's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerSort {
    Graph,
    Node,
    Op,
    SqnrIsolated,
    SqnrAccumulated,
    MetricGain,
    Precision,
}

/// The Layers tab: the last sensitivity report, the table's order and the analysis options.
pub struct LayersState {
    pub report: Option<SensitivityReport>,
    pub sort: LayerSort,
    pub descending: bool,
    /// Budget for classification models: top-1 points below FP32.
    pub budget_top1_pt: f64,
    /// Budget for segmentation models: relative mIoU loss in percent.
    pub budget_miou_pct: f64,
    /// Search the fewest layers to keep in float to meet the budget.
    pub find_mixed: bool,
    /// The engine "Where the time goes" shows (its name in Compare); the first with
    /// per-layer times when unset.
    pub time_engine: Option<String>,
    /// Scroll the table to the selected node on the next frame (it was selected elsewhere).
    pub reveal: bool,
}

impl Default for LayersState {
    fn default() -> Self {
        LayersState {
            report: None,
            sort: LayerSort::Graph,
            descending: false,
            budget_top1_pt: 0.5,
            budget_miou_pct: 1.0,
            find_mixed: true,
            time_engine: None,
            reveal: false,
        }
    }
}

/// Which mask is drawn where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaskSource {
    GroundTruth,
    Row(usize),
    /// Pixels where the row disagrees with FP32.
    Disagreement(usize),
}

/// The masks tab: selection, overlay opacity, shared zoom and pan, textures.
pub struct MaskViewState {
    pub image: usize,
    pub engines: [Option<usize>; 2],
    pub opacity: f32,
    /// 1 = whole image; the centre of the view in image UV (0..1).
    pub zoom: f32,
    pub center: egui::Vec2,
    pub hover: Option<[usize; 2]>,
    pub textures: HashMap<(usize, MaskSource), egui::TextureHandle>,
    pub images: HashMap<PathBuf, egui::TextureHandle>,
    pub image_errors: HashMap<PathBuf, String>,
    pub image_loading: HashMap<JobId, PathBuf>,
}

impl Default for MaskViewState {
    fn default() -> Self {
        MaskViewState {
            image: 0,
            engines: [None, None],
            opacity: 0.6,
            zoom: 1.0,
            center: egui::vec2(0.5, 0.5),
            hover: None,
            textures: HashMap::new(),
            images: HashMap::new(),
            image_errors: HashMap::new(),
            image_loading: HashMap::new(),
        }
    }
}

/// The Classes tab: the engine compared with FP32, the confusion cell the gallery is narrowed
/// to, the gallery image shown large, and the gallery's thumbnails (loaded on the I/O thread).
#[derive(Default)]
pub struct ClassViewState {
    /// The row whose confusion matrix is shown, its difference against FP32 beside it; the
    /// first INT8 row (else the first other engine) when unset.
    pub engine: Option<usize>,
    /// A confusion cell, (true class, predicted class), the gallery is narrowed to.
    pub cell: Option<(usize, usize)>,
    /// The gallery image shown large (an index into the evaluation images).
    pub image: Option<usize>,
    pub thumbs: HashMap<PathBuf, egui::TextureHandle>,
    pub thumb_errors: HashMap<PathBuf, String>,
    pub thumb_loading: HashMap<JobId, PathBuf>,
}

/// One line of the log tab.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub at_s: f64,
    pub error: bool,
    pub text: String,
}

/// What a pending file dialog is for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DialogPurpose {
    Open,
    SaveExperiment,
    CalibDir,
    EvalDir,
    Labels,
    Export(ExportKind),
}

/// The whole workbench: saved experiment, runtime state, worker handle.
pub struct Workbench {
    pub exp: Experiment,
    pub exp_path: Option<PathBuf>,
    /// The experiment as last saved or opened, to tell unsaved edits.
    pub saved: Experiment,
    pub settings: Settings,
    pub model: ModelState,
    pub data: DataState,
    pub run: Option<RunState>,
    pub results: Results,
    /// Earlier runs of this session, newest first, kept for comparison (at most
    /// [`PAST_RUNS_KEPT`]); the Results area can show any of them.
    pub past_runs: Vec<Results>,
    /// An earlier run (index into `past_runs`) whose table the Compare tab shows under the
    /// current one.
    pub compare_with: Option<usize>,
    /// Set for the real window (not in tests): keeps the experiment on disk as it is edited.
    pub autosave: Option<Autosave>,
    pub tab: Tab,
    pub masks: MaskViewState,
    pub classes: ClassViewState,
    pub layers: LayersState,
    /// The node selected in the Graph tab and the Layers table alike (an ONNX node name).
    pub selected_node: Option<String>,
    pub graph: GraphViewState,
    pub calib_tensor: Option<String>,
    pub calib_filter: String,
    pub log: Vec<LogLine>,
    /// A message shown above the results (e.g. a missing experiment file).
    pub banner: Option<(String, bool)>,
    pub backends: Vec<(BackendKind, Result<String, String>)>,
    /// ONNX Runtime for the CPU engine: its version and library, or why it is not found;
    /// `None` until the worker has looked.
    pub ort: Option<Result<crate::backend::cpu::onnxruntime::runtime::OrtFound, String>>,
    /// The method used when "compare all methods" is off.
    pub primary_method: Method,
    pub open_path_text: String,
    /// The window for typing a path is showing, for this purpose: File > Open path…, or a save
    /// or an export on a desktop without a file dialog.
    pub path_window: Option<DialogPurpose>,
    /// After an export: (file, ready `trtexec` line) for each exported model, shown in a
    /// window with Copy buttons until closed.
    pub trt_commands: Vec<(String, String)>,
    /// The TensorRT commands window is showing (closing it keeps the commands for reopening).
    pub trt_window: bool,
    /// Path fields (by label) whose typed text differs from the setting and cannot be used,
    /// as of the last frame: Run stays off until they are fixed or cleared.
    pub unusable_paths: Vec<String>,
    /// Paths dropped on the window this frame and not yet claimed by a path field.
    pub drops: Vec<PathBuf>,
    /// Where the pointer was when they were dropped.
    pub drop_pos: Option<egui::Pos2>,
    /// Commands pushed while drawing this frame, applied at its end.
    pub pending: Vec<Command>,
    /// Every command applied, most recent last (bounded), for the log and tests.
    pub history: Vec<Command>,
    pub worker: Option<Worker>,
    dialogs: HashMap<JobId, DialogPurpose>,
    backend_job: Option<JobId>,
    /// The results area, for the view screenshot.
    central_rect: egui::Rect,
    ctx: Option<egui::Context>,
    /// Notes from screenshot callbacks: Ok(info) or Err(error).
    notes_tx: crossbeam_channel::Sender<Result<String, String>>,
    notes_rx: crossbeam_channel::Receiver<Result<String, String>>,
    started: Instant,
}

impl Workbench {
    /// A workbench with a worker; `path` is an experiment (.ron) or a model (.onnx).
    pub fn new(path: Option<&Path>, settings: Settings) -> Workbench {
        let mut wb = Workbench::without_worker(settings);
        match Worker::spawn() {
            Ok(w) => wb.worker = Some(w),
            Err(e) => wb.log_error(format!("cannot start the worker thread: {e:#}")),
        }
        wb.push(Command::CheckBackends);
        if let Some(p) = path {
            wb.push(Command::Open(p.to_path_buf()));
        }
        wb.apply_pending();
        wb
    }

    /// A workbench with no worker thread: for tests that build state in code.
    pub fn without_worker(settings: Settings) -> Workbench {
        let exp = Experiment::default();
        let (notes_tx, notes_rx) = crossbeam_channel::bounded(8);
        Workbench {
            saved: exp.clone(),
            primary_method: exp.methods.first().copied().unwrap_or(Method::Entropy),
            exp,
            exp_path: None,
            settings,
            model: ModelState::default(),
            data: DataState::default(),
            run: None,
            results: Results::default(),
            past_runs: vec![],
            compare_with: None,
            autosave: None,
            tab: Tab::Compare,
            masks: MaskViewState::default(),
            classes: ClassViewState::default(),
            layers: LayersState::default(),
            selected_node: None,
            graph: GraphViewState::default(),
            calib_tensor: None,
            calib_filter: String::new(),
            log: vec![],
            banner: None,
            backends: vec![(BackendKind::Cpu, Ok("this machine's CPU".into()))],
            ort: None,
            open_path_text: String::new(),
            path_window: None,
            trt_commands: vec![],
            trt_window: false,
            unusable_paths: vec![],
            drops: vec![],
            drop_pos: None,
            pending: vec![],
            history: vec![],
            worker: None,
            dialogs: HashMap::new(),
            backend_job: None,
            central_rect: egui::Rect::NOTHING,
            ctx: None,
            notes_tx,
            notes_rx,
            started: Instant::now(),
        }
    }

    /// Shows a finished report (and its predictions) as if a job had produced it.
    pub fn set_results(&mut self, report: Report, artifacts: Option<Artifacts>) {
        self.results = Results {
            title: format!("report {}", report.experiment),
            rows: report.rows.clone(),
            report: Some(report),
            artifacts,
            partial: false,
            job: None,
        };
        self.masks = MaskViewState::default();
        self.classes = ClassViewState::default();
        self.pick_default_engines();
    }

    /// Shows a sensitivity report as if a job had produced it; a mixed-precision plan in it
    /// goes into the experiment, so the next run builds it as one more engine.
    pub fn set_sensitivity(&mut self, report: SensitivityReport) {
        self.take_sensitivity(report);
    }

    pub fn push(&mut self, c: Command) {
        self.pending.push(c);
    }

    pub fn is_running(&self) -> bool {
        self.run.is_some()
    }

    pub fn log_info(&mut self, text: impl Into<String>) {
        self.log_line(text.into(), false);
    }

    pub fn log_error(&mut self, text: impl Into<String>) {
        self.log_line(text.into(), true);
    }

    fn log_line(&mut self, text: String, error: bool) {
        let at_s = self.started.elapsed().as_secs_f64();
        self.log.push(LogLine { at_s, error, text });
        if self.log.len() > 5000 {
            self.log.drain(..1000);
        }
    }

    /// The backend's device, or why it cannot run.
    pub fn backend_status(&self, kind: BackendKind) -> Option<&Result<String, String>> {
        self.backends.iter().find(|b| b.0 == kind).map(|b| &b.1)
    }
}

/// Where the window keeps the experiment being edited, so a crash loses nothing: written a
/// few seconds after each change and before each run.
pub struct Autosave {
    pub path: PathBuf,
    /// The experiment as last written, and when.
    written: Option<(Experiment, Instant)>,
}

impl Autosave {
    pub fn new(path: PathBuf) -> Autosave {
        Autosave {
            path,
            written: None,
        }
    }

    /// The folder finished runs' reports are kept in, beside the autosaved experiment.
    pub fn runs_dir(&self) -> PathBuf {
        self.path.with_extension("runs")
    }

    /// Keeps a finished run's report (title as its `experiment` line) and drops all but the
    /// newest [`PAST_RUNS_KEPT`], the history the next session starts with.
    pub fn keep_run(&self, title: &str, report: &Report) -> Result<(), String> {
        let dir = self.runs_dir();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut kept = report.clone();
        kept.experiment = title.to_string();
        crate::files::write(&dir.join(format!("{stamp:016}.json")), kept.to_json())
            .map_err(|e| format!("autosave of the run: {e}"))?;
        let mut files = Self::run_files(&dir);
        while files.len() > PAST_RUNS_KEPT {
            let _ = std::fs::remove_file(files.remove(0));
        }
        Ok(())
    }

    /// The kept runs, newest first, as history entries (their predictions are not kept: the
    /// Masks tab needs a new run). Unreadable files are skipped.
    pub fn restore_runs(&self) -> Vec<Results> {
        let mut out: Vec<Results> = Self::run_files(&self.runs_dir())
            .iter()
            .filter_map(|f| crate::files::read_input(f, 256 << 20).ok())
            .filter_map(|b| serde_json::from_slice::<Report>(&b).ok())
            .map(|r| Results {
                title: format!("{} (last session)", r.experiment),
                rows: r.rows.clone(),
                report: Some(r),
                ..Default::default()
            })
            .collect();
        out.reverse();
        out.truncate(PAST_RUNS_KEPT);
        out
    }

    /// The kept run files, oldest first (their names are millisecond stamps).
    fn run_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    }

    /// Writes `exp` if it changed and the last write is `quiet` old (or `now`).
    pub fn keep(&mut self, exp: &Experiment, now: bool) -> Result<(), String> {
        let quiet = std::time::Duration::from_secs(2);
        let due = match &self.written {
            Some((e, _)) if e == exp => false,
            Some((_, t)) => now || t.elapsed() >= quiet,
            None => true,
        };
        if !due || exp.model.as_os_str().is_empty() {
            return Ok(());
        }
        self.written = Some((exp.clone(), Instant::now()));
        exp.save(&self.path).map_err(|e| format!("autosave: {e}"))
    }
}
