//! Normalizations and softmax: LayerNormalization, its decomposed form, InstanceNormalization, GroupNormalization, Softmax.

use super::*;

pub(super) fn layer_normalization_cases() -> Vec<Case> {
    let s = [1, 4, 6, 8];
    let mut cases = vec![];
    cases.push(graph("LayerNormalization axis -1", &s, 17, |b, x| {
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.node(
            "LayerNormalization",
            "ln",
            &[x, &g, &be],
            vec![int("axis", -1), float_attr("epsilon", 1e-5)],
        )
    }));
    cases.push(graph("LayerNormalization, no bias", &s, 17, |b, x| {
        let g = b.random("g", &[8], 1.0);
        b.node("LayerNormalization", "ln", &[x, &g], vec![int("axis", -1)])
    }));
    cases.push(graph(
        "LayerNormalization axis 1 (C, H, W)",
        &s,
        17,
        |b, x| {
            let g = b.random("g", &[4, 6, 8], 1.0);
            let be = b.random("b", &[4, 6, 8], 0.5);
            b.node(
                "LayerNormalization",
                "ln",
                &[x, &g, &be],
                vec![int("axis", 1)],
            )
        },
    ));
    // ConvNeXt: permute to channels-last, normalise over C, permute back.
    cases.push(graph("ConvNeXt LayerNorm over C", &s, 17, |b, x| {
        let c = after_conv(b, x, 4);
        let t = b.node(
            "Transpose",
            "to_nhwc",
            &[&c],
            vec![ints("perm", &[0, 2, 3, 1])],
        );
        let g = b.random("g", &[4], 1.0);
        let be = b.random("b", &[4], 0.5);
        let ln = b.node(
            "LayerNormalization",
            "ln",
            &[&t, &g, &be],
            vec![int("axis", -1), float_attr("epsilon", 1e-6)],
        );
        b.node(
            "Transpose",
            "to_nchw",
            &[&ln],
            vec![ints("perm", &[0, 3, 1, 2])],
        )
    }));
    // The decomposed pattern older exporters write.
    cases.push(graph("ReduceMean/Sub/Pow/Sqrt/Div", &s, 13, |b, x| {
        let m = b.node("ReduceMean", "mean", &[x], vec![ints("axes", &[-1])]);
        let d = b.op("Sub", "sub", &[x, &m]);
        let two = b.constant("two", &[], &[2.0]);
        let p = b.op("Pow", "pow", &[&d, &two]);
        let v = b.node("ReduceMean", "var", &[&p], vec![ints("axes", &[-1])]);
        let eps = b.constant("eps", &[], &[1e-5]);
        let ve = b.op("Add", "add_eps", &[&v, &eps]);
        let sd = b.op("Sqrt", "sqrt", &[&ve]);
        let n = b.op("Div", "div", &[&d, &sd]);
        let g = b.random("g", &[8], 1.0);
        let gm = b.op("Mul", "gamma", &[&n, &g]);
        let be = b.random("b", &[8], 0.5);
        b.op("Add", "beta", &[&gm, &be])
    }));
    cases
}

pub(super) fn instance_and_group_normalization_cases() -> Vec<Case> {
    let s = [2, 8, 4, 5];
    let mut cases = vec![];
    cases.push(graph("InstanceNormalization", &s, 13, |b, x| {
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.node(
            "InstanceNormalization",
            "in",
            &[x, &g, &be],
            vec![float_attr("epsilon", 1e-5)],
        )
    }));
    cases.push(graph("InstanceNormalization after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 8);
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.op("InstanceNormalization", "in", &[&c, &g, &be])
    }));
    // Opset 18: scale and bias per group.
    cases.push(graph("GroupNormalization opset 18", &s, 18, |b, x| {
        let g = b.random("g", &[4], 1.0);
        let be = b.random("b", &[4], 0.5);
        b.node(
            "GroupNormalization",
            "gn",
            &[x, &g, &be],
            vec![int("num_groups", 4), float_attr("epsilon", 1e-5)],
        )
    }));
    // Opset 21: scale and bias per channel.
    cases.push(graph("GroupNormalization opset 21", &s, 21, |b, x| {
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.node(
            "GroupNormalization",
            "gn",
            &[x, &g, &be],
            vec![int("num_groups", 2), float_attr("epsilon", 1e-5)],
        )
    }));
    cases
}

pub(super) fn softmax_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    for op in ["Softmax", "LogSoftmax"] {
        for axis in [1, -1, 2] {
            cases.push(graph(&format!("{op} axis {axis}"), &s, 13, |b, x| {
                b.node(op, "sm", &[x], vec![int("axis", axis)])
            }));
        }
        cases.push(graph(&format!("{op} axis 1 after conv"), &s, 13, |b, x| {
            let c = after_conv(b, x, 4);
            b.node(op, "sm", &[&c], vec![int("axis", 1)])
        }));
    }
    // Attention rows: 64 long, scaled scores.
    cases.push(graph(
        "Softmax attention rows",
        &[2, 4, 8, 64],
        13,
        |b, x| {
            let c = b.constant("scale", &[], &[3.0]);
            let m = b.op("Mul", "scale", &[x, &c]);
            b.node("Softmax", "sm", &[&m], vec![int("axis", -1)])
        },
    ));
    cases
}
