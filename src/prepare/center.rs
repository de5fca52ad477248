//! Activation centering: a float-exact rewrite of the model the INT8 engines are built from,
//! applied before calibration (after cross-layer equalization), that lets a non-negative
//! activation use all of symmetric int8's 255 steps instead of the 128 of its positive half.
//!
//! A ReLU or Clip(0, hi) output t, written by a conv and read only by convs without padding
//! (1x1 projections: MobileNet's depthwise-to-projection tensors, ResNet bottlenecks' middle
//! ReLU) or by depthwise convs (MobileNet's expansions), becomes t - c with c = half its
//! largest value on the calibration images: the producing conv's bias drops by c and the
//! activation's bounds move by -c (Clip(-c, hi - c)), and each reading conv's bias gains
//! c * (sum of its weights over the input window), so every reader's output is what it was.
//! A reader with zero padding would read 0 at the border where t - c reads -c there, so its
//! padding moves into a Pad node before it that pads with -c (the conv then pads nothing):
//! padded t - c is padded t shifted by c everywhere, border included. The Pad's output is what
//! the reader quantizes, with the same shift. Both engines fold the Pad back into the conv
//! (ONNX Runtime's INT8 form, `cpu_form::pads_into_convs`; the CUDA engine's int8 depthwise
//! kernels, `fold_pads_into_depthwise`). A dense conv with padding leaves its tensor alone: the
//! CUDA engine would run its Pad as a pass of its own. The symmetric per-tensor scale of t - c
//! is half that of t, so the rounding step halves (the int8 model is what unsigned
//! activations would give, while staying TensorRT's zero-point-free Q/DQ). Nothing else
//! changes (names included), so exclusions and per-tensor methods keyed by tensor still apply.
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
    /// The convs whose zero padding moved into a Pad node with value -c.
    pub padded: Vec<String>,
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
            (_, n) => {
                let padded = match self.padded.len() {
                    0 => String::new(),
                    p => format!(
                        " ({p} depthwise readers with zero padding read it through a Pad of -c, \
                         which the engines fold back into the conv)"
                    ),
                };
                format!(
                    "activation centering: {n} non-negative activations read by convs shifted \
                     by half their range, so int8 uses all its steps on them (exact in float; \
                     biases absorb the shift){padded}{left}; the FP32 rows use the original \
                     model"
                )
            }
        }
    }
}

/// A tensor that can be centered: the conv writing it, the activation node and the convs
/// reading it (each with its explicit pads, empty when it pads nothing).
#[derive(Clone, Debug)]
struct Site {
    tensor: String,
    producer: usize,
    act: usize,
    readers: Vec<(usize, Vec<i64>)>,
    /// The activation's upper bound (infinite for ReLU).
    hi: f32,
}

/// A conv's explicit pads (empty when it pads nothing), or `None` where `auto_pad` computes
/// them from the input size.
fn explicit_pads(n: &pb::NodeProto) -> Option<Vec<i64>> {
    let pads = proto::attr_ints(n, "pads").unwrap_or_default();
    match proto::attr_str(n, "auto_pad").unwrap_or_default().as_str() {
        "VALID" => Some(vec![]),
        "" | "NOTSET" if pads.iter().all(|&p| p == 0) => Some(vec![]),
        "" | "NOTSET" if pads.iter().all(|&p| p >= 0) => Some(pads),
        _ => None,
    }
}

/// A bias slot is empty or a private float constant (so shifting it changes that node only).
fn bias_ok(g: &Graph<'_>, n: &pb::NodeProto) -> Result<(), String> {
    match n.input.get(2).filter(|b| !b.is_empty()) {
        Some(b) => private_f32(g, b).map(|_| ()),
        None => Ok(()),
    }
}

/// Whether conv `n` is depthwise: as many groups as output channels, one input channel each.
fn depthwise(g: &Graph<'_>, n: &pb::NodeProto) -> bool {
    let groups = proto::attr_i(n, "group").unwrap_or(1);
    let dims = n
        .input
        .get(1)
        .and_then(|w| g.initializer(w))
        .map(|w| w.dims.clone())
        .unwrap_or_default();
    groups > 1 && dims.len() == 4 && dims[0] == groups && dims[1] == 1
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
            let pads = explicit_pads(c);
            if !is_conv(c) || slot != 0 {
                Some(format!("read by {} `{}`", c.op_type, c.name))
            } else if pads.is_none() {
                Some(format!("read by `{}` with automatic padding", c.name))
            } else if pads.is_some_and(|p| !p.is_empty()) && !depthwise(g, c) {
                Some(format!(
                    "read by `{}`, a dense conv with zero padding (the CUDA engine folds a \
                     centering Pad only into its int8 depthwise kernels; before a dense conv \
                     it would be a pass of its own)",
                    c.name
                ))
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
        let mut readers: Vec<(usize, Vec<i64>)> = readers
            .iter()
            .map(|r| (r.0, explicit_pads(g.node(r.0)).unwrap_or_default()))
            .collect();
        readers.dedup_by_key(|r| r.0);
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
    // Pad nodes by the index of the conv they go before (inserted once every site is
    // rewritten, so the sites' node indices hold until then).
    let mut pads: HashMap<usize, pb::NodeProto> = HashMap::new();
    let mut padded_shifts = vec![];
    for (site, c) in &sites_shifts {
        for (reader, pad) in shift_graph(gp, site, *c, model.info.opset) {
            summary.padded.push(gp.node[reader].name.clone());
            padded_shifts.push((pad.output[0].clone(), *c));
            pads.insert(reader, pad);
        }
    }
    if !pads.is_empty() {
        let nodes = std::mem::take(&mut gp.node);
        for (i, n) in nodes.into_iter().enumerate() {
            gp.node.extend(pads.remove(&i));
            gp.node.push(n);
        }
    }
    crate::model::drop_unused_initializers(gp);
    let mut all = shifts(&proto);
    all.extend(summary.centered.iter().map(|c| (c.tensor.clone(), c.shift)));
    all.extend(padded_shifts);
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
/// each reader's bias, and for each reader with padding, the Pad node (value -c) that goes
/// before it, the reader now reading the Pad's output and padding nothing itself.
fn shift_graph(
    gp: &mut pb::GraphProto,
    site: &Site,
    c: f32,
    opset: i64,
) -> Vec<(usize, pb::NodeProto)> {
    let down = vec![-c; channel_sums(gp, site.producer).len()];
    shift_bias(gp, site.producer, &down);
    let mut pad_nodes = vec![];
    for (r, pads) in &site.readers {
        let up: Vec<f32> = channel_sums(gp, *r).iter().map(|s| c * s).collect();
        shift_bias(gp, *r, &up);
        if pads.iter().any(|&p| p != 0) {
            pad_nodes.push((*r, pad_before(gp, *r, &site.tensor, pads, -c, opset)));
        }
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
    pad_nodes
}

/// The Pad node that pads `tensor` (NCHW...) by conv `reader`'s `pads` (begins, then ends, for
/// the spatial axes) with `value`, in the form the model's opset reads; the reader now reads
/// its output and pads nothing.
fn pad_before(
    gp: &mut pb::GraphProto,
    reader: usize,
    tensor: &str,
    pads: &[i64],
    value: f32,
    opset: i64,
) -> pb::NodeProto {
    let name = format!("{}_centered_pad", gp.node[reader].name);
    let out = format!("{tensor}_padded_for_{}", gp.node[reader].name);
    // Batch and channels unpadded: [0, 0, begins..., 0, 0, ends...].
    let half = pads.len() / 2;
    let all: Vec<i64> = [&[0, 0], &pads[..half], &[0, 0], &pads[half..]].concat();
    let pad = if opset >= 11 {
        let (p, v) = (format!("{name}_pads"), format!("{name}_value"));
        gp.initializer
            .push(proto::i64_tensor(&p, &[all.len()], &all));
        gp.initializer.push(proto::f32_tensor(&v, &[], &[value]));
        proto::node("Pad", &name, &[tensor, &p, &v], &[&out], vec![])
    } else {
        let attrs = vec![
            proto::ints_attr("pads", &all),
            proto::float_attr("value", value),
        ];
        proto::node("Pad", &name, &[tensor], &[&out], attrs)
    };
    let conv = &mut gp.node[reader];
    conv.input[0] = out;
    conv.attribute.retain(|a| a.name != "pads");
    pad
}

#[cfg(test)]
mod tests;
