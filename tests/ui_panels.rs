//! Interaction tests for each panel and tab of the workbench: find a control by its label,
//! click it, check the command or state it produced. No renderer needed.

use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use quantscope::backend::Precision;
use quantscope::calib::Method;
use quantscope::data::{Normalize, ResizeMode};
use quantscope::ui::testing::{
    sample_artifacts, sample_report, sample_sensitivity, sample_workbench,
};
use quantscope::ui::{Command, LayerSort, Tab, Workbench};

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
    // The model row's Choose… button asks for a file dialog (its path can also be typed).
    h.get_all_by_label("Choose…")
        .next()
        .expect("the model's Choose… button")
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
    // Choosing a folder goes through a dialog on the I/O thread (the model row comes first).
    h.get_all_by_label("Choose…")
        .nth(1)
        .expect("the calibration folder's Choose… button")
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
    // All four, the chosen method first: it leads the table and the Masks tab.
    assert_eq!(
        h.state().exp.methods,
        vec![
            Method::Mse,
            Method::Max,
            Method::Percentile,
            Method::Entropy
        ]
    );
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
    // The left column scrolls: bring the Build panel's checkbox into view before clicking.
    h.get_all_by_role_and_label(egui::accesskit::Role::CheckBox, "FP16 (simulated)")
        .next()
        .expect("the FP16 checkbox, labelled simulated on the CPU")
        .scroll_to_me();
    h.run();
    h.get_all_by_role_and_label(egui::accesskit::Role::CheckBox, "FP16 (simulated)")
        .next()
        .expect("the FP16 checkbox, labelled simulated on the CPU")
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

/// The CPU engine: the status bar and the Build panel's combo say what runs, and without ONNX
/// Runtime the combo keeps `ONNX Runtime` disabled, saying why and what enables it.
#[test]
fn cpu_engine_combo_and_status_say_what_runs() {
    use quantscope::backend::cpu::CpuEngineChoice;
    use quantscope::backend::cpu::onnxruntime::runtime::OrtFound;
    let mut wb = sample_workbench();
    wb.ort = Some(Err(
        "ONNX Runtime not found (looked at ORT_DYLIB_PATH, the `onnxruntime` Python package and \
         the system's library paths); `pip install onnxruntime` enables it"
            .into(),
    ));
    let mut h = harness(wb);
    h.run();
    h.get_by_label_contains("CPU engine: tract (no ONNX Runtime)");
    // The combo shows its choice as its value.
    h.get_by_value("auto (tract: no ONNX Runtime)")
        .scroll_to_me();
    h.run();
    h.get_by_value("auto (tract: no ONNX Runtime)").click();
    h.run();
    assert!(
        h.get_by_label("ONNX Runtime")
            .accesskit_node()
            .is_disabled(),
        "not selectable without the library"
    );
    h.get_by_label("tract (built in)").click();
    h.run();
    assert_eq!(h.state().exp.cpu_engine, CpuEngineChoice::Tract);
    h.get_by_label_contains("CPU engine: tract");

    let mut wb = sample_workbench();
    wb.ort = Some(Ok(OrtFound {
        version: "1.32.0".into(),
        path: "/x/libonnxruntime.so.1.32.0".into(),
    }));
    let mut h = harness(wb);
    h.run();
    h.get_by_label_contains("CPU engine: ONNX Runtime 1.32.0");
    h.get_by_value("auto (ONNX Runtime 1.32.0)");
}

/// A GPU FP32 row on TF32 tensor cores says so in the table and the report's label.
#[test]
fn compare_tab_labels_tf32_rows() {
    let mut wb = sample_workbench();
    let mut report = sample_report();
    let fp32 = report
        .rows
        .iter_mut()
        .find(|r| r.precision == Some(Precision::Fp32))
        .expect("an FP32 row");
    fp32.tf32 = true;
    fp32.backend = "cuda".into();
    assert_eq!(fp32.label(), "fp32 (tf32)");
    wb.set_results(report, Some(sample_artifacts()));
    let mut h = harness(wb);
    h.run();
    h.get_by_label("FP32 (TF32)");
}

/// An FP16 row whose overflow guard kept layers in FP32 says how many in the Compare table,
/// beside "simulated on CPU" (the layers and why on hover).
#[test]
fn compare_tab_says_how_many_layers_the_overflow_guard_kept() {
    let mut wb = sample_workbench();
    let mut report = sample_report();
    let fp16 = report
        .rows
        .iter_mut()
        .find(|r| r.precision == Some(Precision::Fp16))
        .expect("an FP16 row");
    fp16.fp32_layers = vec![quantscope::fp16_guard::KeptFp32 {
        node: "attn/matmul".into(),
        op: "MatMul".into(),
        reason: "its output reaches 2.10e5 on the calibration images".into(),
    }];
    let simulated = fp16.simulated;
    wb.set_results(report, Some(sample_artifacts()));
    let mut h = harness(wb);
    h.run();
    let want = if simulated {
        "simulated on CPU · 1 layer kept in FP32 (overflow guard)"
    } else {
        "1 layer kept in FP32 (overflow guard)"
    };
    h.get_by_label(want);
}

/// An INT8 row whose engine precision per region ran in FP16 says so in the Compare table,
/// per batch size, with the builder's own lines on hover.
#[test]
fn compare_tab_says_where_an_int8_row_ran_in_fp16() {
    use quantscope::fp16_regions::{Kept, RegionChoice};
    let mut wb = sample_workbench();
    let mut report = sample_report();
    let int8 = report
        .rows
        .iter_mut()
        .find(|r| r.precision == Some(Precision::Int8) && r.budget.is_none())
        .expect("an INT8 row");
    int8.fp16_regions = vec![RegionChoice {
        batch: 1,
        regions: vec![],
        int8_ms: 0.55,
        fp16_ms: 0.5,
        mixed_ms: None,
        fp16_engine_ms: Some(0.49),
        kept: Kept::Fp16,
    }];
    wb.set_results(report, Some(sample_artifacts()));
    let mut h = harness(wb);
    h.run();
    h.get_by_label_contains("batch 1: ran in FP16 throughout (INT8 was 1.10x slower)");
}

/// The mixed-precision row says in the Compare table whether it meets its budget, in red
/// where it does not, with the numbers on hover.
#[test]
fn compare_tab_says_whether_the_mixed_row_meets_its_budget() {
    use quantscope::experiment::Budget;
    use quantscope::report::BudgetCheck;
    for (achieved, label) in [(0.7190, "budget met"), (0.61, "budget not met")] {
        let mut wb = sample_workbench();
        let mut report = sample_report();
        let mixed = report
            .rows
            .iter_mut()
            .find(|r| r.method == Some(Method::Max))
            .expect("an INT8 max row");
        mixed.kept_float = vec!["head/conv".into()];
        mixed.miou = Some(achieved);
        mixed.budget = Some(BudgetCheck::of(
            Budget::MiouRelativePercent(0.5),
            0.72,
            achieved,
        ));
        wb.set_results(report, Some(sample_artifacts()));
        let mut h = harness(wb);
        h.run();
        h.get_by_label(label);
    }
}

#[test]
fn compare_tab_labels_simulated_rows() {
    let mut h = harness(sample_workbench());
    h.run();
    h.get_by_label("FP16 (simulated on CPU)");
    h.get_by_label("simulated on CPU");
    assert!(h.get_all_by_label("INT8 entropy").count() >= 1);
}

/// An FP8 row: named in the Compare tab (simulated on the CPU), and set against the first
/// INT8 engine in the mask views; the Build panel's FP8 box adds the precision.
#[test]
fn fp8_rows_show_and_the_mask_views_put_them_next_to_int8() {
    let mut wb = sample_workbench();
    let mut report = sample_report();
    let mut fp8 = report.rows[2].clone();
    fp8.precision = Some(Precision::Fp8);
    fp8.simulated = true;
    assert_eq!(fp8.label(), "fp8 max");
    report.rows.push(fp8);
    let mut artifacts = sample_artifacts();
    let last = artifacts.predictions[2].clone();
    artifacts.predictions.push(last);
    wb.set_results(report, Some(artifacts));
    assert_eq!(
        wb.masks.engines,
        [Some(2), Some(4)],
        "the first INT8 engine against the FP8 one"
    );
    let mut h = harness(wb);
    h.run();
    h.get_by_label("FP8 max (simulated on CPU)");
    h.get_all_by_role_and_label(egui::accesskit::Role::CheckBox, "FP8 (simulated)")
        .next()
        .expect("the FP8 checkbox, labelled simulated on the CPU")
        .scroll_to_me();
    h.run();
    h.get_all_by_role_and_label(egui::accesskit::Role::CheckBox, "FP8 (simulated)")
        .next()
        .expect("the FP8 checkbox")
        .click();
    h.run();
    assert!(
        h.state().exp.precisions.contains(&Precision::Fp8),
        "{:?}",
        h.state().exp.precisions
    );
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

fn layers_workbench() -> Workbench {
    let mut wb = sample_workbench();
    wb.set_sensitivity(sample_sensitivity());
    wb.tab = Tab::Layers;
    wb
}

/// The table's entry for `node` (the last widget so labelled: "Where the time goes" above the
/// table names the slowest layers too).
fn table_entry<'a>(h: &'a Harness<'_, Workbench>, node: &'a str) -> egui_kittest::Node<'a> {
    h.get_all_by_label(node)
        .last()
        .unwrap_or_else(|| panic!("{node} in the table"))
}

/// The node names in the table, top to bottom.
fn layer_order(h: &Harness<'_, Workbench>) -> Vec<String> {
    let mut nodes: Vec<(f32, String)> = sample_sensitivity()
        .layers
        .iter()
        .map(|l| (table_entry(h, &l.node).rect().min.y, l.node.clone()))
        .collect();
    nodes.sort_by(|a, b| a.0.total_cmp(&b.0));
    nodes.into_iter().map(|n| n.1).collect()
}

#[test]
fn layers_tab_shows_the_layers_and_a_summary() {
    let mut h = harness(layers_workbench());
    h.run();
    for node in [
        "stem/conv",
        "block1/conv",
        "block1/add",
        "head/conv",
        "head/matmul",
    ] {
        table_entry(&h, node);
    }
    h.get_by_label_contains("FP32 mIoU 72.00 %");
    h.get_by_label_contains("calibration entropy");
    h.get_by_label("Analyse sensitivity");
    assert_eq!(h.get_all_by_label("int8").count(), 5);
    // Without a worker the analysis is refused with a logged error, not a panic.
    h.get_by_label("Analyse sensitivity").click();
    h.run();
    assert!(applied(&h, |c| *c == Command::AnalyseSensitivity));
    assert!(h.state().log.iter().any(|l| l.error));
}

#[test]
fn layers_tab_sorts_by_a_clicked_header() {
    let mut h = harness(layers_workbench());
    h.run();
    assert_eq!(
        layer_order(&h),
        [
            "stem/conv",
            "block1/conv",
            "block1/add",
            "head/conv",
            "head/matmul"
        ]
    );
    h.get_by_label("SQNR isolated dB").click();
    h.run();
    assert_eq!(h.state().layers.sort, LayerSort::SqnrIsolated);
    assert_eq!(
        layer_order(&h),
        [
            "block1/add",
            "head/conv",
            "block1/conv",
            "stem/conv",
            "head/matmul"
        ]
    );
    // The same header again flips the order.
    h.get_by_label("SQNR isolated dB (asc)").click();
    h.run();
    assert_eq!(
        layer_order(&h),
        [
            "head/matmul",
            "stem/conv",
            "block1/conv",
            "head/conv",
            "block1/add"
        ]
    );
    // Metric gain: largest first, unmeasured layers last.
    h.get_by_label("gain in float pt").click();
    h.run();
    assert_eq!(
        layer_order(&h),
        [
            "block1/add",
            "stem/conv",
            "head/conv",
            "block1/conv",
            "head/matmul"
        ]
    );
}

#[test]
fn layers_tab_toggles_a_layer_into_float_and_back() {
    let mut h = harness(layers_workbench());
    h.run();
    assert!(h.state().exp.mixed_precision.is_none());
    // Rows are in graph order: the third precision button is block1/add's.
    h.get_all_by_label("int8")
        .nth(2)
        .expect("a precision button")
        .click();
    h.run();
    assert!(applied(
        &h,
        |c| matches!(c, Command::ToggleLayerFloat(n) if n == "block1/add")
    ));
    let mp = h
        .state()
        .exp
        .mixed_precision
        .clone()
        .expect("a mixed-precision plan");
    assert_eq!(mp.keep_float, vec!["block1/add".to_string()]);
    assert_eq!(mp.method, Some(Method::Entropy), "the best single method");
    h.get_by_label_contains("1 layer(s) kept in float");
    h.get_by_label("float").click();
    h.run();
    assert!(h.state().exp.mixed_precision.is_none());
    // Re-run runs the experiment (refused here: no worker).
    h.get_by_label("Re-run").click();
    h.run();
    assert!(applied(&h, |c| *c == Command::Run));
}

#[test]
fn a_mixed_precision_plan_goes_into_the_experiment() {
    let mut report = sample_sensitivity();
    report.amp = Some(quantscope::sensitivity::AmpResult {
        met: true,
        kept_float: vec!["block1/add".into(), "head/conv".into()],
        metric: 0.715,
        note: String::new(),
        ..Default::default()
    });
    let mut wb = sample_workbench();
    wb.set_sensitivity(report);
    let mp = wb.exp.mixed_precision.clone().expect("the plan is applied");
    assert_eq!(mp.keep_float, vec!["block1/add", "head/conv"]);
    assert_eq!(
        wb.rows_expected(),
        7,
        "FP32, FP16, four INT8 and the mixed engine"
    );
    wb.tab = Tab::Layers;
    let mut h = harness(wb);
    h.run();
    h.get_by_label_contains("| mixed precision: 2 layer(s) in float, 71.50 %, budget met");
    h.get_by_label_contains("press Run to compare it");
    assert_eq!(h.get_all_by_label("float").count(), 2);
}

#[test]
fn layers_tab_shows_where_each_engines_time_goes() {
    use quantscope::backend::LayerTime;
    let t = |layer: &str, kernel: &str, time_ms| LayerTime {
        layer: layer.into(),
        kernel: kernel.into(),
        time_ms,
        precision: None,
    };
    let mut report = sample_report();
    for r in report.rows.iter_mut() {
        let int8 = r.precision == Some(Precision::Int8);
        r.layer_times = vec![
            t("stem/conv", "OptMatMul", 4.0),
            t("block1/dw", "DepthwiseConv (quantscope)", 1.5),
            t("head/resize", "Resize (quantscope 2-tap)", 0.5),
        ];
        if int8 {
            r.layer_times
                .push(t("block1/q", "Requantize (quantscope)", 0.25));
            // As a GPU engine says it: which precision each layer ran in, and why.
            let why = [
                "fp16, timed faster than int8",
                "int8",
                "fp16 data",
                "int8 data",
            ];
            for (lt, p) in r.layer_times.iter_mut().zip(why) {
                lt.precision = Some(p.to_string());
            }
        }
    }
    let mut wb = sample_workbench();
    wb.set_results(report, Some(sample_artifacts()));
    wb.tab = Tab::Layers;
    let mut h = harness(wb);
    h.run();
    h.get_by_label("Where the time goes");
    // The first engine (FP32): its ops by time, its layers slowest first, the sum.
    h.get_by_label_contains("3 layers, 6.00 ms summed");
    // In both lists: the op's total and its one layer.
    assert_eq!(h.get_all_by_label("OptMatMul").count(), 2);
    assert_eq!(h.get_all_by_label("4.00 ms · 67 %").count(), 2);
    assert!(h.query_by_label("Requantize (quantscope)").is_none());
    assert!(h.query_by_label("by precision").is_none());
    // Another engine, picked from the list.
    h.get_by_label("engine").click();
    h.run();
    h.get_by_label("INT8 max").click();
    h.run();
    assert_eq!(h.state().layers.time_engine.as_deref(), Some("INT8 max"));
    h.get_by_label_contains("4 layers, 6.25 ms summed");
    assert!(h.get_all_by_label("Requantize (quantscope)").count() >= 1);
    // Its layers by precision: the stem the builder ran in FP16, most time first.
    h.get_by_label("by precision");
    h.get_by_label("fp16, timed faster than int8");
    // By op, slowest layers and by precision.
    assert_eq!(h.get_all_by_label("4.00 ms · 64 %").count(), 3);
    // The sensitivity analysis is still offered below.
    h.get_by_label("Analyse sensitivity");
}
