//! The validation stage between decoding a model and everything that reads it: the graph is
//! well formed (every input produced, no cycles, outputs produced), every initializer holds the
//! bytes its shape declares and only finite values, and the ops we know have the inputs and
//! attributes they need. A model that passes cannot make our own code index out of range or
//! allocate from an unchecked size, and gives tract far fewer ways to panic; one that fails gets
//! a message naming the file, the node and what to do.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{self, tensor_proto::DataType};

use super::proto;

/// Largest rank an axis or permutation may refer to. Vision models stay well below it; an axis
/// of 255 would otherwise reach tract as an index.
pub const MAX_RANK: i64 = 8;

/// Largest tensor the loader accepts (elements), so sizes computed from a file never overflow.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 34;

/// One thing wrong with the model: the node (or tensor) and the reason, which says what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub node: String,
    pub op: String,
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.op.is_empty() {
            write!(f, "`{}`: {}", self.node, self.reason)
        } else {
            write!(f, "node `{}` ({}): {}", self.node, self.op, self.reason)
        }
    }
}

fn problem(n: &pb::NodeProto, reason: impl Into<String>) -> Problem {
    Problem {
        node: n.name.clone(),
        op: n.op_type.clone(),
        reason: reason.into(),
    }
}

/// Elements a tensor declares, or why its shape is unusable.
pub fn declared_elements(t: &pb::TensorProto) -> Result<u64, String> {
    let mut n: u64 = 1;
    for &d in &t.dims {
        if d < 0 {
            return Err(format!("dimension {d} is negative (shape {:?})", t.dims));
        }
        n = n
            .checked_mul(d as u64)
            .filter(|&n| n <= MAX_TENSOR_ELEMENTS)
            .ok_or_else(|| format!("shape {:?} is too large", t.dims))?;
    }
    Ok(n)
}

/// Checks an initializer: the data present matches the declared shape, and float data is
/// finite. Runs before anything decodes the tensor.
pub fn check_tensor(t: &pb::TensorProto) -> Result<(), String> {
    let n = declared_elements(t)?;
    let ty = DataType::try_from(t.data_type).map_err(|_| {
        format!(
            "unknown element type {}; re-export the model with a standard ONNX type",
            t.data_type
        )
    })?;
    let elem_bytes: u64 = match ty {
        DataType::Float | DataType::Int32 | DataType::Uint32 => 4,
        DataType::Double | DataType::Int64 | DataType::Uint64 | DataType::Complex64 => 8,
        DataType::Float16 | DataType::Bfloat16 | DataType::Int16 | DataType::Uint16 => 2,
        DataType::Int8 | DataType::Uint8 | DataType::Bool => 1,
        DataType::String => 0,
        // float8e4m3fn: a pre-quantized FP8 Q/DQ model (modelopt's, or quantscope's own FP8
        // export), which its FP8 row runs with its own scales.
        DataType::Float8e4m3fn => 1,
        // e4m3fnuz, e5m2, e5m2fnuz: FP8 formats no engine here runs.
        _ if (18..=20).contains(&t.data_type) => {
            return Err(
                "float8 initializers other than float8e4m3fn (e4m3fnuz, e5m2): an FP8 Q/DQ \
                 model in a format TensorRT's FP8 and quantscope do not run; export it with \
                 float8e4m3fn, or load the float model and choose the fp8 precision"
                    .into(),
            );
        }
        _ => {
            return Err(format!(
                "element type {} is not supported in initializers",
                proto::data_type_name(t.data_type)
            ));
        }
    };
    let uses_external = t.data_location == Some(pb::tensor_proto::DataLocation::External as i32);
    if uses_external {
        // Inlined before validation; one left here could not be read.
        return Err("external data was not inlined".into());
    }
    let present = if !t.raw_data.is_empty() {
        let want = n * elem_bytes;
        if t.raw_data.len() as u64 != want {
            return Err(format!(
                "declares shape {:?} ({want} bytes) but holds {} bytes: the file is damaged or was cut short; re-export it",
                t.dims,
                t.raw_data.len()
            ));
        }
        n
    } else {
        let typed = match ty {
            DataType::Float => t.float_data.len(),
            DataType::Double => t.double_data.len(),
            DataType::Int64 => t.int64_data.len(),
            DataType::Uint32 | DataType::Uint64 => t.uint64_data.len(),
            DataType::String => t.string_data.len(),
            DataType::Complex64 => t.float_data.len() / 2,
            _ => t.int32_data.len(),
        } as u64;
        if typed != n {
            return Err(format!(
                "declares shape {:?} ({n} values) but holds {typed}: the file is damaged; re-export it",
                t.dims
            ));
        }
        n
    };
    if present > 0 && matches!(ty, DataType::Float | DataType::Double | DataType::Float16) {
        let values = proto::tensor_f32(t).ok_or("float data cannot be decoded")?;
        if let Some((i, v)) = values.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            let bad = values.data.iter().filter(|v| !v.is_finite()).count();
            return Err(format!(
                "holds {bad} non-finite value(s) (first: {v} at index {i}); the weights are corrupt or the training diverged"
            ));
        }
    }
    Ok(())
}

/// (fewest, most) inputs of the ops we know; `usize::MAX` for variadic. Inputs below the
/// fewest must be named (not empty).
fn arity(op: &str, opset: i64) -> Option<(usize, usize)> {
    const MANY: usize = usize::MAX;
    Some(match op {
        "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Neg" | "Abs" | "Reciprocal"
        | "Erf" | "Softplus" | "Softsign" | "Identity" | "Floor" | "Ceil" | "Round" | "Not"
        | "Sign" | "HardSwish" | "HardSigmoid" | "LeakyRelu" | "Elu" | "Selu" | "Celu" | "Mish"
        | "Gelu" | "Flatten" | "Transpose" | "Softmax" | "LogSoftmax" | "Hardmax"
        | "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" | "Shape" | "Size" | "Cast"
        | "MaxPool" | "AveragePool" | "LpPool" | "LpNormalization" | "DepthToSpace"
        | "SpaceToDepth" | "ArgMax" | "ArgMin" | "NonZero" | "ConstantOfShape" | "Sin" | "Cos"
        | "IsNaN" | "IsInf" | "LRN" => (1, 1),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "LessOrEqual"
        | "GreaterOrEqual" | "And" | "Or" | "Xor" | "MatMul" | "PRelu" | "Expand" | "Tile"
        | "Gather" | "GatherElements" | "GatherND" | "Mod" | "BitShift" => (2, 2),
        "Reshape" if opset >= 5 => (2, 2),
        "Max" | "Min" | "Sum" | "Mean" | "Concat" | "Einsum" => (1, MANY),
        "Conv" | "ConvTranspose" | "Gemm" => (2, 3),
        "BatchNormalization" => (5, 5),
        "InstanceNormalization" | "GroupNormalization" | "Where" | "Range" => (3, 3),
        "LayerNormalization" => (2, 3),
        "Clip" => (1, 3),
        "Dropout" => (1, 3),
        "Resize" => (1, 4),
        "Upsample" => (1, 2),
        "Pad" if opset >= 11 => (2, 4),
        "Slice" if opset >= 10 => (3, 5),
        "Split" | "Squeeze" | "Unsqueeze" | "ReduceMean" | "ReduceSum" | "ReduceMax"
        | "ReduceMin" | "ReduceL2" | "ReduceL1" | "ReduceProd" | "ReduceSumSquare"
        | "ReduceLogSumExp" | "TopK" => (1, 2),
        "QuantizeLinear" | "DequantizeLinear" => (2, 3),
        "MatMulInteger" | "ConvInteger" => (2, 4),
        "QLinearConv" => (8, 9),
        "QLinearMatMul" => (8, 8),
        _ => return None,
    })
}

/// The input positions of `op` that hold integers (shapes, axes, pads, indices, steps).
fn integer_inputs(op: &str) -> &'static [usize] {
    match op {
        "Reshape" | "Expand" | "Tile" | "Split" | "Squeeze" | "Unsqueeze" | "TopK"
        | "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL2" | "ReduceL1"
        | "ReduceProd" | "ReduceSumSquare" | "ReduceLogSumExp" | "Pad" => &[1],
        "Slice" => &[1, 2, 3, 4],
        "ConstantOfShape" => &[0],
        _ => &[],
    }
}

/// What the graph already tells about a tensor's rank (graph inputs and value_info).
fn known_ranks(g: &pb::GraphProto) -> HashMap<&str, i64> {
    g.input
        .iter()
        .chain(&g.value_info)
        .chain(&g.output)
        .filter_map(|v| {
            proto::value_info_shape(v)
                .filter(|s| !s.is_empty())
                .map(|s| (v.name.as_str(), s.len() as i64))
        })
        .chain(
            g.initializer
                .iter()
                .map(|t| (t.name.as_str(), t.dims.len() as i64)),
        )
        .collect()
}

/// Per-op checks on attributes and constant inputs.
fn check_node(
    n: &pb::NodeProto,
    opset: i64,
    inits: &HashMap<&str, &pb::TensorProto>,
    ranks: &HashMap<&str, i64>,
    channels: &HashMap<&str, i64>,
) -> Result<(), Problem> {
    // Other domains are reported unsupported later, but tract still reads such a node by its
    // op type while inferring shapes: the same checks keep it from panicking there.
    let op = n.op_type.as_str();
    if n.output.iter().all(|o| o.is_empty()) {
        return Err(problem(n, "has no output"));
    }
    if let Some((fewest, most)) = arity(op, opset) {
        let given = n.input.len();
        if given < fewest || given > most {
            let range = match most {
                usize::MAX => format!("at least {fewest}"),
                m if m == fewest => format!("{fewest}"),
                m => format!("{fewest} to {m}"),
            };
            return Err(problem(
                n,
                format!(
                    "takes {range} input(s) but has {given}: the graph is malformed; re-export the model"
                ),
            ));
        }
        if let Some(i) = n.input.iter().take(fewest).position(|s| s.is_empty()) {
            return Err(problem(n, format!("required input {i} is empty")));
        }
    }
    // Inputs that must be integer tensors (shapes, axes, indices, steps): a float weight there
    // (a mislabelled node) would be read as sizes.
    for &i in integer_inputs(op) {
        if let Some(t) = n.input.get(i).and_then(|s| inits.get(s.as_str())) {
            let Some(values) = proto::tensor_i64(t) else {
                return Err(problem(
                    n,
                    format!(
                        "input {i} (`{}`) must be an integer tensor, not {}",
                        t.name,
                        proto::data_type_name(t.data_type)
                    ),
                ));
            };
            if op == "Slice" && i == 4 && values.contains(&0) {
                return Err(problem(n, format!("a step of 0 in `{}`", t.name)));
            }
        }
    }
    if op == "Resize" && (11..13).contains(&opset) {
        // Opsets 11 and 12 take roi and scales by position: an empty name there shifts them.
        if n.input.len() < 3 || n.input[1].is_empty() || n.input[2].is_empty() {
            return Err(problem(
                n,
                "at opset 11 and 12 Resize needs named roi and scales inputs (empty tensors are \
                 fine, empty names are not); re-export at opset 13",
            ));
        }
    }
    let rank_of = |i: usize| n.input.get(i).and_then(|s| ranks.get(s.as_str())).copied();
    let axis_ok = |axis: i64, rank: Option<i64>| {
        let r = rank.unwrap_or(MAX_RANK);
        (-r..r).contains(&axis)
    };
    // Single `axis` attributes: Softmax, Concat, Gather, Flatten (which allows axis == rank).
    if let Some(axis) = proto::attr_i(n, "axis")
        && !matches!(op, "QuantizeLinear" | "DequantizeLinear")
    {
        let rank = rank_of(0).map(|r| if op == "Flatten" { r + 1 } else { r });
        if !axis_ok(axis, rank) {
            return Err(problem(
                n,
                format!(
                    "axis {axis} is out of range for a rank-{} input",
                    rank.map(|r| r.to_string())
                        .unwrap_or_else(|| format!("≤{MAX_RANK}"))
                ),
            ));
        }
    }
    if let Some(axes) = proto::attr_ints(n, "axes")
        && let Some(a) = axes.iter().find(|&&a| !axis_ok(a, None))
    {
        return Err(problem(n, format!("axis {a} in `axes` is out of range")));
    }
    match op {
        "Transpose" => {
            if let Some(perm) = proto::attr_ints(n, "perm") {
                let len = perm.len() as i64;
                let mut seen = HashSet::new();
                let is_perm = len <= MAX_RANK
                    && perm
                        .iter()
                        .all(|&p| (0..len).contains(&p) && seen.insert(p))
                    && rank_of(0).is_none_or(|r| r == len);
                if !is_perm {
                    return Err(problem(
                        n,
                        format!("perm {perm:?} is not a permutation of the input's axes"),
                    ));
                }
            }
        }
        "Conv" | "ConvTranspose" => {
            check_conv(n, inits)?;
            check_products(n, inits)?;
        }
        "Gemm" | "MatMul" => check_products(n, inits)?,
        "BatchNormalization" => check_batch_norm(n, inits, channels)?,
        "Resize" => {
            // Opset 10: X, scales. Opset 11+: X, roi, scales, sizes (one of the last two).
            let has = |i: usize| n.input.get(i).is_some_and(|s| !s.is_empty());
            let ok = if opset < 11 { has(1) } else { has(2) || has(3) };
            if !ok {
                return Err(problem(
                    n,
                    "has neither scales nor sizes: the output size is undefined; re-export the model",
                ));
            }
        }
        "Pad" if opset < 11 => {
            if proto::attr_ints(n, "pads").is_none() {
                return Err(problem(n, "has no `pads` attribute"));
            }
        }
        "MaxPool" | "AveragePool" => {
            let k = proto::attr_ints(n, "kernel_shape").unwrap_or_default();
            if k.is_empty() || k.iter().any(|&v| v < 1) {
                return Err(problem(n, format!("kernel_shape {k:?} is invalid")));
            }
            check_window(n, k.len())?;
        }
        _ => {}
    }
    Ok(())
}

/// strides, dilations ≥ 1 and pads ≥ 0, of the lengths the spatial rank asks for.
fn check_window(n: &pb::NodeProto, spatial: usize) -> Result<(), Problem> {
    for (name, min, len) in [
        ("strides", 1, spatial),
        ("dilations", 1, spatial),
        ("pads", 0, 2 * spatial),
    ] {
        if let Some(v) = proto::attr_ints(n, name)
            && (v.len() != len || v.iter().any(|&x| x < min || x > 1 << 16))
        {
            return Err(problem(
                n,
                format!("`{name}` {v:?} is invalid for {spatial} spatial axes"),
            ));
        }
    }
    Ok(())
}

fn check_conv(n: &pb::NodeProto, inits: &HashMap<&str, &pb::TensorProto>) -> Result<(), Problem> {
    let group = proto::attr_i(n, "group").unwrap_or(1);
    if group < 1 {
        return Err(problem(n, format!("group {group} must be ≥ 1")));
    }
    let Some(w) = n.input.get(1).and_then(|w| inits.get(w.as_str())) else {
        return Ok(()); // weights computed at run time: tract checks them
    };
    if w.dims.len() < 3 {
        return Err(problem(
            n,
            format!(
                "weight `{}` has shape {:?}; a convolution weight has rank ≥ 3",
                w.name, w.dims
            ),
        ));
    }
    let spatial = w.dims.len() - 2;
    // Conv: [M, C/group, k...], M divisible by group. ConvTranspose: [C, M/group, k...].
    let outer = w.dims[0];
    if n.op_type == "Conv" && (outer == 0 || outer % group != 0) {
        return Err(problem(
            n,
            format!(
                "{outer} output channels are not divisible by group {group} (weight `{}`)",
                w.name
            ),
        ));
    }
    if let Some(k) = proto::attr_ints(n, "kernel_shape")
        && k.as_slice() != &w.dims[2..]
    {
        return Err(problem(
            n,
            format!(
                "kernel_shape {k:?} disagrees with weight `{}` of shape {:?}",
                w.name, w.dims
            ),
        ));
    }
    check_window(n, spatial)?;
    let out_channels = if n.op_type == "Conv" {
        outer
    } else {
        w.dims[1] * group
    };
    if let Some(b) = n
        .input
        .get(2)
        .filter(|b| !b.is_empty())
        .and_then(|b| inits.get(b.as_str()))
        && (b.dims.len() != 1 || b.dims[0] != out_channels)
    {
        return Err(problem(
            n,
            format!(
                "bias `{}` has shape {:?}, expected [{out_channels}]",
                b.name, b.dims
            ),
        ));
    }
    Ok(())
}

/// The largest activation magnitude a weight's products are checked against. Real networks stay
/// orders of magnitude below it; a product beyond f32's range at this input is an Inf waiting.
const ACTIVATION_BOUND: f64 = 1e4;

/// Refuses constant weights whose products with an ordinary activation overflow float32: a
/// finite 1e38 passes every finiteness check and still turns every output into Inf/NaN. The
/// bound takes the tensor's element count as the (over-)estimate of the sum's length.
fn check_products(
    n: &pb::NodeProto,
    inits: &HashMap<&str, &pb::TensorProto>,
) -> Result<(), Problem> {
    for name in n.input.iter().take(2) {
        let Some(t) = inits.get(name.as_str()) else {
            continue;
        };
        let Some(values) = proto::tensor_f32(t) else {
            continue;
        };
        let Some((i, v)) = values
            .data
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        else {
            continue;
        };
        let worst = v.abs() as f64 * values.data.len() as f64 * ACTIVATION_BOUND;
        if worst > f32::MAX as f64 {
            return Err(problem(
                n,
                format!(
                    "weight `{}` holds {v:e} at index {i}: its products with the input overflow float32 (outputs would be Inf/NaN); the weights are corrupt or mis-scaled",
                    t.name
                ),
            ));
        }
    }
    Ok(())
}

/// The channel count of each Conv output whose weight is a constant (`[M, C/group, k...]`).
fn conv_channels<'a>(
    g: &'a pb::GraphProto,
    inits: &HashMap<&str, &pb::TensorProto>,
) -> HashMap<&'a str, i64> {
    g.node
        .iter()
        .filter(|n| n.op_type == "Conv")
        .filter_map(|n| {
            let w = inits.get(n.input.get(1)?.as_str())?;
            Some((n.output.first()?.as_str(), *w.dims.first()?))
        })
        .collect()
}

fn check_batch_norm(
    n: &pb::NodeProto,
    inits: &HashMap<&str, &pb::TensorProto>,
    channels: &HashMap<&str, i64>,
) -> Result<(), Problem> {
    if let Some(eps) = proto::attr_f(n, "epsilon")
        && !(eps.is_finite() && eps >= 0.0)
    {
        return Err(problem(n, format!("epsilon {eps} must be finite and ≥ 0")));
    }
    let params: Vec<&pb::TensorProto> = n.input[1..5]
        .iter()
        .filter_map(|s| inits.get(s.as_str()).copied())
        .collect();
    if params.len() < 4 {
        return Ok(()); // computed at run time: nothing to fold, tract checks it
    }
    let len = |t: &pb::TensorProto| (t.dims.len() == 1).then(|| t.dims[0]);
    let lens: Vec<Option<i64>> = params.iter().map(|t| len(t)).collect();
    if lens.iter().any(|l| l.is_none()) || lens.windows(2).any(|w| w[0] != w[1]) {
        let shapes: Vec<String> = params
            .iter()
            .map(|t| format!("`{}` {:?}", t.name, t.dims))
            .collect();
        return Err(problem(
            n,
            format!(
                "scale, bias, mean and variance must be 1-D of one length, got {}",
                shapes.join(", ")
            ),
        ));
    }
    if let (Some(Some(len)), Some(&c)) = (lens.first(), channels.get(n.input[0].as_str()))
        && *len != c
    {
        return Err(problem(
            n,
            format!(
                "scale, bias, mean and variance hold {len} values but the conv before it makes {c} channels; the file is damaged or was edited: re-export it"
            ),
        ));
    }
    if let Some(var) = proto::tensor_f32(params[3])
        && let Some((c, v)) = var.data.iter().enumerate().find(|(_, v)| **v < 0.0)
    {
        return Err(problem(
            n,
            format!(
                "variance `{}` is negative ({v}) at channel {c}: the statistics are corrupt",
                params[3].name
            ),
        ));
    }
    // Folding divides the scale by sqrt(variance + epsilon): zero there, or a quotient beyond
    // f32, is an Inf in every output of that channel.
    let eps = proto::attr_f(n, "epsilon").unwrap_or(1e-5);
    if let (Some(scale), Some(var)) = (proto::tensor_f32(params[0]), proto::tensor_f32(params[3]))
        && let Some((c, (g, v))) = scale
            .data
            .iter()
            .zip(&var.data)
            .enumerate()
            .find(|(_, (g, v))| !(**g / (**v + eps).sqrt()).is_finite())
    {
        return Err(problem(
            n,
            format!(
                "folding divides by zero at channel {c}: scale {g}, variance `{}` {v}, epsilon {eps} give scale / sqrt(variance + epsilon) = {}; give the layer a positive variance or epsilon",
                params[3].name,
                g / (v + eps).sqrt()
            ),
        ));
    }
    Ok(())
}

/// Checks the whole graph and puts its nodes in topological order (the order ONNX requires and
/// every later stage assumes). Returns every problem found, in node order.
pub fn validate(g: &mut pb::GraphProto, opset: i64) -> Vec<Problem> {
    let mut problems = vec![];
    for t in &g.initializer {
        if let Err(reason) = check_tensor(t) {
            problems.push(Problem {
                node: t.name.clone(),
                op: String::new(),
                reason: format!("initializer: {reason}"),
            });
        }
    }
    if !problems.is_empty() {
        // Per-node checks decode initializers: only once those are sound.
        return problems;
    }
    // Trailing empty inputs mean "not given" (ONNX allows both spellings); tract expects them
    // left out.
    for n in g.node.iter_mut() {
        while n.input.last().is_some_and(|s| s.is_empty()) {
            n.input.pop();
        }
    }
    let inits: HashMap<&str, &pb::TensorProto> =
        g.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
    let ranks = known_ranks(g);
    let channels = conv_channels(g, &inits);
    for n in &g.node {
        if let Err(p) = check_node(n, opset, &inits, &ranks, &channels) {
            problems.push(p);
        }
    }
    problems.extend(structure(g));
    problems
}

/// Every input is produced, no tensor has two producers, no cycles, every output is produced.
/// Reorders the nodes topologically when the graph is sound.
fn structure(g: &mut pb::GraphProto) -> Vec<Problem> {
    let mut problems = vec![];
    let available: HashSet<&str> = g
        .input
        .iter()
        .map(|i| i.name.as_str())
        .chain(g.initializer.iter().map(|t| t.name.as_str()))
        .collect();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if available.contains(o.as_str()) || producer.insert(o.as_str(), i).is_some() {
                problems.push(problem(
                    n,
                    format!("output `{o}` is also produced elsewhere (another node, an input or an initializer)"),
                ));
            }
        }
    }
    // Kahn's algorithm over node → node edges.
    let mut pending = vec![0usize; g.node.len()];
    let mut users: Vec<Vec<usize>> = vec![vec![]; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            match producer.get(inp.as_str()) {
                Some(&p) => {
                    pending[i] += 1;
                    users[p].push(i);
                }
                None if available.contains(inp.as_str()) => {}
                None => problems.push(problem(
                    n,
                    format!(
                        "reads `{inp}`, which no node produces and which is neither an initializer nor a graph input: the graph is malformed; re-export the model"
                    ),
                )),
            }
        }
    }
    for o in &g.output {
        if !producer.contains_key(o.name.as_str()) && !available.contains(o.name.as_str()) {
            problems.push(Problem {
                node: o.name.clone(),
                op: String::new(),
                reason: "graph output that no node produces: the graph is malformed; re-export the model".into(),
            });
        }
    }
    let mut ready: Vec<usize> = (0..g.node.len()).filter(|&i| pending[i] == 0).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for &u in users[i].iter().rev() {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(u);
            }
        }
    }
    if order.len() < g.node.len() {
        let stuck = (0..g.node.len()).find(|&i| pending[i] > 0).unwrap_or(0);
        problems.push(problem(
            &g.node[stuck],
            "is part of a cycle: ONNX graphs must be acyclic; re-export the model",
        ));
    }
    if problems.is_empty() {
        let mut nodes: Vec<Option<pb::NodeProto>> =
            std::mem::take(&mut g.node).into_iter().map(Some).collect();
        g.node = order.into_iter().filter_map(|i| nodes[i].take()).collect();
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::residual_classifier;

    fn set_f32(t: &mut pb::TensorProto, i: usize, v: f32) {
        t.raw_data[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn problems_of(edit: impl FnOnce(&mut pb::GraphProto)) -> Vec<Problem> {
        let mut g = residual_classifier(4).graph;
        edit(&mut g);
        validate(&mut g, 13)
    }

    #[test]
    fn a_sound_graph_passes_and_stays_in_order() {
        assert_eq!(problems_of(|_| {}), vec![]);
    }

    #[test]
    fn nodes_out_of_order_are_sorted() {
        let mut g = residual_classifier(4).graph;
        g.node.reverse();
        assert_eq!(validate(&mut g, 13), vec![]);
        assert_eq!(g.node[0].name, "stem");
    }

    #[test]
    fn each_bug_class_is_named() {
        let cases: Vec<(&str, Box<dyn FnOnce(&mut pb::GraphProto)>)> = vec![
            (
                "no node produces",
                Box::new(|g| g.output[0].name = "nowhere".into()),
            ),
            (
                "part of a cycle",
                Box::new(|g| g.node[1].input[0] = "block.add.out".into()),
            ),
            ("takes 1 input", Box::new(|g| g.node[2].input.clear())),
            (
                "axis 255",
                Box::new(|g| {
                    let n = g
                        .node
                        .iter_mut()
                        .find(|n| n.op_type == "Flatten")
                        .expect("flatten");
                    n.attribute.push(proto::int_attr("axis", 255));
                }),
            ),
            (
                "not a permutation",
                Box::new(|g| {
                    g.node.push(proto::node(
                        "Transpose",
                        "t",
                        &["fc.out"],
                        &["t.out"],
                        vec![proto::ints_attr("perm", &[0, 0])],
                    ))
                }),
            ),
            (
                "non-finite",
                Box::new(|g| {
                    let t = g
                        .initializer
                        .iter_mut()
                        .find(|t| t.name == "fc.w")
                        .expect("fc.w");
                    set_f32(t, 3, f32::NAN);
                }),
            ),
            (
                "variance",
                Box::new(|g| {
                    let t = g
                        .initializer
                        .iter_mut()
                        .find(|t| t.name == "stem.bn.v")
                        .expect("var");
                    set_f32(t, 0, -1.0);
                }),
            ),
            (
                "one length",
                Box::new(|g| {
                    let t = g
                        .initializer
                        .iter_mut()
                        .find(|t| t.name == "stem.bn.m")
                        .expect("mean");
                    t.raw_data.truncate(12);
                    t.dims = vec![3];
                }),
            ),
            (
                "holds 8 bytes",
                Box::new(|g| {
                    let t = g
                        .initializer
                        .iter_mut()
                        .find(|t| t.name == "fc.b")
                        .expect("fc.b");
                    t.raw_data.truncate(8);
                }),
            ),
            (
                "too large",
                Box::new(|g| {
                    let t = g
                        .initializer
                        .iter_mut()
                        .find(|t| t.name == "fc.b")
                        .expect("fc.b");
                    t.dims = vec![1 << 40, 1 << 40];
                }),
            ),
            (
                "not divisible by group",
                Box::new(|g| g.node[0].attribute.push(proto::int_attr("group", 3))),
            ),
        ];
        for (want, edit) in cases {
            let p = problems_of(edit);
            assert!(
                p.iter().any(|p| p.to_string().contains(want)),
                "expected a problem containing `{want}`, got {p:?}"
            );
        }
    }

    #[test]
    fn resize_without_scales_or_sizes_is_refused() {
        let p = problems_of(|g| {
            g.node
                .push(proto::node("Resize", "r", &["fc.out"], &["r.out"], vec![]));
        });
        assert!(
            p.iter()
                .any(|p| p.reason.contains("neither scales nor sizes")),
            "{p:?}"
        );
    }
}
