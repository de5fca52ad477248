//! The window's frame, as rerun's `app.rs` keeps it: each frame takes worker events and the
//! keyboard and dropped files, lays out the panels (menu, status bar, setup, results) and
//! applies the commands the drawing pushed; and eframe's `App` with `run`, which opens the
//! window. Commands are applied in `commands.rs`, worker events taken in `events.rs`, the
//! menu bar, status bar and windows drawn in `chrome.rs`.

use eframe::egui;
use std::path::PathBuf;
use std::time::Instant;

use egui::Key;

use super::commands::{SC_CANCEL, SC_OPEN, SC_RUN, SC_SAVE};
use super::{Autosave, Command, ExportKind, Settings, Tab, Workbench, panels, results, theme};

/// Events taken per frame at most, so a burst never makes a long frame.
const MAX_EVENTS_PER_FRAME: usize = 256;
/// How long a cancelled job may take to stop before the window lets go of it.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

const SETTINGS_KEY: &str = "quantscope.settings";

impl Workbench {
    /// One frame: take worker events, then draw and apply what the drawing asked for.
    /// eframe calls the two halves from `logic` and `ui`; tests call this.
    pub fn frame_ui(&mut self, ui: &mut egui::Ui) {
        self.poll_events(ui.ctx());
        self.root_ui(ui);
    }

    /// Draws the whole window and applies the frame's commands.
    pub fn root_ui(&mut self, ui: &mut egui::Ui) {
        self.input_ui(ui.ctx());
        egui::Panel::top("menu").show(ui, |ui| self.menu_ui(ui));
        egui::Panel::bottom("status").show(ui, |ui| self.status_ui(ui));
        egui::Panel::left("setup")
            .resizable(true)
            .default_size(340.0)
            .min_size(260.0)
            .show(ui, |ui| {
                egui::Panel::bottom("setup.run").show(ui, |ui| {
                    ui.add_space(4.0);
                    panels::run_bar_ui(self, ui);
                });
                egui::ScrollArea::vertical().show(ui, |ui| panels::panels_ui(self, ui));
            });
        egui::CentralPanel::default().show(ui, |ui| {
            self.central_rect = ui.max_rect();
            results::results_ui(self, ui)
        });
        self.open_path_window_ui(ui.ctx());
        self.trt_commands_window_ui(ui.ctx());
        for p in std::mem::take(&mut self.drops) {
            self.route_path(p);
        }
        self.apply_pending();
        if let Some(run) = &self.run {
            // While an engine is being timed the window redraws once a second: a software-
            // rendered frame costs more CPU than the benchmark thread has to spare.
            let every_ms = if run.is_timing() { 1000 } else { 100 };
            ui.ctx()
                .request_repaint_after(std::time::Duration::from_millis(every_ms));
        }
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
        if matches!(self.tab, Tab::Masks | Tab::Classes) && !typing {
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
}

/// Uploads an RGB image as a texture.
pub fn texture(ctx: &egui::Context, name: &str, img: &image::RgbImage) -> egui::TextureHandle {
    let (w, h) = img.dimensions();
    let ci = egui::ColorImage::from_rgb([w as usize, h as usize], img.as_raw());
    ctx.load_texture(name, ci, egui::TextureOptions::LINEAR)
}

/// The eframe face of the workbench.
struct WorkbenchApp {
    wb: Workbench,
    /// `QUANTSCOPE_SMOKE_OUT`: when the autorun ends, write the report and a screenshot there
    /// and close (the Xvfb smoke test drives a whole run this way).
    smoke: Option<Smoke>,
}

/// Where the smoke run is: waiting for the run, then for the screenshot to be written.
struct Smoke {
    dir: PathBuf,
    shot_requested: Option<Instant>,
}

impl WorkbenchApp {
    fn smoke_step(&mut self, ctx: &egui::Context) {
        let Some(smoke) = &mut self.smoke else { return };
        ctx.request_repaint_after(std::time::Duration::from_millis(200));
        let shot = smoke.dir.join("window.png");
        match smoke.shot_requested {
            None if !self.wb.is_running() && self.wb.pending.is_empty() => {
                let dir = smoke.dir.clone();
                smoke.shot_requested = Some(Instant::now());
                self.wb
                    .apply(Command::ExportTo(ExportKind::Json, dir.join("report.json")));
                self.wb.apply(Command::ExportTo(ExportKind::ViewPng, shot));
            }
            Some(t) if shot.is_file() || t.elapsed().as_secs() > 20 => {
                let log: Vec<String> = self.wb.log.iter().map(|l| l.text.clone()).collect();
                let _ = std::fs::write(smoke.dir.join("log.txt"), log.join("\n"));
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            }
            _ => {}
        }
    }
}

impl eframe::App for WorkbenchApp {
    fn logic(&mut self, ctx: &egui::Context, _frame: &mut eframe::Frame) {
        self.wb.poll_events(ctx);
        self.smoke_step(ctx);
    }

    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.wb.root_ui(ui);
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, SETTINGS_KEY, &self.wb.settings);
    }
}

/// Opens the workbench window on `path` (an experiment or a model). A missing file is
/// reported in the window, never a panic. With `QUANTSCOPE_AUTORUN=1` the experiment starts
/// at once and `QUANTSCOPE_TAB` (compare, masks, calibration, layers, graph, log) picks the tab
/// shown; with `QUANTSCOPE_SMOKE_OUT=DIR` the window writes the report, a screenshot and its
/// log into DIR once the run ends, and closes: the smoke test uses all three.
pub fn run(path: Option<PathBuf>) -> anyhow::Result<()> {
    let icon = eframe::icon_data::from_png_bytes(include_bytes!("../../assets/icon.png")).ok();
    let mut viewport = egui::ViewportBuilder::default()
        .with_title("quantscope")
        .with_inner_size([1440.0, 900.0])
        .with_min_inner_size([900.0, 600.0])
        .with_drag_and_drop(true);
    if let Some(icon) = icon {
        viewport = viewport.with_icon(icon);
    }
    let options = eframe::NativeOptions {
        viewport,
        ..Default::default()
    };
    eframe::run_native(
        "quantscope",
        options,
        Box::new(move |cc| {
            let settings: Settings = cc
                .storage
                .and_then(|s| eframe::get_value(s, SETTINGS_KEY))
                .unwrap_or_default();
            theme::apply(&cc.egui_ctx, settings.light_theme);
            let mut wb = Workbench::new(path.as_deref(), settings);
            wb.autosave = Some(Autosave::new(
                crate::calib::StatsCache::default_dir().join("autosave.ron"),
            ));
            wb.past_runs = wb
                .autosave
                .as_ref()
                .map(Autosave::restore_runs)
                .unwrap_or_default();
            if wb.autosave.as_ref().is_some_and(|a| a.path.is_file()) {
                wb.log_info(
                    "the experiment of the last session is kept: File > Restore autosaved experiment",
                );
            }
            if let Ok(tab) = std::env::var("QUANTSCOPE_TAB") {
                if let Some(t) = Tab::from_name(&tab) {
                    wb.tab = t;
                }
            }
            if std::env::var("QUANTSCOPE_AUTORUN").is_ok_and(|v| v == "1") {
                wb.push(Command::Run);
                wb.apply_pending();
            }
            let smoke = std::env::var_os("QUANTSCOPE_SMOKE_OUT").map(|d| Smoke {
                dir: PathBuf::from(d),
                shot_requested: None,
            });
            Ok(Box::new(WorkbenchApp { wb, smoke }))
        }),
    )
    .map_err(|e| anyhow::anyhow!("the window could not open: {e}"))
}
