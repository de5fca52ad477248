//! The `quantscope` binary end to end on a small model and generated data: a whole `eval`
//! run with its JSON report, `inspect`, the statistics cache, and clear errors on bad input.

mod common;

use std::path::Path;
use std::process::Command;

use quantscope::model::testing::residual_classifier;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_quantscope"))
}

fn setup(name: &str) -> std::path::PathBuf {
    let dir = common::temp_dir(name);
    std::fs::write(dir.join("model.onnx"), residual_classifier(4).to_bytes(13)).expect("model");
    common::image_folder(&dir.join("calib"), 12, 20, 1);
    common::image_folder_dataset(&dir.join("eval"), 4, 5, 20);
    std::fs::write(dir.join("calib/notes.txt"), "not an image").expect("txt");
    dir
}

fn eval_args<'a>(dir: &'a Path, report: &'a str) -> Vec<String> {
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    vec![
        "eval".into(),
        "--model".into(),
        p("model.onnx"),
        "--calib".into(),
        p("calib"),
        "--data".into(),
        p("eval"),
        "--size".into(),
        "16,16".into(),
        "--min-runs".into(),
        "3".into(),
        "--min-time-ms".into(),
        "10".into(),
        "--batch".into(),
        "2".into(),
        "--precisions".into(),
        "fp32,fp16,int8".into(),
        "--report".into(),
        p(report),
        "--md".into(),
        p("report.md"),
        "--export-qdq".into(),
        p("qdq"),
    ]
}

#[test]
fn eval_writes_a_complete_report() {
    let dir = setup("eval");
    let cache = dir.join("cache");
    let out = bin()
        .args(eval_args(&dir, "report.json"))
        .env("QUANTSCOPE_CACHE", &cache)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "eval failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).expect("report"))
            .expect("json");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 6, "fp32, fp16 and four int8 methods");
    let methods: Vec<&str> = rows.iter().filter_map(|r| r["method"].as_str()).collect();
    assert_eq!(methods, ["max", "percentile", "mse", "entropy"]);
    for r in rows {
        assert!(r["error"].is_null(), "row failed: {r}");
        for key in [
            "precision",
            "backend",
            "top1",
            "top5",
            "latency_ms",
            "throughput_ips",
            "memory_bytes",
            "build_ms",
        ] {
            assert!(!r[key].is_null(), "row lacks {key}: {r}");
        }
        assert!(r["latency_ms"]["median"].as_f64().unwrap_or(0.0) > 0.0);
        assert!(r["memory_bytes"]["weights"].as_u64().unwrap_or(0) > 0);
        assert!(
            r["threads"].as_u64().unwrap_or(0) >= 1,
            "the thread count: {r}"
        );
        let layers = r["layer_times"]
            .as_array()
            .expect("per-layer times on the CPU too");
        assert!(
            layers
                .iter()
                .any(|l| l["time_ms"].as_f64().unwrap_or(-1.0) >= 0.0),
            "{layers:?}"
        );
        if r["precision"] != "fp32" {
            let agree = r["agreement"].as_f64().expect("agreement");
            assert!((0.0..=1.0).contains(&agree));
        }
        if r["precision"] == "int8" {
            assert_eq!(r["int8_nodes"].as_u64(), Some(4));
            assert!(
                r["memory_bytes"]["weights"].as_u64() < rows[0]["memory_bytes"]["weights"].as_u64()
            );
        }
    }
    assert_eq!(
        rows[1]["simulated"], true,
        "FP16 on the CPU is labelled simulated"
    );
    assert_eq!(report["evaluation"]["images"], 20);
    assert!(dir.join("qdq/model_int8_entropy.onnx").is_file());
    let cache_file =
        std::fs::read_to_string(dir.join("qdq/model_int8_entropy.cache")).expect("cache");
    assert!(cache_file.starts_with("TRT-") && cache_file.contains("x: "));
    assert!(
        std::fs::read_to_string(dir.join("report.md"))
            .expect("md")
            .contains("| int8 mse |")
    );

    // A second run takes the statistics from the cache.
    let out = bin()
        .args(eval_args(&dir, "report2.json"))
        .env("QUANTSCOPE_CACHE", &cache)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let r2: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report2.json")).expect("report"))
            .expect("json");
    assert_eq!(r2["calibration"]["cache_hit"], true);
    assert_eq!(
        r2["rows"][2]["top1"], report["rows"][2]["top1"],
        "same statistics, same INT8 result"
    );
}

/// Runs the binary with `args` and the folder's statistics cache; asserts exit code 0 and
/// returns what it wrote to stderr.
fn eval_ok(dir: &Path, args: &[String]) -> String {
    let out = bin()
        .args(args)
        .env("QUANTSCOPE_CACHE", dir.join("cache"))
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

/// A short FP32-only run of `model` on the setup's data; (success, stderr, report notes).
fn short_run(dir: &Path, model: &str, extra: &[&str]) -> (bool, String, String) {
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    let out = bin()
        .args([
            "eval",
            "--model",
            &p(model),
            "--data",
            &p("eval"),
            "--size",
            "16,16",
        ])
        .args([
            "--precisions",
            "fp32",
            "--min-runs",
            "1",
            "--min-time-ms",
            "1",
        ])
        .args(["--report", &p("short.json")])
        .args(extra)
        .env("QUANTSCOPE_CACHE", dir.join("cache"))
        .output()
        .expect("runs");
    let notes = std::fs::read_to_string(dir.join("short.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|r| r["notes"].to_string())
        .unwrap_or_default();
    let _ = std::fs::remove_file(dir.join("short.json"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        notes,
    )
}

/// A run says which normalisation it used and where the class order came from, in its output
/// and its report: an assumed normalisation or a wrong class order gives a plausible, wrong score.
#[test]
fn the_run_says_where_its_normalisation_and_class_order_came_from() {
    let dir = setup("assumptions");
    let (ok, err, notes) = short_run(&dir, "model.onnx", &[]);
    assert!(ok, "{err}");
    for text in [&err, &notes] {
        assert!(
            text.contains("input normalisation ASSUMED: ImageNet"),
            "{text}"
        );
        assert!(text.contains("class order: sorted folder names"), "{text}");
    }
    // Flags are taken as given.
    let (ok, err, _) = short_run(&dir, "model.onnx", &["--scale", "1", "--offset", "0"]);
    assert!(
        ok && err.contains("input normalisation: x * 1 + 0"),
        "{err}"
    );

    // The exporter's metadata is read when nothing is given.
    let mut g = residual_classifier(4);
    g.metadata = vec![
        ("image_mean".into(), "0.5, 0.5, 0.5".into()),
        ("image_std".into(), "0.25".into()),
    ];
    std::fs::write(dir.join("meta.onnx"), g.to_bytes(13)).expect("model");
    let (ok, err, notes) = short_run(&dir, "meta.onnx", &[]);
    assert!(ok, "{err}");
    let line = "input normalisation from the model's metadata (image_mean/image_std): (x/255 - mean) / std, mean [0.5, 0.5, 0.5], std [0.25, 0.25, 0.25]";
    assert!(err.contains(line) && notes.contains(line), "{err}");
    let out = bin()
        .arg("inspect")
        .arg(dir.join("meta.onnx"))
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&out.stdout).contains("metadata image_mean/image_std"));

    // --labels defines the order: it is said, and a folder it leaves out is refused.
    std::fs::write(
        dir.join("order.txt"),
        "class_3\nclass_2\nclass_1\nclass_0\n",
    )
    .expect("labels");
    let labels = dir.join("order.txt").to_string_lossy().into_owned();
    let (ok, err, _) = short_run(&dir, "model.onnx", &["--labels", &labels]);
    assert!(
        ok && err.contains("order.txt (folders matched by name"),
        "{err}"
    );
    std::fs::write(dir.join("order.txt"), "class_3\nclass_2\nclass_1\nbird\n").expect("labels");
    let (ok, err, _) = short_run(&dir, "model.onnx", &["--labels", &labels]);
    assert!(
        !ok && err.contains("folder `class_0`") && err.contains("order.txt"),
        "{err}"
    );
}

/// `--weight-rounding gptq` rounds every layer of the model for the INT8 engines (with bias
/// correction on top) and says so, as bias correction says which it kept; the INT8 row is
/// built from it.
#[test]
fn gptq_weight_rounding_runs_end_to_end() {
    let dir = setup("gptq");
    let mut args = eval_args(&dir, "gptq.json");
    args.extend(
        [
            "--weight-rounding",
            "gptq",
            "--bias-correction",
            "--methods",
            "max",
        ]
        .map(String::from),
    );
    let err = eval_ok(&dir, &args);
    assert!(
        err.contains("GPTQ weight rounding: 4 layers rounded"),
        "{err}"
    );
    // Bias correction says which correction it kept and what each would give.
    assert!(
        err.contains("bias correction max: ")
            && err.contains("int8 output SQNR on the")
            && err.contains("per-layer")
            && err.contains("full"),
        "{err}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("gptq.json")).expect("report"))
            .expect("json");
    let rows = report["rows"].as_array().expect("rows");
    let int8 = rows
        .iter()
        .find(|r| r["precision"] == "int8")
        .expect("an int8 row");
    assert!(int8["error"].is_null(), "{int8}");
    assert!(int8["top1"].as_f64().is_some(), "{int8}");
}

/// `eval --budget-top1`: the plan sensitivity finds is built as one more INT8 row, which
/// scores what the search measured for it, carries its budget check in the JSON and Markdown
/// reports, and is saved with its budget in the experiment.
#[test]
fn a_budget_adds_a_checked_mixed_row() {
    let dir = setup("budget");
    let mut args = eval_args(&dir, "budget.json");
    args.extend(
        [
            "--methods",
            "max",
            "--budget-top1",
            "0",
            "--save-experiment",
        ]
        .map(String::from),
    );
    args.push(dir.join("plan.ron").to_string_lossy().into_owned());
    let err = eval_ok(&dir, &args);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("budget.json")).expect("report"))
            .expect("json");
    let rows = report["rows"].as_array().expect("rows");
    let mixed = rows
        .iter()
        .find(|r| !r["budget"].is_null())
        .expect("the plan's row carries its budget check");
    let check = &mixed["budget"];
    let (target, achieved) = (
        check["target"].as_f64().expect("target"),
        check["achieved"].as_f64().expect("achieved"),
    );
    assert_eq!(check["budget"], serde_json::json!({"Top1Points": 0.0}));
    assert_eq!(Some(achieved), mixed["top1"].as_f64());
    let fp32 = rows
        .iter()
        .find(|r| r["precision"] == "fp32")
        .expect("fp32");
    assert_eq!(check["fp32"], fp32["top1"]);
    let met = check["met"].as_bool().expect("met");
    assert_eq!(met, achieved >= target, "{check}");
    // The search's own line gives the same metric and verdict as the row that was built.
    let said = format!(
        "{:.2} %, budget {}",
        achieved * 100.0,
        if met { "met" } else { "not met" }
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("mixed precision: ") && l.contains(&said)),
        "wanted `{said}` in: {err}"
    );
    let md = std::fs::read_to_string(dir.join("report.md")).expect("markdown");
    assert!(
        md.contains(if met {
            "budget met: "
        } else {
            "budget NOT met: "
        }),
        "{md}"
    );
    let plan = std::fs::read_to_string(dir.join("plan.ron")).expect("experiment");
    assert!(plan.contains("budget: Some(Top1Points(0.0))"), "{plan}");
}

/// `--precisions fp8`: an FP8 row (simulated on the CPU, max-calibrated) next to INT8, and
/// `--export` writes the FP8 Q/DQ model with its trtexec line and ONNX Runtime check.
#[test]
fn fp8_runs_end_to_end_and_exports() {
    let dir = setup("fp8");
    let mut args = eval_args(&dir, "fp8.json");
    for a in args.iter_mut() {
        if a == "fp32,fp16,int8" {
            *a = "fp32,int8,fp8".into();
        }
        if a == "--export-qdq" {
            *a = "--export".into();
        }
    }
    args.extend(["--methods", "mse"].map(String::from));
    eval_ok(&dir, &args);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("fp8.json")).expect("report"))
            .expect("json");
    let rows = report["rows"].as_array().expect("rows");
    let fp8 = rows
        .iter()
        .find(|r| r["precision"] == "fp8")
        .expect("an fp8 row");
    assert!(fp8["error"].is_null(), "{fp8}");
    assert_eq!(fp8["method"], "max", "FP8 scales come from max calibration");
    assert_eq!(fp8["simulated"], true, "{fp8}");
    assert_eq!(fp8["int8_nodes"], 4, "{fp8}");
    assert!(fp8["sqnr_db"].as_f64().is_some_and(|s| s > 10.0), "{fp8}");
    let file = dir.join("qdq/model_fp8_max.onnx");
    assert!(file.exists(), "{} written", file.display());
    let exports = report["exports"].as_array().expect("exports");
    let e = exports
        .iter()
        .find(|e| e["kind"] == "fp8")
        .expect("an fp8 export");
    assert!(
        e["trtexec"]
            .as_str()
            .is_some_and(|t| t.contains("--stronglyTyped")),
        "{e}"
    );
    assert!(
        e["cache"].is_null(),
        "TensorRT reads FP8 from Q/DQ only: {e}"
    );
    if common::onnxruntime_available() {
        let c = &e["ort_check"];
        assert_eq!(c["within"], true, "{e}");
        // ONNX Runtime's own FP8 kernels reproduce the CPU's simulation far more closely than
        // either reproduces FP32: an independent check of the simulation.
        let (agree, own) = (
            c["sqnr_db"].as_f64().unwrap_or(f64::INFINITY),
            c["quantized_sqnr_db"].as_f64().expect("FP8 against FP32"),
        );
        assert!(agree > own + 6.0, "{c}");
    }
    // Every quantized layer's rounding in both formats, and the note that sums it up: FP8
    // rounds coarser than int8 on the weights of every layer.
    let rounding = report["fp8_rounding"].as_array().expect("fp8_rounding");
    assert_eq!(rounding.len(), 4, "{rounding:?}");
    for l in rounding {
        let (i8db, f8db) = (
            l["weights_int8_db"].as_f64().expect("int8 weights"),
            l["weights_fp8_db"].as_f64().expect("fp8 weights"),
        );
        assert!(f8db < i8db, "{l}");
        assert!(l["input_fp8_db"].as_f64().is_some(), "{l}");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).expect("markdown");
    assert!(md.contains("| fp8 max |"), "{md}");
    assert!(md.contains("FP8 E4M3 keeps 3 mantissa bits"), "{md}");
}

#[test]
fn inspect_prints_the_model() {
    let dir = setup("inspect");
    let out = bin()
        .args(["inspect", "--json"])
        .arg(dir.join("model.onnx"))
        .output()
        .expect("runs");
    assert!(out.status.success());
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(info["task"], "classification");
    assert_eq!(info["op_census"]["Conv"], 3);
    assert_eq!(info["batch_norms_folded"], 1);
    assert!(info["params"].as_u64().unwrap_or(0) > 1000);
}

#[test]
fn bad_inputs_give_errors_that_name_the_file() {
    let dir = setup("bad");
    let junk = dir.join("junk.onnx");
    std::fs::write(&junk, b"this is not protobuf at all \xff\xff\xff").expect("junk");
    let truncated = dir.join("truncated.onnx");
    let bytes = std::fs::read(dir.join("model.onnx")).expect("model");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("truncated");
    for f in [&junk, &truncated, &dir.join("missing.onnx")] {
        let out = bin().arg("inspect").arg(f).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(f.file_name().and_then(|n| n.to_str()).unwrap_or("?")),
            "error names the file: {err}"
        );
        assert!(!err.contains("panicked"), "no panic: {err}");
    }
    // An empty calibration folder.
    std::fs::create_dir_all(dir.join("empty")).expect("dir");
    let mut args = eval_args(&dir, "r.json");
    args[4] = dir.join("empty").to_string_lossy().into_owned();
    let out = bin().args(&args).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no images found") && err.contains("empty"),
        "{err}"
    );
    // A CUDA request on a machine without a GPU: a clear error, not a crash.
    let mut args = eval_args(&dir, "r.json");
    args.extend(["--backend".into(), "cuda".into()]);
    let out = bin().args(&args).output().expect("runs");
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cuda") && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_batch_the_model_cannot_run_is_explained_once() {
    use quantscope::model::{proto, testing::GraphBuilder};
    let dir = setup("batch");
    // A constant concatenated along channels pins the batch at 1, as in many exports.
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let c = b.conv("c1", "x", 3, 4, 3);
    b.graph.initializer.push(proto::f32_tensor(
        "pinned",
        &[1, 4, 16, 16],
        &vec![0.5; 4 * 16 * 16],
    ));
    let cat = "cat.out".to_string();
    b.graph.node.push(proto::node(
        "Concat",
        "cat",
        &[&c, "pinned"],
        &[&cat],
        vec![proto::int_attr("axis", 1)],
    ));
    let y = b.head(&cat, 8, 4);
    b.output(&y);
    std::fs::write(dir.join("pinned.onnx"), b.to_bytes(13)).expect("model");
    let mut args = eval_args(&dir, "batch.json");
    args[2] = dir.join("pinned.onnx").to_string_lossy().into_owned();
    let i = args.iter().position(|a| a == "--batch").expect("batch");
    args[i + 1] = "8".into();
    let err = eval_ok(&dir, &args);
    assert_eq!(
        err.matches("no engine at batch 8").count(),
        1,
        "one explanation, not one error per engine: {err}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("batch.json")).expect("report"))
            .expect("json");
    assert!(report["notes"].as_array().is_some_and(|n| {
        n.iter()
            .any(|n| n.as_str().unwrap_or("").contains("batch 1 only"))
    }));
    assert!(
        report["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .all(|r| r["error"].is_null())
    );
}

/// `--cpu-engine`: `ort` without a usable library is exit 2 naming the library and the fix,
/// never a silent fallback; `auto` falls back to tract and the report says so; `tract` runs
/// without ONNX Runtime. A file that is not ONNX Runtime is refused at load with its path.
#[test]
fn cpu_engine_choice_and_a_missing_or_wrong_library() {
    let dir = setup("cpu_engine");
    let args = |report: &str, engine: &str| {
        let mut a = eval_args(&dir, report);
        a.truncate(a.len() - 4); // no --md / --export-qdq
        for v in a.iter_mut().filter(|v| *v == "fp32,fp16,int8") {
            *v = "fp32".into();
        }
        a.extend(["--cpu-engine".into(), engine.into()]);
        a
    };
    let missing = dir.join("nowhere/libonnxruntime.so.1.32.0");
    let fake = dir.join("libonnxruntime.so.9.9.9");
    std::fs::write(&fake, b"not a shared library").expect("fake library");
    for lib in [&missing, &fake] {
        let out = bin()
            .args(args("ort.json", "ort"))
            .env("ORT_DYLIB_PATH", lib)
            .env("QUANTSCOPE_CACHE", dir.join("cache"))
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&*lib.to_string_lossy()),
            "names the library: {err}"
        );
        assert!(
            err.contains("--cpu-engine tract"),
            "says what runs instead: {err}"
        );
        assert!(
            !dir.join("ort.json").exists(),
            "no report from a refused run"
        );
    }
    // A real shared library that is not ONNX Runtime.
    if let Some(libm) = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    {
        let out = bin()
            .args(args("ort.json", "ort"))
            .env("ORT_DYLIB_PATH", libm)
            .env("QUANTSCOPE_CACHE", dir.join("cache"))
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("not an ONNX Runtime library"), "{err}");
    }
    for (engine, report) in [("auto", "auto.json"), ("tract", "tract.json")] {
        let out = bin()
            .args(args(report, engine))
            .env("ORT_DYLIB_PATH", &missing)
            .env("QUANTSCOPE_CACHE", dir.join("cache"))
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{engine}: {err}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(report)).expect("report"))
                .expect("json");
        assert_eq!(json["cpu_engine"]["name"], "tract", "{engine}");
        assert!(
            err.contains("CPU engine: tract"),
            "{engine}: the header says so: {err}"
        );
        if engine == "auto" {
            let note = json["cpu_engine"]["note"].as_str().unwrap_or_default();
            assert!(note.contains("pip install onnxruntime"), "{note}");
        }
    }
}

/// The bundled classifier's report carries the classifier inspection: each engine's confusion
/// matrix in the JSON, FP32's matrix and what INT8 moves in the Markdown, the gallery of flipped
/// images in both, and the two CSV files.
#[test]
fn the_bundled_classifier_report_has_its_confusion_matrices_and_gallery() {
    let dir = common::temp_dir("classes");
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models");
    let abs = |s: &str| format!("{:?}", samples.join(s).to_string_lossy());
    // The sample experiment, narrowed to FP32 and the entropy engine (the one that flips most
    // images on this model) and a short timing, with its paths made absolute.
    let ron = std::fs::read_to_string(samples.join("fashion_resnet.ron"))
        .expect("sample experiment")
        .replace("\"fashion_resnet.onnx\"", &abs("fashion_resnet.onnx"))
        .replace("\"data/fashion_calib\"", &abs("data/fashion_calib"))
        .replace("\"data/fashion_eval\"", &abs("data/fashion_eval"))
        .replace(
            "\"fashion_resnet.labels.txt\"",
            &abs("fashion_resnet.labels.txt"),
        )
        .replace("[max, percentile, mse, entropy]", "[entropy]")
        .replace("[fp32, fp16, int8]", "[fp32, int8]")
        .replace(
            "(warmup_runs: 5, min_runs: 20, min_time_ms: 500.0, batch: 8)",
            "(warmup_runs: 1, min_runs: 2, min_time_ms: 1.0, batch: 1)",
        );
    let exp = dir.join("fashion.ron");
    std::fs::write(&exp, ron).expect("experiment");
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    eval_ok(
        &dir,
        &[
            "run".into(),
            p("fashion.ron"),
            "--report".into(),
            p("r.json"),
            "--md".into(),
            p("r.md"),
            "--confusion-csv".into(),
            p("confusion.csv"),
            "--gallery-csv".into(),
            p("gallery.csv"),
        ],
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("r.json")).expect("json")).expect("json");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    for r in rows {
        let c = &r["confusion"];
        assert_eq!(c["classes"], 10, "{c}");
        let images: u64 = c["cells"]
            .as_array()
            .expect("cells")
            .iter()
            .map(|cell| cell[2].as_u64().expect("count"))
            .sum();
        assert_eq!(images, 1000, "every evaluation image counted once");
    }
    let gallery = report["gallery"].as_array().expect("gallery");
    assert!(
        !gallery.is_empty(),
        "INT8 entropy flips images on this model"
    );
    let g = &gallery[0];
    assert_eq!(g["tops"].as_array().map(Vec::len), Some(2), "{g}");
    assert_eq!(g["tops"][0]["top"].as_array().map(Vec::len), Some(3), "{g}");
    let md = std::fs::read_to_string(dir.join("r.md")).expect("markdown");
    for needle in [
        "## Confusion matrix, FP32",
        "| true \\ predicted | tshirt_top | trouser |",
        "## int8 entropy minus FP32",
        "## Images that flipped against FP32",
        "### int8 entropy: ",
    ] {
        assert!(md.contains(needle), "{needle} missing from\n{md}");
    }
    let csv = std::fs::read_to_string(dir.join("confusion.csv")).expect("csv");
    assert!(
        csv.starts_with("engine,true_class,true_name,predicted_class"),
        "{csv}"
    );
    assert!(csv.contains("\"int8 entropy\",4,\"coat\","), "{csv}");
    let lines = std::fs::read_to_string(dir.join("gallery.csv")).expect("csv");
    assert!(
        lines
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("\"int8 entropy\",lost,")),
        "{lines}"
    );
}
