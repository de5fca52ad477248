//! What the Q/DQ build reads of a model that activation centering (`prepare::center`)
//! rewrote: the shifts the model carries, and the bias change that keeps a shift exact once
//! the weights reading the shifted tensor are rounded (here, in GPTQ, and in the per-layer
//! twins of `layerwise`).

use std::collections::BTreeMap;

use tract_onnx::pb;

use crate::model::proto;

/// The model's `metadata_props` key holding the shifts (JSON, tensor -> c), written by
/// `prepare::center::apply` and read by [`shifts`].
pub const SHIFTS_KEY: &str = "quantscope.centered_shifts";

/// The shifts `prepare::center::apply` made in this model, by tensor (empty for any other
/// model).
pub fn shifts(p: &pb::ModelProto) -> BTreeMap<String, f32> {
    p.metadata_props
        .iter()
        .find(|m| m.key == SHIFTS_KEY)
        .and_then(|m| serde_json::from_str(&m.value).ok())
        .unwrap_or_default()
}

/// [`rounding_fold`] for int8 weights `q` with per-channel `scales` along `axis`; `None` when
/// the scales do not match the weight's channels.
pub fn int8_fold(
    c: f32,
    w: &proto::F32Tensor,
    q: &[i8],
    scales: &[f32],
    axis: usize,
) -> Option<Vec<f32>> {
    let values: Vec<f32> = q.iter().map(|&v| v as f32).collect();
    let rounded = super::dequantize_per_axis(&values, &w.dims, axis, scales)?;
    let channels = w.dims.first().copied().unwrap_or(1);
    Some(rounding_fold(c, &rounded, &w.data, channels))
}

/// Per output channel of a Conv weight `[Cout, ...]` read on a tensor shifted by `c`, the bias
/// change that makes the shift exact for `rounded` weights when the bias folded it for
/// `float` ones: c × Σ(rounded - float) over the channel's window.
pub fn rounding_fold(c: f32, rounded: &[f32], float: &[f32], channels: usize) -> Vec<f32> {
    let per = (float.len() / channels.max(1)).max(1);
    rounded
        .chunks(per)
        .zip(float.chunks(per))
        .map(|(r, f)| c * r.iter().zip(f).map(|(a, b)| a - b).sum::<f32>())
        .collect()
}
