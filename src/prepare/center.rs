//! Activation centering: a float-exact rewrite of the model the INT8 engines are built from,
//! applied before calibration (after cross-layer equalization), that lets a non-negative
//! activation use all of symmetric int8's 255 steps instead of the 128 of its positive half.
//!
//! A ReLU or Clip(0, hi) output t, written by a conv and read only by convs without padding
//! (1x1 projections: MobileNet's depthwise-to-projection tensors, ResNet bottlenecks' middle
//! ReLU), becomes t - c with c = half its largest value on the calibration images:
//! the producing conv's bias drops by c and the activation's bounds move by -c (Clip(-c, hi - c)),
//! and each reading conv's bias gains c * (sum of its weights over the input window), so
//! every reader's output is what it was. The symmetric per-tensor scale of t - c is half
//! that of t, so the rounding step halves (the int8 model is what unsigned activations
//! would give, while staying TensorRT's zero-point-free Q/DQ). Readers with zero padding are
//! left alone: their border outputs would read -c where they read 0. Nothing else changes
//! (names included), so exclusions and per-tensor methods keyed by tensor still apply.
//!
//! The float fold is exact for float weights; the INT8 engine multiplies the shift by the
//! int8-rounded weights instead, so the shifts travel with the model ([`SHIFTS_KEY`]) and the
//! steps that round weights (GPTQ, the Q/DQ build) fold c × (rounded - float weights) into the
//! bias as well ([`crate::quant::centered`]): the INT8 model then computes exactly what it would on the unshifted tensor
//! with twice the resolution, and the weights' rounding error meets t, not t - c.

use std::collections::HashMap;

use prost::Message;
use serde::{Deserialize, Serialize};
use tract_onnx::pb::{self, tensor_proto::DataType};

use super::cle::{clip_bounds, is_conv, private_f32};
use crate::model::{Graph, Model, ModelError, proto};
use crate::quant::centered::{SHIFTS_KEY, shifts};

/// The experiment's choice (`--center-activations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CenterSetting {
    #[default]
    On,
    Off,
}

impl CenterSetting {
    pub const ALL: [CenterSetting; 2] = [CenterSetting::On, CenterSetting::Off];

    pub fn name(self) -> &'static str {
        match self {
            CenterSetting::On => "on",
            CenterSetting::Off => "off",
        }
    }
}

impl std::fmt::Display for CenterSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CenterError {
    #[error("{path}: activation centering produced a model that does not load again: {source}")]
    Reload {
        path: String,
        #[source]
        source: Box<ModelError>,
    },
}

/// One centered tensor and its shift.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Centered {
    pub tensor: String,
    /// c: the tensor now holds t - c.
    pub shift: f32,
}

/// What centering did to one model (the report's `centering`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CenterSummary {
    pub setting: CenterSetting,
    pub centered: Vec<Centered>,
    /// Non-negative activations written by a conv that were left alone, as (tensor, why).
    pub skipped: Vec<(String, String)>,
}

impl CenterSummary {
    pub fn applied(&self) -> bool {
        !self.centered.is_empty()
    }

    /// One line for the report's notes and the CLI.
    pub fn note(&self) -> String {
        let left = match self.skipped.len() {
            0 => String::new(),
            n => format!(
                "; {n} left as they are (e.g. `{}`: {})",
                self.skipped[0].0, self.skipped[0].1
            ),
        };
        match (self.setting, self.centered.len()) {
            (CenterSetting::Off, _) => "activation centering off".into(),
            (_, 0) => format!("activation centering: no ReLU/Clip(0, hi) output to center{left}"),
            (_, n) => format!(
                "activation centering: {n} non-negative activations read by unpadded convs \
                 shifted by half their range, so int8 uses all its steps on them (exact in \
                 float; biases absorb the shift){left}; the FP32 rows use the original model"
            ),
        }
    }
}

/// A tensor that can be centered: the conv writing it, the activation node and the convs
/// reading it.
#[derive(Clone, Debug)]
struct Site {
    tensor: String,
    producer: usize,
    act: usize,
    readers: Vec<usize>,
    /// The activation's upper bound (infinite for ReLU).
    hi: f32,
}

/// Whether a conv reads its input without padding.
fn unpadded(n: &pb::NodeProto) -> bool {
    let pads = proto::attr_ints(n, "pads").unwrap_or_default();
    let auto = proto::attr_str(n, "auto_pad").unwrap_or_default();
    pads.iter().all(|&p| p == 0) && matches!(auto.as_str(), "" | "NOTSET" | "VALID")
}

/// A bias slot is empty or a private float constant (so shifting it changes that node only).
fn bias_ok(g: &Graph<'_>, n: &pb::NodeProto) -> Result<(), String> {
    match n.input.get(2).filter(|b| !b.is_empty()) {
        Some(b) => private_f32(g, b).map(|_| ()),
        None => Ok(()),
    }
}

/// Every ReLU / Clip(0, hi) written by a conv, as a site or as (tensor, why not).
fn find_sites(g: &Graph<'_>) -> (Vec<Site>, Vec<(String, String)>) {
    let (mut sites, mut skipped) = (vec![], vec![]);
    for (a, n) in g.proto.node.iter().enumerate() {
        let hi = match n.op_type.as_str() {
            "Relu" if n.domain.is_empty() => f32::INFINITY,
            "Clip" if n.domain.is_empty() => match clip_bounds(g, n) {
                Some((lo, hi)) if lo == 0.0 && hi > 0.0 => hi,
                _ => continue,
            },
            _ => continue,
        };
        let (Some(x), Some(t)) = (n.input.first(), n.output.first()) else {
            continue;
        };
        let Some(p) = g.producer(x).filter(|&p| is_conv(g.node(p))) else {
            continue;
        };
        let why = |w: &str| (t.clone(), w.to_string());
        if g.consumers(x).len() != 1 || g.is_graph_output(x) {
            skipped.push(why("the conv's output is also read before the activation"));
            continue;
        }
        if let Err(e) = bias_ok(g, g.node(p)) {
            skipped.push(why(&format!("the writing conv's bias: {e}")));
            continue;
        }
        let readers = g.consumers(t);
        if readers.is_empty() || g.is_graph_output(t) {
            skipped.push(why("it is a graph output"));
            continue;
        }
        let reader_problem = readers.iter().find_map(|&(r, slot)| {
            let c = g.node(r);
            if !is_conv(c) || slot != 0 {
                Some(format!("read by {} `{}`", c.op_type, c.name))
            } else if !unpadded(c) {
                Some(format!("read by `{}` with zero padding", c.name))
            } else if c
                .input
                .get(1)
                .and_then(|w| g.initializer(w))
                .is_none_or(|w| w.data_type != DataType::Float as i32)
            {
                Some(format!("`{}`'s weight is not a float constant", c.name))
            } else {
                bias_ok(g, c)
                    .err()
                    .map(|e| format!("`{}`'s bias: {e}", c.name))
            }
        });
        if let Some(w) = reader_problem {
            skipped.push(why(&w));
            continue;
        }
        let mut readers: Vec<usize> = readers.iter().map(|r| r.0).collect();
        readers.dedup();
        sites.push(Site {
            tensor: t.clone(),
            producer: p,
            act: a,
            readers,
            hi,
        });
    }
    (sites, skipped)
}

/// The tensors centering would shift: the caller measures their largest value over the
/// calibration images (this module runs nothing).
pub fn tensors(model: &Model) -> Vec<String> {
    let g = Graph::new(model.graph());
    find_sites(&g).0.into_iter().map(|s| s.tensor).collect()
}

/// Centers the model per `setting`, with `maxima` the calibration images' largest value of
/// each tensor of [`tensors`] (a tensor without one, or never positive, is left alone).
/// Returns the model the INT8 path uses (the same model when nothing was centered).
pub fn apply(
    model: &Model,
    setting: CenterSetting,
    maxima: &HashMap<String, f32>,
) -> Result<(Model, CenterSummary), CenterError> {
    let mut summary = CenterSummary {
        setting,
        ..Default::default()
    };
    if setting == CenterSetting::Off || model.info.prequantized {
        return Ok((model.clone(), summary));
    }
    let mut proto = model.proto.clone();
    let gp = proto.graph.as_mut().expect("a loaded model has a graph");
    let (sites, skipped) = find_sites(&Graph::new(gp));
    summary.skipped = skipped;
    let mut sites_shifts = vec![];
    for site in sites {
        let top = maxima
            .get(&site.tensor)
            .copied()
            .unwrap_or(0.0)
            .min(site.hi);
        if !(top > 0.0 && top.is_finite()) {
            summary.skipped.push((
                site.tensor,
                "never positive on the calibration images".into(),
            ));
            continue;
        }
        summary.centered.push(Centered {
            tensor: site.tensor.clone(),
            shift: top / 2.0,
        });
        sites_shifts.push((site, top / 2.0));
    }
    if sites_shifts.is_empty() {
        return Ok((model.clone(), summary));
    }
    for (site, c) in &sites_shifts {
        shift_graph(gp, site, *c, model.info.opset);
    }
    crate::model::drop_unused_initializers(gp);
    let mut all = shifts(&proto);
    all.extend(summary.centered.iter().map(|c| (c.tensor.clone(), c.shift)));
    proto.metadata_props.retain(|m| m.key != SHIFTS_KEY);
    proto.metadata_props.push(pb::StringStringEntryProto {
        key: SHIFTS_KEY.into(),
        value: serde_json::to_string(&all).expect("a map of floats serializes"),
    });
    let reloaded = Model::from_bytes(&model.path, &proto.encode_to_vec()).map_err(|e| {
        CenterError::Reload {
            path: model.path.display().to_string(),
            source: Box::new(e),
        }
    })?;
    Ok((reloaded, summary))
}

/// Output channels of conv `node` (its weight's first dim) and, per channel, the sum of its
/// weights over the input window.
fn channel_sums(gp: &pb::GraphProto, node: usize) -> Vec<f32> {
    let w_name = &gp.node[node].input[1];
    gp.initializer
        .iter()
        .find(|t| &t.name == w_name)
        .and_then(proto::tensor_f32)
        .map_or(vec![], |w| {
            let channels = w.dims.first().copied().unwrap_or(1).max(1);
            let per = (w.data.len() / channels).max(1);
            w.data.chunks(per).map(|k| k.iter().sum()).collect()
        })
}

/// `quant::add_to_bias` on node `node` of `gp` (nothing for a conv without float weights).
fn shift_bias(gp: &mut pb::GraphProto, node: usize, shift: &[f32]) {
    if shift.is_empty() {
        return;
    }
    let mut n = std::mem::take(&mut gp.node[node]);
    crate::quant::add_to_bias(gp, &mut n, shift, "centered_bias");
    gp.node[node] = n;
}

/// The rewrite of one site: t - c written by the conv and the activation, + c folded into
/// each reader's bias.
fn shift_graph(gp: &mut pb::GraphProto, site: &Site, c: f32, opset: i64) {
    let down = vec![-c; channel_sums(gp, site.producer).len()];
    shift_bias(gp, site.producer, &down);
    for &r in &site.readers {
        let up: Vec<f32> = channel_sums(gp, r).iter().map(|s| c * s).collect();
        shift_bias(gp, r, &up);
    }
    // The activation becomes Clip(x, -c, hi - c), in the form the model's opset reads.
    let n = &gp.node[site.act];
    let (x, y, name) = (n.input[0].clone(), n.output[0].clone(), n.name.clone());
    let (lo, hi) = (-c, site.hi - c);
    let clip = if opset >= 11 {
        let lo_name = format!("{name}_centered_min");
        gp.initializer.push(proto::f32_tensor(&lo_name, &[], &[lo]));
        let mut inputs = vec![x, lo_name];
        if hi.is_finite() {
            let hi_name = format!("{name}_centered_max");
            gp.initializer.push(proto::f32_tensor(&hi_name, &[], &[hi]));
            inputs.push(hi_name);
        }
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        proto::node("Clip", &name, &inputs, &[&y], vec![])
    } else {
        let mut attrs = vec![proto::float_attr("min", lo)];
        if hi.is_finite() {
            attrs.push(proto::float_attr("max", hi));
        }
        proto::node("Clip", &name, &[&x], &[&y], attrs)
    };
    gp.node[site.act] = clip;
}

#[cfg(test)]
mod tests;
