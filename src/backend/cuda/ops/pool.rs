//! 2-D pooling over NHWC: MaxPool / AveragePool with pads, strides, dilations and ceil mode
//! (windows running past the padded input are clipped, as ONNX Runtime and PyTorch do), and
//! the global pools.

use super::{Builder, OpFamily, err};
use crate::backend::cuda::plan::{Layout, PlanResult, ReduceOp, Step};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "pooling",
    ops: &[
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
    ],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    match n.op_type.as_str() {
        "GlobalAveragePool" => {
            let (x, d) = b.nhwc_input(n, "pool")?;
            let o = b.tensor(
                &n.output[0],
                vec![d.shape[0], d.shape[1], 1, 1],
                Layout::Nhwc,
                b.float,
                1.0,
            );
            b.emit(
                n,
                o,
                Step::GlobalAvgPool {
                    name: n.name.clone(),
                    input: x,
                    out: o,
                },
            )
        }
        "GlobalMaxPool" => {
            let (x, _) = b.nhwc_input(n, "pool")?;
            let o = super::norm::reduce_tensor(
                b,
                x,
                &[2, 3],
                true,
                ReduceOp::Max,
                &n.output[0],
                &n.name,
            )?;
            b.values
                .insert(n.output[0].clone(), super::Value::Tensor(o));
            Ok(())
        }
        _ => pool(b, i),
    }
}

/// Output length of a pooling window sweep (ONNX / PyTorch rule: in ceil mode the last window
/// must start inside the input or its begin padding).
pub(super) fn pooled_len(
    len: usize,
    lo: usize,
    hi: usize,
    k: usize,
    d: usize,
    s: usize,
    ceil: bool,
) -> Option<usize> {
    let span = (len + lo + hi).checked_sub(d * (k - 1) + 1)?;
    let mut o = if ceil { span.div_ceil(s) } else { span / s } + 1;
    if ceil && (o - 1) * s >= len + lo {
        o -= 1;
    }
    Some(o)
}

fn pool(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    if n.output.len() > 1 && !n.output[1].is_empty() && !b.g.consumers(&n.output[1]).is_empty() {
        return Err(err(n, "MaxPool's indices output is not produced"));
    }
    let (x, d) = b.nhwc_input(n, "pool")?;
    let k = proto::attr_ints(n, "kernel_shape").ok_or_else(|| err(n, "no kernel_shape"))?;
    if k.len() != 2 || k.iter().any(|&v| v < 1) {
        return Err(err(n, "only 2-D pooling windows are implemented"));
    }
    let k = [k[0] as usize, k[1] as usize];
    let s = super::pair(n, "strides")?;
    let dil = super::pair(n, "dilations")?;
    let ceil = proto::attr_i(n, "ceil_mode").unwrap_or(0) != 0;
    let (h, w) = (d.shape[2], d.shape[3]);
    let pads = super::conv_pads(n, [h, w], k, s, dil)?;
    let (Some(oh), Some(ow)) = (
        pooled_len(h, pads[0], pads[2], k[0], dil[0], s[0], ceil),
        pooled_len(w, pads[1], pads[3], k[1], dil[1], s[1], ceil),
    ) else {
        return Err(err(n, "the window is larger than the padded input"));
    };
    let o = b.tensor(
        &n.output[0],
        vec![d.shape[0], d.shape[1], oh, ow],
        Layout::Nhwc,
        b.float,
        1.0,
    );
    // An average over the whole unpadded input (TensorFlow's DeepLab writes its image pooling
    // so) is a global average pool: the pool kernel would give each output's thread all
    // h * w pixels, and leave the GPU idle with a few hundred threads.
    if n.op_type == "AveragePool" && k == [h, w] && pads == [0; 4] && [oh, ow] == [1, 1] {
        let step = Step::GlobalAvgPool {
            name: n.name.clone(),
            input: x,
            out: o,
        };
        return b.emit(n, o, step);
    }
    b.emit(
        n,
        o,
        Step::Pool {
            name: n.name.clone(),
            input: x,
            out: o,
            max: n.op_type == "MaxPool",
            k,
            stride: s,
            dilation: dil,
            pads,
            count_include_pad: proto::attr_i(n, "count_include_pad").unwrap_or(0) == 1,
        },
    )
}
