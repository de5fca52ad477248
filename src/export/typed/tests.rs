//! The FP16 and mixed writers on small graphs whose right answer is known.

use super::*;
use crate::calib::{Method, Ranges};
use crate::model::testing::{GraphBuilder, residual_classifier};
use crate::quant;

fn graph(p: &pb::ModelProto) -> &pb::GraphProto {
    p.graph.as_ref().expect("graph")
}

fn node<'a>(g: &'a pb::GraphProto, name: &str) -> &'a pb::NodeProto {
    g.node
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("node {name}"))
}

fn init_type(g: &pb::GraphProto, name: &str) -> i32 {
    g.initializer
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.data_type)
        .unwrap_or_else(|| panic!("initializer {name}"))
}

/// The op that produces `t` in `g` (a Cast's `to` type too).
fn producer<'a>(g: &'a pb::GraphProto, t: &str) -> Option<&'a pb::NodeProto> {
    g.node.iter().find(|n| n.output.iter().any(|o| o == t))
}

#[test]
fn fp16_export_has_fp16_weights_fp32_io_and_keeps_the_logits_layer_fp32() {
    let model = residual_classifier(10).model();
    let typed = fp16_model(&model, None, &[]).expect("fp16");
    let g = graph(&typed.proto);
    // Graph I/O are the model's: float32.
    assert_eq!(proto::value_info_elem_type(&g.input[0]), Some(FLOAT));
    assert_eq!(proto::value_info_elem_type(&g.output[0]), Some(FLOAT));
    // Conv weights and biases are FP16; the logits Gemm's stay FP32 (rule 3).
    // (Batch norms are folded when the model loads: the stem's weights are renamed.)
    for conv in ["stem", "block.conv1", "block.conv2"] {
        for w in &node(g, conv).input[1..] {
            assert_eq!(init_type(g, w), FLOAT16, "{conv}: {w}");
        }
    }
    assert_eq!(init_type(g, "fc.w"), FLOAT);
    assert!(
        typed
            .kept_fp32
            .iter()
            .any(|k| k.node == "fc" && k.reason.contains("logits")),
        "{:?}",
        typed.kept_fp32
    );
    // The input is cast to FP16 before the first conv; the Gemm reads an FP32 cast.
    let stem = node(g, "stem");
    let cast_in = producer(g, &stem.input[0]).expect("a cast feeds the stem");
    assert_eq!(cast_in.op_type, "Cast");
    assert_eq!(proto::attr_i(cast_in, "to"), Some(FLOAT16 as i64));
    assert_eq!(cast_in.input[0], "x");
    let fc = node(g, "fc");
    let cast_fc = producer(g, &fc.input[0]).expect("a cast feeds the Gemm");
    assert_eq!(cast_fc.op_type, "Cast");
    assert_eq!(proto::attr_i(cast_fc, "to"), Some(FLOAT as i64));
    assert_eq!(
        fc.output[0], g.output[0].name,
        "the Gemm writes the FP32 output itself"
    );
    assert_eq!(typed.casts, 2);
    assert!(typed.fp16_nodes >= 6, "{}", typed.fp16_nodes);
    // The opset is the model's.
    assert_eq!(typed.proto.opset_import, model.proto.opset_import);
}

#[test]
fn sensitive_ops_stay_fp32_with_casts_on_both_sides() {
    let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
    let c1 = b.conv("c1", "x", 3, 4, 3);
    let s = b.op("Softmax", "soft", &[&c1]);
    let c2 = b.conv("c2", &s, 4, 4, 3);
    let r = b.op("Relu", "relu", &[&c2]);
    let c3 = b.conv("c3", &r, 4, 2, 1);
    b.output(&c3);
    let typed = fp16_model(&b.model(), None, &[]).expect("fp16");
    let g = graph(&typed.proto);
    let soft = node(g, "soft");
    let before = producer(g, &soft.input[0]).expect("cast before softmax");
    assert_eq!(
        (before.op_type.as_str(), proto::attr_i(before, "to")),
        ("Cast", Some(FLOAT as i64))
    );
    let c2 = node(g, "c2");
    let after = producer(g, &c2.input[0]).expect("cast after softmax");
    assert_eq!(
        (after.op_type.as_str(), proto::attr_i(after, "to")),
        ("Cast", Some(FLOAT16 as i64))
    );
    assert_eq!(after.input[0], soft.output[0]);
    let kept: Vec<&str> = typed.kept_fp32.iter().map(|k| k.node.as_str()).collect();
    assert_eq!(
        kept,
        ["soft", "c3"],
        "softmax (rule 1) and the output conv (rule 3)"
    );
    assert_eq!(init_type(g, "c2.w"), FLOAT16);
    assert_eq!(init_type(g, "c3.w"), FLOAT);
}

#[test]
fn large_upscale_resize_stays_fp32_and_small_one_goes_fp16() {
    for (factor, kept) in [(8.0f32, true), (2.0, false)] {
        let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
        let c1 = b.conv("c1", "x", 3, 4, 3);
        b.graph.initializer.push(proto::f32_tensor(
            "scales",
            &[4],
            &[1.0, 1.0, factor, factor],
        ));
        b.graph.node.push(proto::node(
            "Resize",
            "up",
            &[&c1, "", "scales"],
            &["up.out"],
            vec![proto::str_attr("mode", "linear")],
        ));
        let c2 = b.conv("c2", "up.out", 4, 4, 3);
        let r = b.op("Relu", "relu", &[&c2]);
        let c3 = b.conv("c3", &r, 4, 2, 1);
        b.output(&c3);
        let typed = fp16_model(&b.model(), None, &[]).expect("fp16");
        assert_eq!(
            typed.kept_fp32.iter().any(|k| k.node == "up"),
            kept,
            "x{factor}: {:?}",
            typed.kept_fp32
        );
        // Resize's scales are float32 by the ONNX spec, in either case.
        assert_eq!(init_type(graph(&typed.proto), "scales"), FLOAT);
    }
}

#[test]
fn mixed_export_places_qdq_only_on_int8_layers_and_fp16_elsewhere() {
    let model = residual_classifier(10).model();
    let plan = quant::plan(&model, &["block.conv2".to_string()]);
    let ranges = Ranges {
        method: Method::Max,
        percentile: 99.99,
        amax: plan.tensors().into_iter().map(|t| (t, 2.0)).collect(),
        bias_correction: Default::default(),
    };
    let qdq = quant::build_qdq(&model, &plan, Some(&ranges)).expect("qdq");
    let typed = mixed_model(&qdq, "test.onnx", None, &[]).expect("mixed");
    let g = graph(&typed.proto);
    let reads_dq = |n: &pb::NodeProto| {
        n.input
            .iter()
            .any(|t| producer(g, t).is_some_and(|p| p.op_type == "DequantizeLinear"))
    };
    // Every INT8 layer of the plan reads Q/DQ; the layer kept in float reads none.
    for name in &plan.quantized_nodes {
        assert!(reads_dq(node(g, name)), "{name} reads Q/DQ");
    }
    let kept = node(g, "block.conv2");
    assert!(!reads_dq(kept), "the kept layer has no Q/DQ");
    // ... and computes in FP16: FP16 weights, an FP16 input.
    assert_eq!(init_type(g, "block.conv2.w"), FLOAT16);
    // It reads the FP16 ReLU, which reads INT8 block.conv1's FP32 output through a Cast.
    let relu = producer(g, &kept.input[0]).expect("producer");
    assert_eq!(relu.name, "block.relu1");
    let src = producer(g, &relu.input[0]).expect("producer");
    assert_eq!(
        (src.op_type.as_str(), proto::attr_i(src, "to")),
        ("Cast", Some(FLOAT16 as i64))
    );
    assert_eq!(src.input[0], node(g, "block.conv1").output[0]);
    // Q/DQ count is the Q/DQ model's: nothing added, nothing lost.
    let count =
        |p: &pb::ModelProto, op: &str| graph(p).node.iter().filter(|n| n.op_type == op).count();
    for op in ["QuantizeLinear", "DequantizeLinear"] {
        assert_eq!(count(&typed.proto, op), count(&qdq.proto, op), "{op}");
    }
    // Q/DQ scales stay FP32 (opset 13).
    for n in g.node.iter().filter(|n| n.op_type == "QuantizeLinear") {
        assert_eq!(init_type(g, &n.input[1]), FLOAT);
    }
    // The quantized convs and Gemm, and the residual Add whose other input is quantized.
    assert_eq!(
        typed.int8_layers,
        plan.quantized_nodes.len() + 1,
        "{:?}",
        plan.quantized_nodes
    );
    assert_eq!(proto::value_info_elem_type(&g.output[0]), Some(FLOAT));
}

#[test]
fn a_constant_beyond_fp16_range_keeps_its_reader_fp32() {
    let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
    let c1 = b.conv("c1", "x", 3, 4, 3);
    b.graph
        .initializer
        .push(proto::f32_tensor("big", &[1], &[1e6]));
    let m = b.op("Mul", "mul", &[&c1, "big"]);
    let c2 = b.conv("c2", &m, 4, 2, 1);
    b.output(&c2);
    let typed = fp16_model(&b.model(), None, &[]).expect("fp16");
    assert!(
        typed
            .kept_fp32
            .iter()
            .any(|k| k.node == "mul" && k.reason.contains("65504")),
        "{:?}",
        typed.kept_fp32
    );
    assert_eq!(init_type(graph(&typed.proto), "big"), FLOAT);
}
