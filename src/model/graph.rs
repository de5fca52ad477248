//! A read-only index over an ONNX graph: who produces a tensor, who consumes it, which
//! names are initializers or graph outputs. Placement and backends walk the graph through it.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

pub struct Graph<'a> {
    pub proto: &'a pb::GraphProto,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<(usize, usize)>>,
    initializers: HashMap<&'a str, &'a pb::TensorProto>,
    outputs: HashSet<&'a str>,
}

impl<'a> Graph<'a> {
    pub fn new(proto: &'a pb::GraphProto) -> Self {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
        for (i, n) in proto.node.iter().enumerate() {
            for o in &n.output {
                if !o.is_empty() {
                    producer.insert(o.as_str(), i);
                }
            }
            for (slot, inp) in n.input.iter().enumerate() {
                if !inp.is_empty() {
                    consumers.entry(inp.as_str()).or_default().push((i, slot));
                }
            }
        }
        Graph {
            proto,
            producer,
            consumers,
            initializers: proto
                .initializer
                .iter()
                .map(|t| (t.name.as_str(), t))
                .collect(),
            outputs: proto.output.iter().map(|o| o.name.as_str()).collect(),
        }
    }

    /// Index of the node writing `tensor`, if a node does (not for inputs and initializers).
    pub fn producer(&self, tensor: &str) -> Option<usize> {
        self.producer.get(tensor).copied()
    }

    pub fn producer_op(&self, tensor: &str) -> Option<&'a str> {
        self.producer(tensor)
            .map(|i| self.proto.node[i].op_type.as_str())
    }

    /// (node index, input slot) of every reader of `tensor`.
    pub fn consumers(&self, tensor: &str) -> &[(usize, usize)] {
        self.consumers
            .get(tensor)
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }

    pub fn initializer(&self, name: &str) -> Option<&'a pb::TensorProto> {
        self.initializers.get(name).copied()
    }

    pub fn is_graph_output(&self, tensor: &str) -> bool {
        self.outputs.contains(tensor)
    }

    pub fn node(&self, i: usize) -> &'a pb::NodeProto {
        &self.proto.node[i]
    }
}
