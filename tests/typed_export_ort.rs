//! The strongly typed FP16 and mixed INT8/FP16 exports run in ONNX Runtime and match
//! quantscope's engines for the same plan: FP16 model vs tract's simulated FP16 engine (an engine
//! independent of ONNX Runtime), mixed model vs the INT8 engine of the same Q/DQ model (float
//! layers FP32), within the tolerances `export::ort_check` states.

mod common;

use quantscope::backend::cpu::{Probe, TractBackend};
use quantscope::backend::{Backend, BackendKind, backend};
use quantscope::calib::{Method, Stats};
use quantscope::export::{self, ort_check};
use quantscope::model::testing::{GraphBuilder, residual_classifier, values};
use quantscope::quant;

/// A segmentation-like head: conv, a Softmax in the middle, a 8x Resize to the output.
fn segmenter() -> quantscope::model::Model {
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let c1 = b.conv("c1", "x", 3, 8, 3);
    let r1 = b.op("Relu", "r1", &[&c1]);
    let c2 = b.conv("c2", &r1, 8, 8, 3);
    let s = b.op("Softmax", "soft", &[&c2]);
    let c3 = b.conv("c3", &s, 8, 8, 3);
    let add = b.op("Add", "add", &[&c3, &r1]);
    let c4 = b.conv("c4", &add, 8, 4, 1);
    b.graph
        .initializer
        .push(quantscope::model::proto::f32_tensor(
            "scales",
            &[4],
            &[1.0, 1.0, 8.0, 8.0],
        ));
    b.graph.node.push(quantscope::model::proto::node(
        "Resize",
        "up",
        &[&c4, "", "scales"],
        &["up.out"],
        vec![quantscope::model::proto::str_attr("mode", "linear")],
    ));
    b.output("up.out");
    b.model()
}

fn calibrated_qdq(model: &quantscope::model::Model, keep: &[String]) -> quant::QdqModel {
    let plan = quant::plan(model, keep);
    let probe = Probe::new(model, [16, 16], &plan.tensors()).expect("probe");
    let mut stats = Stats::new("test".into(), &plan.tensors());
    for i in 0..16 {
        let (_, acts) = probe.run(&values(3 * 16 * 16, 300 + i)).expect("probe run");
        stats.add(&plan.tensors(), &acts);
    }
    let ranges = stats.ranges(Method::Max, 99.99);
    quant::build_qdq(model, &plan, Some(&ranges)).expect("qdq")
}

#[test]
fn fp16_and_mixed_exports_match_quantscope_engines_in_onnx_runtime() {
    if !common::onnxruntime_available() {
        return;
    }
    let dir = common::temp_dir("typed-ort");
    // tract's FP16 numerics: an engine independent of the ONNX Runtime that checks the file.
    let cpu: Box<dyn Backend> = Box::new(TractBackend);
    for (name, model, keep) in [
        ("classifier", residual_classifier(10).model(), "block.conv2"),
        ("segmenter", segmenter(), "c3"),
    ] {
        let x = values(3 * 16 * 16, 42);
        let fp16 =
            export::export_fp16(&dir, &model, [16, 16], cpu.as_ref(), &x, &[]).expect("fp16");
        let check = fp16
            .ort_check
            .clone()
            .unwrap_or_else(|| panic!("{name}: no ORT check: {:?}", fp16.ort_note));
        println!("{name} fp16: {}", check.line());
        assert!(check.within, "{name} fp16: {}", check.line());
        assert!(check.max_abs_diff > 0.0, "FP16 rounding shows");
        assert!(fp16.trtexec.contains("--stronglyTyped"));

        let qdq = calibrated_qdq(&model, &[keep.to_string()]);
        let mixed = export::export_mixed(
            &dir,
            std::path::Path::new("model.onnx"),
            &model,
            &qdq,
            [16, 16],
            cpu.as_ref(),
            &x,
            &[],
        )
        .expect("mixed");
        let check = mixed
            .ort_check
            .clone()
            .unwrap_or_else(|| panic!("{name}: no ORT check: {:?}", mixed.ort_note));
        println!("{name} mixed: {}", check.line());
        assert!(check.within, "{name} mixed: {}", check.line());
        assert!(mixed.int8_layers > 0 && mixed.fp16_nodes > 0, "{mixed:?}");
    }
}

#[test]
fn a_broken_export_is_caught_by_the_check() {
    if !common::onnxruntime_available() {
        return;
    }
    // The check must be able to fail: compare the FP16 model's output with a scaled copy.
    let dir = common::temp_dir("typed-ort-broken");
    let model = residual_classifier(10).model();
    let x = values(3 * 16 * 16, 7);
    let cpu = backend(BackendKind::Cpu);
    let fp16 = export::export_fp16(&dir, &model, [16, 16], cpu.as_ref(), &x, &[]).expect("fp16");
    let ort = ort_check::run_onnxruntime(&fp16.file, &x, &[1, 3, 16, 16]).expect("ort");
    let wrong: Vec<f32> = ort.iter().map(|v| v * 1.1 + 0.05).collect();
    let c = ort_check::compare(&ort, &wrong, ort_check::FP16_TOLERANCE_REL, "scaled");
    assert!(!c.within, "{}", c.line());
}

/// A branch of `If` that reads the outer graph's tensors by name, as SSDlite's post-processing
/// does: an FP16 conv's output and an initializer only the branch reads.
fn with_if_branch() -> quantscope::model::Model {
    use quantscope::model::proto::{f32_tensor, float_value_info, node};
    use tract_onnx::pb;
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let c1 = b.conv("c1", "x", 3, 8, 3);
    let r1 = b.op("Relu", "r1", &[&c1]);
    let c2 = b.conv("c2", &r1, 8, 8, 3);
    b.graph.initializer.push(f32_tensor("shift", &[1], &[0.25]));
    b.graph.initializer.push(pb::TensorProto {
        name: "cond".into(),
        data_type: pb::tensor_proto::DataType::Bool as i32,
        int32_data: vec![1],
        ..Default::default()
    });
    let branch = |name: &str, op: &str, inputs: &[&str]| pb::AttributeProto {
        name: format!("{name}_branch"),
        r#type: pb::attribute_proto::AttributeType::Graph as i32,
        g: Some(pb::GraphProto {
            name: name.into(),
            node: vec![node(
                op,
                &format!("{name}.op"),
                inputs,
                &[&format!("{name}.out")],
                vec![],
            )],
            output: vec![float_value_info(&format!("{name}.out"), None)],
            ..Default::default()
        }),
        ..Default::default()
    };
    b.graph.node.push(node(
        "If",
        "branch",
        &["cond"],
        &["branch.out"],
        vec![
            branch("then", "Add", &[&c2, "shift"]),
            branch("else", "Identity", &[&c2]),
        ],
    ));
    let c3 = b.conv("c3", "branch.out", 8, 4, 1);
    b.output(&c3);
    b.model()
}

#[test]
fn an_if_branch_reading_outer_tensors_stays_fp32_and_runs_in_onnx_runtime() {
    if !common::onnxruntime_available() {
        return;
    }
    let dir = common::temp_dir("typed-ort-if");
    let model = with_if_branch();
    let typed = export::typed::fp16_model(&model, None, &[]).expect("fp16 model");
    assert!(
        typed.fp16_nodes >= 2,
        "the convs around the If go FP16: {typed:?}"
    );
    let (fp32_file, fp16_file) = (dir.join("if_fp32.onnx"), dir.join("if_fp16.onnx"));
    std::fs::write(&fp32_file, prost::Message::encode_to_vec(&model.proto)).expect("write");
    std::fs::write(&fp16_file, typed.to_bytes()).expect("write");
    let x = values(3 * 16 * 16, 11);
    let shape = [1, 3, 16, 16];
    let want = ort_check::run_onnxruntime(&fp32_file, &x, &shape).expect("FP32 model runs");
    // Before, ONNX Runtime refused the FP16 model: the branch's Add bound float16 and float.
    let got = ort_check::run_onnxruntime(&fp16_file, &x, &shape).expect("FP16 model runs");
    let sqnr = ort_check::sqnr_db(&want, &got).expect("sqnr");
    assert!(sqnr > 40.0, "FP16 against FP32: {sqnr:.1} dB");
}
