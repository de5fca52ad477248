//! The central area: a banner for messages, then the Compare, Masks, Classes, Calibration,
//! Layers, Graph and Log tabs.

use eframe::egui;
mod calib;
mod classes;
mod compare;
pub(crate) mod graph;
mod layers;
mod log;
pub(crate) mod masks;
mod times;

use super::{Command, Workbench, theme};

/// A chart that stays put: the results are numbers to read, not a canvas to pan.
fn fixed_plot<'a>(id: &str, height: f32) -> egui_plot::Plot<'a> {
    egui_plot::Plot::new(id.to_string())
        .height(height)
        .allow_zoom(false)
        .allow_drag(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .allow_double_click_reset(false)
}

/// Class names of the current report, in model output order (empty before a run).
fn class_names(wb: &Workbench) -> Vec<String> {
    wb.results
        .report
        .as_ref()
        .map(|r| r.evaluation.classes.clone())
        .unwrap_or_default()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tab {
    Compare,
    Masks,
    Classes,
    Calibration,
    Layers,
    Graph,
    Log,
}

impl Tab {
    pub const ALL: [Tab; 7] = [
        Tab::Compare,
        Tab::Masks,
        Tab::Classes,
        Tab::Calibration,
        Tab::Layers,
        Tab::Graph,
        Tab::Log,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Tab::Compare => "Compare",
            Tab::Masks => "Masks",
            Tab::Classes => "Classes",
            Tab::Calibration => "Calibration",
            Tab::Layers => "Layers",
            Tab::Graph => "Graph",
            Tab::Log => "Log",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tab::Compare => "compare",
            Tab::Masks => "masks",
            Tab::Classes => "classes",
            Tab::Calibration => "calibration",
            Tab::Layers => "layers",
            Tab::Graph => "graph",
            Tab::Log => "log",
        }
    }

    pub fn from_name(s: &str) -> Option<Tab> {
        Tab::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
    }

    fn help(self) -> &'static str {
        match self {
            Tab::Compare => {
                "One row per engine: accuracy, agreement, SQNR, latency, memory; charts"
            }
            Tab::Masks => "Predicted masks side by side, worst images first (segmentation)",
            Tab::Classes => {
                "Confusion matrices, what INT8 moves against FP32, per-class accuracy and the images it flips (classification)"
            }
            Tab::Calibration => "Per-tensor histograms with the range each method chose",
            Tab::Layers => "Per-layer sensitivity: which layers to keep in float (mixed precision)",
            Tab::Graph => {
                "The model's graph, as Netron draws it, coloured by the precision each node ran in on an engine"
            }
            Tab::Log => "What ran, with timings and errors",
        }
    }
}

pub fn results_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        for t in Tab::ALL {
            let label = match t {
                Tab::Log if wb.log.iter().any(|l| l.error) => "Log (errors)".to_string(),
                _ => t.title().to_string(),
            };
            if ui
                .selectable_label(wb.tab == t, label)
                .on_hover_text(t.help())
                .clicked()
            {
                wb.push(Command::SetTab(t));
            }
        }
    });
    ui.separator();
    // The run picker and messages come under the tab bar, so the tabs never move under the
    // pointer when one appears.
    if !wb.past_runs.is_empty() {
        run_history_ui(wb, ui);
    }
    if let Some((msg, error)) = wb.banner.clone() {
        egui::Frame::group(ui.style()).show(ui, |ui| {
            ui.horizontal_wrapped(|ui| {
                if error {
                    ui.colored_label(theme::ERROR, msg);
                } else {
                    ui.label(msg);
                }
                if ui
                    .small_button("Dismiss")
                    .on_hover_text("Dismiss")
                    .clicked()
                {
                    wb.banner = None;
                }
            });
        });
    }
    match wb.tab {
        Tab::Compare => compare::compare_ui(wb, ui),
        Tab::Masks => masks::masks_ui(wb, ui),
        Tab::Classes => classes::classes_ui(wb, ui),
        Tab::Calibration => calib::calib_ui(wb, ui),
        Tab::Layers => layers::layers_ui(wb, ui),
        Tab::Graph => graph::graph_ui(wb, ui),
        Tab::Log => log::log_ui(wb, ui),
    }
}

/// Which run the tabs show: this one or an earlier one of the session (also while a run is in
/// flight: its rows keep arriving in its own entry), and an earlier run whose table the Compare
/// tab shows under this one's.
fn run_history_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let title = |r: &crate::ui::Results| {
        let t = if r.title.is_empty() {
            "a run"
        } else {
            r.title.as_str()
        };
        format!("{t} ({} rows)", r.rows().len())
    };
    let mut pick = None;
    let mut compare = wb.compare_with;
    ui.horizontal_wrapped(|ui| {
        ui.label("Showing:");
        egui::ComboBox::from_id_salt("results.history")
            .selected_text(title(&wb.results))
            .width(320.0)
            .show_ui(ui, |ui| {
                for (k, r) in wb.past_runs.iter().enumerate() {
                    if ui.selectable_label(false, title(r)).clicked() {
                        pick = Some(k);
                    }
                }
            })
            .response
            .on_hover_text("Earlier runs of this session, newest first (other models' too): pick one to show it");
        ui.label("Compare with:");
        egui::ComboBox::from_id_salt("results.compare_with")
            .selected_text(
                compare
                    .and_then(|k| wb.past_runs.get(k))
                    .map(title)
                    .unwrap_or_else(|| "none".into()),
            )
            .width(320.0)
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut compare, None, "none");
                for (k, r) in wb.past_runs.iter().enumerate() {
                    ui.selectable_value(&mut compare, Some(k), title(r));
                }
            })
            .response
            .on_hover_text("Show an earlier run's table under this one's, in the Compare tab");
    });
    wb.compare_with = compare;
    if let Some(k) = pick {
        wb.show_past_run(k);
    }
}

/// A placeholder for a tab with nothing to show yet.
pub(crate) fn empty_ui(ui: &mut egui::Ui, text: &str) {
    ui.add_space(40.0);
    ui.vertical_centered(|ui| {
        ui.weak(text);
    });
}
