//! Preprocessing as a user meets it: presets and crop flags on the command line, experiment
//! files written before the crop/letterbox/interpolation fields existed, and the Data panel's
//! preset, resize, crop and interpolation controls.

use clap::Parser;
use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use quantscope::cli::{Cli, Command};
use quantscope::data::{ChannelOrder, Interpolation, Normalize, Preprocess, Preset, ResizeMode};
use quantscope::experiment::Experiment;
use quantscope::ui::Workbench;
use quantscope::ui::testing::sample_workbench;

fn eval_args(flags: &[&str]) -> Box<quantscope::cli::EvalArgs> {
    let argv = ["quantscope", "eval", "--model", "m.onnx"]
        .iter()
        .chain(flags)
        .copied();
    match Cli::try_parse_from(argv).expect("flags parse").command {
        Some(Command::Eval(a)) => a,
        other => panic!("not eval: {other:?}"),
    }
}

#[test]
fn old_experiment_files_load_with_the_old_preprocessing() {
    // An experiment as quantscope wrote it before crop_pct, interpolation and letterbox.
    let old = r#"(
        version: 1,
        model: "m.onnx",
        preprocess: (
            resize: crop,
            size: Some((224, 224)),
            channel_order: BGR,
            normalize: ScaleOffset(scale: 1.0, offset: 0.0),
        ),
    )"#;
    let e = Experiment::from_ron(old).expect("an old file loads");
    let p = &e.preprocess;
    assert_eq!(p.resize, ResizeMode::Crop);
    assert_eq!(p.size, Some([224, 224]));
    assert_eq!(p.channel_order, ChannelOrder::Bgr);
    // Short side straight to the input, bilinear: what `crop` always did.
    assert_eq!(p.crop_pct, 1.0);
    assert_eq!(p.resize_short_px, None);
    assert_eq!(p.interpolation, Interpolation::Bilinear);
    assert_eq!(p.geometry([375, 500], [224, 224]).resized_hw[0], 224);
    // No preprocess section at all: stretch, ImageNet mean/std, as before.
    let e = Experiment::from_ron(r#"(version: 1, model: "m.onnx")"#).expect("loads");
    assert_eq!(e.preprocess, Preprocess::default());
    assert_eq!(e.preprocess.resize, ResizeMode::Stretch);
    // A file with the new fields round-trips.
    let mut e = Experiment::default();
    Preset::TimmInception.apply(&mut e.preprocess);
    e.preprocess.resize_short_px = Some(320);
    let back = Experiment::from_ron(&ron::to_string(&e).expect("ron")).expect("reloads");
    assert_eq!(back.preprocess, e.preprocess);
}

#[test]
fn bad_crop_settings_in_a_file_are_refused_by_name() {
    let e = Experiment::from_ron(
        r#"(version: 1, model: "m.onnx", preprocess: (resize: crop, crop_pct: 1.5))"#,
    )
    .expect("parses");
    let msg = e.validate().expect_err("1.5 is outside (0, 1]");
    assert!(msg.contains("--crop-pct") && msg.contains("1.5"), "{msg}");
}

#[test]
fn preset_flag_sets_the_fields_and_explicit_flags_override() {
    let e = eval_args(&["--preset", "torchvision"]).to_experiment();
    assert_eq!(e.preprocess.resize, ResizeMode::Crop);
    assert_eq!(e.preprocess.crop_pct, 0.875);
    assert_eq!(
        Preset::matching(&e.preprocess),
        Some(Preset::TorchvisionImagenet)
    );

    let a = eval_args(&[
        "--preset",
        "caffe",
        "--interpolation",
        "bicubic",
        "--crop-pct",
        "0.95",
    ]);
    a.check_preprocess_flags().expect("consistent");
    let p = a.to_experiment().preprocess;
    assert_eq!(p.channel_order, ChannelOrder::Bgr);
    assert_eq!(p.interpolation, Interpolation::Bicubic);
    assert_eq!(p.crop_pct, 0.95);
    assert!(matches!(p.normalize, Normalize::MeanStd { std, .. } if std == [1.0 / 255.0; 3]));

    let p = eval_args(&["--preset", "raw", "--mean", "0.5", "--std", "0.5"])
        .to_experiment()
        .preprocess;
    assert_eq!(p.resize, ResizeMode::Stretch);
    assert_eq!(
        p.normalize,
        Normalize::MeanStd {
            mean: [0.5; 3],
            std: [0.5; 3]
        }
    );

    // --resize-short alone means crop; no flag keeps the old default (stretch).
    let p = eval_args(&["--resize-short", "256"])
        .to_experiment()
        .preprocess;
    assert_eq!((p.resize, p.resize_short_px), (ResizeMode::Crop, Some(256)));
    assert_eq!(
        eval_args(&[]).to_experiment().preprocess,
        Preprocess::default()
    );
    let p = eval_args(&["--resize", "letterbox", "--pad-value", "0"])
        .to_experiment()
        .preprocess;
    assert_eq!((p.resize, p.pad_value), (ResizeMode::Letterbox, 0));
}

#[test]
fn contradictory_preprocessing_flags_are_refused() {
    let msg = eval_args(&["--resize", "stretch", "--crop-pct", "0.875"])
        .check_preprocess_flags()
        .expect_err("stretch ignores the crop")
        .to_string();
    assert!(
        msg.contains("--crop-pct") && msg.contains("stretch"),
        "{msg}"
    );
    assert!(
        eval_args(&["--resize", "crop", "--pad-value", "0"])
            .check_preprocess_flags()
            .is_err()
    );
    assert!(
        Cli::try_parse_from([
            "quantscope",
            "eval",
            "--model",
            "m.onnx",
            "--crop-pct",
            "0.9",
            "--resize-short",
            "256"
        ])
        .is_err(),
        "one way to say the short side"
    );
    let help = match Cli::try_parse_from(["quantscope", "eval", "--help"]) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("--help prints help"),
    };
    for name in [
        "--preset",
        "torchvision",
        "timm-inception",
        "raw",
        "caffe",
        "--crop-pct",
    ] {
        assert!(help.contains(name), "--help lists {name}");
    }
}

fn harness(wb: Workbench) -> Harness<'static, Workbench> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), wb)
}

#[test]
fn data_panel_picks_a_preset_crop_and_interpolation() {
    let mut h = harness(sample_workbench());
    h.run();
    // The sample's settings are no named convention.
    h.get_by_value("custom").click();
    h.run();
    h.get_by_label("torchvision").click();
    h.run();
    let p = &h.state().exp.preprocess;
    assert_eq!(Preset::matching(p), Some(Preset::TorchvisionImagenet));
    assert_eq!(p.resize, ResizeMode::Crop);
    // The crop row appears in crop mode and says what the ratio does at the 48x64 input.
    h.get_by_label_contains("short side to 54 px, centre 48×64");
    h.get_by_value("bilinear").click();
    h.run();
    h.get_by_label("bicubic").click();
    h.run();
    assert_eq!(
        h.state().exp.preprocess.interpolation,
        Interpolation::Bicubic
    );
    h.get_by_value("custom");
    h.get_by_label("letterbox").click();
    h.run();
    assert_eq!(h.state().exp.preprocess.resize, ResizeMode::Letterbox);
    h.get_by_label("Padding");
}
