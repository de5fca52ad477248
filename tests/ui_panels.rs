//! Interaction tests for each panel and tab of the workbench: find a control by its label,
//! click it, check the command or state it produced. No renderer needed.

use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use quantscope::backend::Precision;
use quantscope::calib::Method;
use quantscope::data::{Normalize, ResizeMode};
use quantscope::ui::testing::sample_workbench;
use quantscope::ui::{Command, Tab, Workbench};

fn harness(wb: Workbench) -> Harness<'static, Workbench> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), wb)
}

fn applied(h: &Harness<'_, Workbench>, pred: impl Fn(&Command) -> bool) -> bool {
    h.state().history.iter().any(pred)
}

#[test]
fn model_panel_shows_the_model_and_unsupported_ops() {
    let mut h = harness(sample_workbench());
    h.run();
    h.get_by_label("Opset");
    h.get_by_label_contains("1 unsupported op");
    h.get_by_label_contains("GridSample (node `warp/grid`)");
    h.get_by_label_contains("x [1×3×48×64]");
    // The panel's Open… button asks for a file dialog.
    h.get_all_by_label("Open…")
        .next()
        .expect("an Open… button")
        .click();
    h.run();
    assert!(applied(&h, |c| *c == Command::OpenDialog));
}

#[test]
fn data_panel_edits_preprocessing() {
    let mut h = harness(sample_workbench());
    h.run();
    h.get_by_label("crop").click();
    h.run();
    assert_eq!(h.state().exp.preprocess.resize, ResizeMode::Crop);
    assert!(applied(&h, |c| matches!(c, Command::SetExperiment(_))));
    h.get_by_label("scale/offset").click();
    h.run();
    assert!(matches!(
        h.state().exp.preprocess.normalize,
        Normalize::ScaleOffset { .. }
    ));
    h.get_by_label("BGR").click();
    h.run();
    assert_eq!(
        h.state().exp.preprocess.channel_order,
        quantscope::data::ChannelOrder::Bgr
    );
    // Choosing a folder goes through a dialog on the I/O thread.
    h.get_all_by_label("Choose…")
        .next()
        .expect("a Choose… button")
        .click();
    h.run();
    assert!(applied(&h, |c| *c == Command::ChooseCalibDir));
}

#[test]
fn calibration_panel_picks_methods() {
    let mut h = harness(sample_workbench());
    h.run();
    assert_eq!(h.state().exp.methods, Method::ALL.to_vec());
    h.get_by_label("Compare all methods").click();
    h.run();
    assert_eq!(h.state().exp.methods.len(), 1);
    h.get_by_label("mse").click();
    h.run();
    assert_eq!(h.state().exp.methods, vec![Method::Mse]);
    h.get_by_label("Compare all methods").click();
    h.run();
    assert_eq!(h.state().exp.methods, Method::ALL.to_vec());
}

#[test]
fn build_panel_precisions_backend_and_run() {
    let mut h = harness(sample_workbench());
    h.run();
    let cuda = h.get_by_label("CUDA");
    assert!(
        cuda.accesskit_node().is_disabled(),
        "CUDA is disabled without a driver"
    );
    h.get_all_by_role_and_label(egui::accesskit::Role::CheckBox, "FP16")
        .next()
        .expect("the FP16 checkbox")
        .click();
    h.run();
    assert_eq!(
        h.state().exp.precisions,
        vec![Precision::Fp32, Precision::Int8]
    );
    // The Build panel's button, not the menu bar's "Run".
    h.get_all_by_label("Run")
        .find(|n| n.rect().min.y > 40.0)
        .expect("a Run button")
        .scroll_to_me();
    h.run();
    h.get_all_by_label("Run")
        .find(|n| n.rect().min.y > 40.0)
        .expect("a Run button")
        .click();
    h.run();
    assert!(applied(&h, |c| *c == Command::Run));
    // No worker in this test: the run is refused with a logged error, not a panic.
    assert!(h.state().log.iter().any(|l| l.error));
}

#[test]
fn compare_tab_labels_simulated_rows() {
    let mut h = harness(sample_workbench());
    h.run();
    h.get_by_label("FP16 (simulated on CPU)");
    h.get_by_label("simulated on CPU");
    assert!(h.get_all_by_label("INT8 entropy").count() >= 1);
}

#[test]
fn tabs_switch_and_arrow_keys_step_images() {
    let mut h = harness(sample_workbench());
    h.run();
    h.get_by_label("Masks").click();
    h.run();
    assert_eq!(h.state().tab, Tab::Masks);
    let order = h.state().image_order();
    assert_eq!(order[0], 2, "the image with the largest drop comes first");
    assert_eq!(h.state().masks.image, order[0]);
    h.key_press(egui::Key::ArrowRight);
    h.run();
    assert_eq!(h.state().masks.image, order[1]);
    h.key_press(egui::Key::ArrowLeft);
    h.run();
    assert_eq!(h.state().masks.image, order[0]);
    // The Calibration panel's header comes first, the tab last.
    h.get_all_by_label("Calibration")
        .last()
        .expect("a Calibration tab")
        .click();
    h.run();
    assert_eq!(h.state().tab, Tab::Calibration);
    h.get_by_label("block.add.out").click();
    h.run();
    assert_eq!(h.state().calib_tensor.as_deref(), Some("block.add.out"));
    h.get_by_label("Log").click();
    h.run();
    assert_eq!(h.state().tab, Tab::Log);
}

#[test]
fn shortcuts_push_commands() {
    let mut h = harness(sample_workbench());
    h.run();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::R);
    h.run();
    assert!(applied(&h, |c| *c == Command::Run));
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::S);
    h.run();
    assert!(applied(&h, |c| *c == Command::Save));
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::O);
    h.run();
    assert!(applied(&h, |c| *c == Command::OpenDialog));
}

#[test]
fn a_missing_experiment_is_a_message_not_a_panic() {
    let mut wb = Workbench::without_worker(Default::default());
    wb.apply(Command::Open("/nonexistent/sample.ron".into()));
    let mut h = harness(wb);
    h.run();
    h.get_by_label_contains("Could not open /nonexistent/sample.ron");
}

#[test]
fn experiments_save_and_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("exp.ron");
    let mut wb = sample_workbench();
    wb.exp.percentile = 99.9;
    wb.apply(Command::SaveTo(path.clone()));
    assert!(path.is_file());
    assert_eq!(wb.settings.recent.len(), 1);
    let mut other = Workbench::without_worker(Default::default());
    other.apply(Command::Open(path.clone()));
    assert_eq!(other.exp.percentile, 99.9);
    assert_eq!(other.exp_path.as_deref(), Some(path.as_path()));
}

#[test]
fn reports_and_mask_composites_export() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut wb = sample_workbench();
    for (kind, name) in [
        (quantscope::ui::ExportKind::Json, "r.json"),
        (quantscope::ui::ExportKind::Markdown, "r.md"),
        (quantscope::ui::ExportKind::Csv, "r.csv"),
        (quantscope::ui::ExportKind::MaskPng, "m.png"),
    ] {
        wb.apply(Command::ExportTo(kind, dir.path().join(name)));
        assert!(dir.path().join(name).is_file(), "{name} written");
    }
    assert!(!wb.log.iter().any(|l| l.error));
}
