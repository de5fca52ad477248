//! Snapshot tests of the main views, rendered through wgpu (llvmpipe here, no display).
//! Create or update them with `UPDATE_SNAPSHOTS=1 cargo test --test ui_snapshots`.

use eframe::egui;
use egui_kittest::Harness;
use quantscope::ui::testing::sample_workbench;
use quantscope::ui::{Tab, Workbench};

fn snapshot(name: &str, setup: impl FnOnce(&mut Workbench)) {
    let mut wb = sample_workbench();
    setup(&mut wb);
    let mut h = Harness::builder()
        .with_size(egui::vec2(1400.0, 860.0))
        .wgpu()
        .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), wb);
    h.run();
    h.snapshot(name);
}

#[test]
fn compare_view() {
    snapshot("compare", |wb| wb.tab = Tab::Compare);
}

#[test]
fn masks_view() {
    snapshot("masks", |wb| wb.tab = Tab::Masks);
}

#[test]
fn calibration_view() {
    snapshot("calibration", |wb| wb.tab = Tab::Calibration);
}

#[test]
fn layers_view() {
    snapshot("layers", |wb| {
        wb.set_sensitivity(quantscope::ui::testing::sample_sensitivity());
        wb.tab = Tab::Layers;
    });
}

#[test]
fn graph_view() {
    snapshot("graph", |wb| {
        wb.set_sensitivity(quantscope::ui::testing::sample_sensitivity());
        wb.tab = Tab::Graph;
        wb.selected_node = Some("block1/add".into());
    });
}

/// The Classes tab on the bundled classifier's images: INT8 entropy's confusion matrix and its
/// difference against FP32, per-class accuracy, and the flipped images with their thumbnails
/// (loaded by the worker's I/O thread, as in the window).
#[test]
fn classes_view() {
    let mut wb = quantscope::ui::testing::sample_classifier_workbench();
    wb.worker = Some(quantscope::worker::Worker::spawn().expect("worker"));
    wb.tab = Tab::Classes;
    wb.classes.engine = Some(3);
    let mut h = Harness::builder()
        .with_size(egui::vec2(1400.0, 860.0))
        .wgpu()
        .build_ui_state(|ui, wb: &mut Workbench| wb.frame_ui(ui), wb);
    h.run();
    let start = std::time::Instant::now();
    let loaded = |wb: &Workbench| {
        wb.classes.thumb_loading.is_empty()
            && wb.masks.image_loading.is_empty()
            && !wb.classes.thumbs.is_empty()
            && !wb.masks.images.is_empty()
    };
    while !loaded(h.state()) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the gallery's images never loaded"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        h.step();
    }
    h.run();
    h.snapshot("classes");
}
