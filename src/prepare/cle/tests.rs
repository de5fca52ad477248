//! Cross-layer equalization on small graphs built in code: which pairs it finds, that the
//! ranges end up even, that the FP32 function is unchanged (Clip included), and what it leaves.

use super::*;
use crate::backend::cpu::Probe;
use crate::model::testing::{GraphBuilder, values};

const HW: [usize; 2] = [12, 12];

/// Adds a conv with `groups`, bias and "same" padding, whose output channel c is scaled by
/// 10^((c % 3) - 1): the uneven per-channel ranges CLE is for.
fn conv(
    b: &mut GraphBuilder,
    name: &str,
    input: &str,
    cin: usize,
    cout: usize,
    k: usize,
    groups: usize,
    seed: u64,
) -> String {
    let per = cin / groups * k * k;
    let mut w = values(cout * per, seed);
    for (i, v) in w.iter_mut().enumerate() {
        *v *= 10f32.powi((i / per % 3) as i32 - 1) * 3.0 / per as f32;
    }
    let bias = values(cout, seed + 100);
    let (wn, bn) = (format!("{name}.w"), format!("{name}.b"));
    b.graph
        .initializer
        .push(proto::f32_tensor(&wn, &[cout, cin / groups, k, k], &w));
    b.graph
        .initializer
        .push(proto::f32_tensor(&bn, &[cout], &bias));
    let p = (k / 2) as i64;
    let out = format!("{name}.out");
    b.graph.node.push(proto::node(
        "Conv",
        name,
        &[input, &wn, &bn],
        &[&out],
        vec![
            proto::ints_attr("kernel_shape", &[k as i64, k as i64]),
            proto::ints_attr("pads", &[p, p, p, p]),
            proto::int_attr("group", groups as i64),
        ],
    ));
    out
}

fn clip(b: &mut GraphBuilder, name: &str, input: &str) -> String {
    let (lo, hi) = (format!("{name}.lo"), format!("{name}.hi"));
    b.graph
        .initializer
        .push(proto::f32_tensor(&lo, &[], &[0.0]));
    b.graph
        .initializer
        .push(proto::f32_tensor(&hi, &[], &[6.0]));
    b.op("Clip", name, &[input, &lo, &hi])
}

/// MobileNet-style chain: conv 3→8, ReLU6 (Clip), depthwise 3x3, Relu, pointwise 8→6, then a
/// pointwise 6→4 with no activation in between.
fn mobile_chain() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    let c1 = conv(&mut b, "c1", "x", 3, 8, 3, 1, 1);
    let r1 = clip(&mut b, "c1.relu6", &c1);
    let dw = conv(&mut b, "dw", &r1, 8, 8, 3, 8, 2);
    let r2 = b.op("Relu", "dw.relu", &[&dw]);
    let pw = conv(&mut b, "pw", &r2, 8, 6, 1, 1, 3);
    let c3 = conv(&mut b, "c3", &pw, 6, 4, 1, 1, 4);
    b.output(&c3);
    b
}

fn run(model: &Model) -> Vec<f32> {
    let probe = Probe::new(model, HW, &[]).expect("probe builds");
    let input: Vec<f32> = values(3 * HW[0] * HW[1], 7)
        .iter()
        .map(|v| v * 2.0)
        .collect();
    probe.run(&input).expect("runs").0.data
}

/// max |a - b| / max |a|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    d / scale
}

fn weight(model: &Model, name: &str) -> proto::F32Tensor {
    let g = Graph::new(model.graph());
    proto::tensor_f32(g.initializer(name).expect("weight")).expect("f32")
}

fn names(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect()
}

#[test]
fn finds_the_chain_and_keeps_the_fp32_function() {
    let m = mobile_chain().model();
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("equalizes");
    assert!(s.applied);
    assert_eq!(
        names(&s.pairs),
        vec![("c1", "dw"), ("dw", "pw"), ("pw", "c3")]
    );
    assert_eq!(s.clips_rewritten, 1);
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    let ops: Vec<&str> = eq.graph().node.iter().map(|n| n.op_type.as_str()).collect();
    assert!(!ops.contains(&"Clip") && ops.contains(&"Max") && ops.contains(&"Min"));
    // The weights did change, and the function did not.
    assert_ne!(weight(&m, "dw.w"), weight(&eq, "dw.w"));
    let d = rel_diff(&run(&m), &run(&eq));
    assert!(d < 1e-4, "relative difference {d}");
    // The Clip's output keeps its name (per-tensor plans are keyed by it).
    assert!(
        eq.graph()
            .node
            .iter()
            .any(|n| n.output[0] == "c1.relu6.out" && n.op_type == "Min")
    );
}

#[test]
fn ranges_end_up_equal_across_each_pair() {
    let m = mobile_chain().model();
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("equalizes");
    assert!(s.passes > 1, "a chain needs more than one pass");
    assert!(
        s.spread_after < s.spread_before / 3.0,
        "{} -> {}",
        s.spread_before,
        s.spread_after
    );
    for (w1, w2, g2) in [
        ("c1.w", "dw.w", 8),
        ("dw.w", "pw.w", 1),
        ("pw.w", "c3.w", 1),
    ] {
        let before = (out_ranges(&weight(&m, w1)), in_ranges(&weight(&m, w2), g2));
        let r1 = out_ranges(&weight(&eq, w1));
        let r2 = in_ranges(&weight(&eq, w2), g2);
        let unequal_before = before
            .0
            .iter()
            .zip(&before.1)
            .any(|(a, b)| (a / b - 1.0).abs() > 0.5);
        assert!(unequal_before, "{w1}/{w2} were already even: a weak test");
        for (c, (a, b)) in r1.iter().zip(&r2).enumerate() {
            assert!(
                (a / b - 1.0).abs() < 1e-2,
                "{w1} channel {c}: {a} vs {w2} {b}"
            );
        }
    }
}

#[test]
fn clip_pairs_are_skipped_when_asked_and_the_rest_equalized() {
    let m = mobile_chain().model();
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::Skip,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("equalizes");
    assert_eq!(names(&s.pairs), vec![("dw", "pw"), ("pw", "c3")]);
    assert_eq!(s.skipped.len(), 1);
    assert_eq!(
        (s.skipped[0].conv1.as_str(), s.skipped[0].conv2.as_str()),
        ("c1", "dw")
    );
    assert!(
        s.skipped[0].reason.contains("Clip"),
        "{}",
        s.skipped[0].reason
    );
    assert_eq!(s.clips_rewritten, 0);
    assert_eq!(weight(&m, "c1.w"), weight(&eq, "c1.w"), "c1 untouched");
    assert!(rel_diff(&run(&m), &run(&eq)) < 1e-4);
}

#[test]
fn off_and_auto_decide_as_documented() {
    let m = mobile_chain().model();
    let (same, s) = apply(
        &m,
        CleSetting::Off,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("off");
    assert!(!s.applied);
    assert_eq!(s.pairs.len(), 3, "off still says what it would equalize");
    assert_eq!(same.proto, m.proto);
    let (_, s) = apply(
        &m,
        CleSetting::Auto,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("auto");
    assert!(
        s.applied,
        "a depthwise pair: auto equalizes ({})",
        s.decision
    );
    // A plain conv-relu-conv chain has pairs but no depthwise conv: auto leaves it.
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    let c1 = conv(&mut b, "c1", "x", 3, 8, 3, 1, 1);
    let r = b.op("Relu", "r", &[&c1]);
    let c2 = conv(&mut b, "c2", &r, 8, 4, 3, 1, 2);
    b.output(&c2);
    let m = b.model();
    let (same, s) = apply(
        &m,
        CleSetting::Auto,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("auto");
    assert!(
        !s.applied && s.decision.contains("no depthwise"),
        "{}",
        s.decision
    );
    assert_eq!(names(&s.pairs), vec![("c1", "c2")]);
    assert_eq!(same.proto, m.proto);
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("on");
    assert!(s.applied);
    assert!(rel_diff(&run(&m), &run(&eq)) < 1e-4);
}

#[test]
fn patterns_that_are_not_equalizable_are_left_alone() {
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    // conv → Sigmoid → conv: not homogeneous.
    let a = conv(&mut b, "a", "x", 3, 8, 3, 1, 1);
    let sg = b.op("Sigmoid", "a.sig", &[&a]);
    // conv → two readers (a branch): its channels cannot be rescaled for one of them.
    let br = conv(&mut b, "br", &sg, 8, 8, 3, 1, 2);
    let r = b.op("Relu", "br.relu", &[&br]);
    let l = conv(&mut b, "left", &r, 8, 4, 1, 1, 3);
    let rt = conv(&mut b, "right", &r, 8, 4, 1, 1, 4);
    // conv → Add (residual): not a conv pair.
    let add = b.op("Add", "add", &[&l, &rt]);
    let z = conv(&mut b, "z", &add, 4, 4, 1, 1, 5);
    // z's output is a graph output and also read by the last conv.
    let last = conv(&mut b, "last", &z, 4, 2, 1, 1, 6);
    b.output(&z);
    b.output(&last);
    let m = b.model();
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("runs");
    assert!(s.pairs.is_empty(), "{:?}", s.pairs);
    assert!(!s.applied);
    assert_eq!(eq.proto, m.proto);
}

#[test]
fn shared_weights_are_skipped_with_the_reason() {
    let mut b = GraphBuilder::new(&[1, 8, HW[0], HW[1]]);
    let c1 = conv(&mut b, "c1", "x", 8, 8, 1, 1, 1);
    let r = b.op("Relu", "r", &[&c1]);
    let c2 = conv(&mut b, "c2", &r, 8, 8, 1, 1, 2);
    // A third conv reuses c2's weight.
    let out = "c3.out".to_string();
    b.graph.node.push(proto::node(
        "Conv",
        "c3",
        &[&c2, "c2.w"],
        &[&out],
        vec![proto::ints_attr("kernel_shape", &[1, 1])],
    ));
    b.output(&out);
    let m = b.model();
    let (_, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("runs");
    assert!(s.pairs.is_empty(), "{:?}", s.pairs);
    assert_eq!(s.skipped.len(), 2, "{:?}", s.skipped);
    assert!(s.skipped.iter().all(|p| p.reason.contains("shared")));
}

#[test]
fn dead_channels_keep_their_scale() {
    // Channel 0 of c1 has zero weights and a bias: it outputs a constant. Dividing it by a
    // tiny s would turn that constant into the activation's whole range.
    let mut b = mobile_chain();
    let w = b
        .graph
        .initializer
        .iter_mut()
        .find(|t| t.name == "c1.w")
        .expect("c1.w");
    let mut t = proto::tensor_f32(w).expect("f32");
    let per = t.data.len() / t.dims[0];
    t.data[..per].iter_mut().for_each(|v| *v = 0.0);
    *w = proto::f32_tensor("c1.w", &t.dims, &t.data);
    let m = b.model();
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Weights,
        &HashMap::new(),
    )
    .expect("equalizes");
    assert!(s.applied);
    assert_eq!(weight(&m, "c1.b").data[0], weight(&eq, "c1.b").data[0]);
    assert_ne!(weight(&m, "c1.b").data[1], weight(&eq, "c1.b").data[1]);
    assert!(rel_diff(&run(&m), &run(&eq)) < 1e-4);
}

#[test]
fn activation_rule_evens_the_activation_into_a_depthwise_conv() {
    let m = mobile_chain().model();
    // Per-channel ranges of the ReLU6 output that feeds the depthwise conv: very uneven.
    let a: Vec<f32> = (0..8).map(|c| 0.05 + c as f32 * 0.7).collect();
    let ranges: HashMap<String, Vec<f32>> = [("c1.relu6.out".to_string(), a.clone())].into();
    assert_eq!(
        between_tensors(&m, ClipPolicy::PerChannel)[0],
        ("c1.relu6.out".to_string(), 8)
    );
    let mut max = vec![0.0, 3.5];
    channel_max(&[1.0, -3.0, 2.0, 0.5, -0.5, 3.0, 0.0, 1.0], 2, &mut max);
    assert_eq!(
        max,
        vec![3.0, 3.5],
        "running max per channel of [1, 2, 2, 2]"
    );
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Activations,
        &ranges,
    )
    .expect("equalizes");
    assert_eq!(s.activation_scaled, 1, "only c1 -> dw had ranges");
    // The per-channel clip bound is 6 / s_i, so A_i / s_i = A_i * hi_i / 6 is the channel's
    // range after scaling: the same for every channel.
    let hi = weight(&eq, "c1.relu6_cle_hi").data;
    let after: Vec<f32> = a.iter().zip(&hi).map(|(a, h)| a * h / 6.0).collect();
    for v in &after {
        assert!((v / after[0] - 1.0).abs() < 1e-3, "{after:?}");
    }
    assert!(rel_diff(&run(&m), &run(&eq)) < 1e-4);
}

#[test]
fn auto_leaves_depthwise_pairs_with_relu6_alone() {
    // conv, ReLU6, depthwise, ReLU6, pointwise: DeepLabV3-MobileNetV2's blocks.
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    let c1 = conv(&mut b, "c1", "x", 3, 8, 3, 1, 1);
    let r1 = clip(&mut b, "c1.relu6", &c1);
    let dw = conv(&mut b, "dw", &r1, 8, 8, 3, 8, 2);
    let r2 = clip(&mut b, "dw.relu6", &dw);
    let pw = conv(&mut b, "pw", &r2, 8, 4, 1, 1, 3);
    b.output(&pw);
    let m = b.model();
    let none = HashMap::new();
    let (same, s) = apply(
        &m,
        CleSetting::Auto,
        ClipPolicy::PerChannel,
        ScaleRule::Activations,
        &none,
    )
    .expect("auto");
    assert!(!s.applied && s.decision.contains("Clip"), "{}", s.decision);
    assert_eq!(same.proto, m.proto);
    let (eq, s) = apply(
        &m,
        CleSetting::On,
        ClipPolicy::PerChannel,
        ScaleRule::Activations,
        &none,
    )
    .expect("on");
    assert_eq!((s.pairs.len(), s.clips_rewritten), (2, 2));
    assert_eq!(s.activation_scaled, 0, "no ranges given: the weight rule");
    assert!(rel_diff(&run(&m), &run(&eq)) < 1e-4);
}
