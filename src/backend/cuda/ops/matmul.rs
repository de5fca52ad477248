//! Matrix products of computed tensors: batched MatMul with NumPy broadcasting (attention's
//! Q·Kᵀ and attn·V), Gemm of two tensors, and Einsum equations that reduce to a batched
//! MatMul between two transposes. MatMul against a constant 2-D B is a linear layer and goes
//! to `conv` (cuBLASLt, fused epilogue). Int8 operands (the Q/DQ plan quantizes both inputs
//! of every MatMul) are read as int8 with their scales.

use tract_onnx::pb;

use super::{Builder, OpFamily, Value, err};
use crate::backend::FloatNode;
use crate::backend::cuda::plan::{Act, DType, EwOp, Layout, Operand, PlanResult, Step};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "matmul",
    ops: &["MatMul", "Einsum"],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    match n.op_type.as_str() {
        "Einsum" => einsum(b, i),
        // MatMul against a constant 2-D B goes to `conv` (`Builder::lowering_of`).
        _ => {
            let o = matmul(b, n, &n.input[0], &n.input[1], false, &n.output[0], &n.name)?;
            b.values.insert(n.output[0].clone(), Value::Tensor(o));
            Ok(())
        }
    }
}

/// A device operand of a matmul: the tensor (plain, int8 kept as int8) or a constant.
fn operand(b: &mut Builder<'_>, name: &str) -> PlanResult<(Operand, Vec<usize>, DType)> {
    if b.is_const(name)
        && let Some(c) = b.const_f32(name)
    {
        let dims = c.dims.clone();
        return Ok((Operand::Const(c.data, c.dims), dims, DType::F32));
    }
    let t = b.any_tensor_of(name, "matmul operand")?;
    let t = b.to_layout(t, Layout::Plain, "matmul")?;
    let d = b.desc(t).clone();
    Ok((Operand::Tensor(t), d.shape, d.dtype))
}

/// `a @ b` (b transposed in its last two dims when `trans_b`), NumPy matmul broadcasting;
/// returns the output tensor, named `out_name`.
pub(super) fn matmul(
    b: &mut Builder<'_>,
    n: &pb::NodeProto,
    a_name: &str,
    b_name: &str,
    trans_b: bool,
    out_name: &str,
    step_name: &str,
) -> PlanResult<usize> {
    // A is always a device tensor: a constant A (rare: position tables) is materialized.
    let mut a = b.any_tensor_of(a_name, "matmul A")?;
    a = b.to_layout(a, Layout::Plain, "matmul")?;
    let (ashape, at) = (b.desc(a).shape.clone(), b.desc(a).dtype);
    let (bo, bshape, bt) = operand(b, b_name)?;
    if ashape.is_empty() || bshape.is_empty() {
        return Err(err(n, "scalar operands are not matrices"));
    }
    // Rank-1 operands: A [K] is [1, K] and B [K] is [K, 1], the unit dim dropped after.
    let a2 = if ashape.len() == 1 {
        vec![1, ashape[0]]
    } else {
        ashape.clone()
    };
    let b2 = if bshape.len() == 1 {
        if trans_b {
            vec![1, bshape[0]]
        } else {
            vec![bshape[0], 1]
        }
    } else {
        bshape.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, nn) = if trans_b {
        (b2[b2.len() - 1], b2[b2.len() - 2])
    } else {
        (b2[b2.len() - 2], b2[b2.len() - 1])
    };
    if k != kb {
        return Err(err(
            n,
            format!("inner dims differ: A {ashape:?}, B {bshape:?}"),
        ));
    }
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch_dims = super::broadcast_shape(&[ab.to_vec(), bb.to_vec()])
        .ok_or_else(|| err(n, format!("batch dims of {ashape:?} and {bshape:?} differ")))?;
    let batch: usize = batch_dims.iter().product();
    // An operand whose batch dims are not the output's (partial broadcast) is expanded by a
    // copy; one matrix for the whole batch is read with stride 0.
    let a_batch: usize = ab.iter().product();
    let a_stride = if a_batch == 1 {
        0
    } else {
        if a_batch != batch {
            let full: Vec<usize> = batch_dims.iter().copied().chain([m, k]).collect();
            a = expand_copy(b, a, &a2, &full, &format!("{step_name}.expand_a"));
        }
        m * k
    };
    let b_batch: usize = bb.iter().product();
    let mut bo = bo;
    let b_stride = if b_batch == 1 {
        0
    } else {
        if b_batch != batch {
            let Operand::Tensor(t) = bo else {
                return Err(err(
                    n,
                    "a constant B broadcast over part of the batch is not supported",
                ));
            };
            let last2: Vec<usize> = b2[b2.len() - 2..].to_vec();
            let full: Vec<usize> = batch_dims.iter().copied().chain(last2).collect();
            bo = Operand::Tensor(expand_copy(
                b,
                t,
                &b2,
                &full,
                &format!("{step_name}.expand_b"),
            ));
        }
        k * nn
    };
    let mut out_shape: Vec<usize> = batch_dims.clone();
    if ashape.len() > 1 {
        out_shape.push(m);
    }
    if bshape.len() > 1 {
        out_shape.push(nn);
    }
    let both_int8 = at == DType::I8 && bt == DType::I8;
    if both_int8 {
        b.plan.int8_nodes.push(step_name.into());
    } else if b.quant.is_some() {
        b.plan.float_nodes.push(FloatNode {
            node: step_name.into(),
            op: n.op_type.clone(),
            reason: "inputs are not both quantized".into(),
        });
    }
    let o = b.tensor(out_name, out_shape, Layout::Plain, b.float, 1.0);
    b.plan.steps.push(Step::MatMul {
        name: step_name.into(),
        a,
        b: bo,
        out: o,
        batch,
        m,
        n: nn,
        k,
        a_stride,
        b_stride,
        trans_b,
    });
    Ok(o)
}

/// A copy of plain tensor `t` (logical dims `dims`, right-aligned) broadcast to `full`.
fn expand_copy(b: &mut Builder<'_>, t: usize, dims: &[usize], full: &[usize], name: &str) -> usize {
    let d = b.desc(t).clone();
    let o = b.tensor(name, full.to_vec(), Layout::Plain, d.dtype, d.scale);
    let logical = super::bcast_logical(dims, &super::row_major(dims), full);
    let step = b.view_step(name, t, o, Some(logical), 0);
    b.plan.steps.push(step);
    o
}

/// Gemm whose B is computed: `alpha * A' @ B' + beta * C`.
pub(super) fn gemm_of_tensors(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    if proto::attr_i(n, "transA").unwrap_or(0) == 1 {
        return Err(err(n, "Gemm with transA and a computed B is not supported"));
    }
    let trans_b = proto::attr_i(n, "transB").unwrap_or(0) == 1;
    let alpha = proto::attr_f(n, "alpha").unwrap_or(1.0);
    let beta = proto::attr_f(n, "beta").unwrap_or(1.0);
    let c = n.input.get(2).filter(|s| !s.is_empty()).cloned();
    let plain_out = alpha == 1.0 && c.is_none();
    let mm_name = if plain_out {
        n.output[0].clone()
    } else {
        format!("{}.product", n.output[0])
    };
    let mut o = matmul(b, n, &n.input[0], &n.input[1], trans_b, &mm_name, &n.name)?;
    if alpha != 1.0 {
        o = super::elementwise::scale_by(b, o, alpha, &format!("{}.alpha", n.name))?;
    }
    if let Some(c) = c {
        let cc = b
            .const_f32(&c)
            .ok_or_else(|| err(n, "C must be a constant"))?;
        let data: Vec<f32> = cc.data.iter().map(|v| v * beta).collect();
        let d = b.desc(o).clone();
        if super::broadcast_shape(&[d.shape.clone(), cc.dims.clone()]).as_ref() != Some(&d.shape) {
            return Err(err(n, "C does not broadcast over the product"));
        }
        let out = b.tensor(&n.output[0], d.shape.clone(), Layout::Plain, b.float, 1.0);
        b.plan.steps.push(Step::Nary {
            name: format!("{}.c", n.name),
            op: EwOp::Add,
            strides: vec![
                super::row_major(&d.shape),
                super::bcast_strides(&cc.dims, &d),
            ],
            inputs: vec![Operand::Tensor(o), Operand::Const(data, cc.dims)],
            dims: d.shape,
            out,
            act: Act::None,
        });
        o = out;
    }
    b.values.insert(n.output[0].clone(), Value::Tensor(o));
    Ok(())
}

/// Einsum of two operands as permute -> batched MatMul -> permute. Each letter is a batch
/// index (in both inputs and the output), a contraction (both inputs, not the output) or a
/// free index of one input (and the output).
fn einsum(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let eq = proto::attr_str(n, "equation").ok_or_else(|| err(n, "no equation"))?;
    if n.input.len() != 2 {
        return Err(err(n, "only two-operand equations are supported"));
    }
    let shapes: Vec<Vec<usize>> = n
        .input
        .iter()
        .map(|s| {
            b.shape_of(s)
                .ok_or_else(|| err(n, format!("input `{s}` unknown")))
        })
        .collect::<PlanResult<_>>()?;
    let (ins, out) = parse_einsum(&eq, &shapes).map_err(|e| err(n, e))?;
    let (la, lb) = (&ins[0], &ins[1]);
    let size = |c: char| -> usize {
        la.iter()
            .position(|&x| x == c)
            .map(|p| shapes[0][p])
            .or_else(|| lb.iter().position(|&x| x == c).map(|p| shapes[1][p]))
            .unwrap_or(1)
    };
    let batch: Vec<char> = out
        .iter()
        .copied()
        .filter(|c| la.contains(c) && lb.contains(c))
        .collect();
    let contract: Vec<char> = la
        .iter()
        .copied()
        .filter(|c| lb.contains(c) && !out.contains(c))
        .collect();
    let free_a: Vec<char> = la.iter().copied().filter(|c| !lb.contains(c)).collect();
    let free_b: Vec<char> = lb.iter().copied().filter(|c| !la.contains(c)).collect();
    if free_a.iter().chain(&free_b).any(|c| !out.contains(c)) {
        return Err(err(
            n,
            "indices summed within one operand are not supported",
        ));
    }
    for &c in &batch {
        let pa = la.iter().position(|&x| x == c).map(|p| shapes[0][p]);
        let pb = lb.iter().position(|&x| x == c).map(|p| shapes[1][p]);
        if pa != pb {
            return Err(err(n, format!("index `{c}` has different sizes")));
        }
    }
    let prod = |cs: &[char]| cs.iter().map(|&c| size(c)).product::<usize>();
    let (bt, m, k, nn) = (prod(&batch), prod(&free_a), prod(&contract), prod(&free_b));
    // A -> [batch, free_a, contract], B -> [batch, contract, free_b], as plain copies.
    let a_order: Vec<char> = batch
        .iter()
        .chain(&free_a)
        .chain(&contract)
        .copied()
        .collect();
    let b_order: Vec<char> = batch
        .iter()
        .chain(&contract)
        .chain(&free_b)
        .copied()
        .collect();
    let a3 = permuted(
        b,
        &n.input[0],
        la,
        &a_order,
        [bt, m, k],
        &format!("{}.a", n.name),
    )?;
    let b3 = permuted(
        b,
        &n.input[1],
        lb,
        &b_order,
        [bt, k, nn],
        &format!("{}.b", n.name),
    )?;
    let mm_name = format!("{}.bmm", n.output[0]);
    let o = matmul(b, n, &a3, &b3, false, &mm_name, &n.name)?;
    // [batch, free_a, free_b] -> the output's order.
    let got: Vec<char> = batch
        .iter()
        .chain(&free_a)
        .chain(&free_b)
        .copied()
        .collect();
    let got_dims: Vec<usize> = got.iter().map(|&c| size(c)).collect();
    let view = b.alias(&format!("{mm_name}.split"), o, got_dims.clone());
    let out_dims: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    if got == out {
        let fin = b.alias(&n.output[0], view, out_dims);
        b.values.insert(n.output[0].clone(), Value::Tensor(fin));
        return Ok(());
    }
    let st = super::row_major(&got_dims);
    let logical: Vec<i64> = out
        .iter()
        .map(|c| st[got.iter().position(|x| x == c).unwrap_or(0)])
        .collect();
    let fin = b.tensor(&n.output[0], out_dims, Layout::Plain, b.float, 1.0);
    let step = b.view_step(&format!("{}.out", n.name), view, fin, Some(logical), 0);
    b.emit(n, fin, step)
}

/// Input `name` (letters `have`) permuted to `want` and viewed as `dims3`; returns the name
/// of the value holding it.
fn permuted(
    b: &mut Builder<'_>,
    name: &str,
    have: &[char],
    want: &[char],
    dims3: [usize; 3],
    vname: &str,
) -> PlanResult<String> {
    let t = b.any_tensor_of(name, "einsum operand")?;
    let t = b.to_layout(t, Layout::Plain, "einsum")?;
    let d = b.desc(t).clone();
    let st = super::row_major(&d.shape);
    let src = if have == want {
        t
    } else {
        let dims: Vec<usize> = want
            .iter()
            .map(|c| d.shape[have.iter().position(|x| x == c).unwrap_or(0)])
            .collect();
        let logical: Vec<i64> = want
            .iter()
            .map(|c| st[have.iter().position(|x| x == c).unwrap_or(0)])
            .collect();
        let o = b.tensor(
            &format!("{vname}.perm"),
            dims,
            Layout::Plain,
            d.dtype,
            d.scale,
        );
        let step = b.view_step(&format!("{vname}.perm"), t, o, Some(logical), 0);
        b.plan.steps.push(step);
        o
    };
    let v = b.alias(vname, src, dims3.to_vec());
    b.values.insert(vname.into(), Value::Tensor(v));
    Ok(vname.into())
}

/// Parses `eq` ("ab,bc->ac", with `...` expanded from the operand ranks) into each input's
/// letters and the output's letters.
pub(crate) fn parse_einsum(
    eq: &str,
    shapes: &[Vec<usize>],
) -> Result<(Vec<Vec<char>>, Vec<char>), String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != shapes.len() {
        return Err(format!(
            "{} operands for {} terms",
            shapes.len(),
            terms.len()
        ));
    }
    // Letters for `...`: capitals no term uses.
    let used: std::collections::HashSet<char> = eq.chars().collect();
    let spare: Vec<char> = ('A'..='Z').filter(|c| !used.contains(c)).collect();
    let mut ell_rank = 0;
    let mut ins = vec![];
    for (t, s) in terms.iter().zip(shapes) {
        let letters: Vec<char> = t.chars().filter(|c| c.is_ascii_alphabetic()).collect();
        if t.contains("...") {
            let r = s
                .len()
                .checked_sub(letters.len())
                .ok_or("the equation has more indices than the operand has dims")?;
            ell_rank = ell_rank.max(r);
            let (pre, post) = t.split_once("...").unwrap_or((t, ""));
            let mut v: Vec<char> = pre.chars().collect();
            v.extend(spare[ell_rank - r..ell_rank].iter());
            v.extend(post.chars());
            ins.push(v);
        } else {
            if letters.len() != s.len() {
                return Err(format!("term `{t}` does not match rank {}", s.len()));
            }
            ins.push(letters);
        }
    }
    let out = match rhs {
        Some(r) => {
            let (pre, post) = r.split_once("...").unwrap_or((&r, ""));
            let mut v: Vec<char> = pre.chars().collect();
            if r.contains("...") {
                v.extend(spare[..ell_rank].iter());
                v.extend(post.chars());
            }
            v
        }
        None => {
            // Implicit output: the letters used once, in alphabetical order.
            let mut all: Vec<char> = ins.iter().flatten().copied().collect();
            all.sort();
            let mut v: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|x| *x == c).count() == 1)
                .collect();
            v.dedup();
            v
        }
    };
    Ok((ins, out))
}
