//! Shape subgraphs (PyTorch's `x.view(x.size(0), -1)`) that fold at build time.

use super::*;

/// Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as PyTorch exports `x.view(x.size(0),
/// -1)`: folded at build time, so none of its nodes is a step of the CUDA engine.
pub(super) fn shape_cases() -> Vec<Case> {
    let mut cases = vec![];
    for batch in [1usize, 2] {
        cases.push(graph(
            &format!("x.view(x.size(0), -1), batch {batch}"),
            &[batch, 4, 5, 6],
            13,
            |b, x| {
                let c = after_conv(b, x, 4);
                let s = b.op("Shape", "shape", &[&c]);
                let i = b.ints("zero", &[], &[0]);
                let n = b.node("Gather", "shape.gather", &[&s, &i], vec![int("axis", 0)]);
                let ax = b.ints("ax", &[1], &[0]);
                let u = b.op("Unsqueeze", "shape.unsqueeze", &[&n, &ax]);
                let m1 = b.ints("minus1", &[1], &[-1]);
                let cat = b.node("Concat", "shape.concat", &[&u, &m1], vec![int("axis", 0)]);
                let r = b.op("Reshape", "reshape", &[&c, &cat]);
                b.op("Relu", "relu", &[&r])
            },
        ));
    }
    // ConstantOfShape + Range, as ViT exports its position ids.
    cases.push(graph(
        "ConstantOfShape + Range",
        &[1, 4, 5, 6],
        13,
        |b, x| {
            let s = b.op("Shape", "shape", &[x]);
            let i = b.ints("idx", &[1], &[1]);
            let c = b.node("Gather", "shape.gather", &[&s, &i], vec![int("axis", 0)]);
            let z = b.op("ConstantOfShape", "shape.zeros", &[&c]);
            let zf = b.node("Cast", "shape.cast_zeros", &[&z], vec![int("to", 1)]);
            let zero = b.ints("start", &[], &[0]);
            let one = b.ints("delta", &[], &[1]);
            let four = b.ints("limit", &[], &[4]);
            let r = b.op("Range", "shape.range", &[&zero, &four, &one]);
            let rf = b.node("Cast", "shape.cast_range", &[&r], vec![int("to", 1)]);
            let f = b.op("Add", "shape.add", &[&zf, &rf]);
            let shp = b.ints("shp", &[4], &[1, 4, 1, 1]);
            let fr = b.op("Reshape", "shape.reshape", &[&f, &shp]);
            b.op("Mul", "mul", &[x, &fr])
        },
    ));
    cases
}
