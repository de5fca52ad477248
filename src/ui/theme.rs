//! Dark and light themes and the colours the charts and tables share.

use eframe::egui;
use egui::Color32;

use crate::backend::Precision;
use crate::calib::Method;
use crate::report::Row;

pub fn apply(ctx: &egui::Context, light: bool) {
    ctx.set_theme(if light {
        egui::Theme::Light
    } else {
        egui::Theme::Dark
    });
}

pub const ERROR: Color32 = Color32::from_rgb(230, 80, 80);
pub const WARN: Color32 = Color32::from_rgb(220, 160, 40);
pub const GOOD: Color32 = Color32::from_rgb(90, 180, 110);

/// A colour per calibration method, the same in every chart.
pub fn method_color(m: Method) -> Color32 {
    match m {
        Method::Max => Color32::from_rgb(230, 97, 1),
        Method::Percentile => Color32::from_rgb(94, 60, 153),
        Method::Mse => Color32::from_rgb(27, 158, 119),
        Method::Entropy => Color32::from_rgb(217, 95, 150),
    }
}

/// A colour per engine row.
pub fn row_color(r: &Row) -> Color32 {
    match (r.precision, r.method) {
        (Some(Precision::Fp32), _) => Color32::from_rgb(70, 130, 200),
        (Some(Precision::Fp16), _) => Color32::from_rgb(120, 175, 230),
        (Some(Precision::Int8), Some(m)) => method_color(m),
        // Teal: apart from the INT8 methods' colours (FP8 rows are max-calibrated too).
        (Some(Precision::Fp8), _) => Color32::from_rgb(0, 150, 160),
        _ => Color32::GRAY,
    }
}

/// Red for a large drop, amber for a small one, green otherwise (points of accuracy).
pub fn delta_color(delta_pt: f64) -> Color32 {
    if delta_pt <= -2.0 {
        ERROR
    } else if delta_pt <= -0.5 {
        WARN
    } else {
        GOOD
    }
}

pub fn class_color32(c: u8) -> Color32 {
    let [r, g, b] = crate::report::class_color(c);
    Color32::from_rgb(r, g, b)
}
