//! The left side: Model, Data, Calibration and Build panels, top to bottom, each collapsible.
//! Panels draw from a clone of the experiment and push `Command::SetExperiment` when the
//! user changed it.

use std::path::{Path, PathBuf};

use eframe::egui;
mod build;
mod calibration;
mod data;
mod model;

pub use build::run_bar_ui;

use super::{Command, Workbench, theme};

pub fn panels_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    wb.unusable_paths.clear();
    let mut exp = wb.exp.clone();
    egui::CollapsingHeader::new("Model")
        .default_open(true)
        .show(ui, |ui| model::model_ui(wb, ui));
    egui::CollapsingHeader::new("Data")
        .default_open(true)
        .show(ui, |ui| data::data_ui(wb, &mut exp, ui));
    egui::CollapsingHeader::new("Calibration")
        .default_open(true)
        .show(ui, |ui| calibration::calibration_ui(wb, &mut exp, ui));
    egui::CollapsingHeader::new("Build")
        .default_open(true)
        .show(ui, |ui| build::build_ui(wb, &mut exp, ui));
    if exp != wb.exp {
        wb.push(Command::SetExperiment(Box::new(exp)));
    }
}

/// What a path field accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// An ONNX model file.
    Model,
    /// A folder (calibration images, an evaluation set).
    Folder,
    /// A class-name file, one name per line.
    Labels,
}

impl PathKind {
    /// Why `p` cannot be used here, or `None` when it can.
    pub fn problem(self, p: &Path) -> Option<String> {
        let exists = p.exists();
        match self {
            PathKind::Folder if p.is_dir() => None,
            PathKind::Folder if exists => Some("not a folder".into()),
            PathKind::Folder => Some("no such folder".into()),
            _ if p.is_dir() => Some("a folder, not a file".into()),
            _ if !exists => Some("no such file".into()),
            PathKind::Model if !super::commands::is_model(p) => Some("not an .onnx model".into()),
            _ => None,
        }
    }
}

/// An editable path: typed (taken when Enter is pressed or the field is left), dropped onto the
/// row (files and folders), or chosen with `choose`'s dialog; checked as it is typed. Returns
/// the new value when the user committed one (`Some(None)`: the field was cleared).
pub(crate) fn path_field_ui(
    wb: &mut Workbench,
    ui: &mut egui::Ui,
    label: &str,
    current: Option<&Path>,
    kind: PathKind,
    choose: Option<Command>,
    hover: &str,
) -> Option<Option<PathBuf>> {
    // One field per label in the whole window: the label names it.
    let id = egui::Id::unique(("path_field", label));
    let shown = current.map(|p| p.display().to_string()).unwrap_or_default();
    // (the value the text was last synced from, the text being edited)
    let (mut synced, mut text) = ui
        .data_mut(|d| d.get_temp::<(String, String)>(id))
        .unwrap_or_else(|| (shown.clone(), shown.clone()));
    if synced != shown {
        (synced, text) = (shown.clone(), shown.clone());
    }
    let mut committed = None;
    let row = ui.horizontal(|ui| {
        let name = ui.label(label);
        // The button first, from the right, so the text field takes exactly what is left: a
        // field sized from a guess would widen the resizable side panel frame after frame.
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if let Some(c) = choose
                && ui.button("Choose…").on_hover_text(hover).clicked()
            {
                wb.push(c);
            }
            let edit = ui
                .add(
                    egui::TextEdit::singleline(&mut text)
                        .hint_text(match kind {
                            PathKind::Folder => "type or drop a folder",
                            _ => "type or drop a file",
                        })
                        .desired_width(ui.available_width().max(80.0)),
                )
                .labelled_by(name.id)
                .on_hover_text(hover);
            if edit.lost_focus() && text.trim() != shown {
                let t = text.trim();
                committed = match t.is_empty() {
                    true => Some(None),
                    false => {
                        let p = PathBuf::from(t);
                        kind.problem(&p).is_none().then_some(Some(p))
                    }
                };
            }
        });
    });
    let rect = row.response.rect;
    if ui.ctx().input(|i| !i.raw.hovered_files.is_empty()) {
        ui.painter().rect_stroke(
            rect.expand(2.0),
            3.0,
            egui::Stroke::new(1.5, theme::GOOD),
            egui::StrokeKind::Outside,
        );
    }
    if let Some(p) = wb.claim_drop(rect) {
        match kind.problem(&p) {
            None => {
                text = p.display().to_string();
                committed = Some(Some(p));
            }
            Some(why) => wb.log_error(format!("{}: {why}; {label} takes {kind:?}", p.display())),
        }
    }
    let t = text.trim();
    if !t.is_empty()
        && t != shown
        && let Some(why) = kind.problem(Path::new(t))
    {
        ui.colored_label(theme::ERROR, format!("{why}: {t}"))
            .on_hover_text("Fix the path, then press Enter");
        // The field shows a path the run would not use: Run says so rather than run the old.
        wb.unusable_paths
            .push(label.trim_end_matches(':').to_string());
    }
    if committed.is_some() {
        synced = text.trim().to_string();
    }
    ui.data_mut(|d| d.insert_temp(id, (synced, text)));
    committed
}
