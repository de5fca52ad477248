//! The window's chrome: the menu bar, the status bar, and the windows over the results (typing
//! a path, the TensorRT commands).

use eframe::egui;
use std::path::{Path, PathBuf};

use super::commands::*;
use super::{DialogPurpose, RunState, Tab, Workbench, theme};
use crate::model::Task;

impl Workbench {
    /// Rows the run in flight has produced, also while the history picker shows an earlier
    /// run (its rows land in its own entry).
    pub(crate) fn live_rows(&self) -> usize {
        let Some(run) = &self.run else { return 0 };
        std::iter::once(&self.results)
            .chain(&self.past_runs)
            .find(|r| r.job == Some(run.job))
            .map(|r| r.rows.len())
            .unwrap_or(0)
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
                    progress_ui(ui, run, self.live_rows(), 260.0);
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
pub(crate) fn progress_ui(ui: &mut egui::Ui, run: &RunState, rows_done: usize, width: f32) {
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
