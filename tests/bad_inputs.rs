//! The bad-input corpus: one case per class of bug the robustness audit found (crashes, hangs,
//! silently wrong results, lost files, dishonest exit codes), each run through the real binary
//! with a time limit. Every case must end with the documented exit code and a message that
//! names the file or the setting, never a panic.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use prost::Message;
use quantscope::model::proto;
use quantscope::model::testing::{GraphBuilder, residual_classifier};
use tract_onnx::pb;

const BAD_INPUT: i32 = 2;
const OUTPUT_FAILED: i32 = 4;
const INTERRUPTED: i32 = 130;

/// Runs the binary, killing it after `limit`: a hang is a failure, not a stuck test.
fn run_limited(args: &[String], cache: &Path, limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quantscope"))
        .args(args)
        .env("QUANTSCOPE_CACHE", cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let t = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("hung for {limit:?}: quantscope {}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

struct Case {
    dir: PathBuf,
}

impl Case {
    fn new(name: &str) -> Case {
        let dir = common::temp_dir(&format!("bad-{name}"));
        std::fs::write(dir.join("model.onnx"), residual_classifier(4).to_bytes(13)).expect("model");
        common::image_folder(&dir.join("calib"), 4, 16, 1);
        common::image_folder_dataset(&dir.join("eval"), 4, 2, 16);
        Case { dir }
    }

    fn p(&self, s: &str) -> String {
        self.dir.join(s).to_string_lossy().into_owned()
    }

    /// A quick `eval` of `model` (fp32 + int8 max), then `extra` flags.
    fn eval_args(&self, model: &str, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = [
            "eval",
            "--model",
            &self.p(model),
            "--calib",
            &self.p("calib"),
            "--data",
            &self.p("eval"),
            "--precisions",
            "fp32,int8",
            "--methods",
            "max",
            "--min-runs",
            "1",
            "--min-time-ms",
            "0",
            "--batch",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn run(&self, args: &[String]) -> (i32, String) {
        let out = run_limited(args, &self.dir.join("cache"), Duration::from_secs(120));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("panicked"), "no panic: {err}");
        (out.status.code().unwrap_or(-1), err)
    }

    /// Writes `model.onnx` edited by `edit` as `name`.
    fn edited_model(&self, name: &str, edit: impl FnOnce(&mut pb::ModelProto)) -> String {
        let mut m =
            pb::ModelProto::decode(residual_classifier(4).to_bytes(13).as_slice()).expect("decode");
        edit(&mut m);
        std::fs::write(self.dir.join(name), m.encode_to_vec()).expect("write");
        name.to_string()
    }
}

fn graph(m: &mut pb::ModelProto) -> &mut pb::GraphProto {
    m.graph.as_mut().expect("graph")
}

fn init<'a>(m: &'a mut pb::ModelProto, name: &str) -> &'a mut pb::TensorProto {
    graph(m)
        .initializer
        .iter_mut()
        .find(|t| t.name == name)
        .expect("initializer")
}

/// Overwrites value `i` of a float initializer (the builders store raw little-endian bytes).
fn set_f32(t: &mut pb::TensorProto, i: usize, v: f32) {
    t.raw_data[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

fn expect_refused(code: i32, err: &str, wants: &[&str]) {
    assert_eq!(code, BAD_INPUT, "exit code 2 for bad input: {err}");
    for w in wants {
        assert!(err.contains(w), "the message says `{w}`: {err}");
    }
}

#[test]
fn malformed_models_are_refused_with_the_file_and_node() {
    let c = Case::new("models");
    std::fs::write(c.dir.join("weights.bin"), [0u8; 100]).expect("external data");
    type Edit = Box<dyn FnOnce(&mut pb::ModelProto)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "short_bn.onnx",
            Box::new(|m| {
                let t = init(m, "stem.bn.s");
                t.raw_data.truncate(8);
                t.dims = vec![2];
            }),
            &["short_bn.onnx", "stem.bn", "one length"],
        ),
        (
            "offset.onnx",
            Box::new(|m| {
                let t = init(m, "fc.w");
                t.raw_data.clear();
                t.data_location = Some(pb::tensor_proto::DataLocation::External as i32);
                for (k, v) in [
                    ("location", "weights.bin"),
                    ("offset", "18446744073709551615"),
                ] {
                    t.external_data.push(pb::StringStringEntryProto {
                        key: k.into(),
                        value: v.into(),
                    });
                }
            }),
            &["offset.onnx", "fc.w"],
        ),
        (
            "dangling_output.onnx",
            Box::new(|m| graph(m).output[0].name = "nobody_makes_this".into()),
            &[
                "dangling_output.onnx",
                "nobody_makes_this",
                "no node produces",
            ],
        ),
        (
            "resize_one_input.onnx",
            Box::new(|m| {
                graph(m).node.push(proto::node(
                    "Resize",
                    "rs",
                    &["fc.out"],
                    &["rs.out"],
                    vec![],
                ))
            }),
            &["resize_one_input.onnx", "rs", "Resize"],
        ),
        (
            "softmax_no_input.onnx",
            Box::new(|m| {
                graph(m)
                    .node
                    .push(proto::node("Softmax", "sm", &[], &["sm.out"], vec![]))
            }),
            &["softmax_no_input.onnx", "`sm`", "input"],
        ),
        (
            "softmax_axis.onnx",
            Box::new(|m| {
                graph(m).node.push(proto::node(
                    "Softmax",
                    "sm",
                    &["fc.out"],
                    &["sm.out"],
                    vec![proto::int_attr("axis", 255)],
                ))
            }),
            &["softmax_axis.onnx", "axis 255"],
        ),
        (
            "perm.onnx",
            Box::new(|m| {
                graph(m).node.push(proto::node(
                    "Transpose",
                    "tr",
                    &["fc.out"],
                    &["tr.out"],
                    vec![proto::ints_attr("perm", &[1, 1 << 40])],
                ))
            }),
            &["perm.onnx", "`tr`", "permutation"],
        ),
        (
            "nan.onnx",
            Box::new(|m| set_f32(init(m, "block.conv1.w"), 5, f32::NAN)),
            &["nan.onnx", "block.conv1.w", "non-finite"],
        ),
        (
            "variance.onnx",
            Box::new(|m| set_f32(init(m, "stem.bn.v"), 1, -0.5)),
            &["variance.onnx", "variance", "negative"],
        ),
        (
            "cycle.onnx",
            Box::new(|m| graph(m).node[2].input[0] = "block.add.out".into()),
            &["cycle.onnx", "cycle"],
        ),
    ];
    for (name, edit, wants) in cases {
        let file = c.edited_model(name, edit);
        let (code, err) = c.run(&c.eval_args(&file, &[]));
        expect_refused(code, &err, wants);
        let out = run_limited(
            &["inspect".into(), c.p(&file)],
            &c.dir,
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(BAD_INPUT), "inspect {name}");
    }
}

#[test]
fn bad_settings_are_refused_before_anything_runs() {
    let c = Case::new("settings");
    let cases: &[(&[&str], &str)] = &[
        (&["--mean", "nan", "--std", "0.2"], "--mean"),
        (&["--mean", "0.5", "--std", "0"], "--std"),
        (&["--scale", "inf"], "--scale"),
        (&["--percentile", "150"], "--percentile"),
        (&["--min-runs", "0"], "--min-runs"),
        (&["--batch", "100000"], "--batch"),
        (&["--exclude", "block.conv_1"], "did you mean `block.conv1`"),
        (&["--calib-every", "0"], "--calib-every"),
    ];
    for (flags, want) in cases {
        let (code, err) = c.run(&c.eval_args("model.onnx", flags));
        expect_refused(code, &err, &[want]);
    }
    // A dynamic-size model at absurd sizes: refused, not an allocation abort.
    let mut dynamic = residual_classifier(4);
    dynamic.graph.input[0] = dynamic_input();
    std::fs::write(c.dir.join("dynamic.onnx"), dynamic.to_bytes(13)).expect("write");
    for size in ["30000,30000", "16000,16000"] {
        let (code, err) = c.run(&c.eval_args("dynamic.onnx", &["--size", size]));
        expect_refused(code, &err, &["--size"]);
    }
}

/// An NCHW float input with 3 channels and symbolic height and width.
fn dynamic_input() -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{Dimension, dimension::Value};
    let dim = |v: Value| Dimension {
        value: Some(v),
        ..Default::default()
    };
    let mut v = proto::float_value_info("x", Some(&[1, 3, 16, 16]));
    if let Some(pb::type_proto::Value::TensorType(t)) =
        v.r#type.as_mut().and_then(|t| t.value.as_mut())
        && let Some(s) = t.shape.as_mut()
    {
        s.dim[2] = dim(Value::DimParam("h".into()));
        s.dim[3] = dim(Value::DimParam("w".into()));
    }
    v
}

#[test]
fn unusual_folders_neither_hang_nor_mislead() {
    let c = Case::new("folders");
    // Two symlinks to `.` and a FIFO named like an image, in the calibration folder.
    let calib = c.dir.join("calib");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(".", calib.join("loop_a")).expect("symlink");
        std::os::unix::fs::symlink(".", calib.join("loop_b")).expect("symlink");
    }
    let fifo = Command::new("mkfifo").arg(calib.join("x.png")).status();
    if !fifo.is_ok_and(|s| s.success()) {
        eprintln!("no mkfifo: the FIFO case is left out");
    }
    let (code, err) = c.run(&c.eval_args("model.onnx", &[]));
    assert_eq!(code, 0, "a folder with loops and a FIFO still runs: {err}");

    // A class folder missing: every label would shift.
    std::fs::remove_dir_all(c.dir.join("eval/class_3")).expect("rm");
    let (code, err) = c.run(&c.eval_args("model.onnx", &[]));
    expect_refused(code, &err, &["3 class", "4 classes", "labels.txt"]);
}

#[test]
fn bad_masks_are_errors_that_list_the_files() {
    let c = Case::new("masks");
    // A one-conv segmenter with 4 classes.
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let y = b.conv("seg", "x", 3, 4, 3);
    b.output(&y);
    std::fs::write(c.dir.join("seg.onnx"), b.to_bytes(13)).expect("seg");
    let seg = c.dir.join("seg");
    let images = common::image_folder(&seg.join("images"), 3, 16, 5);
    std::fs::create_dir_all(seg.join("masks")).expect("masks");
    let mask = |name: &str, size: u32, id: u8| {
        let m = image::GrayImage::from_fn(size, size, |x, _| {
            image::Luma([if x == 0 { id } else { 1 }])
        });
        m.save(seg.join("masks").join(name)).expect("mask");
    };
    let stem = |i: usize| {
        images[i]
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string()
    };
    let mut args = c.eval_args("seg.onnx", &[]);
    args[6] = seg.to_string_lossy().into_owned();
    // Image 2 has no mask.
    mask(&format!("{}.png", stem(0)), 16, 0);
    mask(&format!("{}.png", stem(1)), 16, 255);
    let (code, err) = c.run(&args);
    expect_refused(code, &err, &[&stem(2), "mask"]);
    // A mask of the wrong size.
    mask(&format!("{}.png", stem(2)), 8, 0);
    let (code, err) = c.run(&args);
    expect_refused(code, &err, &[&stem(2), "size"]);
    // Ids past the model's 4 classes (255 is ignore and fine).
    mask(&format!("{}.png", stem(2)), 16, 9);
    let (code, err) = c.run(&args);
    expect_refused(code, &err, &[&stem(2), "9"]);
    // All fixed: the run goes through.
    mask(&format!("{}.png", stem(2)), 16, 3);
    let (code, err) = c.run(&args);
    assert_eq!(code, 0, "{err}");
    // Overlays into the ground-truth folder would replace the masks.
    let before = std::fs::read(seg.join("masks").join(format!("{}.png", stem(0)))).expect("read");
    let mut a = args.clone();
    a.extend([
        "--save-masks".into(),
        seg.join("masks").to_string_lossy().into_owned(),
    ]);
    let (code, err) = c.run(&a);
    expect_refused(code, &err, &["evaluation masks"]);
    let after = std::fs::read(seg.join("masks").join(format!("{}.png", stem(0)))).expect("read");
    assert_eq!(before, after, "the ground truth is untouched");
}

#[test]
fn files_are_never_destroyed() {
    let c = Case::new("files");
    let model_before = std::fs::read(c.dir.join("model.onnx")).expect("model");
    // --save-experiment onto the model itself.
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--save-experiment", &c.p("model.onnx")]));
    expect_refused(code, &err, &["the model"]);
    assert_eq!(
        std::fs::read(c.dir.join("model.onnx")).expect("model"),
        model_before
    );

    // A good experiment, then a failing run that names it: the file stays as it was.
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--save-experiment", &c.p("good.ron")]));
    assert_eq!(code, 0, "{err}");
    let good = std::fs::read_to_string(c.dir.join("good.ron")).expect("saved");
    let (code, _) = c.run(&c.eval_args("missing.onnx", &["--save-experiment", &c.p("good.ron")]));
    assert_eq!(code, BAD_INPUT);
    assert_eq!(
        std::fs::read_to_string(c.dir.join("good.ron")).expect("kept"),
        good
    );

    // `run x.ron --report x.ron` would overwrite the experiment.
    let (code, err) = c.run(&[
        "run".into(),
        c.p("good.ron"),
        "--report".into(),
        c.p("good.ron"),
    ]);
    expect_refused(code, &err, &["experiment file"]);
    assert_eq!(
        std::fs::read_to_string(c.dir.join("good.ron")).expect("kept"),
        good
    );

    // An experiment from a newer quantscope.
    std::fs::write(
        c.dir.join("v99.ron"),
        good.replacen("version: 1", "version: 99", 1),
    )
    .expect("w");
    let (code, err) = c.run(&["run".into(), c.p("v99.ron")]);
    expect_refused(code, &err, &["v99.ron", "version 99"]);

    // An output that cannot be written: exit code 4, the other outputs still written.
    std::fs::write(c.dir.join("blocker"), "a file, not a folder").expect("w");
    let (code, err) = c.run(&c.eval_args(
        "model.onnx",
        &["--report", &c.p("blocker/r.json"), "--md", &c.p("ok.md")],
    ));
    assert_eq!(code, OUTPUT_FAILED, "{err}");
    assert!(err.contains("blocker"), "{err}");
    assert!(c.dir.join("ok.md").is_file(), "the other output is written");
}

#[test]
fn an_edited_statistics_cache_is_recomputed() {
    let c = Case::new("cache");
    let (code, err) = c.run(&c.eval_args("model.onnx", &[]));
    assert_eq!(code, 0, "{err}");
    let stats_dir = c.dir.join("cache/stats");
    let file = std::fs::read_dir(&stats_dir)
        .expect("cache written")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a statistics file");
    let text = std::fs::read_to_string(&file).expect("read");
    let edited = text.replacen("\"images\":4", "\"images\":5", 1);
    assert_ne!(text, edited, "the edit changes the file");
    std::fs::write(&file, edited).expect("edit");
    let (code, err) = c.run(&c.eval_args("model.onnx", &[]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("checksum"), "the edit is noticed: {err}");
    assert!(
        err.contains("calibration pass"),
        "and the statistics recomputed: {err}"
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_writes_the_finished_rows_marked_incomplete() {
    let c = Case::new("sigint");
    // Each engine is timed for 5 s: Ctrl-C arrives while FP16 is.
    let mut args = c.eval_args("model.onnx", &["--report", &c.p("partial.json")]);
    let i = args
        .iter()
        .position(|a| a == "fp32,int8")
        .expect("precisions");
    args[i] = "fp32,fp16".into();
    let j = args.iter().position(|a| a == "0").expect("min time");
    args[j] = "5000".into();
    let mut child = Command::new(env!("CARGO_BIN_EXE_quantscope"))
        .args(&args)
        .env("QUANTSCOPE_CACHE", c.dir.join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let t = Instant::now();
    // The FP32 row is printed once FP32 is done.
    for line in lines.by_ref() {
        let line = line.expect("line");
        if line.starts_with("fp32") || t.elapsed() > Duration::from_secs(100) {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    assert!(t.elapsed() < Duration::from_secs(100), "stopped promptly");
    assert_eq!(status.code(), Some(INTERRUPTED), "{rest:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.dir.join("partial.json")).expect("report written"))
            .expect("json");
    assert_eq!(report["incomplete"], true);
    let rows = report["rows"].as_array().expect("rows");
    assert!(
        rows[0]["error"].is_null() && rows[0]["top1"].is_number(),
        "FP32 is kept: {rows:?}"
    );
}
