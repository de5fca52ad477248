//! Where an ORT engine's time goes: ONNX Runtime's own profiler (a Chrome-trace JSON file of
//! per-node kernel times), read back into the Layers tab's rows with the real node names.

use std::collections::HashMap;

use super::{Optimisation, run_session, session};
use crate::backend::LayerTime;

/// Per node, the median kernel time over `runs` runs of `input` on a profiling session of the
/// same graph, slowest first. The trace file is written to a temporary folder and removed.
pub fn per_node(
    model_bytes: &[u8],
    opt: Optimisation,
    threads: usize,
    shape: &[usize],
    input: &[f32],
    runs: usize,
) -> Result<Vec<LayerTime>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a folder for the profile: {e}"))?;
    let prefix = dir.path().join("ort_profile");
    let mut s = session(model_bytes, opt, threads, super::Use::Engine, Some(&prefix))?;
    for _ in 0..runs.max(1) {
        run_session(&mut s, shape, input, &[])?;
    }
    let file = s.end_profiling().map_err(|e| format!("{e}"))?;
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;
    parse(&text, runs.max(1))
}

/// The model's own node names, to put on ORT's nodes. ORT names the nodes its optimiser makes
/// after the tensor they write (`<tensor>_nchwc` for its blocked-layout convs, which hold the
/// conv and what it fused): such a node gets the name of the ONNX node that writes that tensor.
pub struct OnnxNames {
    nodes: std::collections::HashSet<String>,
    producer: HashMap<String, String>,
    /// Node name -> (op type, first input tensor).
    ops: HashMap<String, (String, Option<String>)>,
}

impl OnnxNames {
    pub fn of(p: &tract_onnx::pb::ModelProto) -> OnnxNames {
        let nodes = || p.graph.iter().flat_map(|g| g.node.iter());
        OnnxNames {
            nodes: nodes().map(|n| n.name.clone()).collect(),
            producer: nodes()
                .flat_map(|n| n.output.iter().map(move |o| (o.clone(), n.name.clone())))
                .collect(),
            ops: nodes()
                .map(|n| {
                    (
                        n.name.clone(),
                        (n.op_type.clone(), n.input.first().cloned()),
                    )
                })
                .collect(),
        }
    }

    /// `layer` as the model names it, where it can be told; ORT's own name otherwise (the
    /// layout reorders it inserts, say).
    pub fn name(&self, layer: &str) -> String {
        if self.nodes.contains(layer) {
            return layer.to_string();
        }
        // ORT's graph transformers name the nodes they make after the node they replace plus
        // `_token_<n>` (a QDQ group turned QLinearConv, say), and its NCHWc layout pass names
        // a tensor `<tensor>_nchwc`.
        let base = strip_token(layer);
        if self.nodes.contains(base) {
            return base.to_string();
        }
        let tensor = base.strip_suffix("_nchwc").unwrap_or(base);
        self.producer
            .get(tensor)
            .cloned()
            .unwrap_or_else(|| layer.to_string())
    }

    /// ORT fuses an activation (or a quantize) into the Conv, Gemm or MatMul before it and
    /// names the fused node after the last one's output: such a step becomes the group
    /// `conv+relu`, named as the CUDA engine names its fused steps, so its time belongs to the
    /// conv. `node` is the name [`Self::name`] gave, `kernel` the op ORT ran.
    pub fn group(&self, node: String, kernel: &str) -> String {
        let Some(family) = ["Conv", "Gemm", "MatMul"]
            .into_iter()
            .find(|f| kernel.contains(f))
        else {
            return node;
        };
        let mut chain = vec![node.clone()];
        // A fused group is short: the main op and an activation, maybe a quantize.
        for _ in 0..3 {
            let Some((op, input)) = chain.last().and_then(|n| self.ops.get(n)) else {
                return node;
            };
            if op.contains(family) {
                if chain.len() == 1 {
                    return node;
                }
                chain.reverse();
                return chain.join("+");
            }
            let Some(prev) = input.as_ref().and_then(|t| self.producer.get(t)) else {
                return node;
            };
            chain.push(prev.clone());
        }
        node
    }

    /// `times` with the model's node names; ORT nodes that map to one name are summed.
    pub fn rename(&self, times: Vec<LayerTime>) -> Vec<LayerTime> {
        let mut merged: Vec<LayerTime> = vec![];
        for mut t in times {
            t.layer = self.group(self.name(&t.layer), &t.kernel);
            match merged.iter_mut().find(|m| m.layer == t.layer) {
                Some(m) => m.time_ms += t.time_ms,
                None => merged.push(t),
            }
        }
        merged.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
        merged
    }
}

/// `name` without ORT's `_token_<n>` suffix.
fn strip_token(name: &str) -> &str {
    match name.rsplit_once("_token_") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// Reads ORT's trace: events of category "Node" named `<node>_kernel_time`, with the op in
/// `args.op_name` and the duration in µs. A node's samples are its runs'.
pub fn parse(trace: &str, runs: usize) -> Result<Vec<LayerTime>, String> {
    let events: Vec<serde_json::Value> =
        serde_json::from_str(trace).map_err(|e| format!("ONNX Runtime's profile: {e}"))?;
    let mut samples: HashMap<(String, String), Vec<f64>> = HashMap::new();
    for e in &events {
        if e.get("cat").and_then(|c| c.as_str()) != Some("Node") {
            continue;
        }
        let Some(node) = e
            .get("name")
            .and_then(|n| n.as_str())
            .and_then(|n| n.strip_suffix("_kernel_time"))
        else {
            continue;
        };
        let op = e
            .pointer("/args/op_name")
            .and_then(|o| o.as_str())
            .unwrap_or("?")
            .to_string();
        let us = e.get("dur").and_then(|d| d.as_f64()).unwrap_or(0.0);
        samples
            .entry((node.to_string(), op))
            .or_default()
            .push(us / 1e3);
    }
    let mut out: Vec<LayerTime> = samples
        .into_iter()
        .map(|((layer, kernel), mut v)| {
            // A node that ran more than once a run (inside a loop) counts its sum per run.
            if v.len() > runs {
                let per_run = v.len() / runs;
                v = v.chunks(per_run).map(|c| c.iter().sum()).collect();
            }
            LayerTime {
                layer,
                kernel,
                time_ms: crate::timing::latency_from(v).median,
                precision: None,
            }
        })
        .collect();
    out.sort_by(|a, b| b.time_ms.total_cmp(&a.time_ms));
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_node_times_from_the_trace() {
        let trace = r#"[
          {"cat":"Session","name":"model_run","dur":900},
          {"cat":"Node","name":"conv1_kernel_time","dur":400,"args":{"op_name":"Conv"}},
          {"cat":"Node","name":"conv1_kernel_time","dur":600,"args":{"op_name":"Conv"}},
          {"cat":"Node","name":"conv1_fence_before","dur":1,"args":{"op_name":"Conv"}},
          {"cat":"Node","name":"relu_kernel_time","dur":50,"args":{"op_name":"Relu"}},
          {"cat":"Node","name":"relu_kernel_time","dur":70,"args":{"op_name":"Relu"}}
        ]"#;
        let t = super::parse(trace, 2).expect("parses");
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].layer.as_str(), t[0].kernel.as_str()),
            ("conv1", "Conv")
        );
        assert!((t[0].time_ms - 0.5).abs() < 1e-9, "{}", t[0].time_ms);
        assert_eq!(t[1].layer, "relu");
    }

    #[test]
    fn a_fused_conv_is_named_as_the_group_it_holds() {
        use tract_onnx::pb;
        let node = |op: &str, name: &str, input: &str, output: &str| pb::NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: vec![input.into()],
            output: vec![output.into()],
            ..Default::default()
        };
        let p = pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: vec![
                    node("Conv", "stem", "x", "stem:0"),
                    node("Relu", "stem.relu", "stem:0", "stem.relu:0"),
                    node("MaxPool", "pool", "stem.relu:0", "pool:0"),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let n = super::OnnxNames::of(&p);
        let t = |layer: &str, kernel: &str| crate::backend::LayerTime {
            layer: layer.into(),
            kernel: kernel.into(),
            time_ms: 1.0,
            precision: None,
        };
        let out = n.rename(vec![
            t("stem.relu:0_nchwc", "FusedConv"),
            t("pool", "MaxPool"),
            t("ReorderOutput", "ReorderOutput"),
        ]);
        let names: Vec<&str> = out.iter().map(|t| t.layer.as_str()).collect();
        assert_eq!(names, ["stem+stem.relu", "pool", "ReorderOutput"]);
        // A node ORT's QDQ transformer made (QLinearConv) carries the replaced node's name.
        assert_eq!(n.name("stem_token_1"), "stem");
        assert_eq!(n.name("Transpose_token_4"), "Transpose_token_4");
        assert_eq!(n.name("stem_token_x"), "stem_token_x");
        assert_eq!(
            n.group("stem".into(), "Conv"),
            "stem",
            "a plain conv keeps its name"
        );
    }
}
