//! Elementwise ops and activations: broadcasting binaries, Where, Pow and the activation functions.

use super::*;

pub(super) fn elementwise_broadcast_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    // [1, C, 1, 1] constants in both operand orders.
    for op in ["Add", "Mul", "Sub", "Div", "Max", "Min"] {
        for const_first in [false, true] {
            cases.push(graph(
                &format!(
                    "{op} [1,C,1,1] const {}",
                    if const_first { "first" } else { "second" }
                ),
                &s,
                13,
                |b, x| {
                    let v: Vec<f32> = values(4, 3).iter().map(|v| 0.75 + 0.5 * v).collect();
                    let c = b.constant("c", &[1, 4, 1, 1], &v);
                    let ins = if const_first { [&c, x] } else { [x, &c] };
                    b.op(op, "ew", &[ins[0], ins[1]])
                },
            ));
        }
    }
    // Squeeze-excite: a computed [1, C, 1, 1] scale over [1, C, H, W], both orders.
    for scale_first in [false, true] {
        cases.push(graph(
            &format!(
                "SE Mul, scale {}",
                if scale_first { "first" } else { "second" }
            ),
            &s,
            13,
            |b, x| {
                let p = b.op("GlobalAveragePool", "gap", &[x]);
                let sg = b.op("Sigmoid", "sg", &[&p]);
                let ins = if scale_first { [&sg, x] } else { [x, &sg] };
                b.op("Mul", "se", &[ins[0], ins[1]])
            },
        ));
    }
    // The same after a conv (NHWC input on the GPU).
    cases.push(graph("SE Mul after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let p = b.op("GlobalAveragePool", "gap", &[&c]);
        let sg = b.op("HardSigmoid", "sg", &[&p]);
        b.op("Mul", "se", &[&c, &sg])
    }));
    // Whole groups of 16 channels after a conv (`nary8` in FP16, `nary16` in INT8: a
    // thread's 16 bytes of output read and written at once): a gate over two images, a
    // per-channel constant, a tensor plus itself.
    let wide = [2, 32, 5, 6];
    cases.push(graph(
        "SE Mul after conv, 32 channels",
        &wide,
        13,
        |b, x| {
            let c = after_conv(b, x, 32);
            let p = b.op("GlobalAveragePool", "gap", &[&c]);
            let sg = b.op("Sigmoid", "sg", &[&p]);
            b.op("Mul", "se", &[&sg, &c])
        },
    ));
    cases.push(graph(
        "Add [1,C,1,1] const, 32 channels",
        &wide,
        13,
        |b, x| {
            let c = after_conv(b, x, 32);
            let v: Vec<f32> = values(32, 5).iter().map(|v| 0.5 * v).collect();
            let k = b.constant("k", &[1, 32, 1, 1], &v);
            b.op("Add", "ew", &[&c, &k])
        },
    ));
    cases.push(graph(
        "Add tensor to itself, 32 channels",
        &wide,
        13,
        |b, x| {
            let c = after_conv(b, x, 32);
            b.op("Add", "ew", &[&c, &c])
        },
    ));
    // Scalar and row vectors (last axis), tensor [1, C, H, 1] against [1, C, H, W].
    cases.push(graph("Add scalar", &s, 13, |b, x| {
        let c = b.constant("c", &[], &[0.25]);
        b.op("Add", "ew", &[x, &c])
    }));
    cases.push(graph("Sub scalar first", &s, 13, |b, x| {
        let c = b.constant("c", &[], &[0.25]);
        b.op("Sub", "ew", &[&c, x])
    }));
    for op in ["Max", "Min", "Mul"] {
        cases.push(graph(&format!("{op} row vector"), &s, 13, |b, x| {
            let c = b.random("row", &[6], 1.0);
            b.op(op, "ew", &[x, &c])
        }));
    }
    cases.push(graph("Add [1,C,H,1] tensor", &s, 13, |b, x| {
        let m = b.node("ReduceMean", "mean", &[x], vec![ints("axes", &[3])]);
        let t = b.op("Tanh", "t", &[&m]);
        b.op("Add", "ew", &[&t, x])
    }));
    // Pow: a per-channel exponent of a positive base, and squaring.
    cases.push(graph("Pow per channel", &s, 13, |b, x| {
        let base = b.op("Sigmoid", "sg", &[x]);
        let e = b.constant("e", &[1, 4, 1, 1], &[0.5, 1.0, 2.0, 3.0]);
        b.op("Pow", "pow", &[&base, &e])
    }));
    cases.push(graph("Pow 2", &s, 13, |b, x| {
        let e = b.constant("e", &[], &[2.0]);
        b.op("Pow", "pow", &[x, &e])
    }));
    // Where on comparisons (bool tensors inside the graph).
    cases.push(graph("Where(Greater)", &s, 13, |b, x| {
        let c = b.random("c", &[1, 4, 1, 1], 0.5);
        let gt = b.op("Greater", "gt", &[x, &c]);
        let n = b.op("Neg", "neg", &[x]);
        b.op("Where", "where", &[&gt, x, &n])
    }));
    cases.push(graph("Where(Equal)", &s, 13, |b, x| {
        let two = b.constant("two", &[], &[2.0]);
        let m = b.op("Mul", "m2", &[x, &two]);
        let f = b.op("Floor", "floor", &[&m]);
        let zero = b.constant("zero", &[], &[0.0]);
        let eq = b.op("Equal", "eq", &[&f, &zero]);
        let row = b.random("row", &[6], 1.0);
        b.op("Where", "where", &[&eq, &row, x])
    }));
    cases
}

pub(super) fn activations_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    type Build = fn(&mut GraphBuilder, &str) -> String;
    let acts: Vec<(&str, Build)> = vec![
        ("Erf", |b, x| b.op("Erf", "a", &[x])),
        ("Gelu (PyTorch's Div/Erf/Add/Mul export)", |b, x| {
            let s2 = b.constant("sqrt2", &[], &[std::f32::consts::SQRT_2]);
            let d = b.op("Div", "div", &[x, &s2]);
            let e = b.op("Erf", "erf", &[&d]);
            let one = b.constant("one", &[], &[1.0]);
            let a = b.op("Add", "add", &[&e, &one]);
            let m = b.op("Mul", "mul", &[x, &a]);
            let half = b.constant("half", &[], &[0.5]);
            b.op("Mul", "mul2", &[&m, &half])
        }),
        ("Tanh", |b, x| b.op("Tanh", "a", &[x])),
        ("Sigmoid", |b, x| b.op("Sigmoid", "a", &[x])),
        ("HardSigmoid", |b, x| {
            b.node(
                "HardSigmoid",
                "a",
                &[x],
                vec![float_attr("alpha", 0.25), float_attr("beta", 0.4)],
            )
        }),
        ("SiLU (x * Sigmoid(x))", |b, x| {
            let s = b.op("Sigmoid", "sg", &[x]);
            b.op("Mul", "a", &[x, &s])
        }),
        ("LeakyRelu", |b, x| {
            b.node("LeakyRelu", "a", &[x], vec![float_attr("alpha", 0.1)])
        }),
        ("PRelu", |b, x| {
            let slope = b.constant("slope", &[4, 1, 1], &[0.1, 0.2, -0.3, 0.25]);
            b.op("PRelu", "a", &[x, &slope])
        }),
        ("Softplus", |b, x| b.op("Softplus", "a", &[x])),
        ("Exp", |b, x| b.op("Exp", "a", &[x])),
        ("Log", |b, x| {
            let a = b.op("Abs", "abs", &[x]);
            let c = b.constant("c", &[], &[0.5]);
            let p = b.op("Add", "add", &[&a, &c]);
            b.op("Log", "a", &[&p])
        }),
        ("Sqrt", |b, x| {
            let a = b.op("Abs", "abs", &[x]);
            b.op("Sqrt", "a", &[&a])
        }),
        ("Reciprocal", |b, x| {
            let a = b.op("Abs", "abs", &[x]);
            let c = b.constant("c", &[], &[0.5]);
            let p = b.op("Add", "add", &[&a, &c]);
            b.op("Reciprocal", "a", &[&p])
        }),
        ("Neg", |b, x| b.op("Neg", "a", &[x])),
        ("Abs", |b, x| b.op("Abs", "a", &[x])),
        ("Clip", |b, x| {
            let lo = b.constant("lo", &[], &[-0.5]);
            let hi = b.constant("hi", &[], &[1.0]);
            b.op("Clip", "a", &[x, &lo, &hi])
        }),
        ("Elu", |b, x| {
            b.node("Elu", "a", &[x], vec![float_attr("alpha", 0.7)])
        }),
        ("Relu after conv", |b, x| {
            let c = after_conv(b, x, 4);
            b.op("Relu", "a", &[&c])
        }),
        ("SiLU after conv (Mul(Sigmoid(y), y))", |b, x| {
            let c = after_conv(b, x, 4);
            let s = b.op("Sigmoid", "sg", &[&c]);
            b.op("Mul", "a", &[&s, &c])
        }),
        ("Erf after conv", |b, x| {
            let c = after_conv(b, x, 4);
            b.op("Erf", "a", &[&c])
        }),
    ];
    let mut cases: Vec<Case> = acts
        .into_iter()
        .map(|(name, f)| graph(name, &s, 13, f))
        .collect();
    // HardSwish came in opset 14 (ONNX Runtime refuses it in an opset-13 model).
    cases.push(graph("HardSwish", &s, 14, |b, x| {
        b.op("HardSwish", "a", &[x])
    }));
    // The Gelu op itself (opset 20).
    cases.push(graph("Gelu op", &s, 20, |b, x| b.op("Gelu", "a", &[x])));
    cases.push(graph("Gelu op, tanh", &s, 20, |b, x| {
        b.node("Gelu", "a", &[x], vec![string("approximate", "tanh")])
    }));
    cases
}
