//! The written Q/DQ model runs in ONNX Runtime (basic graph optimisation: exact Q/DQ
//! arithmetic) and its outputs match quantscope's INT8 engine, which really computes in int8.

mod common;

use quantscope::backend::cpu::{Probe, TractModel};
use quantscope::backend::{BackendKind, BuildInput, BuildSpec, Engine, backend};
use quantscope::calib::{Method, Stats};
use quantscope::model::testing::{residual_classifier, values};
use quantscope::quant;

const SHAPE: [usize; 4] = [1, 3, 16, 16];

fn calibrated(method: Method) -> (quantscope::model::Model, quant::QdqModel) {
    calibrated_model(residual_classifier(10).model(), method)
}

fn calibrated_model(
    model: quantscope::model::Model,
    method: Method,
) -> (quantscope::model::Model, quant::QdqModel) {
    let plan = quant::plan(&model, &[]);
    let probe = Probe::new(&model, [16, 16], &plan.tensors()).expect("probe");
    let mut stats = Stats::new("test".into(), &plan.tensors());
    for i in 0..24 {
        let (_, acts) = probe.run(&values(3 * 16 * 16, 500 + i)).expect("probe run");
        stats.add(&plan.tensors(), &acts);
    }
    let ranges = stats.ranges(method, 99.99);
    let qdq = quant::build_qdq(&model, &plan, Some(&ranges)).expect("qdq");
    (model, qdq)
}

/// The CPU INT8 engine of `qdq`, batch 1 at 16x16.
fn int8_engine(model: &quantscope::model::Model, qdq: &quant::QdqModel) -> Box<dyn Engine> {
    backend(BackendKind::Cpu)
        .build(
            BuildInput::Int8 { model, qdq },
            BuildSpec {
                batch: 1,
                hw: [16, 16],
            },
        )
        .expect("int8 engine")
}

#[test]
fn int8_engine_computes_in_int8_and_matches_the_float_simulation() {
    let (model, qdq) = calibrated(Method::Max);
    let mut engine = int8_engine(&model, &qdq);
    assert_eq!(
        engine.info().int8_nodes,
        4,
        "three convs and the Gemm run on integer kernels"
    );
    let sim = TractModel::new(
        &quantscope::model::Model {
            proto: qdq.proto.clone(),
            ..model.clone()
        }
        .with_fixed_input(1, [16, 16]),
        SHAPE,
        &[],
    )
    .expect("fake-quant simulation");
    for i in 0..8 {
        let x = values(3 * 16 * 16, 900 + i);
        let ours = engine.run(&x).expect("run").data;
        let s = sim.run_all(&x).expect("sim");
        let s = s[0].cast_to::<f32>().expect("f32");
        let s = s
            .try_as_plain_ram()
            .expect("plain")
            .as_slice::<f32>()
            .expect("slice")
            .to_vec();
        let (err, max_ref) = common::max_err(&ours, &s);
        assert!(
            err <= 1e-4 * max_ref.max(1.0),
            "input {i}: INT8 engine vs float simulation max error {err}"
        );
    }
}

#[test]
fn qdq_model_runs_in_onnx_runtime_and_matches_the_int8_engine() {
    if !common::onnxruntime_available() {
        return;
    }
    let dir = common::temp_dir("ort");
    for method in Method::ALL {
        let (model, qdq) = calibrated(method);
        assert_ort_matches(&model, &qdq, &dir, &method.to_string());
    }
}

/// Runs `qdq` in ONNX Runtime (tools/ort_run.py) on four inputs and checks its outputs against
/// quantscope's INT8 engine.
fn assert_ort_matches(
    model: &quantscope::model::Model,
    qdq: &quant::QdqModel,
    dir: &std::path::Path,
    tag: &str,
) {
    let path = dir.join(format!("qdq_{tag}.onnx"));
    qdq.save(&path).expect("save qdq");
    let mut engine = int8_engine(model, qdq);
    for i in 0..4 {
        let x = values(3 * 16 * 16, 700 + i);
        let (inp, out) = (dir.join("in.f32"), dir.join("out.f32"));
        common::write_f32(&inp, &x);
        let status = std::process::Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/ort_run.py"))
            .args([
                path.to_str().unwrap_or_default(),
                inp.to_str().unwrap_or_default(),
                "1,3,16,16",
                out.to_str().unwrap_or_default(),
            ])
            .output()
            .expect("python3 runs");
        assert!(
            status.status.success(),
            "ONNX Runtime failed on {}: {}",
            path.display(),
            String::from_utf8_lossy(&status.stderr)
        );
        let ort = common::read_f32(&out);
        let ours = engine.run(&x).expect("run").data;
        assert_eq!(ort.len(), ours.len());
        let (err, max_ref) = common::max_err(&ours, &ort);
        assert!(
            err <= 1e-4 * max_ref.max(1.0),
            "{tag} input {i}: INT8 engine vs ONNX Runtime max error {err}"
        );
    }
}

/// A near-dead output channel (weights around 1e-14, as trained models have) with a real
/// bias: its weight scale is floored so that ONNX Runtime's int32 bias (made even at basic
/// graph optimisation) holds the bias. Without the floor the bias saturated int32 and that
/// channel's output was off by the whole bias (seen on DeepLabV3-MobileNetV2's first conv).
#[test]
fn a_near_dead_channel_keeps_its_bias_in_onnx_runtime() {
    if !common::onnxruntime_available() {
        return;
    }
    let mut b = residual_classifier(10);
    // Initializers are raw little-endian f32; output channel 0 comes first.
    let edit = |raw: &mut Vec<u8>, f: &dyn Fn(&mut [f32])| {
        let mut v: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        f(&mut v);
        *raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    };
    for t in b.graph.initializer.iter_mut() {
        if t.name == "block.conv1.w" {
            edit(&mut t.raw_data, &|v| {
                let per = v.len() / 8;
                v[..per].iter_mut().for_each(|x| *x *= 1e-14);
            });
        }
        if t.name == "block.conv1.b" {
            edit(&mut t.raw_data, &|v| v[0] = 0.6);
        }
    }
    let (model, qdq) = calibrated_model(b.model(), Method::Max);
    let dir = common::temp_dir("ort-dead");
    assert_ort_matches(&model, &qdq, &dir, "dead");
}

#[test]
fn fp16_simulation_rounds_through_half() {
    let model = residual_classifier(10).model();
    let spec = BuildSpec {
        batch: 1,
        hw: [16, 16],
    };
    let b = backend(BackendKind::Cpu);
    let mut fp32 = b
        .build(
            BuildInput::Float {
                model: &model,
                precision: quantscope::backend::Precision::Fp32,
            },
            spec,
        )
        .expect("fp32");
    let mut fp16 = b
        .build(
            BuildInput::Float {
                model: &model,
                precision: quantscope::backend::Precision::Fp16,
            },
            spec,
        )
        .expect("fp16");
    assert!(fp16.info().simulated);
    let x = values(3 * 16 * 16, 5);
    let (a, h) = (
        fp32.run(&x).expect("fp32 run").data,
        fp16.run(&x).expect("fp16 run").data,
    );
    let (err, max) = common::max_err(&h, &a);
    assert!(err > 0.0, "rounding through f16 changes the output");
    assert!(err < 2e-2 * max, "but only at half precision: {err}");
}
