//! The Compare tab's charts, which read without the table: latency (log axis, p99 whiskers),
//! memory (weights and activations stacked), the task metric as Δ vs FP32, and per-class IoU
//! (or accuracy) with one row of bars per class. Every bar carries its number; the legend sits
//! above the charts, in table order.

use eframe::egui;
use egui_plot::{
    AxisHints, Bar, BarChart, GridInput, GridMark, HLine, Line, Plot, PlotPoint, PlotPoints, Text,
};

use super::{MIB, fp32_metric, paint_warning, spread_warning, timing_spread};
use crate::backend::Precision;
use crate::bench::Latency;
use crate::report::Row;
use crate::ui::theme;

/// Font size of the numbers drawn on bars: smaller than body text so they fit above narrow
/// bars, large enough to read on a screenshot.
const VALUE_PT: f32 = 11.0;

/// The plot's minimum grid spacing in points; the log-axis spacer uses it to turn the plot's
/// `base_step_size` back into points per decade.
const GRID_MIN_PX: f32 = 8.0;

/// Width of the y axis (tick labels and title) of the per-engine charts.
const ENGINE_Y_AXIS_PX: f32 = 54.0;

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

/// The engine's name under its bar: precision on one line, method (or "sim.") on the next, so
/// that five engines fit side by side in a third of the window.
fn axis_name(r: &Row) -> String {
    let p = r
        .precision
        .map(|p| p.name().to_uppercase())
        .unwrap_or_else(|| "?".into());
    match r.method {
        Some(m) if !r.kept_float.is_empty() => {
            format!("{p}\n{} +{}f", m.name(), r.kept_float.len())
        }
        Some(m) => format!("{p}\n{}", m.name()),
        None if r.simulated => format!("{p}\n(sim.)"),
        None if r.tf32 => format!("{p}\n(tf32)"),
        None => p,
    }
}

/// A value with about three significant digits (0.83, 13.0, 245): enough to compare bars,
/// short enough to sit above a narrow one.
fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A log-axis tick turned back into milliseconds, without trailing zeros (0.5, 2, 50, 1000).
fn fmt_tick(ms: f64) -> String {
    let s = format!("{ms:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The largest 1-2-5 number at or below `v` (v > 0): where the latency bars start.
fn nice_floor(v: f64) -> f64 {
    let decade = 10f64.powf(v.log10().floor());
    [5.0, 2.0, 1.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|&x| x <= v * (1.0 + 1e-9))
        .unwrap_or(decade)
}

/// A class name cut to `max` characters: ADE20K-style names ("chest of drawers, chest,
/// bureau, dresser") would otherwise take half the chart's width.
fn abbreviate(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        name.to_string()
    } else {
        let head: String = name.chars().take(max.saturating_sub(1)).collect();
        format!("{}…", head.trim_end())
    }
}

fn value_text(s: impl Into<String>) -> egui::RichText {
    egui::RichText::new(s).size(VALUE_PT)
}

/// The name at an integer axis position, empty between them.
fn index_label(names: &[String], value: f64) -> String {
    let i = value.round();
    if (value - i).abs() < 1e-6 && i >= 0.0 {
        names.get(i as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// One grid mark per bar (or per class): those tick labels are names, not numbers, so the
/// default spacer's 0.5 steps would only add blanks and its wide steps would skip names.
fn index_marks(input: GridInput) -> Vec<GridMark> {
    let (lo, hi) = input.bounds;
    if !(lo.is_finite() && hi.is_finite()) || hi < lo {
        return Vec::new();
    }
    let first = lo.ceil().max(0.0) as i64;
    let last = hi.floor() as i64;
    (first..=last)
        .take(10_000)
        .map(|i| GridMark {
            value: i as f64,
            step_size: 1.0,
        })
        .collect()
}

/// The smallest distance, in decades, between neighbouring ticks of a 1-2-5 style set.
fn min_gap_decades(set: &[f64]) -> f64 {
    set.iter()
        .zip(set.iter().skip(1).chain(std::iter::once(&10.0)))
        .map(|(a, b)| (b / a).log10())
        .fold(f64::INFINITY, f64::min)
}

/// Grid marks for a log10 axis at round milliseconds: 1-1.5-2-3-5-7 when the axis spans under
/// a decade, 1-2-5 or powers of ten when it spans more, whichever keeps labels ≥ 24 points
/// apart.
fn log_marks(input: GridInput) -> Vec<GridMark> {
    let (lo, hi) = input.bounds;
    // Before the first layout the bounds can be anything: draw nothing rather than thousands.
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo || hi - lo > 30.0 {
        return Vec::new();
    }
    if input.base_step_size <= 0.0 {
        return Vec::new();
    }
    let px_per_decade = f64::from(GRID_MIN_PX) / input.base_step_size;
    const SETS: [&[f64]; 3] = [&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0], &[1.0, 2.0, 5.0], &[1.0]];
    let set: &[f64] = SETS
        .into_iter()
        .find(|set| min_gap_decades(set) * px_per_decade >= 24.0)
        .unwrap_or(&[1.0]);
    let step_size = min_gap_decades(set);
    let mut marks = Vec::new();
    for k in (lo.floor() as i64)..=(hi.ceil() as i64) {
        for m in set {
            let value = k as f64 + m.log10();
            if (lo..=hi).contains(&value) {
                marks.push(GridMark { value, step_size });
            }
        }
    }
    marks
}

fn swatch_ui(ui: &mut egui::Ui, color: egui::Color32) {
    let (rect, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
    ui.painter().rect_filled(rect, 2.0, color);
}

/// The engines' colours in table order, drawn above the charts so that no legend covers a
/// bar; failed rows are named so that a missing bar is not a mystery.
fn legend_ui(rows: &[Row], ui: &mut egui::Ui) {
    ui.horizontal_wrapped(|ui| {
        ui.weak("Engines, in table order:");
        for r in rows {
            ui.add_space(6.0);
            let name = axis_name(r).replace('\n', " ");
            if r.non_finite.is_some() {
                ui.weak(format!("{name} (NaN/Inf outputs, not charted)"));
            } else if r.error.is_some() {
                ui.weak(format!("{name} (failed, not charted)"));
            } else {
                swatch_ui(ui, theme::row_color(r));
                ui.label(name);
            }
        }
    });
}

/// A chart's title and a one-line key to what its bars, numbers and whiskers mean.
/// Every chart's header is a title and two short key lines, so that side-by-side charts
/// start at the same height and no line runs into the next column.
fn chart_header_ui(ui: &mut egui::Ui, title: &str, key: [&str; 2]) {
    ui.label(egui::RichText::new(title).strong());
    for line in key {
        key_ui(ui, line);
    }
    header_gap_ui(ui);
}

/// The gap under a header: the top tick label of a plot sticks out above its frame.
fn header_gap_ui(ui: &mut egui::Ui) {
    ui.add_space(6.0);
}

fn key_ui(ui: &mut egui::Ui, text: &str) {
    key_row_ui(ui, |ui| {
        ui.label(egui::RichText::new(text).size(VALUE_PT).weak());
    });
}

/// One key line of a fixed height, whatever it holds (text, swatches, a warning triangle), so
/// that headers of the same number of lines are the same height.
fn key_row_ui(ui: &mut egui::Ui, add: impl FnOnce(&mut egui::Ui)) {
    let size = egui::vec2(ui.available_width(), VALUE_PT + 5.0);
    ui.allocate_ui_with_layout(
        size,
        egui::Layout::left_to_right(egui::Align::Center),
        |ui| {
            ui.set_height(size.y);
            ui.spacing_mut().item_spacing.x = 4.0;
            add(ui);
        },
    );
}

/// A bar chart with one bar per engine, named on the x axis.
fn engine_chart<'a>(id: &str, y_label: &str, height: f32, names: Vec<String>) -> Plot<'a> {
    let n = names.len();
    let x_axis = AxisHints::new_x()
        .formatter(move |mark, _| index_label(&names, mark.value))
        // The default hides labels closer than 60 points; ours are one per bar and two lines
        // tall, so each fits its slot (a label wider than its slot is still skipped).
        .label_spacing(10.0..=11.0);
    crate::ui::results::fixed_plot(id, height)
        .custom_x_axes(vec![x_axis])
        .x_grid_spacer(index_marks)
        // Vertical grid lines would run through the middle of every bar.
        .show_grid([false, true])
        .include_x(-0.5)
        .include_x(n as f64 - 0.5)
        .y_axis_label(y_label.to_string())
        // Wide enough for "1000" or "-10.0" beside the axis title from the first frame on:
        // the plot only widens an axis a frame after its labels overflowed, and a screenshot
        // may be taken before that.
        .y_axis_min_width(ENGINE_Y_AXIS_PX)
}

pub(super) fn charts_ui(rows: &[Row], seg: bool, classes: &[String], ui: &mut egui::Ui) {
    let ok: Vec<&Row> = rows.iter().filter(|r| !r.failed()).collect();
    if ok.is_empty() {
        return;
    }
    legend_ui(rows, ui);
    ui.add_space(4.0);
    let names: Vec<String> = ok.iter().map(|r| axis_name(r)).collect();
    let reference = fp32_metric(rows);
    let height = 230.0;
    // Three across while every engine's name fits under its bar (the plot skips a tick label
    // wider than its slot); otherwise each chart takes the full width.
    let font = egui::TextStyle::Body.resolve(ui.style());
    let widest_name_px = names
        .iter()
        .flat_map(|n| n.lines())
        .map(|line| {
            ui.painter()
                .layout_no_wrap(line.to_string(), font.clone(), egui::Color32::WHITE)
                .size()
                .x
        })
        .fold(0.0, f32::max);
    let slot_px = (ui.available_width() / 3.0 - ENGINE_Y_AXIS_PX - 24.0) / ok.len() as f32;
    if slot_px >= widest_name_px + 6.0 {
        ui.columns(3, |cols| {
            latency_ui(&ok, &names, height, &mut cols[0]);
            memory_ui(&ok, &names, height, &mut cols[1]);
            metric_ui(&ok, seg, reference, &names, height, &mut cols[2]);
        });
    } else {
        latency_ui(&ok, &names, height, ui);
        ui.add_space(6.0);
        memory_ui(&ok, &names, height, ui);
        ui.add_space(6.0);
        metric_ui(&ok, seg, reference, &names, height, ui);
    }
    per_class_ui(&ok, seg, classes, ui);
}

/// Median latency as bars on a log10 axis, whiskers to p99. A log axis keeps a 25× slower
/// engine from flattening the others into slivers; the numbers above the bars carry the exact
/// values, and a warning triangle marks rows whose repeats varied a lot.
fn latency_ui(ok: &[&Row], names: &[String], height: f32, ui: &mut egui::Ui) {
    let timed: Vec<(usize, &Row, Latency)> = ok
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let l = r.latency_ms?;
            (l.median > 0.0 && l.median.is_finite()).then_some((i, *r, l))
        })
        .collect();
    ui.label(egui::RichText::new("Latency at batch 1 (ms, log scale)").strong());
    key_ui(ui, "bar and number: median; whisker: p99");
    if timed.iter().any(|(_, _, l)| timing_spread(l).is_some()) {
        key_row_ui(ui, |ui| {
            let (rect, _) =
                ui.allocate_exact_size(egui::vec2(VALUE_PT, VALUE_PT), egui::Sense::hover());
            paint_warning(ui.painter(), rect.center(), VALUE_PT);
            ui.label(
                egui::RichText::new("p99 over 1.5× median: rerun")
                    .size(VALUE_PT)
                    .weak(),
            );
        });
    } else {
        key_ui(ui, "repeats steady (p99 ≤ 1.5× median)");
    }
    header_gap_ui(ui);
    let lo_ms = timed
        .iter()
        .map(|t| t.2.median)
        .fold(f64::INFINITY, f64::min);
    let hi_ms = timed
        .iter()
        .map(|t| t.2.p99.max(t.2.median))
        .fold(0.0, f64::max);
    if timed.is_empty() || !lo_ms.is_finite() || !hi_ms.is_finite() {
        ui.weak("No engine was timed.");
        return;
    }
    let (lo, hi) = (lo_ms.log10(), hi_ms.log10());
    let span = hi - lo;
    // On a log axis a bar cannot start at zero: start below the fastest engine, far enough
    // that its bar is still a bar, at a round number so the axis starts on a tick.
    let base = nice_floor(10f64.powf(lo - (0.25 * span).max(0.2))).log10();
    // Room above the tallest whisker for its number.
    let top = hi + 0.2 * (hi - base);
    let pad = 0.03 * (top - base);
    let tips: Vec<String> = ok
        .iter()
        .map(|r| match r.latency_ms {
            Some(l) => {
                let mut tip = format!(
                    "{}: median {:.2} ms, p90 {:.2} ms, p99 {:.2} ms over {} runs",
                    short_name(r),
                    l.median,
                    l.p90,
                    l.p99,
                    l.runs
                );
                if let Some(ratio) = timing_spread(&l) {
                    tip.push_str("\nWarning: ");
                    tip.push_str(&spread_warning(&l, ratio));
                }
                tip
            }
            None => format!("{}: not timed", short_name(r)),
        })
        .collect();
    let response = engine_chart("chart.latency", "ms (log)", height, names.to_vec())
        .y_grid_spacer(log_marks)
        .grid_spacing(GRID_MIN_PX..=300.0)
        .y_axis_formatter(|mark, _| fmt_tick(10f64.powf(mark.value)))
        .include_y(base)
        .include_y(top)
        .show(ui, |p| {
            let text_color = p.ctx().global_style().visuals.text_color();
            let bars: Vec<Bar> = timed
                .iter()
                .map(|(i, r, l)| {
                    Bar::new(*i as f64, l.median.log10() - base)
                        .base_offset(base)
                        .name(short_name(r))
                        .fill(theme::row_color(r))
                        .width(0.6)
                })
                .collect();
            p.bar_chart(BarChart::new("median ms", bars).element_formatter(Box::new(
                move |bar, _| {
                    tips.get(bar.argument.round() as usize)
                        .cloned()
                        .unwrap_or_default()
                },
            )));
            for (i, _, l) in &timed {
                let x = *i as f64;
                let spread = timing_spread(l);
                let color = if spread.is_some() {
                    theme::WARN
                } else {
                    text_color
                };
                let (median, p99) = (l.median.log10(), l.p99.max(l.median).log10());
                p.line(
                    Line::new(
                        format!("p99 {i}"),
                        PlotPoints::from(vec![[x, median], [x, p99]]),
                    )
                    .color(color)
                    .allow_hover(false),
                );
                p.line(
                    Line::new(
                        format!("p99 cap {i}"),
                        PlotPoints::from(vec![[x - 0.15, p99], [x + 0.15, p99]]),
                    )
                    .color(color)
                    .allow_hover(false),
                );
                p.text(
                    Text::new(
                        format!("latency value {i}"),
                        PlotPoint::new(x, p99 + pad),
                        value_text(fmt_value(l.median)).color(color),
                    )
                    .anchor(egui::Align2::CENTER_BOTTOM)
                    .allow_hover(false),
                );
            }
        });
    // The warning triangles go beside the numbers, in screen space: a plot item cannot be
    // sized in points.
    let painter = ui.painter_at(response.response.rect);
    for (i, _, l) in &timed {
        if timing_spread(l).is_none() {
            continue;
        }
        let p99 = l.p99.max(l.median).log10();
        let at = response
            .transform
            .position_from_point(&PlotPoint::new(*i as f64, p99 + pad));
        let galley = painter.layout_no_wrap(
            fmt_value(l.median),
            egui::FontId::proportional(VALUE_PT),
            theme::WARN,
        );
        let size = galley.size();
        paint_warning(
            &painter,
            at + egui::vec2(-size.x / 2.0 - 8.0, -size.y / 2.0),
            VALUE_PT,
        );
    }
}

/// Weights and activations stacked per engine, each part and the total written on the bar.
fn memory_ui(ok: &[&Row], names: &[String], height: f32, ui: &mut egui::Ui) {
    let weights_color = egui::Color32::from_rgb(70, 130, 200);
    let acts_color = egui::Color32::from_rgb(230, 160, 60);
    ui.label(egui::RichText::new("Memory (MiB)").strong());
    key_row_ui(ui, |ui| {
        swatch_ui(ui, weights_color);
        ui.label(egui::RichText::new("weights").size(VALUE_PT).weak());
        ui.add_space(4.0);
        swatch_ui(ui, acts_color);
        ui.label(egui::RichText::new("activations").size(VALUE_PT).weak());
    });
    key_ui(ui, "number on top: the total");
    header_gap_ui(ui);
    let mib: Vec<Option<(f64, f64)>> = ok
        .iter()
        .map(|r| {
            r.memory_bytes
                .as_ref()
                .map(|m| (m.weights as f64 / MIB, m.activations as f64 / MIB))
        })
        .collect();
    let max_total = mib.iter().flatten().map(|(w, a)| w + a).fold(0.0, f64::max);
    let span = if max_total > 0.0 { max_total } else { 1.0 };
    let pad = 0.03 * span;
    engine_chart("chart.memory", "MiB", height, names.to_vec())
        .include_y(0.0)
        // Room above the tallest stack for its total.
        .include_y(span * 1.15)
        .show(ui, |p| {
            // One bar per engine for one part of the stack (0: weights, 1: activations).
            let part = |k: usize, what: &str| -> Vec<Bar> {
                mib.iter()
                    .enumerate()
                    .filter_map(|(i, m)| {
                        let (w, a) = (*m)?;
                        Some(
                            Bar::new(i as f64, [w, a][k])
                                .name(format!("{} {what}", short_name(ok[i])))
                                .width(0.6),
                        )
                    })
                    .collect()
            };
            let (w, a) = (part(0, "weights"), part(1, "activations"));
            let weights = BarChart::new("weights", w).color(weights_color);
            let acts = BarChart::new("activations", a)
                .color(acts_color)
                .stack_on(&[&weights]);
            p.bar_chart(weights);
            p.bar_chart(acts);
            for (i, m) in mib.iter().enumerate() {
                let x = i as f64;
                let Some((w, a)) = *m else {
                    p.text(
                        Text::new(
                            format!("memory value {i}"),
                            PlotPoint::new(x, pad),
                            value_text("n/a").weak(),
                        )
                        .anchor(egui::Align2::CENTER_BOTTOM)
                        .allow_hover(false),
                    );
                    continue;
                };
                p.text(
                    Text::new(
                        format!("memory total {i}"),
                        PlotPoint::new(x, w + a + pad),
                        value_text(fmt_value(w + a)),
                    )
                    .anchor(egui::Align2::CENTER_BOTTOM)
                    .allow_hover(false),
                );
                // A part's own number only where the part is tall enough to hold it.
                for (k, (value, mid)) in [(w, w / 2.0), (a, w + a / 2.0)].into_iter().enumerate() {
                    if value >= 0.12 * span {
                        p.text(
                            Text::new(
                                format!("memory part {i} {k}"),
                                PlotPoint::new(x, mid),
                                value_text(fmt_value(value)),
                            )
                            .allow_hover(false),
                        );
                    }
                }
            }
        });
}

/// The task metric as the change against FP32, in points (FP32 itself at 0, its absolute value
/// in the title); without an FP32 row, the absolute values.
fn metric_ui(
    ok: &[&Row],
    seg: bool,
    reference: Option<f64>,
    names: &[String],
    height: f32,
    ui: &mut egui::Ui,
) {
    let metric = if seg { "mIoU" } else { "top-1" };
    match reference {
        Some(f) => chart_header_ui(
            ui,
            &format!("{metric} Δ vs FP32 (FP32 = {:.2} %)", f * 100.0),
            [
                "points against FP32 (0 = same as FP32)",
                "number: the change",
            ],
        ),
        None => chart_header_ui(
            ui,
            &format!("{metric} (%)"),
            ["no FP32 row to compare with:", "absolute values"],
        ),
    }
    let values: Vec<(usize, &Row, f64, f64)> = ok
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let m = r.metric()?;
            let shown = match reference {
                Some(f) => (m - f) * 100.0,
                None => m * 100.0,
            };
            Some((i, *r, m, shown))
        })
        .collect();
    let lo = values.iter().map(|v| v.3).fold(0.0, f64::min);
    let hi = values.iter().map(|v| v.3).fold(0.0, f64::max);
    // A floor on the range: with every Δ at 0.00 the axis would otherwise be degenerate.
    let span = (hi - lo).max(if reference.is_some() { 1.0 } else { 10.0 });
    let pad = 0.03 * span;
    let y_label = if reference.is_some() {
        "Δ points"
    } else {
        "%"
    };
    let tips: Vec<String> = ok
        .iter()
        .map(|r| match (r.metric(), reference) {
            (Some(m), Some(f)) => format!(
                "{}: {metric} {:.2} % ({:+.2} points vs FP32)",
                short_name(r),
                m * 100.0,
                (m - f) * 100.0
            ),
            (Some(m), None) => format!("{}: {metric} {:.2} %", short_name(r), m * 100.0),
            (None, _) => format!("{}: not evaluated", short_name(r)),
        })
        .collect();
    let mut plot = engine_chart("chart.metric", y_label, height, names.to_vec())
        .include_y(0.0)
        .include_y(hi + 0.18 * span);
    if reference.is_some() {
        plot = plot.include_y(lo - 0.18 * span);
    }
    plot.show(ui, |p| {
        let text_color = p.ctx().global_style().visuals.text_color();
        let bars: Vec<Bar> = values
            .iter()
            .map(|(i, r, _, shown)| {
                Bar::new(*i as f64, *shown)
                    .name(short_name(r))
                    .fill(theme::row_color(r))
                    .width(0.6)
            })
            .collect();
        p.bar_chart(
            BarChart::new(metric, bars).element_formatter(Box::new(move |bar, _| {
                tips.get(bar.argument.round() as usize)
                    .cloned()
                    .unwrap_or_default()
            })),
        );
        if reference.is_some() {
            p.hline(HLine::new("FP32 level", 0.0).color(text_color).width(1.0));
        }
        for (i, r, _, shown) in &values {
            let x = *i as f64;
            let is_ref = reference.is_some() && r.precision == Some(Precision::Fp32);
            let (label, color) = match reference {
                _ if is_ref => ("0 (ref.)".to_string(), text_color),
                Some(_) => (format!("{shown:+.2}"), theme::delta_color(*shown)),
                None => (format!("{shown:.2}"), text_color),
            };
            let (y, anchor) = if *shown < 0.0 {
                (shown - pad, egui::Align2::CENTER_TOP)
            } else {
                (shown + pad, egui::Align2::CENTER_BOTTOM)
            };
            p.text(
                Text::new(
                    format!("metric value {i}"),
                    PlotPoint::new(x, y),
                    value_text(label).color(color),
                )
                .anchor(anchor)
                .allow_hover(false),
            );
        }
    });
}

/// Per-class IoU (or accuracy), one horizontal group of bars per class: class names sit on the
/// y axis where they have room (21 VOC classes, 150 ADE20K ones), and each bar's number beside
/// its end. The chart grows with the classes; the tab scrolls.
fn per_class_ui(ok: &[&Row], seg: bool, classes: &[String], ui: &mut egui::Ui) {
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
    if n_classes == 0 {
        return;
    }
    let class_names: Vec<String> = (0..n_classes)
        .map(|c| {
            classes
                .get(c)
                .map(|s| abbreviate(s, 18))
                .unwrap_or_else(|| format!("class {c}"))
        })
        .collect();
    ui.add_space(10.0);
    chart_header_ui(
        ui,
        if seg {
            "Per-class IoU % by engine"
        } else {
            "Per-class accuracy % by engine"
        },
        [
            "one group per class, engines top to bottom in table order",
            "number: the value",
        ],
    );
    let rows: Vec<Row> = per_class.iter().map(|(r, _)| (*r).clone()).collect();
    legend_ui(&rows, ui);
    let k = per_class.len();
    // Each bar is as thick as its number is tall, so every value can be written beside it.
    let bar_px = VALUE_PT + 4.0;
    let fill = 0.84;
    let class_px = k as f32 * bar_px / fill as f32;
    // 40 points for the x axis and its title.
    let height = n_classes as f32 * class_px + 40.0;
    let label_font = egui::TextStyle::Body.resolve(ui.style());
    let axis_px = class_names
        .iter()
        .map(|s| {
            ui.painter()
                .layout_no_wrap(s.clone(), label_font.clone(), egui::Color32::WHITE)
                .size()
                .x
        })
        .fold(0.0, f32::max)
        + 12.0;
    let y_axis = AxisHints::new_y()
        .formatter(move |mark, _| index_label(&class_names, mark.value))
        .label_spacing(10.0..=11.0)
        .min_thickness(axis_px);
    let width = fill / k as f64;
    let metric = if seg { "IoU %" } else { "accuracy %" };
    crate::ui::results::fixed_plot("chart.per_class", height)
        .custom_y_axes(vec![y_axis])
        .y_grid_spacer(index_marks)
        // Horizontal grid lines would run through the middle of each group.
        .show_grid([true, false])
        // Class 0 at the top, as in the model's class list.
        .invert_y(true)
        .include_x(0.0)
        // Room right of a 100 % bar for its number.
        .include_x(109.0)
        // The default 5 % margin is a whole empty class at 21 classes: keep a sliver instead.
        .set_margin_fraction(egui::vec2(0.0, 0.0))
        .include_y(-0.55)
        .include_y(n_classes as f64 - 0.45)
        .x_axis_label(metric)
        .show(ui, |p| {
            for (j, (r, v)) in per_class.iter().enumerate() {
                let off = -fill / 2.0 + width * (j as f64 + 0.5);
                let name = short_name(r);
                let bars: Vec<Bar> = v
                    .iter()
                    .enumerate()
                    .filter_map(|(c, value)| {
                        Some(
                            Bar::new(c as f64 + off, (*value)? * 100.0)
                                .name(format!("{name} · {}", index_label_or(classes, c)))
                                .width(width),
                        )
                    })
                    .collect();
                p.bar_chart(
                    BarChart::new(name.clone(), bars)
                        .color(theme::row_color(r))
                        .horizontal(),
                );
                for c in 0..n_classes {
                    let y = c as f64 + off;
                    let (x, label) = match v.get(c).copied().flatten() {
                        Some(value) => {
                            (value * 100.0, value_text(format!(" {:.1}", value * 100.0)))
                        }
                        None => (0.0, value_text(" n/a").weak()),
                    };
                    p.text(
                        Text::new(format!("class value {j} {c}"), PlotPoint::new(x, y), label)
                            .anchor(egui::Align2::LEFT_CENTER)
                            .allow_hover(false),
                    );
                }
            }
        });
}

/// A class's full name for hover text (the axis shows it abbreviated).
fn index_label_or(classes: &[String], c: usize) -> String {
    classes
        .get(c)
        .cloned()
        .unwrap_or_else(|| format!("class {c}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_values_read_as_milliseconds() {
        assert_eq!(fmt_tick(10f64.powf(5f64.log10())), "5");
        assert_eq!(fmt_tick(1000.0), "1000");
        assert_eq!(fmt_tick(0.5), "0.5");
        assert_eq!(fmt_value(13.04), "13.0");
        assert_eq!(fmt_value(750.2), "750");
        assert_eq!(fmt_value(0.834), "0.83");
        assert_eq!(nice_floor(9.2), 5.0);
        assert_eq!(nice_floor(10.0), 10.0);
        assert_eq!(nice_floor(0.31), 0.2);
    }

    #[test]
    fn log_marks_thin_out_as_the_axis_spans_more_decades() {
        // 200 points per decade: the dense set.
        let dense = log_marks(GridInput {
            bounds: (1.0, 2.0),
            base_step_size: f64::from(GRID_MIN_PX) / 200.0,
        });
        assert_eq!(dense.len(), 7);
        // 30 points per decade: powers of ten only.
        let sparse = log_marks(GridInput {
            bounds: (0.0, 3.0),
            base_step_size: f64::from(GRID_MIN_PX) / 30.0,
        });
        assert_eq!(sparse.len(), 4);
        assert!(
            log_marks(GridInput {
                bounds: (0.0, 1e9),
                base_step_size: 1.0
            })
            .is_empty()
        );
    }

    #[test]
    fn long_class_names_are_cut() {
        assert_eq!(abbreviate("person", 18), "person");
        let cut = abbreviate("chest of drawers, chest, bureau, dresser", 18);
        assert_eq!(cut.chars().count(), 18);
        assert!(cut.ends_with('…'));
    }
}
