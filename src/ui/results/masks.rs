//! The Masks tab (segmentation): images sorted by the largest mIoU drop first; the image,
//! ground truth, FP32 and one or two chosen engines side by side with masks overlaid at an
//! adjustable opacity, a disagreement map, a class legend, the class under the pointer, and
//! zoom and pan shared by every view. Also the PNG export of that composite.

use eframe::egui;
use std::path::Path;

use egui::{Color32, Rect, Sense, Vec2, pos2, vec2};

use super::empty_ui;
use crate::backend::Precision;
use crate::ui::results::compare::engine_name;
use crate::ui::{Command, MaskSource, Workbench, theme};

/// Masks of one image, borrowed from the artifacts.
struct ImageMasks<'a> {
    gt: &'a [u8],
    fp32: Option<(usize, &'a [u8])>,
    engines: Vec<(usize, &'a [u8])>,
}

fn class_name(classes: &[String], c: u8) -> String {
    if c == 255 {
        return "ignore".into();
    }
    classes
        .get(c as usize)
        .cloned()
        .unwrap_or_else(|| format!("class {c}"))
}

fn mask_image(mask: &[u8], hw: [usize; 2]) -> egui::ColorImage {
    let [h, w] = hw;
    let pixels = (0..h * w)
        .map(|i| match mask.get(i).copied().unwrap_or(0) {
            0 | 255 => Color32::TRANSPARENT,
            c => theme::class_color32(c),
        })
        .collect();
    egui::ColorImage::new([w, h], pixels)
}

fn disagreement_image(a: &[u8], b: &[u8], hw: [usize; 2]) -> egui::ColorImage {
    let [h, w] = hw;
    let pixels = (0..h * w)
        .map(|i| {
            if a.get(i) != b.get(i) {
                Color32::from_rgb(255, 40, 40)
            } else {
                Color32::TRANSPARENT
            }
        })
        .collect();
    egui::ColorImage::new([w, h], pixels)
}

pub fn masks_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let Some(arts) = wb.results.artifacts.as_ref() else {
        empty_ui(
            ui,
            if wb.is_running() {
                "Masks appear when the run finishes."
            } else {
                "No masks yet: run a segmentation experiment."
            },
        );
        return;
    };
    if arts.ground_truth.is_empty() {
        let classifier = wb.results.rows().iter().any(|r| r.confusion.is_some());
        empty_ui(
            ui,
            if classifier {
                "This run is a classifier's: its confusion matrices and flipped images are in the Classes tab."
            } else {
                "This run has no ground-truth masks (not a segmentation set)."
            },
        );
        return;
    }
    let order = wb.image_order();
    if order.is_empty() {
        empty_ui(ui, "No FP32 predictions to compare with.");
        return;
    }
    if !order.contains(&wb.masks.image) {
        wb.masks.image = order[0];
    }
    egui::Panel::left("masks.list")
        .resizable(true)
        .default_size(190.0)
        .show(ui, |ui| image_list_ui(wb, &order, ui));
    controls_ui(wb, ui);
    views_ui(wb, ui);
}

fn image_list_ui(wb: &mut Workbench, order: &[usize], ui: &mut egui::Ui) {
    ui.label("Images, largest drop first")
        .on_hover_text("FP32 mIoU minus the worst chosen engine's, per image (arrow keys step)");
    let rows = wb.results.rows();
    let fp32 = rows
        .iter()
        .find(|r| r.precision == Some(Precision::Fp32) && !r.failed());
    let files = wb
        .results
        .report
        .as_ref()
        .map(|r| r.evaluation.image_files.clone())
        .unwrap_or_default();
    let engines: Vec<usize> = wb.masks.engines.iter().flatten().copied().collect();
    let mut clicked = None;
    egui::ScrollArea::vertical()
        .id_salt("masks.list.scroll")
        .auto_shrink([false, false])
        .show(ui, |ui| {
            for &i in order {
                let name = files
                    .get(i)
                    .and_then(|f| f.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| format!("image {i}"));
                let drop = fp32.and_then(|f| {
                    let base = f.per_image.get(i)?;
                    engines
                        .iter()
                        .filter_map(|&k| rows.get(k)?.per_image.get(i))
                        .map(|v| (v - base) * 100.0)
                        .reduce(f64::min)
                });
                let text = match drop {
                    Some(d) => format!("{name}  {d:+.1}"),
                    None => name,
                };
                if ui
                    .selectable_label(wb.masks.image == i, text)
                    .on_hover_text("mIoU change of the worst chosen engine against FP32, in points")
                    .clicked()
                {
                    clicked = Some(i);
                }
            }
        });
    if let Some(i) = clicked {
        wb.push(Command::SelectImage(i));
    }
}

fn controls_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let rows = wb.results.rows().to_vec();
    let candidates: Vec<usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.precision != Some(Precision::Fp32) && !r.failed())
        .map(|(i, _)| i)
        .collect();
    ui.horizontal_wrapped(|ui| {
        for slot in 0..2 {
            let current = wb.masks.engines[slot];
            let text = current
                .and_then(|k| rows.get(k))
                .map(engine_name)
                .unwrap_or_else(|| "none".into());
            let mut chosen = current;
            egui::ComboBox::from_id_salt(("masks.engine", slot))
                .selected_text(text)
                .show_ui(ui, |ui| {
                    if slot == 1 {
                        ui.selectable_value(&mut chosen, None, "none");
                    }
                    for &k in &candidates {
                        ui.selectable_value(&mut chosen, Some(k), engine_name(&rows[k]));
                    }
                })
                .response
                .on_hover_text(if slot == 0 {
                    "First engine to compare with FP32"
                } else {
                    "Second engine to compare with FP32 (optional)"
                });
            if chosen != current {
                wb.push(Command::SetEngine { slot, row: chosen });
            }
        }
        ui.separator();
        ui.label("Opacity");
        ui.add(egui::Slider::new(&mut wb.masks.opacity, 0.0..=1.0).fixed_decimals(2))
            .on_hover_text("Opacity of the mask overlays");
        ui.separator();
        ui.label(format!("zoom {:.1}×", wb.masks.zoom))
            .on_hover_text("Scroll over a view to zoom, drag to pan; all views follow");
        if ui
            .button("Reset view")
            .on_hover_text("Show the whole image (or double-click a view)")
            .clicked()
        {
            wb.masks.zoom = 1.0;
            wb.masks.center = vec2(0.5, 0.5);
        }
    });
}

fn uv_rect(zoom: f32, center: Vec2) -> Rect {
    let half = 0.5 / zoom;
    let c = vec2(
        center.x.clamp(half, 1.0 - half),
        center.y.clamp(half, 1.0 - half),
    );
    Rect::from_center_size(pos2(c.x, c.y), Vec2::splat(2.0 * half))
}

fn views_ui(wb: &mut Workbench, ui: &mut egui::Ui) {
    let i = wb.masks.image;
    let Some(arts) = wb.results.artifacts.as_ref() else {
        return;
    };
    let rows = wb.results.rows();
    let Some(&hw) = arts.mask_hw.get(i) else {
        return;
    };
    let Some(gt) = arts.ground_truth.get(i) else {
        return;
    };
    let pred = |k: usize| -> Option<&[u8]> {
        let m = arts.predictions.get(k)?.get(i)?;
        (m.len() == hw[0] * hw[1]).then_some(m.as_slice())
    };
    let fp32 = rows
        .iter()
        .position(|r| r.precision == Some(Precision::Fp32) && !r.failed())
        .and_then(|k| Some((k, pred(k)?)));
    let m = ImageMasks {
        gt,
        fp32,
        engines: wb
            .masks
            .engines
            .iter()
            .flatten()
            .filter_map(|&k| Some((k, pred(k)?)))
            .collect(),
    };
    let classes = super::class_names(wb);
    let names: Vec<String> = rows.iter().map(engine_name).collect();
    let image_path = wb
        .results
        .report
        .as_ref()
        .and_then(|r| r.evaluation.image_files.get(i).cloned());

    // Views: (title, source of the overlay, mask for hover).
    let mut views: Vec<(String, Option<MaskSource>, Option<&[u8]>)> = vec![
        ("Image".into(), None, None),
        (
            "Ground truth".into(),
            Some(MaskSource::GroundTruth),
            Some(m.gt),
        ),
    ];
    if let Some((k, f)) = m.fp32 {
        views.push(("FP32".into(), Some(MaskSource::Row(k)), Some(f)));
    }
    for &(k, p) in &m.engines {
        views.push((names[k].clone(), Some(MaskSource::Row(k)), Some(p)));
    }
    if m.fp32.is_some() {
        for &(k, p) in &m.engines {
            views.push((
                format!("{} vs FP32", names[k]),
                Some(MaskSource::Disagreement(k)),
                Some(p),
            ));
        }
    }
    // Textures, made once per image and engine.
    let ctx = ui.ctx().clone();
    let mut new_textures = vec![];
    for (_, src, _) in &views {
        let Some(src) = *src else { continue };
        if wb.masks.textures.contains_key(&(i, src)) {
            continue;
        }
        let img = match src {
            MaskSource::GroundTruth => mask_image(m.gt, hw),
            MaskSource::Row(k) => match pred(k) {
                Some(p) => mask_image(p, hw),
                None => continue,
            },
            MaskSource::Disagreement(k) => match (pred(k), m.fp32) {
                (Some(p), Some((_, f))) => disagreement_image(p, f, hw),
                _ => continue,
            },
        };
        new_textures.push((
            (i, src),
            ctx.load_texture(
                format!("mask.{i}.{src:?}"),
                img,
                egui::TextureOptions::NEAREST,
            ),
        ));
    }
    // Classes present in this image, for the legend.
    let mut present = [false; 256];
    for mask in std::iter::once(m.gt)
        .chain(m.fp32.map(|f| f.1))
        .chain(m.engines.iter().map(|e| e.1))
    {
        for &c in mask {
            present[c as usize] = true;
        }
    }
    let hover_masks: Vec<(String, &[u8])> = views
        .iter()
        .filter(|(t, src, _)| !matches!(src, Some(MaskSource::Disagreement(_))) && !t.is_empty())
        .filter_map(|(t, _, mask)| Some((t.clone(), (*mask)?)))
        .collect();
    let hover_text = wb.masks.hover.map(|[x, y]| {
        let parts: Vec<String> = hover_masks
            .iter()
            .map(|(t, mask)| {
                let c = mask.get(y * hw[1] + x).copied().unwrap_or(0);
                format!("{t}: {}", class_name(&classes, c))
            })
            .collect();
        format!("pixel ({x}, {y}) — {}", parts.join(" · "))
    });
    let view_titles: Vec<(String, Option<MaskSource>)> =
        views.iter().map(|(t, s, _)| (t.clone(), *s)).collect();

    for (key, t) in new_textures {
        wb.masks.textures.insert(key, t);
    }
    if let Some(p) = &image_path {
        wb.want_image(p);
    }
    let image_tex = image_path
        .as_ref()
        .and_then(|p| wb.masks.images.get(p))
        .cloned();
    let image_err = image_path
        .as_ref()
        .and_then(|p| wb.masks.image_errors.get(p))
        .cloned();

    // Legend and hover line.
    ui.horizontal_wrapped(|ui| {
        for c in 0..=255u8 {
            if !present[c as usize] || c == 255 {
                continue;
            }
            let (rect, _) = ui.allocate_exact_size(vec2(12.0, 12.0), Sense::hover());
            ui.painter().rect_filled(
                rect,
                2.0,
                if c == 0 {
                    Color32::from_gray(40)
                } else {
                    theme::class_color32(c)
                },
            );
            ui.label(class_name(&classes, c))
                .on_hover_text(format!("class {c}"));
        }
    });
    ui.label(hover_text.unwrap_or_else(|| "Hover a view to see the class at a pixel.".into()));
    if let Some(e) = image_err {
        ui.colored_label(theme::WARN, format!("image not shown: {e}"));
    }

    let cols = if view_titles.len() > 4 { 3 } else { 2 };
    let avail = ui.available_size();
    let gap = 8.0;
    let cell_w = ((avail.x - gap * (cols as f32 - 1.0)) / cols as f32).max(80.0);
    let aspect = hw[0] as f32 / hw[1].max(1) as f32;
    let n_rows = view_titles.len().div_ceil(cols);
    let max_h = ((avail.y - 24.0 * n_rows as f32) / n_rows as f32).max(60.0);
    let cell = if cell_w * aspect > max_h {
        vec2(max_h / aspect, max_h)
    } else {
        vec2(cell_w, cell_w * aspect)
    };
    let uv = uv_rect(wb.masks.zoom, wb.masks.center);
    let mut hover = None;
    let mut pan = Vec2::ZERO;
    let mut zoom_at: Option<(f32, egui::Pos2, Rect)> = None;
    let mut reset = false;
    egui::Grid::new("masks.views")
        .spacing([gap, 4.0])
        .show(ui, |ui| {
            for (n, (title, src)) in view_titles.iter().enumerate() {
                ui.vertical(|ui| {
                    ui.label(title)
                        .on_hover_text("Scroll to zoom, drag to pan, double-click to reset");
                    let (rect, resp) = ui.allocate_exact_size(cell, Sense::click_and_drag());
                    let painter = ui.painter_at(rect);
                    painter.rect_filled(rect, 0.0, Color32::from_gray(20));
                    let dim = matches!(src, Some(MaskSource::Disagreement(_)));
                    if let Some(t) = &image_tex {
                        let tint = if dim {
                            Color32::from_gray(110)
                        } else {
                            Color32::WHITE
                        };
                        painter.image(t.id(), rect, uv, tint);
                    }
                    if let Some(t) = src.and_then(|s| wb.masks.textures.get(&(i, s))) {
                        let alpha = if dim { 1.0 } else { wb.masks.opacity };
                        painter.image(
                            t.id(),
                            rect,
                            uv,
                            Color32::from_white_alpha((alpha * 255.0) as u8),
                        );
                    }
                    if resp.dragged() {
                        pan += resp.drag_delta() / rect.size();
                    }
                    if resp.double_clicked() {
                        reset = true;
                    }
                    if let Some(pos) = resp.hover_pos() {
                        let t = (pos - rect.min) / rect.size();
                        let u = uv.min + t * uv.size();
                        let x = ((u.x * hw[1] as f32) as usize).min(hw[1] - 1);
                        let y = ((u.y * hw[0] as f32) as usize).min(hw[0] - 1);
                        hover = Some([x, y]);
                        let scroll = ui.input(|inp| inp.smooth_scroll_delta.y);
                        if scroll != 0.0 {
                            zoom_at = Some((scroll, pos, rect));
                        }
                    }
                });
                if (n + 1) % cols == 0 {
                    ui.end_row();
                }
            }
        });
    wb.masks.hover = hover;
    let zoom = wb.masks.zoom;
    if pan != Vec2::ZERO {
        let c = uv.center().to_vec2() - pan / zoom;
        wb.masks.center = c;
    }
    if let Some((scroll, pos, rect)) = zoom_at {
        let t = (pos - rect.min) / rect.size();
        let under = uv.min + t * uv.size();
        let new_zoom = (zoom * (scroll * 0.004).exp()).clamp(1.0, 32.0);
        wb.masks.zoom = new_zoom;
        // Keep the pixel under the pointer where it is.
        wb.masks.center = under.to_vec2() - (t - vec2(0.5, 0.5)) / new_zoom;
    }
    if reset {
        wb.masks.zoom = 1.0;
        wb.masks.center = vec2(0.5, 0.5);
    }
    let c = uv_rect(wb.masks.zoom, wb.masks.center).center();
    wb.masks.center = c.to_vec2();
}

/// Writes the selected image's composite (image, FP32, chosen engines with their
/// disagreement in red) to `path`, with the image crate.
pub fn export_png(wb: &Workbench, path: &Path) -> Result<(), String> {
    let arts = wb
        .results
        .artifacts
        .as_ref()
        .ok_or("no predictions: run a segmentation experiment first")?;
    let i = wb.masks.image;
    let hw = *arts.mask_hw.get(i).ok_or("no mask for this image")?;
    let rows = wb.results.rows();
    let fp32_k = rows
        .iter()
        .position(|r| r.precision == Some(Precision::Fp32) && !r.failed())
        .ok_or("no FP32 result to compare with")?;
    let fp32 = arts
        .predictions
        .get(fp32_k)
        .and_then(|p| p.get(i))
        .ok_or("no FP32 prediction for this image")?;
    let file = wb
        .results
        .report
        .as_ref()
        .and_then(|r| r.evaluation.image_files.get(i).cloned());
    let (h, w) = (hw[0] as u32, hw[1] as u32);
    let img = file
        .as_deref()
        .and_then(|f| crate::data::open_rgb(f).ok())
        .map(|img| image::imageops::resize(&img, w, h, image::imageops::FilterType::Triangle))
        .unwrap_or_else(|| image::RgbImage::from_pixel(w, h, image::Rgb([64, 64, 64])));
    let others: Vec<(String, &[u8])> = wb
        .masks
        .engines
        .iter()
        .flatten()
        .filter_map(|&k| {
            let m = arts.predictions.get(k)?.get(i)?;
            Some((rows.get(k)?.label(), m.as_slice()))
        })
        .collect();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or("the file name is not valid")?;
    crate::report::write_mask_overlays(dir, stem, &img, fp32, &others)
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uv_rect_stays_inside_the_image() {
        let r = uv_rect(4.0, vec2(0.0, 1.0));
        assert!(r.min.x >= 0.0 && r.max.y <= 1.0);
        assert!((r.width() - 0.25).abs() < 1e-6);
        assert_eq!(
            uv_rect(1.0, vec2(0.9, 0.1)),
            Rect::from_min_max(pos2(0.0, 0.0), pos2(1.0, 1.0))
        );
    }

    #[test]
    fn disagreement_marks_only_differing_pixels() {
        let img = disagreement_image(&[1, 2, 3, 4], &[1, 0, 3, 0], [2, 2]);
        let red: Vec<bool> = img
            .pixels
            .iter()
            .map(|p| *p != Color32::TRANSPARENT)
            .collect();
        assert_eq!(red, vec![false, true, false, true]);
    }
}
