//! MatMul and Gemm: batched, broadcast and transposed operands.

use super::*;

pub(super) fn matmul_and_gemm_cases() -> Vec<Case> {
    let mut cases = vec![];
    // Attention's Q.K^T: tensor x tensor, batch dims [2, 4].
    cases.push(graph(
        "MatMul [2,4,8,16] x [2,4,16,8]",
        &[2, 4, 8, 16],
        13,
        |b, x| {
            let a = b.op("Sigmoid", "q", &[x]);
            let t = b.op("Tanh", "k", &[x]);
            let kt = b.node("Transpose", "kt", &[&t], vec![ints("perm", &[0, 1, 3, 2])]);
            b.op("MatMul", "qk", &[&a, &kt])
        },
    ));
    // attn.V: [2,4,8,8] x [2,4,8,16].
    cases.push(graph("MatMul softmax x V", &[2, 4, 8, 16], 13, |b, x| {
        let kt = b.node("Transpose", "kt", &[x], vec![ints("perm", &[0, 1, 3, 2])]);
        let s = b.op("MatMul", "qk", &[x, &kt]);
        let p = b.node("Softmax", "sm", &[&s], vec![int("axis", -1)]);
        b.op("MatMul", "av", &[&p, x])
    }));
    // Batch broadcast: [1, 4, 8, 16] x [4, 16, 8] (rank 4 x rank 3, the batch of 1 stretched).
    cases.push(graph(
        "MatMul batch broadcast",
        &[1, 4, 8, 16],
        13,
        |b, x| {
            let r = b.ints("shape", &[3], &[4, 16, 8]);
            let t = b.node("Transpose", "t", &[x], vec![ints("perm", &[0, 1, 3, 2])]);
            let w = b.op("Reshape", "r", &[&t, &r]);
            let w2 = b.op("Tanh", "tw", &[&w]);
            b.op("MatMul", "mm", &[x, &w2])
        },
    ));
    // Linear layer: rank 3 x constant 2-D.
    cases.push(graph(
        "MatMul rank-3 x const",
        &[1, 4, 8, 16],
        13,
        |b, x| {
            let r = b.ints("shape", &[3], &[1, 32, 16]);
            let x3 = b.op("Reshape", "r", &[x, &r]);
            let w = b.random("w", &[16, 12], 0.5);
            let mm = b.op("MatMul", "mm", &[&x3, &w]);
            let bias = b.random("bias", &[12], 0.1);
            b.op("Add", "add_bias", &[&mm, &bias])
        },
    ));
    cases.push(graph(
        "MatMul rank-4 x const",
        &[2, 4, 8, 16],
        13,
        |b, x| {
            let w = b.random("w", &[16, 8], 0.5);
            b.op("MatMul", "mm", &[x, &w])
        },
    ));
    // Classifier heads: Gemm with transB, and with transA / alpha / beta.
    cases.push(graph("Gemm transB", &[2, 4, 4, 4], 13, |b, x| {
        let f = b.op("Flatten", "f", &[x]);
        let w = b.random("w", &[10, 64], 0.3);
        let bias = b.random("bias", &[10], 0.1);
        b.node("Gemm", "fc", &[&f, &w, &bias], vec![int("transB", 1)])
    }));
    cases.push(graph(
        "Gemm transA alpha beta",
        &[2, 4, 4, 4],
        13,
        |b, x| {
            let f = b.node("Flatten", "f", &[x], vec![int("axis", 1)]);
            let ft = b.node("Transpose", "ft", &[&f], vec![ints("perm", &[1, 0])]);
            let w = b.random("w", &[64, 10], 0.3);
            let bias = b.random("bias", &[10], 0.1);
            b.node(
                "Gemm",
                "fc",
                &[&ft, &w, &bias],
                vec![
                    int("transA", 1),
                    float_attr("alpha", 0.5),
                    float_attr("beta", 2.0),
                ],
            )
        },
    ));
    cases
}
