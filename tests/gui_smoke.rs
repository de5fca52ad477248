//! The real window under Xvfb, driven through a DeepLab-sized run to the end: a 257x257
//! segmenter with 21 classes (made in code), calibration and evaluation folders, FP32 and INT8
//! engines. The window writes its report, a screenshot and its log, then closes; the test checks
//! all three and the exit code. Skips, saying why, where Xvfb is not installed (.ci/run
//! installs it).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use quantscope::model::proto;
use quantscope::model::testing::{GraphBuilder, values};

const CLASSES: usize = 21;
const SIDE: usize = 257;

/// A strided 3x3 conv + ReLU, as in a DeepLab backbone.
fn down(b: &mut GraphBuilder, name: &str, input: &str, cin: usize, cout: usize) -> String {
    let w = format!("{name}.w");
    let n = cout * cin * 9;
    let v: Vec<f32> = values(n, cin as u64 * 31 + cout as u64)
        .iter()
        .map(|x| x * 3.0 / (cin * 9) as f32)
        .collect();
    b.graph
        .initializer
        .push(proto::f32_tensor(&w, &[cout, cin, 3, 3], &v));
    let out = format!("{name}.out");
    b.graph.node.push(proto::node(
        "Conv",
        name,
        &[input, &w],
        &[&out],
        vec![
            proto::ints_attr("kernel_shape", &[3, 3]),
            proto::ints_attr("strides", &[2, 2]),
            proto::ints_attr("pads", &[1, 1, 1, 1]),
        ],
    ));
    b.op("Relu", &format!("{name}.relu"), &[&out])
}

/// Backbone at 1/8 resolution, a 21-class head, bilinear resize back to 257x257.
fn deeplab_sized() -> Vec<u8> {
    let mut b = GraphBuilder::new(&[1, 3, SIDE, SIDE]);
    let s1 = down(&mut b, "stem", "x", 3, 16);
    let s2 = down(&mut b, "block1", &s1, 16, 32);
    let s3 = down(&mut b, "block2", &s2, 32, 64);
    let c = b.conv("aspp", &s3, 64, 64, 3);
    let r = b.op("Relu", "aspp.relu", &[&c]);
    let logits = b.conv("classifier", &r, 64, CLASSES, 1);
    b.graph.initializer.push(proto::i64_tensor(
        "sizes",
        &[4],
        &[1, CLASSES as i64, SIDE as i64, SIDE as i64],
    ));
    b.graph.node.push(proto::node(
        "Resize",
        "upsample",
        &[&logits, "", "", "sizes"],
        &["out"],
        vec![proto::str_attr("mode", "linear")],
    ));
    b.output("out");
    b.to_bytes(13)
}

/// `n` photos-sized images (and masks with VOC-style ids and 255 = ignore) under `root`.
fn segmentation_set(root: &Path, n: usize, seed: u64) {
    std::fs::create_dir_all(root.join("images")).expect("images");
    std::fs::create_dir_all(root.join("masks")).expect("masks");
    for i in 0..n {
        let v = values(320 * 240, seed + i as u64);
        let img = image::RgbImage::from_fn(320, 240, |x, y| {
            let k = (y * 320 + x) as usize;
            let t = ((v[k] * 0.5 + 0.5) * 255.0) as u8;
            image::Rgb([t, (x as u8).wrapping_mul(3), (y as u8).wrapping_add(t / 2)])
        });
        img.save(root.join("images").join(format!("{i:03}.jpg")))
            .expect("jpg");
        let mask = image::GrayImage::from_fn(320, 240, |x, y| {
            let id = ((x / 40 + y / 40) as usize + i) % CLASSES;
            image::Luma([if x % 97 == 0 { 255 } else { id as u8 }])
        });
        mask.save(root.join("masks").join(format!("{i:03}.png")))
            .expect("png");
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn the_window_runs_a_deeplab_sized_experiment_to_the_end() {
    if !have("Xvfb") {
        eprintln!("skipped: Xvfb is not installed (apt-get install xvfb; .ci/run does)");
        return;
    }
    let dir = common::temp_dir("gui-smoke");
    std::fs::write(dir.join("deeplab_sized.onnx"), deeplab_sized()).expect("model");
    segmentation_set(&dir.join("data"), 6, 7);
    common::image_folder(&dir.join("calib"), 6, 96, 3);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).expect("out");
    std::fs::write(
        dir.join("smoke.ron"),
        r#"Experiment(
    version: 1,
    name: "gui_smoke",
    model: "deeplab_sized.onnx",
    calibration: (dir: Some("calib")),
    evaluation: (dir: Some("data"), task: segmentation),
    preprocess: (resize: stretch, normalize: ScaleOffset(scale: 0.0078431373, offset: -1.0)),
    methods: [max, entropy],
    precisions: [fp32, int8],
    bench: (warmup_runs: 1, min_runs: 3, min_time_ms: 200.0, batch: 2),
)"#,
    )
    .expect("experiment");
    let display = format!(":{}", 50 + std::process::id() % 400);
    let mut xvfb = Command::new("Xvfb")
        .args([
            display.as_str(),
            "-screen",
            "0",
            "1600x1000x24",
            "-nolisten",
            "tcp",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Xvfb starts");
    std::thread::sleep(Duration::from_secs(2));
    let mut app = Command::new(env!("CARGO_BIN_EXE_quantscope"))
        .arg("gui")
        .arg(dir.join("smoke.ron"))
        .env("DISPLAY", &display)
        .env("WAYLAND_DISPLAY", "")
        .env("QUANTSCOPE_AUTORUN", "1")
        .env("QUANTSCOPE_SMOKE_OUT", &out)
        .env("QUANTSCOPE_CACHE", dir.join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the window starts");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = app.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(400) {
            let _ = app.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = xvfb.kill();
    let _ = xvfb.wait();
    let stderr = app
        .wait_with_output()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    let log = std::fs::read_to_string(out.join("log.txt")).unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("the window did not finish in 400 s\n{log}\n{stderr}"));
    assert!(status.success(), "exit {status:?}\n{log}\n{stderr}");
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("report.json"))
            .unwrap_or_else(|e| panic!("no report ({e})\n{log}\n{stderr}")),
    )
    .expect("json");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3, "FP32, INT8 max, INT8 entropy: {rows:?}");
    for r in rows {
        assert!(r["error"].is_null(), "row failed: {r}\n{log}");
        assert!(r["miou"].is_number(), "{r}");
    }
    let shot = std::fs::metadata(out.join("window.png"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        shot > 10_000,
        "a screenshot of the window ({shot} bytes)\n{log}"
    );
    assert!(log.contains("finished"), "{log}");
}
