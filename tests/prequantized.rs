//! Pre-quantized models as other tools write them (PyTorch's eager-mode export, ONNX Runtime's
//! `quantize_static`, modelopt's INT8 and FP8), generated in code (`quant::testing`): the load
//! normalises them exactly, both backends take them as quantized engines (the CUDA planner is
//! checked without a GPU), the CPU engine runs them with quantized nodes and the output ONNX
//! Runtime gives on the file as it came, and the repaired model runs in ONNX Runtime with the
//! same outputs.

mod common;

use std::path::Path;

use quantscope::backend::cpu::CpuBackend;
use quantscope::backend::{Backend, BuildInput, BuildSpec, Precision, cuda};
use quantscope::export::ort_check::run_onnxruntime;
use quantscope::model::Model;
use quantscope::model::testing::values;
use quantscope::quant::testing::{Form, INPUT, prequantized};
use quantscope::quant::{self, QFormat, carried};

const HW: [usize; 2] = [INPUT[2], INPUT[3]];

fn load(form: Form) -> Model {
    Model::from_bytes(Path::new("prequantized.onnx"), &prequantized(form)).expect("loads")
}

fn ops(m: &Model) -> Vec<&str> {
    m.graph().node.iter().map(|n| n.op_type.as_str()).collect()
}

/// The CUDA planner's verdict for `precision`: Ok(()) when every node lowers, else the reasons.
fn cuda_takes(m: &Model, precision: Precision) -> Result<(), String> {
    match cuda::coverage(m, HW, precision) {
        Ok(list) if list.is_empty() => Ok(()),
        Ok(list) => Err(list
            .iter()
            .map(|u| format!("`{}` ({}): {}", u.node, u.op, u.why))
            .collect::<Vec<_>>()
            .join("; ")),
        Err(e) => Err(e),
    }
}

/// The CPU engine of the model's own Q/DQ on `x`: its output and quantized-node count.
fn cpu_quantized(m: &Model, x: &[f32]) -> (Vec<f32>, usize) {
    let qdq = quant::build_qdq_as(
        m,
        &quant::plan(m, &[]),
        None,
        carried::carried_format(m).unwrap(),
    )
    .expect("its own Q/DQ");
    let mut e = CpuBackend
        .build(
            BuildInput::Quantized {
                model: m,
                qdq: &qdq,
                keep_fp32: &[],
            },
            BuildSpec { batch: 1, hw: HW },
        )
        .expect("cpu engine");
    (e.run(x).expect("runs").data, e.info().int8_nodes)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn pytorch_export_is_normalised_exactly_into_tensorrt_form() {
    let m = load(Form::Torch);
    let rewrites = m.info.qdq_rewrites.join("\n");
    for what in [
        "folded into initializers",
        "Cast nodes dropped",
        "zero point 128 made int8",
        "int32 biases",
    ] {
        assert!(rewrites.contains(what), "missing `{what}` in:\n{rewrites}");
    }
    assert!(m.info.qdq_kept.is_empty(), "{:?}", m.info.qdq_kept);
    let o = ops(&m);
    assert!(
        !o.contains(&"Cast") && !o.contains(&"ConstantOfShape"),
        "{o:?}"
    );
    // Every zero point left is int8 zero: TensorRT's symmetric form.
    let g = m.graph();
    for n in g
        .node
        .iter()
        .filter(|n| n.op_type.ends_with("QuantizeLinear"))
    {
        let zp = g
            .initializer
            .iter()
            .find(|t| t.name == n.input[2])
            .expect("zero point");
        assert_eq!(
            quantscope::model::proto::data_type_name(zp.data_type),
            "int8",
            "{}",
            n.name
        );
        assert!(
            quantscope::model::proto::tensor_i64(zp)
                .unwrap()
                .iter()
                .all(|&z| z == 0)
        );
    }
    for p in [Precision::Fp32, Precision::Fp16, Precision::Int8] {
        cuda_takes(&m, p).unwrap_or_else(|e| panic!("cuda {p}: {e}"));
    }
    // FP8 is refused with the reason: the model carries INT8.
    let e = cuda_takes(&m, Precision::Fp8).unwrap_err();
    assert!(e.contains("carries its own int8"), "{e}");
}

#[test]
fn every_form_runs_quantized_on_cpu_as_onnx_runtime_runs_the_file() {
    if !common::onnxruntime_available() {
        return;
    }
    let dir = common::temp_dir("prequantized-ort");
    let x: Vec<f32> = values(INPUT.iter().product(), 11)
        .iter()
        .map(|v| v * 2.0)
        .collect();
    for form in Form::ALL {
        let file = dir.join(format!("{form:?}.onnx"));
        std::fs::write(&file, prequantized(form)).unwrap();
        let as_written = run_onnxruntime(&file, &x, &INPUT).expect("ORT runs the file as written");
        let m = Model::load(&file).expect("loads");
        // The repaired model, as `--export-qdq` writes it, computes what the file did.
        let qdq = quant::build_qdq_as(
            &m,
            &quant::plan(&m, &[]),
            None,
            carried::carried_format(&m).unwrap(),
        )
        .unwrap();
        let repaired = dir.join(format!("{form:?}_repaired.onnx"));
        qdq.save(&repaired).unwrap();
        let again = run_onnxruntime(&repaired, &x, &INPUT).expect("ORT runs the repaired model");
        let scale = as_written.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(
            max_abs_diff(&again, &as_written) <= 1e-5 * scale.max(1.0),
            "{form:?}: the repaired model differs: {again:?} vs {as_written:?}"
        );
        let (ours, quantized) = cpu_quantized(&m, &x);
        assert!(quantized > 0, "{form:?}: no quantized node on the CPU");
        // ONNX Runtime may fuse the Q/DQ into integer kernels, so allow a quantization step of
        // the last layer's input (5/127 in, weights ≤ 0.5: a few hundredths at the output).
        let d = max_abs_diff(&ours, &as_written);
        assert!(
            d <= 0.05 * scale.max(1.0),
            "{form:?}: {d} from ONNX Runtime: {ours:?} vs {as_written:?}"
        );
    }
}

#[test]
fn asymmetric_zero_points_are_kept_named_and_refused_by_cuda_with_a_reason() {
    let m = load(Form::OrtAsymmetric);
    let kept = m.info.qdq_kept.join("\n");
    assert!(
        kept.contains("asymmetric zero point") && kept.contains("zero point 0"),
        "{kept}"
    );
    assert!(
        kept.contains("ActivationSymmetric"),
        "says what to do: {kept}"
    );
    // ONNX Runtime's shared DequantizeLinear is split, one per reader.
    assert!(
        m.info
            .qdq_rewrites
            .iter()
            .any(|r| r.contains("one per reader")),
        "{:?}",
        m.info.qdq_rewrites
    );
    let e = cuda_takes(&m, Precision::Int8).unwrap_err();
    assert!(e.contains("zero point"), "{e}");
}

#[test]
fn modelopt_int8_and_fp8_forms_lower_in_their_own_precision() {
    let int8 = load(Form::ModeloptInt8);
    assert_eq!(carried::carried_format(&int8), Some(QFormat::Int8));
    // Its float weights behind a QuantizeLinear become int8 constants, as TensorRT wants them.
    assert!(
        int8.info
            .qdq_rewrites
            .iter()
            .any(|r| r.contains("folded into int8 weights")),
        "{:?}",
        int8.info.qdq_rewrites
    );
    assert_eq!(
        ops(&int8)
            .iter()
            .filter(|o| **o == "QuantizeLinear")
            .count(),
        3,
        "the three activations only"
    );
    cuda_takes(&int8, Precision::Int8).unwrap();
    let fp8 = load(Form::ModeloptFp8);
    assert_eq!(carried::carried_format(&fp8), Some(QFormat::Fp8E4M3));
    cuda_takes(&fp8, Precision::Fp8).unwrap();
    let e = cuda_takes(&fp8, Precision::Int8).unwrap_err();
    assert!(e.contains("carries its own fp8"), "{e}");
    for m in [&int8, &fp8] {
        cuda_takes(m, Precision::Fp32).unwrap();
    }
}

#[test]
fn float_rows_run_the_float_model_the_quantized_one_carries() {
    let x: Vec<f32> = values(INPUT.iter().product(), 5)
        .iter()
        .map(|v| v * 2.0)
        .collect();
    for form in Form::ALL {
        let m = load(form);
        let f = carried::float_form(&m);
        assert!(!f.info.prequantized);
        let o = ops(&f);
        assert!(
            !o.contains(&"QuantizeLinear") && !o.contains(&"DequantizeLinear"),
            "{form:?}: {o:?}"
        );
        let mut e = CpuBackend
            .build(
                BuildInput::Float {
                    model: &f,
                    precision: Precision::Fp32,
                    keep_fp32: &[],
                },
                BuildSpec { batch: 1, hw: HW },
            )
            .expect("fp32 engine");
        let float = e.run(&x).unwrap().data;
        let (quantized, _) = cpu_quantized(&m, &x);
        // Same weights, activations unquantized: close, and not identical.
        let scale = float.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = max_abs_diff(&float, &quantized);
        assert!(d > 0.0 && d < 0.15 * scale, "{form:?}: {d} against {scale}");
    }
}
