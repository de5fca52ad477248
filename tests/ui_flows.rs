//! The newcomer's flows without a file dialog: paths typed into the fields, folders and files
//! dropped on a field or on the window, a labels file (picked, or found beside the model), the
//! Q/DQ export from the window, and the run history. Driven through egui_kittest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eframe::egui;
use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use quantscope::backend::Precision;
use quantscope::experiment::Experiment;
use quantscope::model::testing::residual_classifier;
use quantscope::ui::testing::{fashion_images, sample_classifier_workbench, sample_workbench};
use quantscope::ui::{Command, ExportKind, Settings, Tab, Workbench};

fn harness(wb: Workbench) -> Harness<'static, Workbench> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), wb)
}

/// A dropped file as the window system hands it over.
#[derive(Debug)]
struct Dropped(PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

/// Drops `path` with the pointer at `pos`, as a desktop's drag and drop does.
fn drop_at(h: &mut Harness<'static, Workbench>, pos: egui::Pos2, path: &Path) {
    h.hover_at(pos);
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(path.to_path_buf())));
    h.run();
}

/// A segmentation-style folder (images/ + masks/) and a flat folder of images.
fn folders(root: &Path) -> (PathBuf, PathBuf) {
    let eval = root.join("eval");
    let calib = root.join("calib");
    for d in [eval.join("images"), eval.join("masks"), calib.clone()] {
        std::fs::create_dir_all(&d).expect("mkdir");
    }
    image::RgbImage::new(4, 4)
        .save(calib.join("a.png"))
        .expect("png");
    (eval, calib)
}

/// Replaces the text of the path field labelled `field` and presses Enter.
fn type_into(h: &mut Harness<'static, Workbench>, field: &str, text: &str) {
    let node = h.get_by_role_and_label(Role::TextInput, field);
    node.focus();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::A);
    h.key_press(egui::Key::Backspace);
    h.run();
    let node = h.get_by_role_and_label(Role::TextInput, field);
    node.type_text(text);
    h.run();
    h.key_press(egui::Key::Enter);
    h.run();
}

#[test]
fn typed_paths_are_checked_and_taken() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (eval, calib) = folders(dir.path());
    let mut h = harness(sample_workbench());
    h.run();
    // A folder that does not exist: shown as an error under the field, not taken.
    let missing = dir.path().join("nowhere");
    type_into(&mut h, "Calibration:", &missing.to_string_lossy());
    h.get_by_label_contains("no such folder");
    assert_ne!(
        h.state().exp.calibration.dir.as_deref(),
        Some(missing.as_path())
    );
    // A real folder is taken on Enter.
    type_into(&mut h, "Calibration:", &calib.to_string_lossy());
    assert_eq!(
        h.state().exp.calibration.dir.as_deref(),
        Some(calib.as_path())
    );
    // A labels file typed into its field.
    let labels = dir.path().join("names.txt");
    std::fs::write(&labels, "background\nperson\n").expect("labels");
    type_into(&mut h, "Labels:", &labels.to_string_lossy());
    assert_eq!(
        h.state().exp.evaluation.labels.as_deref(),
        Some(labels.as_path())
    );
    // A folder typed into a file field is refused with the reason.
    type_into(&mut h, "Labels:", &eval.to_string_lossy());
    h.get_by_label_contains("a folder, not a file");
    assert_eq!(
        h.state().exp.evaluation.labels.as_deref(),
        Some(labels.as_path())
    );
}

#[test]
fn dropped_folders_land_where_they_belong() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (eval, calib) = folders(dir.path());
    let mut h = harness(sample_workbench());
    h.run();
    // Onto the Calibration field: that field takes it, whatever its layout.
    let field = h
        .get_by_role_and_label(Role::TextInput, "Calibration:")
        .rect()
        .center();
    drop_at(&mut h, field, &eval);
    assert_eq!(
        h.state().exp.calibration.dir.as_deref(),
        Some(eval.as_path())
    );
    // Onto the results area: routed by layout, never read as an experiment.
    drop_at(&mut h, egui::pos2(1000.0, 500.0), &calib);
    assert_eq!(
        h.state().exp.calibration.dir.as_deref(),
        Some(calib.as_path())
    );
    drop_at(&mut h, egui::pos2(1000.0, 500.0), &eval);
    assert_eq!(
        h.state().exp.evaluation.dir.as_deref(),
        Some(eval.as_path())
    );
    assert!(
        h.state()
            .log
            .iter()
            .any(|l| l.text.contains("used as the evaluation set")),
        "the window says what it did with the drop"
    );
    assert!(
        !h.state().log.iter().any(|l| l.error),
        "no error: {:?}",
        h.state().log
    );
}

#[test]
fn labels_beside_the_model_are_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("net.onnx");
    std::fs::write(&model, residual_classifier(3).to_bytes(13)).expect("model");
    std::fs::write(dir.path().join("net.labels.txt"), "cat\ndog\nbird\n").expect("labels");
    let exp = Experiment {
        model: model.clone(),
        ..Default::default()
    };
    assert_eq!(exp.labels_file(), Some(dir.path().join("net.labels.txt")));
    let mut wb = sample_workbench();
    wb.exp = exp;
    let mut h = harness(wb);
    h.run();
    h.get_by_label_contains("class names from net.labels.txt");
}

#[test]
fn open_path_window_takes_what_the_menu_could_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, calib) = folders(dir.path());
    let mut h = harness(sample_workbench());
    h.run();
    h.state_mut().push(Command::ShowOpenPath);
    h.run();
    let input = h.get_by_role_and_label(Role::TextInput, "Path:");
    input.focus();
    input.type_text(&calib.to_string_lossy());
    h.run();
    h.get_by_label("Open").click();
    h.run();
    assert_eq!(
        h.state().exp.calibration.dir.as_deref(),
        Some(calib.as_path())
    );
    assert!(h.state().path_window.is_none(), "the window closes");
}

/// A tiny classifier with a generated ImageFolder, fast enough to run for real.
fn tiny_experiment(root: &Path) -> Experiment {
    let model = root.join("tiny.onnx");
    std::fs::write(&model, residual_classifier(3).to_bytes(13)).expect("model");
    let data = root.join("data");
    for c in 0..3 {
        let d = data.join(format!("class{c}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        for i in 0..4u32 {
            let img = image::RgbImage::from_fn(16, 16, |x, y| {
                image::Rgb([(x * 9 + i) as u8, (y * 7) as u8, (c * 80) as u8])
            });
            img.save(d.join(format!("{i}.png"))).expect("png");
        }
    }
    let mut e = Experiment {
        name: "tiny".into(),
        model,
        precisions: vec![Precision::Fp32, Precision::Int8],
        methods: vec![quantscope::calib::Method::Max],
        ..Default::default()
    };
    e.calibration.dir = Some(data.clone());
    e.evaluation.dir = Some(data);
    e.bench.min_runs = 2;
    e.bench.warmup_runs = 0;
    e.bench.min_time_ms = 0.0;
    e.bench.batch = 1;
    e
}

fn until(h: &mut Harness<'static, Workbench>, what: &str, done: impl Fn(&Workbench) -> bool) {
    let start = Instant::now();
    while !done(h.state()) {
        h.step();
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn qdq_export_from_the_window_and_run_history() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exp = tiny_experiment(dir.path());
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp)));
    let mut h = harness(wb);
    // The Model panel's GPU line: the CUDA engines planned without a GPU, after the model's
    // description.
    until(&mut h, "the CUDA coverage", |wb| !wb.model.cuda.is_empty());
    assert!(
        h.state()
            .model
            .cuda
            .iter()
            .all(|(_, r)| matches!(r, Ok(v) if v.is_empty())),
        "{:?}",
        h.state().model.cuda
    );
    h.state_mut().push(Command::Run);
    h.step();
    until(&mut h, "the first run", |wb| !wb.is_running());
    assert_eq!(h.state().results.rows().len(), 2, "{:?}", h.state().log);
    // The export goes to the I/O thread; the banner says where the files went.
    let out = dir.path().join("exports");
    h.state_mut().push(Command::ExportTo(
        quantscope::ui::ExportKind::Qdq,
        out.clone(),
    ));
    h.step();
    until(&mut h, "the export", |wb| {
        wb.banner.as_ref().is_some_and(|b| b.0.starts_with("Wrote"))
    });
    let banner = h.state().banner.clone().map(|b| b.0).unwrap_or_default();
    assert!(banner.contains(&out.display().to_string()), "{banner}");
    for f in [
        "tiny_int8_max.onnx",
        "tiny_int8_max.cache",
        "tiny_fp16.onnx",
        "tiny_mixed_int8_fp16_max.onnx",
    ] {
        assert!(out.join(f).is_file(), "{f} written");
    }
    // The ready TensorRT lines: strongly typed for each model, implicit INT8 for the cache.
    let cmds = h.state().trt_commands.clone();
    let line = |file: &str| {
        cmds.iter()
            .find(|(f, _)| f == file)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("no command for {file}: {cmds:?}"))
    };
    assert!(line("tiny_fp16.onnx").contains("--stronglyTyped"));
    assert!(line("tiny_int8_max.onnx").contains("--stronglyTyped"));
    assert!(line("tiny_int8_max.cache").contains("--int8 --calib="));
    // A second run keeps the first for comparison.
    h.state_mut().push(Command::Run);
    h.step();
    until(&mut h, "the second run", |wb| !wb.is_running());
    assert_eq!(h.state().past_runs.len(), 1);
    let first = h.state().past_runs[0].title.clone();
    h.state_mut().show_past_run(0);
    assert_eq!(
        h.state().results.title,
        first,
        "the earlier run is shown again"
    );
    assert_eq!(h.state().results.rows().len(), 2);
    // Browsing during a run: the run's rows land in its own entry, not in the one shown.
    h.state_mut().push(Command::Run);
    h.step();
    assert!(h.state().is_running());
    h.state_mut().show_past_run(0);
    let shown = h.state().results.title.clone();
    until(&mut h, "the third run", |wb| !wb.is_running());
    assert_eq!(
        h.state().results.title,
        shown,
        "the browsed run stays on screen"
    );
    let third = h
        .state()
        .past_runs
        .iter()
        .find(|r| r.title.starts_with("run #") && r.report.is_some() && r.title != shown)
        .map(|r| r.rows().len());
    assert!(
        third.is_some_and(|n| n == 2),
        "the third run filled its own entry"
    );
    // Re-time one row: its latency is measured again, until stable, and nothing else moves.
    let before = h.state().results.rows()[0].latency_ms.expect("timed");
    let metric = h.state().results.rows()[0].metric();
    h.state_mut().push(Command::RetimeRow(0));
    h.step();
    until(&mut h, "the re-time", |wb| !wb.is_running());
    let after = h.state().results.rows()[0].latency_ms.expect("re-timed");
    assert_ne!(before, after, "a new measurement");
    // Until stable: its median known to ±2 % (the run's rows were timed side by side, in turns
    // of many more runs than the minimum).
    assert!(
        after
            .ci95_rel
            .is_some_and(|c| c <= quantscope::bench::STABLE_CI_REL),
        "{after:?}"
    );
    assert_eq!(h.state().results.rows()[0].metric(), metric);
    assert!(
        h.state().log.iter().any(|l| l.text.starts_with("re-timed")),
        "the log says so"
    );
}

/// The workbench's own Run, again and again, on an experiment named by `QUANTSCOPE_GUI_SOAK`
/// (a `.ron` file), `QUANTSCOPE_GUI_SOAK_RUNS` times (default 3): the check for crashes on a
/// real model and CPU (the AMX host's DeepLab run), through the same worker, pipeline and CPU
/// engine a window would drive. Skipped, saying so, when the variable is not set.
#[test]
fn soak_runs_a_saved_experiment_in_the_workbench() {
    let Some(path) = std::env::var_os("QUANTSCOPE_GUI_SOAK") else {
        eprintln!("skipped: set QUANTSCOPE_GUI_SOAK=EXPERIMENT.ron to run it in the workbench");
        return;
    };
    let runs: usize = std::env::var("QUANTSCOPE_GUI_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let exp = Experiment::load(Path::new(&path)).expect("the experiment loads");
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp)));
    let mut h = harness(wb);
    for k in 0..runs {
        let start = Instant::now();
        h.state_mut().push(Command::Run);
        h.step();
        while h.state().is_running() {
            h.step();
            assert!(
                start.elapsed() < Duration::from_secs(900),
                "run {k} never ended"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let rows = h.state().results.rows();
        let errors: Vec<String> = rows.iter().filter_map(|r| r.error.clone()).collect();
        eprintln!(
            "run {k}: {} rows in {:.1} s, {} errors{}",
            rows.len(),
            start.elapsed().as_secs_f64(),
            errors.len(),
            rows.iter()
                .map(|r| format!(
                    "; {} {} {}",
                    r.label(),
                    quantscope::report::pct(r.metric()),
                    r.engine.clone().unwrap_or_default()
                ))
                .collect::<String>()
        );
        assert!(
            !rows.is_empty() && errors.is_empty(),
            "run {k}: {errors:?} {:?}",
            h.state().log
        );
    }
    let engine: Vec<String> = h
        .state()
        .log
        .iter()
        .filter(|l| l.text.starts_with("CPU engine"))
        .map(|l| l.text.clone())
        .collect();
    eprintln!("{engine:?}");
}

/// Saving without a file dialog: the typed window writes where the user says, and the bundled
/// samples are never overwritten, by Save or by a typed path.
#[test]
fn saves_are_typed_and_the_bundled_samples_are_kept() {
    use quantscope::ui::DialogPurpose;
    let dir = tempfile::tempdir().expect("temp dir");
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_scenes_deeplab.ron");
    let before = std::fs::read(&sample).expect("sample");
    let mut wb = sample_workbench();
    wb.exp_path = Some(sample.clone());
    wb.exp.name = "changed".into();
    let mut h = harness(wb);
    h.run();
    h.state_mut().push(Command::Save);
    h.run();
    assert_eq!(
        std::fs::read(&sample).expect("sample"),
        before,
        "not overwritten"
    );
    assert!(
        h.state()
            .log
            .iter()
            .any(|l| l.text.contains("never overwritten")),
        "and the log says why"
    );
    // The typed window refuses the sample's path and takes another.
    h.state_mut().path_window = Some(DialogPurpose::SaveExperiment);
    h.state_mut().open_path_text = sample.display().to_string();
    h.run();
    h.get_by_label_contains("never overwritten");
    let mine = dir.path().join("mine.ron");
    h.state_mut().open_path_text = mine.display().to_string();
    h.run();
    h.get_by_label("Save").click();
    h.run();
    assert!(mine.is_file(), "saved where typed");
    assert_eq!(h.state().exp_path.as_deref(), Some(mine.as_path()));
    assert!(h.state().path_window.is_none());
}

/// Run says why it cannot start; opening another model says what it kept, and the kept data
/// settings can be reset.
#[test]
fn run_explains_itself_and_a_new_model_says_what_it_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut wb = sample_workbench();
    wb.exp.precisions.clear();
    wb.exp.calibration.dir = Some(dir.path().join("calib"));
    assert_eq!(
        wb.run_blocker().as_deref(),
        Some("choose at least one precision")
    );
    let mut h = harness(wb);
    h.run();
    h.state_mut().push(Command::Run);
    h.run();
    assert!(h.state().run.is_none(), "nothing started");
    assert!(
        h.state()
            .log
            .iter()
            .any(|l| l.error && l.text.contains("choose at least one precision"))
    );
    let model = dir.path().join("other.onnx");
    std::fs::write(&model, residual_classifier(3).to_bytes(13)).expect("model");
    h.state_mut().push(Command::Open(model.clone()));
    h.run();
    let st = h.state();
    assert_eq!(st.exp.name, "other", "the experiment follows the new model");
    assert!(
        st.exp_path.is_none(),
        "Save will not write the old experiment's file"
    );
    assert_eq!(
        st.exp.calibration.dir.as_deref(),
        Some(dir.path().join("calib").as_path())
    );
    assert_eq!(
        st.past_runs.len(),
        1,
        "the old model's results stay in the history"
    );
    let (msg, error) = st.banner.clone().expect("a banner says what was kept");
    assert!(
        !error && msg.contains("kept") && msg.contains("Reset data settings"),
        "{msg}"
    );
    h.state_mut().push(Command::ResetDataSettings);
    h.run();
    assert!(h.state().exp.calibration.dir.is_none());
    assert_eq!(h.state().exp.model, model);
}

/// Finished runs are kept beside the autosaved experiment, the newest few, and come back as
/// the run history of the next session.
#[test]
fn the_last_runs_survive_a_restart() {
    use quantscope::ui::{Autosave, testing::sample_report};
    let dir = tempfile::tempdir().expect("temp dir");
    let a = Autosave::new(dir.path().join("autosave.ron"));
    for k in 0..12 {
        a.keep_run(&format!("run #{k}"), &sample_report())
            .expect("kept");
        std::thread::sleep(Duration::from_millis(2));
    }
    let runs = a.restore_runs();
    assert_eq!(runs.len(), quantscope::ui::PAST_RUNS_KEPT);
    assert!(runs[0].title.starts_with("run #11"), "{}", runs[0].title);
    assert!(runs[0].report.is_some() && !runs[0].rows().is_empty());
    let files = std::fs::read_dir(a.runs_dir()).expect("dir").count();
    assert!(
        files <= quantscope::ui::PAST_RUNS_KEPT + 1,
        "{files} files kept"
    );
}

/// A new labels file rescans the evaluation set: the Data panel's class count follows it.
#[test]
fn the_class_count_follows_the_labels_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exp = tiny_experiment(dir.path());
    let labels = dir.path().join("names.txt");
    std::fs::write(&labels, "class0\nclass1\nclass2\n").expect("labels");
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp.clone())));
    let mut h = harness(wb);
    let classes = |wb: &Workbench| match &wb.data.eval {
        quantscope::ui::Scan::Done(s) => Some(s.classes.clone()),
        _ => None,
    };
    until(&mut h, "the first scan", |wb| classes(wb).is_some());
    assert_eq!(classes(h.state()).expect("scanned")[0], "class0");
    // Display names in another order than the folders: the scan must follow the new file.
    std::fs::write(&labels, "class2\nclass1\nclass0\n").expect("labels");
    let mut e = exp;
    e.evaluation.labels = Some(labels);
    h.state_mut().push(Command::SetExperiment(Box::new(e)));
    until(&mut h, "the rescan", |wb| {
        classes(wb).is_some_and(|c| c.first().is_some_and(|n| n == "class2"))
    });
}

/// A classifier evaluated at chance (here a model with random weights, on 24 images of 3
/// classes) says so above the results, naming what to check: every comparison below it is
/// noise.
#[test]
fn a_classifier_at_chance_says_so_above_the_results() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut exp = tiny_experiment(dir.path());
    let data = exp.evaluation.dir.clone().expect("data");
    for c in 0..3u32 {
        for i in 4..8u32 {
            let img = image::RgbImage::from_fn(16, 16, |x, y| {
                image::Rgb([(x * 5 + i * 3) as u8, (y * 11 + i) as u8, (c * 80) as u8])
            });
            img.save(data.join(format!("class{c}/{i}.png")))
                .expect("png");
        }
    }
    exp.precisions = vec![Precision::Fp32];
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp)));
    let mut h = harness(wb);
    h.state_mut().push(Command::Run);
    h.step();
    until(&mut h, "the run", |wb| {
        !wb.is_running() && !wb.results.rows().is_empty()
    });
    let top1 = h.state().results.rows()[0].top1.expect("top-1");
    let (msg, error) = h.state().banner.clone().unwrap_or_default();
    // The model's weights are fixed (seeded), so its top-1 is too: at most twice chance.
    assert!(top1 <= 2.0 / 3.0, "top-1 {top1}");
    assert!(
        error && msg.contains("about chance for 3 classes"),
        "{top1}: {msg}"
    );
    assert!(msg.contains("labels file"), "{msg}");
}

/// Every button labelled `label` (a node's box in the graph, its rows in the Layers tab) is
/// shown selected, or none is.
fn all_selected(h: &Harness<'static, Workbench>, label: &str, selected: bool) {
    let nodes: Vec<_> = h.get_all_by_role_and_label(Role::Button, label).collect();
    assert!(!nodes.is_empty(), "no button labelled {label}");
    for n in nodes {
        assert_eq!(
            n.accesskit_node().toggled(),
            Some(if selected {
                egui::accesskit::Toggled::True
            } else {
                egui::accesskit::Toggled::False
            }),
            "{label}"
        );
    }
}

#[test]
fn a_node_selected_in_the_graph_is_selected_in_the_layers_tab_and_back() {
    let mut wb = sample_workbench();
    wb.set_sensitivity(quantscope::ui::testing::sample_sensitivity());
    wb.tab = quantscope::ui::Tab::Graph;
    let mut h = harness(wb);
    h.run();
    // Every node of the sample's graph is a box with its ONNX name; none selected yet.
    for (name, _) in quantscope::ui::testing::SAMPLE_NODES {
        all_selected(&h, name, false);
    }
    h.get_by_label_contains("Click a node");
    // Clicking a box selects it; the side panel tells how it ran on the engine shown.
    h.get_by_role_and_label(Role::Button, "block1/add").click();
    h.run();
    assert_eq!(h.state().selected_node.as_deref(), Some("block1/add"));
    all_selected(&h, "block1/add", true);
    h.get_by_label_contains("unsupported: no int8 form");
    h.get_by_label_contains("ms (Add)");
    // The Layers tab shows the same node selected.
    h.get_by_label("Show in Layers").click();
    h.run();
    assert_eq!(h.state().tab, quantscope::ui::Tab::Layers);
    all_selected(&h, "block1/add", true);
    all_selected(&h, "head/conv", false);
    // Selecting a row of the Layers table selects that node in the graph.
    h.get_all_by_role_and_label(Role::Button, "head/conv")
        .last()
        .expect("the table's row")
        .click();
    h.run();
    assert_eq!(h.state().selected_node.as_deref(), Some("head/conv"));
    all_selected(&h, "head/conv", true);
    h.get_by_role_and_label(Role::Button, "Graph").click();
    h.run();
    assert_eq!(h.state().tab, quantscope::ui::Tab::Graph);
    all_selected(&h, "head/conv", true);
    all_selected(&h, "block1/add", false);
    assert!(
        h.state()
            .history
            .iter()
            .filter(|c| matches!(c, Command::SelectNode(_)))
            .count()
            == 2,
        "both selections went through the one command"
    );
}

#[test]
fn the_graph_search_selects_a_node_and_the_engine_picker_recolours() {
    let mut wb = sample_workbench();
    wb.tab = quantscope::ui::Tab::Graph;
    let mut h = harness(wb);
    h.run();
    let field = h.get_by_role_and_label(Role::TextInput, "Find:");
    field.focus();
    field.type_text("matmul");
    h.run();
    assert_eq!(h.state().selected_node.as_deref(), Some("head/matmul"));
    h.get_by_label_contains("1 match");
    // An INT8 engine runs the convs in int8; FP32 runs everything in fp32.
    h.get_by_label_contains("int8 (4)");
    h.state_mut().graph.engine = Some("FP32".into());
    h.run();
    h.get_by_label_contains("fp32 (7)");
}

/// The label of the first widget whose text contains `part`.
fn text_containing(h: &Harness<'static, Workbench>, part: &str) -> String {
    let n = h.get_by_label_contains(part);
    let a = n.accesskit_node();
    a.label()
        .map(|l| l.to_string())
        .or(a.value().map(|v| v.to_string()))
        .unwrap_or_default()
}

#[test]
fn the_graph_of_a_real_run_is_laid_out_on_the_worker_with_onnx_names_and_qdq_marks() {
    use quantscope::backend::cpu::CpuEngineChoice;
    // ONNX Runtime where this machine has it, and tract, whose node names are its own.
    for engine in [CpuEngineChoice::Auto, CpuEngineChoice::Tract] {
        graph_of_a_real_run(engine);
    }
}

fn graph_of_a_real_run(engine: quantscope::backend::cpu::CpuEngineChoice) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut exp = tiny_experiment(dir.path());
    exp.cpu_engine = engine;
    let model = quantscope::model::Model::load(&exp.model).expect("model");
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp)));
    let mut h = harness(wb);
    h.state_mut().push(Command::Run);
    h.step();
    until(&mut h, "the run", |wb| !wb.is_running());
    // The tab asks for the drawing; the worker builds and lays it out.
    h.state_mut()
        .push(Command::SetTab(quantscope::ui::Tab::Graph));
    h.step();
    until(&mut h, "the graph", |wb| wb.model.diagram.is_some());
    h.run();
    let d = h.state().model.diagram.clone().expect("a diagram");
    assert_eq!(
        d.nodes
            .iter()
            .filter(|n| n.kind == quantscope::model::diagram::NodeKind::Op)
            .count(),
        model.graph().node.len()
    );
    // Every engine's per-layer times name the model's nodes (tract's or ORT's own names mapped
    // back): each conv is timed under its ONNX name.
    assert!(
        h.state()
            .results
            .rows()
            .iter()
            .any(|r| !r.layer_times.is_empty()),
        "{engine:?}: the engines were profiled"
    );
    if engine == quantscope::backend::cpu::CpuEngineChoice::Tract {
        assert!(
            h.state()
                .results
                .rows()
                .iter()
                .all(|r| r.engine.as_deref().is_some_and(|e| e.starts_with("tract"))),
            "tract ran them"
        );
    }
    for r in h.state().results.rows() {
        if r.layer_times.is_empty() {
            continue;
        }
        for n in model.graph().node.iter().filter(|n| n.op_type == "Conv") {
            // A conv fused with its activation is the step "conv+act", as on the GPU.
            assert!(
                r.layer_times
                    .iter()
                    .any(|t| t.layer.split('+').next() == Some(n.name.as_str())),
                "{}: {} not in {:?}",
                r.label(),
                n.name,
                r.layer_times.iter().map(|t| &t.layer).collect::<Vec<_>>()
            );
        }
    }
    // The INT8 engine is the one shown: its convs in int8, its Q/DQ pairs on the edges.
    let legend = text_containing(&h, "int8 (");
    assert!(!legend.starts_with("int8 (0)"), "{legend}");
    let summary = text_containing(&h, "Q/DQ marks");
    let marks: usize = summary
        .split(", ")
        .find_map(|p| p.strip_suffix(" Q/DQ marks"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(marks > 0, "{summary}");
    let errors: Vec<String> = h
        .state()
        .log
        .iter()
        .filter(|l| l.error)
        .map(|l| l.text.clone())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

/// A press and release of the primary button at `pos`, as a mouse click.
fn click_at(h: &mut Harness<'static, Workbench>, pos: egui::Pos2) {
    h.hover_at(pos);
    h.run();
    h.drag_at(pos);
    h.drop_at(pos);
    h.run();
}

/// The Classes tab on a classifier's results: the first INT8 engine is compared with FP32 at
/// first; another is picked in the combo; a gallery image is selected and shown large with
/// every engine's top-3; a confusion cell narrows the gallery; both CSV exports are written
/// with what the views show.
#[test]
fn classes_tab_picks_an_engine_selects_an_image_and_exports_csv() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut h = harness(sample_classifier_workbench());
    h.run();
    h.get_by_label("Classes").click();
    h.run();
    assert_eq!(h.state().tab, Tab::Classes);
    assert_eq!(
        h.state().classes_engine(),
        Some(2),
        "INT8 max, the first INT8 row"
    );
    h.get_by_label("Flipped images: 1 lost, 1 gained");
    h.get_by_role_and_label(Role::Canvas, "INT8 max: confusion matrix");
    // The engine combo shows its choice as its value; INT8 entropy flips more.
    h.get_all_by_value("INT8 max")
        .find(|n| n.accesskit_node().role() == Role::ComboBox)
        .expect("the engine combo")
        .click();
    h.run();
    h.get_all_by_label("INT8 entropy")
        .find(|n| n.accesskit_node().role() != Role::Label)
        .expect("INT8 entropy in the combo")
        .click();
    h.run();
    assert_eq!(h.state().classes.engine, Some(3));
    h.get_by_label("Flipped images: 3 lost, 1 gained");
    h.get_by_role_and_label(Role::Canvas, "INT8 entropy minus FP32");
    // Per-class accuracy, the largest drop (coat: two of three images to pullover) first.
    h.get_by_label("-66.7");
    // A click on a flipped image selects it: shown large with its true class.
    let images = fashion_images();
    let coat = images[13]
        .0
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    h.get_by_label(&coat).click();
    h.run();
    assert_eq!(h.state().classes.image, Some(13));
    assert!(h.state().history.contains(&Command::SelectGalleryImage(13)));
    h.get_by_label("true class: coat");
    // Arrow keys step through the gallery as shown (lost by largest drop, then gained).
    let order = h.state().gallery_order();
    assert_eq!(order.len(), 4, "{order:?}");
    let at = order.iter().position(|&i| i == 13).expect("shown");
    h.key_press(egui::Key::ArrowDown);
    h.run();
    assert_eq!(h.state().classes.image, Some(order[(at + 1).min(3)]));
    h.key_press(egui::Key::ArrowUp);
    h.run();
    assert_eq!(h.state().classes.image, Some(13));
    // Hovering the difference matrix's last cell (ankle boots kept as ankle boots) says what
    // it counts; a click on it narrows the gallery to it, another widens it again.
    let grid = h
        .get_by_role_and_label(Role::Canvas, "INT8 entropy minus FP32")
        .rect();
    let corner = egui::pos2(grid.max.x as f32 - 3.0, grid.max.y as f32 - 3.0);
    h.hover_at(corner);
    h.run();
    h.get_by_label_contains("true ankle_boot, predicted ankle_boot: FP32 3, INT8 entropy 3 (+0)");
    click_at(&mut h, corner);
    assert_eq!(h.state().classes.cell, Some((9, 9)));
    h.get_by_label("No flipped image in this cell.");
    click_at(&mut h, corner);
    assert_eq!(h.state().classes.cell, None);
    // The coat-as-pullover cell narrows the gallery to the two coats; Show all undoes it.
    h.state_mut().push(Command::SetConfusionCell(Some((4, 2))));
    h.run();
    h.get_by_label("Flipped images: 2 lost, 0 gained");
    h.get_by_label("Show all").click();
    h.run();
    assert_eq!(h.state().classes.cell, None);
    // The buttons ask for a file (no dialog here); the dialog's answer writes it.
    h.get_by_label("Matrices CSV…").click();
    h.run();
    assert!(
        h.state()
            .history
            .contains(&Command::Export(ExportKind::ConfusionCsv))
    );
    let (matrices, gallery) = (dir.path().join("m.csv"), dir.path().join("g.csv"));
    h.state_mut().push(Command::ExportTo(
        ExportKind::ConfusionCsv,
        matrices.clone(),
    ));
    h.state_mut()
        .push(Command::ExportTo(ExportKind::GalleryCsv, gallery.clone()));
    h.run();
    let csv = std::fs::read_to_string(&matrices).expect("matrices written");
    assert!(
        csv.starts_with("engine,true_class,true_name,predicted_class"),
        "{csv}"
    );
    assert!(
        csv.contains("\"int8 entropy\",4,\"coat\",2,\"pullover\",2,0,2\n"),
        "{csv}"
    );
    assert!(
        csv.contains("\"fp32\",4,\"coat\",4,\"coat\",3,3,0\n"),
        "{csv}"
    );
    let csv = std::fs::read_to_string(&gallery).expect("gallery written");
    assert_eq!(
        csv.lines()
            .filter(|l| l.contains("\"int8 entropy\",lost,"))
            .count(),
        3,
        "{csv}"
    );
    assert!(csv.contains(&coat), "{csv}");
}

/// Each per-image tab says where the other task's view is.
#[test]
fn masks_and_classes_tabs_point_to_each_other() {
    let mut h = harness(sample_workbench());
    h.run();
    h.get_by_label("Classes").click();
    h.run();
    h.get_by_label_contains("the Masks tab shows its images");
    let mut h = harness(sample_classifier_workbench());
    h.run();
    h.get_by_label("Masks").click();
    h.run();
    h.get_by_label_contains("in the Classes tab");
}

/// Past 30 classes the Classes tab lists the most confused pairs and the largest moves rather
/// than drawing grids; a click on a pair narrows the gallery to it.
#[test]
fn classes_tab_lists_pairs_for_many_classes() {
    let mut wb = sample_classifier_workbench();
    let mut report = wb.results.report.clone().expect("report");
    report.evaluation.classes = (0..40).map(|c| format!("class_{c}")).collect();
    for r in &mut report.rows {
        r.confusion.as_mut().expect("confusion").classes = 40;
    }
    wb.set_results(report, None);
    wb.tab = Tab::Classes;
    let mut h = harness(wb);
    h.run();
    h.get_by_label("Most confused, INT8 max");
    h.get_by_label("Largest moves, INT8 max minus FP32");
    // INT8 max's one confusion: a pullover (class 2) taken for a coat (class 4).
    h.get_all_by_label("class_2")
        .next()
        .expect("the pair")
        .click();
    h.run();
    assert_eq!(h.state().classes.cell, Some((2, 4)));
    h.get_by_label("Flipped images: 1 lost, 0 gained");
}

/// The bundled classifier run in the window (FP32 and INT8 entropy, the method that flips most
/// images on it): the Classes tab shows INT8's matrices and its flipped images, whose
/// thumbnails and selected image load on the I/O thread.
#[test]
fn the_bundled_classifier_in_the_classes_tab() {
    let ron = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_resnet.ron");
    let mut e = Experiment::load(&ron).expect("sample experiment");
    e.precisions = vec![Precision::Fp32, Precision::Int8];
    e.methods = vec![quantscope::calib::Method::Entropy];
    e.bench.min_runs = 2;
    e.bench.warmup_runs = 0;
    e.bench.min_time_ms = 0.0;
    e.bench.batch = 1;
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(e)));
    // The Calibration panel writes the methods from its choice.
    wb.primary_method = quantscope::calib::Method::Entropy;
    let mut h = harness(wb);
    h.state_mut().push(Command::Run);
    h.step();
    until(&mut h, "the run", |wb| {
        !wb.is_running() && wb.results.report.is_some()
    });
    h.get_by_label("Classes").click();
    h.run();
    assert_eq!(h.state().classes_engine(), Some(1), "the INT8 row");
    h.get_by_role_and_label(Role::Canvas, "INT8 entropy minus FP32");
    let order = h.state().gallery_order();
    assert!(order.len() > 10, "{order:?}");
    let report = h.state().results.report.clone().expect("report");
    let name = report.image_name(order[1]);
    h.get_by_label(&name).click();
    h.run();
    assert_eq!(h.state().classes.image, Some(order[1]));
    let file = report.evaluation.image_files[order[1]].clone();
    until(&mut h, "the thumbnails and the selected image", |wb| {
        wb.classes.thumbs.len() >= 5 && wb.masks.images.contains_key(&file)
    });
    assert!(h.state().classes.thumb_errors.is_empty());
}
