//! Pre-quantized models as other tools write them (PyTorch's eager-mode export, ONNX Runtime's
//! `quantize_static`, modelopt), normalised at load into the one Q/DQ form quantscope's engines
//! and TensorRT's strongly typed builder take: what a TensorRT user otherwise repairs by hand.
//!
//! Every rewrite here is exact (the graph computes the same values), so the model keeps its own
//! scales and nothing is calibrated again:
//! 1. constant subgraphs feeding Q/DQ (`ConstantOfShape` → `Cast` zero points) fold to
//!    initializers, and a `Cast` to the type a tensor already has goes;
//! 2. uint8 with zero point 128 becomes int8 with zero point 0 and the same scale
//!    (`q_u8 - 128 = q_i8` on every value, saturation included); other zero points are kept
//!    and named, since they have no symmetric int8 equivalent;
//! 3. a float weight behind a `QuantizeLinear` (modelopt's form) becomes the int8 constant
//!    that node computes, and an int32 bias behind a `DequantizeLinear` becomes the float bias
//!    it stands for (TensorRT takes float biases and requantizes them itself);
//! 4. an activation `DequantizeLinear` read by several nodes is copied, one per reader, so each
//!    reader has its own to fuse (TensorRT's Q/DQ placement rule).

use std::collections::{HashMap, HashSet};

use tract_onnx::pb::{self, tensor_proto::DataType};

use super::proto;

/// Folded constants larger than this are left alone: zero points and biases are small, and a
/// big computed constant is not what this pass is for.
const MAX_FOLD_ELEMENTS: usize = 1 << 22;

/// What one load changed (one line per kind of rewrite, with a count and an example node) and
/// what it kept that an engine may refuse. Empty for a model without Q/DQ.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normalized {
    pub rewrites: Vec<String>,
    pub kept: Vec<String>,
}

/// Normalises `graph`'s Q/DQ in place (see the module comment). Does nothing to a model
/// without QuantizeLinear/DequantizeLinear.
pub fn normalize(graph: &mut pb::GraphProto) -> Normalized {
    let mut out = Normalized::default();
    if !graph
        .node
        .iter()
        .any(|n| n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear")
    {
        return out;
    }
    // Each pass in order, with the line `inspect` prints when it changed something.
    let kept;
    {
        let mut note = |nodes: Vec<String>, what: &str| {
            if !nodes.is_empty() {
                out.rewrites
                    .push(format!("{} {what} (e.g. `{}`)", nodes.len(), nodes[0]));
            }
        };
        note(
            fold_constants(graph),
            "constant Cast/ConstantOfShape nodes folded into initializers (the zero points and biases PyTorch computes in the graph)",
        );
        note(
            drop_identity_casts(graph),
            "Cast nodes dropped: they cast a quantized tensor to the type it already has",
        );
        let (signed, asymmetric) = uint8_to_int8(graph);
        kept = asymmetric;
        note(
            signed,
            "uint8 Q/DQ with zero point 128 made int8 with zero point 0, same scale (exact)",
        );
        note(
            fold_weight_quantize(graph),
            "QuantizeLinear nodes of float weights folded into int8 weights (exact: the same rounding), so each weight is an int8 constant behind its DequantizeLinear",
        );
        note(
            fold_bias_dequantize(graph),
            "int32 biases behind DequantizeLinear folded into float biases (exact: value × scale)",
        );
        note(
            one_dequantize_per_reader(graph),
            "activation DequantizeLinear nodes read by several nodes copied, one per reader, so each reader fuses its own",
        );
    }
    out.kept = kept_line(&kept).into_iter().collect();
    // Folding and rewriting leave initializers nothing reads.
    super::drop_unused_initializers(graph);
    out
}

/// An initializer's values, whole: integers or floats.
#[derive(Clone, Debug, PartialEq)]
enum Values {
    Ints(Vec<i64>),
    Floats(Vec<f32>),
}

impl Values {
    fn read(t: &pb::TensorProto) -> Option<Values> {
        proto::tensor_i64(t)
            .map(Values::Ints)
            .or_else(|| proto::tensor_f32(t).map(|f| Values::Floats(f.data)))
    }

    /// The tensor of `data_type` holding these values, when each one fits that type exactly.
    fn write(&self, name: &str, dims: &[usize], data_type: i32) -> Option<pb::TensorProto> {
        let ints = |lo: i64, hi: i64| -> Option<Vec<i64>> {
            match self {
                Values::Ints(v) => v.iter().all(|x| (lo..=hi).contains(x)).then(|| v.clone()),
                // A float cast to an integer truncates; only whole values in range are exact.
                Values::Floats(v) => v
                    .iter()
                    .map(|&x| {
                        (x.fract() == 0.0 && (lo as f32..=hi as f32).contains(&x))
                            .then_some(x as i64)
                    })
                    .collect(),
            }
        };
        Some(match DataType::try_from(data_type).ok()? {
            DataType::Float => {
                let f: Vec<f32> = match self {
                    Values::Ints(v) => v.iter().map(|&x| x as f32).collect(),
                    Values::Floats(v) => v.clone(),
                };
                proto::f32_tensor(name, dims, &f)
            }
            DataType::Int8 => {
                let v = ints(i8::MIN as i64, i8::MAX as i64)?;
                proto::i8_tensor(name, dims, &v.iter().map(|&x| x as i8).collect::<Vec<_>>())
            }
            DataType::Uint8 => {
                let v = ints(0, u8::MAX as i64)?;
                proto::u8_tensor(name, dims, &v.iter().map(|&x| x as u8).collect::<Vec<_>>())
            }
            DataType::Int32 => {
                let v = ints(i32::MIN as i64, i32::MAX as i64)?;
                proto::i32_tensor(name, dims, &v.iter().map(|&x| x as i32).collect::<Vec<_>>())
            }
            DataType::Int64 => proto::i64_tensor(name, dims, &ints(i64::MIN, i64::MAX)?),
            _ => return None,
        })
    }
}

fn dims_of(t: &pb::TensorProto) -> Vec<usize> {
    t.dims.iter().map(|&d| d.max(0) as usize).collect()
}

/// Folds `Cast`, `ConstantOfShape` and `Identity` nodes whose inputs are all initializers,
/// repeatedly (PyTorch writes `ConstantOfShape → Cast` for a bias's zero point). Returns the
/// folded nodes' names.
fn fold_constants(graph: &mut pb::GraphProto) -> Vec<String> {
    let mut folded = vec![];
    loop {
        let inits: HashMap<&str, &pb::TensorProto> = graph
            .initializer
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let outputs: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
        let mut made: Option<(usize, pb::TensorProto)> = None;
        for (i, n) in graph.node.iter().enumerate() {
            let (Some(x), [out]) = (n.input.first(), n.output.as_slice()) else {
                continue;
            };
            if outputs.contains(out.as_str()) {
                continue;
            }
            let Some(t) = inits.get(x.as_str()) else {
                continue;
            };
            let tensor = match n.op_type.as_str() {
                "Cast" => proto::attr_i(n, "to")
                    .and_then(|to| Values::read(t)?.write(out, &dims_of(t), to as i32)),
                "Identity" => Some(pb::TensorProto {
                    name: out.clone(),
                    ..(*t).clone()
                }),
                "ConstantOfShape" => constant_of_shape(n, t, out),
                _ => None,
            };
            if let Some(tensor) = tensor {
                made = Some((i, tensor));
                break;
            }
        }
        let Some((i, tensor)) = made else {
            return folded;
        };
        folded.push(graph.node.remove(i).name);
        graph.initializer.push(tensor);
    }
}

/// The tensor `ConstantOfShape` makes: `shape` filled with its `value` (float 0 by default).
fn constant_of_shape(
    n: &pb::NodeProto,
    shape: &pb::TensorProto,
    out: &str,
) -> Option<pb::TensorProto> {
    let dims: Vec<usize> = proto::tensor_i64(shape)?
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<_>>()?;
    let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if numel > MAX_FOLD_ELEMENTS {
        return None;
    }
    let (value, data_type) = match proto::attr(n, "value").and_then(|a| a.t.as_ref()) {
        Some(v) => (Values::read(v)?, v.data_type),
        None => (Values::Floats(vec![0.0]), DataType::Float as i32),
    };
    let filled = match value {
        Values::Ints(v) if v.len() == 1 => Values::Ints(vec![v[0]; numel]),
        Values::Floats(v) if v.len() == 1 => Values::Floats(vec![v[0]; numel]),
        _ => return None,
    };
    filled.write(out, &dims, data_type)
}

/// The type a QuantizeLinear writes: its zero point's, uint8 without one.
fn quantized_type(n: &pb::NodeProto, inits: &HashMap<&str, &pb::TensorProto>) -> Option<i32> {
    match n.input.get(2).filter(|z| !z.is_empty()) {
        Some(z) => inits.get(z.as_str()).map(|t| t.data_type),
        None => Some(DataType::Uint8 as i32),
    }
}

/// Renames every read of `from` to `to`.
fn rewire(graph: &mut pb::GraphProto, from: &str, to: &str) {
    for n in graph.node.iter_mut() {
        for i in n.input.iter_mut().filter(|i| *i == from) {
            *i = to.to_string();
        }
    }
}

/// Drops `Cast`s of a QuantizeLinear's output to the type it already has (PyTorch writes one
/// before every DequantizeLinear). Returns their names.
fn drop_identity_casts(graph: &mut pb::GraphProto) -> Vec<String> {
    let inits: HashMap<&str, &pb::TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let q_types: HashMap<&str, i32> = graph
        .node
        .iter()
        .filter(|n| n.op_type == "QuantizeLinear")
        .filter_map(|n| Some((n.output.first()?.as_str(), quantized_type(n, &inits)?)))
        .collect();
    let outputs: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    let identity: Vec<(usize, String, String)> = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op_type == "Cast" && n.input.len() == 1 && n.output.len() == 1)
        .filter(|(_, n)| !outputs.contains(n.output[0].as_str()))
        .filter(|(_, n)| {
            q_types.get(n.input[0].as_str()).copied() == proto::attr_i(n, "to").map(|t| t as i32)
        })
        .map(|(i, n)| (i, n.input[0].clone(), n.output[0].clone()))
        .collect();
    let mut names = vec![];
    for (i, from, to) in identity.iter().rev() {
        names.push(graph.node.remove(*i).name);
        rewire(graph, to, from);
    }
    names.reverse();
    names
}

/// Whether initializer `t` is uint8 with every value 128.
fn is_u8_128(t: &pb::TensorProto) -> bool {
    t.data_type == DataType::Uint8 as i32
        && proto::tensor_i64(t).is_some_and(|v| !v.is_empty() && v.iter().all(|&z| z == 128))
}

/// Turns uint8 Q/DQ with zero point 128 into int8 with zero point 0: each QuantizeLinear whose
/// every reader is such a DequantizeLinear, with those readers, and DequantizeLinears of uint8
/// constants. Returns the rewritten nodes, and a line per QuantizeLinear kept with a zero point
/// that has no symmetric int8 equivalent.
fn uint8_to_int8(graph: &mut pb::GraphProto) -> (Vec<String>, Vec<String>) {
    let inits: HashMap<String, pb::TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.clone(), t.clone()))
        .collect();
    let zp_of = |n: &pb::NodeProto| n.input.get(2).and_then(|z| inits.get(z));
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for x in &n.input {
            readers.entry(x.as_str()).or_default().push(i);
        }
    }
    let outputs: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    let mut convert: Vec<usize> = vec![];
    let mut kept = vec![];
    for (i, n) in graph.node.iter().enumerate() {
        match n.op_type.as_str() {
            "QuantizeLinear" => {
                let symmetric_u8 = zp_of(n).is_some_and(is_u8_128);
                let out = n.output.first().map(String::as_str).unwrap_or("");
                let dqs = readers.get(out).map(Vec::as_slice).unwrap_or(&[]);
                let all_dq_128 = dqs.iter().all(|&r| {
                    graph.node[r].op_type == "DequantizeLinear"
                        && graph.node[r].input.first().map(String::as_str) == Some(out)
                        && zp_of(&graph.node[r]).is_some_and(is_u8_128)
                });
                if symmetric_u8 && all_dq_128 && !outputs.contains(out) {
                    convert.push(i);
                    convert.extend_from_slice(dqs);
                } else if let Some(why) = asymmetric(n, zp_of(n)) {
                    kept.push(why);
                }
            }
            "DequantizeLinear" => {
                let x = n.input.first().and_then(|x| inits.get(x));
                if x.is_some_and(|t| t.data_type == DataType::Uint8 as i32)
                    && zp_of(n).is_some_and(is_u8_128)
                {
                    convert.push(i);
                }
            }
            _ => {}
        }
    }
    convert.sort_unstable();
    convert.dedup();
    let mut new_inits: HashMap<String, pb::TensorProto> = HashMap::new();
    let mut names = vec![];
    for &i in &convert {
        let n = &mut graph.node[i];
        names.push(n.name.clone());
        let zp = n.input[2].clone();
        let signed_zp = format!("{zp}_int8");
        new_inits.entry(signed_zp.clone()).or_insert_with(|| {
            let t = &inits[&zp];
            proto::i8_tensor(
                &signed_zp,
                &dims_of(t),
                &vec![0; proto::tensor_i64(t).map_or(0, |v| v.len())],
            )
        });
        n.input[2] = signed_zp;
        // A uint8 constant (a weight) moves by 128 too.
        if n.op_type == "DequantizeLinear"
            && let Some(t) = inits.get(&n.input[0])
        {
            let signed_x = format!("{}_int8", t.name);
            let v: Vec<i8> = proto::tensor_i64(t)
                .unwrap_or_default()
                .iter()
                .map(|&q| (q - 128) as i8)
                .collect();
            new_inits
                .entry(signed_x.clone())
                .or_insert_with(|| proto::i8_tensor(&signed_x, &dims_of(t), &v));
            n.input[0] = signed_x;
        }
    }
    graph.initializer.extend(new_inits.into_values());
    (names, kept)
}

/// Why QuantizeLinear `n` stays as it is, when its zero point is not symmetric.
fn asymmetric(n: &pb::NodeProto, zp: Option<&pb::TensorProto>) -> Option<String> {
    let (ty, values) = match zp {
        Some(t) => (t.data_type, proto::tensor_i64(t)?),
        None => (DataType::Uint8 as i32, vec![0]),
    };
    let symmetric = match DataType::try_from(ty).ok()? {
        DataType::Int8 => values.iter().all(|&z| z == 0),
        DataType::Uint8 => values.iter().all(|&z| z == 128),
        _ => return None,
    };
    (!symmetric).then(|| {
        format!(
            "`{}` ({}, zero point {})",
            n.name,
            proto::data_type_name(ty),
            values.first().copied().unwrap_or(0)
        )
    })
}

/// The one line saying which asymmetric QuantizeLinear nodes stay, and what to do about them.
fn kept_line(asymmetric: &[String]) -> Option<String> {
    let shown: Vec<&str> = asymmetric.iter().take(3).map(String::as_str).collect();
    (!asymmetric.is_empty()).then(|| {
        format!(
            "{} QuantizeLinear with an asymmetric zero point kept as they are, e.g. {}. ONNX \
             Runtime runs them exactly; the CUDA engine and TensorRT's int8 take zero point 0 \
             only. For those, re-quantize with symmetric activations (PyTorch: \
             qscheme=torch.per_tensor_symmetric; ONNX Runtime: extra_options=\
             {{'ActivationSymmetric': True}}), or give quantscope the float model to calibrate",
            asymmetric.len(),
            shown.join(", ")
        )
    })
}

/// The channel of element `k` of a tensor quantized per tensor or along one axis.
struct PerAxis {
    channels: usize,
    /// Elements after the axis (one channel's run).
    inner: usize,
}

impl PerAxis {
    /// For a tensor of `dims` quantized along node `n`'s `axis` (default 1, negative counts
    /// from the end), given its scale and zero-point lengths; `None` when those fit neither a
    /// per-tensor nor a per-axis quantization.
    fn of(n: &pb::NodeProto, dims: &[usize], lens: [usize; 2]) -> Option<PerAxis> {
        let a = proto::attr_i(n, "axis").unwrap_or(1);
        let a = if a < 0 { a + dims.len() as i64 } else { a }.max(0) as usize;
        let channels = dims.get(a).copied().unwrap_or(1).max(1);
        let inner = dims
            .get(a + 1..)
            .map_or(1, |d| d.iter().product::<usize>().max(1));
        lens.iter()
            .all(|&l| l == 1 || l == channels)
            .then_some(PerAxis { channels, inner })
    }

    /// `v`'s value for element `k`: its only one, or its channel's.
    fn pick<T: Copy>(&self, v: &[T], k: usize) -> T {
        v[if v.len() == 1 {
            0
        } else {
            (k / self.inner) % self.channels
        }]
    }
}

/// Replaces every `op` node (not writing a graph output) for which `fold` computes its output
/// from the initializers by that constant. Returns the folded nodes' names.
fn fold_nodes(
    graph: &mut pb::GraphProto,
    op: &str,
    fold: impl Fn(&pb::NodeProto, &HashMap<&str, &pb::TensorProto>) -> Option<pb::TensorProto>,
) -> Vec<String> {
    let inits: HashMap<&str, &pb::TensorProto> = graph
        .initializer
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let outputs: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    let made: Vec<(usize, pb::TensorProto)> = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op_type == op && !outputs.contains(n.output[0].as_str()))
        .filter_map(|(i, n)| Some((i, fold(n, &inits)?)))
        .collect();
    let mut names = vec![];
    for (i, t) in made.into_iter().rev() {
        names.push(graph.node.remove(i).name);
        graph.initializer.push(t);
    }
    names.reverse();
    names
}

/// Folds `QuantizeLinear(float constant, scale, int8 zero point)` (a weight quantized in the
/// graph, as modelopt writes it) into the int8 constant it computes: x / scale rounded half to
/// even, plus the zero point, saturated, per tensor or along `axis`. Returns the folded nodes.
fn fold_weight_quantize(graph: &mut pb::GraphProto) -> Vec<String> {
    fold_nodes(graph, "QuantizeLinear", |n, inits| {
        let get = |k: usize| n.input.get(k).and_then(|x| inits.get(x.as_str()));
        let x = proto::tensor_f32(get(0)?)?;
        let scale = proto::tensor_f32(get(1)?)?.data;
        let zero = proto::tensor_i64(get(2).filter(|t| t.data_type == DataType::Int8 as i32)?)?;
        let at = PerAxis::of(n, &x.dims, [scale.len(), zero.len()])?;
        let q: Vec<i8> = x
            .data
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let r = (v / at.pick(&scale, k)).round_ties_even();
                (r + at.pick(&zero, k) as f32).clamp(-128.0, 127.0) as i8
            })
            .collect();
        Some(proto::i8_tensor(&n.output[0], &x.dims, &q))
    })
}

/// Folds `DequantizeLinear(int32 constant, scale, zero point)` (a bias, as PyTorch and ONNX
/// Runtime write it) into the float constant it computes. Returns the folded nodes' names.
fn fold_bias_dequantize(graph: &mut pb::GraphProto) -> Vec<String> {
    fold_nodes(graph, "DequantizeLinear", |n, inits| {
        let get = |k: usize| n.input.get(k).and_then(|x| inits.get(x.as_str()));
        let x = get(0).filter(|t| t.data_type == DataType::Int32 as i32)?;
        let values = proto::tensor_i64(x)?;
        let scale = proto::tensor_f32(get(1)?)?.data;
        let zero = match get(2) {
            Some(z) => proto::tensor_i64(z)?,
            None => vec![0],
        };
        let dims = dims_of(x);
        let at = PerAxis::of(n, &dims, [scale.len(), zero.len()])?;
        // The same arithmetic ONNX Runtime does: (x - zero point) in int32, then × scale in f32.
        let f: Vec<f32> = values
            .iter()
            .enumerate()
            .map(|(k, &q)| (q - at.pick(&zero, k)) as f32 * at.pick(&scale, k))
            .collect();
        Some(proto::f32_tensor(&n.output[0], &dims, &f))
    })
}

/// Copies each activation DequantizeLinear read by more than one node, so every reader has its
/// own. Returns the copied nodes' names.
fn one_dequantize_per_reader(graph: &mut pb::GraphProto) -> Vec<String> {
    let inits: HashSet<String> = graph.initializer.iter().map(|t| t.name.clone()).collect();
    let outputs: HashSet<String> = graph.output.iter().map(|o| o.name.clone()).collect();
    let mut names = vec![];
    let mut i = 0;
    while i < graph.node.len() {
        let n = graph.node[i].clone();
        i += 1;
        if n.op_type != "DequantizeLinear"
            || n.input.first().is_none_or(|x| inits.contains(x))
            || outputs.contains(&n.output[0])
        {
            continue;
        }
        let readers: Vec<usize> = graph
            .node
            .iter()
            .enumerate()
            .filter(|(_, r)| r.input.contains(&n.output[0]))
            .map(|(k, _)| k)
            .collect();
        if readers.len() < 2 {
            continue;
        }
        names.push(n.name.clone());
        // The first reader keeps the original; each other one gets a copy placed right
        // before the original, which keeps the node list in topological order.
        let mut copies = vec![];
        for (k, &r) in readers.iter().enumerate().skip(1) {
            let out = format!("{}_{k}", n.output[0]);
            for x in graph.node[r]
                .input
                .iter_mut()
                .filter(|x| **x == n.output[0])
            {
                *x = out.clone();
            }
            let mut copy = n.clone();
            copy.name = format!("{}_{k}", n.name);
            copy.output = vec![out];
            copies.push(copy);
        }
        let at = i - 1;
        let count = copies.len();
        for (k, c) in copies.into_iter().enumerate() {
            graph.node.insert(at + k, c);
        }
        i += count;
    }
    names
}
