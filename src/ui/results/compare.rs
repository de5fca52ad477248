//! The Compare tab: one table row per (precision, method) and charts side by side: latency
//! (bars with p99 whiskers), memory (weights and activations stacked), accuracy or mIoU, and
//! per-class IoU (or accuracy) grouped by engine.

use eframe::egui;
use egui_plot::{Bar, BarChart, Legend, Line, Plot, PlotPoints};

use super::empty_ui;
use crate::backend::Precision;
use crate::model::Task;
use crate::report::Row;
use crate::ui::{Workbench, theme};

const MIB: f64 = 1024.0 * 1024.0;

/// The name a row goes by in the table and the charts.
pub fn engine_name(r: &Row) -> String {
    let base = match (r.precision, r.method) {
        (Some(p), Some(m)) => format!("{} {}", p.name().to_uppercase(), m.name()),
        (Some(p), None) => p.name().to_uppercase(),
        _ => "?".into(),
    };
    let base = if r.kept_float.is_empty() {
        base
    } else {
        format!("{base} + {} float", r.kept_float.len())
    };
    if r.simulated {
        format!("{base} (simulated on CPU)")
    } else {
        base
    }
}

use crate::report::{num, pct};

pub fn compare_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let rows: Vec<Row> = wb.results.rows().to_vec();
    if rows.is_empty() {
        let text = if wb.is_running() {
            "Building… rows appear here as each engine finishes."
        } else {
            "No results yet: set up the experiment on the left and press Run (Ctrl+R)."
        };
        empty_ui(ui, text);
        return;
    }
    let seg = wb
        .results
        .report
        .as_ref()
        .and_then(|r| r.model.task)
        .map(|t| t == Task::Segmentation)
        .unwrap_or_else(|| rows.iter().any(|r| r.miou.is_some()));
    let classes = super::class_names(wb);
    if wb.results.partial {
        ui.colored_label(
            theme::WARN,
            "Run cancelled: these are the rows that finished.",
        );
    }
    egui::ScrollArea::vertical()
        .id_salt("compare.scroll")
        .auto_shrink([false, false])
        .show(ui, |ui| {
            table_ui(&rows, seg, ui);
            ui.add_space(8.0);
            charts_ui(&rows, seg, &classes, ui);
        });
}

fn fp32_metric(rows: &[Row]) -> Option<f64> {
    rows.iter()
        .find(|r| r.precision == Some(Precision::Fp32) && r.error.is_none())
        .and_then(|r| r.metric())
}

fn table_ui(rows: &[Row], seg: bool, ui: &mut egui::Ui) {
    let reference = fp32_metric(rows);
    let metric = if seg { "mIoU %" } else { "top-1 %" };
    let headers: [(&str, &str); 10] = [
        ("engine", "Precision and calibration method"),
        (metric, "Task metric on the evaluation set"),
        (
            "Δ vs FP32",
            "Change of the task metric against FP32, in points",
        ),
        (
            "agreement %",
            "Argmax agreement with FP32 (pixels or top-1)",
        ),
        (
            "SQNR dB",
            "Signal-to-quantisation-noise ratio of the outputs against FP32",
        ),
        ("median ms", "Median latency at batch 1"),
        ("p99 ms", "99th percentile latency at batch 1"),
        ("img/s", "Throughput (at the batch size when timed)"),
        ("memory MiB", "Weights + activations the engine holds"),
        ("note", "Simulated precisions and errors"),
    ];
    egui::ScrollArea::horizontal()
        .id_salt("compare.table")
        .show(ui, |ui| {
            egui::Grid::new("compare.grid")
                .striped(true)
                .num_columns(headers.len())
                .spacing([14.0, 4.0])
                .show(ui, |ui| {
                    for (h, tip) in headers {
                        ui.label(egui::RichText::new(h).strong()).on_hover_text(tip);
                    }
                    ui.end_row();
                    for r in rows {
                        ui.horizontal(|ui| {
                            let (rect, _) =
                                ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
                            ui.painter().rect_filled(rect, 2.0, theme::row_color(r));
                            ui.label(engine_name(r));
                        });
                        ui.label(pct(r.metric()));
                        let delta = match (r.metric(), reference) {
                            (Some(m), Some(f)) if r.precision != Some(Precision::Fp32) => {
                                Some((m - f) * 100.0)
                            }
                            _ => None,
                        };
                        match delta {
                            Some(d) => {
                                ui.colored_label(theme::delta_color(d), format!("{d:+.2}"));
                            }
                            None => {
                                ui.label("–");
                            }
                        }
                        ui.label(pct(r.agreement));
                        ui.label(num(r.sqnr_db, 1)).on_hover_text(
                            r.sqnr_images
                                .map(|n| format!("over {n} images"))
                                .unwrap_or_else(|| "not measured".into()),
                        );
                        ui.label(num(r.latency_ms.map(|l| l.median), 2)).on_hover_text(
                            r.latency_ms
                                .map(|l| format!("{} runs, p90 {:.2} ms", l.runs, l.p90))
                                .unwrap_or_default(),
                        );
                        ui.label(num(r.latency_ms.map(|l| l.p99), 2));
                        ui.label(num(r.throughput_batch_ips.or(r.throughput_ips), 1))
                            .on_hover_text(
                                r.batch
                                    .map(|b| format!("at batch {b}"))
                                    .unwrap_or_else(|| "at batch 1".into()),
                            );
                        match &r.memory_bytes {
                            Some(m) => {
                                ui.label(format!(
                                    "{:.1}",
                                    (m.weights + m.activations) as f64 / MIB
                                ))
                                .on_hover_text(format!(
                                    "weights {:.2} MiB, activations {:.2} MiB, peak RSS growth {:.1} MiB",
                                    m.weights as f64 / MIB,
                                    m.activations as f64 / MIB,
                                    m.peak_rss as f64 / MIB
                                ));
                            }
                            None => {
                                ui.label("–");
                            }
                        }
                        match (&r.error, r.simulated) {
                            (Some(e), _) => {
                                ui.colored_label(theme::ERROR, "error").on_hover_text(e);
                            }
                            (None, true) => {
                                ui.label("simulated on CPU")
                                    .on_hover_text("FP16 is emulated on the CPU backend: its speed is not FP16 speed");
                            }
                            (None, false) => {
                                ui.label("");
                            }
                        }
                        ui.end_row();
                    }
                });
        });
}

fn short_name(r: &Row) -> String {
    match (r.precision, r.method) {
        (Some(p), Some(m)) if !r.kept_float.is_empty() => format!(
            "{} {} +{}f",
            p.name().to_uppercase(),
            m.name(),
            r.kept_float.len()
        ),
        (Some(p), Some(m)) => format!("{} {}", p.name().to_uppercase(), m.name()),
        (Some(p), None) => p.name().to_uppercase(),
        _ => "?".into(),
    }
}

fn chart<'a>(id: &str, title: &str, height: f32, names: Vec<String>) -> Plot<'a> {
    super::fixed_plot(id, height)
        .y_axis_label(title.to_string())
        .x_axis_formatter(move |mark, _| {
            let i = mark.value.round();
            if (mark.value - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
}

fn charts_ui(rows: &[Row], seg: bool, classes: &[String], ui: &mut egui::Ui) {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.error.is_none()).collect();
    let names: Vec<String> = ok.iter().map(|r| short_name(r)).collect();
    let height = 220.0;
    ui.columns(3, |cols| {
        cols[0].label("Latency at batch 1 (median, whisker to p99)");
        chart("chart.latency", "ms", height, names.clone())
            .include_y(0.0)
            .show(&mut cols[0], |p| {
                let bars: Vec<Bar> = ok
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        let l = r.latency_ms?;
                        Some(
                            Bar::new(i as f64, l.median)
                                .name(short_name(r))
                                .fill(theme::row_color(r))
                                .width(0.6),
                        )
                    })
                    .collect();
                p.bar_chart(BarChart::new("median ms", bars));
                for (i, r) in ok.iter().enumerate() {
                    if let Some(l) = r.latency_ms {
                        let x = i as f64;
                        let c = p.ctx().global_style().visuals.text_color();
                        p.line(
                            Line::new(
                                format!("p99 {i}"),
                                PlotPoints::from(vec![[x, l.median], [x, l.p99]]),
                            )
                            .color(c)
                            .allow_hover(false),
                        );
                        p.line(
                            Line::new(
                                format!("p99 cap {i}"),
                                PlotPoints::from(vec![[x - 0.15, l.p99], [x + 0.15, l.p99]]),
                            )
                            .color(c)
                            .allow_hover(false),
                        );
                    }
                }
            });
        cols[1].label("Memory (weights + activations)");
        chart("chart.memory", "MiB", height, names.clone())
            .include_y(0.0)
            .legend(Legend::default())
            .show(&mut cols[1], |p| {
                let w: Vec<Bar> = ok
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let m = r.memory_bytes.clone().unwrap_or_default();
                        Bar::new(i as f64, m.weights as f64 / MIB).width(0.6)
                    })
                    .collect();
                let a: Vec<Bar> = ok
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let m = r.memory_bytes.clone().unwrap_or_default();
                        Bar::new(i as f64, m.activations as f64 / MIB).width(0.6)
                    })
                    .collect();
                let weights =
                    BarChart::new("weights", w).color(egui::Color32::from_rgb(70, 130, 200));
                let acts = BarChart::new("activations", a)
                    .color(egui::Color32::from_rgb(230, 160, 60))
                    .stack_on(&[&weights]);
                p.bar_chart(weights);
                p.bar_chart(acts);
            });
        let metric = if seg { "mIoU %" } else { "top-1 %" };
        cols[2].label(format!("Task metric ({metric})"));
        chart("chart.metric", "%", height, names.clone())
            .include_y(0.0)
            .show(&mut cols[2], |p| {
                let bars: Vec<Bar> = ok
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        Some(
                            Bar::new(i as f64, r.metric()? * 100.0)
                                .name(short_name(r))
                                .fill(theme::row_color(r))
                                .width(0.6),
                        )
                    })
                    .collect();
                p.bar_chart(BarChart::new(metric, bars));
            });
    });
    let per_class: Vec<(&Row, &Vec<Option<f64>>)> = ok
        .iter()
        .filter_map(|r| {
            let v = if seg {
                r.per_class_iou.as_ref()
            } else {
                r.per_class_accuracy.as_ref()
            }?;
            Some((*r, v))
        })
        .collect();
    if per_class.is_empty() {
        return;
    }
    let n_classes = per_class.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let class_names: Vec<String> = (0..n_classes)
        .map(|c| {
            classes
                .get(c)
                .cloned()
                .unwrap_or_else(|| format!("class {c}"))
        })
        .collect();
    ui.add_space(6.0);
    ui.label(if seg {
        "Per-class IoU % by engine"
    } else {
        "Per-class accuracy % by engine"
    });
    let k = per_class.len() as f64;
    let width = 0.8 / k;
    chart("chart.per_class", "%", 240.0, class_names)
        .include_y(0.0)
        .include_y(100.0)
        .legend(Legend::default())
        .show(ui, |p| {
            for (j, (r, v)) in per_class.iter().enumerate() {
                let off = -0.4 + width * (j as f64 + 0.5);
                let bars: Vec<Bar> = v
                    .iter()
                    .enumerate()
                    .filter_map(|(c, iou)| {
                        Some(Bar::new(c as f64 + off, (*iou)? * 100.0).width(width))
                    })
                    .collect();
                p.bar_chart(BarChart::new(short_name(r), bars).color(theme::row_color(r)));
            }
        });
}
