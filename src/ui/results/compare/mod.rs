//! The Compare tab: one table row per (precision, method), then the charts ([`charts`]) that
//! read without the table. Each row's cells say what the engine ran and how steady its timing
//! was; a row that ran layers in FP16 or FP32 for INT8's or FP16's sake says so.

use eframe::egui;

use super::empty_ui;
use crate::backend::Precision;
use crate::bench::Latency;
use crate::model::Task;
use crate::report::Row;
use crate::ui::{Command, Workbench, theme};

mod charts;

const MIB: f64 = 1024.0 * 1024.0;

/// A row whose p99 is more than this many times its median was timed on a busy machine: its
/// numbers would change on a rerun, so the table and the latency chart flag it.
const UNSTABLE_P99_RATIO: f64 = 1.5;

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
    } else if r.tf32 {
        format!("{base} (TF32)")
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
            if let Some(i) = table_ui(&rows, seg, !wb.is_running(), "shown", ui) {
                wb.push(Command::RetimeRow(i));
            }
            if let Some(other) = wb.compare_with.and_then(|k| wb.past_runs.get(k)) {
                ui.add_space(8.0);
                ui.strong(format!("Compared with {}", other.title));
                let other_rows = other.rows().to_vec();
                table_ui(&other_rows, seg, false, "compared", ui);
            }
            ui.add_space(8.0);
            charts::charts_ui(&rows, seg, &classes, ui);
        });
}

fn fp32_metric(rows: &[Row]) -> Option<f64> {
    rows.iter()
        .find(|r| r.precision == Some(Precision::Fp32) && !r.failed())
        .and_then(|r| r.metric())
}

/// How many times the median the p99 was, for a row timed on a busy machine (None when the
/// repeats agree well enough).
fn timing_spread(l: &Latency) -> Option<f64> {
    (l.median > 0.0 && l.p99 > UNSTABLE_P99_RATIO * l.median).then(|| l.p99 / l.median)
}

/// What a flagged row's warning says: the measurement, then what to do about it.
fn spread_warning(l: &Latency, ratio: f64) -> String {
    format!(
        "p99 {ratio:.1}× the median over {} runs: the machine was busy; rerun for stable numbers",
        l.runs
    )
}

/// A warning triangle with "!" in it. Painted, not typed: the bundled fonts have no ⚠ glyph.
fn paint_warning(painter: &egui::Painter, center: egui::Pos2, size: f32) {
    let h = size * 0.5;
    let points = vec![
        center + egui::vec2(0.0, -h),
        center + egui::vec2(h * 1.1, h),
        center + egui::vec2(-h * 1.1, h),
    ];
    painter.add(egui::Shape::convex_polygon(
        points,
        theme::WARN,
        egui::Stroke::NONE,
    ));
    painter.text(
        center + egui::vec2(0.0, h * 0.25),
        egui::Align2::CENTER_CENTER,
        "!",
        egui::FontId::proportional(size * 0.8),
        egui::Color32::BLACK,
    );
}

/// A warning triangle as a widget: hoverable, and named for screen readers (and tests).
fn warning_icon_ui(ui: &mut egui::Ui, what: &str) -> egui::Response {
    let size = ui.text_style_height(&egui::TextStyle::Body);
    let (rect, response) = ui.allocate_exact_size(egui::vec2(size, size), egui::Sense::hover());
    paint_warning(ui.painter(), rect.center(), size * 0.85);
    let what = what.to_string();
    response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Label, true, &what));
    response
}

/// The p99 cell, with a warning triangle when the repeats varied a lot: a newcomer would
/// otherwise trust a number measured while something else ran.
fn p99_cell_ui(latency: Option<Latency>, ui: &mut egui::Ui) {
    let Some(l) = latency else {
        ui.label("–");
        return;
    };
    match timing_spread(&l) {
        Some(ratio) => {
            ui.horizontal(|ui| {
                ui.spacing_mut().item_spacing.x = 4.0;
                ui.label(format!("{:.2}", l.p99));
                let warning = spread_warning(&l, ratio);
                warning_icon_ui(ui, &format!("unsteady timing: {warning}")).on_hover_text(warning);
            });
        }
        None => {
            ui.label(format!("{:.2}", l.p99));
        }
    }
}

/// The results table; returns the row whose "re-time" button was pressed (offered when
/// `can_retime`, i.e. nothing is running).
fn table_ui(
    rows: &[Row],
    seg: bool,
    can_retime: bool,
    id: &str,
    ui: &mut egui::Ui,
) -> Option<usize> {
    let mut retime = None;
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
        (
            "p99 ms",
            "99th percentile latency at batch 1; a warning triangle when it is over 1.5× the median",
        ),
        ("img/s", "Throughput (at the batch size when timed)"),
        ("memory MiB", "Weights + activations the engine holds"),
        (
            "note",
            "Simulated precisions, errors, and whether the mixed-precision engine meets its budget",
        ),
    ];
    egui::ScrollArea::horizontal()
        .id_salt(("compare.table", id))
        .show(ui, |ui| {
            egui::Grid::new(("compare.grid", id))
                .striped(true)
                .num_columns(headers.len())
                .spacing([14.0, 4.0])
                .show(ui, |ui| {
                    for (h, tip) in headers {
                        ui.label(egui::RichText::new(h).strong()).on_hover_text(tip);
                    }
                    ui.end_row();
                    for (i, r) in rows.iter().enumerate() {
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
                        ui.horizontal(|ui| {
                            ui.spacing_mut().item_spacing.x = 4.0;
                            ui.label(num(r.latency_ms.map(|l| l.median), 2))
                                .on_hover_text(latency_tip(r));
                            if r.latency_ms.is_some()
                                && ui
                                    .add_enabled(can_retime, egui::Button::new("re-time").small())
                                    .on_hover_text(
                                        "Build this engine again and time it until its median is known to ±2 % (no evaluation)",
                                    )
                                    .on_disabled_hover_text("A run is in progress")
                                    .clicked()
                            {
                                retime = Some(i);
                            }
                        });
                        p99_cell_ui(r.latency_ms, ui);
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
                        match (&r.error, &r.non_finite, r.simulated) {
                            (Some(e), _, _) => {
                                ui.colored_label(theme::ERROR, "error").on_hover_text(e);
                            }
                            (None, Some(n), _) => {
                                ui.colored_label(theme::ERROR, "void: NaN/Inf")
                                    .on_hover_text(n.reason());
                            }
                            (None, None, simulated) => match &r.budget {
                                // The mixed-precision row: does the plan hold its budget?
                                Some(b) if !b.met => {
                                    ui.colored_label(theme::ERROR, "budget not met")
                                        .on_hover_text(b.describe());
                                }
                                budget => {
                                    let mut text = vec![];
                                    let mut hover = vec![];
                                    if let Some(b) = budget {
                                        text.push("budget met".to_string());
                                        hover.push(b.describe());
                                    }
                                    if simulated {
                                        text.push("simulated on CPU".to_string());
                                        hover.push("FP16 numerics on CPU: accuracy is real, latency is not an FP16 device's".to_string());
                                    }
                                    if let Some(g) = r.fp32_layers_note() {
                                        text.push(g);
                                        hover.extend(r.fp32_layers.iter().map(|k| {
                                            format!("{} ({}): {}", k.node, k.op, k.reason)
                                        }));
                                    }
                                    // Precision per region: what of this INT8 row ran in FP16.
                                    if let Some(g) = r.fp16_regions_note() {
                                        text.push(g);
                                        hover.extend(
                                            r.fp16_regions.iter().map(|c| c.describe(&r.label())),
                                        );
                                    }
                                    let l = ui.label(text.join(" · "));
                                    if !hover.is_empty() {
                                        l.on_hover_text(hover.join("\n"));
                                    }
                                }
                            },
                        }
                        ui.end_row();
                    }
                });
        });
    retime
}

/// The median cell's tooltip: runs, p90, the median's interval and the load it was timed under.
fn latency_tip(r: &Row) -> String {
    let Some(l) = r.latency_ms else {
        return String::new();
    };
    let mut t = format!("{} runs, p90 {:.2} ms", l.runs, l.p90);
    if let Some(c) = l.ci95_rel {
        t.push_str(&format!("; median ±{:.1} % (95 % interval)", c * 100.0));
    }
    if let Some(w) = r.timing_load.and_then(|x| x.warning(&r.label())) {
        t.push_str(&format!("\n{w}"));
    }
    t
}
#[cfg(test)]
mod tests {
    use super::*;

    fn latency(median: f64, p99: f64) -> Latency {
        Latency {
            median,
            p90: median,
            p99,
            runs: 20,
            ..Default::default()
        }
    }

    #[test]
    fn spread_flags_p99_over_one_and_a_half_medians() {
        assert_eq!(timing_spread(&latency(10.0, 14.0)), None);
        let ratio = timing_spread(&latency(10.0, 23.0)).expect("flagged");
        assert!((ratio - 2.3).abs() < 1e-9);
        assert!(spread_warning(&latency(10.0, 23.0), ratio).starts_with("p99 2.3× the median"));
        assert_eq!(timing_spread(&latency(0.0, 1.0)), None);
    }

    /// A VOC-sized report: 21 classes, an INT8 engine 25× slower than FP32 whose repeats
    /// varied (p99 2.3× its median), and a failed row.
    fn stress_workbench() -> Workbench {
        use crate::ui::testing::{sample_report, sample_workbench};
        const VOC: [&str; 21] = [
            "background",
            "aeroplane",
            "bicycle",
            "bird",
            "boat",
            "bottle",
            "bus",
            "car",
            "cat",
            "chair",
            "cow",
            "diningtable",
            "dog",
            "horse",
            "motorbike",
            "person",
            "pottedplant",
            "sheep",
            "sofa",
            "train",
            "tvmonitor",
        ];
        let mut report = sample_report();
        report.evaluation.classes = VOC.iter().map(|s| s.to_string()).collect();
        for (k, row) in report.rows.iter_mut().enumerate() {
            row.per_class_iou = Some(
                (0..VOC.len())
                    .map(|c| {
                        (c != 5 || k == 0).then_some(0.3 + 0.03 * ((c * 7 + k * 3) % 21) as f64)
                    })
                    .collect(),
            );
        }
        report.rows[2].latency_ms = Some(Latency {
            median: 750.0,
            p90: 900.0,
            p99: 1725.0,
            runs: 20,
            ..Default::default()
        });
        let mut failed = report.rows[3].clone();
        failed.method = Some(crate::calib::Method::Mse);
        failed.error = Some("engine build failed".into());
        report.rows.push(failed);
        let mut wb = sample_workbench();
        wb.set_results(report, None);
        wb
    }

    #[test]
    fn unsteady_timing_is_flagged_in_the_table() {
        use egui_kittest::kittest::Queryable;
        let mut h = egui_kittest::Harness::builder()
            .with_size(egui::vec2(1400.0, 900.0))
            .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), stress_workbench());
        h.run();
        h.get_by_label_contains("unsteady timing: p99 2.3× the median over 20 runs");
        assert_eq!(h.get_all_by_label_contains("unsteady timing").count(), 1);
    }
}
