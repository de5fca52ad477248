//! Planner tests: fusion, layouts, buffers, and the op families on small graphs.

use super::*;
use crate::backend::cuda::plan::{
    ConvStep, assign_buffers, oihw_to_ohwi, reshape_dims, squeeze_dims,
};
use crate::model::testing::{GraphBuilder, residual_classifier};

pub(crate) fn plan_of(b: &GraphBuilder, shape: [usize; 4], p: Precision) -> Plan {
    let m = b.model();
    lower(
        &m.with_fixed_input(shape[0], [shape[2], shape[3]]),
        shape,
        p,
    )
    .expect("lowers")
}

/// The plan's conv steps, in order.
fn conv_steps(plan: &Plan) -> Vec<&ConvStep> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::Conv(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// Max ranges of `amax` for every tensor the plan quantizes.
fn amax_everywhere(qp: &crate::quant::QuantPlan, amax: f32) -> crate::calib::Ranges {
    crate::calib::Ranges {
        method: crate::calib::Method::Max,
        percentile: 99.99,
        amax: qp.tensors().into_iter().map(|t| (t, amax)).collect(),
        bias_correction: Default::default(),
    }
}

/// The INT8 plan of `b` at `shape`, every quantized tensor at amax `amax`.
fn int8_plan_of(b: &GraphBuilder, shape: [usize; 4], amax: f32) -> Plan {
    int8_plan_for(b, shape, amax, Target::default())
}

/// `int8_plan_of` for a `target` GPU.
fn int8_plan_for(b: &GraphBuilder, shape: [usize; 4], amax: f32, target: Target) -> Plan {
    let m = b.model();
    let qp = crate::quant::plan(&m, &[]);
    let qdq = crate::quant::build_qdq(&m, &qp, Some(&amax_everywhere(&qp, amax))).expect("qdq");
    lower_for(
        &crate::model::Model {
            proto: qdq.proto.clone(),
            ..m.clone()
        }
        .with_fixed_input(shape[0], [shape[2], shape[3]]),
        shape,
        Precision::Int8,
        target,
        &[],
        &[],
    )
    .expect("int8 lowers")
}

/// A bottleneck as torchvision orders it: the main branch's last conv comes before the
/// shortcut conv, both feed the Add.
fn shortcut_after_main() -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 8, 8, 8]);
    let r = b.conv("stem", "x", 8, 16, 1);
    let r = b.op("Relu", "stem.relu", &[&r]);
    let a = b.conv("main.conv1", &r, 16, 16, 3);
    let a = b.op("Relu", "main.relu", &[&a]);
    let m = b.conv("main.conv2", &a, 16, 32, 1);
    let d = b.conv("downsample", &r, 16, 32, 1);
    let s = b.op("Add", "add", &[&m, &d]);
    let y = b.op("Relu", "add.relu", &[&s]);
    b.output(&y);
    b
}

#[test]
fn residual_add_fuses_when_the_shortcut_comes_later() {
    let b = shortcut_after_main();
    let fp32 = plan_of(&b, [1, 8, 8, 8], Precision::Fp32);
    let int8 = int8_plan_of(&b, [1, 8, 8, 8], 4.0);
    let residual_conv = |plan: &Plan| {
        plan.steps.iter().find_map(|s| match s {
            Step::Conv(c) if c.residual.is_some() => Some(c.clone()),
            _ => None,
        })
    };
    for (what, plan) in [("fp32", &fp32), ("int8", &int8)] {
        let fused =
            residual_conv(plan).unwrap_or_else(|| panic!("{what}: no conv took the residual"));
        assert_eq!(fused.act, Act::Relu, "{what}");
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Nary { .. })),
            "{what}: a standalone Add is left"
        );
        // Every conv is lowered exactly once.
        let convs = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Conv(_)))
            .count();
        let names: Vec<&str> = plan.steps.iter().map(|s| s.name()).collect();
        assert_eq!(convs, 4, "{what}: {names:?}");
    }
    let fused = residual_conv(&int8).expect("int8 residual conv");
    let r = fused.residual.expect("residual");
    assert_eq!(int8.tensors[r].dtype, DType::I8, "int8 shortcut stays int8");
    // The shortcut conv took its QuantizeLinear, and the input's went into the input's NHWC
    // transpose (`fold_casts`): no separate quantize step.
    let quantizes: Vec<&str> = int8
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Unary { out, .. } if int8.tensors[*out].dtype == DType::I8))
        .map(|s| s.name())
        .collect();
    assert!(quantizes.is_empty(), "{quantizes:?}");
    let first = &int8.steps[0];
    assert!(
        matches!(first, Step::View { .. }) && int8.tensors[first.output()].dtype == DType::I8,
        "the input transpose writes int8: {}",
        first.name()
    );
}

#[test]
fn residual_classifier_fuses_conv_bias_add_relu() {
    let b = residual_classifier(5);
    let plan = plan_of(&b, [2, 3, 16, 16], Precision::Fp32);
    let convs = conv_steps(&plan);
    assert_eq!(convs.len(), 4, "stem, two block convs, fc");
    // stem: BN folded by Model::load, relu fused.
    assert_eq!(convs[0].act, Act::Relu);
    // block.conv2 + add + relu in one step.
    let c2 = convs
        .iter()
        .find(|c| c.name == "block.conv2")
        .expect("conv2");
    assert!(c2.residual.is_some());
    assert_eq!(c2.act, Act::Relu);
    assert_eq!(c2.fused, vec!["block.add", "block.relu2"]);
    // No standalone Add/Relu left.
    assert!(!plan.steps.iter().any(|s| matches!(s, Step::Nary { .. })));
    let out = &plan.tensors[plan.output];
    assert_eq!(out.shape, vec![2, 5]);
    assert_eq!(out.dtype, DType::F32);
    // conv activations are NHWC with NCHW logical shapes.
    let t = &plan.tensors[convs[1].out];
    assert_eq!(
        (t.layout, t.shape.clone()),
        (Layout::Nhwc, vec![2, 8, 16, 16])
    );
}

/// The statistics engine's taps: a tapped tensor is not fused away, reads back as f32 in
/// ONNX order, and keeps its own buffer for the whole run.
#[test]
fn tapped_tensors_stay_unfused_and_read_back_in_onnx_order() {
    let b = residual_classifier(5);
    let m = b.model();
    let shape = [2, 3, 16, 16];
    let g = m.proto.graph.as_ref().expect("graph");
    // The block's second conv output (before its Add) and the stem's ReLU output.
    let conv2_out = g
        .node
        .iter()
        .find(|n| n.name == "block.conv2")
        .expect("conv2")
        .output[0]
        .clone();
    let taps = vec![conv2_out, "stem.relu.out".to_string(), "x".to_string()];
    let tapped = lower_for(
        &m.with_fixed_input(2, [16, 16]),
        shape,
        Precision::Fp32,
        Target::default(),
        &[],
        &taps,
    )
    .expect("lowers with taps");
    assert_eq!(tapped.taps.len(), 3);
    for &t in &tapped.taps {
        let d = &tapped.tensors[t];
        assert_eq!(
            (d.layout, d.dtype),
            (Layout::Plain, DType::F32),
            "{}",
            d.name
        );
        assert!(
            d.alias_of.is_none() && t != tapped.input,
            "{} has its own buffer",
            d.name
        );
    }
    assert_eq!(tapped.tensors[tapped.taps[0]].shape, vec![2, 8, 16, 16]);
    // Untapped, conv2 takes the Add and the ReLU; tapped, its own output must exist.
    let c2 = conv_steps(&tapped)
        .into_iter()
        .find(|c| c.name == "block.conv2")
        .expect("conv2")
        .clone();
    assert!(
        c2.residual.is_none() && c2.act == Act::None,
        "{:?}",
        c2.fused
    );
    // Taps and output are pinned: no other tensor shares their slots.
    let (slot_of, _) = assign_buffers(&tapped, |a, b| a < b);
    for &t in tapped.taps.iter().chain([&tapped.output]) {
        let shared = (0..tapped.tensors.len())
            .filter(|&u| {
                slot_of[u] == slot_of[t] && tapped.tensors[u].alias_of != Some(t) && u != t
            })
            .count();
        assert_eq!(shared, 0, "{} shares its buffer", tapped.tensors[t].name);
    }
    // Nothing changes for the engines' own plans.
    let plain = plan_of(&b, shape, Precision::Fp32);
    assert!(plain.taps.is_empty());
}

#[test]
fn fp16_plan_uses_half_activations_and_f32_io() {
    let plan = plan_of(&residual_classifier(3), [1, 3, 16, 16], Precision::Fp16);
    assert_eq!(plan.tensors[plan.input].dtype, DType::F32);
    assert_eq!(plan.tensors[plan.output].dtype, DType::F32);
    let conv_out = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Conv(c) => Some(c.out),
            _ => None,
        })
        .expect("a conv");
    assert_eq!(plan.tensors[conv_out].dtype, DType::F16);
}

#[test]
fn unknown_op_is_named_and_survey_lists_each_node_once() {
    // Hardmax has no kernel here; Erf (now supported) reads it and is not reported again.
    let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
    let h = b.op("Hardmax", "weird", &["x"]);
    let y = b.op("Erf", "after", &[&h]);
    b.output(&y);
    let m = b.model();
    let p = m.with_fixed_input(1, [8, 8]);
    let e = lower(&p, [1, 3, 8, 8], Precision::Fp32).expect_err("Hardmax unsupported");
    assert!(e.contains("Hardmax") && e.contains("weird"), "{e}");
    let list = survey(&p, [1, 3, 8, 8], Precision::Fp32).expect("survey");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (list[0].node.as_str(), list[0].op.as_str()),
        ("weird", "Hardmax")
    );
}

#[test]
fn every_family_op_is_registered_once() {
    let mut seen = std::collections::HashSet::new();
    for f in REGISTRY {
        for op in f.ops {
            assert!(seen.insert(*op), "{op} is in two families");
        }
    }
    assert_eq!(
        family_of("LayerNormalization").map(|f| f.name),
        Some("normalization")
    );
}

#[test]
fn layout_and_shape_math() {
    assert_eq!(reshape_dims(&[2, 8, 1, 1], &[0, -1]), Some(vec![2, 8]));
    assert_eq!(reshape_dims(&[2, 8, 3, 3], &[2, 72]), Some(vec![2, 72]));
    assert_eq!(reshape_dims(&[2, 8], &[-1, -1]), None);
    assert_eq!(squeeze_dims(&[2, 8, 1, 1], &[2, 3], true), Some(vec![2, 8]));
    assert_eq!(squeeze_dims(&[2, 8], &[-1], false), Some(vec![2, 8, 1]));
    // OIHW -> OHWI for a 2x3x1x2 weight.
    let w: Vec<i32> = (0..12).collect();
    let t = oihw_to_ohwi(&w, 2, 3, 1, 2);
    assert_eq!(&t[..6], &[0, 2, 4, 1, 3, 5]);
}

#[test]
fn flatten_of_spatial_tensor_goes_through_nchw_order() {
    let mut b = GraphBuilder::new(&[1, 3, 4, 4]);
    let c = b.conv("c", "x", 3, 4, 3);
    let f = b.op("Flatten", "f", &[&c]);
    b.output(&f);
    let plan = plan_of(&b, [1, 3, 4, 4], Precision::Fp32);
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, Step::View { name, .. } if name.contains("layout")))
    );
    assert_eq!(plan.tensors[plan.output].shape, vec![1, 64]);
}

#[test]
fn buffers_are_reused_but_not_while_live() {
    let plan = plan_of(&residual_classifier(5), [1, 3, 16, 16], Precision::Fp32);
    let (slot, sizes) = assign_buffers(&plan, |_, _| true);
    assert!(sizes.len() < plan.tensors.len());
    // No step writes a slot that one of its inputs reads.
    for s in &plan.steps {
        let o = slot[s.output()];
        for i in s.inputs() {
            assert_ne!(slot[i], o, "step {} reads and writes one buffer", s.name());
        }
    }
    // A conv's residual stays live until the conv.
    for (k, s) in plan.steps.iter().enumerate() {
        if let Step::Conv(c) = s
            && let Some(r) = c.residual
        {
            for later in &plan.steps[..k] {
                let _ = later;
            }
            assert_ne!(slot[r], slot[c.out]);
        }
    }
    for (t, d) in plan.tensors.iter().enumerate() {
        assert!(sizes[slot[t]] >= d.bytes());
    }
}

#[test]
fn squeeze_excite_scale_broadcasts_in_either_operand_order_without_a_copy() {
    // torchvision's SqueezeExcitation computes `scale * input`: the [1,C,1,1] operand first.
    let mut b = GraphBuilder::new(&[1, 8, 6, 6]);
    let c = b.conv("c", "x", 8, 8, 3);
    let p = b.op("GlobalAveragePool", "pool", &[&c]);
    let s = b.op("Sigmoid", "gate", &[&p]);
    let y = b.op("Mul", "se", &[&s, &c]);
    b.output(&y);
    let plan = plan_of(&b, [1, 8, 6, 6], Precision::Fp32);
    let step = plan
        .steps
        .iter()
        .find(|s| s.name() == "se")
        .expect("se step");
    let Step::Nary {
        op, strides, dims, ..
    } = step
    else {
        panic!("{step:?}")
    };
    assert_eq!(*op, EwOp::Mul);
    // Output NHWC [1, 6, 6, 8]: the gate reads channel-wise (stride 1 on C, 0 on H and W).
    assert_eq!(dims, &vec![1, 6, 6, 8]);
    assert_eq!(strides[0], vec![0, 0, 0, 1]);
    assert_eq!(strides[1], vec![0, 48, 8, 1]);
    // No layout copy for the activation.
    assert!(
        !plan
            .steps
            .iter()
            .any(|s| s.name().contains("layout(") && s.output() != plan.output)
    );
}

/// SiLU as PyTorch exports it, `Mul(x, Sigmoid(x))` in either operand order, is one unary step
/// where no step before it takes the activation (here: a pool); a Sigmoid whose Mul
/// multiplies something else (a squeeze-excite gate) is not.
#[test]
fn sigmoid_times_its_input_is_one_silu_step() {
    let mut b = GraphBuilder::new(&[1, 8, 6, 6]);
    let c = b.conv("c", "x", 8, 8, 3);
    let c = b.node(
        "MaxPool",
        "mp",
        &[&c],
        vec![proto::ints_attr("kernel_shape", &[1, 1])],
    );
    let s = b.op("Sigmoid", "sg", &[&c]);
    let y = b.op("Mul", "silu", &[&s, &c]);
    let p = b.op("GlobalAveragePool", "pool", &[&y]);
    let g = b.op("Sigmoid", "gate", &[&p]);
    let z = b.op("Mul", "se", &[&y, &g]);
    b.output(&z);
    for p in [Precision::Fp32, Precision::Fp16] {
        let plan = plan_of(&b, [1, 8, 6, 6], p);
        let silu: Vec<&Step> = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Unary { act: Act::Silu, .. }))
            .collect();
        assert_eq!(silu.len(), 1, "{p:?}");
        assert_eq!(silu[0].name(), "sg+silu");
        let muls = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Nary { op: EwOp::Mul, .. }))
            .count();
        assert_eq!(muls, 1, "{p:?}: only the gate's multiply");
    }
    // The Q/DQ model dequantizes the conv's output once for both readers: still one step.
    let int8 = int8_plan_of(&b, [1, 8, 6, 6], 4.0);
    assert!(int8.steps.iter().any(|s| s.name() == "sg+silu"));
}

/// A conv whose output only SiLU reads (EfficientNet's blocks) takes it as its activation in
/// FP16 and INT8 engines: no separate pass, and in an INT8 engine the conv writes the
/// quantized SiLU output itself. A conv output that something else also reads keeps the SiLU
/// a step of its own.
#[test]
fn silu_after_a_conv_is_the_convs_activation() {
    let mut b = GraphBuilder::new(&[1, 8, 6, 6]);
    let c = b.conv("c", "x", 8, 16, 1);
    let s = b.op("Sigmoid", "sg", &[&c]);
    let y = b.op("Mul", "silu", &[&c, &s]);
    let d = b.conv("d", &y, 16, 8, 1);
    let s2 = b.op("Sigmoid", "sg2", &[&d]);
    let y2 = b.op("Mul", "silu2", &[&s2, &d]);
    let z = b.op("Add", "sum", &[&y2, &d]);
    b.output(&z);
    let unary_silu = |plan: &Plan| {
        plan.steps
            .iter()
            .filter(|s| matches!(s, Step::Unary { act: Act::Silu, .. }))
            .count()
    };
    let check = |plan: &Plan, what: &str| {
        let convs = conv_steps(plan);
        assert_eq!(convs[0].act, Act::Silu, "{what}");
        assert!(convs[0].fused.iter().any(|f| f == "silu"), "{what}");
        assert_eq!(
            convs[1].act,
            Act::None,
            "{what}: its output has a third reader"
        );
        assert_eq!(
            unary_silu(plan),
            1,
            "{what}: only the second SiLU is a step"
        );
    };
    check(&plan_of(&b, [1, 8, 6, 6], Precision::Fp16), "fp16");
    // FP32 engines keep both SiLUs as unary steps (their fastest conv epilogue has none).
    let fp32 = plan_of(&b, [1, 8, 6, 6], Precision::Fp32);
    assert!(conv_steps(&fp32).iter().all(|c| c.act == Act::None));
    assert_eq!(unary_silu(&fp32), 2);
    let int8 = int8_plan_of(&b, [1, 8, 6, 6], 4.0);
    check(&int8, "int8");
    let first = conv_steps(&int8)[0];
    assert!(first.quant.is_some());
    assert_eq!(
        int8.tensors[first.out].dtype,
        DType::I8,
        "the SiLU output is quantized"
    );
}

#[test]
fn decomposed_layer_norm_is_one_norm_step_and_shape_subgraphs_fold() {
    let mut b = GraphBuilder::new(&[1, 4, 5, 6]);
    let axes = b.ints("axes", &[1], &[-1]);
    let two = b.constant("two", &[], &[2.0]);
    let eps = b.constant("eps", &[], &[1e-5]);
    let g = b.random("gamma", &[6], 1.0);
    let bt = b.random("beta", &[6], 1.0);
    let m = b.node(
        "ReduceMean",
        "m1",
        &["x"],
        vec![proto::ints_attr("axes", &[-1])],
    );
    let d = b.op("Sub", "sub", &["x", &m]);
    let p = b.op("Pow", "pow", &[&d, &two]);
    let v = b.node(
        "ReduceMean",
        "m2",
        &[&p],
        vec![proto::ints_attr("axes", &[-1])],
    );
    let a = b.op("Add", "add", &[&v, &eps]);
    let r = b.op("Sqrt", "sqrt", &[&a]);
    let n = b.op("Div", "div", &[&d, &r]);
    let n = b.op("Mul", "gmul", &[&n, &g]);
    let n = b.op("Add", "badd", &[&n, &bt]);
    // Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write a flatten.
    let sh = b.op("Shape", "shape", &[&n]);
    let zero = b.ints("zero", &[], &[0]);
    let g0 = b.op("Gather", "g0", &[&sh, &zero]);
    let u = b.node("Unsqueeze", "u", &[&g0, &axes], vec![]);
    let minus = b.ints("minus1", &[1], &[-1]);
    let cat = b.node(
        "Concat",
        "cat",
        &[&u, &minus],
        vec![proto::int_attr("axis", 0)],
    );
    let y = b.op("Reshape", "flat", &[&n, &cat]);
    b.output(&y);
    let plan = plan_of(&b, [1, 4, 5, 6], Precision::Fp32);
    let norms: Vec<&Step> = plan
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Norm { .. }))
        .collect();
    assert_eq!(norms.len(), 1, "{:?}", plan.steps);
    let Step::Norm {
        len, rows, gamma, ..
    } = norms[0]
    else {
        unreachable!()
    };
    assert_eq!((*len, *rows, gamma.len()), (6, 20, 6));
    assert!(
        !plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::Reduce { .. } | Step::Nary { .. }))
    );
    assert_eq!(plan.tensors[plan.output].shape, vec![1, 120]);
}

#[test]
fn einsum_equations_parse_with_ellipsis_and_implicit_output() {
    let (ins, out) =
        matmul::parse_einsum("bhid,bhjd->bhij", &[vec![1, 2, 3, 4], vec![1, 2, 5, 4]]).unwrap();
    assert_eq!(ins[0], vec!['b', 'h', 'i', 'd']);
    assert_eq!(out, vec!['b', 'h', 'i', 'j']);
    let (ins, out) = matmul::parse_einsum("...ij,jk", &[vec![7, 2, 3], vec![3, 4]]).unwrap();
    assert_eq!(ins[0].len(), 3);
    assert_eq!(
        out,
        vec!['A', 'i', 'k'],
        "NumPy: the ellipsis dims lead an implicit output"
    );
    assert!(matmul::parse_einsum("ij,jk->ik", &[vec![2, 3]]).is_err());
}

#[test]
fn attention_matmuls_are_batched_and_int8_reads_int8() {
    // q·kᵀ over [1, 2, 4, 8] heads, softmax on the last axis, then ·v.
    let mut b = GraphBuilder::new(&[1, 2, 4, 8]);
    let kt = b.node(
        "Transpose",
        "kt",
        &["x"],
        vec![proto::ints_attr("perm", &[0, 1, 3, 2])],
    );
    let s = b.op("MatMul", "qk", &["x", &kt]);
    let p = b.node("Softmax", "sm", &[&s], vec![proto::int_attr("axis", -1)]);
    let y = b.op("MatMul", "pv", &[&p, "x"]);
    b.output(&y);
    let plan = plan_of(&b, [1, 2, 4, 8], Precision::Fp32);
    let mms: Vec<(usize, usize, usize, usize)> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::MatMul { batch, m, n, k, .. } => Some((*batch, *m, *n, *k)),
            _ => None,
        })
        .collect();
    assert_eq!(mms, vec![(2, 4, 4, 8), (2, 4, 8, 4)]);
    assert_eq!(plan.tensors[plan.output].shape, vec![1, 2, 4, 8]);
}

#[test]
fn average_pool_over_the_whole_input_is_a_global_pool() {
    let pool = |k: i64| {
        let mut b = GraphBuilder::new(&[1, 8, 6, 6]);
        let y = b.node(
            "AveragePool",
            "ap",
            &["x"],
            vec![proto::ints_attr("kernel_shape", &[k, k])],
        );
        b.output(&y);
        plan_of(&b, [1, 8, 6, 6], Precision::Fp32)
    };
    let whole = pool(6);
    assert!(
        whole
            .steps
            .iter()
            .any(|s| matches!(s, Step::GlobalAvgPool { .. }))
            && !whole.steps.iter().any(|s| matches!(s, Step::Pool { .. })),
        "{:?}",
        whole.steps.iter().map(|s| s.kind()).collect::<Vec<_>>()
    );
    let part = pool(3);
    assert!(part.steps.iter().any(|s| matches!(s, Step::Pool { .. })));
}

#[test]
fn casts_and_quantizes_fold_into_the_step_before_them() {
    // FP16: the output's transpose writes f32 itself (no `output.cast`).
    let mut b = GraphBuilder::new(&[1, 8, 6, 6]);
    let c = b.conv("c", "x", 8, 8, 3);
    let y = b.node(
        "AveragePool",
        "ap",
        &[&c],
        vec![proto::ints_attr("kernel_shape", &[2, 2])],
    );
    b.output(&y);
    let plan = plan_of(&b, [1, 8, 6, 6], Precision::Fp16);
    assert!(
        !plan.steps.iter().any(|s| matches!(s, Step::Unary { .. })),
        "{:?}",
        plan.steps.iter().map(|s| s.name()).collect::<Vec<_>>()
    );
    let last = plan.steps.last().expect("steps");
    assert_eq!(last.output(), plan.output);
    assert_eq!(plan.tensors[plan.output].dtype, DType::F32);
    assert!(last.name().ends_with("+output.cast"), "{}", last.name());
}

/// ResNet's stem: conv, ReLU, then a max pool the Q/DQ model quantizes only after. The conv
/// writes int8 at the pool's output scale (quantizing commutes with the max) and the pool
/// reads and writes int8 codes at that one scale: no FP16 tensor between them.
#[test]
fn a_max_pool_before_a_quantize_pools_int8_codes() {
    let mut b = GraphBuilder::new(&[1, 4, 12, 12]);
    let c = b.conv("stem", "x", 4, 16, 3);
    let r = b.op("Relu", "stem.relu", &[&c]);
    let p = b.node(
        "MaxPool",
        "pool",
        &[&r],
        vec![
            proto::ints_attr("kernel_shape", &[3, 3]),
            proto::ints_attr("strides", &[2, 2]),
            proto::ints_attr("pads", &[1, 1, 1, 1]),
        ],
    );
    let y = b.conv("next", &p, 16, 16, 1);
    b.output(&y);
    let plan = int8_plan_of(&b, [1, 4, 12, 12], 4.0);
    let (pin, pout) = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Pool { input, out, .. } => Some((*input, *out)),
            _ => None,
        })
        .expect("a pool step");
    let (i, o) = (&plan.tensors[pin], &plan.tensors[pout]);
    assert_eq!((i.dtype, o.dtype), (DType::I8, DType::I8), "{i:?} -> {o:?}");
    assert_eq!(i.scale, o.scale);
    let stem = conv_steps(&plan)[0];
    assert_eq!(
        stem.out, pin,
        "the stem conv writes the pool's int8 input itself"
    );
}

/// conv -> ReLU -> Pad(value -1) -> `reader`, the Pad as activation centering writes it
/// before a padded conv (`prepare::center`), planned as INT8 with every scale 4 / 127.
fn centering_pad_before(reader_groups: usize, dilation: i64) -> Plan {
    let mut b = GraphBuilder::new(&[1, 4, 12, 12]);
    let c = b.conv("a", "x", 4, 16, 3);
    let r = b.op("Relu", "a.relu", &[&c]);
    let d = dilation;
    let pads = b.ints("pads", &[8], &[0, 0, d, d, 0, 0, d, d]);
    let v = b.constant("v", &[], &[-1.0]);
    let p = b.op("Pad", "pad", &[&r, &pads, &v]);
    let w = b.random("r.w", &[16, 16 / reader_groups, 3, 3], 0.5);
    let y = b.node(
        "Conv",
        "r",
        &[&p, &w],
        vec![
            proto::ints_attr("kernel_shape", &[3, 3]),
            proto::ints_attr("dilations", &[d, d]),
            proto::int_attr("group", reader_groups as i64),
        ],
    );
    b.output(&y);
    int8_plan_of(&b, [1, 4, 12, 12], 4.0)
}

/// Activation centering's Pad before a dense conv: the conv before it writes int8 at the
/// scale the Pad's output is quantized at, and the Pad copies int8 codes (padding with the
/// value's code): no float tensor between the two convs.
#[test]
fn a_constant_pad_before_a_quantize_pads_int8_codes() {
    let plan = centering_pad_before(1, 1);
    let (pin, pout, value) = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Pad {
                input, out, value, ..
            } => Some((*input, *out, *value)),
            _ => None,
        })
        .expect("a pad step");
    let (i, o) = (&plan.tensors[pin], &plan.tensors[pout]);
    assert_eq!((i.dtype, o.dtype), (DType::I8, DType::I8), "{i:?} -> {o:?}");
    assert_eq!(i.scale, o.scale);
    assert_eq!(
        value, -1.0,
        "the pad value, stored as its code at the output's scale"
    );
    assert_eq!(
        conv_steps(&plan)[0].out,
        pin,
        "the conv writes the pad's int8 input"
    );
    assert!(
        !plan.steps.iter().any(|s| matches!(s, Step::Unary { .. })),
        "no quantize or dequantize pass: {:?}",
        plan.steps.iter().map(|s| s.name()).collect::<Vec<_>>()
    );
}

/// Before an int8 depthwise conv, plain (the row-window kernel's) or dilated (DeepLab's,
/// `conv_dw4`'s), the Pad goes into the conv: no Pad step, the conv pads by the Pad's amounts
/// with the value's code (-1 at 4 / 127: -32) and reads the first conv's int8 output itself.
#[test]
fn a_constant_pad_before_an_int8_depthwise_conv_folds_into_it() {
    for dilation in [1, 2] {
        let plan = centering_pad_before(16, dilation);
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Pad { .. })),
            "dilation {dilation}: {:?}",
            plan.steps.iter().map(|s| s.name()).collect::<Vec<_>>()
        );
        let convs = conv_steps(&plan);
        let dw = convs
            .iter()
            .find(|c| c.name == "r")
            .expect("the depthwise conv");
        let d = dilation as usize;
        assert_eq!((dw.pads, dw.dilation), ([d; 4], [d; 2]));
        assert_eq!(dw.pad_code, -32);
        assert_eq!(dw.input, convs[0].out, "reads the first conv's output");
        assert_eq!(plan.tensors[dw.input].dtype, DType::I8);
        assert!(
            dw.fused.iter().any(|f| f.starts_with("pad")),
            "the Pad (with its quantize) is named among the conv's fused nodes: {:?}",
            dw.fused
        );
    }
}

/// An FP8 Q/DQ model plans as the INT8 one does, in E4M3: every conv quantized with its FP8
/// codes and scales, FP8 activations between layers, and an INT8 engine refuses FP8 Q/DQ.
#[test]
fn fp8_plan_keeps_e4m3_tensors_and_weights() {
    use crate::quant::{QFormat, build_qdq_as, fp8};
    let b = residual_classifier(10);
    let m = b.model();
    let qp = crate::quant::plan(&m, &[]);
    let ranges = amax_everywhere(&qp, 4.0);
    let qdq = build_qdq_as(&m, &qp, Some(&ranges), QFormat::Fp8E4M3).expect("fp8 qdq");
    let fixed = crate::model::Model {
        proto: qdq.proto.clone(),
        ..m.clone()
    }
    .with_fixed_input(1, [16, 16]);
    let plan = lower(&fixed, [1, 3, 16, 16], Precision::Fp8).expect("fp8 lowers");
    let convs = conv_steps(&plan);
    assert_eq!(convs.len(), 4, "three convs and the Gemm");
    for c in &convs {
        let q = c
            .quant
            .as_ref()
            .unwrap_or_else(|| panic!("{} not quantized", c.name));
        assert_eq!(q.dtype, DType::F8, "{}", c.name);
        assert_eq!(q.x_scale, 4.0 / 448.0, "{}", c.name);
        // The largest weight of each channel is code 0x7e (448) or its negative.
        let vals = q.values();
        let per = vals.len() / c.cout;
        for ch in 0..c.cout {
            let m = vals[ch * per..(ch + 1) * per]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            assert!(m == 448.0 || m == 0.0, "{} channel {ch}: {m}", c.name);
        }
        assert!(vals.iter().all(|v| fp8::round_e4m3(*v) == *v));
    }
    assert_eq!(plan.tensors[convs[0].input].dtype, DType::F8);
    assert!(
        plan.tensors.iter().all(|t| t.dtype != DType::I8),
        "no int8 tensor in an FP8 engine"
    );
    let refused = lower(&fixed, [1, 3, 16, 16], Precision::Int8).err();
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("symmetric int8")),
        "{refused:?}"
    );
}

/// The `space_to_depth` kernel on the host: NCHW `x` of `[n, c, h, w]` into NHWC blocks.
fn host_space_to_depth(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    out: &[usize],
    block: usize,
    [pt, pl]: [usize; 2],
) -> Vec<f32> {
    let (c2, hs, ws) = (out[1], out[2], out[3]);
    let cp = c2 / (block * block);
    let mut y = vec![0f32; n * hs * ws * c2];
    for b in 0..n {
        for j in 0..hs {
            for i in 0..ws {
                for q in 0..c2 {
                    let (ch, cell) = (q % cp, q / cp);
                    let yy = (block * j + cell / block) as i64 - pt as i64;
                    let xx = (block * i + cell % block) as i64 - pl as i64;
                    if ch < c && (0..h as i64).contains(&yy) && (0..w as i64).contains(&xx) {
                        y[((b * hs + j) * ws + i) * c2 + q] =
                            x[((b * c + ch) * h + yy as usize) * w + xx as usize];
                    }
                }
            }
        }
    }
    y
}

fn to_nhwc(x: &[f32], [n, c, h, w]: [usize; 4]) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for b in 0..n {
        for ch in 0..c {
            for p in 0..h * w {
                y[(b * h * w + p) * c + ch] = x[(b * c + ch) * h * w + p];
            }
        }
    }
    y
}

/// A one-group conv step over an NHWC input `[n, h, w, cin]` (OHWI weights), NHWC out.
fn host_conv(c: &ConvStep, x: &[f32], [n, h, w]: [usize; 3]) -> Vec<f32> {
    let [kh, kw] = c.k;
    let oh = (h + c.pads[0] + c.pads[2] - kh) / c.stride[0] + 1;
    let ow = (w + c.pads[1] + c.pads[3] - kw) / c.stride[1] + 1;
    let mut y = vec![0f32; n * oh * ow * c.cout];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for o in 0..c.cout {
                    let mut acc = c.bias[o];
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let iy = (oy * c.stride[0] + ky) as i64 - c.pads[0] as i64;
                            let ix = (ox * c.stride[1] + kx) as i64 - c.pads[1] as i64;
                            if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                                continue;
                            }
                            let xi = ((b * h + iy as usize) * w + ix as usize) * c.cin;
                            let wi = ((o * kh + ky) * kw + kx) * c.cin;
                            for ci in 0..c.cin {
                                acc += x[xi + ci] * c.w[wi + ci];
                            }
                        }
                    }
                    y[((b * oh + oy) * ow + ox) * c.cout + o] = acc;
                }
            }
        }
    }
    y
}

/// Stems (ResNet's 7x7/2 pad 3, MobileNet's 3x3/2 pad 1, ConvNeXt's 4x4/4 patchify, an
/// asymmetric SAME pad) on odd input sizes: the plan regroups the host input into s x s
/// blocks in one step and runs a stride-1 conv whose result, with the regrouping as the kernel
/// does it, equals the original conv's. An int8 plan quantizes in that same step (no layout
/// copy or quantize left), regroups its int8 weights the same way, and takes taps of 16 or 32
/// channels as the target GPU's kernels copy them.
#[test]
fn stem_convs_run_as_space_to_depth_and_compute_the_same() {
    let stems: [(&str, [usize; 2], usize, [i64; 4]); 4] = [
        ("resnet 7x7/2", [7, 7], 2, [3, 3, 3, 3]),
        ("mobilenet 3x3/2", [3, 3], 2, [1, 1, 1, 1]),
        ("patchify 4x4/4", [4, 4], 4, [0, 0, 0, 0]),
        ("same-upper 3x3/2", [3, 3], 2, [0, 0, 1, 1]),
    ];
    let [n, cin, h, w] = [2, 3, 13, 11];
    for (what, k, s, pads) in stems {
        let mut b = GraphBuilder::new(&[n, cin, h, w]);
        let wt = b.random("stem.w", &[8, cin, k[0], k[1]], 0.3);
        let bias = b.random("stem.b", &[8], 0.1);
        let y = b.node(
            "Conv",
            "stem",
            &["x", &wt, &bias],
            vec![
                proto::ints_attr("kernel_shape", &[k[0] as i64, k[1] as i64]),
                proto::ints_attr("strides", &[s as i64, s as i64]),
                proto::ints_attr("pads", &pads),
            ],
        );
        b.output(&y);
        let plan = plan_of(&b, [n, cin, h, w], Precision::Fp32);
        let conv = conv_steps(&plan)[0].clone();
        assert_eq!(conv.stride, [1, 1], "{what}: stride");
        assert_eq!(conv.pads, [0; 4], "{what}: pads");
        assert_eq!(conv.cin % 16, 0, "{what}: {} channels", conv.cin);
        // One regrouping step reads the host input itself (no layout copy left), then the conv.
        let (src, block, spads) = match plan.steps.as_slice() {
            [
                Step::SpaceToDepth {
                    input, block, pads, ..
                },
                Step::Conv(_),
                ..,
            ] => (*input, *block, *pads),
            steps => panic!(
                "{what}: steps {:?}",
                steps.iter().map(|s| s.name()).collect::<Vec<_>>()
            ),
        };
        assert_eq!(src, plan.input, "{what}: reads the host input");
        // The original conv, NHWC, from the graph's own weights.
        let x: Vec<f32> = crate::model::testing::values(n * cin * h * w, 5);
        let m = b.model();
        let wc = m.initializer("stem.w").expect("weights");
        let bc = m.initializer("stem.b").expect("bias");
        let p = pads.map(|v| v as usize);
        let original = ConvStep {
            w: oihw_to_ohwi(&wc.data, 8, cin, k[0], k[1]),
            bias: bc.data.clone(),
            cin,
            k,
            stride: [s, s],
            pads: p,
            pad_code: 0,
            ..conv.clone()
        };
        let want = host_conv(&original, &to_nhwc(&x, [n, cin, h, w]), [n, h, w]);
        let blocks = host_space_to_depth(
            &x,
            [n, cin, h, w],
            &plan.tensors[conv.input].shape,
            block,
            spads,
        );
        let sd = super::stored_dims(&plan.tensors[conv.input]);
        let got = host_conv(&conv, &blocks, [sd[0], sd[1], sd[2]]);
        assert_eq!(got.len(), want.len(), "{what}: output size");
        let err = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err < 1e-5, "{what}: max error {err}");
    }
    // Int8: the quantized weights are regrouped with the float ones.
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let wt = b.random("stem.w", &[16, 3, 3, 3], 0.3);
    let y = b.node(
        "Conv",
        "stem",
        &["x", &wt],
        vec![
            proto::ints_attr("strides", &[2, 2]),
            proto::ints_attr("pads", &[1, 1, 1, 1]),
        ],
    );
    let y = b.op("Relu", "relu", &[&y]);
    b.output(&y);
    let int8 = int8_plan_of(&b, [1, 3, 16, 16], 4.0);
    match int8.steps.first() {
        Some(Step::SpaceToDepth { input, out, .. }) => {
            assert_eq!(*input, int8.input, "reads the host input");
            assert_eq!(int8.tensors[*out].dtype, DType::I8, "writes int8");
        }
        other => panic!("first step {:?}", other.map(|s| s.name())),
    }
    let c = conv_steps(&int8)[0];
    let q = c.quant.as_ref().expect("int8 stem");
    assert_eq!((c.k, c.cin), ([2, 2], 16), "2x2 taps of 16 int8 channels");
    // Before sm_80 (no tensor-core kernel) the taps are cuDNN's 32 channels.
    let cudnn = int8_plan_for(&b, [1, 3, 16, 16], 4.0, Target { int8_mma: false });
    assert_eq!(conv_steps(&cudnn)[0].cin, 32, "taps of 32 int8 channels");
    assert_eq!(q.w.len(), c.w.len());
    let per_out = c.w.len() / c.cout;
    for (i, (qv, fv)) in q.w.iter().zip(&c.w).enumerate() {
        let scale = q.w_scales[i / per_out];
        assert!(
            (*qv as f32 * scale - fv).abs() <= scale * 0.5 + 1e-6,
            "weight {i}: int8 {qv} x {scale} against {fv}"
        );
    }
}

/// A classifier on [1, 3, 12, 10] whose last conv (16 -> 32, 3x3, ReLU) a global average
/// pool reads: the head's alone, or with `scale` first a squeeze-excite-like scale of the
/// conv's output by its own pool (two readers).
fn pooled_classifier(scale: bool) -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, 12, 10]);
    let s = b.conv("stem", "x", 3, 16, 3);
    let s = b.op("Relu", "stem.relu", &[&s]);
    let c = b.conv("last", &s, 16, 32, 3);
    let mut c = b.op("Relu", "last.relu", &[&c]);
    if scale {
        let p = b.op("GlobalAveragePool", "scale.pool", &[&c]);
        c = b.op("Mul", "scale", &[&c, &p]);
    }
    let y = b.head(&c, 32, 7);
    b.output(&y);
    b
}

/// In an INT8 plan for a GPU the tensor-core kernels run on, the head's pool fuses into the
/// last conv, which writes the fc's int8 codes itself; elsewhere, and where another step also
/// reads the conv's output, the pool stays a step of its own.
#[test]
fn a_global_pool_fuses_into_the_int8_conv_before_it() {
    let b = pooled_classifier(false);
    let plan = int8_plan_of(&b, [2, 3, 12, 10], 4.0);
    let names: Vec<&str> = plan.steps.iter().map(|s| s.name()).collect();
    assert!(
        !plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::GlobalAvgPool { .. })),
        "{names:?}"
    );
    let convs = conv_steps(&plan);
    let last = convs
        .iter()
        .find(|c| c.name.starts_with("last"))
        .expect("last conv");
    assert_eq!(last.pool_hw, Some([12, 10]), "{names:?}");
    assert!(last.name.contains("+pool"), "{}", last.name);
    assert!(
        last.fused.iter().any(|f| f.starts_with("pool")),
        "{:?}",
        last.fused
    );
    // It writes the fc's int8 input: [n, cout, 1, 1] codes the Flatten views.
    let od = &plan.tensors[last.out];
    assert_eq!((od.dtype, od.shape.clone()), (DType::I8, vec![2, 32, 1, 1]));
    let fc = convs.last().expect("fc");
    let root = |t: usize| plan.root(t);
    assert_eq!(
        root(fc.input),
        last.out,
        "the fc reads the fused pool's codes"
    );
    // No other conv pools.
    assert_eq!(convs.iter().filter(|c| c.pool_hw.is_some()).count(), 1);
    // Where the tensor-core kernels do not run, in float plans, and where the scale also
    // reads the conv's output, the pool stays.
    let cudnn = int8_plan_for(&b, [2, 3, 12, 10], 4.0, Target { int8_mma: false });
    let fp16 = plan_of(&b, [2, 3, 12, 10], Precision::Fp16);
    let shared = int8_plan_of(&pooled_classifier(true), [2, 3, 12, 10], 4.0);
    for p in [&cudnn, &fp16, &shared] {
        assert!(
            p.steps
                .iter()
                .any(|s| matches!(s, Step::GlobalAvgPool { .. }))
        );
        assert!(conv_steps(p).iter().all(|c| c.pool_hw.is_none()));
    }
}

#[test]
fn classifier_tail_writes_int8_and_f32_without_cast_steps() {
    // GlobalAveragePool -> Flatten -> QuantizeLinear -> fc -> the f32 output: the pool writes
    // the fc's int8 input itself (the Flatten is a view of it) and the int8 fc writes the f32
    // output itself, so the tail is two steps, not four.
    let b = residual_classifier(5);
    let plan = int8_plan_of(&b, [2, 3, 16, 16], 4.0);
    let names: Vec<&str> = plan.steps.iter().map(|s| s.name()).collect();
    let n = plan.steps.len();
    let (pool, fc) = (&plan.steps[n - 2], &plan.steps[n - 1]);
    assert!(matches!(pool, Step::GlobalAvgPool { .. }), "{names:?}");
    assert_eq!(plan.tensors[pool.output()].dtype, DType::I8, "{names:?}");
    let Step::Conv(fc) = fc else {
        panic!("the last step is not the fc: {names:?}")
    };
    assert!(fc.quant.as_ref().is_some_and(|q| q.is_int8()), "{names:?}");
    let root = |t: usize| plan.root(t);
    assert_eq!(
        root(fc.input),
        pool.output(),
        "the fc reads the pool's output"
    );
    assert_eq!(fc.out, plan.output, "{names:?}");
    assert_eq!(plan.tensors[plan.output].dtype, DType::F32);
    // The FP16 engine's fc still writes f16 and casts: its float convs' fastest kernels
    // (cuDNN, cuBLASLt) write the engine's float type.
    let fp16 = plan_of(&b, [2, 3, 16, 16], Precision::Fp16);
    assert!(
        matches!(fp16.steps.last(), Some(Step::Unary { .. })),
        "{:?}",
        fp16.steps.iter().map(|s| s.name()).collect::<Vec<_>>()
    );
}
