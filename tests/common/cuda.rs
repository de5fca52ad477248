//! Helpers of the CUDA tests: the GPU (or why there is none), the error measure, random
//! inputs, a max-calibrated Q/DQ model for building CPU and CUDA INT8 engines from one plan,
//! the CPU INT8 engine's output the CUDA ones are held to, the FP16 and INT8 comparisons
//! with the CPU, engines with an implementation forced, and the small blocks they run on.

use quantscope::backend::cpu::CpuBackend;
use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildEffort, BuildInput, BuildSpec, Engine, Output, Precision};
use quantscope::calib::{Method, Stats};
use quantscope::model::Model;
use quantscope::model::proto;
use quantscope::model::testing::{GraphBuilder, values};
use quantscope::quant;

/// The CUDA backend when it can run here (FP32 engines in strict FP32, for parity with the
/// CPU); else prints why the test skips.
pub fn gpu() -> Option<CudaBackend> {
    match CudaBackend::strict().check() {
        Ok(dev) => {
            eprintln!("cuda: {dev}");
            Some(CudaBackend::strict())
        }
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// Whether the GPU has Hopper's warpgroup instructions (compute capability 9.0), where the
/// builder offers the int8 `wgmma` kernels: asked once per test process, since a device
/// creates a context and loads every kernel.
pub fn wgmma_gpu() -> bool {
    use quantscope::backend::cuda::engine::Device;
    static HOPPER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOPPER.get_or_init(|| Device::new().is_ok_and(|d| d.compute == (9, 0)))
}

/// Whether the GPU is a Hopper one, which `what` (a kernel's tests) needs; where it is not,
/// says that the test skips, and why.
pub fn hopper_for(what: &str) -> bool {
    let hopper = wgmma_gpu();
    if !hopper {
        eprintln!("skipped: {what} runs on Hopper GPUs only (compute capability 9.0)");
    }
    hopper
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let m = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-12);
    a.iter()
        .zip(b)
        .fold(0f64, |e, (x, y)| e.max((*x as f64 - *y as f64).abs()))
        / m
}

/// A deterministic input of `m` at `batch` x `hw`, values in [-2, 2).
pub fn input_for(m: &Model, batch: usize, hw: [usize; 2], seed: u64) -> Vec<f32> {
    let n: usize = m.input_shape(batch, hw).iter().product();
    values(n, seed).iter().map(|v| v * 2.0).collect()
}

/// The Q/DQ model of `m`, calibrated (max) on `images` random inputs (seeds 100, 101, ...).
pub fn max_qdq(m: &Model, hw: [usize; 2], images: usize) -> Result<quant::QdqModel, String> {
    max_qdq_as(m, hw, images, quant::QFormat::Int8)
}

/// [`max_qdq`] in `format` (INT8 or FP8 E4M3).
pub fn max_qdq_as(
    m: &Model,
    hw: [usize; 2],
    images: usize,
    format: quant::QFormat,
) -> Result<quant::QdqModel, String> {
    let plan = quant::plan(m, &[]);
    let tensors = plan.tensors();
    // The reference interpreter a run calibrates on (ONNX Runtime where it is loaded).
    let probe = quantscope::backend::reference::open_model(m, hw, &tensors)
        .map_err(|e| format!("probe: {e:#}"))?;
    let mut stats = Stats::new("test".into(), &tensors);
    for k in 0..images {
        let (_, acts) = probe
            .run(&input_for(m, 1, hw, 100 + k as u64))
            .map_err(|e| format!("probe run: {e:#}"))?;
        stats.add(&tensors, &acts);
    }
    let ranges = stats.ranges(Method::Max, 99.99);
    quant::build_qdq_as(m, &plan, Some(&ranges), format).map_err(|e| format!("qdq: {e:#}"))
}

/// The CPU engine of `m` built from `qdq` (INT8, or FP8 simulated).
pub fn cpu_int8_engine(
    m: &Model,
    qdq: &quant::QdqModel,
    spec: BuildSpec,
) -> Result<Box<dyn Engine>, String> {
    CpuBackend
        .build(
            BuildInput::Quantized {
                model: m,
                qdq,
                keep_fp32: &[],
            },
            spec,
        )
        .map_err(|e| format!("cpu int8: {e:#}"))
}

/// [`cpu_int8_engine`], run on `x`.
pub fn cpu_int8_run(
    m: &Model,
    qdq: &quant::QdqModel,
    spec: BuildSpec,
    x: &[f32],
) -> Result<Output, String> {
    cpu_int8_engine(m, qdq, spec)?
        .run(x)
        .map_err(|e| format!("cpu int8: {e:#}"))
}

/// The CPU FP32 engine of `m`.
pub fn cpu_fp32_engine(m: &Model, spec: BuildSpec) -> Result<Box<dyn Engine>, String> {
    CpuBackend
        .build(
            BuildInput::Float {
                model: m,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            spec,
        )
        .map_err(|e| format!("cpu fp32 build: {e:#}"))
}

/// The CPU FP32 engine of `m`, run on `x`: the reference the quantized engines are held to.
pub fn cpu_fp32_run(m: &Model, spec: BuildSpec, x: &[f32]) -> Output {
    cpu_fp32_engine(m, spec)
        .and_then(|mut e| e.run(x).map_err(|e| format!("cpu fp32: {e:#}")))
        .expect("cpu fp32")
}

/// FP32 / FP16 of `m` on both backends: the max relative error.
pub fn float_err(gpu: &CudaBackend, m: &Model, p: Precision, batch: usize, hw: [usize; 2]) -> f64 {
    let spec = BuildSpec { batch, hw };
    let mut cpu = cpu_fp32_engine(m, spec).expect("cpu engine");
    let mut cuda = gpu
        .build(
            BuildInput::Float {
                model: m,
                precision: p,
                keep_fp32: &[],
            },
            spec,
        )
        .unwrap_or_else(|e| panic!("cuda {p} engine: {e}"));
    let x = input_for(m, batch, hw, 7);
    let a = cuda.run(&x).expect("cuda run");
    let b = cpu.run(&x).expect("cpu run");
    assert_eq!(a.shape, b.shape);
    let info = cuda.info();
    eprintln!(
        "  {} layers timed, weights {} B, activations {} B, workspace {} B, device mem {:?} B, device {}",
        info.layer_times.len(),
        info.weights_bytes,
        info.activations_bytes,
        info.workspace_bytes,
        info.device_mem_bytes,
        info.device
    );
    let t = cuda.timed_run(&x).expect("timed run");
    assert!(t > 0.0);
    rel_err(&a.data, &b.data)
}

/// The argmax over axis 1 (classes) at every other position, batch first: one per image of
/// a classifier, one per pixel of a segmenter.
pub fn argmaxes(shape: &[usize], d: &[f32]) -> Vec<usize> {
    let c = shape.get(1).copied().unwrap_or(1).max(1);
    let inner: usize = shape.iter().skip(2).product::<usize>().max(1);
    let n = shape.first().copied().unwrap_or(1);
    let mut out = vec![];
    for b in 0..n {
        for p in 0..inner {
            out.push(
                (0..c)
                    .max_by(|&i, &j| {
                        d[(b * c + i) * inner + p].total_cmp(&d[(b * c + j) * inner + p])
                    })
                    .unwrap_or(0),
            );
        }
    }
    out
}

/// INT8 on both backends from the same Q/DQ model, scored against the CPU FP32 engine's
/// argmax (top-1 per image, or pixel accuracy for segmentation): (CUDA INT8 score, CPU INT8
/// score, images/pixels scored, CUDA-vs-CPU INT8 argmax agreement, max rel err).
pub fn int8_scores(
    gpu: &CudaBackend,
    m: &Model,
    hw: [usize; 2],
    batch: usize,
    runs: usize,
) -> (f64, f64, usize, f64, f64) {
    let qdq = max_qdq(m, hw, 4).expect("qdq");
    let spec = BuildSpec { batch, hw };
    let mut cuda = gpu
        .build(
            BuildInput::Quantized {
                model: m,
                qdq: &qdq,
                keep_fp32: &[],
            },
            spec,
        )
        .unwrap_or_else(|e| panic!("cuda int8 engine: {e}"));
    int8_scores_of(cuda.as_mut(), m, &qdq, hw, batch, runs)
}

/// `int8_scores` for a CUDA INT8 engine built from `qdq`.
pub fn int8_scores_of(
    cuda: &mut dyn Engine,
    m: &Model,
    qdq: &quant::QdqModel,
    hw: [usize; 2],
    batch: usize,
    runs: usize,
) -> (f64, f64, usize, f64, f64) {
    let spec = BuildSpec { batch, hw };
    let mut cpu = cpu_int8_engine(m, qdq, spec).expect("cpu int8");
    let mut cpu32 = cpu_fp32_engine(m, spec).expect("cpu fp32");
    eprintln!(
        "  int8 nodes {}, float nodes {}",
        cuda.info().int8_nodes,
        cuda.info().float_nodes.len()
    );
    let (mut ok_gpu, mut ok_cpu, mut agree, mut total, mut err) =
        (0usize, 0usize, 0usize, 0usize, 0f64);
    for r in 0..runs {
        let x = input_for(m, batch, hw, 500 + r as u64);
        let a = cuda.run(&x).expect("cuda run");
        let b = cpu.run(&x).expect("cpu run");
        let f = cpu32.run(&x).expect("cpu fp32 run");
        err = err.max(rel_err(&a.data, &b.data));
        let (ga, cb, lf) = (
            argmaxes(&a.shape, &a.data),
            argmaxes(&b.shape, &b.data),
            argmaxes(&f.shape, &f.data),
        );
        for k in 0..lf.len() {
            ok_gpu += (ga[k] == lf[k]) as usize;
            ok_cpu += (cb[k] == lf[k]) as usize;
            agree += (ga[k] == cb[k]) as usize;
            total += 1;
        }
    }
    let t = total as f64;
    (
        ok_gpu as f64 / t,
        ok_cpu as f64 / t,
        total,
        agree as f64 / t,
        err,
    )
}

/// The INT8 criterion: the CUDA score no more than 0.5 pt below the CPU INT8 score (plus one
/// sample's worth where few are scored). One-sided: on the MobileNetV2 DeepLab the CUDA engine
/// (exact i32 accumulation, f32 requantization) lands closer to FP32 than tract's QLinearConv.
pub fn check_int8(name: &str, s: (f64, f64, usize, f64, f64)) {
    let (g, c, n, agree, err) = s;
    eprintln!(
        "{name} int8: score vs FP32 argmax cuda {:.2}% / cpu {:.2}% over {n} (diff {:.2} pt), cuda-vs-cpu int8 agreement {:.2}%, max rel err {err:.3e}",
        g * 100.0,
        c * 100.0,
        (g - c).abs() * 100.0,
        agree * 100.0
    );
    assert!(
        (g - c).abs() <= 0.005 + 1.0 / n as f64,
        "{name}: int8 score {g} vs cpu {c}"
    );
}

/// A MobileNetV2 block and a ResNet tail on [1, 16, 14, 14]: 1x1 expansion (to 24 channels:
/// the int8 pointwise kernel's 4-byte reads and a partial block of output channels) + ReLU6 (Clip),
/// 3x3 depthwise + ReLU6, 1x1 projection + the block's residual, then a 3x3 conv + ReLU.
/// Every fused epilogue the builder has (bias, clip, ReLU, residual) and the depthwise path.
pub fn mobilenet_block() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 16, 14, 14]);
    let lo = b.constant("zero", &[], &[0.0]);
    let hi = b.constant("six", &[], &[6.0]);
    let e = b.conv("expand", "x", 16, 24, 1);
    let e6 = b.op("Clip", "expand.relu6", &[&e, &lo, &hi]);
    let dw = depthwise_3x3(&mut b, &e6, 24);
    let d6 = b.op("Clip", "dw.relu6", &[&dw, &lo, &hi]);
    let pr = b.conv("project", &d6, 24, 16, 1);
    let add = b.op("Add", "block.add", &[&pr, "x"]);
    let c = b.conv("tail", &add, 16, 16, 3);
    let y = b.op("Relu", "tail.relu", &[&c]);
    b.output(&y);
    b
}

/// A 3x3 depthwise conv "dw" (pads 1, random weights and bias) over `c` channels of `x`.
pub fn depthwise_3x3(b: &mut GraphBuilder, x: &str, c: usize) -> String {
    let w = b.random("dw.w", &[c, 1, 3, 3], 0.5);
    let bias = b.random("dw.b", &[c], 0.1);
    b.node(
        "Conv",
        "dw",
        &[x, &w, &bias],
        vec![
            proto::ints_attr("pads", &[1, 1, 1, 1]),
            proto::int_attr("group", c as i64),
        ],
    )
}

/// Builds `plan` with every conv forced to `family` where it applies: the engine and how
/// many convs took it.
pub fn forced_engine(
    pl: &quantscope::backend::cuda::plan::Plan,
    precision: Precision,
    batch: usize,
    family: &str,
) -> (quantscope::backend::cuda::engine::CudaEngine, usize, usize) {
    let (eng, got) = forced_build(pl, precision, batch, family);
    let applied = got.values().filter(|k| took(k, family)).count();
    (eng, applied, got.len())
}

/// Whether choice key `key` is of `family` (`gemmf:0:rows` is of `gemmf`).
pub fn took(key: &str, family: &str) -> bool {
    key == family || key.strip_prefix(family).is_some_and(|r| r.starts_with(':'))
}

/// `forced_engine`'s build: the engine and each conv's choice key, by conv name.
pub fn forced_build(
    pl: &quantscope::backend::cuda::plan::Plan,
    precision: Precision,
    batch: usize,
    family: &str,
) -> (
    quantscope::backend::cuda::engine::CudaEngine,
    std::collections::BTreeMap<String, String>,
) {
    use quantscope::backend::cuda::cache::Choices;
    use quantscope::backend::cuda::engine::{BuildHow, CudaEngine, Device};
    use quantscope::backend::cuda::plan::Step;
    let convs: Vec<String> = pl
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Conv(c) => Some(c.name.clone()),
            _ => None,
        })
        .collect();
    let forced = Choices {
        convs: convs
            .iter()
            .map(|c| (c.clone(), family.to_string()))
            .collect(),
        ..Default::default()
    };
    let dev = Device::new().expect("device");
    let how = BuildHow {
        precision,
        tf32: false,
        batch,
        effort: BuildEffort::Default,
        near_tie: quantscope::backend::cuda::engine::NEAR_TIE,
    };
    let (eng, got) = CudaEngine::build(dev, pl.clone(), how, &forced, &|_, _| {})
        .unwrap_or_else(|e| panic!("{precision} [{family}]: {e}"));
    let keys = convs
        .into_iter()
        .map(|c| {
            let k = got.convs.get(&c).cloned().unwrap_or_default();
            (c, k)
        })
        .collect();
    (eng, keys)
}

/// A ResNet bottleneck on [1, 48, 14, 14]: 1x1 48 -> 64 + ReLU, 3x3 stride 2 64 -> 64 + ReLU,
/// 1x1 64 -> 96, plus the 1x1 stride-2 shortcut 48 -> 96, then ReLU.
pub fn bottleneck_block() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 48, 14, 14]);
    let strided = |b: &mut GraphBuilder, name: &str, x: &str, cin: usize, cout: usize, k: usize| {
        let w = b.random(
            &format!("{name}.w"),
            &[cout, cin, k, k],
            3.0 / (cin * k * k) as f32,
        );
        let bias = b.random(&format!("{name}.b"), &[cout], 0.1);
        let p = (k / 2) as i64;
        b.node(
            "Conv",
            name,
            &[x, &w, &bias],
            vec![
                proto::ints_attr("pads", &[p, p, p, p]),
                proto::ints_attr("strides", &[2, 2]),
            ],
        )
    };
    let c1 = b.conv("reduce", "x", 48, 64, 1);
    let r1 = b.op("Relu", "reduce.relu", &[&c1]);
    let c2 = strided(&mut b, "mid", &r1, 64, 64, 3);
    let r2 = b.op("Relu", "mid.relu", &[&c2]);
    let c3 = b.conv("expand", &r2, 64, 96, 1);
    let sc = strided(&mut b, "shortcut", "x", 48, 96, 1);
    let add = b.op("Add", "block.add", &[&c3, &sc]);
    let y = b.op("Relu", "block.relu", &[&add]);
    b.output(&y);
    b
}

/// The int8 reference for `m` on `x`: its Q/DQ model (max calibration on 4 images) with the
/// input fixed at `spec`, the CPU INT8 engine's output, and one output step (the largest
/// output over 127).
pub fn int8_reference(
    m: &Model,
    spec: BuildSpec,
    x: &[f32],
) -> (tract_onnx::pb::ModelProto, quantscope::backend::Output, f32) {
    let qdq = max_qdq(m, spec.hw, 4).expect("qdq");
    let q = Model {
        proto: qdq.proto.clone(),
        ..m.clone()
    }
    .with_fixed_input(spec.batch, spec.hw);
    let cpu8 = cpu_int8_run(m, &qdq, spec, x).expect("cpu int8");
    let step = cpu8.data.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
    (q, cpu8, step)
}
