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
        (
            "bn_zero.onnx",
            Box::new(|m| {
                let v = init(m, "stem.bn.v");
                v.raw_data.iter_mut().for_each(|b| *b = 0);
                graph(m).node[1]
                    .attribute
                    .push(proto::float_attr("epsilon", 0.0));
            }),
            &["bn_zero.onnx", "stem.bn", "divides by zero"],
        ),
        (
            "huge_weight.onnx",
            Box::new(|m| set_f32(init(m, "block.conv1.w"), 5, 1e38)),
            &["huge_weight.onnx", "block.conv1.w", "overflow float32"],
        ),
        (
            "bn_short.onnx",
            Box::new(|m| {
                for p in ["s", "b", "m", "v"] {
                    let t = init(m, &format!("stem.bn.{p}"));
                    t.raw_data.truncate(16);
                    t.dims = vec![4];
                }
            }),
            &["bn_short.onnx", "stem.bn", "8 channels"],
        ),
        (
            "ir0.onnx",
            Box::new(|m| m.ir_version = 0),
            &["ir0.onnx", "IR version 0"],
        ),
        (
            "ir99.onnx",
            Box::new(|m| m.ir_version = 99),
            &["ir99.onnx", "IR version 99"],
        ),
        (
            "int64_input.onnx",
            Box::new(|m| {
                if let Some(pb::type_proto::Value::TensorType(t)) = graph(m).input[0]
                    .r#type
                    .as_mut()
                    .and_then(|t| t.value.as_mut())
                {
                    t.elem_type = pb::tensor_proto::DataType::Int64 as i32;
                }
            }),
            &["int64_input.onnx", "int64", "float"],
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
        (&["--calib-count", "0"], "--calib-count must be ≥ 1"),
        (&["--correction-images", "0"], "--correction-images"),
        (&["--scale", "0"], "--scale: 0"),
        (&["--budget-top1", "nan"], "--budget-top1"),
        (&["--budget-miou-rel=-3"], "--budget-miou-rel"),
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
    // A model whose own input is 100,000 pixels wide: refused like --size, not run for minutes.
    let file = c.edited_model("wide.onnx", |m| {
        if let Some(pb::type_proto::Value::TensorType(t)) = graph(m).input[0]
            .r#type
            .as_mut()
            .and_then(|t| t.value.as_mut())
            && let Some(s) = t.shape.as_mut()
        {
            s.dim[3].value = Some(pb::tensor_shape_proto::dimension::Value::DimValue(100_000));
        }
    });
    let (code, err) = c.run(&c.eval_args(&file, &[]));
    expect_refused(code, &err, &["100000", "re-export"]);
    // Shapes that contradict each other: refused before any engine, naming the node.
    let file = c.edited_model("mismatch.onnx", |m| {
        let t = init(m, "fc.w");
        t.dims = vec![2, 16];
    });
    let (code, err) = c.run(&c.eval_args(&file, &[]));
    expect_refused(code, &err, &["mismatch.onnx", "do not fit", "fc"]);
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

/// Reads a run's JSON report.
fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("report written")).expect("json")
}

#[test]
fn non_finite_outputs_void_their_rows_and_exit_3() {
    let c = Case::new("nan-out");
    // Sqrt of the logits: every negative logit is NaN at run time, though every weight is sane.
    let file = c.edited_model("sqrt.onnx", |m| {
        graph(m)
            .node
            .push(proto::node("Sqrt", "sq", &["fc.out"], &["sq.out"], vec![]));
        graph(m).output[0].name = "sq.out".into();
    });
    let (code, err) =
        c.run(&c.eval_args(&file, &["--report", &c.p("r.json"), "--md", &c.p("r.md")]));
    assert_eq!(code, 3, "NaN outputs are a failed engine: {err}");
    assert!(err.contains("NaN/Inf"), "{err}");
    let report = json(&c.dir.join("r.json"));
    for row in report["rows"].as_array().expect("rows") {
        assert!(row["top1"].is_null(), "no metric from NaN: {row}");
        assert!(row["agreement"].is_null(), "{row}");
        assert!(row["non_finite"].is_object(), "counted: {row}");
    }
    assert!(report["rows"][0]["non_finite"]["images"].as_u64() > Some(0));
    let md = std::fs::read_to_string(c.dir.join("r.md")).expect("md");
    assert!(md.contains("metrics void"), "{md}");
}

#[cfg(unix)]
#[test]
fn outputs_that_are_not_files_are_streamed_or_refused() {
    use std::os::unix::fs::{FileTypeExt, symlink};
    let c = Case::new("streams");
    // `-`: the JSON report alone on stdout (the table goes to stderr).
    let out = run_limited(
        &c.eval_args("model.onnx", &["--report", "-"]),
        &c.dir.join("cache"),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON");
    assert!(v["rows"].is_array());
    assert!(String::from_utf8_lossy(&out.stderr).contains("| engine |"));

    // A link to /dev/null is written through: the link stays a link.
    symlink("/dev/null", c.dir.join("null.md")).expect("symlink");
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--md", &c.p("null.md")]));
    assert_eq!(code, 0, "{err}");
    let m = std::fs::symlink_metadata(c.dir.join("null.md")).expect("meta");
    assert!(m.file_type().is_symlink(), "not replaced by a file");
    assert!(
        std::fs::metadata("/dev/null")
            .expect("null")
            .file_type()
            .is_char_device()
    );

    // A FIFO gets the report as a stream, and stays a FIFO.
    let fifo = c.dir.join("report.fifo");
    if Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let f = fifo.clone();
        let reader = std::thread::spawn(move || std::fs::read_to_string(f).expect("read fifo"));
        std::thread::sleep(Duration::from_millis(200));
        let (code, err) = c.run(&c.eval_args("model.onnx", &["--report", &c.p("report.fifo")]));
        assert_eq!(code, 0, "{err}");
        let text = reader.join().expect("reader");
        assert!(text.contains("\"rows\""), "{text}");
        let m = std::fs::symlink_metadata(&fifo).expect("meta");
        assert!(m.file_type().is_fifo(), "still a FIFO");
    }

    // A link to a file outside the output's folder: refused, the file untouched.
    let elsewhere = common::temp_dir("streams-elsewhere");
    std::fs::write(elsewhere.join("victim.json"), "keep").expect("w");
    symlink(elsewhere.join("victim.json"), c.dir.join("out.json")).expect("symlink");
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--report", &c.p("out.json")]));
    expect_refused(code, &err, &["out.json", "outside the output's folder"]);
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("victim.json")).expect("r"),
        "keep"
    );

    // A link inside the folder: its target is replaced, the link kept.
    std::fs::write(c.dir.join("real.json"), "old").expect("w");
    symlink("real.json", c.dir.join("link.json")).expect("symlink");
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--report", &c.p("link.json")]));
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::symlink_metadata(c.dir.join("link.json"))
            .expect("meta")
            .file_type()
            .is_symlink()
    );
    assert!(json(&c.dir.join("real.json"))["rows"].is_array());

    // A report inside the calibration folder would be read as data next time.
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--report", &c.p("calib/r.json")]));
    expect_refused(code, &err, &["calib", "calibration folder"]);

    // A temporary file a killed run left is cleaned by the next write there.
    let stale = c.dir.join("out/.quantscope-killed.part");
    std::fs::create_dir_all(c.dir.join("out")).expect("mkdir");
    std::fs::write(&stale, "half").expect("w");
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--md", &c.p("out/r.md")]));
    assert_eq!(code, 0, "{err}");
    assert!(!stale.exists(), "the stale .part is gone");
}

/// Moves `fc.w` of `model.onnx` into an external file `location`; `unused` adds an 8 GiB
/// external initializer no node reads.
fn external_model(c: &Case, name: &str, location: &str, unused: bool) -> String {
    c.edited_model(name, |m| {
        let t = init(m, "fc.w");
        t.raw_data.clear();
        t.data_location = Some(pb::tensor_proto::DataLocation::External as i32);
        t.external_data.push(pb::StringStringEntryProto {
            key: "location".into(),
            value: location.into(),
        });
        if unused {
            let mut big = pb::TensorProto {
                name: "never_used".into(),
                dims: vec![1 << 31],
                data_type: pb::tensor_proto::DataType::Float as i32,
                data_location: Some(pb::tensor_proto::DataLocation::External as i32),
                ..Default::default()
            };
            big.external_data.push(pb::StringStringEntryProto {
                key: "location".into(),
                value: "huge.bin".into(),
            });
            graph(m).initializer.push(big);
        }
    })
}

#[cfg(unix)]
#[test]
fn external_data_stays_in_the_models_folder_and_unused_weights_are_not_read() {
    let c = Case::new("external");
    let m = pb::ModelProto::decode(residual_classifier(4).to_bytes(13).as_slice()).expect("decode");
    let fc = m
        .graph
        .as_ref()
        .and_then(|g| g.initializer.iter().find(|t| t.name == "fc.w"))
        .expect("fc.w")
        .raw_data
        .clone();
    std::fs::write(c.dir.join("w.bin"), &fc).expect("w");
    // In the folder, with an unused 8 GiB tensor beside it: runs, the big one never read.
    let file = external_model(&c, "ext.onnx", "w.bin", true);
    let (code, err) = c.run(&c.eval_args(&file, &[]));
    assert_eq!(code, 0, "{err}");
    // `w.bin` a link to a file elsewhere (with the right size): refused.
    let elsewhere = common::temp_dir("external-elsewhere");
    std::fs::write(elsewhere.join("secret"), &fc).expect("w");
    std::os::unix::fs::symlink(elsewhere.join("secret"), c.dir.join("link.bin")).expect("link");
    let file = external_model(&c, "ext_link.onnx", "link.bin", false);
    let (code, err) = c.run(&c.eval_args(&file, &[]));
    expect_refused(code, &err, &["link.bin", "outside the model's folder"]);
}

#[test]
fn misspelt_experiment_fields_are_refused_with_a_suggestion() {
    let c = Case::new("ron-fields");
    let (code, err) = c.run(&c.eval_args("model.onnx", &["--save-experiment", &c.p("good.ron")]));
    assert_eq!(code, 0, "{err}");
    let good = std::fs::read_to_string(c.dir.join("good.ron")).expect("saved");
    let cases: [(&str, String, &[&str]); 3] = [
        (
            "typo.ron",
            good.replacen("precisions:", "precisons:", 1),
            &["typo.ron", "line", "precisons", "did you mean `precisions`"],
        ),
        (
            "nested.ron",
            good.replacen(
                "preprocess: Preprocess(",
                "preprocess: Preprocess(\n        mean: (0.5, 0.5, 0.5),",
                1,
            ),
            &["nested.ron", "unknown field `mean`", "Preprocess"],
        ),
        (
            "per_tensor.ron",
            good.replacen(
                "mixed_precision: None",
                "mixed_precision: Some((keep_float: [], method: Some(max), per_tensor: {\"block.relu9.out\": mse}))",
                1,
            ),
            &["per_tensor", "block.relu9.out", "did you mean"],
        ),
    ];
    for (name, text, wants) in cases {
        assert_ne!(text, good, "{name}: the edit applies");
        std::fs::write(c.dir.join(name), text).expect("w");
        let (code, err) = c.run(&["run".into(), c.p(name)]);
        expect_refused(code, &err, wants);
    }
}

#[test]
fn small_data_problems_are_named_or_skipped() {
    let c = Case::new("small");
    // A labels file saved with a byte-order mark still matches the folders.
    let names: Vec<String> = (0..4).map(|i| format!("class_{i}")).collect();
    std::fs::write(
        c.dir.join("eval/labels.txt"),
        format!("\u{feff}{}\n", names.join("\n")),
    )
    .expect("labels");
    let (code, err) = c.run(&c.eval_args("model.onnx", &[]));
    assert_eq!(code, 0, "a BOM is not part of the first name: {err}");
    // One damaged calibration image: left out and named, the run goes on.
    std::fs::write(c.dir.join("calib/broken.png"), b"\x89PNG not really").expect("w");
    let (code, err) = c.run(&c.eval_args("model.onnx", &[]));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("broken.png") && err.contains("left out"),
        "{err}"
    );
    // The statistics cache is keyed by the files, not the spelling of the folder.
    let out = Command::new(env!("CARGO_BIN_EXE_quantscope"))
        .args(
            c.eval_args("model.onnx", &[])
                .iter()
                .map(|a| a.replace(&format!("{}/", c.dir.display()), "")),
        )
        .current_dir(&c.dir)
        .env("QUANTSCOPE_CACHE", c.dir.join("cache"))
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("calibration pass"),
        "relative paths hit the cache the absolute run filled: {err}"
    );
    // Every evaluation image is a calibration image and "skip calibration images" is on.
    let mut args = c.eval_args("model.onnx", &["--eval-skip-calib"]);
    let i = args.iter().position(|a| a == "--data").expect("--data") + 1;
    args[i] = c.p("calib_as_eval");
    common::image_folder_dataset(&c.dir.join("calib_as_eval"), 4, 1, 16);
    let j = args.iter().position(|a| a == "--calib").expect("--calib") + 1;
    args[j] = c.p("calib_as_eval");
    let (code, err) = c.run(&args);
    expect_refused(
        code,
        &err,
        &["also calibration images", "--eval-skip-calib"],
    );
    // A segmenter given class folders is told what a segmentation folder holds.
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let y = b.conv("seg", "x", 3, 4, 3);
    b.output(&y);
    std::fs::write(c.dir.join("seg.onnx"), b.to_bytes(13)).expect("seg");
    let (code, err) = c.run(&c.eval_args("seg.onnx", &[]));
    expect_refused(code, &err, &["Segmentation", "masks/"]);
    assert!(!err.contains("labels.txt"), "{err}");
}

/// Ctrl-C while the first engine is still being evaluated leaves an earlier report as it was.
#[test]
fn a_run_stopped_before_any_row_leaves_old_outputs_alone() {
    use quantscope::pipeline::{CancelToken, Sink};
    struct StopAtEvaluation(CancelToken);
    impl Sink for StopAtEvaluation {
        fn progress(&self, stage: &str, _: usize, _: usize) {
            if stage.starts_with("evaluating") {
                self.0.cancel();
            }
        }
        fn log(&self, _: &str) {}
    }
    let c = Case::new("stop-early");
    std::fs::write(c.dir.join("old.json"), "a complete earlier report").expect("w");
    let mut e = quantscope::experiment::Experiment {
        model: c.dir.join("model.onnx"),
        ..Default::default()
    };
    e.calibration.dir = Some(c.dir.join("calib"));
    e.evaluation.dir = Some(c.dir.join("eval"));
    e.output.report_json = Some(c.dir.join("old.json"));
    e.bench.min_runs = 1;
    let cancel = CancelToken::default();
    let cache = quantscope::calib::StatsCache {
        dir: c.dir.join("cache"),
    };
    let out = quantscope::pipeline::run_with_cache(
        &e,
        &cache,
        &StopAtEvaluation(cancel.clone()),
        &cancel,
    )
    .expect("runs");
    assert!(out.report.incomplete);
    assert_eq!(out.report.finished_rows(), 0);
    assert_eq!(
        std::fs::read_to_string(c.dir.join("old.json")).expect("r"),
        "a complete earlier report"
    );
}
