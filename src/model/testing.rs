//! Builds small ONNX graphs in code, for tests (placement on residual blocks, branches and
//! graph outputs; engine parity) without shipping model files.

use prost::Message;
use tract_onnx::pb;

use super::proto;

/// Deterministic pseudo-random values in [-1, 1) (xorshift), so tests need no rand crate.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A graph under construction: NCHW float input `x`.
pub struct GraphBuilder {
    pub graph: pb::GraphProto,
    /// The model's `metadata_props`.
    pub metadata: Vec<(String, String)>,
    seed: u64,
}

impl GraphBuilder {
    pub fn new(input_shape: &[usize]) -> Self {
        let graph = pb::GraphProto {
            name: "test".into(),
            input: vec![proto::float_value_info("x", Some(input_shape))],
            ..Default::default()
        };
        GraphBuilder {
            graph,
            metadata: vec![],
            seed: 1,
        }
    }

    fn init(&mut self, name: &str, dims: &[usize], scale: f32) -> String {
        self.seed += 1;
        let n = dims.iter().product();
        let v: Vec<f32> = values(n, self.seed).iter().map(|v| v * scale).collect();
        self.graph
            .initializer
            .push(proto::f32_tensor(name, dims, &v));
        name.to_string()
    }

    /// A 3x3 depthwise conv (`channels` groups, weights `{name}.w` in [-0.5, 0.5), no bias),
    /// zero padding 1.
    pub fn depthwise(&mut self, name: &str, input: &str, channels: usize) -> String {
        let w = self.random(&format!("{name}.w"), &[channels, 1, 3, 3], 0.5);
        self.node(
            "Conv",
            name,
            &[input, &w],
            vec![
                proto::ints_attr("kernel_shape", &[3, 3]),
                proto::ints_attr("pads", &[1, 1, 1, 1]),
                proto::int_attr("group", channels as i64),
            ],
        )
    }

    /// A 3x3 (or 1x1) conv with bias, padding kept "same".
    pub fn conv(&mut self, name: &str, input: &str, cin: usize, cout: usize, k: usize) -> String {
        let w = self.init(
            &format!("{name}.w"),
            &[cout, cin, k, k],
            1.0 / (cin * k * k) as f32 * 3.0,
        );
        let b = self.init(&format!("{name}.b"), &[cout], 0.1);
        let p = (k / 2) as i64;
        let out = format!("{name}.out");
        self.graph.node.push(proto::node(
            "Conv",
            name,
            &[input, &w, &b],
            &[&out],
            vec![
                proto::ints_attr("kernel_shape", &[k as i64, k as i64]),
                proto::ints_attr("pads", &[p, p, p, p]),
            ],
        ));
        out
    }

    pub fn op(&mut self, op: &str, name: &str, inputs: &[&str]) -> String {
        let out = format!("{name}.out");
        self.graph
            .node
            .push(proto::node(op, name, inputs, &[&out], vec![]));
        out
    }

    /// Conv -> BatchNormalization, to exercise folding.
    pub fn conv_bn(&mut self, name: &str, input: &str, cin: usize, cout: usize) -> String {
        let c = self.conv(name, input, cin, cout, 3);
        let s = self.init(&format!("{name}.bn.s"), &[cout], 0.5);
        let b = self.init(&format!("{name}.bn.b"), &[cout], 0.5);
        let m = self.init(&format!("{name}.bn.m"), &[cout], 0.5);
        let v: Vec<f32> = values(cout, 99).iter().map(|x| x.abs() + 0.5).collect();
        self.graph
            .initializer
            .push(proto::f32_tensor(&format!("{name}.bn.v"), &[cout], &v));
        let out = format!("{name}.bn.out");
        self.graph.node.push(proto::node(
            "BatchNormalization",
            &format!("{name}.bn"),
            &[&c, &s, &b, &m, &format!("{name}.bn.v")],
            &[&out],
            vec![],
        ));
        out
    }

    /// Global average pool -> flatten -> Gemm to `classes`.
    pub fn head(&mut self, input: &str, cin: usize, classes: usize) -> String {
        let p = self.op("GlobalAveragePool", "pool", &[input]);
        let f = self.op("Flatten", "flatten", &[&p]);
        let w = self.init("fc.w", &[classes, cin], 0.5);
        let b = self.init("fc.b", &[classes], 0.1);
        let out = "fc.out".to_string();
        self.graph.node.push(proto::node(
            "Gemm",
            "fc",
            &[&f, &w, &b],
            &[&out],
            vec![proto::int_attr("transB", 1)],
        ));
        out
    }

    /// A node with attributes and one output, `{name}.out`.
    pub fn node(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        attrs: Vec<pb::AttributeProto>,
    ) -> String {
        let out = format!("{name}.out");
        self.graph
            .node
            .push(proto::node(op, name, inputs, &[&out], attrs));
        out
    }

    /// A node with `outputs` outputs, `{name}.out0`, `{name}.out1`, ...
    pub fn node_n(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: usize,
        attrs: Vec<pb::AttributeProto>,
    ) -> Vec<String> {
        let outs: Vec<String> = (0..outputs).map(|k| format!("{name}.out{k}")).collect();
        let refs: Vec<&str> = outs.iter().map(|s| s.as_str()).collect();
        self.graph
            .node
            .push(proto::node(op, name, inputs, &refs, attrs));
        outs
    }

    /// An f32 initializer holding `data`.
    pub fn constant(&mut self, name: &str, dims: &[usize], data: &[f32]) -> String {
        self.graph
            .initializer
            .push(proto::f32_tensor(name, dims, data));
        name.to_string()
    }

    /// An f32 initializer of deterministic values in [-scale, scale).
    pub fn random(&mut self, name: &str, dims: &[usize], scale: f32) -> String {
        self.init(name, dims, scale)
    }

    /// An i64 initializer (shapes, axes, pads, indices).
    pub fn ints(&mut self, name: &str, dims: &[usize], data: &[i64]) -> String {
        self.graph
            .initializer
            .push(proto::i64_tensor(name, dims, data));
        name.to_string()
    }

    pub fn output(&mut self, name: &str) {
        self.graph.output.push(proto::float_value_info(name, None));
    }

    pub fn to_bytes(&self, opset: i64) -> Vec<u8> {
        pb::ModelProto {
            ir_version: 8,
            opset_import: vec![pb::OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            producer_name: "quantscope-tests".into(),
            graph: Some(self.graph.clone()),
            metadata_props: self
                .metadata
                .iter()
                .map(|(key, value)| pb::StringStringEntryProto {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    pub fn model(&self) -> super::Model {
        self.model_opset(13)
    }

    /// The graph as a model of `opset` (LayerNormalization needs 17, GroupNormalization 18).
    pub fn model_opset(&self, opset: i64) -> super::Model {
        super::Model::from_bytes(std::path::Path::new("test.onnx"), &self.to_bytes(opset))
            .expect("test graph loads")
    }
}

pub use super::proto::float_attr;

/// A small residual classifier: conv-bn-relu, a residual block, a strided conv, a head.
pub fn residual_classifier(classes: usize) -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, 16, 16]);
    let c1 = b.conv_bn("stem", "x", 3, 8);
    let r1 = b.op("Relu", "stem.relu", &[&c1]);
    let c2 = b.conv("block.conv1", &r1, 8, 8, 3);
    let r2 = b.op("Relu", "block.relu1", &[&c2]);
    let c3 = b.conv("block.conv2", &r2, 8, 8, 3);
    let add = b.op("Add", "block.add", &[&c3, &r1]);
    let r3 = b.op("Relu", "block.relu2", &[&add]);
    let y = b.head(&r3, 8, classes);
    b.output(&y);
    b
}

/// A classifier whose FP16 overflows (at `gain` 100): conv 3->8, ReLU, ×`gain`, the Gram
/// matrix over the
/// `hw`×`hw` pixels (linear attention's `Kᵀ·V`: 8×8 sums of hw² products of values in the
/// hundreds, far past FP16's 65504 at 32×32), its square root (an op no engine fuses into
/// the MatMul, so an FP16 engine stores the Gram matrix), ×1e-2, flattened, a linear layer to
/// `classes`. The FP16 overflow guard must keep `gram` (and what reads its output) in FP32.
pub fn gram_classifier(classes: usize, hw: usize, gain: f32) -> GraphBuilder {
    let mut b = GraphBuilder::new(&[1, 3, hw, hw]);
    let c = b.conv("conv", "x", 3, 8, 3);
    let r = b.op("Relu", "relu", &[&c]);
    let k = b.constant("gain", &[1], &[gain]);
    let big = b.op("Mul", "amplify", &[&r, &k]);
    let shape = b.ints("flat_shape", &[3], &[1, 8, (hw * hw) as i64]);
    let f = b.op("Reshape", "tokens", &[&big, &shape]);
    let t = b.node(
        "Transpose",
        "tokens_t",
        &[&f],
        vec![proto::ints_attr("perm", &[0, 2, 1])],
    );
    let gram = b.op("MatMul", "gram", &[&f, &t]);
    let root = b.op("Sqrt", "root", &[&gram]);
    let s = b.constant("norm", &[1], &[1e-2]);
    let small = b.op("Mul", "normalise", &[&root, &s]);
    let shape2 = b.ints("vec_shape", &[2], &[1, 64]);
    let v = b.op("Reshape", "vec", &[&small, &shape2]);
    let w = b.random("fc.w", &[64, classes], 0.2);
    let y = b.op("MatMul", "fc", &[&v, &w]);
    b.output(&y);
    b
}
