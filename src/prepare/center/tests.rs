//! Activation centering on small graphs built in code: which tensors it shifts and why not,
//! that the float function is unchanged, that the INT8 error of a centered tensor halves, and
//! that GPTQ keeps the shift exact for the weights it rounds.

use super::*;
use crate::backend::cpu::Probe;
use crate::backend::{BackendKind, BuildInput, BuildSpec, backend};
use crate::calib::{Method, Stats};
use crate::model::testing::{GraphBuilder, values};
use crate::quant;

const HW: [usize; 2] = [10, 10];

fn clip6(b: &mut GraphBuilder, name: &str, input: &str) -> String {
    let lo = b.constant(&format!("{name}.lo"), &[], &[0.0]);
    let hi = b.constant(&format!("{name}.hi"), &[], &[6.0]);
    b.op("Clip", name, &[input, &lo, &hi])
}

/// conv a (3x3) -> Clip(0, 6) -> conv b (1x1), and conv c (3x3) -> Relu -> depthwise conv d
/// (3x3, zero padding), added.
fn two_branches() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    let a = b.conv("a", "x", 3, 8, 3);
    let t = clip6(&mut b, "a.relu6", &a);
    let pb_ = b.conv("b", &t, 8, 8, 1);
    let c = b.conv("c", "x", 3, 8, 3);
    let r = b.op("Relu", "c.relu", &[&c]);
    let d = b.depthwise("d", &r, 8);
    let y = b.op("Add", "add", &[&pb_, &d]);
    b.output(&y);
    b
}

/// Inputs on a 2/127 grid reaching ±2, so that the graph input's per-tensor int8 quantization
/// (amax 2) is exact.
fn grid_inputs(n: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            let mut v: Vec<f32> = values(3 * HW[0] * HW[1], 40 + i as u64)
                .iter()
                .map(|v| (v.clamp(-1.0, 1.0) * 127.0).round() * 2.0 / 127.0)
                .collect();
            v[0] = 2.0;
            v
        })
        .collect()
}

/// Each output channel's weights moved onto its int8 grid (max |w| / 127), so that rounding
/// them is exact and only activations carry quantization error.
fn snap_weights(b: &mut GraphBuilder, names: &[&str]) {
    for t in b.graph.initializer.iter_mut() {
        if !names.contains(&t.name.as_str()) {
            continue;
        }
        let mut w = proto::tensor_f32(t).expect("f32");
        let per = w.data.len() / w.dims[0];
        for ch in w.data.chunks_mut(per) {
            let s = ch.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            ch.iter_mut().for_each(|v| *v = (*v / s).round() * s);
        }
        *t = proto::f32_tensor(&t.name, &w.dims, &w.data);
    }
}

fn maxima(model: &Model, inputs: &[Vec<f32>]) -> HashMap<String, f32> {
    let names = tensors(model);
    let probe = Probe::new(model, HW, &names).expect("probe");
    let mut out: HashMap<String, f32> = HashMap::new();
    for x in inputs {
        let (_, acts) = probe.run(x).expect("runs");
        for (n, a) in names.iter().zip(&acts) {
            let m = a.as_ref().iter().fold(0f32, |m, v| m.max(*v));
            let e = out.entry(n.clone()).or_default();
            *e = e.max(m);
        }
    }
    out
}

/// `model` centered (on) by its maxima on `inputs`.
fn centered_on(model: &Model, inputs: &[Vec<f32>]) -> (Model, CenterSummary) {
    apply(model, CenterSetting::On, &maxima(model, inputs)).expect("applies")
}

fn fp32(model: &Model, x: &[f32]) -> Vec<f32> {
    Probe::new(model, HW, &[])
        .expect("probe")
        .run(x)
        .expect("runs")
        .0
        .data
}

/// Output SQNR (dB) against FP32 of `model`'s INT8 CPU engine, max calibration on `inputs`.
fn int8_sqnr(model: &Model, reference: &Model, inputs: &[Vec<f32>]) -> f64 {
    let plan = quant::plan(model, &[]);
    let probe = Probe::new(model, HW, &plan.tensors()).expect("probe");
    let mut stats = Stats::new("test".into(), &plan.tensors());
    for x in inputs {
        let (_, acts) = probe.run(x).expect("probe run");
        stats.add(&plan.tensors(), &acts);
    }
    let ranges = stats.ranges(Method::Max, 99.99);
    let qdq = quant::build_qdq(model, &plan, Some(&ranges)).expect("qdq");
    let mut engine = backend(BackendKind::Cpu)
        .build(
            BuildInput::Quantized {
                model,
                qdq: &qdq,
                keep_fp32: &[],
            },
            BuildSpec { batch: 1, hw: HW },
        )
        .expect("int8 engine");
    let (mut signal, mut noise) = (0f64, 0f64);
    for x in inputs {
        let want = fp32(reference, x);
        let got = engine.run(x).expect("int8 runs").data;
        for (a, b) in want.iter().zip(&got) {
            signal += (*a as f64).powi(2);
            noise += (*a as f64 - *b as f64).powi(2);
        }
    }
    10.0 * (signal / noise).log10()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn centers_tensors_read_by_1x1_and_padded_convs_and_pads_with_minus_c() {
    let model = two_branches().model();
    assert_eq!(
        tensors(&model),
        vec!["a.relu6.out".to_string(), "c.relu.out".to_string()]
    );
    let inputs = grid_inputs(8);
    let (centered, summary) = centered_on(&model, &inputs);
    assert_eq!(summary.centered.len(), 2, "{summary:?}");
    let c = &summary.centered[0];
    assert_eq!(c.tensor, "a.relu6.out");
    assert!(c.shift > 0.0 && c.shift <= 3.0, "{c:?}");
    assert!(summary.skipped.is_empty(), "{:?}", summary.skipped);
    assert_eq!(summary.padded, vec!["d".to_string()]);
    assert!(summary.note().contains("2 non-negative activations"));
    assert!(
        summary
            .note()
            .contains("1 depthwise readers with zero padding")
    );
    let s = shifts(&centered.proto);
    assert_eq!(s.get("a.relu6.out"), Some(&c.shift));
    // The padded reader reads a Pad of the shifted tensor with value -c, and pads nothing.
    let relu_c = &summary.centered[1];
    let g = centered.graph();
    let d = g.node.iter().find(|n| n.name == "d").expect("d");
    assert_eq!(
        s.get(&d.input[0]),
        Some(&relu_c.shift),
        "the Pad output is shifted too"
    );
    assert!(proto::attr_ints(d, "pads").is_none_or(|p| p.iter().all(|&v| v == 0)));
    let pad = g
        .node
        .iter()
        .position(|n| n.op_type == "Pad" && n.output[0] == d.input[0])
        .expect("a Pad before d");
    assert!(pad < g.node.iter().position(|n| n.name == "d").expect("d"));
    let value = centered
        .initializer(&g.node[pad].input[2])
        .expect("pad value")
        .data[0];
    assert_eq!(value, -relu_c.shift);
    // Off changes nothing.
    let (same, off) = apply(&model, CenterSetting::Off, &HashMap::new()).expect("off");
    assert!(!off.applied());
    assert_eq!(same.proto, model.proto);
    // The float function is the same, border pixels included.
    for x in &inputs {
        let d = max_rel_diff(&fp32(&model, x), &fp32(&centered, x));
        assert!(d < 1e-5, "centering changed the FP32 output by {d}");
    }
}

/// A dense conv with zero padding leaves its tensor alone (the CUDA engine would run its Pad
/// as a pass of its own), and the summary says why.
#[test]
fn a_dense_conv_with_zero_padding_is_left_alone_and_said_why() {
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    let a = b.conv("a", "x", 3, 8, 3);
    let t = b.op("Relu", "a.relu", &[&a]);
    let y = b.conv("dense", &t, 8, 4, 3);
    b.output(&y);
    let model = b.model();
    assert!(tensors(&model).is_empty());
    let (_, summary) = centered_on(&model, &grid_inputs(2));
    assert!(!summary.applied());
    assert!(
        summary.skipped[0]
            .1
            .contains("a dense conv with zero padding"),
        "{:?}",
        summary.skipped
    );
}

#[test]
fn a_conv_with_automatic_padding_is_left_alone_and_said_why() {
    let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
    let a = b.conv("a", "x", 3, 8, 3);
    let t = b.op("Relu", "a.relu", &[&a]);
    let y = b.conv("b", &t, 8, 4, 3);
    for n in b.graph.node.iter_mut().filter(|n| n.name == "b") {
        n.attribute.retain(|a| a.name != "pads");
        n.attribute.push(proto::str_attr("auto_pad", "SAME_UPPER"));
    }
    b.output(&y);
    let model = b.model();
    let (_, summary) =
        apply(&model, CenterSetting::On, &maxima(&model, &grid_inputs(2))).expect("applies");
    assert!(!summary.applied());
    assert!(
        summary.skipped[0].1.contains("automatic padding"),
        "{:?}",
        summary.skipped
    );
}

#[test]
fn the_int8_error_of_a_centered_tensor_halves() {
    // Inputs and weights exact in int8: the Clip output's rounding is the only error on the
    // centered branch, so halving its step should gain about 6 dB there.
    // The reader is a 1x1 conv, then a 3x3 depthwise one with zero padding (through the Pad).
    for k in [1, 3] {
        let mut b = GraphBuilder::new(&[1, 3, HW[0], HW[1]]);
        let a = b.conv("a", "x", 3, 8, 3);
        let t = clip6(&mut b, "a.relu6", &a);
        let y = match k {
            1 => b.conv("b", &t, 8, 4, 1),
            _ => b.depthwise("b", &t, 8),
        };
        b.output(&y);
        snap_weights(&mut b, &["a.w", "b.w"]);
        let model = b.model();
        let inputs = grid_inputs(8);
        let (centered, summary) = centered_on(&model, &inputs);
        assert!(summary.applied());
        assert_eq!(summary.padded.len(), k / 3);
        let before = int8_sqnr(&model, &model, &inputs);
        let after = int8_sqnr(&centered, &model, &inputs);
        assert!(
            after > before + 4.5,
            "{k}x{k} reader: INT8 SQNR {before:.1} dB uncentered, {after:.1} dB centered"
        );
    }
}

#[test]
fn gptq_keeps_the_shift_exact_for_the_weights_it_rounds() {
    let model = two_branches().model();
    let inputs = grid_inputs(8);
    let (centered, _) = centered_on(&model, &inputs);
    let plan = quant::plan(&centered, &[]);
    assert!(plan.centered.contains_key("a.relu6.out"));
    let shapes = crate::model::infer_shapes(&centered, HW).expect("shapes");
    let (layers, _) = crate::prepare::gptq::layers(&centered, &plan, &shapes);
    let layer = layers
        .into_iter()
        .find(|l| l.node == "b")
        .expect("b is rounded");
    assert!(layer.center > 0.0);
    let probe = Probe::new(&centered, HW, std::slice::from_ref(&layer.input)).expect("probe");
    let mut m = crate::prepare::gptq::Moments::new(&layer);
    for x in &inputs {
        let (_, acts) = probe.run(x).expect("runs");
        m.add(&layer, acts[0].as_ref(), inputs.len());
    }
    let mut rounded = centered.proto.clone();
    let mut originals = crate::prepare::gptq::FloatWeights::default();
    crate::prepare::gptq::round_layer(&mut rounded, &layer, m, &mut originals).expect("rounds");
    let rounded = Model::from_bytes(&centered.path, &rounded.encode_to_vec()).expect("loads");
    // Restoring the layer brings back its float weights and the bias before the rounding
    // fold: the centered FP32 model, bit for bit.
    let restored = originals.restore(&rounded, ["b"]);
    assert!(rounded.proto != centered.proto, "GPTQ changed the layer");
    assert!(
        restored.proto == centered.proto,
        "restored: the centered model as it was before rounding"
    );
    // The uncentered model given the same rounded weights computes the same function.
    let mut plain = model.proto.clone();
    let gp = plain.graph.as_mut().expect("graph");
    let w = rounded.initializer("b.w").expect("rounded weight");
    for t in gp.initializer.iter_mut().filter(|t| t.name == "b.w") {
        *t = proto::f32_tensor("b.w", &w.dims, &w.data);
    }
    let plain = Model::from_bytes(&model.path, &plain.encode_to_vec()).expect("loads");
    assert_ne!(w.data, model.initializer("b.w").expect("w").data);
    for x in &inputs {
        let d = max_rel_diff(&fp32(&plain, x), &fp32(&rounded, x));
        assert!(d < 1e-5, "rounded centered model differs by {d}");
    }
}
