//! The model as a picture, the way Netron draws it: one box per ONNX node (weights and key
//! attributes inside the box, not as nodes of their own), the graph's inputs and outputs as
//! small boxes, edges for the activation tensors, and Q/DQ pairs folded into marks on the edges
//! they sit on. `Diagram::lay_out` places the boxes top to bottom with a layered (Sugiyama)
//! layout; it runs on the worker thread, the UI only draws the result.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

use super::proto;

/// Width and height of a node's box, in diagram units (points at zoom 1).
pub const OP_SIZE: [f32; 2] = [150.0, 40.0];
/// Inputs and outputs of the graph are smaller boxes.
pub const IO_SIZE: [f32; 2] = [120.0, 26.0];
/// Vertical gap between layers (room for the edges and their Q/DQ marks).
const LAYER_GAP: f32 = 34.0;
/// Horizontal gap between boxes of one layer.
const SIBLING_GAP: f64 = 24.0;
/// Horizontal gap between disconnected parts of the graph.
const COMPONENT_GAP: f32 = 60.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Op,
    Input,
    Output,
}

/// One box of the drawing.
#[derive(Clone, Debug, PartialEq)]
pub struct DiagramNode {
    /// The ONNX node's name (the tensor's for inputs and outputs).
    pub name: String,
    /// The op type; "Input" / "Output" for the graph's own.
    pub op: String,
    pub kind: NodeKind,
    /// Activation tensors read and written, Q/DQ folded away (the float tensor's name).
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Initializers read (weights, biases) with their dims; `int8` where the file stores them
    /// quantized behind a DequantizeLinear.
    pub weights: Vec<Weight>,
    /// Key attributes, Netron style (`kernel_shape`, `strides`, `group`, ...).
    pub attributes: Vec<(String, String)>,
    /// Index in the ONNX graph's node list (`None` for inputs and outputs): the index a
    /// [`crate::quant::QuantPlan`] refers to.
    pub onnx_index: Option<usize>,
    /// Centre and size after [`Diagram::lay_out`].
    pub pos: [f32; 2],
    pub size: [f32; 2],
}

#[derive(Clone, Debug, PartialEq)]
pub struct Weight {
    pub name: String,
    pub dims: Vec<i64>,
    pub int8: bool,
}

/// A tensor going from one box to another.
#[derive(Clone, Debug, PartialEq)]
pub struct DiagramEdge {
    pub from: usize,
    pub to: usize,
    pub tensor: String,
    /// The input slot of `to` it feeds (Q/DQ placement is per (node, slot)).
    pub slot: usize,
    /// Dims where the file says (`None` for a dynamic dimension).
    pub shape: Option<Vec<Option<i64>>>,
    /// A Q/DQ pair the file itself holds on this edge (a QAT model), folded into a mark.
    pub qdq: Option<QdqMark>,
}

/// A Q/DQ pair drawn on an edge: its scale where it is a constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QdqMark {
    pub scale: Option<f32>,
}

/// The drawing of a model: boxes, edges, and (after layout) where they go.
#[derive(Clone, Debug, Default)]
pub struct Diagram {
    pub nodes: Vec<DiagramNode>,
    pub edges: Vec<DiagramEdge>,
    /// Width and height of the laid-out drawing.
    pub size: [f32; 2],
    /// Q/DQ pairs folded into edge marks, for the summary line.
    pub folded_qdq: usize,
    by_name: HashMap<String, usize>,
}

/// Why a diagram could not be laid out.
#[derive(Debug, thiserror::Error)]
pub enum DiagramError {
    #[error("the layout failed: {0}")]
    Layout(String),
}

/// Attributes Netron lists first; others are shown too, after these.
const KEY_ATTRIBUTES: [&str; 8] = [
    "kernel_shape",
    "strides",
    "pads",
    "dilations",
    "group",
    "axis",
    "perm",
    "mode",
];

fn attribute_text(a: &pb::AttributeProto) -> Option<String> {
    use pb::attribute_proto::AttributeType as T;
    let ints = |v: &[i64]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("x")
    };
    Some(match T::try_from(a.r#type).ok()? {
        T::Int => a.i.to_string(),
        T::Float => format!("{}", a.f),
        T::String => String::from_utf8_lossy(&a.s).into_owned(),
        T::Ints => ints(&a.ints),
        T::Floats => format!("{:?}", a.floats),
        // Tensors and graphs are too big for a box: named, not shown.
        T::Tensor => "tensor".into(),
        _ => return None,
    })
}

impl Diagram {
    /// The drawing of `model`'s graph (not laid out yet).
    pub fn of(model: &pb::ModelProto) -> Diagram {
        let empty = pb::GraphProto::default();
        Diagram::of_graph(model.graph.as_ref().unwrap_or(&empty))
    }

    /// Builds the boxes and edges of `g`. A DequantizeLinear reading a QuantizeLinear is a Q/DQ
    /// pair: both go, and every reader of the pair's output reads the pair's input through an
    /// edge marked with it. A DequantizeLinear of an initializer (stored int8 weights) goes
    /// too: its readers list the weight as int8.
    pub fn of_graph(g: &pb::GraphProto) -> Diagram {
        let initializers: HashMap<&str, &pb::TensorProto> =
            g.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
        let producer: HashMap<&str, usize> = g
            .node
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
            .collect();
        // The scale of a Q node, where it is a constant.
        let scale_of = |n: &pb::NodeProto| {
            n.input
                .get(1)
                .and_then(|s| initializers.get(s.as_str()))
                .and_then(|t| proto::tensor_f32(t))
                .and_then(|t| (t.data.len() == 1).then(|| t.data[0]))
        };
        // DQ output -> (the float tensor it stands for, the mark); weight DQ output -> weight.
        let mut alias: HashMap<&str, (&str, QdqMark)> = HashMap::new();
        let mut weight_alias: HashMap<&str, &str> = HashMap::new();
        let mut folded: HashSet<usize> = HashSet::new();
        for (i, n) in g.node.iter().enumerate() {
            if n.op_type != "DequantizeLinear" {
                continue;
            }
            let (Some(src), Some(out)) = (n.input.first(), n.output.first()) else {
                continue;
            };
            if initializers.contains_key(src.as_str()) {
                weight_alias.insert(out, src);
                folded.insert(i);
                continue;
            }
            let Some(&q) = producer.get(src.as_str()) else {
                continue;
            };
            let qn = &g.node[q];
            if qn.op_type != "QuantizeLinear" {
                continue;
            }
            let Some(float) = qn.input.first() else {
                continue;
            };
            alias.insert(
                out,
                (
                    float,
                    QdqMark {
                        scale: scale_of(qn),
                    },
                ),
            );
            folded.insert(i);
            folded.insert(q);
        }
        // A Q whose output something else reads too stays a node.
        for (i, n) in g.node.iter().enumerate() {
            if folded.contains(&i) || n.op_type == "QuantizeLinear" {
                continue;
            }
            for t in &n.input {
                if let Some(&p) = producer.get(t.as_str())
                    && g.node[p].op_type == "QuantizeLinear"
                {
                    folded.remove(&p);
                }
            }
        }
        let folded_qdq = alias.len();
        let resolve = |t: &str| -> (String, Option<QdqMark>) {
            match alias.get(t) {
                Some((f, m)) => (f.to_string(), Some(*m)),
                None => (t.to_string(), None),
            }
        };
        let shapes: HashMap<&str, Vec<Option<i64>>> = g
            .input
            .iter()
            .chain(&g.output)
            .chain(&g.value_info)
            .filter_map(|v| Some((v.name.as_str(), proto::value_info_shape(v)?)))
            .collect();

        let mut d = Diagram::default();
        let mut writer: HashMap<String, usize> = HashMap::new();
        for v in &g.input {
            if initializers.contains_key(v.name.as_str()) {
                continue;
            }
            writer.insert(v.name.clone(), d.nodes.len());
            d.nodes.push(DiagramNode {
                name: v.name.clone(),
                op: "Input".into(),
                kind: NodeKind::Input,
                inputs: vec![],
                outputs: vec![v.name.clone()],
                weights: vec![],
                attributes: vec![],
                onnx_index: None,
                pos: [0.0; 2],
                size: IO_SIZE,
            });
        }
        let mut reads: Vec<(usize, usize, String, Option<QdqMark>)> = vec![];
        for (i, n) in g.node.iter().enumerate() {
            if folded.contains(&i) {
                continue;
            }
            let at = d.nodes.len();
            let mut inputs = vec![];
            let mut weights = vec![];
            for (slot, t) in n.input.iter().enumerate() {
                if t.is_empty() {
                    continue;
                }
                let (int8, w) = match weight_alias.get(t.as_str()) {
                    Some(w) => (true, *w),
                    None => (false, t.as_str()),
                };
                if let Some(init) = initializers.get(w) {
                    weights.push(Weight {
                        name: w.to_string(),
                        dims: init.dims.clone(),
                        int8,
                    });
                    continue;
                }
                let (float, mark) = resolve(t);
                reads.push((at, slot, float.clone(), mark));
                inputs.push(float);
            }
            let mut attributes: Vec<(String, String)> = n
                .attribute
                .iter()
                .filter_map(|a| Some((a.name.clone(), attribute_text(a)?)))
                .collect();
            attributes.sort_by_key(|(k, _)| {
                KEY_ATTRIBUTES
                    .iter()
                    .position(|x| x == k)
                    .unwrap_or(KEY_ATTRIBUTES.len())
            });
            for o in &n.output {
                if !o.is_empty() {
                    writer.insert(o.clone(), at);
                }
            }
            d.nodes.push(DiagramNode {
                name: n.name.clone(),
                op: n.op_type.clone(),
                kind: NodeKind::Op,
                inputs,
                outputs: n.output.iter().filter(|o| !o.is_empty()).cloned().collect(),
                weights,
                attributes,
                onnx_index: Some(i),
                pos: [0.0; 2],
                size: OP_SIZE,
            });
        }
        for v in &g.output {
            let at = d.nodes.len();
            let (float, mark) = resolve(&v.name);
            reads.push((at, 0, float.clone(), mark));
            d.nodes.push(DiagramNode {
                name: v.name.clone(),
                op: "Output".into(),
                kind: NodeKind::Output,
                inputs: vec![float],
                outputs: vec![],
                weights: vec![],
                attributes: vec![],
                onnx_index: None,
                pos: [0.0; 2],
                size: IO_SIZE,
            });
        }
        for (to, slot, tensor, qdq) in reads {
            // A tensor nobody writes (a Constant folded away, a broken file) has no edge.
            let Some(&from) = writer.get(&tensor) else {
                continue;
            };
            d.edges.push(DiagramEdge {
                from,
                to,
                shape: shapes.get(tensor.as_str()).cloned(),
                tensor,
                slot,
                qdq,
            });
        }
        d.folded_qdq = folded_qdq;
        d.index();
        d
    }

    fn index(&mut self) {
        self.by_name = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.kind == NodeKind::Op)
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
    }

    /// The box of the ONNX node named `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The boxes for ONNX node indices (what a Q/DQ plan refers to).
    pub fn by_onnx_index(&self) -> HashMap<usize, usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((n.onnx_index?, i)))
            .collect()
    }

    /// Places the boxes top to bottom: a layered (Sugiyama) layout by `rust-sugiyama`, chosen
    /// because it is pure Rust, small (petgraph, already in the tree, and `log`), takes box
    /// sizes, and lays out a ViT-B/16-sized graph (1,000 nodes) in milliseconds (measured in
    /// `lays_out_a_thousand_nodes_quickly`). Disconnected parts go side by side.
    pub fn lay_out(&mut self) -> Result<(), DiagramError> {
        if self.nodes.is_empty() {
            self.size = [0.0; 2];
            return Ok(());
        }
        let vertices: Vec<(u32, (f64, f64))> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u32, (n.size[0] as f64, (n.size[1] + LAYER_GAP) as f64)))
            .collect();
        let mut seen = HashSet::new();
        let edges: Vec<(u32, u32)> = self
            .edges
            .iter()
            .filter(|e| e.from != e.to && seen.insert((e.from, e.to)))
            .map(|e| (e.from as u32, e.to as u32))
            .collect();
        let config = rust_sugiyama::configure::Config {
            vertex_spacing: SIBLING_GAP,
            ..Default::default()
        };
        // The crate asserts its invariants with panics: one becomes this model's error.
        let layouts = std::panic::catch_unwind(|| {
            rust_sugiyama::from_vertices_and_edges(&vertices, &edges, &config)
        })
        .map_err(|p| DiagramError::Layout(crate::guard::payload_text(p.as_ref())))?;
        let mut placed = vec![false; self.nodes.len()];
        let mut left = 0.0f32;
        let mut height = 0.0f32;
        for (coords, _, _) in layouts {
            let (mut x0, mut y0, mut x1, mut y1) = (f32::MAX, f32::MAX, f32::MIN, f32::MIN);
            for &(i, (x, y)) in &coords {
                let Some(n) = self.nodes.get(i) else { continue };
                let [w, h] = n.size;
                x0 = x0.min(x as f32 - w / 2.0);
                x1 = x1.max(x as f32 + w / 2.0);
                y0 = y0.min(y as f32 - h / 2.0);
                y1 = y1.max(y as f32 + h / 2.0);
            }
            for &(i, (x, y)) in &coords {
                if let Some(n) = self.nodes.get_mut(i) {
                    n.pos = [x as f32 - x0 + left, y as f32 - y0];
                    placed[i] = true;
                }
            }
            if x1 >= x0 {
                left += x1 - x0 + COMPONENT_GAP;
                height = height.max(y1 - y0);
            }
        }
        // Vertices the layout did not return (none expected) go in a row underneath.
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if !placed[i] {
                n.pos = [left + n.size[0] / 2.0, n.size[1] / 2.0];
                left += n.size[0] + SIBLING_GAP as f32;
                height = height.max(n.size[1]);
            }
        }
        self.size = [(left - COMPONENT_GAP).max(0.0), height];
        Ok(())
    }
}

/// A synthetic ViT-like graph of about `nodes` boxes (residual blocks of attention-shaped
/// branches), laid out: for layout timing and the frame-time test.
#[doc(hidden)]
pub fn synthetic(nodes: usize) -> Diagram {
    let mut g = pb::GraphProto {
        input: vec![proto::float_value_info("x", Some(&[1, 3, 224, 224]))],
        ..Default::default()
    };
    let mut k = 0usize;
    let mut node = |g: &mut pb::GraphProto, op: &str, inputs: &[&str]| -> String {
        k += 1;
        let name = format!("/blocks/{op}_{k}");
        let out = format!("{name}_output_0");
        g.node.push(proto::node(op, &name, inputs, &[&out], vec![]));
        out
    };
    let mut x = node(&mut g, "Conv", &["x"]);
    while g.node.len() + 40 < nodes {
        let start = x.clone();
        let ln = node(&mut g, "LayerNormalization", &[&start]);
        let mut heads = vec![];
        for _ in 0..3 {
            let mut t = node(&mut g, "MatMul", &[&ln]);
            t = node(&mut g, "Add", &[&t]);
            t = node(&mut g, "Reshape", &[&t]);
            t = node(&mut g, "Transpose", &[&t]);
            heads.push(t);
        }
        let qk = node(&mut g, "MatMul", &[&heads[0], &heads[1]]);
        let s = node(&mut g, "Softmax", &[&qk]);
        let mut t = node(&mut g, "MatMul", &[&s, &heads[2]]);
        for op in ["Transpose", "Reshape", "MatMul", "Add"] {
            t = node(&mut g, op, &[&t]);
        }
        let res = node(&mut g, "Add", &[&start, &t]);
        let ln2 = node(&mut g, "LayerNormalization", &[&res]);
        let mut m = ln2;
        for op in [
            "MatMul", "Add", "Div", "Erf", "Add", "Mul", "Mul", "MatMul", "Add",
        ] {
            m = node(&mut g, op, &[&m]);
        }
        x = node(&mut g, "Add", &[&res, &m]);
    }
    let y = node(&mut g, "Gemm", &[&x]);
    g.output = vec![proto::float_value_info(&y, None)];
    let mut d = Diagram::of_graph(&g);
    if let Err(e) = d.lay_out() {
        panic!("{e}");
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::residual_classifier;

    #[test]
    fn a_model_becomes_boxes_and_edges() {
        let m = residual_classifier(3).model();
        let g = m.graph();
        let mut d = Diagram::of(&m.proto);
        let ops = d.nodes.iter().filter(|n| n.kind == NodeKind::Op).count();
        assert_eq!(ops, g.node.len(), "one box per ONNX node");
        assert_eq!(
            d.nodes.len(),
            g.node.len() + 2,
            "and one per graph input and output"
        );
        // Every activation input of every node is an edge; weights are inside the boxes.
        let activation_reads: usize = g
            .node
            .iter()
            .flat_map(|n| &n.input)
            .filter(|t| !t.is_empty() && !g.initializer.iter().any(|i| &i.name == *t))
            .count();
        assert_eq!(d.edges.len(), activation_reads + g.output.len());
        let conv = d.nodes.iter().find(|n| n.op == "Conv").expect("a conv");
        assert!(!conv.weights.is_empty(), "a conv shows its weights");
        assert!(conv.weights.iter().all(|w| !w.int8));
        assert_eq!(d.find(&conv.name), d.nodes.iter().position(|n| n == conv));
        d.lay_out().expect("lays out");
        // Top to bottom: every edge goes down.
        for e in &d.edges {
            assert!(
                d.nodes[e.from].pos[1] < d.nodes[e.to].pos[1],
                "{} -> {} goes down",
                d.nodes[e.from].name,
                d.nodes[e.to].name
            );
        }
        // No two boxes overlap.
        for (i, a) in d.nodes.iter().enumerate() {
            for b in &d.nodes[i + 1..] {
                let apart = (a.pos[0] - b.pos[0]).abs() >= (a.size[0] + b.size[0]) / 2.0
                    || (a.pos[1] - b.pos[1]).abs() >= (a.size[1] + b.size[1]) / 2.0;
                assert!(apart, "{} and {} overlap", a.name, b.name);
            }
        }
    }

    #[test]
    fn qdq_pairs_become_marks_on_edges() {
        let m = residual_classifier(3).model();
        let plan = crate::quant::plan(&m, &[]);
        assert!(!plan.activations.is_empty());
        let qdq = crate::quant::build_qdq(&m, &plan, None).expect("q/dq model");
        let plain = Diagram::of(&m.proto);
        let d = Diagram::of(&qdq.proto);
        let names = |d: &Diagram| {
            let mut v: Vec<String> = d.nodes.iter().map(|n| n.name.clone()).collect();
            v.sort();
            v
        };
        assert_eq!(names(&d), names(&plain), "no Q/DQ node is drawn");
        assert_eq!(d.edges.len(), plain.edges.len(), "the same edges");
        let uses: usize = plan.activations.iter().map(|a| a.uses.len()).sum();
        let marked: Vec<&DiagramEdge> = d.edges.iter().filter(|e| e.qdq.is_some()).collect();
        assert_eq!(marked.len(), uses, "one mark per quantized read");
        assert_eq!(d.folded_qdq, plan.activations.len());
        for e in &marked {
            assert!(
                plan.activations.iter().any(|a| a.tensor == e.tensor),
                "{} is a planned tensor, by its float name",
                e.tensor
            );
        }
        // Weights stored int8 behind a DequantizeLinear are the node's int8 weights.
        assert!(
            d.nodes
                .iter()
                .filter(|n| n.op == "Conv")
                .all(|n| n.weights.iter().any(|w| w.int8))
        );
    }

    #[test]
    fn the_bundled_models_become_diagrams() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models");
        for (file, min_nodes) in [
            ("fashion_resnet.onnx", 10),
            ("fashion_scenes_deeplab.onnx", 10),
        ] {
            let m = crate::model::Model::load(&dir.join(file)).expect("loads");
            let mut d = Diagram::of(&m.proto);
            let g = m.graph();
            assert_eq!(
                d.nodes.iter().filter(|n| n.kind == NodeKind::Op).count(),
                g.node.len(),
                "{file}"
            );
            assert!(d.nodes.len() >= min_nodes, "{file}");
            assert!(
                d.edges.len() >= g.node.len(),
                "{file}: at least one edge per node"
            );
            d.lay_out().expect("lays out");
            assert!(d.size[0] > 0.0 && d.size[1] > 0.0);
        }
    }

    #[test]
    fn lays_out_a_thousand_nodes_quickly() {
        let start = std::time::Instant::now();
        let d = synthetic(1000);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "{} boxes, {} edges laid out in {ms:.0} ms",
            d.nodes.len(),
            d.edges.len()
        );
        assert!(d.nodes.len() >= 950);
        assert!(ms < 5_000.0, "layout took {ms:.0} ms");
        for e in &d.edges {
            assert!(d.nodes[e.from].pos[1] < d.nodes[e.to].pos[1]);
        }
    }
}
