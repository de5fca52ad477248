//! The Data panel: calibration folder (count, thumbnails), evaluation set (kind, count,
//! classes), the preprocessing editor and a live preview of one preprocessed image (decoded
//! on the I/O thread).

use super::{PathKind, path_field_ui};
use crate::data::{ChannelOrder, Normalize, ResizeMode};
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

fn preprocess_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    ui.label(egui::RichText::new("Preprocessing").strong())
        .on_hover_text("How an image becomes the model's input");
    let pre = &mut exp.preprocess;
    egui::Grid::new("data.pre").num_columns(2).show(ui, |ui| {
        ui.label("Resize");
        ui.horizontal(|ui| {
            ui.radio_value(&mut pre.resize, ResizeMode::Stretch, "stretch")
                .on_hover_text("Resize both sides to the input size, ignoring aspect ratio");
            ui.radio_value(&mut pre.resize, ResizeMode::Crop, "crop")
                .on_hover_text("Resize the short side to fit, then cut the centre");
        });
        ui.end_row();
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
        ui.horizontal(|ui| {
            let mean_std = matches!(pre.normalize, Normalize::MeanStd { .. });
            if ui
                .radio(mean_std, "mean/std")
                .on_hover_text("(x / 255 - mean) / std per channel")
                .clicked()
                && !mean_std
            {
                pre.normalize = Normalize::default();
            }
            if ui
                .radio(!mean_std, "scale/offset")
                .on_hover_text("x * scale + offset on raw 0..255 values")
                .clicked()
                && mean_std
            {
                pre.normalize = Normalize::ScaleOffset {
                    scale: 1.0 / 255.0,
                    offset: 0.0,
                };
            }
        });
        ui.end_row();
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
