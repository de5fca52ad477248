//! The Layers tab: where each engine's time goes (per-layer times, [`super::times`]); then
//! per-layer sensitivity (SQNR isolated and accumulated, task metric gained by keeping a layer
//! in float) as a sortable table and a bar chart; "Analyse sensitivity" runs it on the worker,
//! clicking a layer's precision moves it in or out of the experiment's mixed-precision engine,
//! and "Re-run" builds that engine next to the others. Clicking a layer's name selects it here
//! and in the Graph tab (one `Command::SelectNode`).

use eframe::egui;
use egui_plot::{Bar, BarChart, Legend};

use super::empty_ui;
use crate::model::Task;
use crate::sensitivity::{LayerReport, SensitivityReport};
use crate::ui::{Command, LayerSort, Workbench, theme};

const FLOAT_COLOR: egui::Color32 = egui::Color32::from_rgb(230, 160, 60);
const INT8_COLOR: egui::Color32 = egui::Color32::from_rgb(70, 130, 200);

fn num(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

pub fn layers_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    super::times::times_ui(wb, ui);
    controls_ui(wb, ui);
    ui.separator();
    let Some(report) = wb.layers.report.clone() else {
        let text = if wb.run.as_ref().is_some_and(|r| r.sensitivity) {
            "Analysing… each layer's SQNR, then the task metric of the most sensitive ones."
        } else {
            "No layer analysis yet: press Analyse sensitivity to measure each layer's error."
        };
        empty_ui(ui, text);
        return;
    };
    if report.layers.is_empty() {
        empty_ui(ui, "The analysis found no quantized layers.");
        return;
    }
    summary_ui(&report, ui);
    let keep_float: Vec<String> = wb
        .exp
        .mixed_precision
        .as_ref()
        .map(|m| m.keep_float.clone())
        .unwrap_or_default();
    egui::ScrollArea::vertical()
        .id_salt("layers.scroll")
        .auto_shrink([false, false])
        .show(ui, |ui| {
            chart_ui(&report, &keep_float, ui);
            ui.add_space(8.0);
            table_ui(wb, &report, &keep_float, ui);
        });
}

fn controls_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let running = wb.is_running();
    ui.horizontal_wrapped(|ui| {
        if ui
            .add_enabled(!running, egui::Button::new("Analyse sensitivity"))
            .on_hover_text(
                "Measure each quantized layer's error (SQNR) on calibration images, then the task metric gained by keeping the worst ones in float",
            )
            .on_disabled_hover_text("A job is running")
            .clicked()
        {
            wb.push(Command::AnalyseSensitivity);
        }
        ui.checkbox(&mut wb.layers.find_mixed, "find mixed precision")
            .on_hover_text(
                "Also search the fewest layers to keep in float so the INT8 engine stays within the budget",
            );
        let task = wb.task();
        ui.add_enabled_ui(wb.layers.find_mixed, |ui| {
            if task != Some(Task::Segmentation) {
                ui.label("budget: top-1 points");
                ui.add(
                    egui::DragValue::new(&mut wb.layers.budget_top1_pt)
                        .range(0.0..=100.0)
                        .speed(0.05)
                        .max_decimals(2),
                )
                .on_hover_text("At most this many points of top-1 below FP32 (classification)");
            }
            if task != Some(Task::Classification) {
                ui.label("budget: relative mIoU %");
                ui.add(
                    egui::DragValue::new(&mut wb.layers.budget_miou_pct)
                        .range(0.0..=100.0)
                        .speed(0.05)
                        .max_decimals(2),
                )
                .on_hover_text(
                    "At most this relative mIoU loss against FP32, in percent (segmentation)",
                );
            }
        });
        ui.separator();
        let kept = wb
            .exp
            .mixed_precision
            .as_ref()
            .map(|m| m.keep_float.len())
            .unwrap_or(0);
        if ui
            .add_enabled(!running, egui::Button::new("Re-run"))
            .on_hover_text(
                "Run the experiment: the mixed-precision engine appears as one more row in Compare",
            )
            .on_disabled_hover_text("A job is running")
            .clicked()
        {
            wb.push(Command::Run);
        }
        ui.label(if kept == 0 {
            "no layer kept in float".to_string()
        } else {
            format!("{kept} layer(s) kept in float in the mixed-precision engine")
        })
        .on_hover_text("Click a layer's precision below to change it");
    });
}

fn summary_ui(r: &SensitivityReport, ui: &mut egui::Ui) {
    let metric = match r.task {
        Some(Task::Classification) => "top-1",
        Some(Task::Segmentation) => "mIoU",
        None => "metric",
    };
    let mut text = format!(
        "FP32 {metric} {:.2} % | calibration {} | INT8 {metric} {:.2} % ({:+.2} pt)",
        r.fp32_metric * 100.0,
        if r.chosen.is_empty() {
            "–"
        } else {
            &r.chosen
        },
        r.int8_metric * 100.0,
        (r.int8_metric - r.fp32_metric) * 100.0
    );
    match &r.amp {
        Some(a) => text.push_str(&format!(" | mixed precision: {}", a.summary())),
        None => text.push_str(" | no mixed-precision search"),
    }
    let methods: Vec<String> = r
        .methods
        .iter()
        .map(|m| format!("{} {:.2} %", m.method, m.metric * 100.0))
        .collect();
    ui.label(text).on_hover_text(format!(
        "{} probe images for SQNR, {} evaluation images; calibrations tried: {}; {:.1} s",
        r.probe_images,
        r.eval_images,
        if methods.is_empty() {
            "–".into()
        } else {
            methods.join(", ")
        },
        r.elapsed_ms / 1e3
    ));
}

/// The layers in the table's order.
pub fn sorted_layers<'a>(
    layers: &'a [LayerReport],
    keep_float: &[String],
    sort: LayerSort,
    descending: bool,
) -> Vec<&'a LayerReport> {
    let is_float = |l: &LayerReport| keep_float.contains(&l.node);
    let mut v: Vec<(usize, &LayerReport)> = layers.iter().enumerate().collect();
    v.sort_by(|(ia, a), (ib, b)| {
        let (va, vb) = match sort {
            LayerSort::SqnrIsolated => (a.sqnr_isolated_db, b.sqnr_isolated_db),
            LayerSort::SqnrAccumulated => (a.sqnr_accumulated_db, b.sqnr_accumulated_db),
            LayerSort::MetricGain => (a.metric_gain_pt, b.metric_gain_pt),
            _ => (None, None),
        };
        let ord = match sort {
            LayerSort::Graph => ia.cmp(ib),
            LayerSort::Node => a.node.cmp(&b.node),
            LayerSort::Op => a.op.cmp(&b.op),
            LayerSort::Precision => is_float(a).cmp(&is_float(b)),
            _ => match (va, vb) {
                (Some(x), Some(y)) => x.total_cmp(&y),
                _ => std::cmp::Ordering::Equal,
            },
        };
        let ord = if descending { ord.reverse() } else { ord };
        // Missing values sort last in both directions; ties keep the graph order.
        va.is_none().cmp(&vb.is_none()).then(ord).then(ia.cmp(ib))
    });
    v.into_iter().map(|(_, l)| l).collect()
}

fn table_ui(wb: &mut Workbench, r: &SensitivityReport, keep_float: &[String], ui: &mut egui::Ui) {
    let headers: [(&str, LayerSort, &str); 7] = [
        ("#", LayerSort::Graph, "Order in the graph"),
        ("node", LayerSort::Node, "The layer's node name"),
        ("op", LayerSort::Op, "Operator type"),
        (
            "SQNR isolated dB",
            LayerSort::SqnrIsolated,
            "SQNR of the layer's output when only it is quantized (lower = more sensitive)",
        ),
        (
            "SQNR accumulated dB",
            LayerSort::SqnrAccumulated,
            "SQNR of the layer's output with every layer up to it quantized",
        ),
        (
            "gain in float pt",
            LayerSort::MetricGain,
            "Task metric gained (points, probe evaluation subset) by keeping this layer in float with the rest INT8; measured for the layers SQNR flags",
        ),
        (
            "precision",
            LayerSort::Precision,
            "int8 or float in the mixed-precision engine; click a row's value to toggle",
        ),
    ];
    let layers = sorted_layers(&r.layers, keep_float, wb.layers.sort, wb.layers.descending);
    // A node selected in the Graph tab scrolls into view once.
    let reveal = std::mem::take(&mut wb.layers.reveal);
    egui::Grid::new("layers.grid")
        .striped(true)
        .num_columns(headers.len())
        .spacing([14.0, 4.0])
        .show(ui, |ui| {
            for (h, col, tip) in headers {
                let text = if wb.layers.sort == col {
                    format!(
                        "{h} ({})",
                        if wb.layers.descending { "desc" } else { "asc" }
                    )
                } else {
                    h.to_string()
                };
                if ui
                    .add(egui::Button::new(egui::RichText::new(text).strong()).frame(false))
                    .on_hover_text(format!("{tip}. Click to sort by this column."))
                    .clicked()
                {
                    wb.push(Command::SortLayers(col));
                }
            }
            ui.end_row();
            for l in layers {
                let index = r
                    .layers
                    .iter()
                    .position(|x| std::ptr::eq(x, l))
                    .unwrap_or(0);
                ui.label(index.to_string());
                let selected = wb.selected_node.as_deref() == Some(l.node.as_str());
                let name = ui
                    .selectable_label(selected, &l.node)
                    .on_hover_text("Click to select this node here and in the Graph tab");
                if selected && reveal {
                    name.scroll_to_me(Some(egui::Align::Center));
                }
                if name.clicked() {
                    wb.push(Command::SelectNode(l.node.clone()));
                }
                ui.label(&l.op);
                ui.label(num(l.sqnr_isolated_db, 1));
                ui.label(num(l.sqnr_accumulated_db, 1));
                match l.metric_gain_pt {
                    Some(g) => {
                        ui.colored_label(theme::delta_color(-g), format!("{g:+.2}"));
                    }
                    None => {
                        ui.label("–")
                            .on_hover_text("Not measured: SQNR did not flag it");
                    }
                }
                let float = keep_float.contains(&l.node);
                let (label, color) = if float {
                    ("float", FLOAT_COLOR)
                } else {
                    ("int8", INT8_COLOR)
                };
                let planned = l
                    .precision
                    .map(|p| format!(" The analysis's plan: {}.", p.name()))
                    .unwrap_or_default();
                if ui
                    .add(egui::Button::new(egui::RichText::new(label).color(color)).small())
                    .on_hover_text(format!(
                        "Click to {} `{}` in the mixed-precision engine.{planned}",
                        if float { "quantize" } else { "keep in float" },
                        l.node
                    ))
                    .clicked()
                {
                    wb.push(Command::ToggleLayerFloat(l.node.clone()));
                }
                ui.end_row();
            }
        });
}

/// Bars in graph order: the metric gained in float where measured, and isolated SQNR.
fn chart_ui(r: &SensitivityReport, keep_float: &[String], ui: &mut egui::Ui) {
    let color = |l: &LayerReport| {
        if keep_float.contains(&l.node) {
            FLOAT_COLOR
        } else {
            INT8_COLOR
        }
    };
    let measured = r.layers.iter().any(|l| l.metric_gain_pt.is_some());
    let height = 200.0;
    let n_layers = r.layers.len();
    let plot = |id: &str, y: &str| {
        super::fixed_plot(id, height)
            .include_y(0.0)
            .include_x(-0.5)
            .include_x(n_layers as f64 - 0.5)
            .x_axis_label("layer (graph order)")
            .y_axis_label(y.to_string())
            .legend(Legend::default())
    };
    ui.columns(if measured { 2 } else { 1 }, |cols| {
        cols[0].label("Isolated SQNR per layer (dB; lower = more sensitive)");
        plot("layers.sqnr", "SQNR dB").show(&mut cols[0], |p| {
            let (int8, float): (Vec<_>, Vec<_>) = r
                .layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| Some((i, l, l.sqnr_isolated_db?)))
                .partition(|(_, l, _)| color(l) == INT8_COLOR);
            for (name, bars, c) in [
                ("int8 layers", int8, INT8_COLOR),
                ("kept in float", float, FLOAT_COLOR),
            ] {
                let bars: Vec<Bar> = bars
                    .into_iter()
                    .map(|(i, l, v)| Bar::new(i as f64, v).name(&l.node).width(0.7))
                    .collect();
                if !bars.is_empty() {
                    p.bar_chart(BarChart::new(name, bars).color(c));
                }
            }
        });
        if measured {
            cols[1].label("Task metric gained by keeping the layer in float (points)");
            plot("layers.gain", "pt").show(&mut cols[1], |p| {
                let bars: Vec<Bar> = r
                    .layers
                    .iter()
                    .enumerate()
                    .filter_map(|(i, l)| {
                        Some(
                            Bar::new(i as f64, l.metric_gain_pt?)
                                .name(&l.node)
                                .fill(color(l))
                                .width(0.7),
                        )
                    })
                    .collect();
                p.bar_chart(BarChart::new("gain in float", bars).color(INT8_COLOR));
            });
        }
    });
}
