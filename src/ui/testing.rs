//! A report, predictions, a model's drawing and a workbench built in code, for the GUI tests:
//! no sample files, no models on disk.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::backend::{BackendKind, FloatNode, LayerTime, Precision};
use crate::bench::Latency;
use crate::calib::Method;
use crate::model::{Layout, ModelInfo, Task, TensorInfo, UnsupportedOp};
use crate::pipeline::Artifacts;
use crate::report::{
    CalibSummary, EvalSummary, MemoryBytes, ModelSummary, Report, Row, TensorRanges,
};

use super::{Settings, Workbench};

pub const CLASSES: [&str; 4] = ["background", "person", "car", "dog"];
pub const MASK_HW: [usize; 2] = [48, 64];
pub const IMAGES: usize = 3;

fn row(precision: Precision, method: Option<Method>, miou: f64, median_ms: f64) -> Row {
    let int8 = precision == Precision::Int8;
    Row {
        precision: Some(precision),
        method,
        backend: "cpu".into(),
        simulated: precision == Precision::Fp16,
        miou: Some(miou),
        pixel_acc: Some(miou + 0.1),
        per_class_iou: Some(vec![
            Some(0.95),
            Some(miou),
            Some(miou - 0.1),
            Some(miou - 0.2),
        ]),
        agreement: (precision != Precision::Fp32).then_some(0.9 + miou / 10.0),
        sqnr_db: (precision != Precision::Fp32).then_some(if int8 { 21.5 } else { 60.0 }),
        sqnr_images: Some(IMAGES),
        latency_ms: Some(Latency {
            median: median_ms,
            p90: median_ms * 1.1,
            p99: median_ms * 1.3,
            runs: 20,
            ..Default::default()
        }),
        throughput_ips: Some(1e3 / median_ms),
        memory_bytes: Some(MemoryBytes {
            weights: if int8 { 2 << 20 } else { 8 << 20 },
            activations: 3 << 20,
            peak_rss: 20 << 20,
        }),
        build_ms: Some(120.0),
        int8_nodes: int8.then_some(40),
        per_image: (0..IMAGES).map(|i| miou - 0.05 * i as f64).collect(),
        ..Default::default()
    }
}

/// A segmentation report: FP32, FP16 (simulated on CPU), INT8 max and entropy.
pub fn sample_report() -> Report {
    let mut rows = vec![
        row(Precision::Fp32, None, 0.72, 30.0),
        row(Precision::Fp16, None, 0.72, 45.0),
        row(Precision::Int8, Some(Method::Max), 0.61, 14.0),
        row(Precision::Int8, Some(Method::Entropy), 0.70, 13.0),
    ];
    // The max engine does worst on the last image.
    rows[2].per_image[2] = 0.2;
    // Per-layer times under the graph's node names; the INT8 engines run the convs in int8 and
    // say why the rest stays in float.
    for (k, r) in rows.iter_mut().enumerate() {
        let speed = [1.0, 1.4, 0.5, 0.45][k];
        r.layer_times = SAMPLE_NODES
            .iter()
            .enumerate()
            .map(|(i, (name, op))| LayerTime {
                layer: name.to_string(),
                kernel: op.to_string(),
                time_ms: speed * (0.2 + 0.15 * i as f64),
                precision: None,
            })
            .collect();
        if r.precision == Some(Precision::Int8) {
            r.float_nodes = SAMPLE_NODES
                .iter()
                .filter(|(_, op)| !crate::quant::QUANTIZABLE.contains(op))
                .map(|(name, op)| FloatNode {
                    node: name.to_string(),
                    op: op.to_string(),
                    reason: "no int8 form for this op on the CPU backend: runs in float".into(),
                })
                .collect();
        }
    }
    let tensors = ["stem.relu.out", "block.add.out", "head.out"]
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let counts: Vec<u64> = (0..256u64)
                .map(|i| {
                    ((4000.0 * (-(i as f64) / (12.0 + 8.0 * k as f64)).exp()) as u64)
                        + (i % 7 == 0) as u64
                })
                .collect();
            let amax = BTreeMap::from([
                (Method::Max, 2.56_f32),
                (Method::Percentile, 1.4),
                (Method::Mse, 0.9 + 0.1 * k as f32),
                (Method::Entropy, 0.8 + 0.1 * k as f32),
            ]);
            TensorRanges {
                tensor: name.to_string(),
                bin_width: 0.01,
                counts,
                amax,
            }
        })
        .collect();
    Report {
        quantscope_version: "test".into(),
        experiment: "sample".into(),
        model: ModelSummary {
            file: "segmenter.onnx".into(),
            task: Some(Task::Segmentation),
            params: 2_000_000,
            param_bytes: 8_000_000,
            ..Default::default()
        },
        input_hw: [48, 64],
        calibration: Some(CalibSummary {
            images: 32,
            cache_hit: false,
            pass_ms: 850.0,
            ranges_ms: 40.0,
            tensors,
        }),
        evaluation: EvalSummary {
            dir: None,
            task: Some(Task::Segmentation),
            images: IMAGES,
            classes: CLASSES.iter().map(|s| s.to_string()).collect(),
            image_files: (0..IMAGES)
                .map(|i| PathBuf::from(format!("missing/image_{i}.jpg")))
                .collect(),
        },
        rows,
        ..Default::default()
    }
}

/// A mask with a few shapes; `shift` moves them so engines disagree a little.
fn mask(image: usize, shift: usize) -> Vec<u8> {
    let [h, w] = MASK_HW;
    let mut m = vec![0u8; h * w];
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            if (8 + shift..28 + shift).contains(&x) && (10..40).contains(&y) {
                m[i] = 1 + (image % 3) as u8;
            }
            let (dx, dy) = (x as i64 - 46, y as i64 - 24);
            if dx * dx + dy * dy < (64 + 8 * shift as i64) {
                m[i] = 2 + ((image + 1) % 2) as u8;
            }
            if y > 44 {
                m[i] = 255;
            }
        }
    }
    m
}

/// Predictions for `sample_report`'s rows, and ground truth.
pub fn sample_artifacts() -> Artifacts {
    let shifts = [0, 0, 4, 1];
    Artifacts {
        predictions: shifts
            .iter()
            .map(|&s| (0..IMAGES).map(|i| mask(i, s)).collect())
            .collect(),
        mask_hw: vec![MASK_HW; IMAGES],
        ground_truth: (0..IMAGES).map(|i| mask(i, 1)).collect(),
        qdq: [Method::Max, Method::Entropy]
            .into_iter()
            .map(|m| sample_qdq(m, if m == Method::Max { 1.0 } else { 0.8 }))
            .collect(),
        ..Default::default()
    }
}

/// The nodes of the sample model's graph (names match [`sample_sensitivity`]), in order.
pub const SAMPLE_NODES: [(&str, &str); 7] = [
    ("stem/conv", "Conv"),
    ("stem/relu", "Relu"),
    ("block1/conv", "Conv"),
    ("block1/add", "Add"),
    ("head/conv", "Conv"),
    ("head/matmul", "MatMul"),
    ("warp/grid", "GridSample"),
];

/// The sample model's graph: a stem, a residual block, a head and a warp, with weights.
pub fn sample_graph() -> tract_onnx::pb::GraphProto {
    use crate::model::proto;
    let out = |n: &str| format!("{n}:0");
    let w = |name: &str, dims: &[usize]| {
        proto::f32_tensor(name, dims, &vec![0.1; dims.iter().product()])
    };
    let node = |i: usize, inputs: &[&str]| {
        let (name, op) = SAMPLE_NODES[i];
        proto::node(op, name, inputs, &[&out(name)], vec![])
    };
    let o = |i: usize| out(SAMPLE_NODES[i].0);
    tract_onnx::pb::GraphProto {
        name: "sample".into(),
        input: vec![proto::float_value_info("x", Some(&[1, 3, 48, 64]))],
        output: vec![proto::float_value_info("y", Some(&[1, 4, 48, 64]))],
        initializer: vec![
            w("stem.w", &[8, 3, 3, 3]),
            w("block1.w", &[8, 8, 3, 3]),
            w("head.w", &[8, 8, 1, 1]),
            w("head.m", &[64, 64]),
        ],
        node: vec![
            node(0, &["x", "stem.w"]),
            node(1, &[&o(0)]),
            node(2, &[&o(1), "block1.w"]),
            node(3, &[&o(1), &o(2)]),
            node(4, &[&o(3), "head.w"]),
            node(5, &[&o(4), "head.m"]),
            proto::node("GridSample", "warp/grid", &[&o(5), &o(3)], &["y"], vec![]),
        ],
        ..Default::default()
    }
}

/// The sample model's drawing, laid out.
pub fn sample_diagram() -> crate::model::diagram::Diagram {
    let mut d = crate::model::diagram::Diagram::of_graph(&sample_graph());
    if let Err(e) = d.lay_out() {
        panic!("{e}");
    }
    d
}

/// The Q/DQ model of an INT8 engine of the sample: the convs' inputs quantized (the graph
/// itself is not needed by the views).
fn sample_qdq(method: Method, amax: f32) -> crate::pipeline::QdqArtifact {
    use crate::quant::{ActQuant, QFormat, QdqModel, QuantPlan};
    let act = |tensor: &str, node: usize| ActQuant {
        tensor: tensor.into(),
        uses: vec![(node, 0)],
    };
    let plan = QuantPlan {
        activations: vec![
            act("x", 0),
            act("stem/relu:0", 2),
            act("block1/add:0", 4),
            act("head/conv:0", 5),
        ],
        quantized_nodes: vec![
            "stem/conv".into(),
            "block1/conv".into(),
            "head/conv".into(),
            "head/matmul".into(),
        ],
        ..Default::default()
    };
    let scales = plan
        .activations
        .iter()
        .enumerate()
        .map(|(k, a)| (a.tensor.clone(), amax * (1.0 + k as f32) / 127.0))
        .collect();
    crate::pipeline::QdqArtifact {
        method: Some(method),
        suffix: "",
        model: QdqModel {
            proto: Default::default(),
            format: QFormat::Int8,
            scales,
            method: Some(method),
            plan,
        },
    }
}

/// A model description with one unsupported operator.
pub fn sample_model_info() -> ModelInfo {
    let t = |name: &str, shape: Vec<Option<i64>>| TensorInfo {
        name: name.into(),
        shape,
        dtype: "float32".into(),
    };
    ModelInfo {
        file: "segmenter.onnx".into(),
        opset: 13,
        producer: "tests".into(),
        inputs: vec![t("x", vec![Some(1), Some(3), Some(48), Some(64)])],
        outputs: vec![t("y", vec![Some(1), Some(4), Some(48), Some(64)])],
        op_census: BTreeMap::from([
            ("Conv".to_string(), 12),
            ("Relu".to_string(), 10),
            ("Add".to_string(), 3),
            ("GridSample".to_string(), 1),
        ]),
        nodes: 26,
        params: 2_000_000,
        param_bytes: 8_000_000,
        task: Some(Task::Segmentation),
        layout: Layout::Nchw,
        input_chw: [3, 48, 64],
        batch_norms_folded: 4,
        prequantized: false,
        fp16_initializers: 0,
        normalization: None,
        qdq_rewrites: vec![],
        qdq_kept: vec![],
        unsupported: vec![UnsupportedOp {
            node: "warp/grid".into(),
            op: "GridSample".into(),
        }],
    }
}

/// A workbench (no worker thread) showing the sample model and results; CUDA unavailable.
pub fn sample_workbench() -> Workbench {
    let mut wb = Workbench::without_worker(Settings::default());
    wb.exp.name = "sample".into();
    wb.exp.model = "segmenter.onnx".into();
    wb.exp.precisions = vec![Precision::Fp32, Precision::Fp16, Precision::Int8];
    // A fixed count: "every core" would make the snapshots depend on the machine.
    wb.exp.threads = 4;
    wb.saved = wb.exp.clone();
    wb.model.info = Some(sample_model_info());
    wb.backends = vec![
        (BackendKind::Cpu, Ok("test CPU".into())),
        (
            BackendKind::Cuda,
            Err("no CUDA driver (libcuda.so) on this machine".into()),
        ),
    ];
    wb.set_results(sample_report(), Some(sample_artifacts()));
    wb.model.diagram = Some(std::sync::Arc::new(sample_diagram()));
    wb
}

/// A sensitivity report for `sample_report`'s model: five layers, three measured on the task
/// metric, no mixed-precision plan.
pub fn sample_sensitivity() -> crate::sensitivity::SensitivityReport {
    use crate::sensitivity::{LayerReport, MethodResult, SensitivityReport};
    let layer = |node: &str, op: &str, iso: f64, acc: f64, gain: Option<f64>| LayerReport {
        node: node.into(),
        op: op.into(),
        sqnr_isolated_db: Some(iso),
        sqnr_accumulated_db: Some(acc),
        metric_gain_pt: gain,
        precision: Some(Precision::Int8),
    };
    SensitivityReport {
        model: "segmenter.onnx".into(),
        task: Some(Task::Segmentation),
        probe_images: 32,
        eval_images: IMAGES,
        fp32_metric: 0.72,
        methods: vec![
            MethodResult {
                method: "max".into(),
                metric: 0.61,
            },
            MethodResult {
                method: "entropy".into(),
                metric: 0.70,
            },
        ],
        chosen: "entropy".into(),
        int8_metric: 0.70,
        layers: vec![
            layer("stem/conv", "Conv", 31.0, 31.0, Some(0.4)),
            layer("block1/conv", "Conv", 24.5, 22.0, None),
            layer("block1/add", "Add", 12.0, 18.5, Some(1.3)),
            layer("head/conv", "Conv", 19.0, 15.0, Some(0.1)),
            layer("head/matmul", "MatMul", 40.0, 14.0, None),
        ],
        elapsed_ms: 4200.0,
        ..Default::default()
    }
}

/// The bundled classifier's class names, in its output order.
pub const FASHION_CLASSES: [&str; 10] = [
    "tshirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
];

/// Images per class the classifier sample takes from the bundled evaluation set.
pub const FASHION_PER_CLASS: usize = 3;

/// The first [`FASHION_PER_CLASS`] images of each class of the bundled classifier's
/// evaluation set (sorted by name), with their classes.
pub fn fashion_images() -> Vec<(PathBuf, usize)> {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/data/fashion_eval");
    let mut out = vec![];
    for (c, name) in FASHION_CLASSES.iter().enumerate() {
        let dir = root.join(format!("{c}_{name}"));
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        out.extend(files.into_iter().take(FASHION_PER_CLASS).map(|f| (f, c)));
    }
    out
}

/// A top-3 that predicts `pred` with probability `p`, the true class (or the next class)
/// second.
fn top3(pred: usize, label: usize, p: f32) -> crate::report::ImageTop {
    let n = FASHION_CLASSES.len();
    let second = if pred == label {
        (label + 1) % n
    } else {
        label
    };
    let third = (0..n).find(|c| *c != pred && *c != second).unwrap_or(0);
    let (p2, p3) = ((1.0 - p) * 0.7, (1.0 - p) * 0.2);
    let true_p = if pred == label {
        p
    } else if second == label {
        p2
    } else {
        0.01
    };
    crate::report::ImageTop {
        top: vec![(pred as u32, p), (second as u32, p2), (third as u32, p3)],
        true_p,
    }
}

/// A classifier report on [`fashion_images`]: FP32, FP16 (simulated), INT8 max (a few flips)
/// and INT8 entropy (moves coats to pullovers and shirts to T-shirts), each with its
/// confusion matrix, per-class accuracy and the gallery, made by the pipeline's own functions.
pub fn sample_classifier_report() -> Report {
    let images = fashion_images();
    let labels: Vec<usize> = images.iter().map(|i| i.1).collect();
    // (precision, method, prediction and confidence for image i of class y)
    type Predict = fn(usize, usize) -> (usize, f32);
    let engines: [(Precision, Option<Method>, Predict, f64); 4] = [
        (
            Precision::Fp32,
            None,
            |i, y| {
                if i == 20 {
                    (4, 0.55)
                } else {
                    (y, 0.9 - 0.02 * (i % 5) as f32)
                }
            },
            30.0,
        ),
        (
            Precision::Fp16,
            None,
            |i, y| {
                if i == 20 {
                    (4, 0.55)
                } else {
                    (y, 0.9 - 0.02 * (i % 5) as f32)
                }
            },
            45.0,
        ),
        (
            Precision::Int8,
            Some(Method::Max),
            |i, y| match i {
                20 => (6, 0.5),
                7 => (4, 0.48),
                _ => (y, 0.86 - 0.02 * (i % 5) as f32),
            },
            14.0,
        ),
        (
            Precision::Int8,
            Some(Method::Entropy),
            |i, y| match y {
                4 if i % 3 != 2 => (2, 0.6 + 0.05 * (i % 3) as f32),
                6 if i % 3 == 0 => (0, 0.7),
                _ if i == 20 => (6, 0.75),
                _ => (y, 0.8 - 0.03 * (i % 4) as f32),
            },
            13.0,
        ),
    ];
    let mut tops = vec![];
    let mut rows = vec![];
    for (precision, method, predict, median_ms) in engines {
        let t: Vec<crate::report::ImageTop> = labels
            .iter()
            .enumerate()
            .map(|(i, &y)| {
                let (pred, p) = predict(i, y);
                top3(pred, y, p)
            })
            .collect();
        let preds: Vec<usize> = t.iter().map(|x| x.top1().unwrap_or(0)).collect();
        let mut tally = crate::eval::ClassTally::default();
        let per_image: Vec<f64> = preds
            .iter()
            .zip(&labels)
            .map(|(&p, &y)| {
                let mut scores = vec![0.0f32; FASHION_CLASSES.len()];
                scores[p] = 1.0;
                tally.add(&scores, y);
                (p == y) as u8 as f64
            })
            .collect();
        let int8 = precision == Precision::Int8;
        rows.push(Row {
            precision: Some(precision),
            method,
            backend: "cpu".into(),
            simulated: precision == Precision::Fp16,
            top1: Some(tally.top1()),
            top5: Some(1.0),
            per_class_accuracy: Some(tally.per_class_accuracy()),
            confusion: Some(crate::report::Confusion::from_pairs(
                FASHION_CLASSES.len(),
                labels.iter().copied().zip(preds.iter().copied()),
            )),
            agreement: (precision != Precision::Fp32).then_some(0.9),
            sqnr_db: (precision != Precision::Fp32).then_some(if int8 { 24.0 } else { 70.0 }),
            latency_ms: Some(Latency {
                median: median_ms,
                p90: median_ms * 1.1,
                p99: median_ms * 1.3,
                runs: 20,
                ..Default::default()
            }),
            throughput_ips: Some(1e3 / median_ms),
            int8_nodes: int8.then_some(21),
            per_image,
            ..Default::default()
        });
        tops.push(t);
    }
    Report {
        quantscope_version: "test".into(),
        experiment: "fashion".into(),
        model: ModelSummary {
            file: "fashion_resnet.onnx".into(),
            task: Some(Task::Classification),
            params: 175_000,
            param_bytes: 700_000,
            ..Default::default()
        },
        input_hw: [32, 32],
        evaluation: EvalSummary {
            dir: None,
            task: Some(Task::Classification),
            images: images.len(),
            classes: FASHION_CLASSES.iter().map(|s| s.to_string()).collect(),
            image_files: images.iter().map(|i| i.0.clone()).collect(),
        },
        gallery: crate::report::gallery(0, &tops, &labels),
        rows,
        ..Default::default()
    }
}

/// A workbench (no worker thread) showing [`sample_classifier_report`].
pub fn sample_classifier_workbench() -> Workbench {
    let mut wb = Workbench::without_worker(Settings::default());
    wb.exp.name = "fashion".into();
    wb.exp.model = "fashion_resnet.onnx".into();
    wb.exp.precisions = vec![Precision::Fp32, Precision::Fp16, Precision::Int8];
    wb.exp.threads = 4;
    wb.saved = wb.exp.clone();
    wb.backends = vec![(BackendKind::Cpu, Ok("test CPU".into()))];
    wb.set_results(sample_classifier_report(), Some(Artifacts::default()));
    wb
}
