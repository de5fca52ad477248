//! The Layers tab's "Where the time goes": one engine's per-layer times (batch 1: the CUDA
//! engine's each layer's share of the run, measured as it is built; the CPU engine's measured
//! after the latency runs), summed by precision (where the engine says which precision each
//! layer ran in and why: an INT8 engine's layers run in FP16 because that timed faster, because
//! their region ran faster in FP16, or because the Q/DQ plan leaves them float) and by op kind,
//! and listed slowest first, so a latency in Compare comes with the ops that explain it.

use eframe::egui;

use super::compare::engine_name;
use crate::backend::LayerTime;
use crate::report::Row;
use crate::ui::Workbench;

/// Layers listed, slowest first.
const SLOWEST: usize = 12;
/// Op kinds listed, most time first.
const KINDS: usize = 10;

/// Time by op kind: `(kind, total ms, layers)`, most time first.
pub fn by_kind(times: &[LayerTime]) -> Vec<(String, f64, usize)> {
    sum_by(times, |t| Some(t.kernel.as_str()))
}

/// Time by the precision each layer ran in (layers without one left out), most time first.
/// What follows a colon is the layer's own detail ("fp16 region: INT8 was 1.31x slower for
/// this region"), summed under the words before it.
pub fn by_precision(times: &[LayerTime]) -> Vec<(String, f64, usize)> {
    sum_by(times, |t| {
        t.precision
            .as_deref()
            .map(|p| p.split(':').next().unwrap_or(p))
    })
}

/// `(key, total ms, layers)` over the layers `key` gives one for, most time first.
fn sum_by(
    times: &[LayerTime],
    key: impl Fn(&LayerTime) -> Option<&str>,
) -> Vec<(String, f64, usize)> {
    let mut sums: Vec<(String, f64, usize)> = vec![];
    for t in times {
        let Some(k) = key(t) else { continue };
        match sums.iter_mut().find(|(s, ..)| s == k) {
            Some((_, ms, n)) => {
                *ms += t.time_ms;
                *n += 1;
            }
            None => sums.push((k.to_string(), t.time_ms, 1)),
        }
    }
    sums.sort_by(|a, b| b.1.total_cmp(&a.1));
    sums
}

/// The section, when some engine of the current results has per-layer times.
pub fn times_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let rows: Vec<&Row> = wb
        .results
        .rows()
        .iter()
        .filter(|r| !r.layer_times.is_empty())
        .collect();
    if rows.is_empty() {
        return;
    }
    let names: Vec<String> = rows.iter().map(|r| engine_name(r)).collect();
    let chosen = wb
        .layers
        .time_engine
        .as_ref()
        .and_then(|n| names.iter().position(|m| m == n))
        .unwrap_or(0);
    let mut pick = chosen;
    let selected_node = wb.selected_node.clone();
    let mut select = None;
    egui::CollapsingHeader::new("Where the time goes")
        .id_salt("layers.times")
        .default_open(true)
        .show(ui, |ui| {
            let r = rows[chosen];
            ui.horizontal_wrapped(|ui| {
                egui::ComboBox::new("layers.times.engine", "engine")
                    .selected_text(&names[chosen])
                    .show_ui(ui, |ui| {
                        for (k, n) in names.iter().enumerate() {
                            ui.selectable_value(&mut pick, k, n);
                        }
                    });
                let total: f64 = r.layer_times.iter().map(|t| t.time_ms).sum();
                let mut text = format!(
                    "{} layers, {total:.2} ms summed ({})",
                    r.layer_times.len(),
                    match r.layer_times_in_run {
                        true => "each layer's share of the run",
                        false => "each layer's median over its profiled runs",
                    }
                );
                if let Some(l) = &r.latency_ms {
                    text.push_str(&format!("; the engine's median latency {:.2} ms", l.median));
                }
                text.push_str(&format!(", {}", r.backend));
                if let Some(t) = r.threads {
                    text.push_str(&format!(", {t} thread{}", if t == 1 { "" } else { "s" }));
                }
                ui.label(text).on_hover_text(match r.layer_times_in_run {
                    true => "Measured by the backend while it built the engine, batch 1: each layer's share of the run (the graph up to it timed less the graph before it), so the times sum to the run's",
                    false => "Measured by the backend after the latency runs, batch 1. The sum can differ from the latency: each layer is timed apart from the others",
                });
            });
            let total: f64 = r.layer_times.iter().map(|t| t.time_ms).sum::<f64>().max(1e-9);
            let precisions = by_precision(&r.layer_times);
            if !precisions.is_empty() {
                ui.strong("by precision").on_hover_text(
                    "The precision each layer computed in. In an INT8 engine a layer runs in FP16 where the builder timed that faster than its int8 implementations, where its region ran faster in FP16 than in INT8 (\"fp16 region\": hover a layer for how much), or where the Q/DQ plan leaves it in float; \"data\" marks steps that only move or combine values of that type",
                );
                egui::Grid::new("layers.times.precisions")
                    .striped(true)
                    .show(ui, |ui| {
                        for (p, ms, n) in precisions {
                            ui.label(p);
                            ui.label(format!("{n}×"));
                            share_ui(ui, ms, total);
                            ui.end_row();
                        }
                    });
            }
            ui.columns(2, |cols| {
                cols[0].strong("by op");
                egui::Grid::new("layers.times.kinds")
                    .striped(true)
                    .show(&mut cols[0], |ui| {
                        for (kind, ms, n) in by_kind(&r.layer_times).into_iter().take(KINDS) {
                            ui.label(kind);
                            ui.label(format!("{n}×"));
                            share_ui(ui, ms, total);
                            ui.end_row();
                        }
                    });
                cols[1].strong(format!("slowest {SLOWEST} layers"));
                let mut slowest: Vec<&LayerTime> = r.layer_times.iter().collect();
                slowest.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
                egui::Grid::new("layers.times.slowest")
                    .striped(true)
                    .show(&mut cols[1], |ui| {
                        for t in slowest.into_iter().take(SLOWEST) {
                            // A fused step ("conv+relu") selects its first node.
                            let node = t.layer.split('+').next().unwrap_or(&t.layer);
                            let selected = selected_node.as_deref() == Some(node);
                            if ui
                                .selectable_label(selected, short(&t.layer, 30, true))
                                .on_hover_text(format!(
                                    "{}: click to select it here and in the Graph tab",
                                    t.layer
                                ))
                                .clicked()
                            {
                                select = Some(node.to_string());
                            }
                            let hover = match &t.precision {
                                Some(p) => format!("{} ({p})", t.kernel),
                                None => t.kernel.clone(),
                            };
                            ui.weak(short(&t.kernel, 16, false)).on_hover_text(hover);
                            share_ui(ui, t.time_ms, total);
                            ui.end_row();
                        }
                    });
            });
        });
    if pick != chosen {
        wb.layers.time_engine = Some(names[pick].clone());
    }
    if let Some(n) = select {
        wb.push(crate::ui::Command::SelectNode(n));
    }
}

/// `ms` and its share of `total` as a bar.
fn share_ui(ui: &mut egui::Ui, ms: f64, total: f64) {
    let share = (ms / total).clamp(0.0, 1.0) as f32;
    ui.add(
        egui::ProgressBar::new(share)
            .desired_width(110.0)
            .text(format!("{ms:.2} ms · {:.0} %", share * 100.0)),
    );
}

/// `s` cut to `max` characters. Layer names (`keep_end`) keep both ends, the middle elided:
/// they differ at the end, and their start says which block they are in. Op names keep their
/// start, where they differ.
pub(super) fn short(s: &str, max: usize, keep_end: bool) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    if keep_end {
        let tail_len = (max - 1) * 2 / 3;
        let head: String = s.chars().take(max - 1 - tail_len).collect();
        let tail: String = s.chars().skip(n - tail_len).collect();
        format!("{head}…{tail}")
    } else {
        let head: String = s.chars().take(max - 1).collect();
        format!("{head}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_by_kind_sums_and_sorts() {
        let t = |layer: &str, kernel: &str, time_ms| LayerTime {
            layer: layer.into(),
            kernel: kernel.into(),
            time_ms,
            precision: None,
        };
        let kinds = by_kind(&[
            t("a", "Conv", 1.0),
            t("b", "Requantize", 0.5),
            t("c", "Conv", 2.0),
            t("d", "Resize", 2.5),
        ]);
        assert_eq!(
            kinds,
            vec![
                ("Conv".to_string(), 3.0, 2),
                ("Resize".to_string(), 2.5, 1),
                ("Requantize".to_string(), 0.5, 1)
            ]
        );
        assert_eq!(short("abcdef", 4, true), "a…ef");
        assert_eq!(
            short("/backbone/layer3/block2/conv1/Conv", 20, true),
            "/backbo…2/conv1/Conv"
        );
        assert_eq!(short("abcdef", 4, false), "abc…");
        assert_eq!(short("abc", 4, true), "abc");
    }

    #[test]
    fn time_by_precision_leaves_out_layers_without_one() {
        let t = |p: Option<&str>, time_ms| LayerTime {
            layer: "l".into(),
            kernel: "k".into(),
            time_ms,
            precision: p.map(String::from),
        };
        let p = by_precision(&[
            t(Some("int8"), 1.0),
            t(Some("fp16, timed faster than int8"), 0.5),
            t(None, 9.0),
            t(Some("int8"), 1.0),
            t(
                Some("fp16 region: INT8 was 1.20x slower for this region"),
                0.25,
            ),
            t(
                Some("fp16 region: INT8 was 1.50x slower for this region"),
                0.125,
            ),
        ]);
        assert_eq!(
            p,
            vec![
                ("int8".to_string(), 2.0, 2),
                ("fp16, timed faster than int8".to_string(), 0.5, 1),
                ("fp16 region".to_string(), 0.375, 2)
            ]
        );
    }
}
