//! Reading ONNX models: decoding, preparing the graph the rest of the pipeline works on
//! (external data inlined, weights-as-inputs made initializers, BatchNorm folded into Conv,
//! every node named), and describing it (`ModelInfo`: inputs, outputs, op census, task; the
//! drawing of its graph in [`diagram`]).
//! Nothing here runs the model.

pub mod diagram;
pub mod fp16;
pub mod graph;
pub mod proto;
pub mod qdq_forms;
#[doc(hidden)]
pub mod testing;
pub mod validate;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use prost::Message;
use serde::{Deserialize, Serialize};
use tract_onnx::pb::{self, tensor_proto::DataType};

pub use graph::Graph;
use proto::{F32Tensor, tensor_f32};

/// Why a model could not be loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: cannot read the file")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an ONNX model, or truncated ({reason})")]
    NotOnnx { path: PathBuf, reason: String },
    #[error("{path}: opset {opset} is outside the supported range 7..=21")]
    Opset { path: PathBuf, opset: i64 },
    #[error("{path}: external data for initializer `{tensor}`: {reason}")]
    ExternalData {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{path}: {reason}")]
    Inputs { path: PathBuf, reason: String },
    #[error("{path}: unsupported operator(s): {list}")]
    Unsupported { path: PathBuf, list: String },
    #[error("{path}: {reason}")]
    Shape { path: PathBuf, reason: String },
    /// The validation stage's findings: the first few, and how many there are.
    #[error("{path}: the model is invalid: {summary}")]
    Invalid { path: PathBuf, summary: String },
}

/// What the model is for, detected from its output shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// `[N, C]` output: class scores.
    #[default]
    Classification,
    /// `[N, C, H, W]` output: per-pixel class scores.
    Segmentation,
}

/// Memory layout of the image input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum Layout {
    #[default]
    Nchw,
    Nhwc,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorInfo {
    pub name: String,
    /// `None` for a dynamic dimension.
    pub shape: Vec<Option<i64>>,
    pub dtype: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnsupportedOp {
    pub node: String,
    pub op: String,
}

/// Everything `inspect` prints and the Model panel shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub file: PathBuf,
    pub opset: i64,
    pub producer: String,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    pub op_census: BTreeMap<String, usize>,
    pub nodes: usize,
    pub params: u64,
    pub param_bytes: u64,
    pub task: Option<Task>,
    pub layout: Layout,
    /// Channels, height, width of the image input (0 where dynamic).
    pub input_chw: [usize; 3],
    pub batch_norms_folded: usize,
    /// True when the file already holds QuantizeLinear/DequantizeLinear pairs (e.g. from QAT).
    pub prequantized: bool,
    pub unsupported: Vec<UnsupportedOp>,
    /// Float16 initializers the file stores, upcast to float at load (exact): the model was
    /// exported in FP16. 0 for an FP32 model.
    #[serde(default)]
    pub fp16_initializers: usize,
    /// Input normalisation the exporter wrote into the file's metadata, if any.
    #[serde(default)]
    pub normalization: Option<MetaNormalization>,
    /// A pre-quantized model's Q/DQ as normalised at load (see [`qdq_forms`]): one line per
    /// kind of rewrite, with a count and an example node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qdq_rewrites: Vec<String>,
    /// Q/DQ the load kept as they are although an engine may refuse them (asymmetric zero
    /// points), each saying why and what to do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qdq_kept: Vec<String>,
}

/// Input normalisation read from an ONNX file's `metadata_props`: `(x / 255 - mean) / std`
/// per channel, 0..1 scale, in the model's channel order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetaNormalization {
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// The metadata keys it came from (`mean`/`std`, `image_mean`/`image_std`, ...).
    pub keys: String,
}

/// Metadata key pairs that exporters use for the input normalisation (plain, Hugging Face's
/// `image_mean`/`image_std`, and two common spellings). quantscope writes `mean`/`std`.
const NORMALIZATION_KEYS: [(&str, &str); 4] = [
    ("mean", "std"),
    ("image_mean", "image_std"),
    ("norm_mean", "norm_std"),
    ("pixel_mean", "pixel_std"),
];

/// One or three numbers, separated by commas or spaces, optionally in brackets; values over
/// 1.5 are taken as 0..255 units (Caffe- and detectron-style metadata) and divided by 255.
fn parse_triple(text: &str, scale_255: bool) -> Option<[f32; 3]> {
    let v: Vec<f32> = text
        .split(|c: char| c == ',' || c.is_whitespace() || "[]()".contains(c))
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<f32>().ok().filter(|x| x.is_finite()))
        .collect::<Option<_>>()?;
    let v: [f32; 3] = match v.as_slice() {
        [x] => [*x; 3],
        [a, b, c] => [*a, *b, *c],
        _ => return None,
    };
    Some(if scale_255 { v.map(|x| x / 255.0) } else { v })
}

/// The input normalisation in a model's metadata: the first key pair whose values both
/// parse (1 or 3 numbers each, std > 0). Mean and std are scaled to 0..1 together when
/// either holds a value over 1.5.
pub fn metadata_normalization(p: &pb::ModelProto) -> Option<MetaNormalization> {
    let get = |key: &str| {
        p.metadata_props
            .iter()
            .find(|e| e.key.eq_ignore_ascii_case(key))
            .map(|e| e.value.as_str())
    };
    NORMALIZATION_KEYS.iter().find_map(|(mk, sk)| {
        let (m, s) = (get(mk)?, get(sk)?);
        let raw = |t| parse_triple(t, false);
        let big = raw(m)?.iter().chain(&raw(s)?).any(|x| x.abs() > 1.5);
        let (mean, std) = (parse_triple(m, big)?, parse_triple(s, big)?);
        std.iter().all(|&x| x > 0.0).then(|| MetaNormalization {
            mean,
            std,
            keys: format!("{mk}/{sk}"),
        })
    })
}

/// A loaded, prepared model: the graph every later stage reads.
#[derive(Clone, Debug)]
pub struct Model {
    pub path: PathBuf,
    pub proto: pb::ModelProto,
    pub info: ModelInfo,
}

/// Protobuf's own limit on one message: an ONNX file over it keeps its weights as external data.
const MAX_MODEL_BYTES: u64 = 2 << 30;

/// Ops that are part of the default ONNX domain and that tract knows.
fn tract_knows(op: &str) -> bool {
    thread_local! {
        static KNOWN: HashSet<String> = tract_onnx::onnx().op_register.0.keys().cloned().collect();
    }
    KNOWN.with(|k| k.contains(op))
}

impl Model {
    /// Reads and prepares `path`. The image input's spatial size may stay dynamic here; the
    /// experiment fixes it when an engine is built.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        let bytes =
            crate::files::read_input(path, MAX_MODEL_BYTES).map_err(|source| ModelError::Io {
                path: path.into(),
                source,
            })?;
        Self::from_bytes(path, &bytes)
    }

    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Model, ModelError> {
        let not_onnx = |reason: String| ModelError::NotOnnx {
            path: path.into(),
            reason,
        };
        let mut proto = pb::ModelProto::decode(bytes).map_err(|e| not_onnx(e.to_string()))?;
        let graph = proto
            .graph
            .as_ref()
            .ok_or_else(|| not_onnx("no graph in the file".into()))?;
        if graph.node.is_empty() {
            return Err(not_onnx("the graph has no nodes".into()));
        }
        let opset = proto
            .opset_import
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
            .unwrap_or(0);
        if !(7..=21).contains(&opset) {
            return Err(ModelError::Opset {
                path: path.into(),
                opset,
            });
        }
        // IR 3 came with opset 7 (the oldest opset read); 0 means the field was never written.
        if !(3..=MAX_IR_VERSION).contains(&proto.ir_version) {
            return Err(not_onnx(format!(
                "IR version {} is not one quantscope reads (3 to {MAX_IR_VERSION}){}; re-export the model with a current exporter",
                proto.ir_version,
                if proto.ir_version == 0 {
                    ": the file does not say which ONNX it is"
                } else {
                    ""
                }
            )));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let graph = proto.graph.as_mut().expect("checked above");
        inline_external_data(graph, dir).map_err(|(tensor, reason)| ModelError::ExternalData {
            path: path.into(),
            tensor,
            reason,
        })?;
        constants_to_initializers(graph);
        let fp16_initializers = fp16::upcast(graph);
        let problems = validate::validate(graph, opset);
        if !problems.is_empty() {
            let shown: Vec<String> = problems.iter().take(3).map(|p| p.to_string()).collect();
            let more = match problems.len() {
                n if n > 3 => format!(" (and {} more)", n - 3),
                _ => String::new(),
            };
            return Err(ModelError::Invalid {
                path: path.into(),
                summary: format!("{}{more}", shown.join("; ")),
            });
        }
        let init_names: HashSet<String> =
            graph.initializer.iter().map(|t| t.name.clone()).collect();
        graph.input.retain(|i| !init_names.contains(&i.name));
        name_nodes(graph);
        let qdq = qdq_forms::normalize(graph);
        let folded = fold_batch_norms(graph);
        let mut info = describe(path, &proto, opset, folded)?;
        info.fp16_initializers = fp16_initializers;
        info.qdq_rewrites = qdq.rewrites;
        info.qdq_kept = qdq.kept;
        let mut model = Model {
            path: path.into(),
            proto,
            info,
        };
        model.fill_output_shapes();
        Ok(model)
    }

    /// Output shapes the file does not give are inferred (with the input fixed, batch 1),
    /// so the task can be detected from them.
    fn fill_output_shapes(&mut self) {
        if self.info.outputs.iter().all(|o| !o.shape.is_empty()) && self.info.task.is_some() {
            return;
        }
        let Ok(hw) = self.input_hw(None) else { return };
        // tract may still panic on a graph it cannot analyse: the shapes stay unknown then, and
        // the build reports the problem as an error row.
        let Ok(Ok(shapes)) =
            crate::guard::catch("inferring output shapes", || infer_shapes(self, hw))
        else {
            return;
        };
        for o in self.info.outputs.iter_mut() {
            if let Some(s) = shapes.get(&o.name) {
                o.shape = s
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if i == 0 { None } else { Some(d as i64) })
                    .collect();
            }
        }
        self.info.task = task_of(&self.info.outputs[0]);
    }

    pub fn graph(&self) -> &pb::GraphProto {
        self.proto
            .graph
            .as_ref()
            .expect("a loaded model has a graph")
    }

    pub fn input_name(&self) -> &str {
        &self.info.inputs[0].name
    }

    pub fn output_name(&self) -> &str {
        &self.info.outputs[0].name
    }

    /// Fails with a message naming the nodes when the model uses ops no backend can run.
    pub fn check_supported(&self) -> Result<(), ModelError> {
        if self.info.unsupported.is_empty() {
            return Ok(());
        }
        let list = self
            .info
            .unsupported
            .iter()
            .map(|u| format!("{} (node `{}`)", u.op, u.node))
            .collect::<Vec<_>>()
            .join(", ");
        Err(ModelError::Unsupported {
            path: self.path.clone(),
            list,
        })
    }

    /// The spatial size the image input needs: the model's own if fixed, else `requested`.
    /// Errors when a fixed model size disagrees with a requested one.
    pub fn input_hw(&self, requested: Option<[usize; 2]>) -> Result<[usize; 2], ModelError> {
        let [_, h, w] = self.info.input_chw;
        match (h > 0 && w > 0, requested) {
            (true, Some(r)) if r != [h, w] => Err(ModelError::Shape {
                path: self.path.clone(),
                reason: format!(
                    "input `{}` is fixed at {h}x{w} but the experiment asks for {}x{}",
                    self.input_name(),
                    r[0],
                    r[1]
                ),
            }),
            (true, _) => Ok([h, w]),
            (false, Some(r)) => Ok(r),
            (false, None) => Err(ModelError::Shape {
                path: self.path.clone(),
                reason: format!(
                    "input `{}` has a dynamic height/width: set the input size (--size H,W)",
                    self.input_name()
                ),
            }),
        }
    }

    /// The prepared graph with its input fixed to `[batch, C, H, W]` (or NHWC), as ONNX bytes.
    pub fn with_fixed_input(&self, batch: usize, hw: [usize; 2]) -> pb::ModelProto {
        let mut p = self.proto.clone();
        let shape = self.input_shape(batch, hw);
        let g = p.graph.as_mut().expect("a loaded model has a graph");
        let name = g.input[0].name.clone();
        g.input[0] = proto::float_value_info(&name, Some(&shape));
        // Output shapes in the file may carry stale symbolic dims; the engines infer them. Each
        // output keeps its element type (a detector's labels are int64).
        for o in g.output.iter_mut() {
            let elem = proto::value_info_elem_type(o).filter(|&t| t != 0);
            let mut v = proto::float_value_info(&o.name, None);
            if let (Some(t), Some(pb::type_proto::Value::TensorType(tt))) =
                (elem, v.r#type.as_mut().and_then(|t| t.value.as_mut()))
            {
                tt.elem_type = t;
            }
            *o = v;
        }
        g.value_info.clear();
        p
    }

    pub fn input_shape(&self, batch: usize, hw: [usize; 2]) -> [usize; 4] {
        let c = self.info.input_chw[0].max(1);
        match self.info.layout {
            Layout::Nchw => [batch, c, hw[0], hw[1]],
            Layout::Nhwc => [batch, hw[0], hw[1], c],
        }
    }

    /// Float initializer by name (weights, biases).
    pub fn initializer(&self, name: &str) -> Option<F32Tensor> {
        self.graph()
            .initializer
            .iter()
            .find(|t| t.name == name)
            .and_then(tensor_f32)
    }

    /// A hash of the prepared graph, used to key caches.
    pub fn fingerprint(&self) -> String {
        blake3::hash(&self.proto.encode_to_vec()).to_hex()[..16].to_string()
    }
}

/// Every tensor name a node reads, in the graph and in its subgraphs (an `If` branch may read an
/// initializer of the outer graph), plus the graph's outputs.
fn names_read(graph: &pb::GraphProto, into: &mut HashSet<String>) {
    for n in &graph.node {
        into.extend(n.input.iter().cloned());
        for a in &n.attribute {
            for g in a.g.iter().chain(&a.graphs) {
                names_read(g, into);
            }
        }
    }
    into.extend(graph.output.iter().map(|o| o.name.clone()));
}

fn is_external(t: &pb::TensorProto) -> bool {
    t.data_location == Some(pb::tensor_proto::DataLocation::External as i32)
}

/// The newest ONNX IR version this reader accepts: the newest the ONNX proto defines.
const MAX_IR_VERSION: i64 = 12;

/// Reads the weights a model keeps in separate files into the graph. Initializers that no node
/// reads are dropped unread (an unused 8 GiB tensor must not abort the process); the rest must
/// be regular files inside the model's folder, links resolved, and must fit in the memory this
/// machine has free.
fn inline_external_data(graph: &mut pb::GraphProto, dir: &Path) -> Result<(), (String, String)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut read = HashSet::new();
    names_read(graph, &mut read);
    let unused: HashSet<String> = graph
        .initializer
        .iter()
        .filter(|t| is_external(t) && !read.contains(&t.name))
        .map(|t| t.name.clone())
        .collect();
    graph.initializer.retain(|t| !unused.contains(&t.name));
    // Listed as an input too (older exporters do): dropped there as well, or it would become an
    // input to feed.
    graph.input.retain(|i| !unused.contains(&i.name));
    let mut planned = vec![];
    for t in graph.initializer.iter().filter(|t| is_external(t)) {
        let real_dir = dir.canonicalize().map_err(|e| {
            (
                t.name.clone(),
                format!("the model's folder {}: {e}", dir.display()),
            )
        })?;
        planned.push((t.name.clone(), external_span(t, dir, &real_dir)?));
    }
    let total: u64 = planned.iter().map(|(_, (_, _, len))| len).sum();
    if let Some(free) = crate::host::available_memory_bytes()
        && total > free
    {
        let (name, (_, _, len)) = planned
            .iter()
            .max_by_key(|(_, (_, _, len))| *len)
            .expect("total > 0");
        return Err((
            name.clone(),
            format!(
                "the external weights need {:.1} GiB (this one {:.1} GiB), more than the {:.1} GiB of memory free; free memory or use a machine with more",
                total as f64 / GIB,
                *len as f64 / GIB,
                free as f64 / GIB
            ),
        ));
    }
    let mut spans: std::collections::HashMap<String, (PathBuf, u64, u64)> =
        planned.into_iter().collect();
    for t in graph.initializer.iter_mut() {
        let Some((file, offset, length)) = spans.remove(&t.name) else {
            continue;
        };
        let fail = |reason: String| (t.name.clone(), reason);
        let mut f =
            std::fs::File::open(&file).map_err(|e| fail(format!("{}: {e}", file.display())))?;
        let mut data = vec![0u8; length as usize];
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(&mut data))
            .map_err(|e| fail(format!("{}: {e}", file.display())))?;
        t.raw_data = data;
        t.external_data.clear();
        t.data_location = None;
    }
    Ok(())
}

const GIB: f64 = (1u64 << 30) as f64;

/// Where an external initializer's bytes are: (the file, links resolved; offset; length),
/// checked against the file's size and refused outside the model's folder (`real_dir`).
fn external_span(
    t: &pb::TensorProto,
    dir: &Path,
    real_dir: &Path,
) -> Result<(PathBuf, u64, u64), (String, String)> {
    let fail = |reason: String| (t.name.clone(), reason);
    let get = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.clone())
    };
    let number = |k: &str| -> Result<Option<u64>, (String, String)> {
        get(k)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| fail(format!("`{k}` is `{v}`, not a byte count")))
            })
            .transpose()
    };
    let location = get("location").ok_or_else(|| fail("no `location` entry".into()))?;
    // The data lives beside the model: an absolute path or `..` would read any file.
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(fail(format!(
            "location `{location}` must be a file name relative to the model's folder"
        )));
    }
    let offset = number("offset")?.unwrap_or(0);
    let declared = validate::declared_elements(t).map_err(fail)?;
    let (_, elem) = proto::tensor_numel_and_elem_bytes(t);
    let length = match number("length")? {
        Some(l) => l,
        None => declared
            .checked_mul(elem)
            .ok_or_else(|| fail("the declared size overflows".into()))?,
    };
    let file = dir.join(rel);
    let size = crate::files::regular_file_len(&file).map_err(fail)?;
    // The name check above is lexical: a link named `w.bin` may still lead anywhere.
    let real = file
        .canonicalize()
        .map_err(|e| fail(format!("{}: {e}", file.display())))?;
    if !real.starts_with(real_dir) {
        return Err(fail(format!(
            "{} is a link to {}, outside the model's folder; weights are only read from the model's own folder (copy the file there)",
            file.display(),
            real.display()
        )));
    }
    let end = offset.checked_add(length).filter(|&e| e <= size);
    if end.is_none() {
        return Err(fail(format!(
            "{} holds {size} bytes, needs {length} at offset {offset}",
            file.display()
        )));
    }
    Ok((real, offset, length))
}

/// `Constant` nodes holding a tensor become initializers, so weights stored that way are seen.
fn constants_to_initializers(graph: &mut pb::GraphProto) {
    let mut keep = Vec::with_capacity(graph.node.len());
    for n in std::mem::take(&mut graph.node) {
        if n.op_type == "Constant"
            && n.output.len() == 1
            && let Some(mut t) = proto::attr(&n, "value").and_then(|a| a.t.clone())
        {
            t.name = n.output[0].clone();
            graph.initializer.push(t);
            continue;
        }
        keep.push(n);
    }
    graph.node = keep;
}

/// Gives every node a unique, non-empty name: exclusions and reports refer to nodes by name.
fn name_nodes(graph: &mut pb::GraphProto) {
    let mut seen = HashSet::new();
    for (i, n) in graph.node.iter_mut().enumerate() {
        if n.name.is_empty() || seen.contains(&n.name) {
            let base = n
                .output
                .first()
                .filter(|s| !s.is_empty())
                .cloned()
                .unwrap_or_else(|| format!("{}_{i}", n.op_type));
            let mut name = base.clone();
            let mut k = 1;
            while seen.contains(&name) {
                name = format!("{base}_{k}");
                k += 1;
            }
            n.name = name;
        }
        seen.insert(n.name.clone());
    }
}

/// Folds `Conv -> BatchNormalization` (the conv feeding only that BN) into the conv's weights
/// and bias, as TensorRT does before choosing kernels. Returns how many were folded.
pub fn fold_batch_norms(graph: &mut pb::GraphProto) -> usize {
    let mut folded = 0;
    loop {
        let g = Graph::new(graph);
        let Some((conv_i, bn_i)) = graph.node.iter().enumerate().find_map(|(bi, bn)| {
            if bn.op_type != "BatchNormalization"
                || bn.input.len() != 5
                || bn.output.iter().filter(|o| !o.is_empty()).count() != 1
            {
                return None;
            }
            let ci = g.producer(&bn.input[0])?;
            let conv = &graph.node[ci];
            (conv.op_type == "Conv"
                && conv.input.len() >= 2
                && conv.output.len() == 1
                && g.consumers(&conv.output[0]).len() == 1
                && !g.is_graph_output(&conv.output[0])
                && bn.input[1..].iter().all(|n| g.initializer(n).is_some())
                && g.initializer(&conv.input[1]).is_some())
            .then_some((ci, bi))
        }) else {
            break;
        };
        let init = |name: &str| {
            graph
                .initializer
                .iter()
                .find(|t| t.name == name)
                .and_then(tensor_f32)
        };
        let bn = graph.node[bn_i].clone();
        let conv = graph.node[conv_i].clone();
        let (Some(scale), Some(shift), Some(mean), Some(var), Some(w)) = (
            init(&bn.input[1]),
            init(&bn.input[2]),
            init(&bn.input[3]),
            init(&bn.input[4]),
            init(&conv.input[1]),
        ) else {
            break;
        };
        let eps = proto::attr_f(&bn, "epsilon").unwrap_or(1e-5);
        let m = w.dims.first().copied().unwrap_or(0);
        // Validation checked the BN parameters against each other; the conv's channels are
        // checked here. A mismatch leaves the pair unfolded for the backend to reject.
        if m == 0 || w.len() % m != 0 || [&scale, &shift, &mean, &var].iter().any(|t| t.len() != m)
        {
            break;
        }
        let per = w.len() / m;
        let bias = conv
            .input
            .get(2)
            .filter(|s| !s.is_empty())
            .and_then(|b| init(b))
            .map(|b| b.data)
            .filter(|b| b.len() == m)
            .unwrap_or(vec![0.0; m]);
        let mut new_w = w.data.clone();
        let mut new_b = vec![0.0f32; m];
        for c in 0..m {
            let k = scale.data[c] / (var.data[c] + eps).sqrt();
            for v in &mut new_w[c * per..(c + 1) * per] {
                *v *= k;
            }
            new_b[c] = (bias[c] - mean.data[c]) * k + shift.data[c];
        }
        let w_name = format!("{}_bnfolded_w", conv.name);
        let b_name = format!("{}_bnfolded_b", conv.name);
        graph
            .initializer
            .push(proto::f32_tensor(&w_name, &w.dims, &new_w));
        graph
            .initializer
            .push(proto::f32_tensor(&b_name, &[m], &new_b));
        let c = &mut graph.node[conv_i];
        c.input.resize(3, String::new());
        c.input[1] = w_name;
        c.input[2] = b_name;
        c.output[0] = bn.output[0].clone();
        graph.node.remove(bn_i);
        folded += 1;
    }
    if folded > 0 {
        drop_unused_initializers(graph);
    }
    folded
}

/// Removes initializers no node reads (left behind by folding and rewriting).
pub fn drop_unused_initializers(graph: &mut pb::GraphProto) {
    // Subgraphs count: an `If` branch may read an initializer no outer node reads.
    let mut used = HashSet::new();
    names_read(graph, &mut used);
    graph.initializer.retain(|t| used.contains(&t.name));
}

fn tensor_info(v: &pb::ValueInfoProto) -> TensorInfo {
    TensorInfo {
        name: v.name.clone(),
        shape: proto::value_info_shape(v).unwrap_or_default(),
        dtype: proto::value_info_elem_type(v)
            .map(proto::data_type_name)
            .unwrap_or("float32")
            .to_string(),
    }
}

fn task_of(output: &TensorInfo) -> Option<Task> {
    match output.shape.len() {
        2 => Some(Task::Classification),
        4 => Some(Task::Segmentation),
        _ => None,
    }
}

fn describe(
    path: &Path,
    p: &pb::ModelProto,
    opset: i64,
    folded: usize,
) -> Result<ModelInfo, ModelError> {
    let g = p.graph.as_ref().expect("checked by the caller");
    let inputs: Vec<TensorInfo> = g.input.iter().map(tensor_info).collect();
    let outputs: Vec<TensorInfo> = g.output.iter().map(tensor_info).collect();
    let inputs_err = |reason: String| ModelError::Inputs {
        path: path.into(),
        reason,
    };
    if inputs.is_empty() {
        return Err(inputs_err(
            "the graph has no input that is not an initializer".into(),
        ));
    }
    if inputs.len() > 1 {
        let names = inputs
            .iter()
            .map(|i| format!("`{}`", i.name))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(inputs_err(format!(
            "more than one image input ({names}); quantscope takes one"
        )));
    }
    if outputs.is_empty() {
        return Err(inputs_err("the graph has no output".into()));
    }
    let input = &inputs[0];
    if !input.shape.is_empty() && input.shape.len() != 4 {
        return Err(ModelError::Shape {
            path: path.into(),
            reason: format!(
                "input `{}` has rank {}; an image input is rank 4 (NCHW or NHWC)",
                input.name,
                input.shape.len()
            ),
        });
    }
    if let Some(t) = proto::value_info_elem_type(&g.input[0]).filter(|&t| t != 0)
        && !dtype_is_float(t)
    {
        return Err(inputs_err(format!(
            "input `{}` is {}; quantscope feeds images as float tensors (float32 or float16). A model that takes integer pixels or ids is not one it can evaluate: export it with a float input",
            input.name,
            proto::data_type_name(t)
        )));
    }
    let d = |i: usize| input.shape.get(i).copied().flatten().unwrap_or(0) as usize;
    let layout = if matches!(d(1), 1 | 3) || !matches!(d(3), 1 | 3) {
        Layout::Nchw
    } else {
        Layout::Nhwc
    };
    let input_chw = match layout {
        Layout::Nchw => [d(1), d(2), d(3)],
        Layout::Nhwc => [d(3), d(1), d(2)],
    };
    let mut op_census = BTreeMap::new();
    let mut unsupported = vec![];
    for n in &g.node {
        *op_census.entry(n.op_type.clone()).or_insert(0) += 1;
        let default_domain = n.domain.is_empty() || n.domain == "ai.onnx";
        if !default_domain || !tract_knows(&n.op_type) {
            let op = if default_domain {
                n.op_type.clone()
            } else {
                format!("{}::{}", n.domain, n.op_type)
            };
            unsupported.push(UnsupportedOp {
                node: n.name.clone(),
                op,
            });
        }
    }
    let (mut params, mut param_bytes) = (0u64, 0u64);
    for t in &g.initializer {
        let (n, b) = proto::tensor_numel_and_elem_bytes(t);
        if n > 1 {
            params += n;
            param_bytes += n * b;
        }
    }
    let task = task_of(&outputs[0]);
    let prequantized =
        op_census.contains_key("QuantizeLinear") || op_census.contains_key("DequantizeLinear");
    Ok(ModelInfo {
        file: path.into(),
        opset,
        producer: format!("{} {}", p.producer_name, p.producer_version)
            .trim()
            .to_string(),
        inputs,
        outputs,
        nodes: g.node.len(),
        op_census,
        params,
        param_bytes,
        task,
        layout,
        input_chw,
        batch_norms_folded: folded,
        prequantized,
        fp16_initializers: 0,
        normalization: metadata_normalization(p),
        qdq_rewrites: vec![],
        qdq_kept: vec![],
        unsupported,
    })
}

/// Maps each tensor name to the shape tract infers for it with the input fixed, so that
/// tasks without shapes in the file (and activation sizes) can be known.
pub fn infer_shapes(model: &Model, hw: [usize; 2]) -> anyhow::Result<HashMap<String, Vec<usize>>> {
    use tract_onnx::prelude::*;
    use tract_onnx::tract_hir::infer::Factoid;
    let p = model.with_fixed_input(1, hw);
    let onnx = tract_onnx::onnx();
    let parsed = onnx.parse(&p, model.path.parent().and_then(|d| d.to_str()))?;
    let mut m = parsed.model;
    m.analyse(false)?;
    let mut out = HashMap::new();
    for (name, outlet) in parsed.outlets_by_name {
        if let Ok(f) = m.outlet_fact(outlet)
            && let Some(s) = f.shape.concretize()
        {
            let dims: Option<Vec<usize>> = s
                .iter()
                .map(|d| d.to_i64().ok().map(|v| v as usize))
                .collect();
            if let Some(d) = dims {
                out.insert(name, d);
            }
        }
    }
    Ok(out)
}

pub(crate) fn dtype_is_float(t: i32) -> bool {
    t == DataType::Float as i32 || t == DataType::Float16 as i32 || t == DataType::Double as i32
}

#[cfg(test)]
mod normalization_tests {
    use super::*;

    fn with_props(props: &[(&str, &str)]) -> pb::ModelProto {
        pb::ModelProto {
            metadata_props: props
                .iter()
                .map(|(k, v)| pb::StringStringEntryProto {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn metadata_normalization_reads_the_usual_keys_and_scales() {
        let n = metadata_normalization(&with_props(&[
            ("mean", "0.485, 0.456, 0.406"),
            ("std", "[0.229 0.224 0.225]"),
        ]))
        .expect("mean/std");
        assert_eq!(n.mean, [0.485, 0.456, 0.406]);
        assert_eq!(n.std, [0.229, 0.224, 0.225]);
        assert_eq!(n.keys, "mean/std");
        // Hugging Face's keys, one number for every channel.
        let n = metadata_normalization(&with_props(&[("Image_Mean", "0.5"), ("image_std", "0.5")]))
            .expect("image_mean/image_std");
        assert_eq!((n.mean, n.std), ([0.5; 3], [0.5; 3]));
        // 0..255 units (detectron-style) are scaled together.
        let n = metadata_normalization(&with_props(&[
            ("pixel_mean", "127.5,127.5,127.5"),
            ("pixel_std", "127.5,127.5,127.5"),
        ]))
        .expect("0..255");
        assert_eq!((n.mean, n.std), ([0.5; 3], [0.5; 3]));
    }

    #[test]
    fn unusable_metadata_is_no_normalization() {
        for props in [
            vec![("mean", "0.5")],                     // no std
            vec![("mean", "a,b,c"), ("std", "1,1,1")], // not numbers
            vec![("mean", "0.5,0.5"), ("std", "1")],   // two values
            vec![("mean", "0.5"), ("std", "0")],       // std 0
            vec![("mean", "NaN"), ("std", "1")],       // not finite
        ] {
            assert_eq!(
                metadata_normalization(&with_props(&props)),
                None,
                "{props:?}"
            );
        }
    }
}
