//! The Calibration tab: per-tensor |x| histogram on a log scale with the amax each method
//! chose marked on it, and a table of tensors with their ranges per method.

use eframe::egui;
use egui_plot::{Bar, BarChart, Legend, Plot, VLine};

use super::empty_ui;
use crate::calib::Method;
use crate::report::TensorRanges;
use crate::ui::{Workbench, theme};

pub fn calib_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let Some(summary) = wb
        .results
        .report
        .as_ref()
        .and_then(|r| r.calibration.clone())
    else {
        empty_ui(
            ui,
            "No calibration yet: run an experiment with INT8 to see per-tensor histograms.",
        );
        return;
    };
    if summary.tensors.is_empty() {
        empty_ui(ui, "The calibration recorded no tensors.");
        return;
    }
    ui.label(format!(
        "{} calibration images, {} tensors; statistics {} ({:.0} ms), all four methods' ranges in {:.0} ms",
        summary.images,
        summary.tensors.len(),
        if summary.cache_hit { "from the cache" } else { "collected" },
        summary.pass_ms,
        summary.ranges_ms
    ))
    .on_hover_text("Statistics are collected once; every method is computed from them");
    let selected = wb
        .calib_tensor
        .clone()
        .filter(|t| summary.tensors.iter().any(|x| &x.tensor == t))
        .unwrap_or_else(|| summary.tensors[0].tensor.clone());
    egui::Panel::left("calib.tensors")
        .resizable(true)
        .default_size(300.0)
        .show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label("Filter:");
                ui.add(
                    egui::TextEdit::singleline(&mut wb.calib_filter)
                        .hint_text("tensor name")
                        .desired_width(160.0),
                )
                .on_hover_text("Show tensors whose name contains this text");
            });
            let filter = wb.calib_filter.to_lowercase();
            egui::ScrollArea::both()
                .id_salt("calib.table")
                .auto_shrink([false, false])
                .show(ui, |ui| {
                    egui::Grid::new("calib.grid")
                        .striped(true)
                        .num_columns(1 + Method::ALL.len())
                        .show(ui, |ui| {
                            ui.label(egui::RichText::new("tensor").strong())
                                .on_hover_text("Activation tensor (click to show its histogram)");
                            for m in Method::ALL {
                                ui.colored_label(theme::method_color(m), m.name())
                                    .on_hover_text(format!("amax chosen by {}", m.name()));
                            }
                            ui.end_row();
                            for t in &summary.tensors {
                                if !filter.is_empty() && !t.tensor.to_lowercase().contains(&filter)
                                {
                                    continue;
                                }
                                if ui
                                    .selectable_label(t.tensor == selected, &t.tensor)
                                    .on_hover_text("Show this tensor's histogram")
                                    .clicked()
                                {
                                    wb.calib_tensor = Some(t.tensor.clone());
                                }
                                for m in Method::ALL {
                                    ui.label(
                                        t.amax
                                            .get(&m)
                                            .map(|a| format!("{a:.4}"))
                                            .unwrap_or_else(|| "–".into()),
                                    );
                                }
                                ui.end_row();
                            }
                        });
                });
        });
    if let Some(t) = summary.tensors.iter().find(|t| t.tensor == selected) {
        histogram_ui(t, ui);
    }
}

fn histogram_ui(t: &TensorRanges, ui: &mut egui::Ui) {
    ui.label(egui::RichText::new(&t.tensor).monospace().strong())
        .on_hover_text("Histogram of |x| over the calibration images");
    let w = t.bin_width as f64;
    let bars: Vec<Bar> = t
        .counts
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, c)| Bar::new((i as f64 + 0.5) * w, (*c as f64 + 1.0).log10()).width(w))
        .collect();
    Plot::new(("calib.hist", t.tensor.as_str()))
        .legend(Legend::default())
        .x_axis_label("|x|")
        .y_axis_label("log10(count + 1)")
        .include_y(0.0)
        .allow_scroll(false)
        .show(ui, |p| {
            p.bar_chart(
                BarChart::new("|x| histogram", bars).color(egui::Color32::from_rgb(110, 140, 180)),
            );
            for m in Method::ALL {
                if let Some(a) = t.amax.get(&m) {
                    p.vline(
                        VLine::new(format!("{} amax {a:.4}", m.name()), *a as f64)
                            .color(theme::method_color(m))
                            .width(2.0),
                    );
                }
            }
        });
}
