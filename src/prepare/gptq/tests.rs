use super::*;
use crate::model::testing::{residual_classifier, values};
use crate::quant;

/// `n` rows of `d` correlated inputs (a random mix of a few sources), row-major.
fn correlated_inputs(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let sources = 4;
    let mix = values(sources * d, seed);
    let z = values(n * sources, seed + 1);
    (0..n * d)
        .map(|i| {
            let (r, c) = (i / d, i % d);
            (0..sources)
                .map(|s| z[r * sources + s] * mix[s * d + c])
                .sum::<f32>()
                + 0.05 * values(1, seed + 2 + i as u64)[0]
        })
        .collect()
}

/// Σ over samples of |(W - Q) x|².
fn output_error(w: &[f32], q: &[f32], x: &[f32], d: usize) -> f64 {
    let rows = w.len() / d;
    x.chunks(d)
        .map(|xs| {
            (0..rows)
                .map(|r| {
                    let e: f64 = (0..d)
                        .map(|c| (w[r * d + c] - q[r * d + c]) as f64 * xs[c] as f64)
                        .sum();
                    e * e
                })
                .sum::<f64>()
        })
        .sum()
}

/// H = Σ x xᵀ over the rows of `x` (`d` wide), and each row of `w`'s scale, max |w| / 127.
fn moment_and_scales(w: &[f32], x: &[f32], d: usize) -> (Vec<f64>, Vec<f32>) {
    let mut h = vec![0.0f64; d * d];
    for xs in x.chunks(d) {
        for i in 0..d {
            for j in 0..d {
                h[i * d + j] += xs[i] as f64 * xs[j] as f64;
            }
        }
    }
    let scales = w
        .chunks(d)
        .map(|r| r.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0)
        .collect();
    (h, scales)
}

#[test]
fn gptq_rounds_to_the_grid_keeps_scales_and_beats_nearest_on_the_output() {
    let (rows, d, n) = (6, 24, 400);
    let w = values(rows * d, 11);
    let x = correlated_inputs(n, d, 21);
    let (h, scales) = moment_and_scales(&w, &x, d);
    let mut q = w.clone();
    round_problem(&mut q, d, &scales, &h).expect("positive definite");
    let nearest: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, v)| (v / scales[i / d]).round_ties_even().clamp(-127.0, 127.0) * scales[i / d])
        .collect();
    for (r, row) in q.chunks(d).enumerate() {
        let s = scales[r];
        for v in row {
            let k = v / s;
            assert!(
                (k - k.round()).abs() < 1e-4 && k.abs() <= 127.0 + 1e-4,
                "{v} is not on the grid of {s}"
            );
        }
        // The row's largest weight keeps ±127, so the per-channel scale is unchanged.
        let top = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            (top / s - 127.0).abs() < 1e-3,
            "row {r}: max {top} vs scale {s}"
        );
    }
    let (e_gptq, e_near) = (
        output_error(&w, &q, &x, d),
        output_error(&w, &nearest, &x, d),
    );
    assert!(
        e_gptq < 0.7 * e_near,
        "GPTQ output error {e_gptq} should be well under nearest's {e_near}"
    );
}

/// Act order: where a few inputs carry most of the energy (outlier channels, as activations
/// have), rounding their columns first leaves the most columns to take their error, and the
/// layer's output error comes out below GPTQ's in the natural column order.
#[test]
fn act_order_beats_the_natural_order_where_a_few_inputs_carry_the_energy() {
    let (rows, d, n) = (8, 32, 600);
    let w = values(rows * d, 5);
    // Correlated inputs with every fourth column from the back scaled up 12x.
    let mut x = correlated_inputs(n, d, 7);
    for xs in x.chunks_mut(d) {
        for c in (3..d).step_by(4) {
            xs[d - 1 - c] *= 12.0;
        }
    }
    let (h, scales) = moment_and_scales(&w, &x, d);
    let mut natural = w.clone();
    let u = inverse_factor(&mut h.clone(), d).expect("positive definite");
    round_rows(&mut natural, d, &scales, &u);
    let mut ordered = w.clone();
    round_problem(&mut ordered, d, &scales, &h).expect("positive definite");
    let (e_natural, e_ordered) = (
        output_error(&w, &natural, &x, d),
        output_error(&w, &ordered, &x, d),
    );
    eprintln!("output error: natural order {e_natural:.4e}, act order {e_ordered:.4e}");
    assert!(
        e_ordered < e_natural,
        "act order {e_ordered} should be under the natural order's {e_natural}"
    );
}

#[test]
fn the_rounded_model_quantizes_to_the_same_scales_and_integers() {
    let model = residual_classifier(10).model();
    let plan = quant::plan(&model, &[]);
    let shapes = crate::model::infer_shapes(&model, [16, 16]).expect("shapes");
    let (layers, skipped) = layers(&model, &plan, &shapes);
    // Three convs and the Gemm head.
    assert_eq!(layers.len(), 4, "{skipped:?}");
    let mut proto = model.proto.clone();
    let mut originals = FloatWeights::default();
    for l in &layers {
        let mut m = Moments::new(l);
        // Any positive definite moments will do for the grid property.
        let d = l.row();
        for h in &mut m.h {
            for i in 0..d {
                h[i * d + i] = 1.0 + i as f64;
                if i + 1 < d {
                    h[i * d + i + 1] = 0.3;
                    h[(i + 1) * d + i] = 0.3;
                }
            }
        }
        round_layer(&mut proto, l, m, &mut originals).expect("rounds");
    }
    let rounded = Model {
        proto,
        ..model.clone()
    };
    // What GPTQ replaced is recorded, and a restored layer computes with its float weights
    // again; the other layers stay rounded.
    let names: Vec<&str> = layers.iter().map(|l| l.node.as_str()).collect();
    assert_eq!(originals.nodes().collect::<Vec<_>>().len(), names.len());
    let (kept, rest) = (&layers[0], &layers[1..]);
    let one = originals.restore(&rounded, [kept.node.as_str()]);
    assert_eq!(
        one.initializer(&kept.weight).expect("weight").data,
        model.initializer(&kept.weight).expect("weight").data,
        "{}: the float weights are back, bit for bit",
        kept.node
    );
    for l in rest {
        assert_eq!(
            one.initializer(&l.weight).expect("weight").data,
            rounded.initializer(&l.weight).expect("weight").data,
            "{}: not asked for, still rounded",
            l.node
        );
        assert_ne!(
            one.initializer(&l.weight).expect("weight").data,
            model.initializer(&l.weight).expect("weight").data,
            "{}: GPTQ moved it",
            l.node
        );
    }
    let all = originals.restore_all(&rounded);
    assert!(
        all.proto == model.proto,
        "every float weight back: the FP32 model"
    );
    for wq in &plan.weights {
        let (before, after) = (
            model.initializer(&wq.tensor).expect("weight"),
            rounded.initializer(&wq.tensor).expect("weight"),
        );
        let (_, s0) = quant::quantize_weight(&before, wq.axis);
        let (k1, s1) = quant::quantize_weight(&after, wq.axis);
        for (a, b) in s0.iter().zip(&s1) {
            assert!(
                (a - b).abs() <= 1e-6 * a.abs(),
                "{}: scale {a} became {b}",
                wq.tensor
            );
        }
        // The rounded values are exactly the int8 steps the Q/DQ model stores.
        let channels = s1.len();
        let inner = after.data.len() / channels;
        let per_channel = |i: usize| match wq.axis {
            0 => i / inner,
            _ => i % channels,
        };
        for (i, v) in after.data.iter().enumerate() {
            let back = k1[i] as f32 * s1[per_channel(i)];
            assert!(
                (v - back).abs() <= 1e-5 * v.abs().max(1e-3),
                "{}[{i}]: {v} vs {back}",
                wq.tensor
            );
        }
    }
}
