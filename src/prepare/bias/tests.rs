//! Bias correction on a small conv chain whose quantization shifts add up in depth.

use tract_onnx::pb;

use super::*;
use crate::backend::cpu::Probe;
use crate::calib::Method;
use crate::model::testing::{GraphBuilder, values};

/// Five 3x3 convs with ReLUs between, the third in a residual block (its output added to its
/// input, as ResNets do): deep enough that upstream shifts reach the last layers.
fn chain() -> Model {
    let mut b = GraphBuilder::new(&[1, 3, 12, 12]);
    let mut x = "x".to_string();
    let mut cin = 3;
    for i in 0..5 {
        let mut c = b.conv(&format!("conv{i}"), &x, cin, 6, 3);
        if i == 2 {
            c = b.op("Add", "residual", &[&c, &x]);
        }
        x = if i < 4 {
            b.op("Relu", &format!("relu{i}"), &[&c])
        } else {
            c
        };
        cin = 6;
    }
    b.output(&x);
    b.model()
}

fn inputs(n: usize) -> Vec<Vec<f32>> {
    // Mostly positive images, as normalised photos are, so means are far from zero.
    (0..n)
        .map(|i| {
            values(3 * 12 * 12, 100 + i as u64)
                .iter()
                .map(|v| v * 0.8 + 0.4)
                .collect()
        })
        .collect()
}

/// Clipping ranges (amax 0.4x each tensor's FP32 maximum over `inputs`): clipped activations
/// lower every layer's mean, as percentile or MSE ranges do on real models, and the shift
/// grows layer after layer.
fn clipping_ranges(m: &Model, plan: &QuantPlan, inputs: &[Vec<f32>]) -> Ranges {
    let tensors = plan.tensors();
    let fp32 = Probe::from_graph(&m.with_fixed_input(1, HW), m.input_shape(1, HW), &tensors)
        .expect("fp32 model");
    let mut amax: BTreeMap<String, f32> = BTreeMap::new();
    for x in inputs {
        for (t, v) in tensors.iter().zip(outputs_of(&fp32, x).expect("run")) {
            let a = v.iter().fold(0.0f32, |a, b| a.max(b.abs()));
            let e = amax.entry(t.clone()).or_default();
            *e = e.max(a * 0.4);
        }
    }
    Ranges {
        method: Method::Max,
        percentile: 99.99,
        amax,
        bias_correction: BTreeMap::new(),
    }
}

const HW: [usize; 2] = [12, 12];

/// Per output channel of `node`'s output (one image), adds the mean of `values` to `sums`,
/// sized on first use.
fn accumulate_channel_means(model: &Model, node: &str, values: &[f32], sums: &mut Vec<f64>) {
    let means = ChannelLayout::of(model, node, values.len()).means(values);
    if sums.is_empty() {
        *sums = vec![0.0; means.len()];
    }
    for (s, m) in sums.iter_mut().zip(means) {
        *s += m;
    }
}

/// Mean over every corrected layer and channel of |FP32 mean - quantized-model mean|, the
/// quantized model being the CPU int8 engine's graph with `ranges`' corrections in its biases.
fn residual(m: &Model, plan: &QuantPlan, ranges: &Ranges, inputs: &[Vec<f32>]) -> f64 {
    let convs: Vec<String> = (0..5).map(|i| format!("conv{i}")).collect();
    let outs: Vec<String> = convs.iter().map(|c| format!("{c}.out")).collect();
    let means = |p: &pb::ModelProto| -> Vec<Vec<f64>> {
        let e = Probe::from_graph(p, m.input_shape(1, HW), &outs).expect("engine");
        let mut sums: Vec<Vec<f64>> = vec![vec![]; convs.len()];
        for x in inputs {
            for (k, o) in outputs_of(&e, x).expect("run").iter().enumerate() {
                accumulate_channel_means(m, &convs[k], o, &mut sums[k]);
            }
        }
        sums
    };
    let fp = means(&m.with_fixed_input(1, HW));
    let qdq = Model {
        proto: quant::build_qdq(m, plan, Some(ranges)).expect("qdq").proto,
        ..m.clone()
    };
    let q = means(
        &lower_qdq(&qdq.with_fixed_input(1, HW))
            .expect("lowered")
            .proto,
    );
    let (mut total, mut count) = (0.0, 0);
    for (a, b) in fp.iter().flatten().zip(q.iter().flatten()) {
        total += (a - b).abs() / inputs.len() as f64;
        count += 1;
    }
    total / count as f64
}

/// On the 5-conv chain with clipping ranges, 8 inputs: the residual mean error without
/// correction, the correction `correct` makes, and the residual with it.
fn chain_corrected(
    correct: impl Fn(&Fp32Reference, &QuantPlan, &Ranges) -> BiasCorrection,
) -> (f64, BiasCorrection, f64) {
    let m = chain();
    let plan = quant::plan(&m, &[]);
    let xs = inputs(8);
    let mut r = clipping_ranges(&m, &plan, &xs);
    let none = residual(&m, &plan, &r, &xs);
    let reference = Fp32Reference::new(&m, HW, &plan, &xs).expect("fp32 reference");
    let bc = correct(&reference, &plan, &r);
    r.bias_correction = bc.shifts.clone();
    let after = residual(&m, &plan, &r, &xs);
    (none, bc, after)
}

#[test]
fn sequential_correction_gives_the_whole_quantized_model_the_fp32_means() {
    let (none, bc, full) =
        chain_corrected(|reference, plan, r| bias_correction(reference, plan, r).expect("full"));
    assert_eq!(
        bc.batch, 8,
        "the chain runs at any batch: one batch of all inputs"
    );
    assert_eq!(bc.kind, CorrectionKind::Full, "{bc:?}");
    // On this chain the two corrections bring the output equally close (to 1e-6 dB).
    let (per_layer, full_db) = (
        bc.sqnr_db[1].expect("measured"),
        bc.sqnr_db[2].expect("measured"),
    );
    assert!(
        full_db > per_layer - 1e-3,
        "full is as close as per-layer: {bc:?}"
    );
    assert_eq!(bc.shifts.len(), 5, "every conv gets a shift");
    assert!(
        none > 1e-3,
        "the clipping ranges must shift the means: {none}"
    );
    // One batch: every layer corrected with its inputs final, so what is left is float rounding.
    assert!(full < 1e-4 * none, "none {none}, full {full}");
}

#[test]
fn in_smaller_batches_the_running_mean_still_removes_most_of_the_shift() {
    let (none, bc, one_by_one) = chain_corrected(|reference, plan, r| {
        correct_in_batches(reference, plan, r, Some(1)).expect("full")
    });
    assert_eq!(bc.batch, 1);
    assert_eq!(bc.kind, CorrectionKind::Full, "{bc:?}");
    assert!(
        one_by_one < 0.05 * none,
        "none {none}, one by one {one_by_one}"
    );
}

#[test]
fn a_model_fixed_at_batch_1_is_corrected_one_image_at_a_time() {
    // conv -> Reshape to [1, 864]: a shape exporters write out in full, which no batch of 8 fits.
    let mut b = GraphBuilder::new(&[1, 3, 12, 12]);
    let c = b.conv("conv0", "x", 3, 6, 3);
    let r = b.op("Relu", "relu0", &[&c]);
    let c = b.conv("conv1", &r, 6, 6, 3);
    let shape = b.ints("shape", &[2], &[1, 6 * 12 * 12]);
    let y = b.op("Reshape", "flat", &[&c, &shape]);
    b.output(&y);
    let m = b.model();
    let plan = quant::plan(&m, &[]);
    let xs = inputs(8);
    let r = clipping_ranges(&m, &plan, &xs);
    let reference = Fp32Reference::new(&m, HW, &plan, &xs).expect("fp32 reference");
    let bc = bias_correction(&reference, &plan, &r).expect("full");
    assert_eq!(bc.batch, 1);
    assert_eq!(bc.shifts.len(), 2, "{bc:?}");
    assert!(bc.shifts.values().flatten().any(|s| s.abs() > 1e-4));
}

/// Per-image SQNR (dB) for none, per-layer and full: `gain` added to one of them on every
/// image, on a spread of image SQNRs.
fn measured(per_layer_gain: f64, none_gain: f64) -> [Vec<f64>; 3] {
    let full: Vec<f64> = (0..32).map(|i| 25.0 + (i % 7) as f64).collect();
    let plus = |g: f64| full.iter().map(|x| x + g).collect::<Vec<_>>();
    [plus(none_gain), plus(per_layer_gain), full]
}

#[test]
fn full_correction_stays_unless_another_wins_by_the_margin() {
    let shifts = || vec![vec![0.0]];
    // +1.2 dB on every image (DeepLabV3's max ranges): consistent, but under the 2 dB floor.
    let (kind, _, d) = choose(&measured(1.2, -1.0), shifts(), shifts());
    assert_eq!(kind, CorrectionKind::Full, "{d:?}");
    assert_eq!(d.challenger, CorrectionKind::PerLayer);
    assert!(
        d.describe(kind).contains("full kept (the default)"),
        "{}",
        d.describe(kind)
    );
    // +4.4 dB (the bundled classifier's MSE ranges): per-layer.
    let (kind, shifts_kept, _) = choose(&measured(4.4, -1.0), shifts(), shifts());
    assert_eq!(kind, CorrectionKind::PerLayer);
    assert!(shifts_kept.is_some());
    // No correction 5.5 dB closer (entropy ranges there): none, with no shifts.
    let (kind, shifts_kept, d) = choose(&measured(0.5, 5.5), shifts(), shifts());
    assert_eq!(
        (kind, d.challenger),
        (CorrectionKind::None, CorrectionKind::None)
    );
    assert!(shifts_kept.is_none());
}

#[test]
fn a_large_gain_on_a_few_images_is_noise() {
    // +16 dB on 4 of 32 images, -1 on the rest: a mean of +1.1 dB with a standard error of
    // about 1.1 dB: the margin (2.2 dB) keeps full.
    let full: Vec<f64> = vec![30.0; 32];
    let per_layer: Vec<f64> = (0..32).map(|i| if i < 4 { 46.0 } else { 29.0 }).collect();
    let (kind, _, d) = choose(&[full.clone(), per_layer, full.clone()], vec![], vec![]);
    assert_eq!(kind, CorrectionKind::Full, "{d:?}");
    assert!(d.gain.margin(CHOICE_FLOOR_DB) > d.gain.mean);
}
