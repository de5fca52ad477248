//! What the Graph tab paints on each box for one engine (a report row): the precision the node
//! ran in and why it stayed in float, its time from the engine's own profile (ONNX node names
//! on every backend; a CUDA step fusing several nodes is timed on its first and named on the
//! others), its SQNR from the layer analysis, and the Q/DQ marks of the engine's Q/DQ model.
//! Pure: computed once per (engine, results) and cached by the tab.

use std::collections::HashMap;

use crate::backend::Precision;
use crate::model::diagram::{Diagram, NodeKind};
use crate::pipeline::QdqArtifact;
use crate::quant::QUANTIZABLE;
use crate::report::Row;
use crate::sensitivity::SensitivityReport;

/// The precision a box is coloured by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodePrecision {
    Int8,
    Fp8,
    Fp16,
    Fp32,
    /// The engine failed, or the box is the graph's input or output.
    NotRun,
}

impl NodePrecision {
    pub const ALL: [NodePrecision; 5] = [
        NodePrecision::Int8,
        NodePrecision::Fp8,
        NodePrecision::Fp16,
        NodePrecision::Fp32,
        NodePrecision::NotRun,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NodePrecision::Int8 => "int8",
            NodePrecision::Fp8 => "fp8",
            NodePrecision::Fp16 => "fp16",
            NodePrecision::Fp32 => "fp32",
            NodePrecision::NotRun => "not run",
        }
    }

    /// The first precision word of an engine's own description ("fp16, timed faster than
    /// int8", "int8 data", "tf32").
    pub fn parse(text: &str) -> Option<NodePrecision> {
        let word = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .next()?
            .to_ascii_lowercase();
        Some(match word.as_str() {
            "int8" => NodePrecision::Int8,
            "fp8" => NodePrecision::Fp8,
            "fp16" | "half" => NodePrecision::Fp16,
            "fp32" | "tf32" | "float" => NodePrecision::Fp32,
            _ => return None,
        })
    }
}

/// One box's numbers on one engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStat {
    pub precision: Option<NodePrecision>,
    /// The engine's words for the precision, where it says ("fp16, timed faster than int8").
    pub precision_text: Option<String>,
    /// Why the node stayed in float on a quantized engine: "<kind>: <detail>", the kind one of
    /// placement rule, exclusion, AMP, FP16 overflow, unsupported, or engine choice (a GPU
    /// layer whose float implementation timed faster, or whose region ran faster in FP16).
    pub why_float: Option<String>,
    pub time_ms: Option<f64>,
    pub kernel: Option<String>,
    /// The engine step that holds this node when it ran fused into another's.
    pub fused_into: Option<String>,
    pub sqnr_isolated_db: Option<f64>,
    pub sqnr_accumulated_db: Option<f64>,
    pub metric_gain_pt: Option<f64>,
}

/// Every box's numbers on one engine, and the Q/DQ marks its model puts on edges.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    pub nodes: Vec<NodeStat>,
    /// Per edge: the scale of the engine's Q/DQ pair on it (`Some(None)`: a pair whose scale is
    /// not a constant).
    pub marks: Vec<Option<Option<f32>>>,
    /// The Q/DQ format, for the marks' tooltip ("int8", "fp8").
    pub mark_format: &'static str,
    /// Range of the node times and SQNRs, for the colour ramps.
    pub time_range_ms: Option<[f64; 2]>,
    pub sqnr_range_db: Option<[f64; 2]>,
    /// Profiled steps that match no node of the drawing (tract's plumbing, reorders).
    pub unmatched_time_ms: f64,
}

/// The kind of reason an engine gave for keeping a node in float.
fn why_float(op: &str, reason: Option<&str>, amp: bool, excluded: bool) -> String {
    if amp {
        return "AMP: kept in float by the mixed-precision plan".into();
    }
    if excluded {
        return "exclusion: excluded by the experiment's exclude list".into();
    }
    let Some(r) = reason else {
        return format!(
            "placement rule: {op} is not quantized (Q/DQ go on the inputs of {})",
            QUANTIZABLE.join(", ")
        );
    };
    let lower = r.to_ascii_lowercase();
    let kind = if lower.contains("overflow") {
        "FP16 overflow"
    } else if [
        "no int8 form",
        "no integer",
        "unsupported",
        "not supported",
        "no int",
    ]
    .iter()
    .any(|k| lower.contains(k))
    {
        "unsupported"
    } else if lower.contains("exclu") && !lower.contains("excluded, or") {
        "exclusion"
    } else {
        "placement rule"
    };
    format!("{kind}: {r}")
}

/// The Q/DQ model row `r` was built from: the same format, method and mixed-precision plan.
pub fn qdq_of<'a>(r: &Row, qdq: &'a [QdqArtifact]) -> Option<&'a QdqArtifact> {
    let p = r.precision?;
    if !matches!(p, Precision::Int8 | Precision::Fp8) {
        return None;
    }
    qdq.iter().find(|q| {
        q.model.format.precision() == p
            && q.method == r.method
            && q.suffix.is_empty() == r.kept_float.is_empty()
    })
}

/// Every box's numbers on engine `r`. `exclude`: the experiment's exclusions (node names or op
/// types).
pub fn engine_stats(
    d: &Diagram,
    r: &Row,
    qdq: Option<&QdqArtifact>,
    sensitivity: Option<&SensitivityReport>,
    exclude: &[String],
) -> EngineStats {
    let mut out = EngineStats {
        nodes: vec![NodeStat::default(); d.nodes.len()],
        marks: vec![None; d.edges.len()],
        mark_format: match r.precision {
            Some(Precision::Fp8) => "fp8",
            _ => "int8",
        },
        ..Default::default()
    };
    // Times: a step named after one node, or "a+b+c" for a fused group (timed on its first).
    for t in &r.layer_times {
        let parts: Vec<usize> = match d.find(&t.layer) {
            Some(i) => vec![i],
            None => t.layer.split('+').filter_map(|p| d.find(p)).collect(),
        };
        let Some(&first) = parts.first() else {
            out.unmatched_time_ms += t.time_ms;
            continue;
        };
        for (k, &i) in parts.iter().enumerate() {
            let s = &mut out.nodes[i];
            if k == 0 {
                *s.time_ms.get_or_insert(0.0) += t.time_ms;
                s.kernel = Some(t.kernel.clone());
            } else {
                s.fused_into = Some(d.nodes[first].name.clone());
            }
            if let Some(p) = &t.precision {
                s.precision_text = Some(p.clone());
            }
        }
    }
    let float: HashMap<&str, &str> = r
        .float_nodes
        .iter()
        .map(|f| (f.node.as_str(), f.reason.as_str()))
        .collect();
    let quantized: Option<Vec<&str>> = qdq.map(|q| {
        q.model
            .plan
            .quantized_nodes
            .iter()
            .map(String::as_str)
            .collect()
    });
    let layers: HashMap<&str, &crate::sensitivity::LayerReport> = sensitivity
        .map(|s| s.layers.iter().map(|l| (l.node.as_str(), l)).collect())
        .unwrap_or_default();
    for (i, n) in d.nodes.iter().enumerate() {
        let s = &mut out.nodes[i];
        if let Some(l) = layers.get(n.name.as_str()) {
            s.sqnr_isolated_db = l.sqnr_isolated_db;
            s.sqnr_accumulated_db = l.sqnr_accumulated_db;
            s.metric_gain_pt = l.metric_gain_pt;
        }
        if n.kind != NodeKind::Op {
            continue;
        }
        if r.error.is_some() || r.precision.is_none() {
            s.precision = Some(NodePrecision::NotRun);
            continue;
        }
        let said = s.precision_text.as_deref().and_then(NodePrecision::parse);
        let quantizable = QUANTIZABLE.contains(&n.op.as_str());
        let p = match r.precision {
            Some(Precision::Fp32) => said.unwrap_or(NodePrecision::Fp32),
            Some(Precision::Fp16) => said.unwrap_or(NodePrecision::Fp16),
            _ => {
                let q = if r.precision == Some(Precision::Fp8) {
                    NodePrecision::Fp8
                } else {
                    NodePrecision::Int8
                };
                let amp = r.kept_float.iter().any(|k| k == &n.name);
                let reason = float.get(n.name.as_str()).copied();
                let in_plan = match &quantized {
                    Some(v) => v.contains(&n.name.as_str()),
                    None => quantizable,
                };
                let ran_quantized = match said {
                    Some(p) => p == q,
                    None => in_plan && reason.is_none() && !amp,
                };
                if ran_quantized {
                    q
                } else {
                    let excluded = exclude.iter().any(|e| e == &n.name || e == &n.op);
                    // The engine's own reason first; else where the float came from.
                    let region = s
                        .precision_text
                        .as_deref()
                        .filter(|t| t.starts_with("fp16 region"));
                    let why = match (reason, said, region) {
                        // The builder ran the node's region in FP16, faster than INT8: its
                        // Q/DQ plan lists it float, but the choice is the engine's.
                        (_, _, Some(t)) => format!("engine choice: {t}"),
                        (Some(r), _, _) => why_float(&n.op, Some(r), amp, excluded && quantizable),
                        (None, Some(p), None) if quantizable && !amp && !excluded => {
                            let text = s.precision_text.clone().unwrap_or_else(|| p.name().into());
                            // The GPU builder times each layer's implementations: a float one
                            // that won is its choice, not the plan's.
                            if text.contains("timed") {
                                format!("engine choice: {text}")
                            } else {
                                format!("placement rule: {text}")
                            }
                        }
                        _ => why_float(&n.op, None, amp, excluded && quantizable),
                    };
                    s.why_float = Some(why);
                    said.unwrap_or(NodePrecision::Fp32)
                }
            }
        };
        s.precision = Some(p);
    }
    if let Some(q) = qdq {
        let boxes = d.by_onnx_index();
        let mut uses: HashMap<(usize, usize), (&str, Option<f32>)> = HashMap::new();
        for a in &q.model.plan.activations {
            let scale = q.model.scales.get(&a.tensor).copied();
            for &(node, slot) in &a.uses {
                if let Some(&b) = boxes.get(&node) {
                    uses.insert((b, slot), (a.tensor.as_str(), scale));
                }
            }
        }
        // The plan counts nodes by index: the tensor must match too, or the plan is another
        // model's (a past run shown over this model's drawing).
        for (k, e) in d.edges.iter().enumerate() {
            if let Some((tensor, scale)) = uses.get(&(e.to, e.slot))
                && *tensor == e.tensor
            {
                out.marks[k] = Some(*scale);
            }
        }
    }
    let range = |v: &mut dyn Iterator<Item = f64>| {
        v.fold(None, |acc: Option<[f64; 2]>, x| {
            Some(match acc {
                None => [x, x],
                Some([lo, hi]) => [lo.min(x), hi.max(x)],
            })
        })
    };
    out.time_range_ms = range(&mut out.nodes.iter().filter_map(|s| s.time_ms));
    out.sqnr_range_db = range(&mut out.nodes.iter().filter_map(|s| s.sqnr_isolated_db));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{FloatNode, LayerTime};

    fn diagram() -> Diagram {
        let m = crate::model::testing::residual_classifier(3).model();
        Diagram::of(&m.proto)
    }

    fn named(d: &Diagram, op: &str) -> Vec<String> {
        d.nodes
            .iter()
            .filter(|n| n.op == op)
            .map(|n| n.name.clone())
            .collect()
    }

    #[test]
    fn an_int8_engine_colours_quantized_nodes_and_says_why_others_are_float() {
        let d = diagram();
        let convs = named(&d, "Conv");
        assert!(convs.len() >= 2);
        let mut r = Row {
            precision: Some(Precision::Int8),
            float_nodes: vec![FloatNode {
                node: convs[1].clone(),
                op: "Conv".into(),
                reason: "no integer kernel for a grouped conv: runs in float".into(),
            }],
            kept_float: vec![],
            layer_times: vec![
                LayerTime {
                    layer: convs[0].clone(),
                    kernel: "OptMatMul".into(),
                    time_ms: 2.0,
                    precision: None,
                },
                LayerTime {
                    layer: "plumbing".into(),
                    kernel: "Source".into(),
                    time_ms: 0.5,
                    precision: None,
                },
            ],
            ..Default::default()
        };
        let s = engine_stats(&d, &r, None, None, &[]);
        let at = |name: &str| &s.nodes[d.find(name).expect("a box")];
        assert_eq!(at(&convs[0]).precision, Some(NodePrecision::Int8));
        assert_eq!(at(&convs[0]).time_ms, Some(2.0));
        assert_eq!(at(&convs[1]).precision, Some(NodePrecision::Fp32));
        assert!(
            at(&convs[1])
                .why_float
                .as_deref()
                .is_some_and(|w| w.starts_with("unsupported:"))
        );
        assert_eq!(s.unmatched_time_ms, 0.5);
        assert_eq!(s.time_range_ms, Some([2.0, 2.0]));
        let relu = &named(&d, "Relu")[0];
        assert!(
            at(relu)
                .why_float
                .as_deref()
                .is_some_and(|w| w.starts_with("placement rule:"))
        );
        // The same conv kept in float by the mixed-precision plan: AMP; excluded: exclusion.
        r.float_nodes.clear();
        r.kept_float = vec![convs[1].clone()];
        let s = engine_stats(&d, &r, None, None, &[]);
        assert!(
            s.nodes[d.find(&convs[1]).expect("box")]
                .why_float
                .as_deref()
                .is_some_and(|w| w.starts_with("AMP:"))
        );
        r.kept_float.clear();
        r.float_nodes = vec![FloatNode {
            node: convs[1].clone(),
            op: "Conv".into(),
            reason: "inputs are not quantized (excluded, or not a symmetric int8 Q/DQ pattern)"
                .into(),
        }];
        let s = engine_stats(&d, &r, None, None, &["Conv".into()]);
        assert!(
            s.nodes[d.find(&convs[1]).expect("box")]
                .why_float
                .as_deref()
                .is_some_and(|w| w.starts_with("exclusion:"))
        );
        // Run in FP16 by precision per region (the plan lists it float): the engine's choice.
        r.float_nodes[0].reason = "excluded by the experiment".into();
        r.layer_times.push(LayerTime {
            layer: convs[1].clone(),
            kernel: "cudnn".into(),
            time_ms: 1.0,
            precision: Some("fp16 region: INT8 was 1.30x slower for this region".into()),
        });
        let s = engine_stats(&d, &r, None, None, &[]);
        let c = &s.nodes[d.find(&convs[1]).expect("box")];
        assert_eq!(c.precision, Some(NodePrecision::Fp16));
        assert_eq!(
            c.why_float.as_deref(),
            Some("engine choice: fp16 region: INT8 was 1.30x slower for this region")
        );
    }

    #[test]
    fn a_fused_cuda_step_is_timed_on_its_first_node() {
        let d = diagram();
        let convs = named(&d, "Conv");
        let relus = named(&d, "Relu");
        let r = Row {
            precision: Some(Precision::Fp16),
            layer_times: vec![LayerTime {
                layer: format!("{}+{}", convs[0], relus[0]),
                kernel: "cudnn".into(),
                time_ms: 1.5,
                precision: Some("fp16, timed faster than int8".into()),
            }],
            ..Default::default()
        };
        let s = engine_stats(&d, &r, None, None, &[]);
        let c = &s.nodes[d.find(&convs[0]).expect("box")];
        let u = &s.nodes[d.find(&relus[0]).expect("box")];
        assert_eq!(c.time_ms, Some(1.5));
        assert_eq!(u.time_ms, None);
        assert_eq!(u.fused_into.as_deref(), Some(convs[0].as_str()));
        assert_eq!(c.precision, Some(NodePrecision::Fp16));
        let int8 = Row {
            precision: Some(Precision::Int8),
            ..r.clone()
        };
        let s = engine_stats(&d, &int8, None, None, &[]);
        let c = &s.nodes[d.find(&convs[0]).expect("box")];
        assert_eq!(c.precision, Some(NodePrecision::Fp16));
        assert_eq!(
            c.why_float.as_deref(),
            Some("engine choice: fp16, timed faster than int8")
        );
        assert_eq!(NodePrecision::parse("int8 data"), Some(NodePrecision::Int8));
        assert_eq!(NodePrecision::parse("tf32"), Some(NodePrecision::Fp32));
        assert_eq!(NodePrecision::parse("?"), None);
    }

    #[test]
    fn the_engines_qdq_plan_marks_the_edges_it_quantizes() {
        let m = crate::model::testing::residual_classifier(3).model();
        let d = Diagram::of(&m.proto);
        let plan = crate::quant::plan(&m, &[]);
        let qdq = QdqArtifact {
            method: Some(crate::calib::Method::Max),
            suffix: "",
            model: crate::quant::build_qdq(&m, &plan, None).expect("q/dq"),
        };
        let r = Row {
            precision: Some(Precision::Int8),
            method: Some(crate::calib::Method::Max),
            ..Default::default()
        };
        let arts = [qdq];
        let q = qdq_of(&r, &arts);
        assert!(q.is_some());
        let s = engine_stats(&d, &r, q, None, &[]);
        let uses: usize = plan.activations.iter().map(|a| a.uses.len()).sum();
        assert_eq!(s.marks.iter().filter(|m| m.is_some()).count(), uses);
        // Every marked edge feeds a quantizable node; FP32 has no marks.
        for (k, m) in s.marks.iter().enumerate() {
            if m.is_some() {
                assert!(
                    QUANTIZABLE.contains(&d.nodes[d.edges[k].to].op.as_str())
                        || d.nodes[d.edges[k].to].op == "Add"
                );
            }
        }
        let fp32 = Row {
            precision: Some(Precision::Fp32),
            ..Default::default()
        };
        assert!(qdq_of(&fp32, &arts).is_none());
    }
}
