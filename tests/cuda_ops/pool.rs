//! Pooling and reductions.

use super::*;

/// A 3x3 stride-2 MaxPool node on `x` with `pads` (top, left, bottom, right).
fn max_pool_3x3_stride_2(b: &mut GraphBuilder, x: &str, pads: [i64; 4], ceil: bool) -> String {
    b.node(
        "MaxPool",
        "mp",
        &[x],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("strides", &[2, 2]),
            ints("pads", &pads),
            int("ceil_mode", ceil as i64),
        ],
    )
}

pub(super) fn pooling_cases() -> Vec<Case> {
    let s = [1, 4, 7, 7];
    let mut cases = vec![];
    // SqueezeNet: 3x3 stride 2 ceil mode.
    cases.push(graph("MaxPool ceil_mode", &s, 13, |b, x| {
        max_pool_3x3_stride_2(b, x, [0; 4], true)
    }));
    cases.push(graph(
        "MaxPool ceil_mode after conv",
        &[1, 4, 8, 8],
        13,
        |b, x| {
            let c = after_conv(b, x, 4);
            max_pool_3x3_stride_2(b, &c, [1, 1, 0, 0], true)
        },
    ));
    // ResNet's stem pool over 16 channels between convs: whole 16-byte vectors in FP32, FP16
    // and int8, the raw max kernel's (int8 requantized where the output's scale differs).
    cases.push(graph(
        "MaxPool 3x3/2 pad 1 after conv, 16 channels",
        &[2, 16, 9, 9],
        13,
        |b, x| {
            let c = after_conv(b, x, 16);
            let p = max_pool_3x3_stride_2(b, &c, [1, 1, 1, 1], false);
            // A conv reading the pool, so that in INT8 its output is int8 too.
            b.conv("post", &p, 16, 16, 1)
        },
    ));
    // TensorFlow's image pooling: a window as large as the input (a global average pool).
    cases.push(graph(
        "AveragePool over the whole input",
        &[2, 8, 5, 6],
        13,
        |b, x| {
            let c = after_conv(b, x, 8);
            b.node(
                "AveragePool",
                "ap",
                &[&c],
                vec![ints("kernel_shape", &[5, 6])],
            )
        },
    ));
    cases.push(graph("MaxPool dilation 2", &s, 13, |b, x| {
        b.node(
            "MaxPool",
            "mp",
            &[x],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("dilations", &[2, 2]),
                ints("pads", &[2, 2, 2, 2]),
            ],
        )
    }));
    cases.push(graph("MaxPool asymmetric pads", &s, 13, |b, x| {
        b.node(
            "MaxPool",
            "mp",
            &[x],
            vec![
                ints("kernel_shape", &[2, 3]),
                ints("strides", &[2, 1]),
                ints("pads", &[0, 1, 1, 2]),
            ],
        )
    }));
    for cip in [0, 1] {
        for ceil in [false, true] {
            let name = match ceil {
                true => format!("AveragePool ceil_mode count_include_pad {cip}"),
                false => format!("AveragePool count_include_pad {cip}"),
            };
            cases.push(graph(&name, &s, 13, |b, x| {
                b.node(
                    "AveragePool",
                    "ap",
                    &[x],
                    vec![
                        ints("kernel_shape", &[3, 3]),
                        ints("strides", &[2, 2]),
                        ints("pads", &[1, 1, 1, 1]),
                        int("ceil_mode", ceil as i64),
                        int("count_include_pad", cip),
                    ],
                )
            }));
        }
    }
    cases.push(graph("GlobalMaxPool", &s, 13, |b, x| {
        b.op("GlobalMaxPool", "gmp", &[x])
    }));
    // The first three run a block per image and 32 channels (the first two with fewer pixel
    // lanes than 32, the third with 32 lanes each summing several pixels); the fourth has few
    // images and channels over many pixels, so the pixels are split across blocks (2 to 8
    // splits, by the element size) and a second kernel adds the split sums up.
    for (name, shape) in [
        ("GlobalAveragePool after conv", s),
        (
            "GlobalAveragePool after conv, 7 x 7 (8 pixel lanes)",
            [2, 40, 7, 7],
        ),
        (
            "GlobalAveragePool after conv, a block per image",
            [2, 8, 20, 20],
        ),
        (
            "GlobalAveragePool after conv, pixels split across blocks",
            [2, 8, 128, 128],
        ),
    ] {
        cases.push(graph(name, &shape, 13, |b, x| {
            let c = after_conv(b, x, shape[1]);
            b.op("GlobalAveragePool", "gap", &[&c])
        }));
    }
    cases
}

pub(super) fn reductions_cases() -> Vec<Case> {
    let s = [2, 4, 5, 6];
    let mut cases = vec![];
    for (op, axes, keep) in [
        ("ReduceMean", vec![2, 3], 1),
        ("ReduceMean", vec![1], 0),
        ("ReduceMax", vec![-1], 1),
        ("ReduceMax", vec![1, 2], 0),
        ("ReduceMin", vec![3], 1),
        ("ReduceL2", vec![1, 2], 0),
        ("ReduceL2", vec![3], 1),
        ("ReduceSumSquare", vec![2], 1),
        ("ReduceL1", vec![1], 1),
        ("ReduceLogSumExp", vec![-1], 1),
    ] {
        cases.push(graph(
            &format!("{op} axes {axes:?} keepdims {keep}"),
            &s,
            13,
            |b, x| {
                b.node(
                    op,
                    "r",
                    &[x],
                    vec![ints("axes", &axes), int("keepdims", keep)],
                )
            },
        ));
    }
    // Opset 13 ReduceSum takes its axes as an input.
    for (axes, keep) in [(vec![1i64], 0), (vec![2, 3], 1), (vec![-1], 1)] {
        cases.push(graph(
            &format!("ReduceSum axes {axes:?} keepdims {keep}"),
            &s,
            13,
            |b, x| {
                let a = b.ints("axes", &[axes.len()], &axes);
                b.node("ReduceSum", "r", &[x, &a], vec![int("keepdims", keep)])
            },
        ));
    }
    cases.push(graph("ReduceMean over C after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        b.node("ReduceMean", "r", &[&c], vec![ints("axes", &[1])])
    }));
    cases
}
