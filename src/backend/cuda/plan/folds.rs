//! The rewrites of a lowered plan, in the order `ops` runs them: steps nothing reads dropped,
//! casts and quantizes folded into the step before them, constant pads into the int8
//! depthwise convs after them, and global average pools into the int8 convs before them.

use std::collections::HashSet;

use super::{Act, DType, Layout, PadMode, Plan, Step};

/// Drops steps whose output nothing reads (the plan's output and taps aside), last first so a
/// chain of them goes: copies a reader that converts as it reads made redundant (the stem's
/// input layout copy). A tensor read through an alias counts as read.
pub fn prune_dead(plan: &mut Plan) {
    let root = |t: usize| plan.root(t);
    let mut readers = plan.step_reads();
    // The host reads these.
    for t in plan.host_read() {
        readers[root(t)] += 1;
    }
    let mut keep = vec![true; plan.steps.len()];
    for si in (0..plan.steps.len()).rev() {
        let out = root(plan.steps[si].output());
        if readers[out] == 0 {
            keep[si] = false;
            for t in plan.steps[si].inputs() {
                readers[root(t)] -= 1;
            }
        }
    }
    let mut k = keep.into_iter();
    plan.steps.retain(|_| k.next().unwrap_or(true));
}

/// Folds each cast or quantize (a `Unary` without activation: f16 -> f32, float -> int8) into
/// the step that produces its input, where that step's kernel stores through the generic
/// typed store (any type, any scale) and nothing else reads the input: the producer writes
/// the cast's output, one pass over the tensor instead of two. (The quantize after a concat,
/// a pool or an input transpose, the output's f16 -> f32 cast after its transpose or after an
/// int8 conv, whose epilogue stores any type.) Where the cast reads a view of the producer's
/// output (a Flatten or Reshape of plain data: the same elements in the same order), the
/// producer keeps its output, now in the cast's type, and the cast's output becomes a view of
/// it: a classifier's pool writes its int8 codes through the Flatten to the fc.
pub fn fold_casts(plan: &mut Plan) {
    let nt = plan.tensors.len();
    // Reads of each tensor, counting those through its views.
    let readers = plan.step_reads();
    let aliased: HashSet<usize> = plan.tensors.iter().filter_map(|t| t.alias_of).collect();
    let mut producer = vec![None::<usize>; nt];
    let mut folded = vec![];
    for si in 0..plan.steps.len() {
        if let Step::Unary {
            input,
            out,
            act: Act::None,
            name,
        } = &plan.steps[si]
        {
            let (i, o) = (*input, *out);
            let r = plan.root(i);
            let viewed = r != i;
            let (ti, to) = (&plan.tensors[i], &plan.tensors[o]);
            let host_read = |t: usize| plan.host_read().any(|h| h == t);
            let movable = readers[r] == 1
                && r != plan.input
                && !host_read(r)
                && to.alias_of.is_none()
                && !aliased.contains(&o)
                && if viewed {
                    ti.numel() == to.numel() && !host_read(o)
                } else {
                    !aliased.contains(&i) && ti.shape == to.shape && ti.layout == to.layout
                };
            let p = producer[r].filter(|&p| match &plan.steps[p] {
                Step::Conv(c) => c.quant.as_ref().is_some_and(|q| q.is_int8()),
                s => matches!(
                    s,
                    Step::Unary { .. }
                        | Step::View { .. }
                        | Step::Nary { .. }
                        | Step::Pool { .. }
                        | Step::GlobalAvgPool { .. }
                        | Step::Concat { .. }
                        | Step::Resize { .. }
                        | Step::Pad { .. }
                ),
            });
            if let (true, Some(p)) = (movable, p) {
                let name = name.clone();
                if viewed {
                    let (dtype, scale) = (to.dtype, to.scale);
                    for t in [r, i] {
                        plan.tensors[t].dtype = dtype;
                        plan.tensors[t].scale = scale;
                    }
                    plan.tensors[o].alias_of = Some(r);
                    plan.steps[p].retarget(r, &name);
                } else {
                    plan.steps[p].retarget(o, &name);
                    producer[o] = Some(p);
                }
                folded.push(si);
                continue;
            }
        }
        producer[plan.steps[si].output()] = Some(si);
    }
    for si in folded.into_iter().rev() {
        plan.steps.remove(si);
    }
}

/// Folds each constant Pad of int8 codes whose only reader is an int8 depthwise conv that pads
/// nothing into that conv: the conv pads by the Pad's amounts and reads the pad value's code
/// there (`ConvStep::pad_code`; both int8 depthwise kernels read it, any kernel size, stride
/// and dilation). Activation centering (`prepare::center`) puts such a Pad (value -c) before
/// MobileNets' depthwise convs and DeepLab's dilated ones. As a pass of its own it made
/// MobileNetV2's INT8 engine 1.94x slower than its FP16 one at batch 32 on an H200, and
/// DeepLab's 0.30 instead of 0.26 ms at batch 1. Runs after `fold_casts`, which made the Pad
/// write the codes its quantize wrote.
pub fn fold_pads_into_depthwise(plan: &mut Plan) {
    let readers = plan.step_reads();
    let host: HashSet<usize> = plan.host_read().collect();
    let producer: std::collections::HashMap<usize, usize> = plan
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.output(), i))
        .collect();
    let mut folded = vec![];
    for ci in 0..plan.steps.len() {
        let Step::Conv(c) = &plan.steps[ci] else {
            continue;
        };
        let Some(&pi) = producer.get(&c.input) else {
            continue;
        };
        let Step::Pad {
            input,
            out,
            begin,
            mode: PadMode::Constant,
            value,
            ..
        } = &plan.steps[pi]
        else {
            continue;
        };
        let (xi, xo) = (&plan.tensors[*input], &plan.tensors[*out]);
        let codes = xi.dtype == DType::I8
            && xo.dtype == DType::I8
            && xi.scale == xo.scale
            && xi.scale > 0.0
            && xi.layout == Layout::Nhwc
            && xo.layout == Layout::Nhwc
            && xo.alias_of.is_none()
            && xi.shape.len() == 4
            && xo.shape.len() == 4
            && readers[*out] == 1
            && !host.contains(out);
        // Stored NHWC: nothing on batch and channels.
        let spatial =
            begin.len() == 4 && begin[0] == 0 && begin[3] == 0 && begin[1] >= 0 && begin[2] >= 0;
        let depthwise = c.quant.as_ref().is_some_and(|q| q.is_int8())
            && c.groups == c.cin
            && c.cout == c.cin
            && c.cin.is_multiple_of(4)
            && c.pads == [0; 4];
        if !(codes && spatial && depthwise && xo.shape[..2] == xi.shape[..2]) {
            continue;
        }
        let (top, left) = (begin[1] as usize, begin[2] as usize);
        let end = |k: usize, b: usize| xo.shape[k].checked_sub(xi.shape[k])?.checked_sub(b);
        let (Some(bottom), Some(right)) = (end(2, top), end(3, left)) else {
            continue;
        };
        let code = (value / xo.scale).round_ties_even().clamp(-128.0, 127.0) as i8;
        let (x, pad_name) = (*input, plan.steps[pi].name().to_string());
        if let Step::Conv(c) = &mut plan.steps[ci] {
            c.input = x;
            c.pads = [top, left, bottom, right];
            c.pad_code = code;
            c.fused.push(pad_name);
        }
        folded.push(pi);
    }
    folded.sort_unstable();
    for pi in folded.into_iter().rev() {
        plan.steps.remove(pi);
    }
}

/// Fuses each global average pool whose input only it reads, and an int8 conv writes, into
/// that conv (`ConvStep::pool_hw`): the conv's epilogue averages each image's rows into the
/// pool's output (kernels/conv_i8_mma.cu, `GapFuse`), so the conv's output never goes through
/// memory. ResNet-50's last conv at batch 32 wrote 6.4 MB of FP16 for the pool to read back:
/// 18.6 + 7.3 us on an H200, 14.6 fused (7.7 + 3.5 and 3.4 at batch 1). For GPUs where the
/// int8 tensor-core kernels run (`Target::int8_mma`; they alone fuse the pool), and convs they
/// take: one group, an int8 NHWC input, input channels in 16-byte pieces, output channels in
/// fours, 32-bit row indices, each image's row tiles (of 64 pixels or more) within the grid's
/// y limit. Runs after `fold_casts`, which made the pool write what its quantize wrote (a
/// classifier's int8 codes for the fc).
pub fn fuse_global_pools_into_convs(plan: &mut Plan) {
    // The fused kernels' tiles hold one image each (64 or 128 pixels): an image of fewer
    // pixels than a quarter of the smaller leaves most of their rows unused.
    const GAP_MIN_PIXELS: usize = 16;
    let root = |t: usize| plan.root(t);
    let readers = plan.step_reads();
    let host: HashSet<usize> = plan.host_read().map(root).collect();
    let aliased: HashSet<usize> = plan.tensors.iter().filter_map(|t| t.alias_of).collect();
    let mut folded = vec![];
    for pi in 1..plan.steps.len() {
        let Step::GlobalAvgPool { input, out, .. } = &plan.steps[pi] else {
            continue;
        };
        let (x, o) = (*input, *out);
        let Some(ci) = (0..pi).rev().find(|&s| plan.steps[s].output() == x) else {
            continue;
        };
        let Step::Conv(c) = &plan.steps[ci] else {
            continue;
        };
        let (xd, id) = (&plan.tensors[x], &plan.tensors[c.input]);
        let [n, _, oh, ow] = xd.shape[..] else {
            continue;
        };
        let alone = readers[x] == 1
            && !host.contains(&x)
            && !aliased.contains(&x)
            && xd.alias_of.is_none()
            && x != plan.input;
        let kernels = c.quant.as_ref().is_some_and(|q| q.is_int8())
            && c.groups == 1
            && c.pad_code == 0
            && id.dtype == DType::I8
            && id.layout == Layout::Nhwc
            && id.shape.len() == 4
            && xd.layout == Layout::Nhwc
            && c.cin.is_multiple_of(16)
            && c.cout.is_multiple_of(4)
            && id.numel() < i32::MAX as usize
            && n * oh * ow < i32::MAX as usize
            && n * (oh * ow).div_ceil(64) <= u16::MAX as usize;
        if !(alone && kernels && oh * ow >= GAP_MIN_PIXELS) {
            continue;
        }
        let pool = plan.steps[pi].name().to_string();
        if let Step::Conv(c) = &mut plan.steps[ci] {
            c.pool_hw = Some([oh, ow]);
            c.fused.push(pool.clone());
        }
        plan.steps[ci].retarget(o, &pool);
        folded.push(pi);
    }
    for pi in folded.into_iter().rev() {
        plan.steps.remove(pi);
    }
}
