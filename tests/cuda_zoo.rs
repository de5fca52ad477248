//! The zoo check: every ONNX model in `$QUANTSCOPE_ZOO` (everyday torchvision / timm
//! architectures exported by `tools/zoo.py`, random weights) built by the CUDA backend in FP32,
//! FP16 and INT8 and compared with the CPU backend on the same random input. Prints one line
//! per model, then fails if any model did not build or disagreed beyond the criteria:
//! - no engine's output is NaN or Inf (FP16 engines get the overflow guard's list, measured
//!   on 4 random inputs, as a run measures it on calibration images);
//! - FP32: max relative error 1e-3 against the CPU FP32 engine;
//! - FP16: SQNR against the CPU's FP32 within 6 dB of the CPU FP16 numerics' own SQNR (both
//!   round the same FP16 storage; a GPU engine far below it computes something else). The CPU
//!   FP16 numerics are tract's where it loads the model (each layer's output rounded once),
//!   as the CPU backend's FP16 rows are;
//! - INT8: within 0.1 max relative error of the CPU INT8 engine built from the same Q/DQ model,
//!   or, where quantization itself moves the output more (deep random-weight nets amplify
//!   one-step rounding differences), within the CPU INT8 engine's own distance from FP32.
//!
//! `QUANTSCOPE_ZOO_JSON=FILE` writes one record per model, backend and precision (built or
//! why not, build seconds, SQNR and argmax agreement against that backend's FP32, median
//! latency), the file `bench/results/` keeps. `QUANTSCOPE_ZOO_DIAGNOSE=1` follows a failing
//! FP16 engine down: rebuilt with each conv implementation left out in turn
//! (QUANTSCOPE_CUDA_AVOID), and cut at evenly spaced tensors. Skips, saying why, without a
//! GPU or without the zoo variable; the zoo is not part of the repository.

use std::path::{Path, PathBuf};
use std::time::Instant;

mod common;

use common::cuda::{argmaxes, gpu, input_for, max_qdq, rel_err};

use quantscope::backend::cpu::CpuBackend;
use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildInput, BuildSpec, Engine, Output, Precision};
use quantscope::fp16_guard::{self, KeptFp32};
use quantscope::model::{Model, proto};

/// FP16 on the GPU may sit this far below the CPU's FP16 numerics (SQNR dB against FP32).
const FP16_MARGIN_DB: f64 = 6.0;

/// SQNR of `test` against `reference`, dB (infinite where they are equal).
fn sqnr_db(test: &[f32], reference: &[f32]) -> f64 {
    let (mut s, mut n) = (0f64, 0f64);
    for (&t, &r) in test.iter().zip(reference) {
        s += (r as f64).powi(2);
        n += (t as f64 - r as f64).powi(2);
    }
    if n == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (s / n).log10()
    }
}

fn non_finite(d: &[f32]) -> usize {
    d.iter().filter(|v| !v.is_finite()).count()
}

fn agreement(a: &Output, b: &Output) -> f64 {
    let (x, y) = (argmaxes(&a.shape, &a.data), argmaxes(&b.shape, &b.data));
    x.iter().zip(&y).filter(|(p, q)| p == q).count() as f64 / x.len().max(1) as f64
}

/// One engine of the zoo: built (with its output on the test input and median latency) or why
/// not.
struct Built {
    out: Output,
    build_s: f64,
    latency_ms: f64,
    info: quantscope::backend::EngineInfo,
}

fn build_and_run(
    backend: &dyn Backend,
    input: BuildInput<'_>,
    spec: BuildSpec,
    x: &[f32],
    runs: usize,
) -> Result<Built, String> {
    let t = Instant::now();
    let mut e: Box<dyn Engine> = backend.build(input, spec).map_err(|e| e.to_string())?;
    let build_s = t.elapsed().as_secs_f64();
    let out = e.run(x).map_err(|e| e.to_string())?;
    let mut times = vec![];
    for _ in 0..runs {
        let t = Instant::now();
        e.run(x).map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(Built {
        out,
        build_s,
        latency_ms: times.get(times.len() / 2).copied().unwrap_or(f64::NAN),
        info: e.info().clone(),
    })
}

/// A JSON record for the results file.
fn record(
    model: &str,
    backend: &str,
    p: Precision,
    r: &Result<Built, String>,
    fp32: Option<&Output>,
) -> serde_json::Value {
    match r {
        Ok(b) => serde_json::json!({
            "model": model, "backend": backend, "precision": p.name(), "built": true,
            "build_s": b.build_s, "latency_ms": b.latency_ms,
            "non_finite": non_finite(&b.out.data),
            "sqnr_db_vs_fp32": fp32.map(|f| sqnr_db(&b.out.data, &f.data)).filter(|v| v.is_finite()),
            "agreement_vs_fp32": fp32.map(|f| agreement(&b.out, f)),
            "fp32_layers": b.info.fp32_layers.iter().map(|k| k.node.clone()).collect::<Vec<_>>(),
        }),
        Err(e) => serde_json::json!({
            "model": model, "backend": backend, "precision": p.name(), "built": false, "why": e,
        }),
    }
}

/// The overflow guard's list for `m`, from 4 random inputs (seeds 100..104).
fn guard_of(m: &Model, hw: [usize; 2]) -> Result<Vec<KeptFp32>, String> {
    let inputs = (0..4).map(|k| Ok(input_for(m, 1, hw, 100 + k)));
    let peaks = quantscope::pipeline::tensor_peaks(m, hw, inputs)?;
    let shapes = quantscope::model::infer_shapes(m, hw).ok();
    Ok(fp16_guard::keep_fp32(&m.proto, &peaks, shapes.as_ref()))
}

fn float<'a>(m: &'a Model, p: Precision, keep: &'a [KeptFp32]) -> BuildInput<'a> {
    BuildInput::Float {
        model: m,
        precision: p,
        keep_fp32: keep,
    }
}

fn check_model(
    g: &CudaBackend,
    path: &Path,
    records: &mut Vec<serde_json::Value>,
) -> Result<Vec<String>, String> {
    let name = path
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let m = Model::load(path).map_err(|e| format!("load: {e:#}"))?;
    let hw = m.input_hw(None).unwrap_or([224, 224]);
    let spec = BuildSpec { batch: 1, hw };
    let x = input_for(&m, 1, hw, 7);
    let guard = guard_of(&m, hw).map_err(|e| format!("ranges: {e}"))?;
    let cpu = CpuBackend;
    let (cpu_runs, gpu_runs) = (5, 50);
    fn ok(r: &Result<Built, String>) -> Option<&Output> {
        r.as_ref().ok().map(|b| &b.out)
    }
    let cpu32 = build_and_run(&cpu, float(&m, Precision::Fp32, &[]), spec, &x, cpu_runs);
    let cpu16 = build_and_run(&cpu, float(&m, Precision::Fp16, &guard), spec, &x, 0);
    let gpu32 = build_and_run(g, float(&m, Precision::Fp32, &[]), spec, &x, gpu_runs);
    let gpu16 = build_and_run(g, float(&m, Precision::Fp16, &guard), spec, &x, gpu_runs);
    let qdq = max_qdq(&m, hw, 2);
    let (cpu8, gpu8) = match &qdq {
        Ok(q) => {
            let q8 = |keep| BuildInput::Quantized {
                model: &m,
                qdq: q,
                keep_fp32: keep,
            };
            (
                build_and_run(&cpu, q8(&[]), spec, &x, 0),
                build_and_run(g, q8(&guard), spec, &x, gpu_runs),
            )
        }
        Err(e) => (
            Err(format!("calibration: {e}")),
            Err(format!("calibration: {e}")),
        ),
    };
    for (backend, p, r, fp32) in [
        ("cpu", Precision::Fp32, &cpu32, None),
        ("cpu", Precision::Fp16, &cpu16, ok(&cpu32)),
        ("cpu", Precision::Int8, &cpu8, ok(&cpu32)),
        ("cuda", Precision::Fp32, &gpu32, None),
        ("cuda", Precision::Fp16, &gpu16, ok(&gpu32)),
        ("cuda", Precision::Int8, &gpu8, ok(&gpu32)),
    ] {
        records.push(record(&name, backend, p, r, fp32));
    }

    let cpu32 = cpu32.map_err(|e| format!("cpu fp32: {e}"))?;
    // A random-weight model whose activations died out (logits around 1e-9) makes every
    // relative comparison below meaningless: say so rather than report a 100 % error.
    let top = cpu32.out.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    if top < 1e-6 {
        return Err(format!(
            "its FP32 output is {top:.1e} at most: the random weights collapse it, so nothing \
             can be compared (export with tools/zoo.py, which recalibrates BatchNorm)"
        ));
    }
    let mut lines = vec![];
    let mut bad = vec![];
    if !guard.is_empty() {
        lines.push(format!(
            "overflow guard keeps {} layers in FP32",
            guard.len()
        ));
    }
    for (what, r) in [
        ("cpu fp16", &cpu16),
        ("cpu int8", &cpu8),
        ("cuda fp32", &gpu32),
        ("cuda fp16", &gpu16),
        ("cuda int8", &gpu8),
    ] {
        match r {
            Ok(b) if non_finite(&b.out.data) > 0 => bad.push(format!(
                "{what}: {} of {} values are not finite",
                non_finite(&b.out.data),
                b.out.data.len()
            )),
            Ok(_) => {}
            Err(e) => bad.push(format!("{what}: {e}")),
        }
    }
    if let Ok(b) = &gpu32 {
        let e = rel_err(&b.out.data, &cpu32.out.data);
        lines.push(format!("fp32 max rel err {e:.2e}"));
        if !(e <= 1e-3) {
            bad.push(format!("fp32 max rel err {e:.2e} (tol 1e-3)"));
        }
    }
    if let (Ok(c16), Ok(g16)) = (&cpu16, &gpu16) {
        let (c, gq) = (
            sqnr_db(&c16.out.data, &cpu32.out.data),
            sqnr_db(&g16.out.data, &cpu32.out.data),
        );
        lines.push(format!(
            "fp16 SQNR vs fp32: cuda {gq:.1} dB, cpu numerics {c:.1} dB"
        ));
        if !(gq >= c - FP16_MARGIN_DB) {
            bad.push(format!(
                "cuda fp16 SQNR {gq:.1} dB, more than {FP16_MARGIN_DB} dB below the cpu's {c:.1} dB"
            ));
        }
    }
    if let (Ok(c8), Ok(g8)) = (&cpu8, &gpu8) {
        let e = rel_err(&g8.out.data, &c8.out.data);
        // What quantization itself moves the output by: two engines of one int8 plan
        // differ by a few last-step roundings per layer, which must stay below that.
        let q = rel_err(&c8.out.data, &cpu32.out.data);
        // How close each INT8 engine is to FP32, so that a failure says whether the GPU's is
        // further from it than the CPU's or merely elsewhere.
        let (gs, cs) = (
            sqnr_db(&g8.out.data, &cpu32.out.data),
            sqnr_db(&c8.out.data, &cpu32.out.data),
        );
        lines.push(format!(
            "int8 argmax agreement with cpu int8 {:.1} %, max rel err {e:.2e} (cpu int8 vs fp32 {q:.2e}), SQNR vs fp32: cuda {gs:.1} dB, cpu {cs:.1} dB, {} int8 / {} float nodes",
            agreement(&g8.out, &c8.out) * 100.0,
            g8.info.int8_nodes,
            g8.info.float_nodes.len()
        ));
        if e > 0.1 && e > q {
            bad.push(format!(
                "int8 max rel err {e:.2e}, more than quantization's own {q:.2e}"
            ));
        }
    }
    if let (Ok(g8), Ok(g16)) = (&gpu8, &gpu16) {
        lines.push(format!(
            "cuda latency batch 1: fp16 {:.3} ms, int8 {:.3} ms (int8 / fp16 {:.2})",
            g16.latency_ms,
            g8.latency_ms,
            g8.latency_ms / g16.latency_ms
        ));
    }
    if std::env::var_os("QUANTSCOPE_ZOO_DIAGNOSE").is_some()
        && bad.iter().any(|b| b.starts_with("cuda fp16"))
    {
        diagnose_fp16(g, &m, spec, &x, &guard, &cpu32.out);
    }
    if bad.is_empty() {
        Ok(lines)
    } else {
        Err(format!("{}; {}", bad.join("; "), lines.join("; ")))
    }
}

/// Follows a wrong FP16 engine down: each conv implementation left out in turn, then the
/// model cut at evenly spaced tensors (GPU FP16 and CPU FP16 numerics against CPU FP32).
fn diagnose_fp16(
    g: &CudaBackend,
    m: &Model,
    spec: BuildSpec,
    x: &[f32],
    guard: &[KeptFp32],
    cpu32: &Output,
) {
    // SAFETY (every set_var here): the zoo test runs alone (--test-threads=1 in
    // tools/gpu_check.sh). Each build below chooses afresh.
    unsafe { std::env::set_var("QUANTSCOPE_CUDA_CACHE", "off") };
    let fp16 = |what: &str| match build_and_run(g, float(m, Precision::Fp16, guard), spec, x, 0) {
        Ok(b) => eprintln!(
            "  diagnose: {what:<24} cuda fp16 SQNR {:.1} dB",
            sqnr_db(&b.out.data, &cpu32.data)
        ),
        Err(e) => eprintln!("  diagnose: {what}: {e}"),
    };
    for k in 1..=2 {
        fp16(&format!("fresh build {k}"));
    }
    unsafe { std::env::set_var("QUANTSCOPE_CUDA_AUX_STREAMS", "3") };
    for k in 1..=3 {
        fp16(&format!("3 aux streams, {k}"));
    }
    unsafe { std::env::remove_var("QUANTSCOPE_CUDA_AUX_STREAMS") };
    for avoid in [
        "gemm:", "gemmf", "cudnn:", "cudnng", "dw", "pw", "direct", "f16+",
    ] {
        unsafe { std::env::set_var("QUANTSCOPE_CUDA_AVOID", avoid) };
        fp16(&format!("without {avoid}"));
        unsafe { std::env::remove_var("QUANTSCOPE_CUDA_AVOID") };
    }
    let tensors = fp16_guard::measured_tensors(&m.proto);
    let cuts = 6.min(tensors.len());
    for k in 1..=cuts {
        let t = &tensors[k * (tensors.len() - 1) / cuts];
        let mut proto = m.proto.clone();
        let gp = proto.graph.as_mut().expect("graph");
        gp.output = vec![proto::float_value_info(t, None)];
        let cut = Model { proto, ..m.clone() };
        let producer = m
            .proto
            .graph
            .as_ref()
            .and_then(|g| g.node.iter().find(|n| n.output.contains(t)))
            .map(|n| format!("{} {}", n.op_type, n.name))
            .unwrap_or_default();
        let run = |b: &dyn Backend, p| build_and_run(b, float(&cut, p, guard), spec, x, 0);
        match (
            run(&CpuBackend, Precision::Fp32),
            run(&CpuBackend, Precision::Fp16),
            run(g, Precision::Fp16),
        ) {
            (Ok(c32), Ok(c16), Ok(g16)) => eprintln!(
                "  diagnose: cut at `{t}` ({producer}): cuda fp16 {:.1} dB, cpu fp16 {:.1} dB",
                sqnr_db(&g16.out.data, &c32.out.data),
                sqnr_db(&c16.out.data, &c32.out.data)
            ),
            (a, b, c) => eprintln!(
                "  diagnose: cut at `{t}` ({producer}): {:?} / {:?} / {:?}",
                a.err(),
                b.err(),
                c.err()
            ),
        }
    }
    unsafe { std::env::remove_var("QUANTSCOPE_CUDA_CACHE") };
}

#[test]
fn zoo_builds_and_matches_cpu_in_every_precision() {
    let Some(g) = gpu() else { return };
    let Some(dir) = std::env::var_os("QUANTSCOPE_ZOO") else {
        eprintln!("skipped: set QUANTSCOPE_ZOO to a folder of ONNX models (tools/zoo.py)");
        return;
    };
    let only = std::env::var("QUANTSCOPE_ZOO_ONLY").ok();
    let mut models: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("zoo folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .filter(|p| {
            only.as_deref().is_none_or(|o| {
                o.split(',')
                    .any(|n| p.file_stem().is_some_and(|s| s.to_string_lossy() == n))
            })
        })
        .collect();
    models.sort();
    let mut failed = vec![];
    let mut records = vec![];
    for p in &models {
        let name = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let t = Instant::now();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_model(&g, p, &mut records)
        })) {
            Ok(Ok(lines)) => eprintln!(
                "zoo {name:<32} ok ({:.1} s): {}",
                t.elapsed().as_secs_f64(),
                lines.join("; ")
            ),
            Ok(Err(e)) => {
                eprintln!("zoo {name:<32} FAILED: {e}");
                failed.push(name);
            }
            Err(_) => {
                eprintln!("zoo {name:<32} FAILED: panicked");
                failed.push(name);
            }
        }
    }
    eprintln!(
        "zoo: {} of {} models pass",
        models.len() - failed.len(),
        models.len()
    );
    if let Some(file) = std::env::var_os("QUANTSCOPE_ZOO_JSON") {
        let doc = serde_json::json!({
            "device": g.check().unwrap_or_default(),
            "quantscope": env!("CARGO_PKG_VERSION"),
            "records": records,
        });
        std::fs::write(&file, serde_json::to_string_pretty(&doc).expect("json"))
            .expect("write the zoo results");
        eprintln!("zoo: results in {}", Path::new(&file).display());
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}
