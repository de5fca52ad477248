//! Resize / Upsample of the spatial dims over NHWC: nearest (every rounding mode), linear and
//! cubic (coefficient and exclude_outside), every coordinate transformation but
//! tf_crop_and_resize; scales or sizes must be build-time constants.

use super::{Builder, OpFamily, err};
use crate::backend::cuda::plan::{PlanResult, Step};
use crate::model::proto;

pub const FAMILY: OpFamily = OpFamily {
    name: "resize",
    ops: &["Resize", "Upsample"],
    lower,
};

fn lower(b: &mut Builder<'_>, i: usize) -> PlanResult<()> {
    let n = b.g.node(i);
    if proto::attr_i(n, "antialias").unwrap_or(0) != 0 {
        return Err(err(n, "antialiased resize is not supported"));
    }
    if proto::attr_str(n, "keep_aspect_ratio_policy").is_some_and(|p| p != "stretch") {
        return Err(err(
            n,
            "keep_aspect_ratio_policy other than stretch is not supported",
        ));
    }
    let (x, d) = b.nhwc_input(n, "resize")?;
    let nonempty = |k: usize| n.input.get(k).filter(|s| !s.is_empty());
    // Upsample and opset-10 Resize: X, scales.
    let (scales_in, sizes_in) = if n.op_type == "Upsample" || n.input.len() == 2 {
        (nonempty(1), None)
    } else {
        (nonempty(2), nonempty(3))
    };
    // Opset 18: `axes` names which dims scales / sizes give.
    let axes: Vec<usize> = match proto::attr_ints(n, "axes") {
        Some(a) => a
            .iter()
            .map(|&v| super::axis(n, v, 4))
            .collect::<PlanResult<_>>()?,
        None => (0..4).collect(),
    };
    let full = |given: &[f32], fill: f32| -> PlanResult<[f32; 4]> {
        if given.len() != axes.len() {
            return Err(err(n, "scales / sizes do not match the axes"));
        }
        let mut v = [fill; 4];
        for (k, &a) in axes.iter().enumerate() {
            v[a] = given[k];
        }
        Ok(v)
    };
    let scales = scales_in
        .map(|s| {
            b.const_f32(s)
                .ok_or_else(|| err(n, "scales must be a constant"))
        })
        .transpose()?
        .filter(|t| !t.is_empty());
    let sizes = sizes_in
        .map(|s| {
            b.ints_const(s)
                .ok_or_else(|| err(n, "sizes must be a constant"))
        })
        .transpose()?;
    let (oh, ow, sh, sw) = if let Some(sz) = sizes {
        let dims: Vec<f32> = d.shape.iter().map(|&v| v as f32).collect();
        let base = [dims[0], dims[1], dims[2], dims[3]];
        let given: Vec<f32> = sz.iter().map(|&v| v as f32).collect();
        let mut want = full(&given, 0.0)?;
        for k in 0..4 {
            if !axes.contains(&k) {
                want[k] = base[k];
            }
        }
        // N may be the export's batch (often 1): only C must match.
        if want[1] as usize != d.shape[1] {
            return Err(err(n, "resizing C is not supported"));
        }
        let (oh, ow) = (want[2] as usize, want[3] as usize);
        (
            oh,
            ow,
            oh as f32 / d.shape[2] as f32,
            ow as f32 / d.shape[3] as f32,
        )
    } else if let Some(s) = scales {
        let s = full(&s.data, 1.0)?;
        if s[0] != 1.0 || s[1] != 1.0 {
            return Err(err(n, "resizing N or C is not supported"));
        }
        (
            (d.shape[2] as f32 * s[2]).floor() as usize,
            (d.shape[3] as f32 * s[3]).floor() as usize,
            s[2],
            s[3],
        )
    } else {
        return Err(err(n, "scales or sizes must be given"));
    };
    if oh == 0 || ow == 0 {
        return Err(err(n, "the output would be empty"));
    }
    let mode = match proto::attr_str(n, "mode")
        .unwrap_or("nearest".into())
        .as_str()
    {
        "nearest" => 0,
        "linear" | "bilinear" => 1,
        "cubic" | "bicubic" => 2,
        m => return Err(err(n, format!("mode `{m}` is not supported"))),
    };
    let default_coord = if n.op_type == "Upsample" || b.opset < 11 {
        "asymmetric"
    } else {
        "half_pixel"
    };
    let coord = match proto::attr_str(n, "coordinate_transformation_mode")
        .unwrap_or(default_coord.into())
        .as_str()
    {
        "half_pixel" => 0,
        "asymmetric" => 1,
        "align_corners" => 2,
        "pytorch_half_pixel" => 3,
        m => {
            return Err(err(
                n,
                format!("coordinate_transformation_mode `{m}` is not supported"),
            ));
        }
    };
    let nearest = match proto::attr_str(n, "nearest_mode")
        .unwrap_or("round_prefer_floor".into())
        .as_str()
    {
        "round_prefer_floor" => 0,
        "round_prefer_ceil" => 1,
        "floor" => 2,
        "ceil" => 3,
        m => return Err(err(n, format!("nearest_mode `{m}` is not supported"))),
    };
    let o = b.tensor(
        &n.output[0],
        vec![d.shape[0], d.shape[1], oh, ow],
        crate::backend::cuda::plan::Layout::Nhwc,
        b.float,
        1.0,
    );
    b.emit(
        n,
        o,
        Step::Resize {
            name: n.name.clone(),
            input: x,
            out: o,
            mode,
            coord,
            nearest,
            scale_hw: [sh, sw],
            cubic_a: proto::attr_f(n, "cubic_coeff_a").unwrap_or(-0.75),
            exclude_outside: proto::attr_i(n, "exclude_outside").unwrap_or(0) == 1,
        },
    )
}
