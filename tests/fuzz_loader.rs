//! Mutation fuzzer over the ONNX loader -> validation -> CPU engine path, on stable Rust.
//!
//! Mutants of the bundled models (and of a small generated one) are made by byte edits of the
//! encoded file and by protobuf-aware edits of the decoded `ModelProto` (shapes, data, op types,
//! inputs, attributes, graph structure, opset, external data). Each mutant goes through
//! `Model::from_bytes`, which must never panic: a panic there is a loader CRASH and fails the
//! test. A mutant that loads is built into an FP32 CPU engine and run once on zeros, through
//! `guard::catch` as the app does: a panic inside tract is "contained" (the app shows it as an
//! error row), so it is reported, deduplicated by location, but does not fail the test.
//!
//! Environment:
//! - `FUZZ_SECONDS` (default 40): time budget; CI spends about a minute on this test.
//! - `FUZZ_SEED` (default: a fixed seed; `random` takes one from the clock, as `tools/fuzz.sh`
//!   does): the run's seed, printed first so a failure replays.
//! - `FUZZ_ITER`: run only that mutant of the seed (mutant `i` depends on the seed and `i` only).
//! - `FUZZ_HANG_SECONDS` (default 120): one mutant taking longer counts as a hang (a failure).
//!
//! Crashing (and hanging) mutants are written to `target/fuzz-crashes/<seed>-<i>.onnx`; the first
//! mutant per contained-panic location to `target/fuzz-crashes/contained-<seed>-<i>.onnx`.
//! `tools/fuzz.sh [SECONDS]` runs it for longer in release mode.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use quantscope::backend::{BackendKind, BuildInput, BuildSpec, Precision, backend};
use quantscope::guard;
use quantscope::model::testing::{residual_classifier, values};
use quantscope::model::{Model, infer_shapes, proto};
use tract_onnx::pb;
use tract_onnx::pb::tensor_shape_proto::dimension::Value as Dim;

/// The seed of `cargo test` runs.
const FIXED_SEED: u64 = 0x5eed_0f_0a11;

// ---------------------------------------------------------------------------------------------
// Randomness: a seeded xorshift, so the test needs no rand crate and every mutant replays.

struct Rng(u64);

impl Rng {
    /// splitmix64 of the seed, so that neighbouring seeds (seed + i) give unrelated streams.
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n`; 0 when `n` is 0 so callers need not special-case empty lists.
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Integers that find off-by-one, sign and overflow bugs.
const INTERESTING: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    4,
    7,
    8,
    255,
    -300,
    1 << 16,
    (1 << 31) - 1,
    1 << 31,
    1 << 40,
    -(1 << 40),
    i64::MAX,
    i64::MIN,
];

fn interesting_or_small(rng: &mut Rng) -> i64 {
    if rng.one_in(2) {
        rng.pick(INTERESTING)
    } else {
        rng.below(5) as i64
    }
}

const OPS: &[&str] = &[
    "Softmax",
    "Resize",
    "Transpose",
    "Pad",
    "Reshape",
    "Gather",
    "Concat",
    "BatchNormalization",
    "Conv",
    "MaxPool",
    "Slice",
    "Split",
    "Squeeze",
    "Unsqueeze",
    // Beyond the brief's list: ops whose attributes or shapes tract reads eagerly.
    "AveragePool",
    "Gemm",
    "MatMul",
    "Flatten",
    "ConvTranspose",
    "Expand",
    "Tile",
    "ConstantOfShape",
    "Clip",
    "Upsample",
    "ReduceMean",
    "DepthToSpace",
    "Constant",
    "NotAnOp",
];

// ---------------------------------------------------------------------------------------------
// Byte-level mutations of the encoded file.

/// A position in `len` bytes: a third uniform, a third near the start (prost writes the nodes
/// before the initializers) and a third near the end (graph inputs, outputs and opset), so the
/// bundled models' megabytes of weights do not absorb every edit.
fn position(rng: &mut Rng, len: usize) -> usize {
    match rng.below(3) {
        0 => rng.below(len),
        1 => rng.below(len.min(16 << 10)),
        _ => len.saturating_sub(1 + rng.below(len.min(4 << 10))),
    }
}

fn mutate_bytes(b: &mut Vec<u8>, rng: &mut Rng) -> String {
    if b.is_empty() {
        b.push(rng.next() as u8);
        return "bytes: grew from empty".into();
    }
    let len = b.len();
    match rng.below(7) {
        0 => {
            let k = 1 + rng.below(8);
            for _ in 0..k {
                let p = position(rng, len);
                b[p] ^= 1 << rng.below(8);
            }
            format!("bytes: {k} bit flip(s)")
        }
        1 => {
            let k = 1 + rng.below(4);
            for _ in 0..k {
                let p = position(rng, len);
                b[p] = rng.pick(&[0x00, 0xff, 0x7f, 0x80, 0x01, 0x08, 0x0a, 0x12]);
            }
            format!("bytes: {k} byte(s) set to boundary values")
        }
        2 => {
            let p = position(rng, len);
            let n = 1 + rng.below(16);
            let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            b.splice(p..p, ins);
            format!("bytes: {n} random byte(s) inserted at {p}")
        }
        3 => {
            let p = position(rng, len);
            let n = (1 + rng.below(64)).min(len - p);
            b.drain(p..p + n);
            format!("bytes: {n} byte(s) deleted at {p}")
        }
        4 => {
            let keep = rng.below(len);
            b.truncate(keep);
            format!("bytes: truncated to {keep} of {len}")
        }
        5 => {
            let from = position(rng, len);
            let to = position(rng, len);
            let n = (1 + rng.below(256)).min(len - from).min(len - to);
            b.copy_within(from..from + n, to);
            format!("bytes: {n} byte(s) copied from {from} to {to}")
        }
        _ => {
            // A run of 0xff makes a maximal varint: huge lengths and tags.
            let p = position(rng, len);
            let n = (1 + rng.below(10)).min(len - p);
            b[p..p + n].fill(0xff);
            format!("bytes: {n}-byte varint stomp at {p}")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Protobuf-aware mutations of the decoded model.

/// Every tensor name the graph mentions, for inputs that point somewhere plausible.
fn tensor_names(g: &pb::GraphProto) -> Vec<String> {
    g.input
        .iter()
        .map(|v| v.name.clone())
        .chain(g.initializer.iter().map(|t| t.name.clone()))
        .chain(g.node.iter().flat_map(|n| n.output.iter().cloned()))
        .collect()
}

fn random_ints(rng: &mut Rng) -> Vec<i64> {
    let len = rng.below(10);
    (0..len).map(|_| interesting_or_small(rng)).collect()
}

fn set_attr(n: &mut pb::NodeProto, a: pb::AttributeProto) {
    n.attribute.retain(|x| x.name != a.name);
    n.attribute.push(a);
}

fn mutate_initializer(g: &mut pb::GraphProto, rng: &mut Rng) -> String {
    if g.initializer.is_empty() {
        return "no initializer to mutate".into();
    }
    let i = rng.below(g.initializer.len());
    let t = &mut g.initializer[i];
    let name = t.name.clone();
    match rng.below(6) {
        0 => {
            match rng.below(4) {
                0 if !t.dims.is_empty() => {
                    let d = rng.below(t.dims.len());
                    t.dims[d] = rng.pick(INTERESTING);
                }
                1 => t.dims.push(rng.pick(INTERESTING)),
                2 => {
                    t.dims.pop();
                }
                _ => t.dims = random_ints(rng),
            }
            format!("initializer `{name}`: dims -> {:?}", t.dims)
        }
        1 => {
            if !t.raw_data.is_empty() {
                let keep = rng.below(t.raw_data.len());
                t.raw_data.truncate(keep);
                format!("initializer `{name}`: raw_data truncated to {keep}")
            } else {
                let keep = rng.below(t.float_data.len().max(1));
                t.float_data.truncate(keep);
                t.int64_data.truncate(keep);
                t.int32_data.truncate(keep);
                format!("initializer `{name}`: typed data truncated to {keep}")
            }
        }
        2 => {
            let v = rng.pick(&[
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::MAX,
                -0.0,
                1e-45,
                // Finite but overflowing once multiplied (issue 42).
                1e38,
                -3e37,
            ]);
            if t.raw_data.len() >= 4 {
                let at = 4 * rng.below(t.raw_data.len() / 4);
                t.raw_data[at..at + 4].copy_from_slice(&v.to_le_bytes());
            } else if !t.float_data.is_empty() {
                let at = rng.below(t.float_data.len());
                t.float_data[at] = v;
            } else {
                t.float_data.push(v);
            }
            format!("initializer `{name}`: value {v} written")
        }
        3 => {
            t.data_type = rng.pick(&[
                0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 23, 99, -1,
            ]);
            format!("initializer `{name}`: data_type -> {}", t.data_type)
        }
        4 => {
            // Shape-like constants (Reshape shapes, Resize scales, Slice bounds) set to extremes.
            let v = rng.pick(INTERESTING);
            if !t.int64_data.is_empty() {
                let at = rng.below(t.int64_data.len());
                t.int64_data[at] = v;
            } else if t.raw_data.len() >= 8
                && t.data_type == pb::tensor_proto::DataType::Int64 as i32
            {
                let at = 8 * rng.below(t.raw_data.len() / 8);
                t.raw_data[at..at + 8].copy_from_slice(&v.to_le_bytes());
            } else if t.raw_data.len() >= 4 {
                let at = 4 * rng.below(t.raw_data.len() / 4);
                t.raw_data[at..at + 4].copy_from_slice(&(v as f32).to_le_bytes());
            } else if !t.float_data.is_empty() {
                let at = rng.below(t.float_data.len());
                t.float_data[at] = v as f32;
            }
            format!("initializer `{name}`: an element set to {v}")
        }
        5 if rng.one_in(3) => {
            // Every value zero: a BatchNorm variance of 0 (with epsilon 0 elsewhere) divides by
            // zero when folded.
            t.raw_data.iter_mut().for_each(|b| *b = 0);
            t.float_data.iter_mut().for_each(|v| *v = 0.0);
            format!("initializer `{name}`: all values zero")
        }
        _ => {
            // Raw and typed data both present, or neither.
            if rng.one_in(2) {
                t.raw_data.clear();
                t.float_data.clear();
                t.int64_data.clear();
                t.int32_data.clear();
                format!("initializer `{name}`: all data removed")
            } else {
                t.float_data.extend(values(3, 7));
                format!("initializer `{name}`: float_data added beside raw_data")
            }
        }
    }
}

fn mutate_external(g: &mut pb::GraphProto, rng: &mut Rng) -> String {
    if g.initializer.is_empty() {
        return "no initializer to make external".into();
    }
    let i = rng.below(g.initializer.len());
    let t = &mut g.initializer[i];
    t.data_location = Some(pb::tensor_proto::DataLocation::External as i32);
    if rng.one_in(2) {
        t.raw_data.clear();
        t.float_data.clear();
    }
    let entry = |k: &str, v: &str| pb::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    t.external_data.clear();
    let location = rng.pick(&[
        "../x",
        "/etc/passwd",
        WEIGHTS_FILE,
        "",
        "missing.bin",
        "sub/../weights.bin",
        ".",
        "a\0b",
    ]);
    if !rng.one_in(8) {
        t.external_data.push(entry("location", location));
    }
    let offset = rng.pick(&[
        "18446744073709551615",
        "0",
        "4",
        "-1",
        "abc",
        " 16 ",
        "65535",
    ]);
    if rng.one_in(2) {
        t.external_data.push(entry("offset", offset));
    }
    let length = rng.pick(&["18446744073709551615", "0", "16", "65536", "1"]);
    if rng.one_in(2) {
        t.external_data.push(entry("length", length));
    }
    format!(
        "initializer `{}`: external data {:?}",
        t.name,
        t.external_data
            .iter()
            .map(|e| format!("{}={:?}", e.key, e.value))
            .collect::<Vec<_>>()
    )
}

fn mutate_node(g: &mut pb::GraphProto, rng: &mut Rng) -> String {
    if g.node.is_empty() {
        return "no node to mutate".into();
    }
    let names = tensor_names(g);
    let i = rng.below(g.node.len());
    let n = &mut g.node[i];
    let who = format!("node {i} `{}` ({})", n.name, n.op_type);
    match rng.below(9) {
        0 => {
            n.op_type = rng.pick(OPS).into();
            format!("{who}: op_type -> {}", n.op_type)
        }
        1 => {
            if !n.input.is_empty() {
                n.input.remove(rng.below(n.input.len()));
            }
            format!("{who}: an input dropped")
        }
        2 => {
            let extra = if names.is_empty() || rng.one_in(3) {
                n.input.first().cloned().unwrap_or_default()
            } else {
                names[rng.below(names.len())].clone()
            };
            for _ in 0..1 + rng.below(3) {
                n.input.push(extra.clone());
            }
            format!("{who}: input(s) `{extra}` added")
        }
        3 => {
            let v = rng.pick(&["", "no_such_tensor"]).to_string();
            if n.input.is_empty() {
                n.input.push(v.clone());
            } else {
                let k = rng.below(n.input.len());
                n.input[k] = v.clone();
            }
            format!("{who}: an input set to {v:?}")
        }
        4 => {
            let name = rng.pick(&[
                "axis",
                "group",
                "keepdims",
                "transA",
                "transB",
                "blocksize",
                "ceil_mode",
                "count_include_pad",
                "storage_order",
                "allowzero",
                "select_last_index",
            ]);
            let v = rng.pick(&[255, -300, -1, 0, 1, 3, 7, 1 << 40, i64::MIN, i64::MAX]);
            set_attr(n, proto::int_attr(name, v));
            format!("{who}: {name} = {v}")
        }
        5 => {
            let name = rng.pick(&[
                "perm",
                "pads",
                "strides",
                "kernel_shape",
                "dilations",
                "axes",
                "output_shape",
                "output_padding",
                "split",
                "starts",
                "ends",
                "shape",
            ]);
            let v = if name == "perm" && rng.one_in(2) {
                // Permutation-like: duplicates and out-of-range entries.
                let mut p: Vec<i64> = (0..rng.below(6) as i64).collect();
                if !p.is_empty() {
                    let k = rng.below(p.len());
                    p[k] = rng.pick(&[0, 4, 9, -1, 255]);
                }
                p
            } else {
                random_ints(rng)
            };
            set_attr(n, proto::ints_attr(name, &v));
            format!("{who}: {name} = {v:?}")
        }
        6 => {
            let name = rng.pick(&[
                "epsilon", "alpha", "beta", "momentum", "min", "max", "scale",
            ]);
            let v = rng.pick(&[f32::NAN, f32::INFINITY, -1.0, 0.0, 1e30, -1e-30]);
            set_attr(
                n,
                pb::AttributeProto {
                    name: name.into(),
                    r#type: pb::attribute_proto::AttributeType::Float as i32,
                    f: v,
                    ..Default::default()
                },
            );
            format!("{who}: {name} = {v}")
        }
        7 => {
            let name = rng.pick(&[
                "mode",
                "auto_pad",
                "coordinate_transformation_mode",
                "nearest_mode",
                "direction",
            ]);
            let v = rng.pick(&[
                "",
                "SAME_UPPER",
                "SAME_LOWER",
                "VALID",
                "cubic",
                "nearest",
                "DCR",
                "bogus",
            ]);
            set_attr(
                n,
                pb::AttributeProto {
                    name: name.into(),
                    r#type: pb::attribute_proto::AttributeType::String as i32,
                    s: v.as_bytes().to_vec(),
                    ..Default::default()
                },
            );
            format!("{who}: {name} = {v:?}")
        }
        _ => {
            // An attribute whose type disagrees with its payload.
            if n.attribute.is_empty() {
                n.attribute.push(proto::int_attr("axis", 1));
            }
            let k = rng.below(n.attribute.len());
            let a = &mut n.attribute[k];
            a.r#type = rng.pick(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 99]);
            format!("{who}: attribute `{}` type -> {}", a.name, a.r#type)
        }
    }
}

fn mutate_structure(p: &mut pb::ModelProto, rng: &mut Rng) -> String {
    if rng.one_in(6) {
        let v = rng.pick(&[
            0,
            1,
            6,
            7,
            9,
            10,
            11,
            12,
            13,
            17,
            21,
            22,
            9999,
            -1,
            i64::MAX,
        ]);
        match rng.below(4) {
            0 => p.opset_import.clear(),
            1 => p.opset_import.push(pb::OperatorSetIdProto {
                domain: String::new(),
                version: v,
            }),
            _ => {
                for o in p.opset_import.iter_mut() {
                    o.version = v;
                }
            }
        }
        return format!("opset -> {v} (imports {:?})", p.opset_import);
    }
    let Some(g) = p.graph.as_mut() else {
        return "no graph".into();
    };
    let len = g.node.len();
    match rng.below(10) {
        0 => {
            if g.output.is_empty() {
                return "no output to rename".into();
            }
            let k = rng.below(g.output.len());
            g.output[k].name = rng.pick(&["", "renamed_output", "x"]).into();
            format!("graph output {k} renamed to {:?}", g.output[k].name)
        }
        1 => {
            if len == 0 {
                return "no node to remove".into();
            }
            let k = rng.below(len);
            g.node.remove(k);
            format!("node {k} removed")
        }
        2 => {
            g.node.reverse();
            "node order reversed".into()
        }
        3 => {
            // A cycle: an early node reads a later node's output.
            if len < 2 {
                return "too few nodes for a cycle".into();
            }
            let late = 1 + rng.below(len - 1);
            let early = rng.below(late);
            let Some(out) = g.node[late].output.first().cloned() else {
                return "later node has no output".into();
            };
            if g.node[early].input.is_empty() {
                g.node[early].input.push(out.clone());
            } else {
                g.node[early].input[0] = out.clone();
            }
            format!("cycle: node {early} reads `{out}` from node {late}")
        }
        4 => {
            if len == 0 {
                return "no node to duplicate".into();
            }
            let k = rng.below(len);
            let copy = g.node[k].clone();
            g.node.insert(rng.below(len + 1), copy);
            format!("node {k} duplicated (two producers of its outputs)")
        }
        5 => {
            if len == 0 {
                return "no node to move".into();
            }
            let k = rng.below(len);
            g.node[k].domain = rng
                .pick(&["ai.onnx.ml", "com.microsoft", "ai.onnx", "x"])
                .into();
            format!("node {k} domain -> {}", g.node[k].domain)
        }
        6 => {
            // A Constant node whose tensor becomes an initializer before validation.
            let mut t = proto::f32_tensor("c", &[2], &[1.0, 2.0]);
            t.dims = random_ints(rng);
            let out = g
                .node
                .first()
                .and_then(|n| n.input.first().cloned())
                .unwrap_or_default();
            let name = if rng.one_in(2) {
                out
            } else {
                "const_out".to_string()
            };
            let node = pb::NodeProto {
                op_type: "Constant".into(),
                name: "fuzz_const".into(),
                output: vec![name.clone()],
                attribute: vec![pb::AttributeProto {
                    name: "value".into(),
                    r#type: pb::attribute_proto::AttributeType::Tensor as i32,
                    t: Some(t.clone()),
                    ..Default::default()
                }],
                ..Default::default()
            };
            g.node.insert(0, node);
            format!("Constant `{name}` with dims {:?} inserted", t.dims)
        }
        7 => {
            if g.initializer.is_empty() {
                return "no initializer to drop".into();
            }
            let k = rng.below(g.initializer.len());
            let t = g.initializer.remove(k);
            format!("initializer `{}` removed", t.name)
        }
        8 => mutate_graph_input(g, rng),
        _ => {
            match rng.below(3) {
                0 => g.input.clear(),
                1 => g.output.clear(),
                _ => {
                    // An intermediate tensor exposed as a further output, or as the first one.
                    let names = tensor_names(g);
                    let name = names
                        .get(rng.below(names.len()))
                        .cloned()
                        .unwrap_or_default();
                    g.output.insert(0, proto::float_value_info(&name, None));
                }
            }
            "graph inputs/outputs edited".into()
        }
    }
}

/// The image input's declared type: dims (zero, negative, huge, symbolic), rank, element type.
fn mutate_graph_input(g: &mut pb::GraphProto, rng: &mut Rng) -> String {
    let Some(v) = g.input.first_mut() else {
        return "no graph input".into();
    };
    let Some(pb::type_proto::Value::TensorType(tt)) =
        v.r#type.as_mut().and_then(|t| t.value.as_mut())
    else {
        v.r#type = None;
        return "graph input type removed".into();
    };
    if rng.one_in(4) {
        tt.elem_type = rng.pick(&[0, 2, 7, 10, 11, 16, 99]);
        return format!("graph input elem_type -> {}", tt.elem_type);
    }
    let shape = tt.shape.get_or_insert_with(Default::default);
    match rng.below(3) {
        0 if !shape.dim.is_empty() => {
            let k = rng.below(shape.dim.len());
            shape.dim[k].value = Some(if rng.one_in(4) {
                Dim::DimParam("N".into())
            } else {
                Dim::DimValue(interesting_or_small(rng))
            });
        }
        1 => {
            shape.dim.push(pb::tensor_shape_proto::Dimension {
                value: Some(Dim::DimValue(interesting_or_small(rng))),
                ..Default::default()
            });
        }
        _ => {
            shape.dim.pop();
        }
    }
    format!(
        "graph input dims -> {:?}",
        shape
            .dim
            .iter()
            .map(|d| d.value.clone())
            .collect::<Vec<_>>()
    )
}

fn mutate_proto(p: &mut pb::ModelProto, rng: &mut Rng) -> String {
    let Some(g) = p.graph.as_mut() else {
        return "no graph".into();
    };
    match rng.below(11) {
        0..=2 => mutate_initializer(g, rng),
        3 => mutate_external(g, rng),
        4..=6 => mutate_node(g, rng),
        7..=9 => mutate_structure(p, rng),
        _ => {
            p.ir_version = rng.pick(&[0, 1, 2, 3, 7, 10, 12, 13, 99, -1]);
            format!("ir_version -> {}", p.ir_version)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Seeds, and making mutant `i`.

struct Seed {
    name: &'static str,
    bytes: Vec<u8>,
    proto: pb::ModelProto,
}

/// Most mutants come from the small generated model (built in milliseconds); every tenth from
/// a bundled one, alternating, since tract takes far longer to build those.
fn seed_index(i: u64) -> usize {
    match (i % 10, (i / 10) % 2) {
        (9, 0) => 1,
        (9, _) => 2,
        _ => 0,
    }
}

fn load_seeds() -> Vec<Seed> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sample_models");
    let mut files = vec![("residual_classifier", residual_classifier(4).to_bytes(13))];
    for name in ["fashion_resnet", "fashion_scenes_deeplab"] {
        let path = dir.join(format!("{name}.onnx"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        files.push((name, bytes));
    }
    files
        .into_iter()
        .map(|(name, bytes)| {
            let proto = pb::ModelProto::decode(bytes.as_slice()).expect("seed decodes");
            Seed { name, bytes, proto }
        })
        .collect()
}

/// Mutant `i` of `seed`: 1 to 3 stacked edits, byte-level or protobuf-aware (then sometimes a
/// byte edit on top). Depends on (seed, i) only, so `FUZZ_ITER=i` replays it alone.
fn make_mutant(seeds: &[Seed], seed: u64, i: u64) -> (usize, Vec<u8>, Vec<String>) {
    let mut rng = Rng::new(seed.wrapping_add((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let s = seed_index(i);
    let edits = 1 + rng.below(3);
    let mut what = vec![];
    let mut bytes = if rng.below(10) < 3 {
        let mut b = seeds[s].bytes.clone();
        for _ in 0..edits {
            what.push(mutate_bytes(&mut b, &mut rng));
        }
        b
    } else {
        let mut p = seeds[s].proto.clone();
        for _ in 0..edits {
            what.push(mutate_proto(&mut p, &mut rng));
        }
        p.encode_to_vec()
    };
    if rng.one_in(8) {
        what.push(mutate_bytes(&mut bytes, &mut rng));
    }
    (s, bytes, what)
}

// ---------------------------------------------------------------------------------------------
// Running one mutant through the path the app takes.

/// External-data mutants that name this file get real bytes to read (beside the mutant's path).
const WEIGHTS_FILE: &str = "weights.bin";

/// Largest input the harness builds for, as the pipeline's memory check would.
const MAX_INPUT_ELEMENTS: usize = 1 << 24;
const MAX_ACTIVATION_BYTES: u64 = 1 << 30;

#[derive(Default)]
struct Reached {
    loaded: bool,
    built: bool,
    ran: bool,
    /// Not built: the input or the inferred activations would not fit (the pipeline refuses it).
    too_large: bool,
    /// Why the loader refused the mutant (the `ModelError` variant), to see what the mutations hit.
    refused: Option<String>,
    /// Messages of panics `guard::catch` contained (in shape inference, build or run).
    contained: Vec<String>,
}

fn exercise(path: &Path, bytes: &[u8]) -> Reached {
    let mut r = Reached::default();
    // Deliberately not inside `guard::catch`: a panic here is the bug this test hunts.
    let m = match Model::from_bytes(path, bytes) {
        Ok(m) => m,
        Err(e) => {
            let debug = format!("{e:?}");
            let variant = debug.split([' ', '{', '(']).next().unwrap_or_default();
            r.refused = Some(variant.to_string());
            return r;
        }
    };
    r.loaded = true;
    // A fixed model builds at its own size; a dynamic one at 16x16, as tests elsewhere do.
    let Ok(hw) = m.input_hw(None).or_else(|_| m.input_hw(Some([16, 16]))) else {
        return r;
    };
    let shape = m.input_shape(1, hw);
    let elements = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let Some(elements) = elements.filter(|&n| n <= MAX_INPUT_ELEMENTS) else {
        r.too_large = true;
        return r;
    };
    // The pipeline's memory check, cheaply: an allocation failure would abort the whole test.
    match guard::catch("inferring shapes", || infer_shapes(&m, hw)) {
        Err(msg) => r.contained.push(msg),
        Ok(Ok(shapes)) => {
            let bytes = shapes
                .values()
                .map(|d| d.iter().fold(4u64, |a, &v| a.saturating_mul(v as u64)))
                .fold(0u64, u64::saturating_add);
            if bytes > MAX_ACTIVATION_BYTES {
                r.too_large = true;
                return r;
            }
        }
        // Tract could not infer shapes: the pipeline still builds, and so do we.
        Ok(Err(_)) => {}
    }
    let built = guard::catch("building FP32", || {
        backend(BackendKind::Cpu).build(
            BuildInput::Float {
                model: &m,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            BuildSpec { batch: 1, hw },
        )
    });
    let mut engine = match built {
        Err(msg) => {
            r.contained.push(msg);
            return r;
        }
        Ok(Err(_)) => return r,
        Ok(Ok(e)) => e,
    };
    r.built = true;
    let input = vec![0f32; elements];
    match guard::catch("running FP32", || engine.run(&input)) {
        Err(msg) => r.contained.push(msg),
        Ok(Ok(_)) => r.ran = true,
        Ok(Err(_)) => {}
    }
    r
}

/// `file:line` from guard's "(at file:line)", the key contained panics are deduplicated by;
/// paths into the cargo registry are cut to `crate-version/src/...` to stay readable.
fn location_of(msg: &str) -> String {
    let loc = msg
        .rsplit_once("(at ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(loc, _)| loc)
        .unwrap_or(msg);
    short_path(loc)
}

fn short_path(loc: &str) -> String {
    loc.split_once("/registry/src/")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, rest)| rest)
        .unwrap_or(loc)
        .to_string()
}

/// Where the last panic outside `guard::catch` happened, filled by the hook installed below.
static LAST_PANIC_AT: Mutex<Option<String>> = Mutex::new(None);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The mutant in flight, for the hang watchdog.
struct InFlight {
    i: u64,
    since: Instant,
    bytes: Arc<Vec<u8>>,
    what: String,
}

#[derive(Default)]
struct PerSeed {
    mutants: u64,
    loaded: u64,
    built: u64,
    ran: u64,
}

#[test]
fn mutants_never_crash_the_loader() {
    // Panics outside `guard::catch` keep being printed (by the default hook) and their location
    // is kept for the report; guard's hook, installed over this one, silences contained panics.
    let default_hook = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()));
        *LAST_PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) = at;
        default_hook(info);
    }));
    guard::install_hook();

    // `cargo test` (and CI) use a fixed seed, so a failure there is the same on every machine;
    // `tools/fuzz.sh` asks for a fresh one (FUZZ_SEED=random) to explore further.
    let seed = match std::env::var("FUZZ_SEED").ok().as_deref() {
        Some("random") => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        _ => env_u64("FUZZ_SEED").unwrap_or(FIXED_SEED),
    };
    let budget = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(40.0);
    let only = env_u64("FUZZ_ITER");
    let hang = Duration::from_secs(env_u64("FUZZ_HANG_SECONDS").unwrap_or(120));
    println!("fuzz: seed {seed} (FUZZ_SEED={seed} replays this run), budget {budget} s");

    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let crash_dir = target.join("fuzz-crashes");
    let work = target.join("fuzz-work");
    std::fs::create_dir_all(&crash_dir).expect("create target/fuzz-crashes");
    std::fs::create_dir_all(&work).expect("create target/fuzz-work");
    let weights: Vec<u8> = values(16 << 10, 5)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(work.join(WEIGHTS_FILE), weights).expect("write the external-data file");
    // Never written: the loader only uses its folder, to resolve external data.
    let model_path = work.join("mutant.onnx");

    let seeds = load_seeds();
    let mut per_seed: Vec<PerSeed> = seeds.iter().map(|_| PerSeed::default()).collect();

    // A mutant that never finishes is a finding too; the watchdog saves it and ends the process.
    let in_flight: Arc<Mutex<Option<InFlight>>> = Arc::new(Mutex::new(None));
    {
        let in_flight = Arc::clone(&in_flight);
        let crash_dir = crash_dir.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let guard = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(f) = guard.as_ref()
                    && f.since.elapsed() > hang
                {
                    let file = crash_dir.join(format!("{seed}-{}-hang.onnx", f.i));
                    let saved = std::fs::write(&file, f.bytes.as_slice()).is_ok();
                    eprintln!(
                        "fuzz: HANG: mutant {} (seed {seed}, FUZZ_ITER={} replays it) ran over {} s; mutation: {}; {}",
                        f.i,
                        f.i,
                        hang.as_secs(),
                        f.what,
                        if saved {
                            format!("saved to {}", file.display())
                        } else {
                            "not saved".into()
                        }
                    );
                    std::process::exit(1);
                }
            }
        });
    }

    let started = Instant::now();
    // Loader crashes by location: (message, mutation, saved file).
    let mut crashes: BTreeMap<String, (String, String, PathBuf)> = BTreeMap::new();
    // Contained panics by location: (count, first message, first mutant's file).
    let mut contained: BTreeMap<String, (u64, String, PathBuf)> = BTreeMap::new();
    let mut too_large = 0u64;
    let mut refused: BTreeMap<String, u64> = BTreeMap::new();
    let mut n = 0u64;
    let iterations: Box<dyn Iterator<Item = u64>> = match only {
        Some(i) => Box::new(std::iter::once(i)),
        None => Box::new(0..),
    };
    for i in iterations {
        if only.is_none() && started.elapsed().as_secs_f64() >= budget {
            break;
        }
        let (s, bytes, what) = make_mutant(&seeds, seed, i);
        let what = what.join("; ");
        if only.is_some() {
            println!("fuzz: mutant {i} of {}: {what}", seeds[s].name);
        }
        let bytes = Arc::new(bytes);
        *in_flight.lock().unwrap_or_else(|e| e.into_inner()) = Some(InFlight {
            i,
            since: Instant::now(),
            bytes: Arc::clone(&bytes),
            what: what.clone(),
        });
        // Only to keep the mutant and go on: a panic that gets here fails the test at the end.
        let result = panic::catch_unwind(AssertUnwindSafe(|| exercise(&model_path, &bytes)));
        *in_flight.lock().unwrap_or_else(|e| e.into_inner()) = None;
        n += 1;
        let stats = &mut per_seed[s];
        stats.mutants += 1;
        match result {
            Ok(r) => {
                stats.loaded += r.loaded as u64;
                stats.built += r.built as u64;
                stats.ran += r.ran as u64;
                too_large += r.too_large as u64;
                if let Some(why) = r.refused {
                    *refused.entry(why).or_insert(0) += 1;
                }
                for msg in r.contained {
                    let at = location_of(&msg);
                    let entry = contained.entry(at).or_insert_with(|| {
                        let file = crash_dir.join(format!("contained-{seed}-{i}.onnx"));
                        let _ = std::fs::write(&file, bytes.as_slice());
                        (0, msg.clone(), file)
                    });
                    entry.0 += 1;
                }
            }
            Err(payload) => {
                let msg = guard::payload_text(payload.as_ref());
                let at = LAST_PANIC_AT
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .map(|l| short_path(&l))
                    .unwrap_or_else(|| "unknown location".into());
                let file = crash_dir.join(format!("{seed}-{i}.onnx"));
                if let Err(e) = std::fs::write(&file, bytes.as_slice()) {
                    eprintln!("fuzz: cannot save {}: {e}", file.display());
                }
                eprintln!(
                    "fuzz: LOADER CRASH: mutant {i} of {} (seed {seed}, FUZZ_ITER={i} replays it): `{msg}` at {at}; mutation: {what}; saved to {}",
                    seeds[s].name,
                    file.display()
                );
                crashes.entry(at).or_insert((msg, what, file));
            }
        }
    }

    let secs = started.elapsed().as_secs_f64();
    for (seed_info, st) in seeds.iter().zip(&per_seed) {
        println!(
            "fuzz:   {}: {} mutants, {} loaded, {} built, {} ran",
            seed_info.name, st.mutants, st.loaded, st.built, st.ran
        );
    }
    for (at, (count, msg, file)) in &contained {
        println!(
            "fuzz:   contained x{count} at {at}: {msg} (first: {})",
            file.display()
        );
    }
    println!("fuzz:   refused by the loader: {refused:?}");
    println!("fuzz:   {too_large} loaded mutants not built: input or activations too large");
    let total = |f: fn(&PerSeed) -> u64| per_seed.iter().map(f).sum::<u64>();
    println!(
        "fuzz: {n} mutants (seed {seed}, {secs:.0} s): {} loaded, {} built, {} ran, {} loader crashes, {} contained panics at [{}]",
        total(|s| s.loaded),
        total(|s| s.built),
        total(|s| s.ran),
        crashes.len(),
        contained.values().map(|c| c.0).sum::<u64>(),
        contained.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    let report: Vec<String> = crashes
        .iter()
        .map(|(at, (msg, what, file))| {
            format!("`{msg}` at {at} (mutation: {what}; {})", file.display())
        })
        .collect();
    assert!(
        crashes.is_empty(),
        "Model::from_bytes panicked (seed {seed}):\n{}",
        report.join("\n")
    );
}
