//! tract's per-node times under the model's own ONNX node names. tract keeps an ONNX node's
//! name on the node it becomes and names the nodes it splits one into after it with a suffix
//! (`conv1.im2col`, `conv1.matmatmul`, `conv1#1` for a duplicate); our INT8 lowering and Q/DQ
//! placement name theirs `<node>_<tag>` or `<tensor>_Q` (the tensor being a node's output). So a
//! tract node belongs to the longest ONNX node name it starts with, followed by `.`, `#`, `_`
//! or nothing: the quantize of a layer's output counts as that layer's, as a TensorRT engine
//! fuses it there.

use std::collections::HashMap;

use crate::backend::LayerTime;

/// The model's node names and op types, to put on tract's nodes.
pub struct OnnxNodes {
    /// name -> op type.
    ops: HashMap<String, String>,
}

impl OnnxNodes {
    pub fn of(p: &tract_onnx::pb::ModelProto) -> OnnxNodes {
        OnnxNodes {
            ops: p
                .graph
                .iter()
                .flat_map(|g| g.node.iter())
                .filter(|n| !n.name.is_empty())
                .map(|n| (n.name.clone(), n.op_type.clone()))
                .collect(),
        }
    }

    /// The ONNX node `tract_name` comes from, if any.
    pub fn name<'a>(&'a self, tract_name: &str) -> Option<&'a str> {
        if let Some((k, _)) = self.ops.get_key_value(tract_name) {
            return Some(k);
        }
        // Cut at each separator from the right: the first cut that is a node name is the
        // longest prefix.
        let cuts = tract_name
            .char_indices()
            .filter(|(_, c)| matches!(c, '.' | '#' | '_'))
            .map(|(i, _)| i)
            .rev();
        for i in cuts {
            if let Some((k, _)) = self.ops.get_key_value(&tract_name[..i]) {
                return Some(k);
            }
        }
        None
    }

    /// `times` under ONNX node names, the parts of one node summed (its kind is the slowest
    /// part's); tract nodes of no ONNX node (the input, constants) keep their name.
    pub fn rename(&self, times: Vec<LayerTime>) -> Vec<LayerTime> {
        let mut merged: Vec<(LayerTime, f64)> = vec![];
        for t in times {
            let layer = self
                .name(&t.layer)
                .map(String::from)
                .unwrap_or_else(|| t.layer.clone());
            match merged.iter_mut().find(|(m, _)| m.layer == layer) {
                Some((m, slowest)) => {
                    m.time_ms += t.time_ms;
                    if t.time_ms > *slowest {
                        *slowest = t.time_ms;
                        m.kernel = t.kernel;
                    }
                }
                None => {
                    let slowest = t.time_ms;
                    merged.push((LayerTime { layer, ..t }, slowest));
                }
            }
        }
        let mut out: Vec<LayerTime> = merged.into_iter().map(|(t, _)| t).collect();
        out.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
        out
    }

    /// The op type of ONNX node `name`.
    pub fn op(&self, name: &str) -> Option<&str> {
        self.ops.get(name).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::pb;

    fn nodes(names: &[&str]) -> OnnxNodes {
        OnnxNodes::of(&pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: names
                    .iter()
                    .map(|n| pb::NodeProto {
                        name: n.to_string(),
                        op_type: "Conv".into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn tract_names_map_to_the_longest_onnx_prefix() {
        let n = nodes(&["conv1", "conv10", "/layer1/layer1.0/conv1/Conv", "a", "a_b"]);
        assert_eq!(n.name("conv1"), Some("conv1"));
        assert_eq!(n.name("conv1.im2col"), Some("conv1"));
        assert_eq!(n.name("conv1.matmatmul.pack"), Some("conv1"));
        assert_eq!(n.name("conv10.im2col"), Some("conv10"), "not conv1");
        assert_eq!(n.name("conv1#1"), Some("conv1"));
        assert_eq!(
            n.name("/layer1/layer1.0/conv1/Conv.add_bias"),
            Some("/layer1/layer1.0/conv1/Conv"),
            "dots inside an ONNX name"
        );
        assert_eq!(
            n.name("/layer1/layer1.0/conv1/Conv_output_0_Q"),
            Some("/layer1/layer1.0/conv1/Conv")
        );
        assert_eq!(n.name("a_b.pack"), Some("a_b"), "the longest prefix");
        assert_eq!(n.name("a_c"), Some("a"));
        assert_eq!(n.name("conv2.im2col"), None);
        assert_eq!(n.name("conv1x"), None, "only at a separator");
        assert_eq!(n.op("conv1"), Some("Conv"));
    }

    #[test]
    fn parts_of_one_node_are_summed() {
        let t = |layer: &str, kernel: &str, time_ms| LayerTime {
            layer: layer.into(),
            kernel: kernel.into(),
            time_ms,
            precision: None,
        };
        let n = nodes(&["conv1", "conv2"]);
        let out = n.rename(vec![
            t("conv1.im2col", "Im2Col", 1.0),
            t("conv2", "OptMatMul", 1.5),
            t("conv1.matmatmul", "OptMatMul", 2.0),
            t("input", "Source", 0.1),
        ]);
        assert_eq!(
            out,
            vec![
                t("conv1", "OptMatMul", 3.0),
                t("conv2", "OptMatMul", 1.5),
                t("input", "Source", 0.1)
            ]
        );
    }

    #[test]
    fn a_tract_engines_profile_names_onnx_nodes() {
        use crate::backend::{BuildInput, BuildSpec, Precision};
        let m = crate::model::testing::residual_classifier(3).model();
        let names = OnnxNodes::of(&m.proto);
        let spec = BuildSpec {
            batch: 1,
            hw: [16, 16],
        };
        let input = crate::model::testing::values(3 * 16 * 16, 3);
        let plan = crate::quant::plan(&m, &[]);
        let qdq = crate::quant::build_qdq(&m, &plan, None).expect("q/dq");
        for build in [
            BuildInput::Float {
                model: &m,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            BuildInput::Quantized {
                model: &m,
                qdq: &qdq,
                keep_fp32: &[],
            },
        ] {
            let mut e = super::super::build_tract(build, spec).expect("build");
            let times = e.profile(&input).expect("profile");
            let onnx: Vec<&str> = times
                .iter()
                .filter(|t| names.op(&t.layer).is_some())
                .map(|t| t.layer.as_str())
                .collect();
            // Every conv of the model is timed under its own name, once.
            for n in &m.graph().node {
                if n.op_type == "Conv" {
                    assert_eq!(
                        onnx.iter().filter(|l| **l == n.name).count(),
                        1,
                        "{} in {:?}",
                        n.name,
                        times.iter().map(|t| &t.layer).collect::<Vec<_>>()
                    );
                }
            }
            // What is left is tract's own plumbing (the input, constants), a small share.
            let other: f64 = times
                .iter()
                .filter(|t| names.op(&t.layer).is_none())
                .map(|t| t.time_ms)
                .sum();
            let all: f64 = times.iter().map(|t| t.time_ms).sum();
            assert!(
                other <= 0.5 * all,
                "unmapped {:?}",
                times
                    .iter()
                    .filter(|t| names.op(&t.layer).is_none())
                    .collect::<Vec<_>>()
            );
        }
    }
}
