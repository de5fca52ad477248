//! Sensitivity and mixed precision on small graphs whose answer is known: a layer fed by a
//! tensor with a huge outlier ranks first; a budget FP32 meets trivially keeps no layer in
//! float; an impossible budget keeps them all and says so.

mod common;

use quantscope::backend::{BackendKind, BuildInput, BuildSpec, Precision, backend};
use quantscope::calib::{Method, StatsCache};
use quantscope::data;
use quantscope::experiment::Experiment;
use quantscope::model::proto;
use quantscope::model::testing::GraphBuilder;
use quantscope::pipeline::{CancelToken, Sink};
use quantscope::sensitivity::{self, Budget, SensitivityOptions};

struct Quiet;
impl Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

/// conv1 -> relu -> conv2 -> relu -> (+ a constant with one value of 5000 in channel 0) ->
/// conv3 -> relu -> head. conv3 ignores channel 0 (its weights there are zero), so FP32 never
/// sees the outlier, but conv3's input range (max calibration) is set by it.
fn outlier_model() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let c1 = b.conv("conv1", "x", 3, 8, 3);
    let r1 = b.op("Relu", "relu1", &[&c1]);
    let c2 = b.conv("conv2", &r1, 8, 8, 3);
    let r2 = b.op("Relu", "relu2", &[&c2]);
    let mut bump = vec![0f32; 8 * 16 * 16];
    bump[5] = 5000.0;
    b.graph
        .initializer
        .push(proto::f32_tensor("bump", &[1, 8, 16, 16], &bump));
    let a = b.op("Add", "outlier", &[&r2, "bump"]);
    let c3 = b.conv("conv3", &a, 8, 8, 3);
    let w = b
        .graph
        .initializer
        .iter_mut()
        .find(|t| t.name == "conv3.w")
        .expect("conv3 weight");
    let mut wv = proto::tensor_f32(w).expect("f32").data;
    for o in 0..8 {
        for k in 0..9 {
            wv[o * 72 + k] = 0.0;
        }
    }
    *w = proto::f32_tensor("conv3.w", &[8, 8, 3, 3], &wv);
    let r3 = b.op("Relu", "relu3", &[&c3]);
    let y = b.head(&r3, 8, 4);
    b.output(&y);
    b
}

/// Writes the model, 16 calibration images and an ImageFolder labelled with the FP32 model's
/// own predictions (so FP32 scores 100 % and every INT8 error shows in the metric).
fn setup(name: &str) -> (Experiment, StatsCache) {
    let dir = common::temp_dir(name);
    let b = outlier_model();
    let model_path = dir.join("model.onnx");
    std::fs::write(&model_path, b.to_bytes(13)).expect("model");
    common::image_folder(&dir.join("calib"), 16, 16, 3);
    let mut exp = Experiment {
        model: model_path.clone(),
        ..Default::default()
    };
    exp.calibration.dir = Some(dir.join("calib"));
    exp.evaluation.dir = Some(dir.join("eval"));
    exp.methods = vec![Method::Max];
    let model = quantscope::model::Model::load(&model_path).expect("loads");
    let mut fp32 = backend(BackendKind::Cpu)
        .build(
            BuildInput::Float {
                model: &model,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            BuildSpec {
                batch: 1,
                hw: [16, 16],
            },
        )
        .expect("fp32");
    let imgs = common::image_folder(&dir.join("raw"), 40, 16, 77);
    for (i, img) in imgs.iter().enumerate() {
        let x = exp.preprocess.apply(
            &data::open_rgb(img).expect("img"),
            [16, 16],
            3,
            model.info.layout,
        );
        let out = fp32.run(&x).expect("run").data;
        let pred = (0..out.len())
            .max_by(|&a, &b| out[a].total_cmp(&out[b]))
            .unwrap_or(0);
        let d = dir.join("eval").join(format!("class_{pred}"));
        std::fs::create_dir_all(&d).expect("class dir");
        std::fs::copy(img, d.join(format!("{i}.png"))).expect("copy");
    }
    std::fs::write(
        dir.join("eval/labels.txt"),
        "class_0\nclass_1\nclass_2\nclass_3\n",
    )
    .expect("labels");
    (
        exp,
        StatsCache {
            dir: dir.join("cache"),
        },
    )
}

fn opts(budget: Option<Budget>) -> SensitivityOptions {
    SensitivityOptions {
        probe_images: 8,
        candidates: 4,
        probe_eval_images: 40,
        budget,
        method: Some(Method::Max),
    }
}

#[test]
fn the_layer_behind_the_outlier_ranks_first() {
    let (exp, cache) = setup("sens-rank");
    let (r, _) =
        sensitivity::run_with_cache(&exp, &opts(None), &cache, &Quiet, &CancelToken::default())
            .expect("sensitivity");
    assert_eq!(r.fp32_metric, 1.0, "labels are FP32's own predictions");
    assert_eq!(r.layers.len(), 4, "three convs and the Gemm");
    assert_eq!(
        r.layers[0].node,
        "conv3",
        "ranking: {:?}",
        r.layers.iter().map(|l| &l.node).collect::<Vec<_>>()
    );
    let worst = r.layers[0].sqnr_isolated_db.unwrap_or(f64::INFINITY);
    for l in &r.layers[1..] {
        assert!(
            l.sqnr_isolated_db.unwrap_or(f64::INFINITY) > worst + 10.0,
            "{} should have a far better SQNR than conv3",
            l.node
        );
    }
    assert!(r.layers.iter().all(|l| l.sqnr_accumulated_db.is_some()));
}

#[test]
fn a_trivial_budget_keeps_nothing_and_an_impossible_one_keeps_everything() {
    let (exp, cache) = setup("sens-budget");
    let (easy, _) = sensitivity::run_with_cache(
        &exp,
        &opts(Some(Budget::Top1Points(100.0))),
        &cache,
        &Quiet,
        &CancelToken::default(),
    )
    .expect("easy");
    let amp = easy.amp.expect("amp result");
    assert!(amp.met && amp.kept_float.is_empty(), "{amp:?}");

    let (hard, qdq) = sensitivity::run_with_cache(
        &exp,
        &opts(Some(Budget::Top1Points(-50.0))),
        &cache,
        &Quiet,
        &CancelToken::default(),
    )
    .expect("hard");
    let amp = hard.amp.expect("amp result");
    assert!(!amp.met, "a budget above FP32 cannot be met");
    assert_eq!(
        amp.kept_float.len(),
        4,
        "keeps every quantized layer in float"
    );
    assert!(amp.note.contains("cannot be met"), "{}", amp.note);
    assert!(
        hard.layers
            .iter()
            .all(|l| l.precision == Some(Precision::Fp32))
    );
    // The Q/DQ model of that plan has no quantized layer left.
    let g = qdq.proto.graph.expect("graph");
    assert!(
        !g.node.iter().any(|n| n.op_type == "QuantizeLinear"),
        "nothing left to quantize"
    );
}
