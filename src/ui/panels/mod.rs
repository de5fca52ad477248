//! The left side: Model, Data, Calibration and Build panels, top to bottom, each collapsible.
//! Panels draw from a clone of the experiment and push `Command::SetExperiment` when the
//! user changed it.

use eframe::egui;
mod build;
mod calibration;
mod data;
mod model;

use super::{Command, Workbench};

pub fn panels_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
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

/// A label that shows a path's file name, with the full path as tooltip.
pub(crate) fn path_label_ui(ui: &mut egui::Ui, path: Option<&std::path::Path>, none: &str) {
    match path {
        Some(p) => {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string());
            ui.label(egui::RichText::new(name).monospace())
                .on_hover_text(p.display().to_string());
        }
        None => {
            ui.weak(none).on_hover_text("Not set");
        }
    }
}
