//! The Classes tab (classifiers), the counterpart of the Masks tab: the chosen engine's
//! confusion matrix with its difference against FP32 beside it (which classes it moves images
//! into and out of), per-class accuracy Δ largest drop first, and the gallery of images it flips
//! against FP32 (thumbnails, true class, top-3s), the one selected shown large with every
//! engine's top-3. A click on a cell narrows the gallery to it. Exports: the matrices and the
//! gallery as CSV, the view as PNG.

use std::path::PathBuf;

use eframe::egui;
use egui::{Color32, Rect, Sense, pos2, vec2};

use super::empty_ui;
use crate::model::Task;
use crate::report::{Confusion, Flip, GRID_MAX_CLASSES, GalleryImage, Report};
use crate::ui::results::compare::engine_name;
use crate::ui::{ClassViewState, Command, ExportKind, Workbench, theme};

/// What drawing asked for: commands, and images to load on the I/O thread.
#[derive(Default)]
struct Wants {
    commands: Vec<Command>,
    thumbs: Vec<PathBuf>,
    image: Option<PathBuf>,
}

/// What every part of the tab reads.
struct View<'a> {
    report: &'a Report,
    state: &'a ClassViewState,
    images: &'a std::collections::HashMap<PathBuf, egui::TextureHandle>,
    fp32: usize,
    engine: usize,
    base: &'a Confusion,
    own: &'a Confusion,
    names: Vec<String>,
}

impl View<'_> {
    fn name(&self, c: usize) -> String {
        self.names
            .get(c)
            .cloned()
            .unwrap_or_else(|| format!("class {c}"))
    }
}

pub fn classes_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let mut wants = Wants::default();
    {
        let Some(report) = wb.results.report.as_ref() else {
            empty_ui(
                ui,
                if wb.is_running() {
                    "The class views appear when the run finishes."
                } else {
                    "No results yet: run a classification experiment."
                },
            );
            return;
        };
        if report.model.task == Some(Task::Segmentation) {
            empty_ui(
                ui,
                "This run is a segmentation model's: the Masks tab shows its images, Compare its per-class IoU.",
            );
            return;
        }
        let fp32 = report.fp32_index();
        let base = fp32.and_then(|f| report.rows[f].confusion.as_ref());
        let (Some(fp32), Some(base), Some(engine)) = (fp32, base, wb.classes_engine()) else {
            empty_ui(
                ui,
                "No FP32 confusion matrix to compare with: run the experiment with FP32 on a classification set (reports from before quantscope had this tab have none).",
            );
            return;
        };
        let Some(own) = report.rows[engine].confusion.as_ref() else {
            return;
        };
        let v = View {
            report,
            state: &wb.classes,
            images: &wb.masks.images,
            fp32,
            engine,
            base,
            own,
            names: (0..base.classes.max(own.classes))
                .map(|c| report.class_name(c))
                .collect(),
        };
        egui::Panel::left("classes.gallery")
            .resizable(true)
            .default_size(340.0)
            .show(ui, |ui| gallery_ui(&v, ui, &mut wants));
        controls_ui(&v, ui, &mut wants);
        ui.separator();
        matrices_ui(&v, ui, &mut wants);
        ui.separator();
        ui.horizontal_top(|ui| {
            ui.vertical(|ui| per_class_ui(&v, ui));
            ui.separator();
            ui.vertical(|ui| detail_ui(&v, ui, &mut wants));
        });
    }
    for c in wants.commands {
        wb.push(c);
    }
    for p in wants.thumbs {
        wb.want_thumb(&p);
    }
    if let Some(p) = wants.image {
        wb.want_image(&p);
    }
}

fn controls_ui(v: &View, ui: &mut egui::Ui, wants: &mut Wants) {
    let rows = &v.report.rows;
    ui.horizontal_wrapped(|ui| {
        ui.label("Engine:");
        let mut chosen = v.engine;
        egui::ComboBox::from_id_salt("classes.engine")
            .selected_text(engine_name(&rows[v.engine]))
            .show_ui(ui, |ui| {
                for (k, r) in rows.iter().enumerate() {
                    if !r.failed() && r.confusion.is_some() {
                        ui.selectable_value(&mut chosen, k, engine_name(r));
                    }
                }
            })
            .response
            .on_hover_text("The engine whose confusion matrix and flipped images are shown, against FP32");
        if chosen != v.engine {
            wants.commands.push(Command::SetClassesEngine(chosen));
        }
        ui.separator();
        for (label, kind, tip) in [
            (
                "Matrices CSV…",
                ExportKind::ConfusionCsv,
                "Every engine's confusion matrix with FP32's and the difference, one line per cell",
            ),
            (
                "Gallery CSV…",
                ExportKind::GalleryCsv,
                "The images each engine flips against FP32, with the true class's probability and each top-3",
            ),
            (
                "View PNG…",
                ExportKind::ViewPng,
                "This view as shown, as a PNG",
            ),
        ] {
            if ui.button(label).on_hover_text(tip).clicked() {
                wants.commands.push(Command::Export(kind));
            }
        }
    });
    // The same line with or without a cell (the button only enables), so the matrices stay
    // under the pointer when a click narrows the gallery.
    ui.horizontal(|ui| {
        match v.state.cell {
            Some((t, p)) => ui.label(format!(
                "Gallery narrowed to true {}, predicted {}",
                v.name(t),
                v.name(p)
            )),
            None => ui
                .weak("Click a cell to narrow the gallery to its images; hover it for the counts."),
        };
        if ui
            .add_enabled(
                v.state.cell.is_some(),
                egui::Button::new("Show all").small(),
            )
            .on_hover_text("Show every flipped image again")
            .clicked()
        {
            wants.commands.push(Command::SetConfusionCell(None));
        }
    });
}

/// `a` mixed towards `b` by `t` (0..1).
fn mix(a: Color32, b: Color32, t: f32) -> Color32 {
    let t = t.clamp(0.0, 1.0);
    let m = |x: u8, y: u8| (x as f32 + (y as f32 - x as f32) * t).round() as u8;
    Color32::from_rgb(m(a.r(), b.r()), m(a.g(), b.g()), m(a.b(), b.b()))
}

const COUNT_COLOR: Color32 = Color32::from_rgb(70, 130, 200);
const WORSE_COLOR: Color32 = Color32::from_rgb(215, 70, 60);
const BETTER_COLOR: Color32 = Color32::from_rgb(60, 150, 220);

/// A cell's fill, the number written in it, and its hover text.
type CellFn<'a> = dyn Fn(usize, usize) -> (Color32, String, String) + 'a;

/// An n × n heatmap with class names on both axes (columns written upwards); returns the
/// cell clicked.
fn heatmap_ui(
    ui: &mut egui::Ui,
    title: &str,
    names: &[String],
    cell_px: f32,
    selected: Option<(usize, usize)>,
    cell: &CellFn,
) -> Option<(usize, usize)> {
    let n = names.len();
    let font = egui::TextStyle::Small.resolve(ui.style());
    let color = ui.visuals().text_color();
    let galleys: Vec<_> = names
        .iter()
        .map(|s| ui.painter().layout_no_wrap(s.clone(), font.clone(), color))
        .collect();
    let label_px = galleys
        .iter()
        .map(|g| g.size().x)
        .fold(0.0, f32::max)
        .min(110.0)
        + 6.0;
    let size = vec2(label_px + n as f32 * cell_px, label_px + n as f32 * cell_px);
    let (rect, resp) = ui.allocate_exact_size(size, Sense::click());
    resp.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Canvas, true, title));
    let painter = ui.painter_at(rect);
    let grid = Rect::from_min_size(
        rect.min + vec2(label_px, label_px),
        vec2(n as f32 * cell_px, n as f32 * cell_px),
    );
    let at = |t: usize, p: usize| {
        Rect::from_min_size(
            grid.min + vec2(p as f32 * cell_px, t as f32 * cell_px),
            vec2(cell_px, cell_px),
        )
    };
    for (c, g) in galleys.iter().enumerate() {
        let row = at(c, 0);
        painter.galley(
            pos2(
                grid.min.x - 4.0 - g.size().x,
                row.center().y - g.size().y / 2.0,
            ),
            g.clone(),
            color,
        );
        // Upwards from just above the grid, centred on the column.
        let col = at(0, c);
        let pos = pos2(col.center().x - g.size().y / 2.0, grid.min.y - 4.0);
        painter.add(
            egui::epaint::TextShape::new(pos, g.clone(), color)
                .with_angle(-std::f32::consts::FRAC_PI_2),
        );
    }
    let digits = egui::FontId::proportional((cell_px * 0.42).clamp(7.0, 12.0));
    let hovered = resp.hover_pos().filter(|p| grid.contains(*p)).map(|p| {
        let q = (p - grid.min) / cell_px;
        ((q.y as usize).min(n - 1), (q.x as usize).min(n - 1))
    });
    for t in 0..n {
        for p in 0..n {
            let r = at(t, p);
            let (fill, text, _) = cell(t, p);
            painter.rect_filled(r.shrink(0.5), 1.0, fill);
            if cell_px >= 14.0 && !text.is_empty() {
                let ink = if fill.r() as u32 + fill.g() as u32 + fill.b() as u32 > 400 {
                    Color32::BLACK
                } else {
                    Color32::WHITE
                };
                painter.text(
                    r.center(),
                    egui::Align2::CENTER_CENTER,
                    text,
                    digits.clone(),
                    ink,
                );
            }
        }
    }
    for (cell_at, stroke) in [
        (selected, egui::Stroke::new(2.0, theme::WARN)),
        (
            hovered,
            egui::Stroke::new(1.5, ui.visuals().strong_text_color()),
        ),
    ] {
        if let Some((t, p)) = cell_at {
            painter.rect_stroke(at(t, p), 1.0, stroke, egui::StrokeKind::Inside);
        }
    }
    let resp = resp.on_hover_ui_at_pointer(|ui| {
        ui.label(
            hovered
                .map(|(t, p)| cell(t, p).2)
                .unwrap_or_else(|| "Rows: true class; columns: predicted class".into()),
        );
    });
    if resp.clicked() { hovered } else { None }
}

fn matrices_ui(v: &View, ui: &mut egui::Ui, wants: &mut Wants) {
    let n = v.names.len();
    let engine = engine_name(&v.report.rows[v.engine]);
    let is_fp32 = v.engine == v.fp32;
    if n > GRID_MAX_CLASSES {
        pairs_ui(v, ui, wants);
        return;
    }
    // Two grids side by side, labels included, in the width there is; at most half the height.
    let font = egui::TextStyle::Small.resolve(ui.style());
    let label_px = v
        .names
        .iter()
        .map(|s| {
            ui.painter()
                .layout_no_wrap(s.clone(), font.clone(), Color32::WHITE)
                .size()
                .x
        })
        .fold(0.0, f32::max)
        .min(110.0)
        + 6.0;
    let by_width = (ui.available_width() / 2.0 - label_px - 16.0) / n as f32;
    let by_height = (ui.available_height() * 0.5 - label_px - 24.0) / n as f32;
    let cell_px = by_width.min(by_height).clamp(6.0, 30.0);
    let mut clicked = None;
    ui.horizontal_top(|ui| {
        ui.vertical(|ui| {
            let title = format!("{engine}: confusion matrix");
            ui.strong(&title)
                .on_hover_text("Rows: true class; columns: predicted class. Colour: share of the true class's images");
            let bg = ui.visuals().extreme_bg_color;
            // Once per frame, not once per cell.
            let totals = v.own.row_totals();
            let cell = |t: usize, p: usize| {
                let c = v.own.count(t, p);
                let total = totals[t].max(1);
                let rate = c as f32 / total as f32;
                let fill = mix(bg, COUNT_COLOR, rate.sqrt());
                let hover = format!(
                    "true {}, predicted {}: {c} images ({:.1} % of {}); FP32: {}",
                    v.names[t],
                    v.names[p],
                    rate * 100.0,
                    v.names[t],
                    v.base.count(t, p)
                );
                (fill, if c > 0 { c.to_string() } else { String::new() }, hover)
            };
            clicked = clicked.or(heatmap_ui(
                ui,
                &title,
                &v.names,
                cell_px,
                v.state.cell,
                &cell,
            ));
        });
        ui.add_space(12.0);
        ui.vertical(|ui| {
            if is_fp32 {
                ui.strong("Difference against FP32");
                ui.weak("Pick another engine to see where it moves images.");
                return;
            }
            let diff = v.own.diff(v.base);
            let max = diff.iter().map(|d| d.2.abs()).max().unwrap_or(1).max(1) as f32;
            let title = format!("{engine} minus FP32");
            ui.strong(&title)
                .on_hover_text("Red: worse than FP32 (more images in a wrong cell, fewer on the diagonal); blue: better");
            let bg = ui.visuals().extreme_bg_color;
            let cell = |t: usize, p: usize| {
                let (a, b) = (v.base.count(t, p) as i64, v.own.count(t, p) as i64);
                let d = b - a;
                let worse = (t == p) == (d < 0);
                let tint = if worse { WORSE_COLOR } else { BETTER_COLOR };
                let fill = if d == 0 {
                    bg
                } else {
                    mix(
                        bg,
                        tint,
                        0.25 + 0.75 * (d.abs() as f32 / max).sqrt(),
                    )
                };
                let hover = format!(
                    "true {}, predicted {}: FP32 {a}, {engine} {b} ({d:+})",
                    v.names[t], v.names[p]
                );
                (
                    fill,
                    if d != 0 { format!("{d:+}") } else { String::new() },
                    hover,
                )
            };
            clicked = clicked.or(heatmap_ui(
                ui,
                &title,
                &v.names,
                cell_px,
                v.state.cell,
                &cell,
            ));
        });
    });
    if let Some(c) = clicked {
        let again = v.state.cell == Some(c);
        wants
            .commands
            .push(Command::SetConfusionCell((!again).then_some(c)));
    }
}

/// For many classes: the most confused pairs and the largest moves against FP32, as tables.
fn pairs_ui(v: &View, ui: &mut egui::Ui, wants: &mut Wants) {
    let engine = engine_name(&v.report.rows[v.engine]);
    let mut moves = v.own.diff(v.base);
    moves.sort_by(|a, b| b.2.abs().cmp(&a.2.abs()).then((a.0, a.1).cmp(&(b.0, b.1))));
    let confused: Vec<(usize, usize)> = v
        .own
        .most_confused(15)
        .iter()
        .map(|c| (c[0] as usize, c[1] as usize))
        .collect();
    let moved: Vec<(usize, usize)> = moves.iter().take(15).map(|m| (m.0, m.1)).collect();
    ui.horizontal_top(|ui| {
        for (title, id, pairs) in [
            (format!("Most confused, {engine}"), "classes.confused", confused),
            (format!("Largest moves, {engine} minus FP32"), "classes.moves", moved),
        ] {
            ui.vertical(|ui| {
                ui.strong(title).on_hover_text(format!(
                    "{} classes: pairs rather than a grid. Click a pair to narrow the gallery to it",
                    v.names.len()
                ));
                egui::Grid::new(id).striped(true).show(ui, |ui| {
                    for h in ["true class", "predicted", "FP32", "engine", "Δ"] {
                        ui.strong(h);
                    }
                    ui.end_row();
                    for (t, p) in pairs {
                        let (a, b) = (v.base.count(t, p), v.own.count(t, p));
                        let on = v.state.cell == Some((t, p));
                        if ui.selectable_label(on, &v.names[t]).clicked() {
                            wants
                                .commands
                                .push(Command::SetConfusionCell((!on).then_some((t, p))));
                        }
                        ui.label(&v.names[p]);
                        ui.label(a.to_string());
                        ui.label(b.to_string());
                        ui.label(format!("{:+}", b as i64 - a as i64));
                        ui.end_row();
                    }
                });
            });
            ui.add_space(16.0);
        }
    });
}

/// Per-class accuracy, FP32 and the engine, largest drop first.
fn per_class_ui(v: &View, ui: &mut egui::Ui) {
    let rows = &v.report.rows;
    let (Some(a), Some(b)) = (
        rows[v.fp32].per_class_accuracy.as_ref(),
        rows[v.engine].per_class_accuracy.as_ref(),
    ) else {
        return;
    };
    let mut classes: Vec<(usize, Option<f64>, Option<f64>)> = (0..a.len().max(b.len()))
        .map(|c| (c, a.get(c).copied().flatten(), b.get(c).copied().flatten()))
        .filter(|(_, x, y)| x.is_some() || y.is_some())
        .collect();
    let delta = |x: &Option<f64>, y: &Option<f64>| Some(y.as_ref()? - x.as_ref()?);
    classes.sort_by(|l, r| match (delta(&l.1, &l.2), delta(&r.1, &r.2)) {
        (Some(x), Some(y)) => x.total_cmp(&y).then(l.0.cmp(&r.0)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => l.0.cmp(&r.0),
    });
    ui.strong("Per-class accuracy, largest drop first")
        .on_hover_text("Top-1 accuracy on each class's images, FP32 and the chosen engine");
    // Fixed column widths and only the rows in view: a 1000-class model stays cheap to draw.
    let widths = [
        v.names
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(8)
            .clamp(8, 24) as f32
            * 7.5,
        52.0,
        58.0,
        64.0,
        48.0,
    ];
    let row_h = ui.text_style_height(&egui::TextStyle::Body);
    let cells = |ui: &mut egui::Ui, texts: [egui::WidgetText; 5]| {
        ui.horizontal(|ui| {
            // The class name to the left, numbers to the right of their columns.
            for (k, (w, t)) in widths.iter().zip(texts).enumerate() {
                let layout = if k == 0 {
                    egui::Layout::left_to_right(egui::Align::Center)
                } else {
                    egui::Layout::right_to_left(egui::Align::Center)
                };
                ui.allocate_ui_with_layout(vec2(*w, row_h), layout, |ui| {
                    ui.set_min_width(*w);
                    ui.add(egui::Label::new(t).truncate());
                });
            }
        });
    };
    cells(
        ui,
        ["class", "images", "FP32 %", "engine %", "Δ pt"]
            .map(|h| egui::RichText::new(h).strong().into()),
    );
    let totals = v.base.row_totals();
    egui::ScrollArea::vertical()
        .id_salt("classes.per_class")
        .auto_shrink([true, true])
        .max_height(ui.available_height().max(120.0))
        .show_rows(
            ui,
            row_h + ui.spacing().item_spacing.y,
            classes.len(),
            |ui, range| {
                for &(c, x, y) in &classes[range] {
                    let d = match delta(&x, &y) {
                        Some(d) => egui::RichText::new(format!("{:+.1}", d * 100.0))
                            .color(theme::delta_color(d * 100.0)),
                        None => egui::RichText::new("–"),
                    };
                    cells(
                        ui,
                        [
                            v.name(c).into(),
                            totals.get(c).copied().unwrap_or(0).to_string().into(),
                            crate::report::pct(x).into(),
                            crate::report::pct(y).into(),
                            d.into(),
                        ],
                    );
                }
            },
        );
}

/// A gallery entry's top-k as "shirt 0.52 · coat 0.35 · pullover 0.05".
fn top_text(v: &View, g: &GalleryImage, k: usize) -> String {
    g.tops
        .get(k)
        .and_then(Option::as_ref)
        .map(|t| {
            t.top
                .iter()
                .map(|&(c, p)| {
                    let name = v
                        .names
                        .get(c as usize)
                        .cloned()
                        .unwrap_or_else(|| format!("class {c}"));
                    format!("{name} {p:.2}")
                })
                .collect::<Vec<_>>()
                .join(" · ")
        })
        .unwrap_or_else(|| "–".into())
}

/// The engine's flips, narrowed to the chosen cell.
fn shown_flips<'a>(v: &View<'a>) -> Vec<(&'a GalleryImage, Flip, f32)> {
    v.report.flips_in(v.engine, v.state.cell)
}

/// The flipped images, lost first (largest drop of the true class's probability), then
/// gained; a thumbnail, the true class, FP32's and the engine's top-3 each.
fn gallery_ui(v: &View, ui: &mut egui::Ui, wants: &mut Wants) {
    // The panel keeps its width whatever it lists, so the matrices beside it stay put.
    ui.set_min_width(ui.available_width());
    let engine = engine_name(&v.report.rows[v.engine]);
    let flips = shown_flips(v);
    let kept = flips.iter().filter(|f| f.1 == Flip::Lost).count();
    // Over every image (the gallery keeps the largest changes only), unless narrowed to a cell.
    let (lost, gained) = match v.state.cell {
        None => v.report.flip_counts(v.engine),
        Some(_) => None,
    }
    .unwrap_or((kept, flips.len() - kept));
    let more = if lost + gained > flips.len() {
        format!(" (the {} with the largest changes shown)", flips.len())
    } else {
        String::new()
    };
    ui.label(format!("Flipped images: {lost} lost, {gained} gained{more}"))
    .on_hover_text(format!(
        "Lost: FP32 right, {engine} wrong; gained: the reverse. Sorted by the drop in the true class's probability (FP32 minus {engine})"
    ));
    if v.engine == v.fp32 {
        ui.weak("Pick an engine other than FP32.");
        return;
    }
    if flips.is_empty() {
        ui.weak(if v.state.cell.is_some() {
            "No flipped image in this cell."
        } else {
            "The engine gets every image right or wrong exactly where FP32 does."
        });
        return;
    }
    let files = &v.report.evaluation.image_files;
    let selected = v.state.image.or(flips.first().map(|f| f.0.image));
    let thumb_px = 52.0;
    egui::ScrollArea::vertical()
        .id_salt("classes.gallery.scroll")
        .auto_shrink([false, false])
        .show(ui, |ui| {
            let mut section = None;
            for (g, flip, drop) in flips {
                if section != Some(flip) {
                    section = Some(flip);
                    ui.add_space(4.0);
                    ui.strong(match flip {
                        Flip::Lost => format!("FP32 right, {engine} wrong"),
                        Flip::Gained => format!("FP32 wrong, {engine} right"),
                    });
                }
                let path = files.get(g.image);
                ui.horizontal(|ui| {
                    let (rect, resp) =
                        ui.allocate_exact_size(vec2(thumb_px, thumb_px), Sense::click());
                    let tex = path.and_then(|p| v.state.thumbs.get(p));
                    match tex {
                        Some(t) => {
                            ui.painter().rect_filled(rect, 2.0, Color32::BLACK);
                            let fit = fit_rect(rect, t.size_vec2());
                            ui.painter().image(
                                t.id(),
                                fit,
                                Rect::from_min_max(pos2(0.0, 0.0), pos2(1.0, 1.0)),
                                Color32::WHITE,
                            );
                        }
                        None => {
                            ui.painter().rect_filled(rect, 2.0, Color32::from_gray(40));
                            if let Some(p) = path.filter(|_| ui.is_rect_visible(rect))
                                && !v.state.thumb_errors.contains_key(p)
                            {
                                wants.thumbs.push(p.clone());
                            }
                        }
                    }
                    if Some(g.image) == selected {
                        ui.painter().rect_stroke(
                            rect,
                            2.0,
                            egui::Stroke::new(2.0, theme::WARN),
                            egui::StrokeKind::Outside,
                        );
                    }
                    ui.vertical(|ui| {
                        ui.horizontal(|ui| {
                            let picked = ui
                                .selectable_label(
                                    Some(g.image) == selected,
                                    v.report.image_name(g.image),
                                )
                                .on_hover_text(
                                    path.map(|p| p.display().to_string()).unwrap_or_default(),
                                );
                            if picked.clicked() || resp.clicked() {
                                wants.commands.push(Command::SelectGalleryImage(g.image));
                            }
                            ui.label(format!("true {}", v.name(g.true_class)));
                            let color = if flip == Flip::Lost {
                                theme::ERROR
                            } else {
                                theme::GOOD
                            };
                            ui.colored_label(color, format!("{:+.2}", -drop))
                                .on_hover_text(
                                    "Change of the true class's probability against FP32",
                                );
                        });
                        ui.small(format!("FP32: {}", top_text(v, g, v.fp32)));
                        ui.small(format!("{engine}: {}", top_text(v, g, v.engine)));
                    });
                });
            }
        });
}

/// An engine's name without the notes that make it long ("FP16", "INT8 entropy").
fn short_name(r: &crate::report::Row) -> String {
    let name = engine_name(r);
    match name.split_once(" (") {
        Some((short, _)) => short.to_string(),
        None => name,
    }
}

/// `rect` shrunk to the aspect of an image of `size`, centred.
fn fit_rect(rect: Rect, size: egui::Vec2) -> Rect {
    let s = (rect.width() / size.x.max(1.0)).min(rect.height() / size.y.max(1.0));
    Rect::from_center_size(rect.center(), size * s)
}

/// The selected gallery image, large, with every engine's top-3.
fn detail_ui(v: &View, ui: &mut egui::Ui, wants: &mut Wants) {
    let flips = shown_flips(v);
    let Some(g) = v
        .state
        .image
        .and_then(|i| v.report.gallery.iter().find(|g| g.image == i))
        .or(flips.first().map(|f| f.0))
    else {
        ui.weak("Select a flipped image to see every engine's top-3.");
        return;
    };
    let path = v.report.evaluation.image_files.get(g.image);
    ui.strong(v.report.image_name(g.image));
    ui.label(format!("true class: {}", v.name(g.true_class)));
    let side = 140.0;
    let (rect, _) = ui.allocate_exact_size(vec2(side, side), Sense::hover());
    ui.painter().rect_filled(rect, 2.0, Color32::from_gray(30));
    let tex = path.and_then(|p| v.images.get(p).or(v.state.thumbs.get(p)));
    if let Some(t) = tex {
        ui.painter().image(
            t.id(),
            fit_rect(rect, t.size_vec2()),
            Rect::from_min_max(pos2(0.0, 0.0), pos2(1.0, 1.0)),
            Color32::WHITE,
        );
    }
    if let Some(p) = path.filter(|p| !v.images.contains_key(*p)) {
        wants.image = Some(p.clone());
    }
    // Small text: six engines' top-3 fit beside the per-class table.
    ui.style_mut().override_text_style = Some(egui::TextStyle::Small);
    egui::Grid::new("classes.detail")
        .striped(true)
        .show(ui, |ui| {
            for h in ["engine", "p(true)", "1st", "2nd", "3rd"] {
                ui.strong(h);
            }
            ui.end_row();
            for (k, top) in g.tops.iter().enumerate() {
                let (Some(top), Some(r)) = (top, v.report.rows.get(k)) else {
                    continue;
                };
                let name = short_name(r);
                if k == v.engine {
                    ui.strong(name);
                } else {
                    ui.label(name);
                }
                ui.label(format!("{:.2}", top.true_p));
                for &(c, p) in &top.top {
                    let text = format!(
                        "{} {p:.2}",
                        v.names
                            .get(c as usize)
                            .cloned()
                            .unwrap_or_else(|| format!("class {c}"))
                    );
                    if c as usize == g.true_class {
                        ui.colored_label(theme::GOOD, text);
                    } else {
                        ui.label(text);
                    }
                }
                ui.end_row();
            }
        });
}
