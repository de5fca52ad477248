//! Convolutions and linear layers with constant weights: Conv (grouped, dilated), Gemm and
//! MatMul against a constant B (as 1x1 convolutions over rows, any leading dims), with bias,
//! a constant bias Add, a residual Add and an activation fused; int8 (FP8 in an FP8 engine)
//! where the Q/DQ plan quantizes both inputs, with a quantized output where every reader
//! quantizes at one scale.
//! Also BatchNormalization left unfolded and ConvTranspose.

use super::{Builder, OpFamily, Value, conv_pads, err, pair};
use crate::backend::FloatNode;
use crate::backend::cuda::plan::{
    Act, ConvStep, DType, Layout, PlanResult, QuantWeights, Step, oihw_to_ohwi,
};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "convolution",
    ops: &["Conv", "Gemm", "BatchNormalization", "ConvTranspose"],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    match b.g.node(i).op_type.as_str() {
        "BatchNormalization" => batch_norm(b, i),
        "ConvTranspose" => conv_transpose(b, i),
        // Gemm of two computed tensors goes to `matmul` (`Builder::lowering_of`).
        _ => conv(b, i),
    }
}

/// A row-major `[k, m]` matrix as `[m, k]` (B of a linear layer into output-channel rows).
fn transpose_km<T: Copy + Default>(d: &[T], k: usize, m: usize) -> Vec<T> {
    let mut t = vec![T::default(); d.len()];
    for r in 0..k {
        for c in 0..m {
            t[c * k + r] = d[r * m + c];
        }
    }
    t
}

pub(super) fn conv(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let op = n.op_type.as_str();
    let wname = n.input.get(1).ok_or_else(|| err(n, "no weight input"))?;
    let w = b.const_of(wname).ok_or_else(|| {
        err(
            n,
            "the weights must be a constant (a computed weight input is not supported)",
        )
    })?;
    // The quantized weights, in the engine's type (FP8 codes held as their i8 bit patterns).
    let w_i8 = match (
        b.quant,
        b.values.get(&format!("{wname}#int8")),
        b.values.get(&format!("{wname}#fp8")),
    ) {
        (Some(DType::I8), Some(Value::ConstI8 { data, dims, scales }), _) => {
            Some((data.clone(), dims.clone(), scales.clone()))
        }
        (
            Some(DType::F8),
            _,
            Some(Value::ConstF8 {
                codes,
                dims,
                scales,
            }),
        ) => Some((
            codes.iter().map(|&c| c as i8).collect(),
            dims.clone(),
            scales.clone(),
        )),
        _ => None,
    };
    let bias_c = n
        .input
        .get(2)
        .filter(|s| !s.is_empty())
        .map(|s| {
            b.const_f32(s)
                .ok_or_else(|| err(n, "bias must be a constant"))
        })
        .transpose()?;
    let x_dq = match b.values.get(&n.input[0]) {
        Some(Value::Dequant { src, scale }) if Some(b.desc(*src).dtype) == b.quant => {
            Some((*src, *scale))
        }
        _ => None,
    };
    let use_int8 = b.quant.is_some() && x_dq.is_some() && w_i8.is_some();
    let x = match x_dq {
        Some((src, _)) if use_int8 => src,
        _ => b.float_tensor_of(&n.input[0], "conv input")?,
    };
    let x = if op == "Conv" {
        b.to_layout(x, Layout::Nhwc, "conv")?
    } else {
        let x = b.to_layout(x, Layout::Plain, "gemm")?;
        let d = b.desc(x).clone();
        if op == "Gemm" && proto::attr_i(n, "transA").unwrap_or(0) == 1 && d.shape.len() == 2 {
            // A is stored [K, M]: one transposing copy gives the rows the GEMM reads.
            let t = b.tensor(
                &format!("{}.transposed", n.input[0]),
                vec![d.shape[1], d.shape[0]],
                Layout::Plain,
                d.dtype,
                d.scale,
            );
            let step = b.view_step(
                &format!("{}.transA", n.name),
                x,
                t,
                Some(vec![1, d.shape[1] as i64]),
                0,
            );
            b.plan.steps.push(step);
            t
        } else {
            x
        }
    };
    let xd = b.desc(x).clone();
    let mut step = ConvStep {
        name: n.name.clone(),
        fused: vec![],
        input: x,
        out: 0,
        w: vec![],
        bias: vec![],
        quant: None,
        cin: 0,
        cout: 0,
        k: [1, 1],
        stride: [1, 1],
        pads: [0; 4],
        pad_code: 0,
        dilation: [1, 1],
        groups: 1,
        residual: None,
        act: Act::None,
        pool_hw: None,
    };
    // The logical output shape, and the shape the step computes (rows x M for linear layers).
    let (out_shape, step_shape): (Vec<usize>, Vec<usize>);
    let w_scales: Vec<f32>;
    let mut w_i8_ordered: Option<Vec<i8>>;
    if op == "Conv" {
        if w.dims.len() != 4 || xd.shape.len() != 4 {
            return Err(err(
                n,
                "only 2-D convolutions (rank-4 input and weights) are implemented",
            ));
        }
        let (co, cig, kh, kw) = (w.dims[0], w.dims[1], w.dims[2], w.dims[3]);
        let groups = proto::attr_i(n, "group").unwrap_or(1).max(1) as usize;
        let strides = pair(n, "strides")?;
        let dil = pair(n, "dilations")?;
        let [nb, cin, h, wd] = [xd.shape[0], xd.shape[1], xd.shape[2], xd.shape[3]];
        if cig * groups != cin || co % groups != 0 {
            return Err(err(n, "channel/group mismatch"));
        }
        let pads = conv_pads(n, [h, wd], [kh, kw], strides, dil)?;
        let span = |len: usize, lo: usize, hi: usize, k: usize, d: usize, s: usize| {
            (len + lo + hi)
                .checked_sub(d * (k - 1) + 1)
                .map(|v| v / s + 1)
        };
        let (oh, ow) = match (
            span(h, pads[0], pads[2], kh, dil[0], strides[0]),
            span(wd, pads[1], pads[3], kw, dil[1], strides[1]),
        ) {
            (Some(a), Some(c)) => (a, c),
            _ => return Err(err(n, "the kernel is larger than the padded input")),
        };
        out_shape = vec![nb, co, oh, ow];
        step_shape = out_shape.clone();
        step.cin = cin;
        step.cout = co;
        step.k = [kh, kw];
        step.stride = strides;
        step.dilation = dil;
        step.pads = pads;
        step.groups = groups;
        step.w = oihw_to_ohwi(&w.data, co, cig, kh, kw);
        w_i8_ordered = w_i8
            .as_ref()
            .map(|(d, _, _)| oihw_to_ohwi(d, co, cig, kh, kw));
        w_scales = w_i8.as_ref().map(|x| x.2.clone()).unwrap_or_default();
        step.bias = match &bias_c {
            Some(bc) if bc.len() == co => bc.data.clone(),
            Some(_) => return Err(err(n, "bias length differs from output channels")),
            None => vec![0.0; co],
        };
        space_to_depth_stem(b, &mut step, w_i8_ordered.as_mut(), [oh, ow]);
    } else {
        // Gemm / MatMul with a constant B: rows of the (flattened) input times B, as a 1x1
        // convolution over H = W = 1.
        if w.dims.len() != 2 || xd.shape.len() < 2 {
            return Err(err(
                n,
                format!(
                    "B must be a 2-D constant and A at least 2-D (A {:?}, B {:?})",
                    xd.shape, w.dims
                ),
            ));
        }
        let gemm = op == "Gemm";
        if gemm && xd.shape.len() != 2 {
            return Err(err(n, "Gemm takes a 2-D A"));
        }
        let trans_b = gemm && proto::attr_i(n, "transB").unwrap_or(0) == 1;
        let alpha = if gemm {
            proto::attr_f(n, "alpha").unwrap_or(1.0)
        } else {
            1.0
        };
        let (k, m) = if trans_b {
            (w.dims[1], w.dims[0])
        } else {
            (w.dims[0], w.dims[1])
        };
        let last = *xd.shape.last().unwrap_or(&0);
        if last != k {
            return Err(err(n, format!("inner dims differ: {last} vs {k}")));
        }
        let rows: usize = xd.shape[..xd.shape.len() - 1].iter().product();
        let mut os = xd.shape.clone();
        *os.last_mut().unwrap_or(&mut 0) = m;
        out_shape = os;
        step_shape = vec![rows, m];
        if xd.shape.len() != 2 {
            // The rows of a plain tensor are contiguous: view it as [rows, K].
            let v = b.alias(&format!("{}.rows", n.input[0]), x, vec![rows, k]);
            step.input = v;
        }
        step.cin = k;
        step.cout = m;
        let mk = if trans_b {
            w.data.clone()
        } else {
            transpose_km(&w.data, k, m)
        };
        step.w = mk.iter().map(|v| v * alpha).collect();
        w_i8_ordered = w_i8.as_ref().map(|(d, _, _)| {
            if trans_b {
                d.clone()
            } else {
                transpose_km(d, k, m)
            }
        });
        w_scales = w_i8
            .as_ref()
            .map(|x| x.2.iter().map(|s| s * alpha).collect())
            .unwrap_or_default();
        step.bias = match &bias_c {
            Some(bc) => {
                let beta = proto::attr_f(n, "beta").unwrap_or(1.0);
                if bc.len() != m && bc.len() != 1 {
                    return Err(err(n, "only a per-column bias C is supported"));
                }
                (0..m)
                    .map(|c| bc.data[if bc.len() == 1 { 0 } else { c }] * beta)
                    .collect()
            }
            None => vec![0.0; m],
        };
    }
    if use_int8 {
        let (_, xs) = x_dq.unwrap_or_default();
        let ws = if w_scales.len() == 1 {
            vec![w_scales[0]; step.cout]
        } else {
            w_scales
        };
        if ws.len() != step.cout {
            return Err(err(n, "weight scales do not match output channels"));
        }
        step.quant = Some(QuantWeights {
            x_scale: xs,
            w: w_i8_ordered.unwrap_or_default(),
            w_scales: ws,
            dtype: b.quant.unwrap_or(DType::I8),
        });
        b.plan.int8_nodes.push(n.name.clone());
    } else if b.quant.is_some() {
        b.plan.float_nodes.push(FloatNode {
            node: n.name.clone(),
            op: n.op_type.clone(),
            reason: "inputs are not quantized (excluded, or not a symmetric Q/DQ pattern of the engine's type)"
                .into(),
        });
    }
    let mut tname = n.output[0].clone();
    // Fusion: a constant bias Add (MatMul + Add is how Linear layers export), a residual Add,
    // then an activation.
    if op != "Conv"
        && let Some(ci) = b.single_consumer(&tname)
    {
        let c = b.g.node(ci);
        if c.op_type == "Add" && c.input.len() == 2 {
            let other = if c.input[0] == tname {
                &c.input[1]
            } else {
                &c.input[0]
            };
            if let Some(bc) = b.const_of(other)
                && bc.dims.iter().rev().skip(1).all(|&d| d == 1)
                && (bc.len() == step.cout || bc.len() == 1)
            {
                for (k, v) in step.bias.iter_mut().enumerate() {
                    *v += bc.data[if bc.len() == 1 { 0 } else { k }];
                }
                step.fused.push(c.name.clone());
                b.skip.insert(ci);
                tname = c.output[0].clone();
            }
        }
    }
    if let Some(ci) = b.single_consumer(&tname) {
        let c = b.g.node(ci);
        if c.op_type == "Add" && c.input.len() == 2 && !b.skip.contains(&ci) {
            let other = if c.input[0] == tname {
                &c.input[1]
            } else {
                &c.input[0]
            };
            // The shortcut may come later in node order (torchvision puts the downsample
            // conv after conv3): lower it now so the Add can still fuse here.
            b.lower_early(other, 4)?;
            let res = match b.values.get(other).cloned() {
                Some(Value::Tensor(t)) if t != b.plan.input => Some(t),
                Some(Value::Dequant { src, .. }) if b.quant.is_some() => Some(src),
                _ => None,
            };
            if let Some(r) = res
                && b.desc(r).shape == out_shape
            {
                // A residual from a layer of the other float type (the overflow guard's FP32
                // layers in an FP16 engine) is cast to this conv's.
                let r = b.in_float(r);
                let r = if op == "Conv" {
                    b.to_layout(r, Layout::Nhwc, "residual")?
                } else {
                    let r = b.to_layout(r, Layout::Plain, "residual")?;
                    if out_shape.len() == 2 {
                        r
                    } else {
                        b.alias(&format!("{other}.rows"), r, step_shape.clone())
                    }
                };
                step.residual = Some(r);
                step.fused.push(c.name.clone());
                b.skip.insert(ci);
                tname = c.output[0].clone();
            }
        }
    }
    // SiLU stays a pass of its own in an FP32 engine: its convs run fastest on cuBLASLt's own
    // epilogue, which has no SiLU, and fused (GEMM, then the epilogue kernel) EfficientNet-B0
    // at batch 32 took 3.09 ms against 2.81 unfused on an H200, where FP16 went from 2.20 to
    // 1.73 ms and INT8 from 2.49 to 2.02.
    let silu = b.float != DType::F32;
    let (act, name) = b.fuse_act(&tname, &mut step.fused, silu);
    step.act = act;
    tname = name;
    // Int8 output when every reader quantizes at one scale (`reader_q_scale`: a max pool
    // whose readers all do counts, so that ResNet's stem pool runs on int8 codes and the conv
    // writes a quarter of the f32 bytes).
    let mut out_dtype = b.float;
    let mut out_scale = 1.0;
    let mut q_nodes = vec![];
    if use_int8 && !b.g.is_graph_output(&tname) {
        let cons = b.g.consumers(&tname);
        let scale = one_scale(
            cons.iter()
                .map(|&(ci, slot)| reader_q_scale(b, ci, slot, true)),
        );
        if let Some(scale) = scale {
            out_dtype = b.quant.unwrap_or(DType::I8);
            out_scale = scale;
            // Bias through int32 at x_scale * w_scale, as an int8-out conv (QLinearConv on
            // the CPU, TensorRT's int32 bias) computes it. FP8 layers keep a float bias.
            if let Some(q) = step.quant.as_ref().filter(|q| q.is_int8()) {
                for (c, v) in step.bias.iter_mut().enumerate() {
                    let s = q.x_scale * q.w_scales[c];
                    if s > 0.0 {
                        *v = (*v / s).round_ties_even() * s;
                    }
                }
            }
            q_nodes = cons
                .iter()
                .map(|c| c.0)
                .filter(|&ci| b.g.node(ci).op_type == "QuantizeLinear")
                .collect();
        }
    }
    let layout = if op == "Conv" {
        Layout::Nhwc
    } else {
        Layout::Plain
    };
    let o = b.tensor(&tname, step_shape.clone(), layout, out_dtype, out_scale);
    step.out = o;
    let logical = if step_shape == out_shape {
        o
    } else {
        b.alias(&format!("{tname}.shaped"), o, out_shape)
    };
    b.values.insert(tname.clone(), Value::Tensor(logical));
    for q in q_nodes {
        let qn = b.g.node(q);
        step.fused.push(qn.name.clone());
        b.skip.insert(q);
        b.values
            .insert(qn.output[0].clone(), Value::Tensor(logical));
    }
    b.plan.steps.push(Step::Conv(step));
    Ok(())
}

/// The scale at which reader `ci` (reading input `slot`) quantizes a conv's output: a
/// QuantizeLinear's own; with `through_pool`, for a max pool or a constant pad, the one scale
/// all its readers quantize at (quantizing is monotone, so it commutes with the max, and a pad
/// only copies values: exact). `None` for any
/// other reader, or one whose output is a graph output.
fn reader_q_scale(b: &Builder<'_>, ci: usize, slot: usize, through_pool: bool) -> Option<f32> {
    let c = b.g.node(ci);
    if slot != 0 || b.g.is_graph_output(&c.output[0]) {
        return None;
    }
    match c.op_type.as_str() {
        "QuantizeLinear" => super::quant::q_scale(b, c),
        "MaxPool" if through_pool && c.output.iter().skip(1).all(|o| o.is_empty()) => one_scale(
            b.g.consumers(&c.output[0])
                .iter()
                .map(|&(cj, s)| reader_q_scale(b, cj, s, false)),
        ),
        // A constant pad (activation centering's, before a padded conv: `prepare::center`)
        // commutes with quantizing as the max does; it then copies codes.
        "Pad" if through_pool && proto::attr_str(c, "mode").is_none_or(|m| m == "constant") => {
            one_scale(
                b.g.consumers(&c.output[0])
                    .iter()
                    .map(|&(cj, s)| reader_q_scale(b, cj, s, false)),
            )
        }
        _ => None,
    }
}

/// The scale when there is at least one and all are the same scale.
fn one_scale(mut scales: impl Iterator<Item = Option<f32>>) -> Option<f32> {
    let first = scales.next()??;
    scales.all(|s| s == Some(first)).then_some(first)
}

/// Input channels at most which a strided conv is a stem `space_to_depth_stem` regroups: an
/// image's 3 (or 4) channels, a quarter of a tensor-core step or less per tap.
const STEM_MAX_CIN: usize = 4;

/// A stem conv (stride s >= 2 in both axes, no dilation, one group, at most `STEM_MAX_CIN`
/// input channels) rewritten as a stride-1 conv over its input regrouped into s x s blocks,
/// as MLPerf's ResNet-50 submissions run it. With 3 channels a tap is 6 bytes of FP16 or 3 of
/// int8, and cuDNN found only slow kernels for ResNet-50's 7x7/2 stem (0.24 ms of a 1.16 ms
/// FP16 batch-32 engine on an H200): blocks of s x s pixels times 4 or 8 channels (zero
/// channels after the input's; 32 bytes or more in all) make it a ceil(k / s)-tap conv.
/// One `Step::SpaceToDepth` does the regrouping, the conv's top/left pads and the zero
/// channels, reading the tensor the conv input was converted from (the host input, not its
/// NHWC or quantized copy, which then has no reader and is dropped). Exact: every added
/// product has a zero factor. `w_q` are the quantized OHWI weights (regrouped with the float
/// ones), `[oh, ow]` the conv's output size; a step that is not a stem is left as it is.
fn space_to_depth_stem(
    b: &mut Builder<'_>,
    step: &mut ConvStep,
    w_q: Option<&mut Vec<i8>>,
    [oh, ow]: [usize; 2],
) {
    let s = step.stride[0];
    let xd = b.desc(step.input).clone();
    // Channels per pixel: a multiple of 4 (the regrouping kernel stores four at a time),
    // enough that a tap is 32 bytes, one tensor-core k-step (16 FP16 or 32 int8 or FP8
    // channels: with 16, cuDNN's int8 and FP8 kernels ran ResNet-50's stem no faster than
    // before). Where the int8 tensor-core kernel runs (`conv_i8_mma`, sm_80 on) int8 taps are
    // 16 bytes, its copy: it reads every tap of the stem from L2 once per output pixel, and
    // with 32 channels (12 of them the image's) took 119 us at batch 32 on an H200 (cuDNN's
    // int8 graph 122), against 69 with 16 (cuDNN's 349).
    let tap_bytes = if xd.dtype == DType::I8 && b.target.int8_mma {
        16
    } else {
        32
    };
    let cp = (tap_bytes / (s * s * xd.dtype.bytes()).max(1))
        .max(4)
        .next_multiple_of(4);
    if step.cin > STEM_MAX_CIN
        || !(s * s * cp).is_multiple_of(16)
        || s < 2
        || step.stride[1] != s
        || step.dilation != [1, 1]
        || step.groups != 1
        || xd.layout != Layout::Nhwc
        || xd.shape.len() != 4
    {
        return;
    }
    let (kh, kw, cin) = (step.k[0], step.k[1], step.cin);
    let (ah, aw) = (kh.div_ceil(s), kw.div_ceil(s));
    let c2 = s * s * cp;
    let blocks = b.tensor(
        &format!("{}.space_to_depth", xd.name),
        vec![xd.shape[0], c2, oh + ah - 1, ow + aw - 1],
        Layout::Nhwc,
        xd.dtype,
        xd.scale,
    );
    b.plan.steps.push(Step::SpaceToDepth {
        name: format!("{}.space_to_depth", step.name),
        input: b.conversion_source(step.input),
        out: blocks,
        block: s,
        pads: [step.pads[0], step.pads[1]],
    });
    // OHWI [cout, kh, kw, cin] -> [cout, ah, aw, (bh, bw, c)], tap (s * a + b) or zero.
    fn regroup<T: Copy + Default>(
        w: &[T],
        cout: usize,
        [kh, kw, cin]: [usize; 3],
        [ah, aw, s, cp]: [usize; 4],
    ) -> Vec<T> {
        let c2 = s * s * cp;
        let mut out = vec![T::default(); cout * ah * aw * c2];
        for o in 0..cout {
            for y in 0..kh {
                for x in 0..kw {
                    for c in 0..cin {
                        let (a, by, ax, bx) = (y / s, y % s, x / s, x % s);
                        let dst = ((o * ah + a) * aw + ax) * c2 + (by * s + bx) * cp + c;
                        out[dst] = w[((o * kh + y) * kw + x) * cin + c];
                    }
                }
            }
        }
        out
    }
    let (from, to) = ([kh, kw, cin], [ah, aw, s, cp]);
    step.w = regroup(&step.w, step.cout, from, to);
    if let Some(q) = w_q {
        *q = regroup(q, step.cout, from, to);
    }
    step.input = blocks;
    step.cin = c2;
    step.k = [ah, aw];
    step.stride = [1, 1];
    step.pads = [0; 4];
}

/// BatchNormalization not folded into a convolution: a per-channel multiply-add.
fn batch_norm(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let get = |k: usize| {
        n.input
            .get(k)
            .and_then(|s| b.const_f32(s))
            .ok_or_else(|| err(n, "BatchNormalization parameters must be constants"))
    };
    let (s, bb, m, v) = (get(1)?, get(2)?, get(3)?, get(4)?);
    let eps = proto::attr_f(n, "epsilon").unwrap_or(1e-5);
    let c = s.len();
    if [bb.len(), m.len(), v.len()].iter().any(|&l| l != c) {
        return Err(err(n, "parameters differ in length"));
    }
    let k: Vec<f32> = (0..c)
        .map(|j| s.data[j] / (v.data[j] + eps).sqrt())
        .collect();
    let sh: Vec<f32> = (0..c).map(|j| bb.data[j] - m.data[j] * k[j]).collect();
    let x = b.float_tensor_of(&n.input[0], "batch norm input")?;
    let d = b.desc(x).clone();
    if d.shape.len() < 2 || d.shape[1] != c {
        return Err(err(n, "channel count differs from the parameters"));
    }
    super::elementwise::channel_affine(b, n, x, k, sh)
}

fn conv_transpose(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    let w = n
        .input
        .get(1)
        .and_then(|s| b.const_f32(s))
        .ok_or_else(|| err(n, "the weights must be a constant"))?;
    let x = b.float_tensor_of(&n.input[0], "conv transpose input")?;
    let x = b.to_layout(x, Layout::Plain, "conv transpose")?;
    let xd = b.desc(x).clone();
    if xd.shape.len() != 4 || w.dims.len() != 4 {
        return Err(err(n, "only 2-D transposed convolutions are implemented"));
    }
    let groups = proto::attr_i(n, "group").unwrap_or(1).max(1) as usize;
    let [nb, cin, h, wd] = [xd.shape[0], xd.shape[1], xd.shape[2], xd.shape[3]];
    if w.dims[0] != cin || cin % groups != 0 {
        return Err(err(n, "weights do not match the input channels / groups"));
    }
    let cout = w.dims[1] * groups;
    let k = [w.dims[2], w.dims[3]];
    let s = pair(n, "strides")?;
    let d = pair(n, "dilations")?;
    let op = proto::attr_ints(n, "output_padding").unwrap_or(vec![0, 0]);
    let ek = [d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1];
    let full = [
        (h - 1) * s[0] + ek[0] + op.first().copied().unwrap_or(0).max(0) as usize,
        (wd - 1) * s[1] + ek[1] + op.get(1).copied().unwrap_or(0).max(0) as usize,
    ];
    let auto = proto::attr_str(n, "auto_pad").unwrap_or("NOTSET".into());
    let pads: [usize; 4] = if let Some(os) = proto::attr_ints(n, "output_shape") {
        let os: Vec<usize> = os.iter().rev().take(2).rev().map(|&v| v as usize).collect();
        let mut p = [0; 4];
        for a in 0..2 {
            let total = full[a]
                .checked_sub(os[a])
                .ok_or_else(|| err(n, "output_shape larger than the full output"))?;
            let (lo, hi) = if auto == "SAME_LOWER" {
                (total - total / 2, total / 2)
            } else {
                (total / 2, total - total / 2)
            };
            p[a] = lo;
            p[a + 2] = hi;
        }
        p
    } else if auto == "SAME_UPPER" || auto == "SAME_LOWER" {
        let mut p = [0; 4];
        for a in 0..2 {
            let want = [h, wd][a] * s[a];
            let total = full[a].saturating_sub(want);
            let (lo, hi) = if auto == "SAME_LOWER" {
                (total - total / 2, total / 2)
            } else {
                (total / 2, total - total / 2)
            };
            p[a] = lo;
            p[a + 2] = hi;
        }
        p
    } else {
        conv_pads(n, [h, wd], k, s, d)?
    };
    let oh = full[0]
        .checked_sub(pads[0] + pads[2])
        .ok_or_else(|| err(n, "pads larger than the output"))?;
    let ow = full[1]
        .checked_sub(pads[1] + pads[3])
        .ok_or_else(|| err(n, "pads larger than the output"))?;
    let bias = match n.input.get(2).filter(|s| !s.is_empty()) {
        Some(bn) => {
            let bc = b
                .const_f32(bn)
                .ok_or_else(|| err(n, "bias must be a constant"))?;
            if bc.len() != cout {
                return Err(err(n, "bias length differs from output channels"));
            }
            bc.data
        }
        None => vec![0.0; cout],
    };
    if b.quant.is_some() {
        b.plan.float_nodes.push(crate::backend::FloatNode {
            node: n.name.clone(),
            op: n.op_type.clone(),
            reason: "ConvTranspose runs in float on the CUDA backend".into(),
        });
    }
    let mut fused = vec![];
    let (act, tname) = b.fuse_act(&n.output[0], &mut fused, true);
    let o = b.tensor(&tname, vec![nb, cout, oh, ow], Layout::Plain, b.float, 1.0);
    b.plan.steps.push(Step::ConvTranspose {
        name: std::iter::once(n.name.clone())
            .chain(fused)
            .collect::<Vec<_>>()
            .join("+"),
        input: x,
        out: o,
        w: w.data,
        bias,
        groups,
        k,
        stride: s,
        pads,
        dilation: d,
        act,
    });
    b.values.insert(tname, Value::Tensor(o));
    Ok(())
}
