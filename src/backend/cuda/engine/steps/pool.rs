//! Pooling steps: `Pool` (max or average windows over NHWC, raw 16-byte max where types
//! allow) and `GlobalAvgPool` (split over the pixels where blocks would be few, the partial
//! sums in the raw scratch).

use cudarc::driver::LaunchConfig;

use super::super::device::Launch;
use super::super::kernels::launch;
use super::{Check, not_a};
use crate::backend::cuda::error::CudaResult;
use crate::backend::cuda::plan::{DType, Layout, Step};

/// Blocks a global average pool aims for (four per SM on a 132-SM H100 or H200).
const GAP_BLOCKS: usize = 512;
/// The fewest pixels a lane of a global average pool sums where it has fewer than 32 lanes.
const GAP_LANE_PIXELS: usize = 6;
/// The least input a split of a global average pool's block reads.
const GAP_SPLIT_BYTES: usize = 64 << 10;

pub(super) fn pool(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::Pool {
        input,
        out,
        max,
        k: kk,
        stride,
        dilation,
        pads,
        count_include_pad,
        ..
    } = s
    else {
        return Err(not_a("Pool", s));
    };
    c.rank4(*input, Some(Layout::Nhwc))?;
    c.rank4(*out, Some(Layout::Nhwc))?;
    c.positive("kernel", kk)?;
    c.positive("strides", stride)?;
    c.positive("dilations", dilation)?;
    c.same_nc(*input, *out)?;
    let Some(cx) = go else { return Ok(()) };
    let (k, st) = (&cx.dev.k, cx.stream);
    let (i, o) = (cx.td(*input), cx.td(*out));
    let u = |v: usize| v as i32;
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    // Max of raw 16-byte vectors where the output takes the input's type (and scale, but for
    // int8's requantizing), else four channels per thread where the channels allow (vector
    // accesses), else one.
    let bytes = i.dtype.bytes();
    let raw_max = *max
        && i.dtype == o.dtype
        && (i.scale == o.scale || i.dtype == DType::I8)
        && i.dtype != DType::F8
        && (i.shape[1] * bytes).is_multiple_of(16)
        && i.numel().max(o.numel()) * bytes / 16 < i32::MAX as usize;
    if raw_max {
        let cv = i.shape[1] * bytes / 16;
        return launch!(st, k.max_pool16, o.numel() * bytes / 16; ip, it, is, op, os,
            u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(cv), u(o.shape[2]), u(o.shape[3]),
            u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]),
            u(dilation[0]), u(dilation[1]));
    }
    let (f, n) = if i.shape[1] % 4 == 0 {
        (&k.pool4, o.numel() / 4)
    } else {
        (&k.pool, o.numel())
    };
    launch!(st, f, n; ip, it, is, op, ot, os,
        u(i.shape[0]), u(i.shape[2]), u(i.shape[3]), u(i.shape[1]), u(o.shape[2]), u(o.shape[3]),
        u(kk[0]), u(kk[1]), u(stride[0]), u(stride[1]), u(pads[0]), u(pads[1]), u(pads[2]), u(pads[3]),
        u(dilation[0]), u(dilation[1]), if *max { 0i32 } else { 1i32 }, *count_include_pad as i32)
}

pub(super) fn global_avg_pool(c: &Check, s: &Step, go: Option<&Launch>) -> CudaResult<()> {
    let Step::GlobalAvgPool { input, out, .. } = s else {
        return Err(not_a("GlobalAvgPool", s));
    };
    c.rank4(*input, None)?;
    let i = &c.plan.tensors[*input];
    c.is("the output", c.numel(*out), i.shape[0] * i.shape[1])?;
    let Some(cx) = go else { return Ok(()) };
    let k = &cx.dev.k;
    let (n, ch, hw) = i.nchw();
    let splits = gap_splits(n, ch, hw, i.dtype.bytes());
    let cfg = LaunchConfig {
        grid_dim: (ch.div_ceil(32) as u32, n as u32, splits as u32),
        block_dim: (32 * gap_lanes(hw.div_ceil(splits)) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let ((ip, it, is), (op, ot, os)) = (cx.tensor(*input), cx.tensor(*out));
    // Split sums go to the raw scratch, which the engine sized for them (`gap_splits`).
    launch!(cx.stream, k.gap, cfg cfg; ip, it, is, op, ot, os,
        n as i32, hw as i64, ch as i32, splits as i32, cx.raw_ptr())?;
    if splits > 1 {
        launch!(cx.stream, k.gap_finish, n * ch; cx.raw_ptr(), splits as i32, op, ot, os,
            n as i32, hw as i64, ch as i32)?;
    }
    Ok(())
}

/// Pixel lanes of a global average pool's block over `pixels` pixels: GAP_LANE_PIXELS a lane
/// or more, 32 lanes at most (the kernel's shared memory).
fn gap_lanes(pixels: usize) -> usize {
    (pixels / GAP_LANE_PIXELS).clamp(1, 32)
}

/// Blocks along the pixels of a global average pool of `n` images of `c` channels of
/// `esize` bytes and `hw` pixels: enough for about GAP_BLOCKS blocks in all (a block per
/// image and 32 channels left most SMs idle on EfficientNet-B0's batch-32 pools), but none
/// reading less than GAP_SPLIT_BYTES (on the ../shared DeepLab's 35 KB blocks, splitting
/// only added the second kernel's launch).
pub(in super::super) fn gap_splits(n: usize, c: usize, hw: usize, esize: usize) -> usize {
    let blocks = n * c.div_ceil(32);
    let block_bytes = hw * c.min(32) * esize;
    GAP_BLOCKS
        .div_ceil(blocks.max(1))
        .min(block_bytes / GAP_SPLIT_BYTES)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_average_pools_split_their_pixels_where_blocks_are_few() {
        // EfficientNet-B0's first squeeze-excite pool at batch 32 (FP16): 32 blocks of 784 KB.
        assert_eq!(gap_splits(32, 32, 112 * 112, 2), 12);
        // ... in int8: half the bytes, half the splits.
        assert_eq!(gap_splits(32, 32, 112 * 112, 1), 6);
        // ResNet-50's final pool at batch 32: 2,048 blocks already.
        assert_eq!(gap_splits(32, 2048, 49, 2), 1);
        // The ../shared DeepLab's ASPP pool at batch 8 in int8: 80 blocks of 35 KB.
        assert_eq!(gap_splits(8, 320, 33 * 33, 1), 1);
        // DeepLabV3-ResNet50's at batch 1: 64 blocks of 270 KB.
        assert_eq!(gap_splits(1, 2048, 65 * 65, 2), 4);
        // Lanes: 8 over ResNet-50's 49 pixels, all 32 over 12,544 / 12, one over 1 pixel.
        assert_eq!(gap_lanes(49), 8);
        assert_eq!(gap_lanes(112 * 112 / 12), 32);
        assert_eq!(gap_lanes(1), 1);
    }
}
