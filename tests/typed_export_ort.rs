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
