//! Host side of the CUDA engine builder: turns the prepared ONNX graph (or its Q/DQ form) into
//! a list of device steps over typed, laid-out tensors. Conv/Gemm/MatMul become `ConvStep`s
//! with bias, residual add and activation fused; per-layer precision follows the Q/DQ plan
//! (int8 in, int8 out at the next layer's scale where every reader quantizes); rank-4 tensors
//! live in NHWC; buffers are shared between tensors whose lifetimes do not overlap.
//! Nothing here touches a GPU, so all of it is unit-tested.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

use crate::backend::{FloatNode, Precision};
use crate::model::{Graph, proto};

/// Element type of a device tensor; the codes are the kernels' `dtype` arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    I8 = 2,
}

impl DType {
    pub fn code(self) -> i32 {
        self as i32
    }
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::I8 => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Rank-4 tensor stored `[N, H, W, C]`; `shape` stays NCHW.
    Nhwc,
    /// Stored in the order of `shape` (row-major).
    Plain,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    /// Logical (ONNX) shape.
    pub shape: Vec<usize>,
    pub layout: Layout,
    pub dtype: DType,
    /// Quantization scale for int8 tensors (1.0 otherwise).
    pub scale: f32,
    /// Tensor this one is a view of (reshape/flatten): shares its buffer.
    pub alias_of: Option<usize>,
}

impl TensorDesc {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.bytes()
    }
    /// (N, C, H*W) of a rank-4 (or rank-2 as [N, C, 1]) tensor.
    pub fn nchw(&self) -> (usize, usize, usize) {
        match self.shape.len() {
            4 => (self.shape[0], self.shape[1], self.shape[2] * self.shape[3]),
            2 => (self.shape[0], self.shape[1], 1),
            1 => (1, self.shape[0], 1),
            _ => (1, self.numel(), 1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    None,
    Relu,
    Clip(f32, f32),
    Sigmoid,
    HardSwish,
    HardSigmoid(f32, f32),
}

impl Act {
    /// (code, a0, a1) as the kernels take it.
    pub fn code(self) -> (i32, f32, f32) {
        match self {
            Act::None => (0, 0.0, 0.0),
            Act::Relu => (1, 0.0, 0.0),
            Act::Clip(a, b) => (2, a, b),
            Act::Sigmoid => (3, 0.0, 0.0),
            Act::HardSwish => (4, 0.0, 0.0),
            Act::HardSigmoid(a, b) => (5, a, b),
        }
    }
}

/// Int8 form of a convolution: int8 weights (OHWI) and per-output-channel scales.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Weights {
    pub x_scale: f32,
    pub w: Vec<i8>,
    pub w_scales: Vec<f32>,
}

/// A convolution (or Gemm/MatMul as a 1x1 convolution) with its fused epilogue.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvStep {
    /// Name of the conv node; the fused nodes follow in `fused`.
    pub name: String,
    pub fused: Vec<String>,
    pub input: usize,
    pub out: usize,
    /// Float weights, OHWI `[cout, kh, kw, cin / groups]`.
    pub w: Vec<f32>,
    pub bias: Vec<f32>,
    pub int8: Option<Int8Weights>,
    pub cin: usize,
    pub cout: usize,
    pub k: [usize; 2],
    pub stride: [usize; 2],
    /// top, left, bottom, right.
    pub pads: [usize; 4],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub residual: Option<usize>,
    pub act: Act,
}

impl ConvStep {
    /// 1x1, stride 1, no padding, one group: a plain GEMM over NHWC rows.
    pub fn is_pointwise(&self) -> bool {
        self.k == [1, 1] && self.stride == [1, 1] && self.pads == [0; 4] && self.groups == 1
    }
    pub fn reduction(&self) -> usize {
        self.k[0] * self.k[1] * self.cin / self.groups
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Tensor(usize),
    /// f32 constant with its broadcast mode (0 full, 1 scalar, 2 per channel).
    Const(Vec<f32>, i32),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Conv(ConvStep),
    /// y = act(x), with dtype conversion (quantize, dequantize, cast, copy).
    Unary {
        name: String,
        input: usize,
        out: usize,
        act: Act,
    },
    /// y = act(a op b); op 0 add, 1 mul, 2 sub, 3 div; b broadcast by `mode`.
    Binary {
        name: String,
        a: usize,
        b: Operand,
        mode: i32,
        op: i32,
        out: usize,
        act: Act,
    },
    /// Permutes the stored order: `perm` over the stored dims of the input.
    Transpose {
        name: String,
        input: usize,
        out: usize,
        in_dims: Vec<usize>,
        perm: Vec<usize>,
    },
    Pool {
        name: String,
        input: usize,
        out: usize,
        max: bool,
        k: [usize; 2],
        stride: [usize; 2],
        pads: [usize; 4],
        count_include_pad: bool,
    },
    GlobalAvgPool {
        name: String,
        input: usize,
        out: usize,
    },
    Concat {
        name: String,
        inputs: Vec<usize>,
        out: usize,
        outer: usize,
        inner: usize,
    },
    Resize {
        name: String,
        input: usize,
        out: usize,
        linear: bool,
        coord: i32,
        nearest: i32,
        scale_hw: [f32; 2],
    },
    Softmax {
        name: String,
        input: usize,
        out: usize,
        outer: usize,
        len: usize,
        inner: usize,
    },
    Pad {
        name: String,
        input: usize,
        out: usize,
        top_left: [usize; 2],
        value: f32,
    },
}

impl Step {
    pub fn name(&self) -> &str {
        match self {
            Step::Conv(c) => &c.name,
            Step::Unary { name, .. }
            | Step::Binary { name, .. }
            | Step::Transpose { name, .. }
            | Step::Pool { name, .. }
            | Step::GlobalAvgPool { name, .. }
            | Step::Concat { name, .. }
            | Step::Resize { name, .. }
            | Step::Softmax { name, .. }
            | Step::Pad { name, .. } => name,
        }
    }
    pub fn inputs(&self) -> Vec<usize> {
        match self {
            Step::Conv(c) => std::iter::once(c.input).chain(c.residual).collect(),
            Step::Binary { a, b, .. } => match b {
                Operand::Tensor(t) => vec![*a, *t],
                Operand::Const(..) => vec![*a],
            },
            Step::Concat { inputs, .. } => inputs.clone(),
            Step::Unary { input, .. }
            | Step::Transpose { input, .. }
            | Step::Pool { input, .. }
            | Step::GlobalAvgPool { input, .. }
            | Step::Resize { input, .. }
            | Step::Softmax { input, .. }
            | Step::Pad { input, .. } => vec![*input],
        }
    }
    pub fn output(&self) -> usize {
        match self {
            Step::Conv(c) => c.out,
            Step::Unary { out, .. }
            | Step::Binary { out, .. }
            | Step::Transpose { out, .. }
            | Step::Pool { out, .. }
            | Step::GlobalAvgPool { out, .. }
            | Step::Concat { out, .. }
            | Step::Resize { out, .. }
            | Step::Softmax { out, .. }
            | Step::Pad { out, .. } => *out,
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Conv(_) => "conv",
            Step::Unary { .. } => "unary",
            Step::Binary { .. } => "binary",
            Step::Transpose { .. } => "transpose",
            Step::Pool { .. } => "pool",
            Step::GlobalAvgPool { .. } => "global_avg_pool",
            Step::Concat { .. } => "concat",
            Step::Resize { .. } => "resize",
            Step::Softmax { .. } => "softmax",
            Step::Pad { .. } => "pad",
        }
    }
}

/// The lowered engine: tensors, steps in execution order, and what precision each node got.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub tensors: Vec<TensorDesc>,
    pub steps: Vec<Step>,
    /// The f32 NCHW host input as a device tensor (Plain, f32).
    pub input: usize,
    /// The f32 output in ONNX order (Plain, f32).
    pub output: usize,
    pub int8_nodes: Vec<String>,
    pub float_nodes: Vec<FloatNode>,
}

pub type PlanResult<T> = Result<T, String>;

/// A value in the graph while lowering: a device tensor, an int8 tensor seen through a
/// DequantizeLinear (materialized only when a float reader needs it), or a constant.
#[derive(Clone, Debug)]
enum Value {
    Tensor(usize),
    Dequant {
        src: usize,
        scale: f32,
    },
    Const(proto::F32Tensor),
    /// Int8 constant (a quantized weight) with its per-axis scales.
    ConstI8 {
        data: Vec<i8>,
        dims: Vec<usize>,
        scales: Vec<f32>,
    },
}

struct Builder<'a> {
    g: Graph<'a>,
    /// Float activation type of this engine.
    float: DType,
    int8: bool,
    plan: Plan,
    values: HashMap<String, Value>,
    /// Materialized float copies of `Dequant` values, by tensor name.
    dequantized: HashMap<String, usize>,
    /// Layout-converted copies: (tensor id, wanted layout) -> tensor id.
    converted: HashMap<(usize, bool), usize>,
    skip: HashSet<usize>,
    /// Outputs of `Shape` nodes (shapes are static here).
    shapes: HashMap<String, Vec<i64>>,
}

fn err(n: &pb::NodeProto, why: impl std::fmt::Display) -> String {
    format!("node `{}` ({}): {why}", n.name, n.op_type)
}

/// Type of the float layers: FP16 in FP16 and INT8 engines (as TensorRT builds with both its
/// INT8 and FP16 flags), FP32 in FP32 engines.
pub fn float_type(precision: Precision) -> DType {
    if precision == Precision::Fp32 {
        DType::F32
    } else {
        DType::F16
    }
}

/// Lowers `p` (a prepared model with a fixed input of `input_shape`, NCHW) for `precision`.
/// For INT8, `p` is the Q/DQ model.
pub fn lower(
    p: &pb::ModelProto,
    input_shape: [usize; 4],
    precision: Precision,
) -> PlanResult<Plan> {
    let gp = p.graph.as_ref().ok_or("the model has no graph")?;
    let float = float_type(precision);
    let mut b = Builder {
        g: Graph::new(gp),
        float,
        int8: precision == Precision::Int8,
        plan: Plan::default(),
        values: HashMap::new(),
        dequantized: HashMap::new(),
        converted: HashMap::new(),
        skip: HashSet::new(),
        shapes: HashMap::new(),
    };
    let in_name = &gp.input.first().ok_or("the graph has no input")?.name;
    let host_in = b.tensor(
        in_name,
        input_shape.to_vec(),
        Layout::Plain,
        DType::F32,
        1.0,
    );
    b.plan.input = host_in;
    b.values.insert(in_name.clone(), Value::Tensor(host_in));
    for t in &gp.initializer {
        if let Some(f) = proto::tensor_f32(t) {
            b.values.insert(t.name.clone(), Value::Const(f));
        } else if t.data_type == pb::tensor_proto::DataType::Int8 as i32 {
            let data = proto::tensor_i64(t)
                .ok_or_else(|| format!("initializer `{}` unreadable", t.name))?
                .into_iter()
                .map(|v| v as i8)
                .collect();
            let dims = t.dims.iter().map(|&d| d as usize).collect();
            b.values.insert(
                t.name.clone(),
                Value::ConstI8 {
                    data,
                    dims,
                    scales: vec![],
                },
            );
        }
    }
    for i in 0..gp.node.len() {
        // Marked before lowering: a node lowered early (`lower_early`) or in progress is
        // never lowered twice.
        if !b.skip.insert(i) {
            continue;
        }
        b.node(i)?;
    }
    let out_name = &gp.output.first().ok_or("the graph has no output")?.name;
    let out = b.float_tensor_of(out_name, "output")?;
    // The host reads f32 in ONNX order.
    let desc = b.plan.tensors[out].clone();
    let plain = b.to_layout(out, Layout::Plain, "output")?;
    let fin =
        if b.plan.tensors[plain].dtype == DType::F32 && (plain != out || desc.alias_of.is_none()) {
            plain
        } else {
            let o = b.tensor(
                &format!("{out_name}.f32"),
                desc.shape.clone(),
                Layout::Plain,
                DType::F32,
                1.0,
            );
            b.plan.steps.push(Step::Unary {
                name: "output.cast".into(),
                input: plain,
                out: o,
                act: Act::None,
            });
            o
        };
    b.plan.output = fin;
    Ok(b.plan)
}

impl Builder<'_> {
    fn tensor(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        layout: Layout,
        dtype: DType,
        scale: f32,
    ) -> usize {
        self.plan.tensors.push(TensorDesc {
            name: name.into(),
            shape,
            layout,
            dtype,
            scale,
            alias_of: None,
        });
        self.plan.tensors.len() - 1
    }

    fn desc(&self, t: usize) -> &TensorDesc {
        &self.plan.tensors[t]
    }

    fn layout_for(shape: &[usize]) -> Layout {
        if shape.len() == 4 {
            Layout::Nhwc
        } else {
            Layout::Plain
        }
    }

    /// The float device tensor for `name`, dequantizing / converting the input on first use.
    fn float_tensor_of(&mut self, name: &str, why: &str) -> PlanResult<usize> {
        match self.values.get(name).cloned() {
            Some(Value::Tensor(t)) => {
                if t == self.plan.input {
                    // The host input: f32 NCHW -> engine float type, NHWC.
                    if let Some(&c) = self.converted.get(&(t, true)) {
                        return Ok(c);
                    }
                    let shape = self.desc(t).shape.clone();
                    let o = self.tensor(
                        &format!("{name}.nhwc"),
                        shape.clone(),
                        Layout::Nhwc,
                        self.float,
                        1.0,
                    );
                    self.plan.steps.push(Step::Transpose {
                        name: "input.to_nhwc".into(),
                        input: t,
                        out: o,
                        in_dims: shape,
                        perm: vec![0, 2, 3, 1],
                    });
                    self.converted.insert((t, true), o);
                    return Ok(o);
                }
                Ok(t)
            }
            Some(Value::Dequant { src, scale: _ }) => {
                if let Some(&t) = self.dequantized.get(name) {
                    return Ok(t);
                }
                let d = self.desc(src).clone();
                let o = self.tensor(name, d.shape.clone(), d.layout, self.float, 1.0);
                self.plan.steps.push(Step::Unary {
                    name: format!("{name}.dequantize"),
                    input: src,
                    out: o,
                    act: Act::None,
                });
                self.dequantized.insert(name.into(), o);
                Ok(o)
            }
            Some(Value::Const(_)) | Some(Value::ConstI8 { .. }) => Err(format!(
                "tensor `{name}` ({why}) is a constant; the CUDA backend needs it computed (fold it before export)"
            )),
            None => Err(format!(
                "tensor `{name}` ({why}) is not produced by any node"
            )),
        }
    }

    /// `t` in `layout`, inserting a conversion (NHWC <-> NCHW order) when needed.
    /// The node's first input as a rank-4 float tensor in NHWC, with its description.
    fn nhwc_input(&mut self, n: &pb::NodeProto, what: &str) -> PlanResult<(usize, TensorDesc)> {
        let x = self.float_tensor_of(&n.input[0], &format!("{what} input"))?;
        let x = self.to_layout(x, Layout::Nhwc, what)?;
        let d = self.desc(x).clone();
        if d.shape.len() != 4 {
            return Err(err(n, format!("{what} needs a rank-4 input")));
        }
        Ok((x, d))
    }

    fn to_layout(&mut self, t: usize, layout: Layout, why: &str) -> PlanResult<usize> {
        let d = self.desc(t).clone();
        if d.layout == layout {
            return Ok(t);
        }
        if d.shape.len() != 4 {
            // Rank != 4 tensors are always plain; "NHWC" of them is the same order.
            return Ok(t);
        }
        let to_nhwc = layout == Layout::Nhwc;
        if let Some(&c) = self.converted.get(&(t, to_nhwc)) {
            return Ok(c);
        }
        let [n, c, h, w] = [d.shape[0], d.shape[1], d.shape[2], d.shape[3]];
        let (in_dims, perm) = if to_nhwc {
            (vec![n, c, h, w], vec![0, 2, 3, 1])
        } else {
            (vec![n, h, w, c], vec![0, 3, 1, 2])
        };
        let o = self.tensor(
            &format!("{}.{}", d.name, if to_nhwc { "nhwc" } else { "nchw" }),
            d.shape.clone(),
            layout,
            d.dtype,
            d.scale,
        );
        self.plan.steps.push(Step::Transpose {
            name: format!("{}.layout({why})", d.name),
            input: t,
            out: o,
            in_dims,
            perm,
        });
        self.converted.insert((t, to_nhwc), o);
        Ok(o)
    }

    fn const_of(&self, name: &str) -> Option<proto::F32Tensor> {
        match self.values.get(name) {
            Some(Value::Const(c)) => Some(c.clone()),
            _ => None,
        }
    }

    fn ints_const(&self, name: &str) -> Option<Vec<i64>> {
        if let Some(s) = self.shapes.get(name) {
            return Some(s.clone());
        }
        self.g.initializer(name).and_then(proto::tensor_i64)
    }

    /// Integer shape arithmetic on constants (exporters compute Resize sizes from
    /// `Shape -> Slice -> Concat`): folded at build time into `shapes`, no kernel.
    fn fold_shape_op(&self, n: &pb::NodeProto) -> Option<Vec<i64>> {
        let int = |k: usize| {
            n.input
                .get(k)
                .filter(|s| !s.is_empty())
                .and_then(|t| self.ints_const(t))
        };
        match n.op_type.as_str() {
            "Cast" | "Unsqueeze" | "Squeeze" | "Identity" => int(0),
            "Concat" => n
                .input
                .iter()
                .map(|t| self.ints_const(t))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.concat()),
            "Gather" => {
                let (data, idx) = (int(0)?, int(1)?);
                let len = data.len() as i64;
                idx.iter()
                    .map(|&i| {
                        data.get((if i < 0 { i + len } else { i }) as usize)
                            .copied()
                    })
                    .collect()
            }
            "Slice" => {
                let data = int(0)?;
                if int(3).is_some_and(|axes| axes != [0]) {
                    return None;
                }
                let len = data.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + len } else { v }).clamp(0, len);
                let (start, end) = (clamp(*int(1)?.first()?), clamp(*int(2)?.first()?));
                let step = int(4).and_then(|s| s.first().copied()).unwrap_or(1);
                (step == 1).then(|| data[start as usize..end.max(start) as usize].to_vec())
            }
            _ => None,
        }
    }

    /// Node `n`'s float NHWC output: `d`'s batch and channels at `oh` x `ow`.
    fn spatial_out(&mut self, n: &pb::NodeProto, d: &TensorDesc, oh: usize, ow: usize) -> usize {
        let shape = vec![d.shape[0], d.shape[1], oh, ow];
        self.tensor(&n.output[0], shape, Layout::Nhwc, self.float, 1.0)
    }

    /// Adds `step`, whose output `o` is node `n`'s (first) output.
    fn emit(&mut self, n: &pb::NodeProto, o: usize, step: Step) -> PlanResult<()> {
        self.plan.steps.push(step);
        self.values.insert(n.output[0].clone(), Value::Tensor(o));
        Ok(())
    }

    /// Node `n` as an elementwise step (activation, quantize) into a `dtype` tensor.
    fn unary_node(
        &mut self,
        n: &pb::NodeProto,
        what: &str,
        dtype: DType,
        scale: f32,
        act: Act,
    ) -> PlanResult<()> {
        let x = self.float_tensor_of(&n.input[0], what)?;
        let d = self.desc(x).clone();
        let o = self.tensor(&n.output[0], d.shape, d.layout, dtype, scale);
        let step = Step::Unary {
            name: n.name.clone(),
            input: x,
            out: o,
            act,
        };
        self.emit(n, o, step)
    }

    /// Lowers the producer of `name` ahead of node order when it is not lowered yet and its
    /// inputs are (recursively, `depth` producers deep); otherwise leaves it to the main loop.
    fn lower_early(&mut self, name: &str, depth: usize) -> PlanResult<()> {
        if depth == 0 || self.values.contains_key(name) || self.shapes.contains_key(name) {
            return Ok(());
        }
        let Some(j) = self.g.producer(name) else {
            return Ok(());
        };
        if self.skip.contains(&j) {
            return Ok(());
        }
        let n = self.g.node(j);
        for i in n.input.iter().filter(|i| !i.is_empty()) {
            self.lower_early(i, depth - 1)?;
        }
        // Lowering an input may have fused this node already (a conv takes its Q node).
        let ready = !self.skip.contains(&j)
            && n.input.iter().all(|i| {
                i.is_empty() || self.values.contains_key(i) || self.shapes.contains_key(i)
            });
        if ready {
            // Marked first: the main loop must not lower it again.
            self.skip.insert(j);
            self.node(j)?;
        }
        Ok(())
    }

    fn node(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let op = n.op_type.as_str();
        if let Some(v) = self.fold_shape_op(n) {
            self.shapes.insert(n.output[0].clone(), v);
            return Ok(());
        }
        let res = match op {
            "QuantizeLinear" => self.quantize(i),
            "DequantizeLinear" => self.dequantize(i),
            "Conv" | "Gemm" | "MatMul" => self.conv(i),
            "Identity" | "Dropout"
                if !matches!(self.values.get(&n.input[0]), Some(Value::Tensor(_))) =>
            {
                // Pass-through of a constant (exporters share weights this way) or of a lazy value.
                let v = self
                    .values
                    .get(&n.input[0])
                    .cloned()
                    .ok_or_else(|| err(n, "input unknown"))?;
                if let Some(Value::ConstI8 { .. }) =
                    self.values.get(&format!("{}#int8", n.input[0]))
                {
                    let q = self.values[&format!("{}#int8", n.input[0])].clone();
                    self.values.insert(format!("{}#int8", n.output[0]), q);
                }
                self.values.insert(n.output[0].clone(), v);
                Ok(())
            }
            "Relu" | "Clip" | "Sigmoid" | "HardSwish" | "HardSigmoid" | "Identity" | "Dropout" => {
                let act = self.act_of(n)?;
                self.unary_node(n, "activation input", self.float, 1.0, act)
            }
            "Add" | "Mul" | "Sub" | "Div" => self.binary(i),
            "BatchNormalization" => self.batch_norm(i),
            "MaxPool" | "AveragePool" => self.pool(i),
            "GlobalAveragePool" => {
                let (x, d) = self.nhwc_input(n, "pool")?;
                let o = self.spatial_out(n, &d, 1, 1);
                self.emit(
                    n,
                    o,
                    Step::GlobalAvgPool {
                        name: n.name.clone(),
                        input: x,
                        out: o,
                    },
                )
            }
            "Flatten" | "Reshape" | "Squeeze" | "Unsqueeze" => self.reshape(i),
            "Shape" => {
                let shape = match self.values.get(&n.input[0]) {
                    Some(Value::Tensor(t)) => self.desc(*t).shape.clone(),
                    Some(Value::Dequant { src, .. }) => self.desc(*src).shape.clone(),
                    Some(Value::Const(c)) => c.dims.clone(),
                    _ => return Err(err(n, "input unknown")),
                };
                self.shapes.insert(
                    n.output[0].clone(),
                    shape.iter().map(|&d| d as i64).collect(),
                );
                Ok(())
            }
            "Transpose" => self.transpose(i),
            "Concat" => self.concat(i),
            "Resize" | "Upsample" => self.resize(i),
            "Softmax" => self.softmax(i),
            "Pad" => self.pad(i),
            _ => Err(format!(
                "the CUDA backend has no kernel for op `{op}` (node `{}`)",
                n.name
            )),
        };
        res.map_err(|e| if e.contains(&n.name) { e } else { err(n, e) })
    }

    fn act_of(&self, n: &pb::NodeProto) -> PlanResult<Act> {
        Ok(match n.op_type.as_str() {
            "Relu" => Act::Relu,
            "Sigmoid" => Act::Sigmoid,
            "HardSwish" => Act::HardSwish,
            "HardSigmoid" => Act::HardSigmoid(
                proto::attr_f(n, "alpha").unwrap_or(0.2),
                proto::attr_f(n, "beta").unwrap_or(0.5),
            ),
            "Identity" | "Dropout" => Act::None,
            "Clip" => {
                let bound = |slot: usize, attr: &str, default: f32| -> PlanResult<f32> {
                    match n.input.get(slot).filter(|s| !s.is_empty()) {
                        Some(name) => self
                            .const_of(name)
                            .and_then(|t| t.data.first().copied())
                            .ok_or_else(|| err(n, "Clip bounds must be constants")),
                        None => Ok(proto::attr_f(n, attr).unwrap_or(default)),
                    }
                };
                Act::Clip(
                    bound(1, "min", f32::NEG_INFINITY)?,
                    bound(2, "max", f32::INFINITY)?,
                )
            }
            _ => return Err(err(n, "not an activation")),
        })
    }

    fn is_act(&self, n: &pb::NodeProto) -> bool {
        matches!(
            n.op_type.as_str(),
            "Relu" | "Clip" | "Sigmoid" | "HardSwish" | "HardSigmoid"
        ) && self.act_of(n).is_ok()
    }

    fn quantize(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let scale = self
            .const_of(&n.input[1])
            .filter(|s| s.len() == 1)
            .ok_or_else(|| err(n, "only per-tensor constant scales are supported"))?
            .data[0];
        if let Some(zp) = n.input.get(2).filter(|s| !s.is_empty()) {
            let ok = self
                .g
                .initializer(zp)
                .map(|t| {
                    t.data_type == pb::tensor_proto::DataType::Int8 as i32
                        && proto::tensor_i64(t).is_some_and(|v| v.iter().all(|&z| z == 0))
                })
                .unwrap_or(false);
            if !ok {
                return Err(err(n, "only symmetric int8 (zero point 0) is supported"));
            }
        } else {
            return Err(err(
                n,
                "uint8 quantization (no zero point) is not supported",
            ));
        }
        if !self.int8 {
            return Err(err(n, "QuantizeLinear in a float engine"));
        }
        self.unary_node(n, "quantize input", DType::I8, scale, Act::None)
    }

    fn dequantize(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let scales = self
            .const_of(&n.input[1])
            .ok_or_else(|| err(n, "scale must be a constant"))?
            .data;
        match self.values.get(&n.input[0]).cloned() {
            Some(Value::ConstI8 { data, dims, .. }) => {
                // A quantized weight: keep the int8 data and also its float value.
                let axis = proto::attr_i(n, "axis").unwrap_or(1) as usize;
                let per = if scales.len() == 1 { None } else { Some(axis) };
                let f: Vec<f32> = data
                    .iter()
                    .enumerate()
                    .map(|(k, &v)| {
                        let s = match per {
                            None => scales[0],
                            Some(ax) => {
                                let inner: usize = dims[ax + 1..].iter().product();
                                scales[(k / inner) % dims[ax]]
                            }
                        };
                        v as f32 * s
                    })
                    .collect();
                // Keep the int8 form under the DQ output's name for convs to find.
                self.values.insert(
                    format!("{}#int8", n.output[0]),
                    Value::ConstI8 {
                        data,
                        dims: dims.clone(),
                        scales,
                    },
                );
                self.values.insert(
                    n.output[0].clone(),
                    Value::Const(proto::F32Tensor { dims, data: f }),
                );
                Ok(())
            }
            Some(Value::Tensor(t)) if self.desc(t).dtype == DType::I8 => {
                if scales.len() != 1 {
                    return Err(err(n, "per-channel activation dequantization"));
                }
                self.values.insert(
                    n.output[0].clone(),
                    Value::Dequant {
                        src: t,
                        scale: scales[0],
                    },
                );
                Ok(())
            }
            _ => Err(err(n, "input is not an int8 tensor or int8 constant")),
        }
    }

    /// Consumers of `t` when `t` is read by exactly one node and is not a graph output.
    fn single_consumer(&self, t: &str) -> Option<usize> {
        let c = self.g.consumers(t);
        (c.len() == 1 && !self.g.is_graph_output(t)).then(|| c[0].0)
    }

    fn conv(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let op = n.op_type.as_str();
        let wname = n.input.get(1).ok_or_else(|| err(n, "no weight input"))?;
        let w = self.const_of(wname).ok_or_else(|| {
            err(
                n,
                "the second input must be a constant (non-constant weights are not supported)",
            )
        })?;
        let w_i8 = match self.values.get(&format!("{wname}#int8")) {
            Some(Value::ConstI8 { data, dims, scales }) => {
                Some((data.clone(), dims.clone(), scales.clone()))
            }
            _ => None,
        };
        let bias_c = n
            .input
            .get(2)
            .filter(|s| !s.is_empty())
            .map(|b| {
                self.const_of(b)
                    .ok_or_else(|| err(n, "bias must be a constant"))
            })
            .transpose()?;
        let x_val = self.values.get(&n.input[0]).cloned();
        let x_dq = match &x_val {
            Some(Value::Dequant { src, scale }) => Some((*src, *scale)),
            _ => None,
        };
        let use_int8 = self.int8 && x_dq.is_some() && w_i8.is_some();
        let x = if use_int8 {
            x_dq.map(|(s, _)| s).unwrap_or_default()
        } else {
            self.float_tensor_of(&n.input[0], "conv input")?
        };
        let x = if op == "Conv" {
            self.to_layout(x, Layout::Nhwc, "conv")?
        } else {
            x
        };
        let xd = self.desc(x).clone();
        // Geometry and OHWI weights.
        let mut step = ConvStep {
            name: n.name.clone(),
            fused: vec![],
            input: x,
            out: 0,
            w: vec![],
            bias: vec![],
            int8: None,
            cin: 0,
            cout: 0,
            k: [1, 1],
            stride: [1, 1],
            pads: [0; 4],
            dilation: [1, 1],
            groups: 1,
            residual: None,
            act: Act::None,
        };
        let (out_shape, w_ohwi, w_i8_ohwi, w_scales): (
            Vec<usize>,
            Vec<f32>,
            Option<Vec<i8>>,
            Vec<f32>,
        );
        if op == "Conv" {
            if w.dims.len() != 4 || xd.shape.len() != 4 {
                return Err(err(n, "only 2-D convolutions are supported"));
            }
            let (co, cig, kh, kw) = (w.dims[0], w.dims[1], w.dims[2], w.dims[3]);
            let groups = proto::attr_i(n, "group").unwrap_or(1) as usize;
            let strides = proto::attr_ints(n, "strides").unwrap_or(vec![1, 1]);
            let dil = proto::attr_ints(n, "dilations").unwrap_or(vec![1, 1]);
            let [nb, cin, h, wd] = [xd.shape[0], xd.shape[1], xd.shape[2], xd.shape[3]];
            if cig * groups != cin || co % groups != 0 {
                return Err(err(n, "channel/group mismatch"));
            }
            let pads = conv_pads(
                n,
                [h, wd],
                [kh, kw],
                [strides[0] as usize, strides[1] as usize],
                [dil[0] as usize, dil[1] as usize],
            )?;
            let oh = (h + pads[0] + pads[2] - (dil[0] as usize * (kh - 1) + 1))
                / strides[0] as usize
                + 1;
            let ow = (wd + pads[1] + pads[3] - (dil[1] as usize * (kw - 1) + 1))
                / strides[1] as usize
                + 1;
            out_shape = vec![nb, co, oh, ow];
            step.cin = cin;
            step.cout = co;
            step.k = [kh, kw];
            step.stride = [strides[0] as usize, strides[1] as usize];
            step.dilation = [dil[0] as usize, dil[1] as usize];
            step.pads = pads;
            step.groups = groups;
            w_ohwi = oihw_to_ohwi(&w.data, co, cig, kh, kw);
            w_i8_ohwi = w_i8
                .as_ref()
                .map(|(d, _, _)| oihw_to_ohwi(d, co, cig, kh, kw));
            w_scales = w_i8.as_ref().map(|x| x.2.clone()).unwrap_or_default();
        } else {
            // Gemm / MatMul: [N, K] x B -> [N, M], as a 1x1 conv over H = W = 1.
            if xd.shape.len() != 2 || w.dims.len() != 2 {
                return Err(err(
                    n,
                    "only 2-D Gemm/MatMul with a constant B is supported",
                ));
            }
            let trans_a = proto::attr_i(n, "transA").unwrap_or(0) == 1;
            if trans_a {
                return Err(err(n, "Gemm with transA is not supported"));
            }
            let trans_b = op == "Gemm" && proto::attr_i(n, "transB").unwrap_or(0) == 1;
            let alpha = if op == "Gemm" {
                proto::attr_f(n, "alpha").unwrap_or(1.0)
            } else {
                1.0
            };
            let (k, m) = if trans_b {
                (w.dims[1], w.dims[0])
            } else {
                (w.dims[0], w.dims[1])
            };
            if xd.shape[1] != k {
                return Err(err(n, format!("inner dims differ: {} vs {k}", xd.shape[1])));
            }
            out_shape = vec![xd.shape[0], m];
            step.cin = k;
            step.cout = m;
            let to_mk = |v: &[f32]| -> Vec<f32> {
                if trans_b {
                    v.to_vec()
                } else {
                    let mut t = vec![0.0; v.len()];
                    for r in 0..k {
                        for c in 0..m {
                            t[c * k + r] = v[r * m + c];
                        }
                    }
                    t
                }
            };
            w_ohwi = to_mk(&w.data).iter().map(|v| v * alpha).collect();
            w_i8_ohwi = w_i8.as_ref().map(|(d, _, _)| {
                if trans_b {
                    d.clone()
                } else {
                    let mut t = vec![0i8; d.len()];
                    for r in 0..k {
                        for c in 0..m {
                            t[c * k + r] = d[r * m + c];
                        }
                    }
                    t
                }
            });
            w_scales = w_i8
                .as_ref()
                .map(|x| x.2.iter().map(|s| s * alpha).collect())
                .unwrap_or_default();
            if let Some(b) = &bias_c {
                let beta = proto::attr_f(n, "beta").unwrap_or(1.0);
                if b.len() != m && b.len() != 1 {
                    return Err(err(n, "only a per-column bias C is supported"));
                }
                let full: Vec<f32> = (0..m)
                    .map(|c| b.data[if b.len() == 1 { 0 } else { c }] * beta)
                    .collect();
                step.bias = full;
            }
        }
        step.w = w_ohwi;
        if op == "Conv" {
            step.bias = match &bias_c {
                Some(b) if b.len() == step.cout => b.data.clone(),
                Some(_) => return Err(err(n, "bias length differs from output channels")),
                None => vec![0.0; step.cout],
            };
        } else if step.bias.is_empty() {
            step.bias = vec![0.0; step.cout];
        }
        if use_int8 {
            let (xs_src, xs) = x_dq.unwrap_or_default();
            let _ = xs_src;
            let ws = if w_scales.len() == 1 {
                vec![w_scales[0]; step.cout]
            } else {
                w_scales
            };
            if ws.len() != step.cout {
                return Err(err(n, "weight scales do not match output channels"));
            }
            step.int8 = Some(Int8Weights {
                x_scale: xs,
                w: w_i8_ohwi.unwrap_or_default(),
                w_scales: ws,
            });
            self.plan.int8_nodes.push(n.name.clone());
        } else if self.int8 {
            self.plan.float_nodes.push(FloatNode {
                node: n.name.clone(),
                op: n.op_type.clone(),
                reason: "inputs are not quantized (excluded, or not a symmetric int8 Q/DQ pattern)"
                    .into(),
            });
        }
        // Fusion: residual Add, then an activation.
        let mut tname = n.output[0].clone();
        if let Some(ci) = self.single_consumer(&tname) {
            let c = self.g.node(ci);
            if c.op_type == "Add" && c.input.len() == 2 {
                let other = if c.input[0] == tname {
                    &c.input[1]
                } else {
                    &c.input[0]
                };
                // The shortcut may come later in node order (torchvision puts the downsample
                // conv after conv3): lower it now so the Add can still fuse here.
                self.lower_early(other, 4)?;
                let other_val = self.values.get(other).cloned();
                let res = match other_val {
                    Some(Value::Tensor(t)) if t != self.plan.input => Some(t),
                    Some(Value::Dequant { src, .. }) if self.int8 => Some(src),
                    _ => None,
                };
                if let Some(r) = res {
                    let r = self.to_layout(r, Self::layout_for(&out_shape), "residual")?;
                    if self.desc(r).shape == out_shape {
                        step.residual = Some(r);
                        step.fused.push(c.name.clone());
                        self.skip.insert(ci);
                        tname = c.output[0].clone();
                    }
                }
            }
        }
        if let Some(ci) = self.single_consumer(&tname) {
            let c = self.g.node(ci);
            if self.is_act(c) {
                step.act = self.act_of(c)?;
                step.fused.push(c.name.clone());
                self.skip.insert(ci);
                tname = c.output[0].clone();
            }
        }
        // Int8 output when every reader quantizes at one scale.
        let mut out_dtype = self.float;
        let mut out_scale = 1.0;
        let mut q_nodes = vec![];
        if use_int8 && !self.g.is_graph_output(&tname) {
            let cons = self.g.consumers(&tname);
            let scales: Vec<Option<f32>> = cons
                .iter()
                .map(|&(ci, slot)| {
                    let c = self.g.node(ci);
                    (c.op_type == "QuantizeLinear" && slot == 0)
                        .then(|| self.q_scale(c))
                        .flatten()
                })
                .collect();
            if !scales.is_empty()
                && scales.iter().all(|s| s.is_some() && *s == scales[0])
                && cons
                    .iter()
                    .all(|&(ci, _)| !self.g.is_graph_output(&self.g.node(ci).output[0]))
            {
                out_dtype = DType::I8;
                out_scale = scales[0].unwrap_or(1.0);
                // Bias through int32 at x_scale * w_scale, as an int8-out conv (QLinearConv on
                // the CPU, TensorRT's int32 bias) computes it.
                if let Some(q) = &step.int8 {
                    for (c, b) in step.bias.iter_mut().enumerate() {
                        let s = q.x_scale * q.w_scales[c];
                        if s > 0.0 {
                            *b = (*b / s).round_ties_even() * s;
                        }
                    }
                }
                q_nodes = cons.iter().map(|c| c.0).collect();
            }
        }
        let layout = if op == "Conv" {
            Layout::Nhwc
        } else {
            Layout::Plain
        };
        let o = self.tensor(&tname, out_shape, layout, out_dtype, out_scale);
        step.out = o;
        self.values.insert(tname.clone(), Value::Tensor(o));
        for q in q_nodes {
            let qn = self.g.node(q);
            step.fused.push(qn.name.clone());
            self.skip.insert(q);
            self.values.insert(qn.output[0].clone(), Value::Tensor(o));
        }
        self.plan.steps.push(Step::Conv(step));
        Ok(())
    }

    fn q_scale(&self, n: &pb::NodeProto) -> Option<f32> {
        let s = self.const_of(n.input.get(1)?)?;
        let zp = self.g.initializer(n.input.get(2)?)?;
        let zero = zp.data_type == pb::tensor_proto::DataType::Int8 as i32
            && proto::tensor_i64(zp)?.iter().all(|&v| v == 0);
        (s.len() == 1 && zero).then_some(s.data[0])
    }

    fn binary(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let op = match n.op_type.as_str() {
            "Add" => 0,
            "Mul" => 1,
            "Sub" => 2,
            _ => 3,
        };
        let (mut a_name, mut b_name) = (n.input[0].clone(), n.input[1].clone());
        let a_const = self.const_of(&a_name).is_some();
        if a_const && (op == 0 || op == 1) {
            std::mem::swap(&mut a_name, &mut b_name);
        } else if a_const {
            return Err(err(
                n,
                "a constant first operand of Sub/Div is not supported",
            ));
        }
        let a = self.float_tensor_of(&a_name, "first operand")?;
        let ad = self.desc(a).clone();
        let (b, mode) = if let Some(c) = self.const_of(&b_name) {
            const_operand(&c, &ad).ok_or_else(|| {
                err(
                    n,
                    format!(
                        "broadcast of a constant {:?} over {:?} is not supported",
                        c.dims, ad.shape
                    ),
                )
            })?
        } else {
            let b = self.float_tensor_of(&b_name, "second operand")?;
            let bd = self.desc(b).clone();
            if bd.shape == ad.shape {
                let b = self.to_layout(b, ad.layout, "binary")?;
                (Operand::Tensor(b), 0)
            } else if bd.shape.len() == 4
                && ad.shape.len() == 4
                && bd.shape[0] == ad.shape[0]
                && bd.shape[1] == ad.shape[1]
                && bd.shape[2] == 1
                && bd.shape[3] == 1
            {
                (Operand::Tensor(b), 3)
            } else if bd.numel() == 1 {
                (Operand::Tensor(b), 1)
            } else {
                return Err(err(
                    n,
                    format!(
                        "broadcast of {:?} over {:?} is not supported",
                        bd.shape, ad.shape
                    ),
                ));
            }
        };
        let mut act = Act::None;
        let mut tname = n.output[0].clone();
        let mut fused = vec![];
        if let Some(ci) = self.single_consumer(&tname) {
            let c = self.g.node(ci);
            if self.is_act(c) {
                act = self.act_of(c)?;
                self.skip.insert(ci);
                fused.push(c.name.clone());
                tname = c.output[0].clone();
            }
        }
        let o = self.tensor(&tname, ad.shape.clone(), ad.layout, self.float, 1.0);
        let name = std::iter::once(n.name.clone())
            .chain(fused)
            .collect::<Vec<_>>()
            .join("+");
        self.plan.steps.push(Step::Binary {
            name,
            a,
            b,
            mode,
            op,
            out: o,
            act,
        });
        self.values.insert(tname, Value::Tensor(o));
        Ok(())
    }

    fn batch_norm(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let get = |k: usize| {
            self.const_of(&n.input[k])
                .ok_or_else(|| err(n, "BatchNormalization parameters must be constants"))
        };
        let (s, b, m, v) = (get(1)?, get(2)?, get(3)?, get(4)?);
        let eps = proto::attr_f(n, "epsilon").unwrap_or(1e-5);
        let k: Vec<f32> = (0..s.len())
            .map(|c| s.data[c] / (v.data[c] + eps).sqrt())
            .collect();
        let sh: Vec<f32> = (0..s.len()).map(|c| b.data[c] - m.data[c] * k[c]).collect();
        let x = self.float_tensor_of(&n.input[0], "batch norm input")?;
        let d = self.desc(x).clone();
        if d.nchw().1 != k.len() {
            return Err(err(n, "channel count differs from the parameters"));
        }
        let t = self.tensor(
            &format!("{}.scaled", n.output[0]),
            d.shape.clone(),
            d.layout,
            self.float,
            1.0,
        );
        self.plan.steps.push(Step::Binary {
            name: format!("{}.scale", n.name),
            a: x,
            b: Operand::Const(k, 2),
            mode: 2,
            op: 1,
            out: t,
            act: Act::None,
        });
        let o = self.tensor(&n.output[0], d.shape, d.layout, self.float, 1.0);
        self.emit(
            n,
            o,
            Step::Binary {
                name: n.name.clone(),
                a: t,
                b: Operand::Const(sh, 2),
                mode: 2,
                op: 0,
                out: o,
                act: Act::None,
            },
        )
    }

    fn pool(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let (x, d) = self.nhwc_input(n, "pool")?;
        let k = proto::attr_ints(n, "kernel_shape").ok_or_else(|| err(n, "no kernel_shape"))?;
        let s = proto::attr_ints(n, "strides").unwrap_or(vec![1, 1]);
        if proto::attr_ints(n, "dilations").is_some_and(|d| d.iter().any(|&v| v != 1)) {
            return Err(err(n, "dilated pooling is not supported"));
        }
        if proto::attr_i(n, "ceil_mode").unwrap_or(0) != 0 {
            return Err(err(n, "ceil_mode pooling is not supported"));
        }
        let ku = [k[0] as usize, k[1] as usize];
        let su = [s[0] as usize, s[1] as usize];
        let pads = conv_pads(n, [d.shape[2], d.shape[3]], ku, su, [1, 1])?;
        let oh = (d.shape[2] + pads[0] + pads[2] - ku[0]) / su[0] + 1;
        let ow = (d.shape[3] + pads[1] + pads[3] - ku[1]) / su[1] + 1;
        let o = self.spatial_out(n, &d, oh, ow);
        self.emit(
            n,
            o,
            Step::Pool {
                name: n.name.clone(),
                input: x,
                out: o,
                max: n.op_type == "MaxPool",
                k: ku,
                stride: su,
                pads,
                count_include_pad: proto::attr_i(n, "count_include_pad").unwrap_or(0) == 1,
            },
        )
    }

    fn reshape(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let x = self.float_tensor_of(&n.input[0], "reshape input")?;
        let d = self.desc(x).clone();
        let new_shape: Vec<usize> = match n.op_type.as_str() {
            "Flatten" => {
                let r = d.shape.len() as i64;
                let mut axis = proto::attr_i(n, "axis").unwrap_or(1);
                if axis < 0 {
                    axis += r;
                }
                let a = axis as usize;
                vec![d.shape[..a].iter().product(), d.shape[a..].iter().product()]
            }
            "Reshape" => {
                let spec = n
                    .input
                    .get(1)
                    .and_then(|s| self.ints_const(s))
                    .ok_or_else(|| err(n, "the target shape must be a constant"))?;
                reshape_dims(&d.shape, &spec)
                    .ok_or_else(|| err(n, format!("cannot reshape {:?} to {spec:?}", d.shape)))?
            }
            "Squeeze" | "Unsqueeze" => {
                let axes = proto::attr_ints(n, "axes")
                    .or_else(|| n.input.get(1).and_then(|s| self.ints_const(s)))
                    .ok_or_else(|| err(n, "axes must be constant"))?;
                squeeze_dims(&d.shape, &axes, n.op_type == "Squeeze")
                    .ok_or_else(|| err(n, "bad axes"))?
            }
            _ => unreachable!(),
        };
        // Only a plain (row-major) tensor can be viewed under a new shape.
        let needs_plain = !(d.layout == Layout::Nhwc
            && d.shape.len() == 4
            && d.shape[2] * d.shape[3] == 1
            && new_shape.len() != 4);
        let src = if d.layout == Layout::Nhwc && d.shape.len() == 4 && needs_plain {
            self.to_layout(x, Layout::Plain, "reshape")?
        } else {
            x
        };
        let sd = self.desc(src).clone();
        let root = sd.alias_of.unwrap_or(src);
        let o = self.tensor(&n.output[0], new_shape, Layout::Plain, sd.dtype, sd.scale);
        self.plan.tensors[o].alias_of = Some(root);
        self.values.insert(n.output[0].clone(), Value::Tensor(o));
        Ok(())
    }

    fn transpose(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let x = self.float_tensor_of(&n.input[0], "transpose input")?;
        let x = self.to_layout(x, Layout::Plain, "transpose")?;
        let d = self.desc(x).clone();
        let r = d.shape.len();
        let perm: Vec<usize> = proto::attr_ints(n, "perm")
            .map(|p| p.iter().map(|&v| v as usize).collect())
            .unwrap_or_else(|| (0..r).rev().collect());
        if perm.len() != r || r > 6 {
            return Err(err(n, "bad perm (or rank above 6)"));
        }
        let shape: Vec<usize> = perm.iter().map(|&p| d.shape[p]).collect();
        let o = self.tensor(&n.output[0], shape, Layout::Plain, d.dtype, d.scale);
        self.emit(
            n,
            o,
            Step::Transpose {
                name: n.name.clone(),
                input: x,
                out: o,
                in_dims: d.shape,
                perm,
            },
        )
    }

    fn concat(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let mut ins = vec![];
        for t in &n.input {
            ins.push(self.float_tensor_of(t, "concat input")?);
        }
        let d0 = self.desc(ins[0]).clone();
        let r = d0.shape.len() as i64;
        let mut axis = proto::attr_i(n, "axis").ok_or_else(|| err(n, "no axis"))?;
        if axis < 0 {
            axis += r;
        }
        let axis = axis as usize;
        let layout = if r == 4 && axis == 1 {
            Layout::Nhwc
        } else {
            Layout::Plain
        };
        let mut conv = vec![];
        for t in ins {
            conv.push(self.to_layout(t, layout, "concat")?);
        }
        let mut shape = d0.shape.clone();
        shape[axis] = conv.iter().map(|&t| self.desc(t).shape[axis]).sum();
        for &t in &conv {
            let s = &self.desc(t).shape;
            if s.len() != shape.len() || (0..s.len()).any(|k| k != axis && s[k] != shape[k]) {
                return Err(err(n, "inputs differ outside the concat axis"));
            }
        }
        let (outer, inner) = if layout == Layout::Nhwc {
            (shape[0] * shape[2] * shape[3], 1)
        } else {
            (
                shape[..axis].iter().product(),
                shape[axis + 1..].iter().product(),
            )
        };
        let o = self.tensor(&n.output[0], shape, layout, self.float, 1.0);
        self.emit(
            n,
            o,
            Step::Concat {
                name: n.name.clone(),
                inputs: conv,
                out: o,
                outer,
                inner,
            },
        )
    }

    fn resize(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let (x, d) = self.nhwc_input(n, "resize")?;
        let nonempty = |k: usize| n.input.get(k).filter(|s| !s.is_empty());
        // Upsample and opset-10 Resize: X, scales.
        let (scales_in, sizes_in) = if n.op_type == "Upsample" || n.input.len() == 2 {
            (nonempty(1), None)
        } else {
            (nonempty(2), nonempty(3))
        };
        let scales = scales_in
            .and_then(|s| self.const_of(s))
            .filter(|t| !t.is_empty());
        let sizes = sizes_in.and_then(|s| self.ints_const(s));
        let (oh, ow, sh, sw) = if let Some(sz) = sizes.filter(|s| s.len() == 4) {
            // N may be the export's batch (often 1): only C must match.
            if sz[1] as usize != d.shape[1] {
                return Err(err(n, "resizing C is not supported"));
            }
            let (oh, ow) = (sz[2] as usize, sz[3] as usize);
            (
                oh,
                ow,
                oh as f32 / d.shape[2] as f32,
                ow as f32 / d.shape[3] as f32,
            )
        } else if let Some(s) = scales.filter(|s| s.len() == 4) {
            if s.data[0] != 1.0 || s.data[1] != 1.0 {
                return Err(err(n, "resizing N or C is not supported"));
            }
            (
                (d.shape[2] as f32 * s.data[2]).floor() as usize,
                (d.shape[3] as f32 * s.data[3]).floor() as usize,
                s.data[2],
                s.data[3],
            )
        } else {
            return Err(err(n, "scales or sizes must be constants"));
        };
        let mode = proto::attr_str(n, "mode").unwrap_or("nearest".into());
        let linear = match mode.as_str() {
            "nearest" => false,
            "linear" | "bilinear" => true,
            m => return Err(err(n, format!("mode `{m}` is not supported"))),
        };
        let coord = match proto::attr_str(n, "coordinate_transformation_mode")
            .unwrap_or(if n.op_type == "Upsample" {
                "asymmetric".into()
            } else {
                "half_pixel".into()
            })
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
        let o = self.spatial_out(n, &d, oh, ow);
        self.emit(
            n,
            o,
            Step::Resize {
                name: n.name.clone(),
                input: x,
                out: o,
                linear,
                coord,
                nearest,
                scale_hw: [sh, sw],
            },
        )
    }

    fn softmax(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let x = self.float_tensor_of(&n.input[0], "softmax input")?;
        let d = self.desc(x).clone();
        let r = d.shape.len() as i64;
        let mut axis = proto::attr_i(n, "axis").unwrap_or(-1);
        if axis < 0 {
            axis += r;
        }
        let axis = axis as usize;
        let (x, outer, len, inner) = if d.layout == Layout::Nhwc && axis == 1 {
            (x, d.shape[0] * d.shape[2] * d.shape[3], d.shape[1], 1)
        } else {
            let x = self.to_layout(x, Layout::Plain, "softmax")?;
            (
                x,
                d.shape[..axis].iter().product(),
                d.shape[axis],
                d.shape[axis + 1..].iter().product(),
            )
        };
        let layout = self.desc(x).layout;
        let o = self.tensor(&n.output[0], d.shape, layout, self.float, 1.0);
        self.emit(
            n,
            o,
            Step::Softmax {
                name: n.name.clone(),
                input: x,
                out: o,
                outer,
                len,
                inner,
            },
        )
    }

    fn pad(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let mode = proto::attr_str(n, "mode").unwrap_or("constant".into());
        if mode != "constant" {
            return Err(err(n, format!("pad mode `{mode}` is not supported")));
        }
        let pads = proto::attr_ints(n, "pads")
            .or_else(|| n.input.get(1).and_then(|s| self.ints_const(s)))
            .ok_or_else(|| err(n, "pads must be constant"))?;
        let value = n
            .input
            .get(2)
            .filter(|s| !s.is_empty())
            .and_then(|s| self.const_of(s))
            .and_then(|t| t.data.first().copied())
            .or(proto::attr_f(n, "value"))
            .unwrap_or(0.0);
        let (x, d) = self.nhwc_input(n, "pad")?;
        if pads.len() != 8 || pads.iter().any(|&p| p < 0) {
            return Err(err(
                n,
                "only non-negative spatial padding of rank-4 tensors",
            ));
        }
        if pads[0] != 0 || pads[1] != 0 || pads[4] != 0 || pads[5] != 0 {
            return Err(err(n, "padding N or C is not supported"));
        }
        let shape = vec![
            d.shape[0],
            d.shape[1],
            d.shape[2] + (pads[2] + pads[6]) as usize,
            d.shape[3] + (pads[3] + pads[7]) as usize,
        ];
        let o = self.tensor(&n.output[0], shape, Layout::Nhwc, self.float, 1.0);
        self.emit(
            n,
            o,
            Step::Pad {
                name: n.name.clone(),
                input: x,
                out: o,
                top_left: [pads[2] as usize, pads[3] as usize],
                value,
            },
        )
    }
}

/// A constant operand over tensor `a`: (values laid out for `a`'s storage, broadcast mode).
fn const_operand(c: &proto::F32Tensor, a: &TensorDesc) -> Option<(Operand, i32)> {
    if c.len() == 1 {
        return Some((Operand::Const(c.data.clone(), 1), 1));
    }
    let (_, ch, _) = a.nchw();
    let nontrivial: Vec<usize> = c.dims.iter().copied().filter(|&d| d != 1).collect();
    // Per channel: [C,1,1], [1,C,1,1] over rank 4; [C] over rank 2's last axis.
    let per_channel = nontrivial == [ch]
        && match a.shape.len() {
            // A rank-1 [C] broadcasts over W, not over channels.
            4 => {
                let r = c.dims.len();
                r >= 3 && c.dims[r - 3] == ch
            }
            2 => c.dims.last() == Some(&ch),
            _ => false,
        };
    if per_channel {
        return Some((Operand::Const(c.data.clone(), 2), 2));
    }
    if c.len() == a.numel() && c.dims.len() == a.shape.len() && c.dims == a.shape {
        let data = if a.layout == Layout::Nhwc {
            let [n, cc, h, w] = [a.shape[0], a.shape[1], a.shape[2], a.shape[3]];
            let mut v = vec![0.0; c.len()];
            for b in 0..n {
                for k in 0..cc {
                    for y in 0..h {
                        for x in 0..w {
                            v[((b * h + y) * w + x) * cc + k] =
                                c.data[((b * cc + k) * h + y) * w + x];
                        }
                    }
                }
            }
            v
        } else {
            c.data.clone()
        };
        return Some((Operand::Const(data, 0), 0));
    }
    None
}

/// Explicit or auto padding of a conv/pool: [top, left, bottom, right].
fn conv_pads(
    n: &pb::NodeProto,
    hw: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
) -> PlanResult<[usize; 4]> {
    let auto = proto::attr_str(n, "auto_pad").unwrap_or("NOTSET".into());
    match auto.as_str() {
        "NOTSET" | "" => {
            let p = proto::attr_ints(n, "pads").unwrap_or(vec![0, 0, 0, 0]);
            if p.len() != 4 || p.iter().any(|&v| v < 0) {
                return Err(err(n, "pads must be 4 non-negative values"));
            }
            Ok([p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize])
        }
        "VALID" => Ok([0; 4]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut out = [0usize; 4];
            for a in 0..2 {
                let o = hw[a].div_ceil(s[a]);
                let ek = d[a] * (k[a] - 1) + 1;
                let total = ((o - 1) * s[a] + ek).saturating_sub(hw[a]);
                let (lo, hi) = if auto == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                out[a] = lo;
                out[a + 2] = hi;
            }
            Ok(out)
        }
        other => Err(err(n, format!("auto_pad `{other}` is not supported"))),
    }
}

/// OIHW -> OHWI.
pub fn oihw_to_ohwi<T: Copy + Default>(w: &[T], o: usize, i: usize, h: usize, wd: usize) -> Vec<T> {
    let mut out = vec![T::default(); w.len()];
    for a in 0..o {
        for c in 0..i {
            for y in 0..h {
                for x in 0..wd {
                    out[((a * h + y) * wd + x) * i + c] = w[((a * i + c) * h + y) * wd + x];
                }
            }
        }
    }
    out
}

/// ONNX Reshape semantics (0 copies the input dim, -1 is inferred).
pub fn reshape_dims(input: &[usize], spec: &[i64]) -> Option<Vec<usize>> {
    let total: usize = input.iter().product();
    let mut out: Vec<usize> = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (k, &s) in spec.iter().enumerate() {
        match s {
            0 => out.push(*input.get(k)?),
            -1 => {
                if infer.is_some() {
                    return None;
                }
                infer = Some(k);
                out.push(1);
            }
            s if s > 0 => out.push(s as usize),
            _ => return None,
        }
    }
    let known: usize = out.iter().product();
    if let Some(k) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return None;
        }
        out[k] = total / known;
    }
    (out.iter().product::<usize>() == total).then_some(out)
}

fn squeeze_dims(input: &[usize], axes: &[i64], squeeze: bool) -> Option<Vec<usize>> {
    if squeeze {
        let r = input.len() as i64;
        let ax: HashSet<usize> = axes
            .iter()
            .map(|&a| (if a < 0 { a + r } else { a }) as usize)
            .collect();
        Some(
            input
                .iter()
                .enumerate()
                .filter(|(k, d)| !(ax.contains(k) && **d == 1))
                .map(|(_, &d)| d)
                .collect(),
        )
    } else {
        let r = (input.len() + axes.len()) as i64;
        let ax: HashSet<usize> = axes
            .iter()
            .map(|&a| (if a < 0 { a + r } else { a }) as usize)
            .collect();
        let mut it = input.iter();
        (0..r as usize)
            .map(|k| {
                if ax.contains(&k) {
                    Some(1)
                } else {
                    it.next().copied()
                }
            })
            .collect()
    }
}

/// Buffer assignment: tensors whose lifetimes do not overlap share a buffer. Returns the slot
/// of every tensor (aliases share their root's) and each slot's size in bytes. `pinned`
/// tensors (the host input and output) get slots of their own for the whole run.
pub fn assign_buffers(plan: &Plan) -> (Vec<usize>, Vec<usize>) {
    let nt = plan.tensors.len();
    let root = |t: usize| plan.tensors[t].alias_of.unwrap_or(t);
    // Last step reading each root.
    let mut last_use = vec![None::<usize>; nt];
    let mut first_def = vec![None::<usize>; nt];
    for (s, step) in plan.steps.iter().enumerate() {
        for t in step.inputs() {
            last_use[root(t)] = Some(s);
        }
        let o = root(step.output());
        first_def[o].get_or_insert(s);
    }
    let pinned = [root(plan.input), root(plan.output)];
    let mut slot_of = vec![usize::MAX; nt];
    let mut sizes: Vec<usize> = vec![];
    let mut free: Vec<usize> = vec![];
    for &p in &pinned {
        if slot_of[p] == usize::MAX {
            slot_of[p] = sizes.len();
            sizes.push(plan.tensors[p].bytes());
        }
    }
    for (s, step) in plan.steps.iter().enumerate() {
        let o = root(step.output());
        if slot_of[o] == usize::MAX {
            let need = plan.tensors[o].bytes();
            // Best fit among free slots, else grow the smallest that is too small, else new.
            let pick = free
                .iter()
                .enumerate()
                .filter(|(_, sl)| sizes[**sl] >= need)
                .min_by_key(|(_, sl)| sizes[**sl])
                .map(|(k, _)| k)
                .or_else(|| {
                    (!free.is_empty())
                        .then(|| (0..free.len()).max_by_key(|&k| sizes[free[k]]).unwrap_or(0))
                });
            let sl = match pick {
                Some(k) => free.swap_remove(k),
                None => {
                    sizes.push(0);
                    sizes.len() - 1
                }
            };
            sizes[sl] = sizes[sl].max(need);
            slot_of[o] = sl;
        }
        // Free roots whose last reader is this step (not the pinned ones, not this output).
        let mut seen = HashSet::new();
        for t in step.inputs() {
            let r = root(t);
            if last_use[r] == Some(s) && !pinned.contains(&r) && r != o && seen.insert(r) {
                free.push(slot_of[r]);
            }
        }
    }
    for t in 0..nt {
        let r = root(t);
        if slot_of[r] == usize::MAX {
            slot_of[r] = sizes.len();
            sizes.push(plan.tensors[r].bytes());
        }
        slot_of[t] = slot_of[r];
    }
    let _ = first_def;
    (slot_of, sizes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::{GraphBuilder, residual_classifier};

    fn plan_of(b: &GraphBuilder, shape: [usize; 4], p: Precision) -> Plan {
        let m = b.model();
        lower(
            &m.with_fixed_input(shape[0], [shape[2], shape[3]]),
            shape,
            p,
        )
        .expect("lowers")
    }

    /// A bottleneck as torchvision orders it: the main branch's last conv comes before the
    /// shortcut conv, both feed the Add.
    fn shortcut_after_main() -> GraphBuilder {
        let mut b = GraphBuilder::new(&[1, 8, 8, 8]);
        let r = b.conv("stem", "x", 8, 16, 1);
        let r = b.op("Relu", "stem.relu", &[&r]);
        let a = b.conv("main.conv1", &r, 16, 16, 3);
        let a = b.op("Relu", "main.relu", &[&a]);
        let m = b.conv("main.conv2", &a, 16, 32, 1);
        let d = b.conv("downsample", &r, 16, 32, 1);
        let s = b.op("Add", "add", &[&m, &d]);
        let y = b.op("Relu", "add.relu", &[&s]);
        b.output(&y);
        b
    }

    #[test]
    fn residual_add_fuses_when_the_shortcut_comes_later() {
        let b = shortcut_after_main();
        let m = b.model();
        let qp = crate::quant::plan(&m, &[]);
        let ranges = crate::calib::Ranges {
            method: crate::calib::Method::Max,
            percentile: 99.99,
            amax: qp.tensors().into_iter().map(|t| (t, 4.0)).collect(),
            bias_correction: Default::default(),
        };
        let qdq = crate::quant::build_qdq(&m, &qp, Some(&ranges)).expect("qdq");
        let fp32 = plan_of(&b, [1, 8, 8, 8], Precision::Fp32);
        let int8 = lower(
            &crate::model::Model {
                proto: qdq.proto.clone(),
                ..m.clone()
            }
            .with_fixed_input(1, [8, 8]),
            [1, 8, 8, 8],
            Precision::Int8,
        )
        .expect("int8 lowers");
        let residual_conv = |plan: &Plan| {
            plan.steps.iter().find_map(|s| match s {
                Step::Conv(c) if c.residual.is_some() => Some(c.clone()),
                _ => None,
            })
        };
        for (what, plan) in [("fp32", &fp32), ("int8", &int8)] {
            let fused =
                residual_conv(plan).unwrap_or_else(|| panic!("{what}: no conv took the residual"));
            assert_eq!(fused.act, Act::Relu, "{what}");
            assert!(
                !plan.steps.iter().any(|s| matches!(s, Step::Binary { .. })),
                "{what}: a standalone Add is left"
            );
            // Every conv is lowered exactly once.
            let convs = plan
                .steps
                .iter()
                .filter(|s| matches!(s, Step::Conv(_)))
                .count();
            let names: Vec<&str> = plan.steps.iter().map(|s| s.name()).collect();
            assert_eq!(convs, 4, "{what}: {names:?}");
        }
        let fused = residual_conv(&int8).expect("int8 residual conv");
        let r = fused.residual.expect("residual");
        assert_eq!(int8.tensors[r].dtype, DType::I8, "int8 shortcut stays int8");
        // The shortcut conv took its QuantizeLinear: no separate quantize step for it.
        let quantizes: Vec<&str> = int8
            .steps
            .iter()
            .filter(
                |s| matches!(s, Step::Unary { out, .. } if int8.tensors[*out].dtype == DType::I8),
            )
            .map(|s| s.name())
            .collect();
        assert_eq!(quantizes.len(), 1, "only the input: {quantizes:?}");
    }

    #[test]
    fn residual_classifier_fuses_conv_bias_add_relu() {
        let b = residual_classifier(5);
        let plan = plan_of(&b, [2, 3, 16, 16], Precision::Fp32);
        let convs: Vec<&ConvStep> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Conv(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(convs.len(), 4, "stem, two block convs, fc");
        // stem: BN folded by Model::load, relu fused.
        assert_eq!(convs[0].act, Act::Relu);
        // block.conv2 + add + relu in one step.
        let c2 = convs
            .iter()
            .find(|c| c.name == "block.conv2")
            .expect("conv2");
        assert!(c2.residual.is_some());
        assert_eq!(c2.act, Act::Relu);
        assert_eq!(c2.fused, vec!["block.add", "block.relu2"]);
        // No standalone Add/Relu left.
        assert!(!plan.steps.iter().any(|s| matches!(s, Step::Binary { .. })));
        let out = &plan.tensors[plan.output];
        assert_eq!(out.shape, vec![2, 5]);
        assert_eq!(out.dtype, DType::F32);
        // conv activations are NHWC with NCHW logical shapes.
        let t = &plan.tensors[convs[1].out];
        assert_eq!(
            (t.layout, t.shape.clone()),
            (Layout::Nhwc, vec![2, 8, 16, 16])
        );
    }

    #[test]
    fn fp16_plan_uses_half_activations_and_f32_io() {
        let plan = plan_of(&residual_classifier(3), [1, 3, 16, 16], Precision::Fp16);
        assert_eq!(plan.tensors[plan.input].dtype, DType::F32);
        assert_eq!(plan.tensors[plan.output].dtype, DType::F32);
        let conv_out = plan
            .steps
            .iter()
            .find_map(|s| match s {
                Step::Conv(c) => Some(c.out),
                _ => None,
            })
            .expect("a conv");
        assert_eq!(plan.tensors[conv_out].dtype, DType::F16);
    }

    #[test]
    fn unknown_op_is_named() {
        let mut b = GraphBuilder::new(&[1, 3, 8, 8]);
        let y = b.op("Erf", "weird", &["x"]);
        b.output(&y);
        let m = b.model();
        let e = lower(
            &m.with_fixed_input(1, [8, 8]),
            [1, 3, 8, 8],
            Precision::Fp32,
        )
        .expect_err("Erf unsupported");
        assert!(e.contains("Erf") && e.contains("weird"), "{e}");
    }

    #[test]
    fn layout_and_shape_math() {
        assert_eq!(reshape_dims(&[2, 8, 1, 1], &[0, -1]), Some(vec![2, 8]));
        assert_eq!(reshape_dims(&[2, 8, 3, 3], &[2, 72]), Some(vec![2, 72]));
        assert_eq!(reshape_dims(&[2, 8], &[-1, -1]), None);
        assert_eq!(squeeze_dims(&[2, 8, 1, 1], &[2, 3], true), Some(vec![2, 8]));
        assert_eq!(squeeze_dims(&[2, 8], &[-1], false), Some(vec![2, 8, 1]));
        // OIHW -> OHWI for a 2x3x1x2 weight.
        let w: Vec<i32> = (0..12).collect();
        let t = oihw_to_ohwi(&w, 2, 3, 1, 2);
        assert_eq!(&t[..6], &[0, 2, 4, 1, 3, 5]);
    }

    #[test]
    fn flatten_of_spatial_tensor_goes_through_nchw_order() {
        let mut b = GraphBuilder::new(&[1, 3, 4, 4]);
        let c = b.conv("c", "x", 3, 4, 3);
        let f = b.op("Flatten", "f", &[&c]);
        b.output(&f);
        let plan = plan_of(&b, [1, 3, 4, 4], Precision::Fp32);
        assert!(
            plan.steps
                .iter()
                .any(|s| matches!(s, Step::Transpose { perm, .. } if perm == &vec![0, 3, 1, 2]))
        );
        assert_eq!(plan.tensors[plan.output].shape, vec![1, 64]);
    }

    #[test]
    fn buffers_are_reused_but_not_while_live() {
        let plan = plan_of(&residual_classifier(5), [1, 3, 16, 16], Precision::Fp32);
        let (slot, sizes) = assign_buffers(&plan);
        assert!(sizes.len() < plan.tensors.len());
        // No step writes a slot that one of its inputs reads.
        for s in &plan.steps {
            let o = slot[s.output()];
            for i in s.inputs() {
                assert_ne!(slot[i], o, "step {} reads and writes one buffer", s.name());
            }
        }
        // A conv's residual stays live until the conv.
        for (k, s) in plan.steps.iter().enumerate() {
            if let Step::Conv(c) = s
                && let Some(r) = c.residual
            {
                for later in &plan.steps[..k] {
                    let _ = later;
                }
                assert_ne!(slot[r], slot[c.out]);
            }
        }
        for (t, d) in plan.tensors.iter().enumerate() {
            assert!(sizes[slot[t]] >= d.bytes());
        }
    }
}
