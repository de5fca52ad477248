//! Convolutions the CUDA planner treats apart: grouped, dilated and transposed.

use super::*;

fn conv_node(
    b: &mut GraphBuilder,
    name: &str,
    x: &str,
    w_dims: [usize; 4],
    bias: bool,
    attrs: Vec<AttributeProto>,
) -> String {
    let fan_in = (w_dims[1] * w_dims[2] * w_dims[3]) as f32;
    let w = b.random(&format!("{name}.w"), &w_dims, 3.0 / fan_in);
    let mut ins = vec![x.to_string(), w];
    if bias {
        ins.push(b.random(&format!("{name}.b"), &[w_dims[0]], 0.1));
    }
    let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
    b.node("Conv", name, &refs, attrs)
}

pub(super) fn grouped_and_dilated_conv_cases() -> Vec<Case> {
    let s = [2, 4, 9, 9];
    let mut cases = vec![];
    cases.push(graph("Conv groups 2", &s, 13, |b, x| {
        conv_node(
            b,
            "conv",
            x,
            [6, 2, 3, 3],
            true,
            vec![ints("pads", &[1, 1, 1, 1]), int("group", 2)],
        )
    }));
    cases.push(graph("Conv dilation 2", &s, 13, |b, x| {
        conv_node(
            b,
            "conv",
            x,
            [8, 4, 3, 3],
            true,
            vec![ints("pads", &[2, 2, 2, 2]), ints("dilations", &[2, 2])],
        )
    }));
    // Activation centering's Pad (value -c) before a depthwise conv that pads nothing: the
    // INT8 engine folds it into the depthwise kernel (the row-window one, or `conv_dw4` for
    // DeepLab's dilated convs), which then pads with -c's code.
    for (stride, d) in [(1i64, 1i64), (2, 1), (1, 2)] {
        cases.push(graph(
            &format!("Centering pad folded into a depthwise conv, stride {stride}, dilation {d}"),
            &s,
            13,
            |b, x| {
                let c = b.conv("pre", x, 4, 8, 1);
                let r = b.op("Relu", "pre.relu", &[&c]);
                let pads = b.ints("pads", &[8], &[0, 0, d, d, 0, 0, d, d]);
                let v = b.constant("v", &[], &[-0.5]);
                let p = b.op("Pad", "pad", &[&r, &pads, &v]);
                let attrs = vec![
                    ints("strides", &[stride, stride]),
                    ints("dilations", &[d, d]),
                    int("group", 8),
                ];
                conv_node(b, "dw", &p, [8, 1, 3, 3], true, attrs)
            },
        ));
    }
    cases.push(graph(
        "Depthwise stride 2 asymmetric pads",
        &s,
        13,
        |b, x| {
            conv_node(
                b,
                "conv",
                x,
                [4, 1, 3, 3],
                false,
                vec![
                    ints("pads", &[0, 1, 1, 0]),
                    ints("strides", &[2, 2]),
                    int("group", 4),
                ],
            )
        },
    ));
    // Stems: 3 input channels at stride 2 or 4, which the planner regroups into blocks
    // (space to depth) so the conv runs at stride 1 over 16 channels.
    let rgb = [2, 3, 17, 15];
    for (what, k, st, pads) in [
        ("Stem 7x7/2 pad 3", 7, 2, [3, 3, 3, 3]),
        ("Stem 3x3/2 pad 1", 3, 2, [1, 1, 1, 1]),
        ("Stem 3x3/2 SAME pads", 3, 2, [0, 0, 1, 1]),
        ("Patchify 4x4/4", 4, 4, [0, 0, 0, 0]),
    ] {
        cases.push(graph(what, &rgb, 13, |b, x| {
            let y = conv_node(
                b,
                "stem",
                x,
                [16, 3, k, k],
                true,
                vec![ints("strides", &[st, st]), ints("pads", &pads)],
            );
            b.op("Relu", "relu", &[&y])
        }));
    }
    cases.push(graph("Conv 1x5 then 5x1", &s, 13, |b, x| {
        let a = conv_node(
            b,
            "c1",
            x,
            [8, 4, 1, 5],
            true,
            vec![ints("pads", &[0, 2, 0, 2])],
        );
        let r = b.op("Relu", "relu", &[&a]);
        conv_node(
            b,
            "c2",
            &r,
            [8, 8, 5, 1],
            true,
            vec![ints("pads", &[2, 0, 2, 0])],
        )
    }));
    cases
}

pub(super) fn conv_transpose_cases() -> Vec<Case> {
    let s = [1, 4, 5, 5];
    let mut cases = vec![];
    let ct =
        |b: &mut GraphBuilder, x: &str, w: [usize; 4], bias: bool, attrs: Vec<AttributeProto>| {
            let fan_in = (w[0] * w[2] * w[3]) as f32;
            let wn = b.random("ct.w", &w, 3.0 / fan_in);
            let mut ins = vec![x.to_string(), wn];
            if bias {
                ins.push(b.random("ct.b", &[w[1] * groups_of(&attrs)], 0.1));
            }
            let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
            b.node("ConvTranspose", "ct", &refs, attrs)
        };
    cases.push(graph("ConvTranspose stride 2", &s, 13, |b, x| {
        ct(
            b,
            x,
            [4, 3, 3, 3],
            true,
            vec![
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
                ints("output_padding", &[1, 1]),
            ],
        )
    }));
    cases.push(graph("ConvTranspose stride 2 groups 2", &s, 13, |b, x| {
        ct(
            b,
            x,
            [4, 2, 4, 4],
            true,
            vec![
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
                int("group", 2),
            ],
        )
    }));
    cases.push(graph(
        "ConvTranspose dilation 2, no bias",
        &s,
        13,
        |b, x| {
            ct(
                b,
                x,
                [4, 2, 3, 3],
                false,
                vec![ints("dilations", &[2, 2]), ints("pads", &[0, 1, 1, 0])],
            )
        },
    ));
    cases.push(graph(
        "ConvTranspose after conv, then Relu",
        &s,
        13,
        |b, x| {
            let c = after_conv(b, x, 4);
            let y = ct(b, &c, [4, 4, 2, 2], true, vec![ints("strides", &[2, 2])]);
            b.op("Relu", "relu", &[&y])
        },
    ));
    cases
}

fn groups_of(attrs: &[AttributeProto]) -> usize {
    attrs
        .iter()
        .find(|a| a.name == "group")
        .map_or(1, |a| a.i as usize)
}
