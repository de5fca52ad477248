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
    calibrated_as(model, method, quant::QFormat::Int8)
}

/// `model` calibrated on 24 generated inputs, its Q/DQ model in `format`.
fn calibrated_as(
    model: quantscope::model::Model,
    method: Method,
    format: quant::QFormat,
) -> (quantscope::model::Model, quant::QdqModel) {
    let plan = quant::plan(&model, &[]);
    let probe = Probe::new(&model, [16, 16], &plan.tensors()).expect("probe");
    let mut stats = Stats::new("test".into(), &plan.tensors());
    for i in 0..24 {
        let (_, acts) = probe.run(&values(3 * 16 * 16, 500 + i)).expect("probe run");
        stats.add(&plan.tensors(), &acts);
    }
    let ranges = stats.ranges(method, 99.99);
    let qdq = quant::build_qdq_as(&model, &plan, Some(&ranges), format).expect("qdq");
    if format == quant::QFormat::Fp8E4M3 {
        for (t, s) in &qdq.scales {
            let amax = ranges.amax[t];
            assert!(
                (s * 448.0 - amax).abs() <= 1e-6 * amax,
                "{t}: scale {s}, amax {amax}"
            );
        }
    }
    (model, qdq)
}

/// The CPU engine of `qdq` (INT8, or FP8 simulated), batch 1 at 16x16.
fn int8_engine(model: &quantscope::model::Model, qdq: &quant::QdqModel) -> Box<dyn Engine> {
    backend(BackendKind::Cpu)
        .build(
            BuildInput::Quantized {
                model,
                qdq,
                keep_fp32: &[],
            },
            BuildSpec {
                batch: 1,
                hw: [16, 16],
            },
        )
        .expect("quantized engine")
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
/// quantscope's engine of the same Q/DQ model (INT8, or FP8 simulated).
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
            "{tag} input {i}: quantized engine vs ONNX Runtime max error {err}"
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
                keep_fp32: &[],
            },
            spec,
        )
        .expect("fp32");
    let mut fp16 = b
        .build(
            BuildInput::Float {
                model: &model,
                precision: quantscope::backend::Precision::Fp16,
                keep_fp32: &[],
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

/// The FP8 E4M3 Q/DQ model of the residual classifier (scales amax / 448, checked).
fn fp8_calibrated() -> (quantscope::model::Model, quant::QdqModel) {
    calibrated_as(
        residual_classifier(10).model(),
        Method::Max,
        quant::QFormat::Fp8E4M3,
    )
}

#[test]
fn fp8_qdq_model_is_opset_19_float8_and_its_cpu_engine_is_simulated() {
    use quant::fp8::{ONNX_FLOAT8E4M3FN, tensor_codes};
    let (model, qdq) = fp8_calibrated();
    let opset = qdq
        .proto
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty())
        .map(|o| o.version);
    assert_eq!(opset, Some(19));
    assert!(qdq.proto.ir_version >= 9, "float8 needs IR version 9");
    let g = qdq.proto.graph.as_ref().expect("graph");
    let f8: Vec<_> = g
        .initializer
        .iter()
        .filter(|t| t.data_type == ONNX_FLOAT8E4M3FN)
        .collect();
    // Four weights and their zero points, and the activations' shared zero point.
    assert_eq!(f8.len(), 9, "float8 initializers");
    assert!(
        f8.iter()
            .flat_map(|t| tensor_codes(t).unwrap_or_default())
            .all(|c| c & 0x7f != 0x7f),
        "no NaN codes"
    );
    let mut engine = backend(BackendKind::Cpu)
        .build(
            BuildInput::Quantized {
                model: &model,
                qdq: &qdq,
                keep_fp32: &[],
            },
            BuildSpec {
                batch: 1,
                hw: [16, 16],
            },
        )
        .expect("fp8 engine");
    assert!(engine.info().simulated, "the CPU has no FP8 arithmetic");
    assert_eq!(engine.info().int8_nodes, 4, "three convs and the Gemm");
    let mut fp32 = backend(BackendKind::Cpu)
        .build(
            BuildInput::Float {
                model: &model,
                precision: quantscope::backend::Precision::Fp32,
                keep_fp32: &[],
            },
            BuildSpec {
                batch: 1,
                hw: [16, 16],
            },
        )
        .expect("fp32 engine");
    let x = values(3 * 16 * 16, 77);
    let (a, q) = (
        fp32.run(&x).expect("fp32").data,
        engine.run(&x).expect("fp8").data,
    );
    let (err, max) = common::max_err(&q, &a);
    assert!(err > 0.0, "E4M3 rounding changes the output");
    assert!(
        err < 0.15 * max,
        "by about FP8's 3-bit mantissa: {err} of {max}"
    );
}

/// ONNX Runtime's FP8 QuantizeLinear/DequantizeLinear (its own E4M3 conversion) and the CPU's
/// FP8 simulation compute the same model.
#[test]
fn fp8_qdq_model_runs_in_onnx_runtime_and_matches_the_fp8_engine() {
    if !common::onnxruntime_available() {
        return;
    }
    let (model, qdq) = fp8_calibrated();
    let dir = common::temp_dir("ort-fp8");
    assert_ort_matches(&model, &qdq, &dir, "fp8");
}

/// A centered model (activation centering: a ReLU6 output read by a 1x1 conv holds t - c, the
/// 1x1 conv's bias folds c × Σ of its int8 weights; a ReLU output read by a padded 3x3
/// depthwise conv is padded with -c by a Pad node) runs in ONNX Runtime as quantscope's INT8 engine runs it: the
/// fold lives in the Q/DQ file's float bias.
#[test]
fn a_centered_model_runs_in_onnx_runtime_and_matches_the_int8_engine() {
    if !common::onnxruntime_available() {
        return;
    }
    use quantscope::model::testing::GraphBuilder;
    use quantscope::prepare::center;
    let mut b = GraphBuilder::new(&SHAPE);
    let c = b.conv("stem", "x", 3, 8, 3);
    let lo = b.constant("lo", &[], &[0.0]);
    let hi = b.constant("hi", &[], &[6.0]);
    let t = b.op("Clip", "stem.relu6", &[&c, &lo, &hi]);
    let p = b.conv("project", &t, 8, 8, 1);
    let r = b.op("Relu", "project.relu", &[&p]);
    let q = b.depthwise("spatial", &r, 8);
    let y = b.head(&q, 8, 10);
    b.output(&y);
    let model = b.model();
    let names = center::tensors(&model);
    assert_eq!(
        names,
        vec!["stem.relu6.out".to_string(), "project.relu.out".to_string()]
    );
    let probe = Probe::new(&model, [16, 16], &names).expect("probe");
    let mut top = vec![0f32; names.len()];
    for i in 0..24 {
        let (_, acts) = probe.run(&values(3 * 16 * 16, 500 + i)).expect("runs");
        for (t, a) in top.iter_mut().zip(&acts) {
            *t = a.as_ref().iter().fold(*t, |m, v| m.max(*v));
        }
    }
    let maxima = names.iter().cloned().zip(top).collect();
    let (centered, summary) =
        center::apply(&model, center::CenterSetting::On, &maxima).expect("centers");
    assert!(summary.applied(), "{summary:?}");
    assert_eq!(summary.padded, vec!["spatial".to_string()]);
    let (centered, qdq) = calibrated_model(centered, Method::Max);
    assert_ort_matches(
        &centered,
        &qdq,
        &common::temp_dir("ort-centered"),
        "centered",
    );
}
