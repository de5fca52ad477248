//! Placement on small graphs whose right answer is known.

use super::*;
use crate::calib::Method;
use crate::model::testing::{GraphBuilder, residual_classifier};

fn qdq_pairs(q: &QdqModel) -> Vec<String> {
    q.proto
        .graph
        .as_ref()
        .map(|g| {
            g.node
                .iter()
                .filter(|n| n.op_type == "QuantizeLinear")
                .map(|n| n.input[0].clone())
                .collect()
        })
        .unwrap_or_default()
}

fn ranges_for(plan: &QuantPlan) -> Ranges {
    Ranges {
        method: Method::Max,
        percentile: 99.99,
        amax: plan.tensors().into_iter().map(|t| (t, 2.0)).collect(),
        bias_correction: Default::default(),
    }
}

/// torchvision's MobileNetV2 stage opening: `x + conv(x)` where x is itself the previous
/// block's projection conv, which the next block's conv also reads. Only conv(x) can take
/// the Add into its epilogue, so x is the input quantized.
#[test]
fn a_residual_add_of_two_conv_outputs_quantizes_the_shared_one() {
    let mut b = GraphBuilder::new(&[1, 4, 8, 8]);
    let x = b.conv("prev.project", "x", 4, 8, 1);
    let e = b.conv("expand", &x, 8, 8, 1);
    let e = b.op("Relu", "expand.relu", &[&e]);
    let p = b.conv("project", &e, 8, 8, 1);
    let y = b.op("Add", "add", &[&x, &p]);
    b.output(&y);
    let plan = plan(&b.model(), &[]);
    let x_q = plan
        .activations
        .iter()
        .find(|a| a.tensor == x)
        .expect("the shared conv output is quantized");
    // Read quantized by the expand conv (slot 0) and by the Add (slot 0).
    assert_eq!(x_q.uses.len(), 2, "{x_q:?}");
    assert!(
        !plan.tensors().contains(&p),
        "the projection's output fuses into the Add: {:?}",
        plan.tensors()
    );
}

/// A region run in FP16 keeps its convs and the residual Add fused into the last one in
/// float: then nothing inside the block is quantized. With the convs alone in float, the Add
/// still quantizes its shortcut, and the engine must requantize it for an FP16 block.
#[test]
fn a_float_block_with_its_residual_add_quantizes_nothing_inside() {
    let m = residual_classifier(4).model();
    let block = ["block.conv1", "block.conv2"].map(String::from);
    let convs_only = plan(&m, &block);
    let shortcut = convs_only
        .activations
        .iter()
        .find(|a| a.tensor == "stem.relu.out")
        .expect("the Add still quantizes its shortcut");
    assert_eq!(shortcut.uses.len(), 1, "{shortcut:?}");
    let with_add: Vec<String> = block.iter().cloned().chain(["block.add".into()]).collect();
    let whole = plan(&m, &with_add);
    let acts = whole.tensors();
    for t in ["stem.relu.out", "block.relu1.out", "block.conv2.out"] {
        assert!(!acts.contains(&t.to_string()), "{t} quantized: {acts:?}");
    }
    assert_eq!(
        whole.quantized_nodes.len(),
        convs_only.quantized_nodes.len()
    );
}

#[test]
fn residual_block_quantizes_conv_inputs_and_the_residual_branch() {
    let m = residual_classifier(4).model();
    assert_eq!(m.info.batch_norms_folded, 1);
    let plan = plan(&m, &[]);
    let acts = plan.tensors();
    // Conv inputs: x (stem), stem.relu (conv1), block.relu1 (conv2), flatten (fc).
    for t in ["x", "stem.relu.out", "block.relu1.out", "flatten.out"] {
        assert!(
            acts.contains(&t.to_string()),
            "{t} should be quantized: {acts:?}"
        );
    }
    // The residual input of the Add fed by conv2 is stem.relu.out: used by conv1 and by the add.
    let res = plan
        .activations
        .iter()
        .find(|a| a.tensor == "stem.relu.out")
        .expect("residual");
    assert_eq!(res.uses.len(), 2);
    // The conv output into the Add is not quantized; nor is any graph output.
    assert!(!acts.contains(&"block.conv2.out".to_string()));
    assert!(!acts.contains(&"fc.out".to_string()));
    assert_eq!(plan.weights.len(), 4);
    let fc = plan
        .weights
        .iter()
        .find(|w| w.tensor == "fc.w")
        .expect("gemm weight");
    assert_eq!(
        fc.axis, 0,
        "Gemm with transB=1 has output channels on axis 0"
    );
}

#[test]
fn branch_shares_one_qdq_pair() {
    let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
    let a = b.conv("a", "x", 3, 4, 3);
    let c = b.conv("b", "x", 3, 4, 1);
    let y = b.op("Concat", "cat", &[&a, &c]);
    b.graph
        .node
        .last_mut()
        .map(|n| n.attribute.push(crate::model::proto::int_attr("axis", 1)));
    b.output(&y);
    let m = b.model();
    let plan = plan(&m, &[]);
    assert_eq!(plan.tensors(), vec!["x".to_string()]);
    let q = build_qdq(&m, &plan, Some(&ranges_for(&plan))).expect("qdq");
    assert_eq!(
        qdq_pairs(&q),
        vec!["x".to_string()],
        "one Q/DQ pair for the two readers of x"
    );
}

#[test]
fn graph_outputs_stay_float() {
    let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
    let y1 = b.conv("c1", "x", 3, 4, 3);
    let y2 = b.conv("c2", &y1, 4, 4, 3);
    b.output(&y1);
    b.output(&y2);
    let m = b.model();
    let plan = plan(&m, &[]);
    let q = build_qdq(&m, &plan, Some(&ranges_for(&plan))).expect("qdq");
    let g = q.proto.graph.as_ref().expect("graph");
    // y1 is still written by c1 (a Conv), and c2 reads its dequantized copy.
    let producer = g
        .node
        .iter()
        .find(|n| n.output.contains(&y1))
        .expect("producer");
    assert_eq!(producer.op_type, "Conv");
    let c2 = g.node.iter().find(|n| n.name == "c2").expect("c2");
    assert_eq!(c2.input[0], format!("{y1}_dequantized"));
    assert!(g.output.iter().all(|o| {
        g.node
            .iter()
            .any(|n| n.output.contains(&o.name) && n.op_type == "Conv")
    }));
}

#[test]
fn exclusions_by_name_and_op_type() {
    let m = residual_classifier(4).model();
    let by_name = plan(&m, &["block.conv2".to_string()]);
    assert!(!by_name.quantized_nodes.contains(&"block.conv2".to_string()));
    assert!(by_name.float_nodes.iter().any(|(n, _)| n == "block.conv2"));
    let by_op = plan(&m, &["Conv".to_string(), "Gemm".to_string()]);
    assert!(by_op.quantized_nodes.is_empty());
}

#[test]
fn weights_are_per_channel_symmetric() {
    let w = proto::F32Tensor {
        dims: vec![2, 3],
        data: vec![1.0, -0.5, 0.25, 10.0, 5.0, -10.0],
    };
    let (q, s) = quantize_weight(&w, 0);
    assert_eq!(s, vec![1.0 / 127.0, 10.0 / 127.0]);
    assert_eq!(q, vec![127, -64, 32, 127, 64, -127]);
}

#[test]
fn calibration_cache_has_the_tensorrt_layout() {
    let m = residual_classifier(4).model();
    let plan = plan(&m, &[]);
    let q = build_qdq(&m, &plan, Some(&ranges_for(&plan))).expect("qdq");
    let cache = q.calibration_cache();
    let mut lines = cache.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.starts_with("TRT-") && header.ends_with("-EntropyCalibration2"));
    let x = cache
        .lines()
        .find(|l| l.starts_with("x: "))
        .expect("input scale line");
    assert_eq!(x, format!("x: {:08x}", (2.0f32 / 127.0).to_bits()));
}

#[test]
fn old_opsets_are_raised_to_13() {
    let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
    let c = b.conv("c", "x", 3, 4, 3);
    let y = b.op("Softmax", "sm", &[&c]);
    b.output(&y);
    let m = crate::model::Model::from_bytes(std::path::Path::new("old.onnx"), &b.to_bytes(11))
        .expect("loads");
    let plan = plan(&m, &[]);
    let q = build_qdq(&m, &plan, Some(&ranges_for(&plan))).expect("qdq");
    assert_eq!(q.proto.opset_import[0].version, 13);
    let g = q.proto.graph.as_ref().expect("graph");
    assert!(
        g.node.iter().any(|n| n.op_type == "Flatten"),
        "old Softmax keeps its 2-D meaning"
    );
}

#[test]
fn a_misspelt_exclusion_is_an_error_with_suggestions() {
    let m = residual_classifier(4).model();
    check_exclusions(&m, &["block.conv1".into(), "Gemm".into()], "--exclude").expect("known names");
    let e = check_exclusions(&m, &["block.conv_1".into()], "--exclude").unwrap_err();
    assert!(e.contains("`block.conv_1`"), "{e}");
    assert!(e.contains("did you mean `block.conv1`"), "{e}");
}

/// FP8 Q/DQ needs opset 19: a ReduceMean's `axes` attribute (an input from opset 18) moves
/// into an initializer, and the raised model computes what the original did.
#[test]
fn opset_19_moves_reduce_axes_and_keeps_the_meaning() {
    use crate::backend::cpu::TractModel;
    let mut b = GraphBuilder::new(&[1, 4, 5, 5]);
    let c = b.conv("c", "x", 4, 4, 3);
    let r = b.node(
        "ReduceMean",
        "pool",
        &[&c],
        vec![proto::ints_attr("axes", &[2, 3])],
    );
    b.output(&r);
    let model = b.model();
    let mut raised = model.proto.clone();
    ensure_opset19(&mut raised).expect("raise");
    let opset = raised.opset_import.iter().find(|o| o.domain.is_empty());
    assert_eq!(opset.map(|o| o.version), Some(19));
    let g = raised.graph.as_ref().expect("graph");
    let pool = g.node.iter().find(|n| n.name == "pool").expect("pool");
    assert!(pool.attribute.iter().all(|a| a.name != "axes"));
    let axes = g
        .initializer
        .iter()
        .find(|t| Some(&t.name) == pool.input.get(1))
        .and_then(proto::tensor_i64);
    assert_eq!(axes, Some(vec![2, 3]));
    let x = crate::model::testing::values(100, 3);
    let run = |p: &pb::ModelProto| {
        let m = TractModel::new(p, [1, 4, 5, 5], &[]).expect("tract loads it");
        let y = m.run_all(&x).expect("runs");
        y[0].try_as_plain_ram()
            .expect("plain")
            .as_slice::<f32>()
            .expect("f32")
            .to_vec()
    };
    assert_eq!(run(&model.proto), run(&raised));
}

#[test]
fn fp8_placement_matches_int8_with_e4m3_scales() {
    let model = residual_classifier(10).model();
    let plan = plan(&model, &[]);
    let ranges = ranges_for(&plan);
    let int8 = build_qdq(&model, &plan, Some(&ranges)).expect("int8");
    let fp8 = build_qdq_as(&model, &plan, Some(&ranges), QFormat::Fp8E4M3).expect("fp8");
    assert_eq!(qdq_pairs(&int8), qdq_pairs(&fp8), "same placement");
    assert!(fp8.scales.values().all(|&s| s == 2.0 / 448.0));
    assert!(int8.scales.values().all(|&s| s == 2.0 / 127.0));
    assert_eq!(fp8.format.precision(), crate::precision::Precision::Fp8);
}
