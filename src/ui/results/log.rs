//! The Log tab: what ran, with timings and any errors.

use crate::ui::{Workbench, theme};
use eframe::egui;

pub fn log_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        ui.label(format!("{} lines", wb.log.len()));
        if ui.button("Clear").on_hover_text("Clear the log").clicked() {
            wb.log.clear();
        }
        if ui
            .button("Copy")
            .on_hover_text("Copy the log to the clipboard")
            .clicked()
        {
            let text: Vec<String> = wb
                .log
                .iter()
                .map(|l| format!("{:8.1} s  {}", l.at_s, l.text))
                .collect();
            ui.ctx().copy_text(text.join("\n"));
        }
    });
    egui::ScrollArea::vertical()
        .stick_to_bottom(true)
        .auto_shrink([false, false])
        .show(ui, |ui| {
            for l in &wb.log {
                let text = egui::RichText::new(format!("{:8.1} s  {}", l.at_s, l.text)).monospace();
                if l.error {
                    ui.colored_label(theme::ERROR, text);
                } else {
                    ui.label(text);
                }
            }
        });
}
