//! The CUDA planner's op registry: lowers the prepared ONNX graph (or its Q/DQ form) into the
//! device steps of `plan`. Each op family lives in its own module and declares, in its
//! `FAMILY`, the ONNX ops it takes and how it lowers one node; `REGISTRY` lists the families,
//! so adding an op touches one file. Shape subgraphs and anything else whose inputs are all
//! constants are evaluated on the host at build time (input shapes are fixed per engine)
//! with tract's own op implementations (`shape`). `survey` runs the same lowering without
//! stopping at the first problem, so `inspect` and the Model panel can list every node the
//! backend cannot take before anything is built. Nothing here touches a GPU.

mod conv;
mod elementwise;
mod matmul;
mod movement;
mod norm;
mod pool;
mod quant;
mod resize;
mod shape;

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;
use tract_onnx::prelude::Tensor;

use super::plan::{
    Act, DType, EwOp, Layout, MAX_RANK, Operand, Plan, PlanResult, Step, TensorDesc, float_type,
};
use crate::backend::Precision;
use crate::fp16_guard::KeptFp32;
use crate::model::{Graph, proto};

/// One op family: the ONNX ops it takes and how it lowers node `i` of the graph.
pub struct OpFamily {
    pub name: &'static str,
    pub ops: &'static [&'static str],
    pub lower: fn(&mut Builder<'_>, usize) -> PlanResult<()>,
}

/// Every family, in no particular order (an op belongs to exactly one).
pub const REGISTRY: &[&OpFamily] = &[
    &quant::FAMILY,
    &conv::FAMILY,
    &matmul::FAMILY,
    &elementwise::FAMILY,
    &norm::FAMILY,
    &pool::FAMILY,
    &resize::FAMILY,
    &movement::FAMILY,
    &shape::FAMILY,
];

/// The family that takes `op`, if any.
pub fn family_of(op: &str) -> Option<&'static OpFamily> {
    REGISTRY.iter().copied().find(|f| f.ops.contains(&op))
}

/// A node the backend cannot take, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsupported {
    pub node: String,
    pub op: String,
    pub why: String,
}

/// What a plan depends on of the GPU it is for.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The int8 tensor-core conv kernel runs there (`conv_i8_mma`, compute capability 8.0
    /// on): int8 stems are regrouped into the taps it copies rather than cuDNN's, and a
    /// global average pool fuses into the int8 conv before it (the tensor-core kernels'
    /// epilogue alone pools).
    pub int8_mma: bool,
}

impl Default for Target {
    /// A GPU of compute capability 8.0 or newer.
    fn default() -> Target {
        Target { int8_mma: true }
    }
}

/// A value in the graph while lowering.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// A device tensor.
    Tensor(usize),
    /// An int8 or FP8 tensor seen through a DequantizeLinear: readers that take it quantized
    /// read `src` with its scale; float readers get a dequantized copy made on first use.
    Dequant { src: usize, scale: f32 },
    /// A float constant.
    Const(proto::F32Tensor),
    /// An int8 constant (a quantized weight) with its per-axis scales.
    ConstI8 {
        data: Vec<i8>,
        dims: Vec<usize>,
        scales: Vec<f32>,
    },
    /// An FP8 E4M3 constant (a quantized weight: its codes) with its per-axis scales.
    ConstF8 {
        codes: Vec<u8>,
        dims: Vec<usize>,
        scales: Vec<f32>,
    },
    /// A non-float constant (shapes, indices, masks) computed at build time.
    Host(Tensor),
    /// Produced by a node that could not be lowered (`survey` only): readers are skipped
    /// without a second report.
    Failed,
}

pub struct Builder<'a> {
    pub(crate) model: &'a pb::ModelProto,
    pub(crate) opset: i64,
    pub(crate) g: Graph<'a>,
    /// Float activation type of the node being lowered: the engine's, or F32 for a node the
    /// FP16 overflow guard keeps in FP32.
    pub(crate) float: DType,
    /// The engine's float activation type.
    engine_float: DType,
    /// The overflow guard's nodes (by name): lowered with `float` F32 in an FP16 engine.
    keep_fp32: HashMap<String, KeptFp32>,
    /// F16 <-> F32 copies of tensors read by a node of the other float type: (tensor, type).
    casts: HashMap<(usize, DType), usize>,
    /// The quantized type of a Q/DQ engine (I8 for INT8, F8 for FP8); `None` for float ones.
    pub(crate) quant: Option<DType>,
    pub(crate) plan: Plan,
    pub(crate) values: HashMap<String, Value>,
    /// Float device copies of values that are not float tensors (dequantized int8 values,
    /// materialized constants), made on first use, by value name.
    float_copies: HashMap<String, usize>,
    /// Layout-converted copies: (tensor id, to NHWC) -> tensor id.
    converted: HashMap<(usize, bool), usize>,
    /// Nodes lowered (or being lowered, or fused into another node's step).
    pub(crate) skip: HashSet<usize>,
    pub(crate) target: Target,
    /// Tensors the host reads after each run besides the output (`Plan::taps`).
    taps: Vec<String>,
}

pub(crate) fn err(n: &pb::NodeProto, why: impl std::fmt::Display) -> String {
    format!("node `{}` ({}): {why}", n.name, n.op_type)
}

/// Lowers `p` (a prepared model with a fixed input of `input_shape`, NCHW) for `precision`
/// on a GPU of compute capability 8.0 or newer. For INT8, `p` is the Q/DQ model. Stops at the
/// first node it cannot take.
pub fn lower(
    p: &pb::ModelProto,
    input_shape: [usize; 4],
    precision: Precision,
) -> PlanResult<Plan> {
    lower_for(p, input_shape, precision, Target::default(), &[], &[])
}

/// `lower` for a `target` GPU.
/// `keep_fp32`: the FP16 overflow guard's nodes, computed in FP32 where the engine's float
/// layers are FP16 (casts at their edges); `plan.fp32_layers` lists those lowered.
/// `taps`: tensors the host reads after each run (`plan.taps`, in this order), for statistics.
pub fn lower_for(
    p: &pb::ModelProto,
    input_shape: [usize; 4],
    precision: Precision,
    target: Target,
    keep_fp32: &[KeptFp32],
    taps: &[String],
) -> PlanResult<Plan> {
    // A tapped tensor is lowered as a graph output is: no step fuses it away (a conv's output
    // into its ReLU) and it keeps a buffer of its own.
    let tapped;
    let p = if taps.is_empty() {
        p
    } else {
        let mut q = p.clone();
        let g = q.graph.as_mut().ok_or("the model has no graph")?;
        for t in taps {
            if !g.output.iter().any(|o| &o.name == t) {
                g.output.push(proto::float_value_info(t, None));
            }
        }
        tapped = q;
        &tapped
    };
    let mut b = Builder::new(p, input_shape, precision, target)?;
    b.taps = taps.to_vec();
    if b.engine_float != DType::F32 {
        b.keep_fp32 = keep_fp32
            .iter()
            .map(|k| (k.node.clone(), k.clone()))
            .collect();
    }
    let gp = p.graph.as_ref().ok_or("the model has no graph")?;
    for i in 0..gp.node.len() {
        // Marked before lowering: a node lowered early (`lower_early`) or in progress is
        // never lowered twice.
        if !b.skip.insert(i) {
            continue;
        }
        b.node(i)?;
    }
    b.finish()
}

/// Every node of `p` the backend cannot take for `precision`, in graph order (empty when the
/// whole graph lowers). Nodes that only read a failed node's output are not listed again.
pub fn survey(
    p: &pb::ModelProto,
    input_shape: [usize; 4],
    precision: Precision,
) -> Result<Vec<Unsupported>, String> {
    let mut b = Builder::new(p, input_shape, precision, Target::default())?;
    let gp = p.graph.as_ref().ok_or("the model has no graph")?;
    let mut out = vec![];
    for i in 0..gp.node.len() {
        if !b.skip.insert(i) {
            continue;
        }
        if let Err(why) = b.node(i) {
            let n = b.g.node(i);
            out.push(Unsupported {
                node: n.name.clone(),
                op: n.op_type.clone(),
                why,
            });
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                b.values.insert(o.clone(), Value::Failed);
            }
        }
    }
    if out.is_empty()
        && let Err(why) = b.finish()
    {
        out.push(Unsupported {
            node: "(graph output)".into(),
            op: String::new(),
            why,
        });
    }
    Ok(out)
}

impl<'a> Builder<'a> {
    fn new(
        p: &'a pb::ModelProto,
        input_shape: [usize; 4],
        precision: Precision,
        target: Target,
    ) -> PlanResult<Builder<'a>> {
        let gp = p.graph.as_ref().ok_or("the model has no graph")?;
        let opset = p
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
            .unwrap_or(13);
        let mut b = Builder {
            model: p,
            opset,
            g: Graph::new(gp),
            float: float_type(precision),
            engine_float: float_type(precision),
            keep_fp32: HashMap::new(),
            casts: HashMap::new(),
            quant: match precision {
                Precision::Int8 => Some(DType::I8),
                Precision::Fp8 => Some(DType::F8),
                _ => None,
            },
            plan: Plan::default(),
            values: HashMap::new(),
            float_copies: HashMap::new(),
            converted: HashMap::new(),
            skip: HashSet::new(),
            target,
            taps: vec![],
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
            let dims: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
            let v = if let Some(f) = proto::tensor_f32(t) {
                Value::Const(f)
            } else if t.data_type == pb::tensor_proto::DataType::Int8 as i32 {
                let data = proto::tensor_i64(t)
                    .ok_or_else(|| format!("initializer `{}` unreadable", t.name))?
                    .into_iter()
                    .map(|v| v as i8)
                    .collect();
                Value::ConstI8 {
                    data,
                    dims,
                    scales: vec![],
                }
            } else if let Some(codes) = crate::quant::fp8::tensor_codes(t) {
                Value::ConstF8 {
                    codes,
                    dims,
                    scales: vec![],
                }
            } else if let Some(v) = proto::tensor_i64(t) {
                let host = Tensor::from_shape(&dims, &v)
                    .map_err(|e| format!("initializer `{}`: {e}", t.name))?;
                Value::Host(host)
            } else if let Some(v) = bool_data(t) {
                let host = Tensor::from_shape(&dims, &v)
                    .map_err(|e| format!("initializer `{}`: {e}", t.name))?;
                Value::Host(host)
            } else {
                // Types no op here reads (strings, complex): only an error if something uses it.
                continue;
            };
            b.values.insert(t.name.clone(), v);
        }
        Ok(b)
    }

    fn finish(mut self) -> PlanResult<Plan> {
        let gp = self.model.graph.as_ref().ok_or("the model has no graph")?;
        let out_name = &gp.output.first().ok_or("the graph has no output")?.name;
        let out = self.float_tensor_of(out_name, "output")?;
        self.plan.output = self.host_f32(out, out_name, "output")?;
        for name in std::mem::take(&mut self.taps) {
            let t = self.float_tensor_of(&name, "read for statistics")?;
            let tap = self.host_f32(t, &name, &format!("tap {name}"))?;
            self.plan.taps.push(tap);
        }
        crate::backend::cuda::plan::prune_dead(&mut self.plan);
        crate::backend::cuda::plan::fold_casts(&mut self.plan);
        crate::backend::cuda::plan::fold_pads_into_depthwise(&mut self.plan);
        if self.target.int8_mma {
            crate::backend::cuda::plan::fuse_global_pools_into_convs(&mut self.plan);
        }
        Ok(self.plan)
    }

    /// `t` as the host reads it: f32 in ONNX order, in a tensor of its own (not a view, not
    /// the input), converted where it is not.
    fn host_f32(&mut self, t: usize, name: &str, step: &str) -> PlanResult<usize> {
        let desc = self.plan.tensors[t].clone();
        let plain = self.to_layout(t, Layout::Plain, step)?;
        if self.plan.tensors[plain].dtype == DType::F32
            && (plain != t || desc.alias_of.is_none())
            && plain != self.plan.input
        {
            return Ok(plain);
        }
        let o = self.tensor(
            &format!("{name}.f32"),
            desc.shape.clone(),
            Layout::Plain,
            DType::F32,
            1.0,
        );
        self.plan.steps.push(Step::Unary {
            name: format!("{step}.cast"),
            input: plain,
            out: o,
            act: Act::None,
        });
        Ok(o)
    }

    /// Lowers node `i`: host evaluation when every input is a constant, else its family.
    fn node(&mut self, i: usize) -> PlanResult<()> {
        let n = self.g.node(i);
        let ins: Vec<&String> = n.input.iter().filter(|s| !s.is_empty()).collect();
        if ins
            .iter()
            .any(|s| matches!(self.values.get(*s), Some(Value::Failed)))
        {
            for o in &n.output {
                self.values.insert(o.clone(), Value::Failed);
            }
            return Ok(());
        }
        if shape::try_fold(self, n)? {
            return Ok(());
        }
        let family = family_of(&n.op_type).ok_or_else(|| {
            format!(
                "the CUDA backend has no kernel for op `{}` (node `{}`)",
                n.op_type, n.name
            )
        })?;
        // This node's float type; the one in force is restored after, as a node lowered early
        // from inside another's lowering (`lower_early`) returns to that node's.
        let kept = self.keep_fp32.get(&n.name).cloned();
        let outer = self.float;
        self.float = if kept.is_some() {
            DType::F32
        } else {
            self.engine_float
        };
        let lowered = (self.lowering_of(i, family))(self, i)
            .map_err(|e| if e.contains(&n.name) { e } else { err(n, e) });
        self.float = outer;
        if let Some(k) = kept {
            self.plan.fp32_layers.push(k);
        }
        lowered
    }

    /// How node `i` lowers: its family's `lower`, except where Gemm and MatMul cross families
    /// by what B is. Against a constant 2-D B they are linear layers, lowered by `conv`
    /// (cuBLASLt with its fused epilogue); between two computed tensors, products lowered by
    /// `matmul`. Decided here, once, so that neither family calls the other.
    fn lowering_of(
        &self,
        i: usize,
        family: &OpFamily,
    ) -> fn(&mut Builder<'_>, usize) -> PlanResult<()> {
        let n = self.g.node(i);
        match n.op_type.as_str() {
            "Gemm" if !self.is_const(&n.input[1]) => matmul::gemm_of_tensors,
            "MatMul"
                if self
                    .const_of(&n.input[1])
                    .is_some_and(|c| c.dims.len() == 2)
                    && !self.is_const(&n.input[0]) =>
            {
                conv::conv
            }
            _ => family.lower,
        }
    }

    pub(crate) fn tensor(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        layout: Layout,
        dtype: DType,
        scale: f32,
    ) -> usize {
        // Rank != 4 tensors are always plain; "NHWC" of them would be the same order.
        let layout = if shape.len() == 4 {
            layout
        } else {
            Layout::Plain
        };
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

    pub(crate) fn desc(&self, t: usize) -> &TensorDesc {
        &self.plan.tensors[t]
    }

    /// Whether `name` holds a build-time constant (float, int8, FP8 or host).
    pub(crate) fn is_const(&self, name: &str) -> bool {
        matches!(
            self.values.get(name),
            Some(Value::Const(_) | Value::ConstI8 { .. } | Value::ConstF8 { .. } | Value::Host(_))
        )
    }

    /// The device tensor for `name` as a reader that takes int8 sees it: the int8 source of a
    /// dequantized value (read with its scale, no float copy), else the float tensor.
    pub(crate) fn any_tensor_of(&mut self, name: &str, why: &str) -> PlanResult<usize> {
        if let Some(Value::Dequant { src, scale }) = self.values.get(name).cloned()
            && self.desc(src).scale == scale
        {
            return Ok(src);
        }
        self.float_tensor_of(name, why)
    }

    /// The float device tensor for `name` in the float type of the node being lowered: the
    /// host input converted on first use, int8 values dequantized on first use, constants
    /// materialized on the device, and a cast where an FP16 and an FP32 layer meet.
    pub(crate) fn float_tensor_of(&mut self, name: &str, why: &str) -> PlanResult<usize> {
        let t = self.any_float_tensor_of(name, why)?;
        Ok(self.in_float(t))
    }

    /// `t` as `self.float`: a cast (made once per tensor and type) where a layer the overflow
    /// guard keeps in FP32 reads an FP16 tensor, or an FP16 layer reads a kept one's output.
    pub(crate) fn in_float(&mut self, t: usize) -> usize {
        let d = self.desc(t).clone();
        if d.dtype == self.float || !matches!(d.dtype, DType::F16 | DType::F32) {
            return t;
        }
        if let Some(&c) = self.casts.get(&(t, self.float)) {
            return c;
        }
        let suffix = if self.float == DType::F32 {
            "f32"
        } else {
            "f16"
        };
        let o = self.tensor(
            &format!("{}.{suffix}", d.name),
            d.shape.clone(),
            d.layout,
            self.float,
            1.0,
        );
        self.plan.steps.push(Step::Unary {
            name: format!("{}.to_{suffix}", d.name),
            input: t,
            out: o,
            act: Act::None,
        });
        self.casts.insert((t, self.float), o);
        o
    }

    /// The float device tensor for `name` in whatever float type it was made.
    fn any_float_tensor_of(&mut self, name: &str, why: &str) -> PlanResult<usize> {
        match self.values.get(name).cloned() {
            Some(Value::Tensor(t)) => {
                if t == self.plan.input {
                    // The host input: f32 NCHW -> engine float type, NHWC.
                    if let Some(&c) = self.converted.get(&(t, true)) {
                        return Ok(c);
                    }
                    let d = self.desc(t).clone();
                    let o = self.tensor(
                        &format!("{name}.nhwc"),
                        d.shape.clone(),
                        Layout::Nhwc,
                        self.float,
                        1.0,
                    );
                    let step = self.view_step("input.to_nhwc", t, o, None, 0);
                    self.plan.steps.push(step);
                    self.converted.insert((t, true), o);
                    return Ok(o);
                }
                Ok(t)
            }
            _ if self.float_copies.contains_key(name) => Ok(self.float_copies[name]),
            Some(Value::Dequant { src, scale: _ }) => {
                let d = self.desc(src).clone();
                let o = self.tensor(name, d.shape.clone(), d.layout, self.float, 1.0);
                self.plan.steps.push(Step::Unary {
                    name: format!("{name}.dequantize"),
                    input: src,
                    out: o,
                    act: Act::None,
                });
                self.float_copies.insert(name.into(), o);
                Ok(o)
            }
            Some(
                Value::Const(_) | Value::Host(_) | Value::ConstI8 { .. } | Value::ConstF8 { .. },
            ) => {
                let c = self
                    .const_f32(name)
                    .ok_or_else(|| format!("constant `{name}` ({why}) has no float value"))?;
                let o = self.tensor(name, c.dims.clone(), Layout::Plain, self.float, 1.0);
                let d = self.desc(o).clone();
                let strides = vec![bcast_strides(&c.dims, &d)];
                self.plan.steps.push(Step::Nary {
                    name: format!("{name}.constant"),
                    op: EwOp::Copy,
                    inputs: vec![Operand::Const(c.data, c.dims)],
                    strides,
                    dims: stored_dims(&d),
                    out: o,
                    act: Act::None,
                });
                // The constant stays a constant for readers that take one (a shared weight).
                self.float_copies.insert(name.into(), o);
                Ok(o)
            }
            Some(Value::Failed) => Err(format!("tensor `{name}` ({why}) could not be computed")),
            None => Err(format!(
                "tensor `{name}` ({why}) is not produced by any node"
            )),
        }
    }

    /// The node's first input as a rank-4 float tensor in NHWC, with its description.
    pub(crate) fn nhwc_input(
        &mut self,
        n: &pb::NodeProto,
        what: &str,
    ) -> PlanResult<(usize, TensorDesc)> {
        let x = self.float_tensor_of(&n.input[0], &format!("{what} input"))?;
        let d = self.desc(x).clone();
        if d.shape.len() != 4 {
            return Err(err(
                n,
                format!(
                    "{what} takes rank-4 (NCHW) tensors here, not {:?} (only 2-D spatial ops are implemented)",
                    d.shape
                ),
            ));
        }
        let x = self.to_layout(x, Layout::Nhwc, what)?;
        Ok((x, self.desc(x).clone()))
    }

    /// A strided-copy step from `input` into `out`. With `src` None, out's logical index maps
    /// to the same logical index of the input (a layout change or dtype conversion); else
    /// `src` gives, for each *logical* output dim, the input element stride.
    pub(crate) fn view_step(
        &self,
        name: &str,
        input: usize,
        out: usize,
        src: Option<Vec<i64>>,
        offset: i64,
    ) -> Step {
        let (id, od) = (self.desc(input), self.desc(out));
        let logical = src.unwrap_or_else(|| logical_strides(id));
        let (dims, strides) = to_stored(od, &logical);
        Step::View {
            name: name.into(),
            input,
            out,
            dims,
            strides,
            offset,
        }
    }

    /// `t` in `layout`, inserting a conversion (NHWC <-> NCHW order) when needed.
    pub(crate) fn to_layout(&mut self, t: usize, layout: Layout, why: &str) -> PlanResult<usize> {
        let d = self.desc(t).clone();
        if d.layout == layout || d.shape.len() != 4 {
            return Ok(t);
        }
        let to_nhwc = layout == Layout::Nhwc;
        if let Some(&c) = self.converted.get(&(t, to_nhwc)) {
            return Ok(c);
        }
        let o = self.tensor(
            &format!("{}.{}", d.name, if to_nhwc { "nhwc" } else { "nchw" }),
            d.shape.clone(),
            layout,
            d.dtype,
            d.scale,
        );
        let step = self.view_step(&format!("{}.layout({why})", d.name), t, o, None, 0);
        self.plan.steps.push(step);
        self.converted.insert((t, to_nhwc), o);
        Ok(o)
    }

    /// The tensor `t` was converted from elementwise (a layout change, cast, quantize or
    /// dequantize, or a chain of them): a reader that converts as it reads can take that one
    /// and leave the copies without a reader (`prune_dead` then drops them).
    pub(crate) fn conversion_source(&self, mut t: usize) -> usize {
        loop {
            let from_layout = self
                .converted
                .iter()
                .find(|&(_, &o)| o == t)
                .map(|(&(src, _), _)| src);
            let from_unary = self.plan.steps.iter().find_map(|s| match s {
                Step::Unary {
                    input,
                    out,
                    act: Act::None,
                    ..
                } if *out == t
                    && self.desc(*input).shape == self.desc(t).shape
                    && self.desc(*input).layout == self.desc(t).layout =>
                {
                    Some(*input)
                }
                _ => None,
            });
            match from_layout.or(from_unary) {
                Some(src) => t = src,
                None => return t,
            }
        }
    }

    /// The float constant `name` (float, int8 dequantized, or host values cast to f32).
    pub(crate) fn const_f32(&self, name: &str) -> Option<proto::F32Tensor> {
        match self.values.get(name)? {
            Value::Const(c) => Some(c.clone()),
            Value::Host(t) => Some(proto::F32Tensor {
                dims: t.shape().to_vec(),
                data: host_values::<f32>(t)?,
            }),
            _ => None,
        }
    }

    /// A float constant that is stored as such (not a host value cast).
    pub(crate) fn const_of(&self, name: &str) -> Option<proto::F32Tensor> {
        match self.values.get(name) {
            Some(Value::Const(c)) => Some(c.clone()),
            _ => None,
        }
    }

    /// An integer constant (shapes, axes, pads, indices), flattened.
    pub(crate) fn ints_const(&self, name: &str) -> Option<Vec<i64>> {
        match self.values.get(name)? {
            Value::Host(t) => host_values::<i64>(t),
            Value::Const(c) => Some(c.data.iter().map(|&v| v as i64).collect()),
            Value::ConstI8 { data, .. } => Some(data.iter().map(|&v| v as i64).collect()),
            _ => None,
        }
    }

    /// Input `k` of `n` as integer constants, None when absent (empty name).
    pub(crate) fn ints_input(&self, n: &pb::NodeProto, k: usize) -> PlanResult<Option<Vec<i64>>> {
        match n.input.get(k).filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(s) => self
                .ints_const(s)
                .map(Some)
                .ok_or_else(|| err(n, format!("input {k} (`{s}`) must be a constant"))),
        }
    }

    /// Logical shape of value `name` (device tensor or constant).
    pub(crate) fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        match self.values.get(name)? {
            Value::Tensor(t) => Some(self.desc(*t).shape.clone()),
            Value::Dequant { src, .. } => Some(self.desc(*src).shape.clone()),
            Value::Const(c) => Some(c.dims.clone()),
            Value::ConstI8 { dims, .. } | Value::ConstF8 { dims, .. } => Some(dims.clone()),
            Value::Host(t) => Some(t.shape().to_vec()),
            Value::Failed => None,
        }
    }

    /// Adds `step`, whose output `o` is node `n`'s (first) output.
    pub(crate) fn emit(&mut self, n: &pb::NodeProto, o: usize, step: Step) -> PlanResult<()> {
        self.plan.steps.push(step);
        self.values.insert(n.output[0].clone(), Value::Tensor(o));
        Ok(())
    }

    /// Output `name` is a view of tensor `src` under `shape` (no copy): `src` must be plain.
    pub(crate) fn alias(&mut self, name: &str, src: usize, shape: Vec<usize>) -> usize {
        let sd = self.desc(src).clone();
        let root = sd.alias_of.unwrap_or(src);
        let o = self.tensor(name, shape, Layout::Plain, sd.dtype, sd.scale);
        self.plan.tensors[o].alias_of = Some(root);
        self.values.insert(name.into(), Value::Tensor(o));
        o
    }

    /// Lowers the producer of `name` ahead of node order when it is not lowered yet and its
    /// inputs are (recursively, `depth` producers deep); otherwise leaves it to the main loop.
    pub(crate) fn lower_early(&mut self, name: &str, depth: usize) -> PlanResult<()> {
        if depth == 0 || self.values.contains_key(name) {
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
            && n.input
                .iter()
                .all(|i| i.is_empty() || self.values.contains_key(i));
        if ready {
            // Marked first: the main loop must not lower it again.
            self.skip.insert(j);
            self.node(j)?;
        }
        Ok(())
    }

    /// The reader of `t` when exactly one node reads it and it is not a graph output.
    pub(crate) fn single_consumer(&self, t: &str) -> Option<usize> {
        let c = self.g.consumers(t);
        (c.len() == 1 && !self.g.is_graph_output(t)).then(|| c[0].0)
    }

    /// The Sigmoid and Mul nodes computing SiLU of `t` when they are `t`'s only two readers
    /// and `t` is not a graph output.
    fn silu_of(&self, t: &str) -> Option<(usize, usize)> {
        let c = self.g.consumers(t);
        if c.len() != 2 || self.g.is_graph_output(t) {
            return None;
        }
        c.iter().find_map(|&(si, _)| {
            let mi = elementwise::silu_mul(self, self.g.node(si))?;
            (!self.skip.contains(&si) && c.iter().any(|&(ci, _)| ci == mi)).then_some((si, mi))
        })
    }

    /// The activation node `i` computes, if it is one with constant parameters.
    pub(crate) fn act_of(&self, n: &pb::NodeProto) -> Option<Act> {
        elementwise::act_of(self, n)
    }

    /// Fuses the single activation reading `tname` (if any) into the step being built:
    /// returns the activation and the name the step's output takes. With `silu`, SiLU as
    /// PyTorch exports it, a Sigmoid and a Mul both reading `tname` (see
    /// `elementwise::silu_mul`), counts as one activation: EfficientNet's convs each end in
    /// one, and fused they write their output once (quantized, in an INT8 engine) instead of
    /// leaving a full float tensor for a separate SiLU pass.
    pub(crate) fn fuse_act(
        &mut self,
        tname: &str,
        fused: &mut Vec<String>,
        silu: bool,
    ) -> (Act, String) {
        if silu && let Some((si, mi)) = self.silu_of(tname) {
            self.skip.extend([si, mi]);
            fused.extend([self.g.node(si).name.clone(), self.g.node(mi).name.clone()]);
            return (Act::Silu, self.g.node(mi).output[0].clone());
        }
        if let Some(ci) = self.single_consumer(tname) {
            let c = self.g.node(ci);
            if !self.skip.contains(&ci)
                && let Some(act) = self.act_of(c)
                && act != Act::None
            {
                self.skip.insert(ci);
                fused.push(c.name.clone());
                return (act, c.output[0].clone());
            }
        }
        (Act::None, tname.into())
    }
}

/// Normalizes an ONNX axis of a rank-`r` tensor.
/// Explicit or automatic pads (top, left, bottom, right) of a 2-D window op.
pub(crate) fn conv_pads(
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

/// A 2-element spatial attribute (strides, dilations), default 1.
pub(crate) fn pair(n: &pb::NodeProto, name: &str) -> PlanResult<[usize; 2]> {
    let v = proto::attr_ints(n, name).unwrap_or(vec![1, 1]);
    if v.len() != 2 || v.iter().any(|&x| x < 1) {
        return Err(err(
            n,
            format!("`{name}` must be two positive values (only 2-D windows are implemented)"),
        ));
    }
    Ok([v[0] as usize, v[1] as usize])
}

pub(crate) fn axis(n: &pb::NodeProto, a: i64, r: usize) -> PlanResult<usize> {
    let v = if a < 0 { a + r as i64 } else { a };
    if (0..r as i64).contains(&v) {
        Ok(v as usize)
    } else {
        Err(err(n, format!("axis {a} is out of range for rank {r}")))
    }
}

/// Element strides of each *logical* (ONNX-order) dim of `d` in its storage.
pub(crate) fn logical_strides(d: &TensorDesc) -> Vec<i64> {
    let s = &d.shape;
    if d.layout == Layout::Nhwc && s.len() == 4 {
        let (c, h, w) = (s[1] as i64, s[2] as i64, s[3] as i64);
        vec![h * w * c, 1, w * c, c]
    } else {
        row_major(s)
    }
}

pub(crate) fn row_major(s: &[usize]) -> Vec<i64> {
    let mut st = vec![1i64; s.len()];
    for k in (0..s.len().saturating_sub(1)).rev() {
        st[k] = st[k + 1] * s[k + 1] as i64;
    }
    st
}

/// Storage order of `d`'s logical dims.
pub(crate) fn stored_order(d: &TensorDesc) -> Vec<usize> {
    if d.layout == Layout::Nhwc && d.shape.len() == 4 {
        vec![0, 2, 3, 1]
    } else {
        (0..d.shape.len()).collect()
    }
}

/// `d`'s dims in storage order.
pub(crate) fn stored_dims(d: &TensorDesc) -> Vec<usize> {
    stored_order(d).iter().map(|&k| d.shape[k]).collect()
}

/// Per-logical-dim strides `logical` of some source, reordered to `out`'s storage order.
pub(crate) fn to_stored(out: &TensorDesc, logical: &[i64]) -> (Vec<usize>, Vec<i64>) {
    let order = stored_order(out);
    (
        order.iter().map(|&k| out.shape[k]).collect(),
        order.iter().map(|&k| logical[k]).collect(),
    )
}

/// NumPy-broadcast strides of a plain row-major `dims` operand over `out`'s logical dims.
pub(crate) fn bcast_logical(dims: &[usize], strides: &[i64], out: &[usize]) -> Vec<i64> {
    let off = out.len() - dims.len();
    (0..out.len())
        .map(|k| {
            if k < off || dims[k - off] == 1 {
                0
            } else {
                strides[k - off]
            }
        })
        .collect()
}

/// Strides of a plain constant of `dims` over `out`'s stored dims.
pub(crate) fn bcast_strides(dims: &[usize], out: &TensorDesc) -> Vec<i64> {
    let logical = bcast_logical(dims, &row_major(dims), &out.shape);
    to_stored(out, &logical).1
}

/// NumPy broadcast of shapes, None when they do not broadcast.
pub(crate) fn broadcast_shape(shapes: &[Vec<usize>]) -> Option<Vec<usize>> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; r];
    for s in shapes {
        let off = r - s.len();
        for (k, &d) in s.iter().enumerate() {
            let o = &mut out[off + k];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    (r <= MAX_RANK).then_some(out)
}

/// A host tensor's values cast to `D`, flattened.
pub(crate) fn host_values<D: tract_onnx::prelude::Datum + Copy>(t: &Tensor) -> Option<Vec<D>> {
    let c = t.cast_to::<D>().ok()?;
    Some(c.to_plain_array_view::<D>().ok()?.iter().copied().collect())
}

/// Bool initializers (masks).
fn bool_data(t: &pb::TensorProto) -> Option<Vec<bool>> {
    (t.data_type == pb::tensor_proto::DataType::Bool as i32).then(|| {
        if t.raw_data.is_empty() {
            t.int32_data.iter().map(|&v| v != 0).collect()
        } else {
            t.raw_data.iter().map(|&v| v != 0).collect()
        }
    })
}

#[cfg(test)]
pub(crate) mod tests;
