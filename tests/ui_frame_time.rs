//! The UI thread never blocks: a real worker job runs on a small model built in code and a
//! generated ImageFolder while the harness draws frames; every frame must take < 50 ms.
//! Cancelling stops the job within a second and keeps the rows already finished.

use std::path::Path;
use std::time::{Duration, Instant};

use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use quantscope::backend::Precision;
use quantscope::experiment::Experiment;
use quantscope::model::testing::residual_classifier;
use quantscope::ui::{Command, Settings, Workbench};

const FRAME_BUDGET_MS: f64 = 50.0;

/// The tests here take turns. Run side by side (cargo's default), the other tests' worker
/// jobs (the cancel test's 4-second benchmark among them) took the cores whose frames were
/// being timed: on a 2-core CI machine the build's worst frame was 59.7 and then 69.6 ms
/// against means of 3.5 and 4.2 ms (two runs on 2026-11-30). A frame is timed against its
/// own test's job, the one the UI must not wait on, not against another test's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn (a test that failed before it still passes the turn on).
fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// `root/<class>/<i>.png`: 16x16 images whose colour depends on the class.
fn image_folder(root: &Path, classes: usize, per_class: usize) {
    for c in 0..classes {
        let dir = root.join(format!("class{c}"));
        std::fs::create_dir_all(&dir).expect("class folder");
        for i in 0..per_class {
            let img = image::RgbImage::from_fn(16, 16, |x, y| {
                let v = ((x + y * 3 + i as u32 * 7) % 64) as u8;
                let mut p = [v, v, v];
                p[c % 3] = 160 + v;
                image::Rgb(p)
            });
            img.save(dir.join(format!("{i}.png"))).expect("png");
        }
    }
}

fn experiment(root: &Path, min_time_ms: f64) -> Experiment {
    let model = root.join("tiny.onnx");
    std::fs::write(&model, residual_classifier(3).to_bytes(13)).expect("model file");
    let data = root.join("data");
    image_folder(&data, 3, 8);
    let mut e = Experiment {
        name: "frame-time".into(),
        model,
        precisions: vec![Precision::Fp32, Precision::Fp16, Precision::Int8],
        ..Default::default()
    };
    e.calibration.dir = Some(data.clone());
    e.evaluation.dir = Some(data);
    e.bench.min_runs = 5;
    e.bench.warmup_runs = 1;
    e.bench.min_time_ms = min_time_ms;
    e.bench.batch = 2;
    e
}

fn harness(wb: Workbench) -> Harness<'static, Workbench> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), wb)
}

#[test]
fn frames_stay_under_50_ms_while_a_build_runs() {
    let _turn = turn();
    let dir = tempfile::tempdir().expect("temp dir");
    let exp = experiment(dir.path(), 150.0);
    let exp_path = dir.path().join("exp.ron");
    exp.save(&exp_path).expect("save");
    let mut h = harness(Workbench::new(Some(&exp_path), Settings::default()));
    h.state_mut().push(Command::Run);
    let start = Instant::now();
    let mut frames_ms = vec![];
    let mut busy_frames = 0;
    loop {
        let t = Instant::now();
        h.step();
        frames_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if h.state().is_running() {
            busy_frames += 1;
        } else if busy_frames > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the job never finished"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The first frame builds fonts and layout caches; it is not a frame "while the worker runs".
    let worst_ms = frames_ms.iter().skip(1).copied().fold(0.0, f64::max);
    let mean_ms = frames_ms.iter().sum::<f64>() / frames_ms.len() as f64;
    eprintln!(
        "{} frames ({busy_frames} while the worker ran, {:.1} s): mean {mean_ms:.2} ms, worst {worst_ms:.2} ms, first {:.2} ms",
        frames_ms.len(),
        start.elapsed().as_secs_f64(),
        frames_ms[0]
    );
    assert!(busy_frames > 10, "frames were drawn while the job ran");
    assert!(
        worst_ms < FRAME_BUDGET_MS,
        "worst frame {worst_ms:.1} ms >= {FRAME_BUDGET_MS} ms"
    );
    let wb = h.state();
    assert!(
        !wb.log.iter().any(|l| l.error),
        "errors: {:?}",
        wb.log
            .iter()
            .filter(|l| l.error)
            .map(|l| &l.text)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        wb.results.rows().len(),
        2 + 4,
        "FP32, FP16 and four INT8 rows"
    );
    assert!(
        wb.results
            .report
            .as_ref()
            .is_some_and(|r| r.calibration.is_some())
    );
    assert!(
        wb.model.info.is_some(),
        "the model was inspected off the UI thread"
    );
}

#[test]
fn cancel_stops_within_a_second_and_keeps_finished_rows() {
    let _turn = turn();
    let dir = tempfile::tempdir().expect("temp dir");
    // Long timing per engine, so there is something to cancel.
    let exp = experiment(dir.path(), 4000.0);
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp)));
    let mut h = harness(wb);
    h.state_mut().push(Command::Run);
    let start = Instant::now();
    while h.state().results.rows.is_empty() {
        h.step();
        assert!(start.elapsed() < Duration::from_secs(120), "no row arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    h.key_press(egui::Key::Escape);
    let cancelled_at = Instant::now();
    while h.state().is_running() {
        h.step();
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(1),
            "the job did not stop within a second"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let wb = h.state();
    assert!(
        wb.results.partial,
        "the results are marked as a cancelled run"
    );
    assert!(!wb.results.rows().is_empty(), "finished rows are kept");
    assert!(wb.results.rows().len() < 6);
}

/// Steps frames until no job runs; returns the worst frame (after the first) in ms.
fn run_to_end(h: &mut Harness<'static, Workbench>, what: &str) -> f64 {
    let start = Instant::now();
    let mut frames_ms = vec![];
    loop {
        let t = Instant::now();
        h.step();
        frames_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if !h.state().is_running() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{what} never finished"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    frames_ms.iter().skip(1).copied().fold(0.0, f64::max)
}

#[test]
fn layer_analysis_runs_on_the_worker_and_a_toggled_layer_becomes_an_engine() {
    let _turn = turn();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut exp = experiment(dir.path(), 20.0);
    exp.methods = vec![quantscope::calib::Method::Max];
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(exp)));
    wb.tab = quantscope::ui::Tab::Layers;
    wb.layers.find_mixed = false;
    let mut h = harness(wb);
    h.state_mut().push(Command::AnalyseSensitivity);
    h.step();
    assert!(h.state().run.as_ref().is_some_and(|r| r.sensitivity));
    let worst_ms = run_to_end(&mut h, "the analysis");
    assert!(
        worst_ms < FRAME_BUDGET_MS,
        "worst frame {worst_ms:.1} ms while analysing"
    );
    let errors: Vec<&String> = h
        .state()
        .log
        .iter()
        .filter(|l| l.error)
        .map(|l| &l.text)
        .collect();
    assert!(errors.is_empty(), "errors: {errors:?}");
    let report = h
        .state()
        .layers
        .report
        .clone()
        .expect("a sensitivity report");
    assert!(!report.layers.is_empty());
    // The table shows the layers; toggling the first puts it in the experiment.
    h.run();
    let first = report.layers[0].node.clone();
    h.get_by_label(&first);
    h.get_all_by_label("int8")
        .next()
        .expect("a precision button")
        .click();
    h.run();
    let mp = h.state().exp.mixed_precision.clone().expect("a plan");
    assert_eq!(mp.keep_float, vec![first]);
    h.get_by_label("Re-run").click();
    h.run();
    run_to_end(&mut h, "the run");
    let rows = h.state().results.rows().to_vec();
    assert_eq!(
        rows.len(),
        2 + 1 + 1,
        "FP32, FP16, INT8 max, INT8 max + 1 float"
    );
    assert!(
        rows.iter()
            .any(|r| r.kept_float.len() == 1 && r.error.is_none()),
        "the mixed-precision engine: {:?}",
        rows.iter().map(|r| r.label()).collect::<Vec<_>>()
    );
}

#[test]
fn a_failed_run_returns_to_idle_with_the_error_and_run_works_again() {
    let _turn = turn();
    let dir = tempfile::tempdir().expect("temp dir");
    let good = experiment(dir.path(), 20.0);
    // The same model with a NaN weight: refused by validation, on the worker.
    let mut bad = good.clone();
    let mut broken = residual_classifier(3);
    if let Some(t) = broken
        .graph
        .initializer
        .iter_mut()
        .find(|t| t.name == "fc.w")
    {
        t.raw_data[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
    }
    bad.model = dir.path().join("broken.onnx");
    std::fs::write(&bad.model, broken.to_bytes(13)).expect("model file");
    let mut wb = Workbench::new(None, Settings::default());
    wb.apply(Command::SetExperiment(Box::new(bad)));
    let mut h = harness(wb);
    h.state_mut().push(Command::Run);
    h.step();
    assert!(h.state().is_running());
    run_to_end(&mut h, "the failing run");
    let banner = h.state().banner.clone().map(|b| b.0).unwrap_or_default();
    assert!(
        banner.contains("broken.onnx") && banner.contains("non-finite"),
        "the error names the file and the problem: {banner}"
    );
    h.state_mut().apply(Command::SetExperiment(Box::new(good)));
    h.state_mut().push(Command::Run);
    h.step();
    assert!(h.state().is_running(), "Run works again");
    run_to_end(&mut h, "the good run");
    assert_eq!(
        h.state().results.rows().len(),
        6,
        "every engine of the good run"
    );
}

/// "Stays smooth on ViT-B/16": a ~1,000-node graph (laid out once, off the frame) drawn at its
/// first view, fitted whole (every box and edge on screen), zoomed at the pointer and dragged;
/// every frame after the first stays under the budget.
#[test]
fn a_thousand_node_graph_stays_under_the_frame_budget() {
    let _turn = turn();
    use quantscope::ui::{Overlay, Tab};
    let mut wb = quantscope::ui::testing::sample_workbench();
    let d = quantscope::model::diagram::synthetic(1000);
    let report = wb.results.report.as_mut().expect("a report");
    for r in &mut report.rows {
        r.layer_times = d
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| quantscope::backend::LayerTime {
                layer: n.name.clone(),
                kernel: n.op.clone(),
                time_ms: 0.01 + (i % 17) as f64 * 0.03,
                precision: None,
            })
            .collect();
    }
    wb.results.rows = report.rows.clone();
    let nodes = d.nodes.len();
    wb.model.diagram = Some(std::sync::Arc::new(d));
    wb.tab = Tab::Graph;
    wb.graph.overlay = Overlay::TimeMs;
    let mut h = harness(wb);
    h.run();
    let mut frames_ms: Vec<(String, f64)> = vec![];
    let mut frame = |h: &mut Harness<'static, Workbench>, what: &str| {
        let t = Instant::now();
        h.step();
        frames_ms.push((what.to_string(), t.elapsed().as_secs_f64() * 1e3));
    };
    for _ in 0..5 {
        frame(&mut h, "first view");
    }
    h.state_mut().graph.fit = true;
    for _ in 0..5 {
        frame(&mut h, "fitted");
    }
    let centre = egui::pos2(700.0, 500.0);
    h.hover_at(centre);
    for _ in 0..8 {
        h.event(egui::Event::Zoom(1.4));
        frame(&mut h, "zooming");
    }
    h.drag_at(centre);
    for k in 0..8 {
        h.hover_at(centre + egui::vec2(0.0, 30.0 * k as f32));
        frame(&mut h, "dragging");
    }
    h.drop_at(centre + egui::vec2(0.0, 240.0));
    frame(&mut h, "dropped");
    h.state_mut().graph.overlay = Overlay::Precision;
    h.state_mut().graph.fit = true;
    frame(&mut h, "precision, fitted");
    let (worst_what, worst_ms) = frames_ms
        .iter()
        .cloned()
        .fold((String::new(), 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let mean_ms = frames_ms.iter().map(|f| f.1).sum::<f64>() / frames_ms.len() as f64;
    eprintln!(
        "{nodes} boxes: {} frames, mean {mean_ms:.2} ms, worst {worst_ms:.2} ms ({worst_what}); zoom now {:.2}",
        frames_ms.len(),
        h.state().graph.zoom
    );
    assert!(
        worst_ms < FRAME_BUDGET_MS,
        "worst frame {worst_ms:.1} ms ({worst_what}) >= {FRAME_BUDGET_MS} ms"
    );
    assert!(h.state().graph.zoom > 0.0);
}

/// A classifier report of `classes` classes over `images` images: FP32, FP16 and four INT8
/// engines, each with its confusion matrix and per-class accuracy, and the gallery.
fn large_classifier_report(classes: usize, images: usize) -> quantscope::report::Report {
    use quantscope::report::{Confusion, ImageTop, Report, Row};
    let labels: Vec<usize> = (0..images).map(|i| i % classes).collect();
    let mut tops = vec![];
    let mut rows = vec![];
    for k in 0..6usize {
        let t: Vec<ImageTop> = labels
            .iter()
            .enumerate()
            .map(|(i, &y)| {
                let pred = match k {
                    0 | 1 if i % 7 == 0 => (y + 1) % classes,
                    2.. if i % (3 + k) == 0 => (y + k) % classes,
                    _ => y,
                };
                ImageTop {
                    top: vec![
                        (pred as u32, 0.8),
                        (((pred + 1) % classes) as u32, 0.1),
                        (((pred + 2) % classes) as u32, 0.05),
                    ],
                    true_p: if pred == y { 0.8 } else { 0.02 },
                }
            })
            .collect();
        let mut tally = quantscope::eval::ClassTally::default();
        for (x, &y) in t.iter().zip(&labels) {
            let mut scores = vec![0.0f32; classes];
            scores[x.top1().unwrap_or(0)] = 1.0;
            tally.add(&scores, y);
        }
        rows.push(Row {
            precision: Some(
                [Precision::Fp32, Precision::Fp16][..]
                    .get(k)
                    .copied()
                    .unwrap_or(Precision::Int8),
            ),
            method: (k >= 2).then(|| quantscope::calib::Method::ALL[k - 2]),
            top1: Some(tally.top1()),
            per_class_accuracy: Some(tally.per_class_accuracy()),
            confusion: Some(Confusion::from_pairs(
                classes,
                labels
                    .iter()
                    .copied()
                    .zip(t.iter().map(|x| x.top1().unwrap_or(0))),
            )),
            ..Default::default()
        });
        tops.push(t);
    }
    let mut r = Report {
        gallery: quantscope::report::gallery(0, &tops, &labels),
        rows,
        ..Default::default()
    };
    r.model.task = Some(quantscope::model::Task::Classification);
    r.evaluation.classes = (0..classes).map(|c| format!("class_{c}")).collect();
    r.evaluation.image_files = (0..images)
        .map(|i| format!("missing/{i}.png").into())
        .collect();
    r
}

/// The Classes tab draws a 30-class model (two 30 × 30 heatmaps) and a 1000-class one (pairs,
/// 1000 per-class rows, a full gallery) within the frame budget.
#[test]
fn classes_tab_draws_large_models_within_the_budget() {
    let _turn = turn();
    for (classes, images) in [(30, 3000), (1000, 20_000)] {
        let mut wb = Workbench::without_worker(Settings::default());
        wb.set_results(large_classifier_report(classes, images), None);
        wb.tab = quantscope::ui::Tab::Classes;
        let mut h = harness(wb);
        h.run();
        assert_eq!(
            h.state().results.report.as_ref().map(|r| r.gallery.len()),
            Some(256)
        );
        let mut worst_ms: f64 = 0.0;
        for _ in 0..5 {
            let t = Instant::now();
            h.step();
            worst_ms = worst_ms.max(t.elapsed().as_secs_f64() * 1e3);
        }
        assert!(
            worst_ms < FRAME_BUDGET_MS,
            "{classes} classes: worst frame {worst_ms:.1} ms"
        );
        eprintln!("{classes} classes: worst frame {worst_ms:.1} ms");
    }
}
