//! How the CUDA builder chooses each conv's implementation, against the CPU engines, on a GPU
//! machine: every implementation forced in turn on every layer it applies to (float and int8,
//! on MobileNet, EfficientNet, bottleneck, ghost and stem blocks, a classifier tail with its
//! pool fused into the last conv, and a ResNet layer4 block whose reductions split over
//! clusters, and a chain of 1x1 convs in each plan of the streaming wgmma kernel), and every
//! build effort.
//! Without a usable GPU every test prints why it skips and passes. Tolerances as in
//! `cuda_backend.rs`.

mod common;

use std::path::Path;

use common::cuda::{
    bottleneck_block, check_int8, cpu_fp32_run, depthwise_3x3, float_err, forced_build,
    forced_engine, gpu, hopper_for, input_for, int8_reference, int8_scores, int8_scores_of,
    max_qdq, mobilenet_block, rel_err, took, wgmma_gpu,
};
use common::max_err;

use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildEffort, BuildInput, BuildSpec, Engine, Precision};
use quantscope::model::testing::GraphBuilder;
use quantscope::model::{Model, proto};

/// Each way the builder can run an int8 conv, forced on every conv it applies to (a cached
/// choice naming only the family), against the CPU INT8 engine on the bundled classifier:
/// the cuDNN graph int8 conv, the fused int8-out cuBLASLt GEMM, the raw int32 GEMM +
/// epilogue, the FP16 way through cuDNN and through cuBLASLt, the direct kernel (its convs
/// take no int8 pointwise kernel: the MobileNet block's test forces that one) and, on a
/// Hopper GPU, the wgmma kernels.
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
    let families = ["cudnng", "gemmf", "gemm", "f16+cudnn", "f16+gemm", "direct"];
    for &family in families.iter().chain(hopper_kernels()) {
        let (mut eng, applied, n) = forced_engine(&pl, Precision::Int8, batch, family);
        eprintln!("{family}: forced on {applied} of {n} convs");
        assert!(applied > 0, "{family} applied to no conv");
        let s = int8_scores_of(&mut eng, &m, &qdq, hw, batch, 8);
        check_int8(&format!("fashion_resnet int8 [{family}]"), s);
        assert!(s.3 >= 0.9, "{family}: agreement with CPU INT8 {}", s.3);
    }
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
        &["cudnng", "gemmf", "gemm", "f16+cudnn", "dw", "dwr", "dwt"][..],
        &int8_kernels(),
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
        &[
            "cudnng",
            "gemm",
            "f16+cudnn",
            "dw",
            "dwr",
            "dwt",
            "mmas",
            "mmas64",
        ][..],
        &int8_kernels(),
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
        &int8_kernels(),
    ]
    .concat();
    every_conv_implementation_matches_cpu(bottleneck_block(), false, &float, &int8);
}

/// The streaming 1x1 tensor-core kernels (`mmas`, `mmas64`, and on Hopper the wgmma one,
/// `wgs`) where each block steps over several pixel tiles, its copies of the next tiles beside
/// the current one's work: ResNet layer1's expansion at batch 16 (50,176 pixels, 64 -> 256
/// channels: 392 tiles of 128 pixels for a grid of about 132 blocks on an H100 or H200), one
/// 1x1 conv with no residual and one with it and ReLU, then a 256 -> 64 reduction with hard
/// swish (reduction 256: the 64-pixel `mmas` kernel only) and a float head, forced on every
/// conv, against the CPU INT8 engine within two output steps.
#[test]
fn streaming_1x1_kernels_match_cpu_over_many_tiles() {
    let Some(_) = gpu() else { return };
    let mut b = GraphBuilder::new(&[1, 64, 56, 56]);
    let s = b.conv("shortcut", "x", 64, 256, 1);
    let e = b.conv("expand", "x", 64, 256, 1);
    let add = b.op("Add", "block.add", &[&e, &s]);
    let r = b.op("Relu", "block.relu", &[&add]);
    let c = b.conv("reduce", &r, 256, 64, 1);
    let c = b.op("HardSwish", "reduce.hswish", &[&c]);
    // A head whose float output (the graph's) no streaming kernel writes.
    let y = b.conv("head", &c, 64, 16, 1);
    b.output(&y);
    let m = b.model_opset(14);
    let (batch, hw) = (16, [56, 56]);
    let x = input_for(&m, batch, hw, 13);
    let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
    let wgs: &[(&str, usize)] = if wgmma_gpu() { &[("wgs", 3)] } else { &[] };
    for &(family, takes) in [("mmas", 2), ("mmas64", 3)].iter().chain(wgs) {
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

/// The implicit GEMM tensor-core kernels (`mma`, `mma64`, and on Hopper the `wgmma` ones, the
/// 128-channel tiles of `wgmmaw` among them) over many pixel tiles and reduction tiles: a
/// ResNet layer3 block at batch 4 (28 x 28, 3,136 pixels: 25 tiles of 128, the last partial),
/// two 3x3 256 -> 256 convs (reduction 2,304 bytes: 18 tiles of 128, so every stage of the
/// copy pipeline is refilled; two 128-channel tiles), the second with the block's input added
/// and ReLU, then a float 1x1 head, forced on every conv, against the CPU INT8 engine within
/// two output steps. The blocks above have reductions of a few tiles and grids of a few
/// blocks.
#[test]
fn implicit_gemm_kernels_match_cpu_over_many_tiles_and_stages() {
    let Some(_) = gpu() else { return };
    let m = resnet_3x3_block([28, 28], 16, 1);
    let (batch, hw) = (4, [28, 28]);
    let x = input_for(&m, batch, hw, 17);
    let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
    let wide: &[&str] = if wgmma_gpu() { &["wgmmaw"] } else { &[] };
    for family in [
        &["mma", "mma64"][..],
        hopper_kernels(),
        wide,
        hopper_split_kernels(),
    ]
    .concat()
    {
        let (mut eng, applied, n) = forced_engine(&pl, Precision::Int8, batch, family);
        let out = eng.run(&x).expect("cuda run");
        let (abs, _) = max_err(&out.data, &cpu8.data);
        eprintln!(
            "int8 [{family}]: forced on {applied} of {n} convs, max abs err {abs:.3e}, step {step:.3e}"
        );
        assert!(
            applied >= 2,
            "int8: {family} on {applied} of {n} convs, not both 3x3 ones"
        );
        assert!(
            abs <= 2.0 * step,
            "int8 [{family}]: max abs err {abs} over two steps of {step}"
        );
    }
}

/// The wgmma kernels with each tile's reduction split over a cluster of blocks (`wgmma:k`,
/// `wgmma64:k`, `wgmmaw:k`), forced on ResNet-50's layer4 in small: 7x7 maps, 3x3 256 -> 256
/// convs (reductions of 18 tiles of 128 bytes), ReLU, the block's input added, then a 3x3
/// 256 -> 128 conv whose float output is the model's (the epilogue's generic path). At batch
/// 1 and 3 (49 and 147 pixels: one to three tiles of 64, each split 8 ways, so that some
/// blocks' share of the rows lies past the last pixel), against the CPU INT8 engine within
/// two output steps, twice a build. The many-tiles test above splits 2 ways.
#[test]
fn split_reduction_wgmma_kernels_match_cpu() {
    let Some(_) = gpu() else { return };
    if !hopper_for("the split-reduction kernels") {
        return;
    }
    let m = resnet_3x3_block([7, 7], 128, 3);
    for batch in [1, 3] {
        let hw = [7, 7];
        let x = input_for(&m, batch, hw, 23);
        let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
        for &family in hopper_split_kernels() {
            let (mut eng, keys) = forced_build(&pl, Precision::Int8, batch, family);
            let what = format!("batch {batch} int8 [{family}]: {keys:?}");
            let applied = keys.values().filter(|k| took(k, family)).count();
            // The 128-channel tiles take the 256-channel convs; the last one's 128 too.
            assert_eq!(applied, 3, "{what}: on {applied} of 3 convs");
            assert!(
                keys.values().all(|k| k.ends_with(":8")),
                "{what}: not split 8 ways"
            );
            twice_within_two_steps(&mut eng, &x, &cpu8.data, step, &what);
        }
    }
}

/// The streaming wgmma 1x1 kernel (`wgs`) in each of its plans: a bottleneck-like chain on
/// 26 x 26 maps at batch 26 (17,576 pixels: 274 tiles of 64 and a partial one, so that every
/// block streams two tiles or more, which the builder asks of the kernel), 160 -> 512 + ReLU
/// (a reduction of 192 bytes, 160 of them x's: a 128-byte block of the weights and half of
/// one, zeros past the input's row; two stages at three blocks an SM, four at two, six at
/// one), 512 -> 160 with the chain's input added and ReLU (512: one block an SM, five stages;
/// the residual's last 64-channel box half past its row), 160 -> 1024 + ReLU, 1024 -> 64 +
/// hard swish (1,024: one block an SM, two stages), then a float 1x1 head no streaming kernel
/// takes. Forced as the family (each conv's first plan, the most blocks an SM), then on one
/// block an SM (`wgs:1`) and two (`wgs:2`), against the CPU INT8 engine within two output
/// steps, twice a build (the ring's stages reused across tiles).
#[test]
fn streaming_wgmma_kernel_matches_cpu_in_each_plan() {
    let Some(_) = gpu() else { return };
    if !hopper_for("the streaming wgmma kernel") {
        return;
    }
    let mut b = GraphBuilder::new(&[1, 160, 26, 26]);
    let a = b.conv("expand", "x", 160, 512, 1);
    let a = b.op("Relu", "expand.relu", &[&a]);
    let r = b.conv("reduce", &a, 512, 160, 1);
    let add = b.op("Add", "block.add", &[&r, "x"]);
    let r = b.op("Relu", "block.relu", &[&add]);
    let w = b.conv("wide", &r, 160, 1024, 1);
    let w = b.op("Relu", "wide.relu", &[&w]);
    let n = b.conv("narrow", &w, 1024, 64, 1);
    let n = b.op("HardSwish", "narrow.hswish", &[&n]);
    let y = b.conv("head", &n, 64, 16, 1);
    b.output(&y);
    let m = b.model_opset(14);
    let (batch, hw) = (26, [26, 26]);
    let x = input_for(&m, batch, hw, 29);
    let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
    for (family, takes) in [("wgs", 4), ("wgs:1", 4), ("wgs:2", 2)] {
        let (mut eng, keys) = forced_build(&pl, Precision::Int8, batch, family);
        let what = format!("int8 [{family}]: {keys:?}");
        let applied = keys.values().filter(|k| took(k, family)).count();
        assert_eq!(applied, takes, "{what}: on {applied} convs");
        twice_within_two_steps(&mut eng, &x, &cpu8.data, step, &what);
    }
}

/// The streaming wgmma kernel (`wgs`) on convs whose filter rows are contiguous windows of a
/// padded input: ResNet's 7x7 stride-2 stem (3 -> 32 channels, half a tile of them, + ReLU) on
/// [24, 3, 96, 96], which the planner regroups into a 4x4 conv over 16 channels of 51 x 51
/// blocks (64-byte window rows, a 64-byte swizzle), then a 4x4 32 -> 64 conv without padding
/// (128-byte rows, the 128-byte swizzle, + hard swish) and a 1x1 head. Their tiles are rows of
/// 48 and 45 output pixels, whose last 16 and 19 positions compute windows that wrap into the
/// next row and must not be written; the blocks' stretches of tiles cross from one image to
/// the next. Forced as the family (the stem's plan of four blocks an SM and seven window
/// boxes, the other's of two and eight), on two blocks an SM (the stem's 16 boxes) and on one
/// (the second conv's 16), against the CPU INT8 engine within two output steps, twice a build.
#[test]
fn streaming_wgmma_kernel_matches_cpu_on_stem_windows() {
    let Some(_) = gpu() else { return };
    if !hopper_for("the streaming wgmma kernel") {
        return;
    }
    let mut b = GraphBuilder::new(&[1, 3, 96, 96]);
    let w = b.random("stem.w", &[32, 3, 7, 7], 3.0 / 147.0);
    let bias = b.random("stem.b", &[32], 0.1);
    let stem = b.node(
        "Conv",
        "stem",
        &["x", &w, &bias],
        vec![
            proto::ints_attr("pads", &[3, 3, 3, 3]),
            proto::ints_attr("strides", &[2, 2]),
        ],
    );
    let r = b.op("Relu", "stem.relu", &[&stem]);
    let w = b.random("valid.w", &[64, 32, 4, 4], 3.0 / 512.0);
    let bias = b.random("valid.b", &[64], 0.1);
    let v = b.node("Conv", "valid", &[&r, &w, &bias], vec![]);
    let v = b.op("HardSwish", "valid.hswish", &[&v]);
    let y = b.conv("head", &v, 64, 16, 1);
    b.output(&y);
    let m = b.model_opset(14);
    let (batch, hw) = (24, [96, 96]);
    let x = input_for(&m, batch, hw, 31);
    let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
    let both: &[&str] = &["stem", "valid"];
    for (family, convs) in [("wgs", both), ("wgs:2", both), ("wgs:1", &["valid"])] {
        let (mut eng, keys) = forced_build(&pl, Precision::Int8, batch, family);
        let what = format!("int8 [{family}]: {keys:?}");
        for conv in convs {
            assert!(
                keys.iter()
                    .any(|(name, k)| name.starts_with(conv) && took(k, family)),
                "{what}: not on {conv}"
            );
        }
        twice_within_two_steps(&mut eng, &x, &cpu8.data, step, &what);
    }
}

/// Every conv implementation against the CPU, as on the blocks above, on two stems of a
/// [1, 3, 50, 50] image, concatenated: ResNet's 7x7 stride-2 3 -> 64 + ReLU and MobileNetV3's
/// 3x3 stride-2 3 -> 32 + hard swish. The planner regroups them into 4x4 and 2x2 stride-1 convs
/// over 16 channels, which the row-at-a-time tensor-core kernel (`mmar`) takes: rows of 25
/// output pixels (a 16-pixel tile and a partial one), padded edges, 32 output channels (half
/// a tile of channels).
#[test]
fn every_conv_implementation_matches_cpu_on_stems() {
    let Some(_) = gpu() else { return };
    let mut b = GraphBuilder::new(&[1, 3, 50, 50]);
    let stem = |b: &mut GraphBuilder, name: &str, cout: usize, k: usize, act: &str| {
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
        b.op(act, &format!("{name}.act"), &[&c])
    };
    let r7 = stem(&mut b, "stem7", 64, 7, "Relu");
    let r3 = stem(&mut b, "stem3", 32, 3, "HardSwish");
    let y = b.node(
        "Concat",
        "cat",
        &[&r7, &r3],
        vec![proto::int_attr("axis", 1)],
    );
    b.output(&y);
    let int8 = [&["mmar", "mma", "direct"][..], hopper_kernels()].concat();
    every_conv_implementation_matches_cpu(b, false, &["direct"], &int8);
}

/// The same on a classifier's end, where the int8 GEMV (`pwv`) takes the layers of a few
/// rows: a 3x3 conv + ReLU on [n, 32, 4, 4], its global average pool, two 1x1 convs on the
/// pooled [n, 2080, 1, 1] (2080 -> 20 + ReLU, a reduction longer than the GEMV's 2048 bytes
/// of weights in flight, so that it loads them in two rounds; then 20 -> 64 + hard swish,
/// 20-byte rows read a word at a time: a squeeze-excitation's shape) and the Gemm to 100
/// classes with its float output; against the other int8 kernels that take rows (both
/// `__dp4a` pointwise ones, the tensor-core ones) and the direct one. Batch 2 and 4 (the
/// GEMV's most rows).
#[test]
fn classifier_rows_on_every_int8_kernel_match_cpu() {
    let Some(_) = gpu() else { return };
    for batch in [2, 4] {
        classifier_rows_at(batch);
    }
}

fn classifier_rows_at(batch: usize) {
    let mut b = GraphBuilder::new(&[1, 32, 4, 4]);
    let c = b.conv("conv", "x", 32, 2080, 3);
    let r = b.op("Relu", "conv.relu", &[&c]);
    let p = b.op("GlobalAveragePool", "pool", &[&r]);
    let s1 = b.conv("squeeze", &p, 2080, 20, 1);
    let s1 = b.op("Relu", "squeeze.relu", &[&s1]);
    let s2 = b.conv("excite", &s1, 20, 64, 1);
    let s2 = b.op("HardSwish", "excite.act", &[&s2]);
    let f = b.op("Flatten", "flatten", &[&s2]);
    let w = b.random("fc.w", &[100, 64], 0.5);
    let bias = b.random("fc.b", &[100], 0.1);
    let y = b.node(
        "Gemm",
        "fc",
        &[&f, &w, &bias],
        vec![proto::int_attr("transB", 1)],
    );
    b.output(&y);
    let int8 = [
        &["pwv", "pw", "pww", "mma", "mma64", "direct"][..],
        hopper_kernels(),
    ]
    .concat();
    every_conv_implementation_matches_cpu_at(b, batch, false, &["direct"], &int8);
}

/// A classifier's tail with the global average pool fused into its last conv (3x3 128 ->
/// 128, the residual of a 1x1 16 -> 128 before it, ReLU, on 7x7 maps: ResNet-50's last block
/// in small): the pooled conv forced onto each tensor-core kernel (mma.sync in 128- and
/// 64-pixel tiles, on a Hopper GPU the wgmma ones, 128-channel tiles included) against the
/// CPU INT8 engine, twice a build (each image's count of finished tiles is reset for the next
/// run). Tiles hold one image each: 7x7 images take one tile of 64 or 128 pixels, at batch 1
/// and 3; 12x10 ones (120 pixels) two 64-pixel tiles, whose sums the last to finish adds up.
/// ReLU, and the other activations the pooled epilogue computes inline: hard swish, SiLU.
#[test]
fn a_conv_with_its_global_pool_fused_matches_cpu_on_every_tensor_core_kernel() {
    let Some(_) = gpu() else { return };
    let cases = [
        (1, [7, 7], "Relu"),
        (3, [7, 7], "Relu"),
        (2, [12, 10], "Relu"),
        (2, [7, 7], "HardSwish"),
        (2, [12, 10], "Silu"),
    ];
    for (batch, hw, act) in cases {
        let mut b = GraphBuilder::new(&[1, 16, 7, 7]);
        let a = b.conv("expand", "x", 16, 128, 1);
        let a = b.op("Relu", "expand.relu", &[&a]);
        let c = b.conv("last", &a, 128, 128, 3);
        let add = b.op("Add", "last.add", &[&c, &a]);
        let r = if act == "Silu" {
            let s = b.op("Sigmoid", "last.sigmoid", &[&add]);
            b.op("Mul", "last.silu", &[&add, &s])
        } else {
            b.op(act, "last.act", &[&add])
        };
        let y = b.head(&r, 128, 10);
        b.output(&y);
        let m = b.model_opset(14);
        let x = input_for(&m, batch, hw, 5);
        let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
        let pooled = pl.steps.iter().find_map(|s| match s {
            quantscope::backend::cuda::plan::Step::Conv(c)
                if c.pool_hw == Some(hw) && c.residual.is_some() =>
            {
                Some(c.name.clone())
            }
            _ => None,
        });
        let pooled = pooled.expect("the pool fuses into the last conv with its residual");
        let wide: &[&str] = if wgmma_gpu() { &["wgmmaw"] } else { &[] };
        for &family in [&["mma", "mma64"][..], hopper_kernels(), wide]
            .concat()
            .iter()
        {
            let (mut eng, keys) = forced_build(&pl, Precision::Int8, batch, family);
            let what = format!("batch {batch} {hw:?} {act} int8 [{family}]: {keys:?}");
            assert!(
                took(&keys[&pooled], family),
                "{what}: {pooled} not on {family}"
            );
            // Twice: an image's last tile reset its count for the next run.
            twice_within_two_steps(&mut eng, &x, &cpu8.data, step, &what);
        }
    }
}

/// The same on a chain of depthwise convs, one of each kernel size and stride the int8
/// row-window kernels have (`dwr`), then a dilated one and one that reads a centering Pad
/// folded into it (a pad code), against the other depthwise kernels (`dw`, the shared-memory
/// tile one `dwt`) and the direct one: padded edges, rows of 14 and 7 outputs (partial groups
/// of four), 24 channels (six groups, no power of two).
#[test]
fn every_depthwise_implementation_matches_cpu_at_each_row_kernel_shape() {
    use quantscope::backend::cuda::ops as plan;
    use quantscope::backend::cuda::plan::{DType, Step};
    let Some(_) = gpu() else { return };
    let m = depthwise_chain().model_opset(14);
    let hw = m.input_hw(None).expect("the chain's input size");
    let q = max_qdq(&m, hw, 4).expect("qdq");
    let p = Model {
        proto: q.proto.clone(),
        ..m.clone()
    }
    .with_fixed_input(2, hw);
    let pl = plan::lower(&p, m.input_shape(2, hw), Precision::Int8).expect("int8 plan");
    // The centering Pad folds into the last depthwise conv, which writes FP16 for the pool.
    let last = pl.steps.iter().find_map(|s| match s {
        Step::Conv(c) if c.pad_code != 0 => Some(c),
        _ => None,
    });
    let last = last.expect("the centering Pad folds into the last depthwise conv");
    assert_eq!(pl.tensors[last.out].dtype, DType::F16, "{}", last.name);
    every_conv_implementation_matches_cpu(
        depthwise_chain(),
        false,
        &["dw", "direct"],
        &["dw", "dwr", "dwt", "direct"],
    );
}

/// Depthwise convs on [1, 24, 14, 14], pads k / 2: 3x3 stride 1 + ReLU, 3x3 stride 2 +
/// ReLU6 (Clip), 5x5 stride 1 + SiLU, 5x5 stride 2, 7x7 stride 1 + hard swish (14 -> 14 -> 7 -> 7
/// -> 4 -> 4 pixels a side); then 3x3 dilation 2 (pads 2) + ReLU, and activation centering's
/// Pad of -0.5 (one pixel a side) before a 3x3 conv that pads nothing (4 -> 4 -> 6 -> 4),
/// with SiLU, whose output a global average pool reads in float, as EfficientNets'
/// squeeze-excite does (the depthwise kernels' FP16 epilogue).
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
            4 => b.op("HardSwish", &format!("{name}.hswish"), &[&y]),
            _ => b.op("Relu", &format!("{name}.relu"), &[&y]),
        };
    }
    let dilated = depthwise(
        &mut b,
        "dw5",
        &x,
        c,
        vec![proto::ints_attr("dilations", &[2, 2])],
    );
    x = b.op("Relu", "dw5.relu", &[&dilated]);
    let pads = b.ints("dw6.pads", &[8], &[0, 0, 1, 1, 0, 0, 1, 1]);
    let v = b.constant("dw6.value", &[], &[-0.5]);
    let padded = b.op("Pad", "dw6.pad", &[&x, &pads, &v]);
    let y = depthwise(
        &mut b,
        "dw6",
        &padded,
        c,
        vec![proto::ints_attr("pads", &[0; 4])],
    );
    let sg = b.op("Sigmoid", "dw6.sigmoid", &[&y]);
    let silu = b.op("Mul", "dw6.silu", &[&y, &sg]);
    let pooled = b.op("GlobalAveragePool", "pool", &[&silu]);
    b.output(&pooled);
    b
}

/// A 3x3 depthwise conv of `c` channels with random weights and bias, pads 2 a side unless
/// `attrs` say otherwise.
fn depthwise(
    b: &mut GraphBuilder,
    name: &str,
    x: &str,
    c: usize,
    mut attrs: Vec<tract_onnx::pb::AttributeProto>,
) -> String {
    let w = b.random(&format!("{name}.w"), &[c, 1, 3, 3], 2.0 / 9.0);
    let bias = b.random(&format!("{name}.b"), &[c], 0.1);
    if !attrs.iter().any(|a| a.name == "pads") {
        attrs.push(proto::ints_attr("pads", &[2; 4]));
    }
    attrs.push(proto::int_attr("group", c as i64));
    b.node("Conv", name, &[x, &w, &bias], attrs)
}

/// The float ways of running a conv that the MobileNet and EfficientNet blocks each reach.
const FLOAT_FAMILIES: [&str; 6] = ["cudnng", "gemmf", "gemm", "cudnn", "dw", "direct"];

/// The NVRTC kernels for int8 convs that each block test forces: both `__dp4a` pointwise
/// kernels, the tensor-core kernel in both tile heights, the direct one, and on a Hopper GPU
/// the wgmma kernels.
fn int8_kernels() -> Vec<&'static str> {
    [
        &["pw", "pww", "mma", "mma64", "direct"][..],
        hopper_kernels(),
    ]
    .concat()
}

/// The int8 kernels of compute capability 9.0 alone: the wgmma kernel's 64-channel tiles on a
/// Hopper GPU, none elsewhere (the builder does not offer them there). Its 128-channel tiles
/// need 128 output channels or more, which only the many-tiles test's block and the fused
/// pool's test have.
fn hopper_kernels() -> &'static [&'static str] {
    if wgmma_gpu() {
        &["wgmma", "wgmma64"]
    } else {
        &[]
    }
}

/// A ResNet block on `hw` maps: two 3x3 256 -> 256 convs (ReLU; the block's input added,
/// ReLU), then a `k` x `k` 256 -> `cout` conv whose float output is the model's.
fn resnet_3x3_block(hw: [usize; 2], cout: usize, k: usize) -> Model {
    let mut b = GraphBuilder::new(&[1, 256, hw[0], hw[1]]);
    let c1 = b.conv("conv1", "x", 256, 256, 3);
    let r1 = b.op("Relu", "conv1.relu", &[&c1]);
    let c2 = b.conv("conv2", &r1, 256, 256, 3);
    let add = b.op("Add", "block.add", &[&c2, "x"]);
    let r2 = b.op("Relu", "block.relu", &[&add]);
    let y = b.conv("last", &r2, 256, cout, k);
    b.output(&y);
    b.model()
}

/// Model `m`'s int8 plan at `batch` on `hw` images (quantized as `int8_reference` does), and
/// the CPU INT8 engine's output on `x` with its output step: what the forced builds are checked
/// against.
fn int8_plan(
    m: &Model,
    batch: usize,
    hw: [usize; 2],
    x: &[f32],
) -> (
    quantscope::backend::cuda::plan::Plan,
    quantscope::backend::Output,
    f32,
) {
    use quantscope::backend::cuda::ops as plan;
    let (q, cpu8, step) = int8_reference(m, BuildSpec { batch, hw }, x);
    let pl = plan::lower(&q, m.input_shape(batch, hw), Precision::Int8).expect("int8 plan");
    (pl, cpu8, step)
}

/// Runs `eng` on `x` twice: the output within two steps `step` of the CPU INT8 engine's
/// (`cpu8`), and the second run's the same as the first (state a run leaves behind, a count of
/// finished tiles, would show there). `what` names the engine in the log and the failures.
fn twice_within_two_steps(
    eng: &mut quantscope::backend::cuda::engine::CudaEngine,
    x: &[f32],
    cpu8: &[f32],
    step: f32,
    what: &str,
) {
    let out = eng.run(x).expect("cuda run");
    let (abs, _) = max_err(&out.data, cpu8);
    eprintln!("{what}, max abs err {abs:.3e}, step {step:.3e}");
    assert!(
        abs <= 2.0 * step,
        "{what}: max abs err {abs} over two steps of {step}"
    );
    let again = eng.run(x).expect("cuda run");
    assert_eq!(again.data, out.data, "{what}: a second run differs");
}

/// The wgmma kernels with a split reduction (any number of blocks a tile) on a Hopper GPU,
/// none elsewhere.
fn hopper_split_kernels() -> &'static [&'static str] {
    if wgmma_gpu() {
        &["wgmma:k", "wgmma64:k", "wgmmaw:k"]
    } else {
        &[]
    }
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
    every_conv_implementation_matches_cpu_at(b, 2, dense_on_cudnng, float_families, int8_families)
}

/// The same at batch `batch`.
fn every_conv_implementation_matches_cpu_at(
    b: GraphBuilder,
    batch: usize,
    dense_on_cudnng: bool,
    float_families: &[&str],
    int8_families: &[&str],
) {
    use quantscope::backend::cuda::ops as plan;
    // Opset 14: HardSwish.
    let m = b.model_opset(14);
    let hw = m.input_hw(None).expect("the block's input size");
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
    let (pl, cpu8, step) = int8_plan(&m, batch, hw, &x);
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
        let device = int8_engine_description(&g, &m, hw);
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

/// Near ties settled in the run: with every candidate within 100 % of the fastest alone a
/// contender, an exhaustive INT8 build times the contenders again with their neighbours, says
/// how many it settled, matches the CPU INT8 engine, and a margin of 0 settles none.
#[test]
fn near_ties_are_settled_in_the_run_and_match_cpu() {
    let Some(_) = gpu() else { return };
    let m = repeated_blocks();
    let hw = [16, 16];
    for (near_tie, settles) in [(1.0, true), (0.0, false)] {
        let g = CudaBackend {
            effort: BuildEffort::Exhaustive,
            near_tie: Some(near_tie),
            ..CudaBackend::strict()
        };
        let label = format!("repeated_blocks, near tie {near_tie}");
        check_int8(&label, int8_scores(&g, &m, hw, 8, 8));
        let device = int8_engine_description(&g, &m, hw);
        eprintln!("{label}: {device}");
        assert_eq!(
            device.contains("near ties settled in the run"),
            settles,
            "{device}"
        );
    }
}

/// How the builder says it chose the convs of `m`'s INT8 engine at batch 8 (max calibration).
fn int8_engine_description(g: &CudaBackend, m: &Model, hw: [usize; 2]) -> String {
    let qdq = max_qdq(m, hw, 4).expect("qdq");
    let eng = g
        .build(
            BuildInput::Quantized {
                model: m,
                qdq: &qdq,
                keep_fp32: &[],
            },
            BuildSpec { batch: 8, hw },
        )
        .expect("int8 engine");
    eng.info().engine.clone().unwrap_or_default()
}
