//! The Graph tab: the model drawn as Netron draws it (top to bottom, one box per ONNX node),
//! each box coloured by the precision it ran in on the chosen engine, or by its time or SQNR
//! as a colour ramp; Q/DQ pairs as diamonds on the edges they sit on; a search box, fit to
//! view, wheel zoom and drag pan; a side panel for the selected node. Selecting a node here or
//! in the Layers tab is one `Command::SelectNode`, so both show the same node. The drawing and
//! its layout come from the worker ([`crate::model::diagram`]); this file only draws, and only
//! what is on screen (labels only where they are readable).

pub mod stats;

use std::sync::Arc;

use eframe::egui;
use egui::{Color32, Pos2, Rect, Sense, Stroke, Vec2, vec2};

use super::compare::engine_name;
use super::empty_ui;
use crate::model::diagram::{Diagram, NodeKind};
use crate::ui::{Command, Workbench};
use stats::{EngineStats, NodePrecision, NodeStat};

/// What the boxes are coloured by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overlay {
    #[default]
    Precision,
    TimeMs,
    SqnrDb,
}

impl Overlay {
    const ALL: [Overlay; 3] = [Overlay::Precision, Overlay::TimeMs, Overlay::SqnrDb];

    fn title(self) -> &'static str {
        match self {
            Overlay::Precision => "precision",
            Overlay::TimeMs => "time ms",
            Overlay::SqnrDb => "SQNR dB",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Overlay::Precision => "Colour each node by the precision it ran in on the engine",
            Overlay::TimeMs => {
                "Colour each node by its time in the engine's own profile (batch 1): dark = fast, bright = slow"
            }
            Overlay::SqnrDb => {
                "Colour each node by its isolated SQNR against FP32 from the layer analysis (Layers tab): red = low"
            }
        }
    }
}

/// The tab's view: zoom and pan, the overlay, the engine, the search, the per-engine numbers.
pub struct GraphViewState {
    pub overlay: Overlay,
    /// The engine shown (its name in Compare); the last quantized one when unset.
    pub engine: Option<String>,
    /// Screen points per diagram unit, and where the diagram's origin is from the canvas's
    /// top left, in screen points.
    pub zoom: f32,
    pub pan: Vec2,
    /// The view was placed for the current diagram (first frame: fit, or the top at a
    /// readable zoom).
    pub placed: Option<usize>,
    /// Bring the selected node into view on the next frame (it was selected elsewhere).
    pub reveal: bool,
    /// Fit the whole drawing in the view on the next frame.
    pub fit: bool,
    pub search: String,
    /// Which match Enter in the search box selected last.
    pub search_at: usize,
    stats: Option<(u64, Arc<EngineStats>)>,
}

impl Default for GraphViewState {
    fn default() -> Self {
        GraphViewState {
            overlay: Overlay::Precision,
            engine: None,
            zoom: 1.0,
            pan: Vec2::ZERO,
            placed: None,
            reveal: false,
            fit: false,
            search: String::new(),
            search_at: 0,
            stats: None,
        }
    }
}

/// Below this zoom boxes have no text (it would not be readable); below `EDGE_CURVES_ZOOM`
/// edges are straight lines (far cheaper to tessellate on 1,000 edges).
const LABEL_ZOOM: f32 = 0.3;
const NAME_ZOOM: f32 = 0.55;
const EDGE_CURVES_ZOOM: f32 = 0.3;
/// Margin around the drawing when fitting it, in screen points.
const FIT_MARGIN: f32 = 24.0;
const MIN_ZOOM: f32 = 0.01;
const MAX_ZOOM: f32 = 4.0;
/// Boxes get their own widget (hover text, accessibility, click) up to this many on screen.
const MAX_NODE_WIDGETS: usize = 400;

pub fn precision_color(p: Option<NodePrecision>) -> Color32 {
    match p {
        Some(NodePrecision::Int8) => Color32::from_rgb(100, 160, 235),
        Some(NodePrecision::Fp8) => Color32::from_rgb(70, 195, 195),
        Some(NodePrecision::Fp16) => Color32::from_rgb(130, 205, 120),
        Some(NodePrecision::Fp32) => Color32::from_rgb(242, 172, 85),
        Some(NodePrecision::NotRun) | None => Color32::from_gray(150),
    }
}

const IO_COLOR: Color32 = Color32::from_gray(70);
const TEXT_ON_BOX: Color32 = Color32::from_gray(15);
const NO_VALUE: Color32 = Color32::from_gray(120);
const SELECTED: Color32 = Color32::from_rgb(255, 230, 0);
const MARK: Color32 = Color32::from_rgb(200, 60, 200);

/// `t` in 0..1 along dark blue -> teal -> yellow (time: bright = slow).
fn ramp(t: f32) -> Color32 {
    let stops = [
        (40.0, 60.0, 130.0),
        (40.0, 160.0, 150.0),
        (250.0, 220.0, 60.0),
    ];
    lerp3(stops, t)
}

/// `t` in 0..1 along red -> amber -> green (SQNR: green = high, good).
fn ramp_good(t: f32) -> Color32 {
    let stops = [
        (220.0, 70.0, 60.0),
        (235.0, 190.0, 70.0),
        (90.0, 190.0, 110.0),
    ];
    lerp3(stops, t)
}

fn lerp3(stops: [(f32, f32, f32); 3], t: f32) -> Color32 {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (a, b, u) = if t < 0.5 {
        (stops[0], stops[1], t * 2.0)
    } else {
        (stops[1], stops[2], t * 2.0 - 1.0)
    };
    let l = |x: f32, y: f32| (x + (y - x) * u) as u8;
    Color32::from_rgb(l(a.0, b.0), l(a.1, b.1), l(a.2, b.2))
}

fn fraction(v: f64, range: Option<[f64; 2]>) -> f32 {
    match range {
        Some([lo, hi]) if hi > lo => ((v - lo) / (hi - lo)) as f32,
        _ => 1.0,
    }
}

fn fill(overlay: Overlay, s: &NodeStat, e: &EngineStats) -> Color32 {
    match overlay {
        Overlay::Precision => precision_color(s.precision),
        Overlay::TimeMs => match s.time_ms {
            // Times spread over decades: the ramp follows their square root.
            Some(t) => ramp(fraction(
                t.sqrt(),
                e.time_range_ms.map(|r| r.map(f64::sqrt)),
            )),
            None => NO_VALUE,
        },
        Overlay::SqnrDb => match s.sqnr_isolated_db {
            Some(v) => ramp_good(fraction(v, e.sqnr_range_db)),
            None => NO_VALUE,
        },
    }
}

/// The rows that can be shown, and the one chosen.
fn engine_choice(wb: &Workbench) -> (Vec<String>, Option<usize>) {
    let rows = wb.results.rows();
    let names: Vec<String> = rows.iter().map(engine_name).collect();
    let chosen = wb
        .graph
        .engine
        .as_ref()
        .and_then(|n| names.iter().position(|m| m == n))
        .or_else(|| {
            // The quantized engine is the one worth reading; the last one is usually the
            // mixed-precision or best-calibrated.
            rows.iter()
                .rposition(|r| matches!(r.precision, Some(crate::backend::Precision::Int8)))
        })
        .or(if rows.is_empty() { None } else { Some(0) });
    (names, chosen)
}

/// The numbers of engine `row` for `d`, from the cache when nothing they depend on changed.
fn engine_stats(wb: &mut Workbench, d: &Arc<Diagram>, row: Option<usize>) -> Arc<EngineStats> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (Arc::as_ptr(d) as usize).hash(&mut h);
    row.hash(&mut h);
    wb.results.title.hash(&mut h);
    let rows = wb.results.rows();
    rows.len().hash(&mut h);
    if let Some(r) = row.and_then(|k| rows.get(k)) {
        engine_name(r).hash(&mut h);
        r.layer_times.len().hash(&mut h);
        r.float_nodes.len().hash(&mut h);
        r.kept_float.hash(&mut h);
    }
    wb.results
        .artifacts
        .as_ref()
        .map(|a| a.qdq.len())
        .hash(&mut h);
    wb.layers
        .report
        .as_ref()
        .map(|s| (s.layers.len(), s.elapsed_ms.to_bits()))
        .hash(&mut h);
    wb.exp.exclude.hash(&mut h);
    let key = h.finish();
    if let Some((k, s)) = &wb.graph.stats
        && *k == key
    {
        return s.clone();
    }
    let s = Arc::new(match row.and_then(|k| rows.get(k)) {
        Some(r) => {
            let qdq = wb
                .results
                .artifacts
                .as_ref()
                .and_then(|a| stats::qdq_of(r, &a.qdq));
            stats::engine_stats(d, r, qdq, wb.layers.report.as_ref(), &wb.exp.exclude)
        }
        None => {
            // No run yet: the drawing, with the layer analysis's SQNR where there is one.
            let none = crate::report::Row::default();
            let mut s = stats::engine_stats(d, &none, None, wb.layers.report.as_ref(), &[]);
            for n in &mut s.nodes {
                n.precision = None;
            }
            s
        }
    });
    wb.graph.stats = Some((key, s.clone()));
    s
}

pub fn graph_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let Some(d) = wb.model.diagram.clone() else {
        let text = if let Some(e) = &wb.model.diagram_error {
            format!("The graph could not be drawn: {e}")
        } else if wb.model.diagram_job.is_some() {
            "Laying out the graph…".to_string()
        } else if wb.exp.model.as_os_str().is_empty() {
            "Open a model to see its graph.".to_string()
        } else {
            wb.push(Command::DrawGraph);
            "Laying out the graph…".to_string()
        };
        empty_ui(ui, &text);
        return;
    };
    let (names, chosen) = engine_choice(wb);
    let st = engine_stats(wb, &d, chosen);
    toolbar_ui(wb, ui, &d, &st, &names, chosen);
    legend_ui(wb, ui, &st);
    ui.separator();
    egui::Panel::right("graph.details")
        .resizable(true)
        .default_size(300.0)
        .show(ui, |ui| details_ui(wb, ui, &d, &st));
    canvas_ui(wb, ui, &d, &st);
}

fn toolbar_ui(
    wb: &mut Workbench,
    ui: &mut egui::Ui,
    d: &Diagram,
    st: &EngineStats,
    names: &[String],
    chosen: Option<usize>,
) {
    ui.horizontal_wrapped(|ui| {
        if let Some(c) = chosen {
            let mut pick = c;
            egui::ComboBox::new("graph.engine", "engine")
                .selected_text(&names[c])
                .show_ui(ui, |ui| {
                    for (k, n) in names.iter().enumerate() {
                        ui.selectable_value(&mut pick, k, n);
                    }
                })
                .response
                .on_hover_text("The engine whose precisions, times and Q/DQ marks are drawn");
            if pick != c {
                wb.graph.engine = Some(names[pick].clone());
            }
        } else {
            ui.weak("no run yet: the model as it is");
        }
        ui.separator();
        ui.label("colour by");
        for o in Overlay::ALL {
            ui.selectable_value(&mut wb.graph.overlay, o, o.title())
                .on_hover_text(o.help());
        }
        ui.separator();
        let find = ui.label("Find:");
        let search = ui
            .add(
                egui::TextEdit::singleline(&mut wb.graph.search)
                    .hint_text("find a node")
                    .desired_width(180.0),
            )
            .labelled_by(find.id)
            .on_hover_text("A node's name or op type; Enter selects the next match");
        let needle = wb.graph.search.trim().to_lowercase();
        if !needle.is_empty() {
            let hits: Vec<usize> = d
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| {
                    n.kind == NodeKind::Op
                        && (n.name.to_lowercase().contains(&needle)
                            || n.op.to_lowercase() == needle)
                })
                .map(|(i, _)| i)
                .collect();
            ui.label(format!(
                "{} match{}",
                hits.len(),
                if hits.len() == 1 { "" } else { "es" }
            ));
            let enter = search.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            if (enter || search.changed()) && !hits.is_empty() {
                let at = if enter { wb.graph.search_at + 1 } else { 0 } % hits.len();
                wb.graph.search_at = at;
                wb.push(Command::SelectNode(d.nodes[hits[at]].name.clone()));
                if enter {
                    search.request_focus();
                }
            }
        }
        ui.separator();
        if ui
            .button("Fit")
            .on_hover_text("Fit the whole graph in the view")
            .clicked()
        {
            wb.graph.fit = true;
        }
        ui.label(format!("{:.0} %", wb.graph.zoom * 100.0))
            .on_hover_text(
                "Wheel to zoom at the pointer, drag to pan, double-click to fit; click a node to select it",
            );
        let ops = d.nodes.iter().filter(|n| n.kind == NodeKind::Op).count();
        let marks = st.marks.iter().filter(|m| m.is_some()).count()
            + d.edges.iter().filter(|e| e.qdq.is_some()).count();
        ui.weak(format!(
            "{ops} nodes, {} edges, {marks} Q/DQ marks",
            d.edges.len()
        ));
    });
}

fn swatch_ui(ui: &mut egui::Ui, color: Color32, text: &str) {
    let (r, _) = ui.allocate_exact_size(vec2(14.0, 14.0), Sense::hover());
    ui.painter().rect_filled(r, 2.0, color);
    ui.label(text);
}

fn legend_ui(wb: &Workbench, ui: &mut egui::Ui, st: &EngineStats) {
    ui.horizontal_wrapped(|ui| {
        match wb.graph.overlay {
            Overlay::Precision => {
                for p in NodePrecision::ALL {
                    let n = st.nodes.iter().filter(|s| s.precision == Some(p)).count();
                    swatch_ui(ui, precision_color(Some(p)), &format!("{} ({n})", p.name()));
                }
            }
            Overlay::TimeMs => match st.time_range_ms {
                Some([lo, hi]) => {
                    swatch_ui(ui, ramp(0.0), &format!("{lo:.3} ms"));
                    swatch_ui(ui, ramp(0.5), "");
                    swatch_ui(ui, ramp(1.0), &format!("{hi:.3} ms"));
                    swatch_ui(ui, NO_VALUE, "no time of its own");
                    if st.unmatched_time_ms > 0.0 {
                        ui.weak(format!(
                            "{:.3} ms in steps of no node (the runtime's own)",
                            st.unmatched_time_ms
                        ));
                    }
                }
                None => {
                    ui.weak("This engine has no per-layer times (they are measured after the latency runs).");
                }
            },
            Overlay::SqnrDb => match st.sqnr_range_db {
                Some([lo, hi]) => {
                    swatch_ui(ui, ramp_good(0.0), &format!("{lo:.1} dB"));
                    swatch_ui(ui, ramp_good(0.5), "");
                    swatch_ui(ui, ramp_good(1.0), &format!("{hi:.1} dB"));
                    swatch_ui(ui, NO_VALUE, "not analysed");
                }
                None => {
                    ui.weak("No layer analysis yet: Layers > Analyse sensitivity measures each layer's SQNR.");
                }
            },
        }
        ui.separator();
        let (r, _) = ui.allocate_exact_size(vec2(14.0, 14.0), Sense::hover());
        diamond(ui.painter(), r.center(), 5.0, MARK);
        ui.label("Q/DQ pair on an edge (hover for its scale)");
    });
}

fn diamond(p: &egui::Painter, c: Pos2, r: f32, color: Color32) {
    p.add(egui::Shape::convex_polygon(
        vec![
            c + vec2(0.0, -r),
            c + vec2(r, 0.0),
            c + vec2(0.0, r),
            c + vec2(-r, 0.0),
        ],
        color,
        Stroke::new(1.0, Color32::from_gray(20)),
    ));
}

/// The zoom and pan that show the whole drawing in `canvas`.
fn fit(d: &Diagram, canvas: Rect) -> (f32, Vec2) {
    let avail = canvas.size() - Vec2::splat(2.0 * FIT_MARGIN);
    let zoom = (avail.x / d.size[0].max(1.0))
        .min(avail.y / d.size[1].max(1.0))
        .clamp(MIN_ZOOM, 1.0);
    let drawn = vec2(d.size[0], d.size[1]) * zoom;
    (zoom, (canvas.size() - drawn) / 2.0)
}

/// Where the view starts: the whole graph where it is readable so, else its top (the input)
/// at a readable zoom, as Netron opens a large model.
fn first_view(d: &Diagram, canvas: Rect) -> (f32, Vec2) {
    let (zoom, pan) = fit(d, canvas);
    if zoom >= NAME_ZOOM {
        return (zoom, pan);
    }
    let zoom = 0.8;
    let top = d
        .nodes
        .iter()
        .find(|n| n.kind == NodeKind::Input)
        .or(d.nodes.first())
        .map(|n| vec2(n.pos[0], n.pos[1] - n.size[1] / 2.0))
        .unwrap_or_default();
    (zoom, vec2(canvas.width() / 2.0, FIT_MARGIN) - top * zoom)
}

fn canvas_ui(wb: &mut Workbench, ui: &mut egui::Ui, d: &Diagram, st: &EngineStats) {
    let canvas = ui.available_rect_before_wrap();
    if canvas.width() < 10.0 || canvas.height() < 10.0 {
        return;
    }
    let resp = ui.allocate_rect(canvas, Sense::click_and_drag());
    let diagram_id = d as *const Diagram as usize;
    if wb.graph.fit || wb.graph.placed != Some(diagram_id) {
        let (z, p) = if wb.graph.fit {
            fit(d, canvas)
        } else {
            first_view(d, canvas)
        };
        wb.graph.fit = false;
        wb.graph.zoom = z;
        wb.graph.pan = p;
        wb.graph.placed = Some(diagram_id);
    }
    let selected = wb.selected_node.as_deref().and_then(|n| d.find(n));
    // A node selected elsewhere (Layers tab, search) is brought to the middle if off screen.
    if wb.graph.reveal {
        wb.graph.reveal = false;
        if let Some(i) = selected {
            let n = &d.nodes[i];
            let at = canvas.min + wb.graph.pan + vec2(n.pos[0], n.pos[1]) * wb.graph.zoom;
            if !canvas.shrink(20.0).contains(at) {
                if wb.graph.zoom < NAME_ZOOM {
                    wb.graph.zoom = 0.8;
                }
                wb.graph.pan = canvas.size() / 2.0 - vec2(n.pos[0], n.pos[1]) * wb.graph.zoom;
            }
        }
    }
    // Pan and zoom; a double click fits the whole graph, as Fit does.
    if resp.double_clicked() {
        let (z, p) = fit(d, canvas);
        wb.graph.zoom = z;
        wb.graph.pan = p;
    }
    if resp.dragged() {
        wb.graph.pan += resp.drag_delta();
    }
    if let Some(pointer) = resp.hover_pos() {
        let (scroll, pinch) = ui.input(|i| (i.smooth_scroll_delta.y, i.zoom_delta()));
        let factor = (scroll * 0.003).exp() * pinch;
        if factor != 1.0 {
            let z0 = wb.graph.zoom;
            let z1 = (z0 * factor).clamp(MIN_ZOOM, MAX_ZOOM);
            // Keep the diagram point under the pointer where it is.
            let under = (pointer - canvas.min - wb.graph.pan) / z0;
            wb.graph.pan = pointer - canvas.min - under * z1;
            wb.graph.zoom = z1;
        }
    }
    let zoom = wb.graph.zoom;
    let origin = canvas.min + wb.graph.pan;
    let to_screen = |p: [f32; 2]| origin + vec2(p[0], p[1]) * zoom;
    let painter = ui.painter_at(canvas);
    painter.rect_filled(canvas, 0.0, ui.visuals().extreme_bg_color);
    let node_rect = |i: usize| {
        let n = &d.nodes[i];
        Rect::from_center_size(to_screen(n.pos), vec2(n.size[0], n.size[1]) * zoom)
    };
    // Edges first, under the boxes.
    let view = canvas.expand(4.0);
    let edge_stroke = Stroke::new((1.2 * zoom).clamp(0.5, 1.5), Color32::from_gray(140));
    let hot_stroke = Stroke::new((2.0 * zoom).clamp(1.0, 2.5), SELECTED);
    let mut mark_spots: Vec<(Pos2, usize)> = vec![];
    for (k, e) in d.edges.iter().enumerate() {
        let (a, b) = (node_rect(e.from), node_rect(e.to));
        let (p0, p1) = (a.center_bottom(), b.center_top());
        if !view.intersects(Rect::from_two_pos(p0, p1)) {
            continue;
        }
        let hot = selected.is_some_and(|s| s == e.from || s == e.to);
        let stroke = if hot { hot_stroke } else { edge_stroke };
        if zoom >= EDGE_CURVES_ZOOM {
            let dy = ((p1.y - p0.y) * 0.5).max(12.0 * zoom);
            painter.add(egui::epaint::CubicBezierShape::from_points_stroke(
                [p0, p0 + vec2(0.0, dy), p1 - vec2(0.0, dy), p1],
                false,
                Color32::TRANSPARENT,
                stroke,
            ));
        } else {
            painter.line_segment([p0, p1], stroke);
        }
        if st.marks.get(k).is_some_and(|m| m.is_some()) || e.qdq.is_some() {
            // On the reading end: Q/DQ placement is per (node, input).
            let at = p1 - vec2(0.0, (14.0 * zoom).max(3.0));
            mark_spots.push((at, k));
        }
    }
    let mark_r = (5.0 * zoom).clamp(2.0, 6.0);
    for (at, _) in &mark_spots {
        diamond(&painter, *at, mark_r, MARK);
    }
    // Boxes, text only where readable.
    let visible: Vec<usize> = (0..d.nodes.len())
        .filter(|&i| view.intersects(node_rect(i)))
        .collect();
    let rounding = (4.0 * zoom).min(6.0);
    for &i in &visible {
        let n = &d.nodes[i];
        let r = node_rect(i);
        let color = match n.kind {
            NodeKind::Op => fill(wb.graph.overlay, &st.nodes[i], st),
            _ => IO_COLOR,
        };
        painter.rect_filled(r, rounding, color);
        if Some(i) == selected {
            painter.rect_stroke(
                r.expand(2.0),
                rounding,
                Stroke::new(3.0, SELECTED),
                egui::StrokeKind::Outside,
            );
        }
        if zoom < LABEL_ZOOM {
            continue;
        }
        let text_color = if n.kind == NodeKind::Op {
            TEXT_ON_BOX
        } else {
            Color32::WHITE
        };
        let big = 13.0 * zoom;
        let width_chars = |px: f32| ((r.width() - 6.0) / (px * 0.55)).max(3.0) as usize;
        if n.kind == NodeKind::Op && zoom >= NAME_ZOOM {
            painter.text(
                r.center_top() + vec2(0.0, 3.0 * zoom),
                egui::Align2::CENTER_TOP,
                super::times::short(&n.op, width_chars(big), false),
                egui::FontId::proportional(big),
                text_color,
            );
            let small = 10.0 * zoom;
            painter.text(
                r.center_bottom() - vec2(0.0, 4.0 * zoom),
                egui::Align2::CENTER_BOTTOM,
                super::times::short(&n.name, width_chars(small), true),
                egui::FontId::monospace(small),
                text_color,
            );
        } else {
            let label = match n.kind {
                NodeKind::Op => n.op.clone(),
                _ => n.name.clone(),
            };
            painter.text(
                r.center(),
                egui::Align2::CENTER_CENTER,
                super::times::short(&label, width_chars(big), true),
                egui::FontId::proportional(big),
                text_color,
            );
        }
    }
    // Each box on screen is a widget where there are few enough: hover text, a name for
    // accessibility (and the UI tests), a click.
    let mut clicked = None;
    if zoom >= LABEL_ZOOM && visible.len() <= MAX_NODE_WIDGETS {
        for &i in &visible {
            let n = &d.nodes[i];
            if n.kind != NodeKind::Op {
                continue;
            }
            let r = node_rect(i).intersect(canvas);
            let id = ui.scope_id().with(("graph.node", i));
            let nr = ui.interact(r, id, Sense::click());
            let is_sel = Some(i) == selected;
            nr.widget_info(|| {
                egui::WidgetInfo::selected(egui::Role::Button, true, is_sel, &n.name)
            });
            if nr.clicked() {
                clicked = Some(i);
            }
            nr.on_hover_ui(|ui| node_tooltip_ui(ui, n, &st.nodes[i]));
        }
    } else if resp.clicked()
        && let Some(p) = resp.interact_pointer_pos()
    {
        clicked = visible.iter().copied().find(|&i| node_rect(i).contains(p));
    }
    if let Some(i) = clicked
        && d.nodes[i].kind == NodeKind::Op
    {
        wb.push(Command::SelectNode(d.nodes[i].name.clone()));
    }
    // A Q/DQ mark under the pointer says what it is.
    if let Some(p) = resp.hover_pos()
        && let Some((_, k)) = mark_spots
            .iter()
            .find(|(at, _)| at.distance(p) <= mark_r + 3.0)
    {
        let e = &d.edges[*k];
        let scale = st
            .marks
            .get(*k)
            .copied()
            .flatten()
            .or(e.qdq.map(|m| m.scale));
        let scale = match scale.flatten() {
            Some(s) => format!("scale {s:.6} (amax {:.4})", s * 127.0),
            None => "scale not a constant".into(),
        };
        let source = if e.qdq.is_some() {
            "in the model file"
        } else {
            "placed by the run"
        };
        resp.clone().on_hover_text_at_pointer(format!(
            "Q/DQ pair ({}, {source}) on `{}` into `{}` (input {}): {scale}",
            st.mark_format, e.tensor, d.nodes[e.to].name, e.slot
        ));
    }
}

fn node_tooltip_ui(ui: &mut egui::Ui, n: &crate::model::diagram::DiagramNode, s: &NodeStat) {
    ui.strong(&n.name);
    ui.label(format!("op {}", n.op));
    if let Some(p) = s.precision {
        ui.label(format!(
            "ran in {}",
            s.precision_text.clone().unwrap_or_else(|| p.name().into())
        ));
    }
    if let Some(w) = &s.why_float {
        ui.label(format!("float: {w}"));
    }
    if let Some(t) = s.time_ms {
        ui.label(format!("{t:.3} ms"));
    }
    if let Some(v) = s.sqnr_isolated_db {
        ui.label(format!("SQNR {v:.1} dB (isolated)"));
    }
}

fn shape_text(shape: &Option<Vec<Option<i64>>>) -> String {
    match shape {
        Some(s) => format!(
            "[{}]",
            s.iter()
                .map(|d| d.map(|v| v.to_string()).unwrap_or_else(|| "?".into()))
                .collect::<Vec<_>>()
                .join("x")
        ),
        None => String::new(),
    }
}

/// The selected node: what it is, how it ran on the engine, what it reads and writes.
fn details_ui(wb: &mut Workbench, ui: &mut egui::Ui, d: &Diagram, st: &EngineStats) {
    let Some(i) = wb.selected_node.as_deref().and_then(|n| d.find(n)) else {
        ui.add_space(8.0);
        ui.weak("Click a node (or a row of the Layers table) to see it here.");
        return;
    };
    let n = &d.nodes[i];
    let s = &st.nodes[i];
    egui::ScrollArea::vertical()
        .id_salt("graph.details.scroll")
        .auto_shrink([false, false])
        .show(ui, |ui| {
            ui.strong(&n.op);
            ui.add(egui::Label::new(egui::RichText::new(&n.name).monospace()).wrap());
            ui.add_space(4.0);
            egui::Grid::new("graph.details.grid")
                .num_columns(2)
                .striped(true)
                .show(ui, |ui| {
                    ui.label("precision");
                    ui.horizontal(|ui| {
                        let (r, _) = ui.allocate_exact_size(vec2(12.0, 12.0), Sense::hover());
                        ui.painter()
                            .rect_filled(r, 2.0, precision_color(s.precision));
                        ui.label(
                            s.precision_text
                                .clone()
                                .or(s.precision.map(|p| p.name().to_string()))
                                .unwrap_or_else(|| "–".into()),
                        );
                    });
                    ui.end_row();
                    if let Some(w) = &s.why_float {
                        ui.label("why float");
                        ui.add(egui::Label::new(w).wrap());
                        ui.end_row();
                    }
                    ui.label("time");
                    match (s.time_ms, &s.fused_into) {
                        (Some(t), _) => ui.label(format!(
                            "{t:.3} ms{}",
                            s.kernel
                                .as_ref()
                                .map(|k| format!(" ({k})"))
                                .unwrap_or_default()
                        )),
                        (None, Some(f)) => ui.label(format!("fused into {f}")),
                        (None, None) => ui.weak("–"),
                    };
                    ui.end_row();
                    ui.label("SQNR isolated");
                    ui.label(
                        s.sqnr_isolated_db
                            .map(|v| format!("{v:.1} dB"))
                            .unwrap_or_else(|| "–".into()),
                    );
                    ui.end_row();
                    ui.label("SQNR accumulated");
                    ui.label(
                        s.sqnr_accumulated_db
                            .map(|v| format!("{v:.1} dB"))
                            .unwrap_or_else(|| "–".into()),
                    );
                    ui.end_row();
                    if let Some(g) = s.metric_gain_pt {
                        ui.label("gain in float");
                        ui.label(format!("{g:+.2} pt"));
                        ui.end_row();
                    }
                });
            ui.add_space(6.0);
            ui.strong("inputs");
            for (k, e) in d.edges.iter().enumerate().filter(|(_, e)| e.to == i) {
                let mark = st.marks.get(k).copied().flatten().map(|s| {
                    format!(
                        " · Q/DQ {}",
                        s.map(|s| format!("scale {s:.5}")).unwrap_or_default()
                    )
                });
                let mark = mark.or(e.qdq.map(|_| " · Q/DQ (file)".to_string()));
                let from = &d.nodes[e.from];
                if ui
                    .link(format!(
                        "{} {}{}",
                        e.tensor,
                        shape_text(&e.shape),
                        mark.unwrap_or_default()
                    ))
                    .on_hover_text(format!(
                        "from {} ({}); click to select it",
                        from.name, from.op
                    ))
                    .clicked()
                    && from.kind == NodeKind::Op
                {
                    wb.push(Command::SelectNode(from.name.clone()));
                }
            }
            for w in &n.weights {
                ui.label(format!(
                    "{} [{}]{}",
                    w.name,
                    w.dims
                        .iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join("x"),
                    if w.int8 { " int8" } else { "" }
                ));
            }
            ui.strong("outputs");
            for o in &n.outputs {
                ui.label(o);
                for e in d.edges.iter().filter(|e| e.from == i && &e.tensor == o) {
                    let to = &d.nodes[e.to];
                    if to.kind == NodeKind::Op {
                        if ui.link(format!("  -> {} ({})", to.name, to.op)).clicked() {
                            wb.push(Command::SelectNode(to.name.clone()));
                        }
                    } else {
                        ui.weak(format!("  -> graph output {}", to.name));
                    }
                }
            }
            if !n.attributes.is_empty() {
                ui.strong("attributes");
                egui::Grid::new("graph.details.attrs")
                    .num_columns(2)
                    .show(ui, |ui| {
                        for (k, v) in &n.attributes {
                            ui.label(k);
                            ui.label(super::times::short(v, 40, false));
                            ui.end_row();
                        }
                    });
            }
            ui.add_space(6.0);
            if ui
                .button("Show in Layers")
                .on_hover_text("The Layers tab, with this node selected in its table")
                .clicked()
            {
                wb.push(Command::SetTab(crate::ui::Tab::Layers));
            }
        });
}
