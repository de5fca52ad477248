//! CUDA engines against the CPU engines, on a GPU machine. Without a usable GPU every test
//! prints why it skips and passes.
//!
//! Tolerances: FP32 within 1e-3 relative (max |gpu - cpu| / max |cpu| over the outputs);
//! FP16 within 2e-2 relative (activations and weights stored in f16, f32 accumulation);
//! INT8: on the labelled sample experiments, top-1 / mIoU within 0.5 pt of the CPU INT8 engine
//! built from the same Q/DQ model; on a small graph, agreement with the CPU INT8 engine.

use std::path::Path;

mod common;

use common::cuda::{
    cpu_fp32_run, cpu_int8_engine, cpu_int8_run, gpu, input_for, max_qdq, max_qdq_as, rel_err,
};
use common::max_err;

use quantscope::backend::cpu::CpuBackend;
use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildEffort, BuildInput, BuildSpec, Engine, Precision};
use quantscope::model::Model;
use quantscope::model::proto;
use quantscope::model::testing::{GraphBuilder, residual_classifier, values};
use quantscope::quant;

/// FP32 / FP16 of `m` on both backends: the max relative error.
fn float_err(gpu: &CudaBackend, m: &Model, p: Precision, batch: usize, hw: [usize; 2]) -> f64 {
    let spec = BuildSpec { batch, hw };
    let mut cpu = CpuBackend
        .build(
            BuildInput::Float {
                model: m,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            spec,
        )
        .expect("cpu engine");
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

fn argmaxes(shape: &[usize], d: &[f32]) -> Vec<usize> {
    let (c, inner) = if shape.len() == 4 {
        (shape[1], shape[2] * shape[3])
    } else {
        (shape[1], 1)
    };
    let mut out = vec![];
    for n in 0..shape[0] {
        for p in 0..inner {
            out.push(
                (0..c)
                    .max_by(|&i, &j| {
                        d[(n * c + i) * inner + p].total_cmp(&d[(n * c + j) * inner + p])
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
fn int8_scores(
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
fn int8_scores_of(
    cuda: &mut dyn Engine,
    m: &Model,
    qdq: &quant::QdqModel,
    hw: [usize; 2],
    batch: usize,
    runs: usize,
) -> (f64, f64, usize, f64, f64) {
    let spec = BuildSpec { batch, hw };
    let mut cpu = cpu_int8_engine(m, qdq, spec).expect("cpu int8");
    let mut cpu32 = CpuBackend
        .build(
            BuildInput::Float {
                model: m,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            spec,
        )
        .expect("cpu fp32");
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
fn check_int8(name: &str, s: (f64, f64, usize, f64, f64)) {
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

#[test]
fn residual_classifier_fp32_fp16_int8_match_cpu() {
    let Some(g) = gpu() else { return };
    let m = residual_classifier(10).model();
    let e32 = float_err(&g, &m, Precision::Fp32, 2, [16, 16]);
    eprintln!("residual_classifier fp32 max rel err {e32:.3e}");
    assert!(e32 <= 1e-3, "fp32 rel err {e32}");
    let e16 = float_err(&g, &m, Precision::Fp16, 2, [16, 16]);
    eprintln!("residual_classifier fp16 max rel err {e16:.3e}");
    assert!(e16 <= 2e-2, "fp16 rel err {e16}");
    check_int8("residual_classifier", int8_scores(&g, &m, [16, 16], 8, 8));
}

/// The FP16 overflow guard on the GPU: the Gram-matrix classifier's FP16 engine outputs
/// NaN/Inf without it; with it the guarded layers compute in FP32 (named in the engine's
/// info and its Layers rows), the output is finite and close to the CPU's FP32, and the
/// INT8 engine's float layers are guarded the same way.
#[test]
fn fp16_overflow_guard_keeps_the_overflowing_layers_in_fp32() {
    let Some(g) = gpu() else { return };
    let hw = [32, 32];
    let m = quantscope::model::testing::gram_classifier(3, 32, 100.0).model();
    let inputs = (0..4).map(|k| Ok(input_for(&m, 1, hw, 100 + k)));
    let peaks = quantscope::pipeline::tensor_peaks(&m, hw, inputs).expect("peaks");
    let shapes = quantscope::model::infer_shapes(&m, hw).ok();
    let guard = quantscope::fp16_guard::keep_fp32(&m.proto, &peaks, shapes.as_ref());
    assert!(guard.iter().any(|k| k.node == "gram"), "{guard:?}");
    let spec = BuildSpec { batch: 1, hw };
    let x = input_for(&m, 1, hw, 7);
    let cpu32 = cpu_fp32_run(&m, spec, &x);
    let build = |keep| {
        g.build(
            BuildInput::Float {
                model: &m,
                precision: Precision::Fp16,
                keep_fp32: keep,
            },
            spec,
        )
        .expect("fp16 engine")
    };
    let unguarded = build(&[]).run(&x).expect("run");
    assert!(
        unguarded.data.iter().any(|v| !v.is_finite()),
        "the test model must overflow FP16 without the guard"
    );
    let mut e = build(&guard);
    let out = e.run(&x).expect("run");
    assert!(out.data.iter().all(|v| v.is_finite()), "{:?}", out.data);
    let err = rel_err(&out.data, &cpu32.data);
    eprintln!(
        "guarded fp16 max rel err {err:.2e}, kept {:?}",
        e.info().fp32_layers
    );
    assert!(err <= 2e-2, "guarded fp16 rel err {err}");
    let kept: Vec<&str> = e
        .info()
        .fp32_layers
        .iter()
        .map(|k| k.node.as_str())
        .collect();
    assert!(kept.contains(&"gram"), "{kept:?}");
    assert!(
        e.info()
            .layer_times
            .iter()
            .all(|l| !l.layer.starts_with("conv") || l.precision.as_deref() == Some("fp16")),
        "the in-range conv stays FP16: {:?}",
        e.info().layer_times
    );
    // INT8: the float layers the Q/DQ plan leaves (the Gram MatMul) run FP16 on the GPU.
    let qdq = max_qdq(&m, hw, 2).expect("qdq");
    let mut q = g
        .build(
            BuildInput::Quantized {
                model: &m,
                qdq: &qdq,
                keep_fp32: &guard,
            },
            spec,
        )
        .expect("int8 engine");
    let out = q.run(&x).expect("run");
    assert!(
        out.data.iter().all(|v| v.is_finite()),
        "int8: {:?}",
        out.data
    );
}

/// FP32 on TF32 tensor cores (the default): the engine says so on compute capability 8.0+,
/// and its output stays within TF32's rounding of the CPU's strict FP32 (inputs rounded to a
/// 10-bit mantissa: about 1e-3 relative per product).
#[test]
fn fp32_tf32_is_said_and_stays_close_to_strict_fp32() {
    let Some(strict) = gpu() else { return };
    let dev = strict.check().unwrap_or_default();
    // "... sm_90 ..." -> 90.
    let sm: u32 = dev
        .split("sm_")
        .nth(1)
        .and_then(|s| s.get(..2))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let m = residual_classifier(10).model();
    let tf32 = CudaBackend::default();
    let err = float_err(&tf32, &m, Precision::Fp32, 2, [16, 16]);
    eprintln!("residual_classifier fp32 (tf32) max rel err {err:.3e}");
    assert!(err <= 1e-2, "tf32 rel err {err}");
    let fp32_engine = |b: &CudaBackend| {
        b.build(
            BuildInput::Float {
                model: &m,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            BuildSpec {
                batch: 1,
                hw: [16, 16],
            },
        )
        .expect("fp32 engine")
    };
    let e = fp32_engine(&tf32);
    assert_eq!(e.info().tf32, sm >= 80, "{dev}: {}", e.info().device);
    let s = fp32_engine(&strict);
    assert!(!s.info().tf32, "{}", s.info().device);
}

/// Each way the builder can run an int8 conv, forced on every conv it applies to (a cached
/// choice naming only the family), against the CPU INT8 engine on the bundled classifier:
/// the cuDNN graph int8 conv, the fused int8-out cuBLASLt GEMM, the raw int32 GEMM +
/// epilogue, the FP16 way through cuDNN and through cuBLASLt, and the direct kernel (its
/// convs take no int8 pointwise kernel: the MobileNet block's test forces that one).
#[test]
fn every_int8_conv_implementation_matches_cpu() {
    use quantscope::backend::cuda::ops as plan;
    let Some(_) = gpu() else { return };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_resnet.onnx");
    let m = Model::load(&path).expect("sample model loads");
    let hw = m.input_hw(None).expect("fixed input size");
    let batch = 4;
    let qdq = max_qdq(&m, hw, 4).expect("qdq");
    let p = Model {
        proto: qdq.proto.clone(),
        ..m.clone()
    }
    .with_fixed_input(batch, hw);
    let pl = plan::lower(&p, m.input_shape(batch, hw), Precision::Int8).expect("int8 plan");
    for family in ["cudnng", "gemmf", "gemm", "f16+cudnn", "f16+gemm", "direct"] {
        let (mut eng, applied, n) = forced_engine(&pl, Precision::Int8, batch, family);
        eprintln!("{family}: forced on {applied} of {n} convs");
        assert!(applied > 0, "{family} applied to no conv");
        let s = int8_scores_of(&mut eng, &m, &qdq, hw, batch, 8);
        check_int8(&format!("fashion_resnet int8 [{family}]"), s);
        assert!(s.3 >= 0.9, "{family}: agreement with CPU INT8 {}", s.3);
    }
}

/// A MobileNetV2 block and a ResNet tail on [1, 16, 14, 14]: 1x1 expansion (to 24 channels:
/// the int8 pointwise kernel's 4-byte reads and a partial block of output channels) + ReLU6 (Clip),
/// 3x3 depthwise + ReLU6, 1x1 projection + the block's residual, then a 3x3 conv + ReLU.
/// Every fused epilogue the builder has (bias, clip, ReLU, residual) and the depthwise path.
fn mobilenet_block() -> GraphBuilder {
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
fn depthwise_3x3(b: &mut GraphBuilder, x: &str, c: usize) -> String {
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

/// An EfficientNet block on [1, 16, 14, 14]: 1x1 expansion to 32 channels + SiLU (as PyTorch
/// exports it: Sigmoid and Mul), 3x3 depthwise + SiLU, 1x1 projection + the block's residual.
/// SiLU is fused into each conv, the cuDNN graph's as Swish.
fn efficientnet_block() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 16, 14, 14]);
    let silu = |b: &mut GraphBuilder, x: &str, name: &str| {
        let s = b.op("Sigmoid", &format!("{name}.sigmoid"), &[x]);
        b.op("Mul", &format!("{name}.silu"), &[x, &s])
    };
    let e = b.conv("expand", "x", 16, 32, 1);
    let e = silu(&mut b, &e, "expand");
    let dw = depthwise_3x3(&mut b, &e, 32);
    let d = silu(&mut b, &dw, "dw");
    let pr = b.conv("project", &d, 32, 16, 1);
    let y = b.op("Add", "block.add", &[&pr, "x"]);
    b.output(&y);
    b
}

/// A GhostNet bottleneck with a strided shortcut, at the shapes of timm's ghostnet_100
/// blocks.5.0 ([1, 40, 28, 28] -> [1, 80, 14, 14]): each ghost module a 1x1 primary conv and
/// a cheap 3x3 depthwise conv of its output, concatenated and sliced to the module's width;
/// the shortcut a strided depthwise conv and a 1x1 conv, added to the second module's output
/// (the Add fuses into the shortcut's 1x1 conv as its residual).
fn ghost_block() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 40, 28, 28]);
    fn dw(b: &mut GraphBuilder, name: &str, x: &str, c: usize, stride: i64) -> String {
        let w = b.random(&format!("{name}.w"), &[c, 1, 3, 3], 0.5);
        let bias = b.random(&format!("{name}.b"), &[c], 0.1);
        b.node(
            "Conv",
            name,
            &[x, &w, &bias],
            vec![
                proto::ints_attr("pads", &[1, 1, 1, 1]),
                proto::ints_attr("strides", &[stride, stride]),
                proto::int_attr("group", c as i64),
            ],
        )
    }
    fn ghost(
        b: &mut GraphBuilder,
        name: &str,
        x: &str,
        cin: usize,
        out: usize,
        relu: bool,
    ) -> String {
        let half = out / 2;
        let mut p = b.conv(&format!("{name}.primary"), x, cin, half, 1);
        if relu {
            p = b.op("Relu", &format!("{name}.primary.relu"), &[&p]);
        }
        let mut c = dw(b, &format!("{name}.cheap"), &p, half, 1);
        if relu {
            c = b.op("Relu", &format!("{name}.cheap.relu"), &[&c]);
        }
        let cat = b.node(
            "Concat",
            &format!("{name}.concat"),
            &[&p, &c],
            vec![proto::int_attr("axis", 1)],
        );
        let starts = b.ints(&format!("{name}.starts"), &[1], &[0]);
        let ends = b.ints(&format!("{name}.ends"), &[1], &[out as i64]);
        let axes = b.ints(&format!("{name}.axes"), &[1], &[1]);
        b.op(
            "Slice",
            &format!("{name}.slice"),
            &[&cat, &starts, &ends, &axes],
        )
    }
    let g1 = ghost(&mut b, "ghost1", "x", 40, 240, true);
    let d = dw(&mut b, "conv_dw", &g1, 240, 2);
    let g2 = ghost(&mut b, "ghost2", &d, 240, 80, false);
    let s = dw(&mut b, "shortcut.0", "x", 40, 2);
    let s = b.conv("shortcut.2", &s, 40, 80, 1);
    let y = b.op("Add", "block.add", &[&g2, &s]);
    b.output(&y);
    b
}

/// The ghost block in FP16 and FP32 with every conv forced to each float implementation in
/// turn, at batch 1 and 2, against the CPU's FP32 (GhostNet's FP16 engine read 10 dB SQNR
/// where the CPU's FP16 numerics read 57 dB, and left the cuDNN graph conv out it read 55:
/// the graph conv of the shortcut, its residual fused, at batch 1). Forced where it no longer
/// applies, a family takes no conv and is skipped.
#[test]
fn every_float_conv_implementation_matches_cpu_on_a_ghost_block() {
    use quantscope::backend::cuda::ops as plan;
    let Some(_) = gpu() else { return };
    let m = ghost_block().model();
    let hw = [28, 28];
    let mut bad = vec![];
    for batch in [1, 2] {
        let p = m.with_fixed_input(batch, hw);
        let x = input_for(&m, batch, hw, 11);
        let reference = cpu_fp32_run(&m, BuildSpec { batch, hw }, &x);
        for (precision, tol) in [(Precision::Fp16, 2e-2), (Precision::Fp32, 1e-3)] {
            let pl = plan::lower(&p, m.input_shape(batch, hw), precision).expect("float plan");
            for family in FLOAT_FAMILIES {
                let (mut eng, applied, n) = forced_engine(&pl, precision, batch, family);
                if applied == 0 {
                    continue;
                }
                let out = eng.run(&x).expect("cuda run");
                let err = rel_err(&out.data, &reference.data);
                eprintln!(
                    "ghost block batch {batch} {precision} [{family}]: forced on {applied} of {n} convs, rel err {err:.2e}"
                );
                if !(err <= tol) {
                    bad.push(format!(
                        "batch {batch} {precision} [{family}]: rel err {err:.2e}"
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}

/// Builds `plan` with every conv forced to `family` where it applies: the engine and how
/// many convs took it.
fn forced_engine(
    pl: &quantscope::backend::cuda::plan::Plan,
    precision: Precision,
    batch: usize,
    family: &str,
) -> (quantscope::backend::cuda::engine::CudaEngine, usize, usize) {
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
    };
    let (eng, got) = CudaEngine::build(dev, pl.clone(), how, &forced, &|_, _| {})
        .unwrap_or_else(|e| panic!("{precision} [{family}]: {e}"));
    let applied = convs
        .iter()
        .filter(|c| {
            got.convs.get(*c).is_some_and(|k| {
                k == family || k.strip_prefix(family).is_some_and(|r| r.starts_with(':'))
            })
        })
        .count();
    (eng, applied, convs.len())
}

/// Each way of running a float conv (the cuDNN graph conv with its epilogue fused, the
/// cuBLASLt GEMM writing the output from its epilogue, the GEMM + epilogue kernel, cuDNN's
/// legacy conv, the depthwise kernel, the direct kernel), forced on every conv it applies to
/// in FP16 and strict FP32 engines, against the CPU FP32 engine; then each way of running an
/// int8 conv (both pointwise kernels too) against the CPU INT8 engine on the same block
/// (within two output steps).
#[test]
fn every_conv_implementation_matches_cpu_on_a_mobilenet_block() {
    let Some(_) = gpu() else { return };
    let int8 = [
        &["cudnng", "gemmf", "gemm", "f16+cudnn", "dw", "dwr"][..],
        &INT8_KERNELS,
    ]
    .concat();
    every_conv_implementation_matches_cpu(mobilenet_block(), false, &FLOAT_FAMILIES, &int8);
}

/// The same on an EfficientNet block: every implementation with SiLU as its fused activation;
/// the FP16 cuDNN graph takes both dense convs (the expansion's SiLU as Swish). No int8
/// layer here writes int8 through cuBLASLt's own epilogue: the expansion ends in SiLU, and
/// the projection, its residual fused, writes the graph's float output. The streaming 1x1
/// kernels (`mmas`, `mmas64`) take the expansion, SiLU in their register epilogue.
#[test]
fn every_conv_implementation_matches_cpu_on_an_efficientnet_block() {
    let Some(_) = gpu() else { return };
    let int8 = [
        &["cudnng", "gemm", "f16+cudnn", "dw", "dwr", "mmas", "mmas64"][..],
        &INT8_KERNELS,
    ]
    .concat();
    every_conv_implementation_matches_cpu(efficientnet_block(), true, &FLOAT_FAMILIES, &int8);
}

/// The same on a ResNet bottleneck with a strided shortcut, for the int8 tensor-core conv
/// kernel's edges: 48 input channels (less than a tile of the reduction), 96 output channels
/// (a tile and a half), row counts that are no whole tile, a padded 3x3 stride-2 conv and a
/// 1x1 stride-2 one; the streaming 1x1 kernels on the reduction and on the expansion with its
/// residual and ReLU.
#[test]
fn every_conv_implementation_matches_cpu_on_a_bottleneck_block() {
    let Some(_) = gpu() else { return };
    let float = ["cudnng", "gemmf", "gemm", "cudnn", "direct"];
    let int8 = [
        &["cudnng", "gemm", "f16+cudnn", "mmas", "mmas64"][..],
        &INT8_KERNELS,
    ]
    .concat();
    every_conv_implementation_matches_cpu(bottleneck_block(), false, &float, &int8);
}

/// The streaming 1x1 tensor-core kernels (`mmas`, `mmas64`) where each block steps over
/// several pixel tiles, its copies of the next tile beside the current one's work: ResNet
/// layer1's expansion at batch 16 (50,176 pixels, 64 -> 256 channels: 392 tiles of 128 pixels
/// for a grid of about 132 blocks on an H100 or H200), one 1x1 conv with no residual and one
/// with it and ReLU, then a 256 -> 64 reduction (reduction 256: the 64-pixel kernel only) and
/// a float head, forced on every conv, against the CPU INT8 engine within two output steps.
#[test]
fn streaming_1x1_kernels_match_cpu_over_many_tiles() {
    use quantscope::backend::cuda::ops as plan;
    let Some(_) = gpu() else { return };
    let mut b = GraphBuilder::new(&[1, 64, 56, 56]);
    let s = b.conv("shortcut", "x", 64, 256, 1);
    let e = b.conv("expand", "x", 64, 256, 1);
    let add = b.op("Add", "block.add", &[&e, &s]);
    let r = b.op("Relu", "block.relu", &[&add]);
    let c = b.conv("reduce", &r, 256, 64, 1);
    let c = b.op("Relu", "reduce.relu", &[&c]);
    // A head whose float output (the graph's) no streaming kernel writes.
    let y = b.conv("head", &c, 64, 16, 1);
    b.output(&y);
    let m = b.model();
    let (batch, hw) = (16, [56, 56]);
    let x = input_for(&m, batch, hw, 13);
    let (q, cpu8, step) = int8_reference(&m, BuildSpec { batch, hw }, &x);
    let pl = plan::lower(&q, m.input_shape(batch, hw), Precision::Int8).expect("int8 plan");
    for (family, takes) in [("mmas", 2), ("mmas64", 3)] {
        let (mut eng, applied, n) = forced_engine(&pl, Precision::Int8, batch, family);
        let out = eng.run(&x).expect("cuda run");
        let (abs, _) = max_err(&out.data, &cpu8.data);
        eprintln!(
            "int8 [{family}]: forced on {applied} of {n} convs, max abs err {abs:.3e}, step {step:.3e}"
        );
        assert_eq!(applied, takes, "int8: {family} on the convs it applies to");
        assert!(
            abs <= 2.0 * step,
            "int8 [{family}]: max abs err {abs} over two steps of {step}"
        );
    }
}

/// Three parallel convs on one input, concatenated, then a 1x1 (an ASPP head) on
/// [1, 32, 14, 14].
fn aspp_head() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 32, 14, 14]);
    let stem = b.conv("stem", "x", 32, 32, 1);
    let r = b.op("Relu", "stem.relu", &[&stem]);
    let a = b.conv("branch1x1", &r, 32, 32, 1);
    let c = b.conv("branch3x3a", &r, 32, 32, 3);
    let d = b.conv("branch3x3b", &r, 32, 32, 3);
    let cat = b.node(
        "Concat",
        "cat",
        &[&a, &c, &d],
        vec![proto::int_attr("axis", 1)],
    );
    let rc = b.op("Relu", "cat.relu", &[&cat]);
    let y = b.conv("project", &rc, 96, 32, 1);
    b.output(&y);
    b
}

/// Independent branches (an ASPP head's three convs, a bottleneck's strided shortcut) run
/// on streams beside the main one where their implementation takes none of the main
/// stream's scratch (here the cuDNN graph conv in FP16, the tensor-core kernel in int8):
/// the engine says so, its output matches the CPU's, and twenty runs give the same bits
/// (a missing wait between streams shows as a race).
#[test]
fn independent_branches_run_beside_the_main_stream_and_match_cpu() {
    let Some(_) = gpu() else { return };
    use quantscope::backend::cuda::ops as plan;
    // Auxiliary streams are opt-in (see engine::aux_streams). SAFETY: the GPU tests run one
    // at a time (--test-threads=1, tools/gpu_check.sh); nothing else reads the variable now.
    unsafe { std::env::set_var("QUANTSCOPE_CUDA_AUX_STREAMS", "3") };
    for (name, b) in [("aspp", aspp_head()), ("bottleneck", bottleneck_block())] {
        let m = b.model();
        let (batch, hw) = (2, [14, 14]);
        let p = m.with_fixed_input(batch, hw);
        let x = input_for(&m, batch, hw, 11);
        let spec = BuildSpec { batch, hw };
        let reference = cpu_fp32_run(&m, spec, &x);
        let (q, cpu8, step) = int8_reference(&m, spec, &x);
        for (precision, family) in [(Precision::Fp16, "cudnng"), (Precision::Int8, "mma")] {
            let int8 = precision == Precision::Int8;
            let (model, want) = if int8 { (&q, &cpu8) } else { (&p, &reference) };
            let pl = plan::lower(model, m.input_shape(batch, hw), precision).expect("plan");
            let (mut eng, applied, n) = forced_engine(&pl, precision, batch, family);
            let device = eng.info().device.clone();
            let beside: Vec<String> = eng
                .info()
                .layer_times
                .iter()
                .filter(|l| l.kernel.contains("beside the main one"))
                .map(|l| l.layer.clone())
                .collect();
            eprintln!(
                "{name} {precision} [{family}] on {applied} of {n} convs: {device}; beside: {beside:?}"
            );
            assert!(
                device.contains("streams beside the main one"),
                "{name} {precision}: {device}"
            );
            assert!(
                !beside.is_empty(),
                "{name} {precision}: no layer says its stream"
            );
            let first = eng.run(&x).expect("cuda run");
            let (abs, top) = max_err(&first.data, &want.data);
            let tol = if int8 { 2.0 * step } else { 2e-2 * top };
            assert!(
                abs <= tol,
                "{name} {precision}: max abs err {abs} over {tol}"
            );
            for _ in 0..20 {
                let again = eng.run(&x).expect("cuda run");
                assert!(again.data == first.data, "{name} {precision}: runs differ");
            }
        }
    }
    unsafe { std::env::remove_var("QUANTSCOPE_CUDA_AUX_STREAMS") };
}

/// Every conv implementation against the CPU, as on the blocks above, on two stems of a
/// [1, 3, 50, 50] image, concatenated: ResNet's 7x7 stride-2 3 -> 64 and MobileNet's 3x3
/// stride-2 3 -> 32 (each + ReLU). The planner regroups them into 4x4 and 2x2 stride-1 convs
/// over 16 channels, which the row-at-a-time tensor-core kernel (`mmar`) takes: rows of 25
/// output pixels (a 16-pixel tile and a partial one), padded edges, 32 output channels (half
/// a tile of channels).
#[test]
fn every_conv_implementation_matches_cpu_on_stems() {
    let Some(_) = gpu() else { return };
    let mut b = GraphBuilder::new(&[1, 3, 50, 50]);
    let stem = |b: &mut GraphBuilder, name: &str, cout: usize, k: usize| {
        let w = b.random(
            &format!("{name}.w"),
            &[cout, 3, k, k],
            3.0 / (3 * k * k) as f32,
        );
        let bias = b.random(&format!("{name}.b"), &[cout], 0.1);
        let p = (k / 2) as i64;
        let c = b.node(
            "Conv",
            name,
            &["x", &w, &bias],
            vec![
                proto::ints_attr("pads", &[p, p, p, p]),
                proto::ints_attr("strides", &[2, 2]),
            ],
        );
        b.op("Relu", &format!("{name}.relu"), &[&c])
    };
    let r7 = stem(&mut b, "stem7", 64, 7);
    let r3 = stem(&mut b, "stem3", 32, 3);
    let y = b.node(
        "Concat",
        "cat",
        &[&r7, &r3],
        vec![proto::int_attr("axis", 1)],
    );
    b.output(&y);
    every_conv_implementation_matches_cpu(b, false, &["direct"], &["mmar", "mma", "direct"]);
}

/// The same on a chain of depthwise convs, one of each kernel size and stride the int8
/// row-window kernels have (`dwr`), against the depthwise kernel they stand beside (`dw`)
/// and the direct one: padded edges, and rows of 14 and 7 outputs (partial groups of four).
#[test]
fn every_depthwise_implementation_matches_cpu_at_each_row_kernel_shape() {
    let Some(_) = gpu() else { return };
    every_conv_implementation_matches_cpu(
        depthwise_chain(),
        false,
        &["dw", "direct"],
        &["dw", "dwr", "direct"],
    );
}

/// Depthwise convs on [1, 24, 14, 14], pads k / 2: 3x3 stride 1 + ReLU, 3x3 stride 2 +
/// ReLU6 (Clip), 5x5 stride 1 + SiLU, 5x5 stride 2, 7x7 stride 1 + ReLU (14 -> 14 -> 7 -> 7
/// -> 4 -> 4 pixels a side).
fn depthwise_chain() -> GraphBuilder {
    let c = 24;
    let mut b = GraphBuilder::new(&[1, c, 14, 14]);
    let lo = b.constant("zero", &[], &[0.0]);
    let hi = b.constant("six", &[], &[6.0]);
    let mut x = "x".to_string();
    for (i, (k, s)) in [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)]
        .into_iter()
        .enumerate()
    {
        let name = format!("dw{i}");
        let w = b.random(&format!("{name}.w"), &[c, 1, k, k], 2.0 / (k * k) as f32);
        let bias = b.random(&format!("{name}.b"), &[c], 0.1);
        let p = (k / 2) as i64;
        let y = b.node(
            "Conv",
            &name,
            &[&x, &w, &bias],
            vec![
                proto::ints_attr("pads", &[p, p, p, p]),
                proto::ints_attr("strides", &[s, s]),
                proto::int_attr("group", c as i64),
            ],
        );
        x = match i {
            1 => b.op("Clip", &format!("{name}.relu6"), &[&y, &lo, &hi]),
            2 => {
                let sg = b.op("Sigmoid", &format!("{name}.sigmoid"), &[&y]);
                b.op("Mul", &format!("{name}.silu"), &[&y, &sg])
            }
            3 => y,
            _ => b.op("Relu", &format!("{name}.relu"), &[&y]),
        };
    }
    b.output(&x);
    b
}

/// A ResNet bottleneck on [1, 48, 14, 14]: 1x1 48 -> 64 + ReLU, 3x3 stride 2 64 -> 64 + ReLU,
/// 1x1 64 -> 96, plus the 1x1 stride-2 shortcut 48 -> 96, then ReLU.
fn bottleneck_block() -> GraphBuilder {
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

/// The float ways of running a conv that the MobileNet and EfficientNet blocks each reach.
const FLOAT_FAMILIES: [&str; 6] = ["cudnng", "gemmf", "gemm", "cudnn", "dw", "direct"];

/// The NVRTC kernels for int8 convs that each block test forces: both `__dp4a` pointwise
/// kernels, the tensor-core kernel in both tile heights and the direct one.
const INT8_KERNELS: [&str; 5] = ["pw", "pww", "mma", "mma64", "direct"];

/// The int8 reference for `m` on `x`: its Q/DQ model (max calibration on 4 images) with the
/// input fixed at `spec`, the CPU INT8 engine's output, and one output step (the largest
/// output over 127).
fn int8_reference(
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

/// `dense_on_cudnng`: the FP16 cuDNN graph must take every conv but the depthwise one;
/// `float_families`, `int8_families`: the float and int8 ways each applying to some conv of
/// the block. Batch 2 at the block's own input size.
fn every_conv_implementation_matches_cpu(
    b: GraphBuilder,
    dense_on_cudnng: bool,
    float_families: &[&str],
    int8_families: &[&str],
) {
    use quantscope::backend::cuda::ops as plan;
    let m = b.model();
    let (batch, hw) = (2, m.input_hw(None).expect("the block's input size"));
    let p = m.with_fixed_input(batch, hw);
    let x = input_for(&m, batch, hw, 11);
    let spec = BuildSpec { batch, hw };
    let reference = cpu_fp32_run(&m, spec, &x);
    for (precision, tol) in [(Precision::Fp16, 2e-2), (Precision::Fp32, 1e-3)] {
        let pl = plan::lower(&p, m.input_shape(batch, hw), precision).expect("float plan");
        for &family in float_families {
            if precision == Precision::Fp32 && family == "cudnng" {
                continue; // FP16 and int8 layers only
            }
            let (mut eng, applied, n) = forced_engine(&pl, precision, batch, family);
            let out = eng.run(&x).expect("cuda run");
            let err = rel_err(&out.data, &reference.data);
            eprintln!(
                "{precision} [{family}]: forced on {applied} of {n} convs, rel err {err:.2e}"
            );
            assert!(applied > 0, "{precision}: {family} applied to no conv");
            if dense_on_cudnng && family == "cudnng" {
                assert_eq!(applied, n - 1, "{precision}: the cuDNN graph's dense convs");
            }
            assert!(err <= tol, "{precision} [{family}]: rel err {err}");
        }
    }
    let (q, cpu8, step) = int8_reference(&m, spec, &x);
    let pl = plan::lower(&q, m.input_shape(batch, hw), Precision::Int8).expect("int8 plan");
    for &family in int8_families {
        let (mut eng, applied, n) = forced_engine(&pl, Precision::Int8, batch, family);
        let out = eng.run(&x).expect("cuda run");
        let (abs, _) = max_err(&out.data, &cpu8.data);
        eprintln!(
            "int8 [{family}]: forced on {applied} of {n} convs, max abs err {abs:.3e}, step {step:.3e}"
        );
        assert!(applied > 0, "int8: {family} applied to no conv");
        assert!(
            abs <= 2.0 * step,
            "int8 [{family}]: max abs err {abs} over two steps of {step}"
        );
    }
}

/// FP8 (E4M3) engines against the CPU's FP8 simulation of the same Q/DQ model: each way of
/// running an FP8 conv (the cuDNN graph's FP8 conv with its epilogue fused, the FP16 way
/// through cuDNN, the depthwise and direct kernels reading FP8 input), forced on the
/// MobileNet block, then the bundled classifier as the builder chooses. On a GPU without FP8
/// tensor cores the build must fail and say why.
#[test]
fn fp8_engine_matches_the_cpu_fp8_simulation() {
    use quantscope::backend::cuda::engine::Device;
    use quantscope::backend::cuda::ops as plan;
    use quantscope::quant::QFormat;
    let Some(cuda) = gpu() else { return };
    let m = mobilenet_block().model();
    let (batch, hw) = (2, [14, 14]);
    let spec = BuildSpec { batch, hw };
    let x = input_for(&m, batch, hw, 11);
    let qdq = max_qdq_as(&m, hw, 4, QFormat::Fp8E4M3).expect("fp8 qdq");
    let compute = Device::new().expect("device").compute;
    if compute < quantscope::backend::cuda::FP8_COMPUTE {
        let e = cuda
            .build(
                BuildInput::Quantized {
                    model: &m,
                    qdq: &qdq,
                    keep_fp32: &[],
                },
                spec,
            )
            .err()
            .expect("no FP8 engine below compute capability 8.9");
        assert!(e.to_string().contains("FP8"), "{e}");
        eprintln!("skipped: {e}");
        return;
    }
    let cpu8 = cpu_int8_run(&m, &qdq, spec, &x).expect("cpu fp8");
    let fp32 = cpu_fp32_run(&m, spec, &x);
    // The FP8 error itself: a GPU engine of the same numerics differs from the simulation by
    // rounding flips (another summation order), a small part of it.
    let fp8_err = rel_err(&cpu8.data, &fp32.data);
    let tol = 0.5 * fp8_err + 1e-3;
    let q = Model {
        proto: qdq.proto.clone(),
        ..m.clone()
    }
    .with_fixed_input(batch, hw);
    let pl = plan::lower(&q, m.input_shape(batch, hw), Precision::Fp8).expect("fp8 plan");
    for family in ["cudnng", "f16+cudnn", "dw", "direct"] {
        let (mut eng, applied, n) = forced_engine(&pl, Precision::Fp8, batch, family);
        let out = eng.run(&x).expect("cuda run");
        let err = rel_err(&out.data, &cpu8.data);
        eprintln!(
            "fp8 [{family}]: forced on {applied} of {n} convs, rel err {err:.2e} vs the CPU's FP8 (FP8 vs FP32 {fp8_err:.2e})"
        );
        assert!(applied > 0, "fp8: {family} applied to no conv");
        assert!(err <= tol, "fp8 [{family}]: rel err {err} over {tol}");
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models/fashion_resnet.onnx");
    let m = Model::load(&path).expect("sample model loads");
    let hw = m.input_hw(None).expect("fixed input size");
    let spec = BuildSpec { batch: 4, hw };
    let qdq = max_qdq_as(&m, hw, 4, QFormat::Fp8E4M3).expect("fp8 qdq");
    let x = input_for(&m, 4, hw, 12);
    let cpu8 = cpu_int8_run(&m, &qdq, spec, &x).expect("cpu fp8");
    let mut eng = cuda
        .build(
            BuildInput::Quantized {
                model: &m,
                qdq: &qdq,
                keep_fp32: &[],
            },
            spec,
        )
        .expect("cuda fp8 engine");
    let out = eng.run(&x).expect("cuda fp8 run");
    let fp32 = cpu_fp32_run(&m, spec, &x);
    // 22 FP8 layers: rounding flips compound (H100: 4.6e-2 to 6.7e-2 against FP8's own 9.4e-2
    // from FP32, with the builder's timed choices); random inputs give near-tied classes, so
    // the check is the distance, not the argmax.
    let fp8_err = rel_err(&cpu8.data, &fp32.data);
    let err = rel_err(&out.data, &cpu8.data);
    let layers = eng.profile(&x).expect("profile");
    eprintln!(
        "fashion_resnet fp8: rel err {err:.2e} vs the CPU's FP8 (FP8 vs FP32 {fp8_err:.2e}), {} FP8 layers; precisions: {:?}",
        eng.info().int8_nodes,
        layers
            .iter()
            .filter_map(|l| l.precision.clone())
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(eng.info().int8_nodes > 0);
    assert!(
        err <= fp8_err,
        "fashion_resnet fp8: rel err {err} over {fp8_err}"
    );
}

/// A graph touching every op the backend lowers outside Conv/Gemm.
fn op_zoo() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, 12, 12]);
    let c1 = b.conv("c1", "x", 3, 8, 3);
    let hs = b.op("HardSwish", "hs", &[&c1]);
    let mp = {
        let out = "mp.out".to_string();
        b.graph.node.push(proto::node(
            "MaxPool",
            "mp",
            &[&hs],
            &[&out],
            vec![
                proto::ints_attr("kernel_shape", &[3, 3]),
                proto::ints_attr("strides", &[2, 2]),
                proto::ints_attr("pads", &[1, 1, 1, 1]),
            ],
        ));
        out
    };
    let ap = {
        let out = "ap.out".to_string();
        b.graph.node.push(proto::node(
            "AveragePool",
            "ap",
            &[&hs],
            &[&out],
            vec![
                proto::ints_attr("kernel_shape", &[2, 2]),
                proto::ints_attr("strides", &[2, 2]),
            ],
        ));
        out
    };
    let sg = b.op("Sigmoid", "sg", &[&ap]);
    let mul = b.op("Mul", "mul", &[&mp, &sg]);
    let cat = {
        let out = "cat.out".to_string();
        b.graph.node.push(proto::node(
            "Concat",
            "cat",
            &[&mul, &mp],
            &[&out],
            vec![proto::int_attr("axis", 1)],
        ));
        out
    };
    // Depthwise dilated conv, then clip.
    let dw = {
        let w: Vec<f32> = values(16 * 9, 77).iter().map(|v| v * 0.3).collect();
        b.graph
            .initializer
            .push(proto::f32_tensor("dw.w", &[16, 1, 3, 3], &w));
        let out = "dw.out".to_string();
        b.graph.node.push(proto::node(
            "Conv",
            "dw",
            &[&cat, "dw.w"],
            &[&out],
            vec![
                proto::ints_attr("kernel_shape", &[3, 3]),
                proto::ints_attr("pads", &[2, 2, 2, 2]),
                proto::ints_attr("dilations", &[2, 2]),
                proto::int_attr("group", 16),
            ],
        ));
        out
    };
    let clip = {
        b.graph
            .initializer
            .push(proto::f32_tensor("lo", &[], &[0.0]));
        b.graph
            .initializer
            .push(proto::f32_tensor("hi", &[], &[0.5]));
        b.op("Clip", "clip", &[&dw, "lo", "hi"])
    };
    // Resize x2 bilinear (half_pixel) back to 12x12.
    let rs = {
        b.graph
            .initializer
            .push(proto::f32_tensor("roi", &[0], &[]));
        b.graph
            .initializer
            .push(proto::f32_tensor("scales", &[4], &[1.0, 1.0, 2.0, 2.0]));
        let out = "rs.out".to_string();
        let mut attrs = vec![];
        attrs.push(tract_onnx::pb::AttributeProto {
            name: "mode".into(),
            r#type: tract_onnx::pb::attribute_proto::AttributeType::String as i32,
            s: b"linear".to_vec(),
            ..Default::default()
        });
        b.graph.node.push(proto::node(
            "Resize",
            "rs",
            &[&clip, "roi", "scales"],
            &[&out],
            attrs,
        ));
        out
    };
    let pad = {
        b.graph
            .initializer
            .push(proto::i64_tensor("pads", &[8], &[0, 0, 1, 1, 0, 0, 1, 1]));
        b.op("Pad", "pad", &[&rs, "pads"])
    };
    let c2 = b.conv("c2", &pad, 16, 6, 3);
    let sm = {
        let out = "sm.out".to_string();
        b.graph.node.push(proto::node(
            "Softmax",
            "sm",
            &[&c2],
            &[&out],
            vec![proto::int_attr("axis", 1)],
        ));
        out
    };
    let tr = {
        let out = "tr.out".to_string();
        b.graph.node.push(proto::node(
            "Transpose",
            "tr",
            &[&sm],
            &[&out],
            vec![proto::ints_attr("perm", &[0, 1, 3, 2])],
        ));
        out
    };
    b.output(&tr);
    b
}

#[test]
fn op_zoo_fp32_matches_cpu() {
    let Some(g) = gpu() else { return };
    // The shape-arithmetic graph fixes batch 1 in its Resize sizes, as exporters do.
    for (name, m, batch) in [
        ("op_zoo", op_zoo().model_opset(14), 2),
        ("shape_arithmetic", shape_arithmetic().model(), 1),
    ] {
        let e = float_err(&g, &m, Precision::Fp32, batch, [12, 12]);
        eprintln!("{name} fp32 max rel err {e:.3e}");
        assert!(e <= 1e-3, "{name} fp32 rel err {e}");
        let e16 = float_err(&g, &m, Precision::Fp16, batch, [12, 12]);
        eprintln!("{name} fp16 max rel err {e16:.3e}");
        assert!(e16 <= 2e-2, "{name} fp16 rel err {e16}");
    }
}

fn model_files() -> Vec<std::path::PathBuf> {
    let mut v = vec![];
    for dir in ["sample_models", "/work/shared/models"] {
        if let Ok(rd) = std::fs::read_dir(Path::new(dir)) {
            let mut fs: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
                .collect();
            fs.sort();
            v.extend(fs);
        }
    }
    if let Ok(extra) = std::env::var("QUANTSCOPE_TEST_MODELS") {
        v.extend(
            extra
                .split(':')
                .filter(|s| !s.is_empty())
                .map(std::path::PathBuf::from),
        );
    }
    v
}

#[test]
fn bundled_and_shared_models_match_cpu() {
    let Some(g) = gpu() else { return };
    let files = model_files();
    if files.is_empty() {
        eprintln!("skipped: no sample_models/*.onnx or /work/shared/models/*.onnx here");
        return;
    }
    for f in files {
        let m = Model::load(&f).expect("model loads");
        let hw = m.input_hw(None).unwrap_or([224, 224]);
        let e = float_err(&g, &m, Precision::Fp32, 1, hw);
        eprintln!("{} fp32 max rel err {e:.3e}", f.display());
        assert!(e <= 1e-3, "{}: fp32 rel err {e}", f.display());
        let e16 = float_err(&g, &m, Precision::Fp16, 1, hw);
        eprintln!("{} fp16 max rel err {e16:.3e}", f.display());
        assert!(e16 <= 2e-2, "{}: fp16 rel err {e16}", f.display());
    }
}

struct Quiet;
impl quantscope::pipeline::Sink for Quiet {
    fn progress(&self, _: &str, _: usize, _: usize) {}
    fn log(&self, _: &str) {}
}

/// The INT8 criterion on labelled data: each sample experiment's INT8 top-1 / mIoU
/// on the CUDA backend is within 0.5 pt of the CPU backend's, with the same scales (one
/// statistics cache, so both build from identical Q/DQ models).
#[test]
fn samples_int8_metric_matches_cpu() {
    use quantscope::backend::BackendKind;
    use quantscope::experiment::Experiment;
    use quantscope::pipeline::{CancelToken, run_with_cache};
    let Some(_) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("qs-cuda-int8-{}", std::process::id()));
    let cache = quantscope::calib::StatsCache { dir };
    for (name, count) in [("fashion_resnet", 1000), ("fashion_scenes_deeplab", 240)] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("sample_models/{name}.ron"));
        let Ok(mut exp) = Experiment::load(&path) else {
            eprintln!("skipped: {} not found", path.display());
            continue;
        };
        exp.evaluation.count = Some(count);
        exp.precisions = vec![Precision::Fp32, Precision::Int8];
        exp.bench.min_runs = 1;
        exp.bench.min_time_ms = 0.0;
        exp.bench.batch = 1;
        let mut metrics = vec![];
        for kind in [BackendKind::Cpu, BackendKind::Cuda] {
            exp.backend = kind;
            let out =
                run_with_cache(&exp, &cache, &Quiet, &CancelToken::default()).expect("sample runs");
            metrics.push(
                out.report
                    .rows
                    .iter()
                    .map(|r| (r.label(), r.metric(), r.error.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        for (c, g) in metrics[0].iter().zip(&metrics[1]) {
            assert!(g.2.is_none(), "{name} {}: {:?}", g.0, g.2);
            let (c, gm) = (c.1.unwrap_or(0.0), g.1.unwrap_or(0.0));
            eprintln!(
                "{name} {}: cpu {:.2} % cuda {:.2} % (diff {:+.2} pt)",
                g.0,
                c * 100.0,
                gm * 100.0,
                (gm - c) * 100.0
            );
            assert!(
                (gm - c).abs() <= 0.005 + 1e-9,
                "{name} {}: cuda {gm} vs cpu {c}",
                g.0
            );
        }
    }
}

#[test]
fn check_says_why_or_what() {
    match CudaBackend::default().check() {
        Ok(d) => assert!(d.contains("sm_"), "{d}"),
        Err(why) => {
            eprintln!("skipped: {why}");
            assert!(!why.is_empty());
        }
    }
}

/// torchvision's ASPP pooling: the Resize target size comes from the input's shape through
/// `Shape -> Slice -> Concat` (integer arithmetic folded at build time).
fn shape_arithmetic() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, 12, 12]);
    let c = b.conv("c", "x", 3, 4, 3);
    let pooled = b.op("GlobalAveragePool", "gap", &[&c]);
    let shape = b.op("Shape", "shape", &[&c]);
    for (name, v) in [
        ("hw_start", 2i64),
        ("hw_end", 4),
        ("nc_start", 0),
        ("nc_end", 2),
    ] {
        b.graph
            .initializer
            .push(proto::i64_tensor(name, &[1], &[v]));
    }
    let hw = b.op("Slice", "hw", &[&shape, "hw_start", "hw_end"]);
    let nc = b.op("Slice", "nc", &[&shape, "nc_start", "nc_end"]);
    let sizes = b.op("Concat", "sizes", &[&nc, &hw]);
    b.graph
        .node
        .last_mut()
        .map(|n| n.attribute.push(proto::int_attr("axis", 0)));
    let up = "up.out".to_string();
    b.graph.node.push(proto::node(
        "Resize",
        "up",
        &[&pooled, "", "", &sizes],
        &[&up],
        vec![],
    ));
    let y = b.op("Add", "sum", &[&up, &c]);
    b.output(&y);
    b
}

/// Host side only: every model here lowers to a plan in every precision (no GPU needed).
#[test]
fn models_lower_to_plans_without_a_gpu() {
    let mut models: Vec<(String, Model)> = vec![
        (
            "residual_classifier".into(),
            residual_classifier(10).model(),
        ),
        ("op_zoo".into(), op_zoo().model_opset(14)),
        ("shape_arithmetic".into(), shape_arithmetic().model()),
    ];
    for f in model_files() {
        models.push((f.display().to_string(), Model::load(&f).expect("loads")));
    }
    for (name, m) in models {
        let hw = m.input_hw(None).unwrap_or([224, 224]);
        let shape = m.input_shape(1, hw);
        for p in [Precision::Fp32, Precision::Fp16] {
            quantscope::backend::cuda::ops::lower(&m.with_fixed_input(1, hw), shape, p)
                .unwrap_or_else(|e| panic!("{name} {p}: {e}"));
        }
        let qdq = max_qdq(&m, hw, 1).expect("qdq");
        let qm = Model {
            proto: qdq.proto.clone(),
            ..m.clone()
        };
        let pl = quantscope::backend::cuda::ops::lower(
            &qm.with_fixed_input(1, hw),
            shape,
            Precision::Int8,
        )
        .unwrap_or_else(|e| panic!("{name} int8: {e}"));
        eprintln!(
            "{name}: int8 plan with {} steps, {} int8 convs, {} float nodes",
            pl.steps.len(),
            pl.int8_nodes.len(),
            pl.float_nodes.len()
        );
        assert!(!pl.int8_nodes.is_empty());
    }
}

/// A stem, four identical 3x3 conv + ReLU blocks (16 -> 16 channels), and the head: four
/// convs of one shape for the default build effort to time once.
fn repeated_blocks() -> Model {
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let mut x = b.conv("stem", "x", 3, 16, 3);
    for i in 0..4 {
        let c = b.conv(&format!("block{i}.conv"), &x, 16, 16, 3);
        x = b.op("Relu", &format!("block{i}.relu"), &[&c]);
    }
    let y = b.head(&x, 16, 10);
    b.output(&y);
    b.model()
}

/// Every build effort builds FP16 and INT8 engines that match the CPU; the default effort
/// times the repeated shape once and reuses its choice, the fast one times nothing, the
/// exhaustive one times every conv (or each engine names the choice cache, where one is on).
#[test]
fn build_efforts_match_cpu_and_say_how_convs_were_chosen() {
    let Some(_) = gpu() else { return };
    let m = repeated_blocks();
    let hw = [16, 16];
    for effort in [
        BuildEffort::Fast,
        BuildEffort::Default,
        BuildEffort::Exhaustive,
    ] {
        let g = CudaBackend {
            effort,
            ..CudaBackend::strict()
        };
        let e16 = float_err(&g, &m, Precision::Fp16, 2, hw);
        eprintln!("{} fp16 max rel err {e16:.3e}", effort.name());
        assert!(e16 <= 2e-2, "{}: fp16 rel err {e16}", effort.name());
        check_int8(
            &format!("repeated_blocks {}", effort.name()),
            int8_scores(&g, &m, hw, 8, 8),
        );
        let qdq = max_qdq(&m, hw, 4).expect("qdq");
        let eng = g
            .build(
                BuildInput::Quantized {
                    model: &m,
                    qdq: &qdq,
                    keep_fp32: &[],
                },
                BuildSpec { batch: 8, hw },
            )
            .expect("int8 engine");
        let device = eng.info().engine.clone().unwrap_or_default();
        eprintln!("{}: {device}", effort.name());
        assert!(
            device.contains(&format!("build effort {}", effort.name())),
            "{device}"
        );
        let cached = device.contains("from the choice cache");
        match effort {
            BuildEffort::Fast => assert!(
                cached
                    || device.contains("by the fast order, untimed") && !device.contains(" timed"),
                "{device}"
            ),
            BuildEffort::Default => assert!(
                cached || device.contains("reused for a repeated shape"),
                "{device}"
            ),
            BuildEffort::Exhaustive => assert!(!cached && !device.contains("reused"), "{device}"),
        }
    }
}
