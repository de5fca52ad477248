//! The Calibration panel: method (max, percentile with its p, MSE, entropy), how many
//! calibration images, "compare all methods", cross-layer equalization (auto/on/off),
//! activation centering, the recipe (fast/best) and its parts: weight rounding (nearest/GPTQ)
//! and bias correction.

use crate::calib::Method;
use crate::data::Selection;
use crate::experiment::Experiment;
use crate::prepare::Recipe;
use crate::prepare::center::CenterSetting;
use crate::prepare::cle::CleSetting;
use crate::prepare::gptq::WeightRounding;
use crate::ui::Workbench;
use eframe::egui;

fn method_help(m: Method) -> &'static str {
    match m {
        Method::Max => "amax = max |x| seen during calibration",
        Method::Percentile => "amax = the value below which p % of |x| lies",
        Method::Mse => "amax minimising the mean squared quantisation error",
        Method::Entropy => "TensorRT's KL-divergence search (IInt8EntropyCalibrator2)",
    }
}

/// A recipe in the combo, with what it costs (whole `eval` runs measured on the 2-core AMD
/// EPYC development machine with ONNX Runtime, 18 and 74 s; README's accuracy section).
fn recipe_label(r: Recipe) -> &'static str {
    match r {
        Recipe::Fast => "fast: calibration only (DeepLabV3 257², 32 images: 18 s a run)",
        Recipe::Best => "best: + GPTQ and bias correction (DeepLabV3: about 1 min more)",
    }
}

pub fn calibration_ui(wb: &mut Workbench, exp: &mut Experiment, ui: &mut egui::Ui) {
    let mut all = Method::ALL.iter().all(|m| exp.methods.contains(m));
    let mut primary = wb.primary_method;
    ui.horizontal_wrapped(|ui| {
        ui.label("Method:");
        for m in Method::ALL {
            let tip = match all {
                true => format!(
                    "{}. With \"Compare all methods\" ticked, this method's engine comes first \
                     and is the one the Masks tab and mixed precision start from",
                    method_help(m)
                ),
                false => method_help(m).to_string(),
            };
            ui.radio_value(&mut primary, m, m.name()).on_hover_text(tip);
        }
    });
    ui.horizontal(|ui| {
        ui.label("Percentile p:");
        ui.add_enabled(
            primary == Method::Percentile || all,
            egui::DragValue::new(&mut exp.percentile)
                .range(90.0..=100.0)
                .speed(0.001)
                .max_decimals(4)
                .suffix(" %"),
        )
        .on_hover_text("p for the percentile method (99.99 by default)");
    });
    ui.checkbox(&mut all, "Compare all methods").on_hover_text(
        "Build one INT8 engine per method from the same statistics (switching is instant)",
    );
    ui.horizontal(|ui| {
        ui.label("Equalize:");
        egui::ComboBox::from_id_salt("calib.cle")
            .selected_text(exp.cle.name())
            .show_ui(ui, |ui| {
                for c in CleSetting::ALL {
                    ui.selectable_value(&mut exp.cle, c, c.name());
                }
            })
            .response
            .on_hover_text(
                "Cross-layer equalization before calibration: rescales the channels between two \
                 convs so their weight ranges match (the FP32 rows keep the original model). \
                 auto: on where a depthwise conv is in a pair with no Clip (ReLU6) between",
            );
        let mut on = exp.center == CenterSetting::On;
        ui.checkbox(&mut on, "center ReLU").on_hover_text(
            "Activation centering: each ReLU/ReLU6 output read only by unpadded or depthwise \
             convs is shifted by half its calibration range, so int8 spends all 255 steps on it \
             instead of 128; exact in float (the convs' biases absorb the shift, and a \
             depthwise conv with zero padding reads a Pad that pads with the shift's negative, \
             which the engines fold back into the conv)",
        );
        exp.center = if on {
            CenterSetting::On
        } else {
            CenterSetting::Off
        };
    });
    ui.horizontal(|ui| {
        ui.label("Recipe:");
        let now = Recipe::of(exp.weight_rounding, exp.bias_correction);
        egui::ComboBox::from_id_salt("calib.recipe")
            .selected_text(now.map_or("custom", Recipe::name))
            .show_ui(ui, |ui| {
                for r in Recipe::ALL {
                    if ui
                        .selectable_label(now == Some(r), recipe_label(r))
                        .clicked()
                    {
                        r.apply(&mut exp.weight_rounding, &mut exp.bias_correction);
                    }
                }
            })
            .response
            .on_hover_text(
                "best (the default): GPTQ weight rounding + bias correction, the most accurate \
                 measured; fast: calibration only. custom: the two settings below set apart",
            );
    });
    ui.horizontal(|ui| {
        ui.label("Weights:");
        egui::ComboBox::from_id_salt("calib.weight_rounding")
            .selected_text(exp.weight_rounding.name())
            .show_ui(ui, |ui| {
                for r in WeightRounding::ALL {
                    ui.selectable_value(&mut exp.weight_rounding, r, r.name());
                }
            })
            .response
            .on_hover_text(
                "How the INT8 weights are rounded. nearest: each weight to its nearest int8 step. \
                 gptq: rounded together so each layer's output on the calibration images stays \
                 closest to FP32 (same scales, same Q/DQ format; a few seconds more)",
            );
        ui.checkbox(&mut exp.bias_correction, "bias correction")
            .on_hover_text(
                "Shift each INT8 layer's float bias so its output keeps the FP32 mean per \
                 channel, measured on the calibration images in the whole quantized model \
                 (full, as NNCF), or per layer or not at all where that is clearly closer to \
                 FP32; the log says which and by what margin",
            );
        ui.add_enabled(
            exp.bias_correction || exp.weight_rounding == WeightRounding::Gptq,
            egui::DragValue::new(&mut exp.correction_images)
                .range(1..=4096)
                .suffix(" images"),
        )
        .on_hover_text(
            "GPTQ and bias correction measure each layer on the first this-many calibration \
             images (the ranges use them all); more cost time in proportion (32 by default)",
        );
    });
    if primary != wb.primary_method {
        wb.primary_method = primary;
    }
    // The chosen method first: its row leads the table and is the Masks tab's default.
    let methods = if all {
        std::iter::once(primary)
            .chain(Method::ALL.into_iter().filter(|&m| m != primary))
            .collect()
    } else {
        vec![primary]
    };
    if methods != exp.methods {
        exp.methods = methods;
    }
    ui.horizontal(|ui| {
        ui.label("Images:");
        let (mut mode, mut n) = match exp.calibration.select {
            Selection::All => (0, 128),
            Selection::First(n) => (1, n),
            Selection::EveryNth(k) => (2, k),
        };
        egui::ComboBox::from_id_salt("calib.select")
            .selected_text(["all", "first", "every k-th"][mode])
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut mode, 0, "all");
                ui.selectable_value(&mut mode, 1, "first");
                ui.selectable_value(&mut mode, 2, "every k-th");
            })
            .response
            .on_hover_text("Which calibration images to use, in sorted order");
        if mode != 0 {
            ui.add(egui::DragValue::new(&mut n).range(1..=100_000))
                .on_hover_text(if mode == 1 {
                    "Number of calibration images"
                } else {
                    "Take every k-th image"
                });
        }
        exp.calibration.select = match mode {
            0 => Selection::All,
            1 => Selection::First(n),
            _ => Selection::EveryNth(n),
        };
    });
}
