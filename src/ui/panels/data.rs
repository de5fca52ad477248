//! The Data panel: calibration folder (count, thumbnails), evaluation set (kind, count,
//! classes), the preprocessing editor and a live preview of one preprocessed image (decoded
//! on the I/O thread).

use super::{PathKind, path_field_ui};
use crate::data::{
    ChannelOrder, Interpolation, Normalize, NormalizeSource, Preprocess, Preset, ResizeMode,
};
use crate::experiment::{Experiment, TaskChoice};
use crate::model::Task;
use crate::ui::{Command, Scan, Workbench, theme};
use eframe::egui;

pub fn data_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    calib_folder_ui(wb, exp, ui);
    ui.separator();
    eval_ui(wb, exp, ui);
    ui.separator();
    preprocess_ui(wb, exp, ui);
}

fn calib_folder_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    if let Some(dir) = path_field_ui(
        wb,
        ui,
        "Calibration:",
        exp.calibration.dir.as_deref(),
        PathKind::Folder,
        Some(Command::ChooseCalibDir),
        "Folder of calibration images (searched recursively): type, drop or choose it",
    ) {
        exp.calibration.dir = dir;
    }
    if let Some(s) = scan_state_ui(ui, &wb.data.calib, "The folder could not be read") {
        ui.label(format!(
            "{} images, {} selected{}",
            s.total,
            s.selected,
            if s.skipped_files > 0 {
                format!(", {} other files skipped", s.skipped_files)
            } else {
                String::new()
            }
        ))
        .on_hover_text("Images found and images the selection takes");
        egui::ScrollArea::horizontal()
            .id_salt("data.thumbs")
            .max_height(56.0)
            .show(ui, |ui| {
                ui.horizontal(|ui| {
                    for (p, t) in &wb.data.thumbs {
                        ui.add(egui::Image::new(t).fit_to_exact_size(egui::vec2(48.0, 48.0)))
                            .on_hover_text(p.display().to_string());
                    }
                });
            });
    }
}

/// A spinner while a folder scan runs, its error if it failed; its result once done.
fn scan_state_ui<'a, T>(ui: &mut egui::Ui, scan: &'a Scan<T>, failed_hover: &str) -> Option<&'a T> {
    match scan {
        Scan::None => None,
        Scan::Loading(_) => {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label("scanning…");
            });
            None
        }
        Scan::Failed(e) => {
            ui.colored_label(theme::ERROR, e)
                .on_hover_text(failed_hover);
            None
        }
        Scan::Done(s) => Some(s),
    }
}

fn eval_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    if let Some(dir) = path_field_ui(
        wb,
        ui,
        "Evaluation:",
        exp.evaluation.dir.as_deref(),
        PathKind::Folder,
        Some(Command::ChooseEvalDir),
        "ImageFolder (<class>/<image>) or images/ + masks/ folder: type, drop or choose it",
    ) {
        exp.evaluation.dir = dir;
    }
    let beside = exp
        .labels_file()
        .filter(|_| exp.evaluation.labels.is_none());
    let hover = match &beside {
        Some(f) => format!(
            "Class names, one per line, in output order. Now: {} (found beside the model)",
            f.display()
        ),
        None => "Class names, one per line, in output order (default: <model>.labels.txt \
                 beside the model, or labels.txt in the evaluation folder)"
            .to_string(),
    };
    if let Some(l) = path_field_ui(
        wb,
        ui,
        "Labels:",
        exp.evaluation.labels.as_deref(),
        PathKind::Labels,
        Some(Command::ChooseLabels),
        &hover,
    ) {
        exp.evaluation.labels = l;
    }
    if let Some(f) = beside {
        ui.weak(format!(
            "class names from {}",
            f.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        ))
        .on_hover_text(f.display().to_string());
    }
    if let Some(s) = scan_state_ui(ui, &wb.data.eval, "The evaluation set could not be read") {
        let kind = match s.kind {
            Task::Classification => "classification (ImageFolder)",
            Task::Segmentation => "segmentation (images + masks)",
        };
        ui.label(format!(
            "{kind}, {} images, {} classes",
            s.count,
            s.classes.len()
        ))
        .on_hover_text(if s.classes.is_empty() {
            "No class names found".to_string()
        } else {
            s.classes.join(", ")
        });
    }
    ui.horizontal(|ui| {
        ui.label("Task:");
        egui::ComboBox::from_id_salt("data.task")
            .selected_text(match exp.evaluation.task {
                TaskChoice::Auto => "auto",
                TaskChoice::Classification => "classification",
                TaskChoice::Segmentation => "segmentation",
            })
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut exp.evaluation.task, TaskChoice::Auto, "auto");
                ui.selectable_value(
                    &mut exp.evaluation.task,
                    TaskChoice::Classification,
                    "classification",
                );
                ui.selectable_value(
                    &mut exp.evaluation.task,
                    TaskChoice::Segmentation,
                    "segmentation",
                );
            })
            .response
            .on_hover_text("Auto: from the model's output shape and the folder's layout");
    });
    ui.horizontal(|ui| {
        let mut limit = exp.evaluation.count.is_some();
        ui.checkbox(&mut limit, "At most")
            .on_hover_text("Evaluate on a subset (balanced over classes for ImageFolder)");
        let mut n = exp.evaluation.count.unwrap_or(100);
        ui.add_enabled(limit, egui::DragValue::new(&mut n).range(1..=100_000))
            .on_hover_text("Number of evaluation images");
        ui.label("images");
        exp.evaluation.count = limit.then_some(n);
    });
    ui.checkbox(
        &mut exp.evaluation.skip_calibration_images,
        "Skip calibration images",
    )
    .on_hover_text("Leave out evaluation images that are also calibration images");
}

/// A combo of the named conventions; shows the one the settings match, else "custom".
fn preset_ui(pre: &mut Preprocess, ui: &mut egui::Ui) {
    let current = Preset::matching(pre);
    egui::ComboBox::from_id_salt("data.preset")
        .selected_text(current.map_or("custom", Preset::name))
        .show_ui(ui, |ui| {
            for p in Preset::ALL {
                if ui
                    .selectable_label(current == Some(p), p.name())
                    .on_hover_text(p.description())
                    .clicked()
                {
                    p.apply(pre);
                }
            }
        })
        .response
        .on_hover_text(current.map_or(
            "Settings of no named convention; pick one to set resize, crop, interpolation, channels and normalisation",
            Preset::description,
        ));
}

fn interpolation_ui(interpolation: &mut Interpolation, ui: &mut egui::Ui) {
    let hover = |i: Interpolation| match i {
        Interpolation::Nearest => {
            "Resampling: the source pixel under each output pixel (Pillow NEAREST)"
        }
        Interpolation::Bilinear => {
            "Resampling: triangle filter, antialiased when shrinking (Pillow / torchvision BILINEAR)"
        }
        Interpolation::Bicubic => {
            "Resampling: Catmull-Rom cubic, a = -0.5 (Pillow BICUBIC, timm bicubic)"
        }
    };
    egui::ComboBox::from_id_salt("data.interpolation")
        .selected_text(interpolation.name())
        .show_ui(ui, |ui| {
            for i in Interpolation::ALL {
                ui.selectable_value(interpolation, i, i.name())
                    .on_hover_text(hover(i));
            }
        })
        .response
        .on_hover_text(hover(*interpolation));
}

/// Crop ratio (timm's crop_pct) and what it means at this input size.
fn crop_ui(pre: &mut Preprocess, input_hw: [usize; 2], ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        if let Some(n) = pre.resize_short_px {
            ui.label(format!("short side {n} px"));
            if ui
                .small_button("use ratio")
                .on_hover_text("Resize by the crop ratio instead of a fixed short side")
                .clicked()
            {
                pre.resize_short_px = None;
            }
            return;
        }
        ui.add(
            egui::DragValue::new(&mut pre.crop_pct)
                .range(0.05..=1.0)
                .speed(0.005)
                .max_decimals(4),
        )
        .on_hover_text(
            "Share of the resized image the centre crop keeps (timm crop_pct): 0.875 resizes \
             the short side to 256 and crops 224; 1 resizes straight to the input",
        );
        let [h, w] = input_hw;
        let short = ((h.min(w) as f64) / pre.crop_pct).floor() as usize;
        ui.weak(format!("short side to {short} px, centre {h}×{w}"));
    });
}

fn preprocess_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    let input_hw = exp.preprocess.size.unwrap_or_else(|| wb.input_hw());
    let pre = &mut exp.preprocess;
    // The preset shares the heading's row: the left column is tall already, and the Build
    // panel below it must stay on a laptop screen.
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new("Preprocessing").strong())
            .on_hover_text("How an image becomes the model's input");
        ui.label("preset");
        preset_ui(pre, ui);
    });
    egui::Grid::new("data.pre").num_columns(2).show(ui, |ui| {
        ui.label("Resize");
        ui.horizontal(|ui| {
            ui.radio_value(&mut pre.resize, ResizeMode::Stretch, "stretch")
                .on_hover_text("Resize both sides to the input size, ignoring aspect ratio");
            ui.radio_value(&mut pre.resize, ResizeMode::Crop, "crop")
                .on_hover_text(
                    "Resize the short side (to input / crop ratio), then cut the centre \
                     (torchvision Resize + CenterCrop)",
                );
            ui.radio_value(&mut pre.resize, ResizeMode::Letterbox, "letterbox")
                .on_hover_text(
                    "Keep the aspect ratio, fit the long side, pad the rest (detectors)",
                );
        });
        ui.end_row();
        ui.label("Resample");
        interpolation_ui(&mut pre.interpolation, ui);
        ui.end_row();
        match pre.resize {
            ResizeMode::Stretch => {}
            ResizeMode::Crop => {
                ui.label("Crop ratio");
                crop_ui(pre, input_hw, ui);
                ui.end_row();
            }
            ResizeMode::Letterbox => {
                ui.label("Padding");
                ui.add(egui::DragValue::new(&mut pre.pad_value).range(0..=255))
                    .on_hover_text(
                        "Raw 0..255 value of the padding, on every channel (ultralytics: 114)",
                    );
                ui.end_row();
            }
        }
        ui.label("Size");
        ui.horizontal(|ui| {
            let mut own = pre.size.is_none();
            ui.checkbox(&mut own, "model's")
                .on_hover_text("Use the model's own input size");
            let [mut h, mut w] = pre.size.unwrap_or_else(|| wb.input_hw());
            ui.add_enabled(!own, egui::DragValue::new(&mut h).range(1..=4096))
                .on_hover_text("Input height in pixels");
            ui.label("×");
            ui.add_enabled(!own, egui::DragValue::new(&mut w).range(1..=4096))
                .on_hover_text("Input width in pixels");
            pre.size = (!own).then_some([h, w]);
        });
        ui.end_row();
        ui.label("Channels");
        ui.horizontal(|ui| {
            ui.radio_value(&mut pre.channel_order, ChannelOrder::Rgb, "RGB")
                .on_hover_text("Channel order the model expects: red, green, blue");
            ui.radio_value(&mut pre.channel_order, ChannelOrder::Bgr, "BGR")
                .on_hover_text("Channel order the model expects: blue, green, red (Caffe-style)");
        });
        ui.end_row();
        ui.label("Normalise");
        // Auto resolves as a run would: the model's metadata, else ImageNet (assumed).
        let meta = wb
            .model
            .info
            .as_ref()
            .and_then(|i| i.normalization.as_ref());
        let (resolved, source) = pre.resolved(meta);
        ui.horizontal(|ui| {
            if ui
                .radio(pre.auto_normalize, "auto")
                .on_hover_text(
                    "The normalisation in the model's metadata if the exporter wrote one, \
                     else ImageNet mean/std (assumed, and said so in the results)",
                )
                .clicked()
            {
                pre.auto_normalize = true;
            }
            let mean_std = matches!(pre.normalize, Normalize::MeanStd { .. });
            if ui
                .radio(!pre.auto_normalize && mean_std, "mean/std")
                .on_hover_text("(x / 255 - mean) / std per channel")
                .clicked()
            {
                // From auto, start from the values auto would use.
                if pre.auto_normalize {
                    pre.normalize = resolved.normalize;
                }
                if !matches!(pre.normalize, Normalize::MeanStd { .. }) {
                    pre.normalize = Normalize::default();
                }
                pre.auto_normalize = false;
            }
            if ui
                .radio(!pre.auto_normalize && !mean_std, "scale/offset")
                .on_hover_text("x * scale + offset on raw 0..255 values")
                .clicked()
            {
                if mean_std {
                    pre.normalize = Normalize::ScaleOffset {
                        scale: 1.0 / 255.0,
                        offset: 0.0,
                    };
                }
                pre.auto_normalize = false;
            }
        });
        ui.end_row();
        if pre.auto_normalize {
            ui.label("");
            let line = source.describe(&resolved.normalize);
            let text = match source {
                NormalizeSource::Assumed => egui::RichText::new(format!(
                    "assumed: ImageNet {}",
                    resolved.normalize.describe()
                ))
                .color(theme::WARN),
                _ => egui::RichText::new(format!(
                    "from the model: {}",
                    resolved.normalize.describe()
                )),
            };
            ui.add(egui::Label::new(text.small()).wrap())
                .on_hover_text(line);
            ui.end_row();
            return;
        }
        match &mut pre.normalize {
            Normalize::MeanStd { mean, std } => {
                ui.label("Mean");
                ui.horizontal(|ui| {
                    for (c, v) in mean.iter_mut().enumerate() {
                        ui.add(
                            egui::DragValue::new(v)
                                .speed(0.001)
                                .range(-10.0..=10.0)
                                .max_decimals(4),
                        )
                        .on_hover_text(format!("Mean of channel {c} (0..1 scale)"));
                    }
                });
                ui.end_row();
                ui.label("Std");
                ui.horizontal(|ui| {
                    for (c, v) in std.iter_mut().enumerate() {
                        ui.add(
                            egui::DragValue::new(v)
                                .speed(0.001)
                                .range(1e-4..=10.0)
                                .max_decimals(4),
                        )
                        .on_hover_text(format!("Standard deviation of channel {c} (0..1 scale)"));
                    }
                });
                ui.end_row();
            }
            Normalize::ScaleOffset { scale, offset } => {
                ui.label("Scale");
                ui.add(egui::DragValue::new(scale).speed(0.0001).max_decimals(6))
                    .on_hover_text("Multiplies the raw 0..255 value");
                ui.end_row();
                ui.label("Offset");
                ui.add(egui::DragValue::new(offset).speed(0.01).max_decimals(4))
                    .on_hover_text("Added after scaling");
                ui.end_row();
            }
        }
    });
    match (&wb.data.preview, &wb.data.preview_tex) {
        (Scan::Loading(_), _) => {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label("preview…");
            });
        }
        (Scan::Failed(e), _) => {
            ui.colored_label(theme::ERROR, format!("preview: {e}"))
                .on_hover_text("The preview image could not be made");
        }
        (Scan::Done(p), Some([resized, tensor])) => {
            ui.horizontal(|ui| {
                ui.vertical(|ui| {
                    ui.add(egui::Image::new(resized).fit_to_exact_size(egui::vec2(120.0, 120.0)))
                        .on_hover_text(format!("{} resized", p.source.display()));
                    ui.small("resized");
                });
                ui.vertical(|ui| {
                    ui.add(egui::Image::new(tensor).fit_to_exact_size(egui::vec2(120.0, 120.0)))
                        .on_hover_text(
                            "The input tensor, each channel stretched to its range for display",
                        );
                    ui.small("tensor");
                });
            });
            let ranges: Vec<String> = p
                .channel_range
                .iter()
                .map(|[lo, hi]| format!("[{lo:.2}, {hi:.2}]"))
                .collect();
            ui.small(format!("value range per channel: {}", ranges.join(" ")))
                .on_hover_text("Min and max of the normalised input values");
        }
        _ => {
            ui.weak("Choose a calibration or evaluation folder to preview an image.");
        }
    }
}
