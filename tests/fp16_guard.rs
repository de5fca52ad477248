//! FP16 that cannot overflow (the CPU's FP16 numerics; the CUDA side is in cuda_backend): a
//! classifier with a Gram-matrix layer, the `Kᵀ·V` of linear attention, whose sums pass
//! FP16's largest value. Without the overflow guard its FP16 output is NaN/Inf (tract's FP16
//! numerics); with it the FP16 row is finite and close to FP32 on both CPU engines, the layers
//! kept in FP32 are named with why, and the strongly typed FP16 export keeps the same layers
//! in FP32.

mod common;

use std::path::{Path, PathBuf};

use quantscope::backend::cpu::{CpuBackend, CpuEngineChoice};
use quantscope::backend::{Backend, BuildInput, BuildSpec, Precision};
use quantscope::calib::StatsCache;
use quantscope::data::Selection;
use quantscope::experiment::Experiment;
use quantscope::fp16_guard;
use quantscope::model::Model;
use quantscope::model::proto;
use quantscope::model::testing;
use quantscope::pipeline::{self, CancelToken, Sink};

struct Quiet;
impl Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

const CLASSES: usize = 3;
const HW: usize = 32;

/// The overflowing classifier of `model::testing`, written to `dir`.
fn gram_classifier(dir: &Path) -> PathBuf {
    let path = dir.join("gram.onnx");
    std::fs::write(
        &path,
        testing::gram_classifier(CLASSES, HW, 100.0).to_bytes(13),
    )
    .expect("write model");
    path
}

fn experiment(dir: &Path, engine: CpuEngineChoice) -> Experiment {
    let data = dir.join("data");
    common::image_folder_dataset(&data, CLASSES, 3, HW as u32);
    let mut exp = Experiment {
        model: gram_classifier(dir),
        precisions: vec![Precision::Fp32, Precision::Fp16],
        cpu_engine: engine,
        ..Default::default()
    };
    exp.calibration.dir = Some(data.clone());
    exp.calibration.select = Selection::First(6);
    exp.evaluation.dir = Some(data);
    exp.bench.min_runs = 1;
    exp.bench.min_time_ms = 0.0;
    exp.bench.warmup_runs = 0;
    exp.bench.batch = 1;
    exp.output.qdq_dir = Some(dir.join("exports"));
    exp.output.export_precisions = vec![quantscope::export::ExportPrecision::Fp16];
    exp
}

fn engines() -> Vec<CpuEngineChoice> {
    let mut e = vec![CpuEngineChoice::Tract];
    if quantscope::backend::cpu::onnxruntime::runtime::runtime().is_ok() {
        e.push(CpuEngineChoice::Ort);
    } else {
        eprintln!("ONNX Runtime not found: the tract engine only");
    }
    e
}

#[test]
fn the_fp16_row_stays_finite_and_names_what_it_kept() {
    for engine in engines() {
        let dir = common::temp_dir(&format!("fp16-guard-{engine:?}"));
        let exp = experiment(&dir, engine);
        let cache = StatsCache {
            dir: dir.join("cache"),
        };
        let out =
            pipeline::run_with_cache(&exp, &cache, &Quiet, &CancelToken::default()).expect("run");
        let r = &out.report;
        let fp16 = r
            .rows
            .iter()
            .find(|r| r.precision == Some(Precision::Fp16))
            .expect("fp16 row");
        assert!(fp16.error.is_none(), "{engine:?}: {:?}", fp16.error);
        assert!(
            fp16.non_finite.is_none(),
            "{engine:?}: FP16 overflowed: {:?}",
            fp16.non_finite
        );
        let sqnr = fp16.sqnr_db.expect("sqnr");
        assert!(sqnr > 30.0, "{engine:?}: FP16 SQNR {sqnr:.1} dB");
        let kept: Vec<&str> = fp16.fp32_layers.iter().map(|k| k.node.as_str()).collect();
        assert!(kept.contains(&"gram"), "{engine:?}: {kept:?}");
        assert!(
            !kept.contains(&"conv") && !kept.contains(&"relu"),
            "{engine:?}: in range, FP16: {kept:?}"
        );
        assert!(
            r.notes
                .iter()
                .any(|n| n.starts_with("FP16 overflow guard") && n.contains("gram")),
            "{engine:?}: {:?}",
            r.notes
        );
        assert!(fp16.note().contains("kept in FP32 (overflow guard)"));
        // The strongly typed export keeps the same layers in FP32.
        let e = r
            .exports
            .iter()
            .find(|e| e.kind == "fp16")
            .expect("fp16 export");
        let written = Model::load(&e.file).expect("export loads");
        let g = written.proto.graph.as_ref().expect("graph");
        let types = proto::tensor_types(g);
        let gram = g.node.iter().find(|n| n.name == "gram").expect("gram node");
        assert_eq!(
            types.get(&gram.output[0]),
            Some(&1), // ONNX FLOAT
            "{engine:?}: the export computes gram in FP32"
        );
    }
}

#[test]
fn without_the_guard_fp16_overflows_and_with_it_does_not() {
    let dir = common::temp_dir("fp16-guard-engine");
    let m = Model::load(&gram_classifier(&dir)).expect("model");
    let hw = [HW, HW];
    let inputs: Vec<Vec<f32>> = (0..4)
        .map(|s| {
            testing::values(3 * HW * HW, 10 + s)
                .iter()
                .map(|v| v * 2.0)
                .collect()
        })
        .collect();
    let peaks = pipeline::tensor_peaks(&m, hw, inputs.iter().cloned().map(Ok)).expect("peaks");
    assert_eq!(peaks.images, 4);
    let shapes = quantscope::model::infer_shapes(&m, hw).ok();
    let guard = fp16_guard::keep_fp32(&m.proto, &peaks, shapes.as_ref());
    assert!(guard.iter().any(|k| k.node == "gram"), "{guard:?}");
    let spec = BuildSpec { batch: 1, hw };
    for engine in engines() {
        quantscope::backend::cpu::set_engine(engine).expect("engine");
        let run = |keep: &[fp16_guard::KeptFp32]| {
            CpuBackend
                .build(
                    BuildInput::Float {
                        model: &m,
                        precision: Precision::Fp16,
                        keep_fp32: keep,
                    },
                    spec,
                )
                .and_then(|mut e| e.run(&inputs[0]))
                .expect("fp16 engine")
                .data
        };
        // tract's FP16 numerics round every layer's output, as an FP16 engine stores it, and
        // overflow here. ONNX Runtime's CPU provider has no FP16 MatMul: it computes the
        // Gram matrix in FP32 behind casts it then folds away, so it may not.
        let unguarded = run(&[]);
        if engine == CpuEngineChoice::Tract {
            assert!(
                unguarded.iter().any(|v| !v.is_finite()),
                "the test model must overflow FP16 without the guard: {unguarded:?}, peaks {:?}",
                peaks.abs_max
            );
        }
        let out = run(&guard);
        assert!(out.iter().all(|v| v.is_finite()), "{engine:?}: {out:?}");
    }
}
