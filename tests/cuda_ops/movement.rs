//! Data movement: Transpose and the Reshape family, Expand/Tile/Gather, Slice/Split/Concat, Pad, DepthToSpace and SpaceToDepth.

use super::*;

pub(super) fn transpose_and_reshape_family_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    for perm in [
        [0, 2, 3, 1],
        [0, 3, 1, 2],
        [0, 2, 1, 3],
        [3, 1, 0, 2],
        [1, 0, 3, 2],
    ] {
        cases.push(graph(&format!("Transpose {perm:?}"), &s, 13, |b, x| {
            b.node("Transpose", "t", &[x], vec![ints("perm", &perm)])
        }));
        cases.push(graph(
            &format!("Transpose {perm:?} after conv"),
            &s,
            13,
            |b, x| {
                let c = after_conv(b, x, 4);
                b.node("Transpose", "t", &[&c], vec![ints("perm", &perm)])
            },
        ));
    }
    cases.push(graph("Transpose rank 5", &s, 13, |b, x| {
        let r = b.ints("shape", &[5], &[1, 2, 2, 5, 6]);
        let x5 = b.op("Reshape", "r", &[x, &r]);
        b.node(
            "Transpose",
            "t",
            &[&x5],
            vec![ints("perm", &[0, 3, 1, 4, 2])],
        )
    }));
    cases.push(graph("Reshape [1, 4, 30] + Relu", &s, 13, |b, x| {
        let r = b.ints("shape", &[3], &[1, 4, -1]);
        let y = b.op("Reshape", "r", &[x, &r]);
        b.op("Relu", "relu", &[&y])
    }));
    cases.push(graph("Reshape after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let r = b.ints("shape", &[3], &[0, 2, -1]);
        b.op("Reshape", "r", &[&c, &r])
    }));
    cases.push(graph("Flatten axis 2", &s, 13, |b, x| {
        let f = b.node("Flatten", "f", &[x], vec![int("axis", 2)]);
        b.op("Tanh", "t", &[&f])
    }));
    cases.push(graph("Unsqueeze, Squeeze", &s, 13, |b, x| {
        let ax = b.ints("ax0", &[1], &[0]);
        let u = b.op("Unsqueeze", "u", &[x, &ax]);
        let t = b.op("Sigmoid", "sg", &[&u]);
        let ax2 = b.ints("ax2", &[2], &[0, 1]);
        b.op("Squeeze", "s", &[&t, &ax2])
    }));
    cases.push(graph("Identity, Dropout", &s, 13, |b, x| {
        let i = b.op("Identity", "id", &[x]);
        let d = b.op("Dropout", "drop", &[&i]);
        b.op("Neg", "neg", &[&d])
    }));
    cases
}

pub(super) fn expand_tile_gather_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    cases.push(graph("Expand [1,4,1,6] -> [2,4,5,6]", &s, 13, |b, x| {
        let m = b.node("ReduceMean", "m", &[x], vec![ints("axes", &[2])]);
        let shape = b.ints("shape", &[4], &[2, 4, 5, 6]);
        b.op("Expand", "e", &[&m, &shape])
    }));
    cases.push(graph("Expand rank up", &s, 13, |b, x| {
        let shape = b.ints("shape", &[5], &[3, 1, 4, 5, 6]);
        b.op("Expand", "e", &[x, &shape])
    }));
    cases.push(graph("Tile", &s, 13, |b, x| {
        let r = b.ints("reps", &[4], &[1, 2, 1, 3]);
        b.op("Tile", "t", &[x, &r])
    }));
    // Channel shuffle (ShuffleNet): constant indices on axis 1.
    cases.push(graph("Gather axis 1", &s, 13, |b, x| {
        let i = b.ints("idx", &[4], &[2, 0, 3, 1]);
        b.node("Gather", "g", &[x, &i], vec![int("axis", 1)])
    }));
    cases.push(graph("Gather axis 1 after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let i = b.ints("idx", &[6], &[3, 2, 1, 0, 0, 1]);
        b.node("Gather", "g", &[&c, &i], vec![int("axis", 1)])
    }));
    cases.push(graph(
        "Gather scalar index (ViT class token)",
        &s,
        13,
        |b, x| {
            let i = b.ints("idx", &[], &[2]);
            b.node("Gather", "g", &[x, &i], vec![int("axis", 2)])
        },
    ));
    cases.push(graph("Gather negative indices axis -1", &s, 13, |b, x| {
        let i = b.ints("idx", &[2, 2], &[-1, 0, 2, -3]);
        b.node("Gather", "g", &[x, &i], vec![int("axis", -1)])
    }));
    cases.push(graph("Gather axis 0 of a 2-D table", &s, 13, |b, x| {
        let r = b.ints("shape", &[2], &[20, 6]);
        let t = b.op("Reshape", "r", &[x, &r]);
        let i = b.ints("idx", &[3], &[19, 0, 7]);
        b.node("Gather", "g", &[&t, &i], vec![int("axis", 0)])
    }));
    cases
}

pub(super) fn slice_split_concat_cases() -> Vec<Case> {
    let s = [1, 4, 6, 8];
    let mut cases = vec![];
    cases.push(graph("Slice step 2", &s, 13, |b, x| {
        let st = b.ints("starts", &[1], &[1]);
        let en = b.ints("ends", &[1], &[8]);
        let ax = b.ints("axes", &[1], &[3]);
        let sp = b.ints("steps", &[1], &[2]);
        b.op("Slice", "sl", &[x, &st, &en, &ax, &sp])
    }));
    cases.push(graph("Slice reversed (step -1)", &s, 13, |b, x| {
        let st = b.ints("starts", &[1], &[-1]);
        let en = b.ints("ends", &[1], &[i64::MIN]);
        let ax = b.ints("axes", &[1], &[2]);
        let sp = b.ints("steps", &[1], &[-1]);
        b.op("Slice", "sl", &[x, &st, &en, &ax, &sp])
    }));
    cases.push(graph("Slice negative starts, two axes", &s, 13, |b, x| {
        let st = b.ints("starts", &[2], &[-5, 1]);
        let en = b.ints("ends", &[2], &[i64::MAX, 3]);
        let ax = b.ints("axes", &[2], &[3, 1]);
        b.op("Slice", "sl", &[x, &st, &en, &ax])
    }));
    cases.push(graph("Slice step -2 after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let st = b.ints("starts", &[1], &[6]);
        let en = b.ints("ends", &[1], &[0]);
        let ax = b.ints("axes", &[1], &[3]);
        let sp = b.ints("steps", &[1], &[-2]);
        b.op("Slice", "sl", &[&c, &st, &en, &ax, &sp])
    }));
    cases.push(graph("Split [1, 3] + Concat swapped", &s, 13, |b, x| {
        let sp = b.ints("split_sizes", &[2], &[1, 3]);
        let parts = b.node_n("Split", "split", &[x, &sp], 2, vec![int("axis", 1)]);
        let r = b.op("Relu", "relu", &[&parts[0]]);
        let t = b.op("Sigmoid", "sg", &[&parts[1]]);
        b.node("Concat", "cat", &[&t, &r], vec![int("axis", 1)])
    }));
    cases.push(graph("Split equal on the last axis", &s, 13, |b, x| {
        let parts = b.node_n("Split", "split", &[x], 2, vec![int("axis", -1)]);
        b.op("Sub", "sub", &[&parts[0], &parts[1]])
    }));
    for axis in [1, 2, -1, 0] {
        cases.push(graph(&format!("Concat axis {axis}"), &s, 13, |b, x| {
            let t = b.op("Tanh", "t", &[x]);
            b.node("Concat", "cat", &[x, &t, x], vec![int("axis", axis)])
        }));
    }
    cases.push(graph("Concat conv outputs axis 1", &s, 13, |b, x| {
        let c1 = b.conv("c1", x, 4, 4, 1);
        let c2 = b.conv("c2", x, 4, 6, 3);
        b.node("Concat", "cat", &[&c1, &c2], vec![int("axis", 1)])
    }));
    cases
}

pub(super) fn pad_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    let pads: [(&str, [i64; 8]); 2] = [
        ("spatial", [0, 0, 1, 2, 0, 0, 2, 1]),
        ("channels too", [0, 1, 1, 0, 0, 2, 0, 1]),
    ];
    let pad = |b: &mut GraphBuilder, x: &str, p: &[i64], mode: &str| {
        let pp = b.ints("pads", &[8], p);
        let v = b.constant("value", &[], &[0.5]);
        let ins: Vec<&str> = if mode == "constant" {
            vec![x, &pp, &v]
        } else {
            vec![x, &pp]
        };
        b.node("Pad", "pad", &ins, vec![string("mode", mode)])
    };
    for mode in ["constant", "reflect", "edge"] {
        for (what, p) in pads {
            cases.push(graph(&format!("Pad {mode} {what}"), &s, 13, |b, x| {
                pad(b, x, &p, mode)
            }));
        }
        // Negative pads crop. tract panics on them (overflow in its Pad), so the CPU runs the
        // same as a Slice then a Pad.
        let crop = graph(&format!("Pad {mode} negative (crop)"), &s, 13, |b, x| {
            pad(b, x, &[0, 0, -1, 2, 0, 0, 1, -2], mode)
        });
        let reference = graph("crop reference", &s, 13, |b, x| {
            let st = b.ints("starts", &[2], &[1, 0]);
            let en = b.ints("ends", &[2], &[i64::MAX, 4]);
            let ax = b.ints("axes", &[2], &[2, 3]);
            let sl = b.op("Slice", "slice", &[x, &st, &en, &ax]);
            pad(b, &sl, &[0, 0, 0, 2, 0, 0, 1, 0], mode)
        });
        cases.push(crop.with_reference(reference));
        cases.push(graph(&format!("Pad {mode} after conv"), &s, 13, |b, x| {
            let c = after_conv(b, x, 4);
            let pp = b.ints("pads", &[8], &[0, 0, 2, 1, 0, 0, 1, 2]);
            b.node("Pad", "pad", &[&c, &pp], vec![string("mode", mode)])
        }));
    }
    cases
}

pub(super) fn depth_to_space_and_space_to_depth_cases() -> Vec<Case> {
    let mut cases = vec![];
    for mode in ["DCR", "CRD"] {
        cases.push(graph(
            &format!("DepthToSpace {mode}"),
            &[1, 8, 4, 5],
            13,
            |b, x| {
                b.node(
                    "DepthToSpace",
                    "d2s",
                    &[x],
                    vec![int("blocksize", 2), string("mode", mode)],
                )
            },
        ));
    }
    cases.push(graph(
        "DepthToSpace after conv",
        &[1, 8, 4, 5],
        13,
        |b, x| {
            let c = after_conv(b, x, 8);
            b.node("DepthToSpace", "d2s", &[&c], vec![int("blocksize", 2)])
        },
    ));
    cases.push(graph("SpaceToDepth", &[1, 2, 4, 6], 13, |b, x| {
        b.node("SpaceToDepth", "s2d", &[x], vec![int("blocksize", 2)])
    }));
    cases
}
