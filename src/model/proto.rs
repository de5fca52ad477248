//! Small helpers over the ONNX protobuf types (tract-onnx's prost structs): reading and
//! writing tensors, attributes and value infos, so the rest of the crate never touches
//! raw protobuf fields directly.

use std::collections::HashMap;

use tract_onnx::pb::{
    self, AttributeProto, NodeProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    tensor_proto::DataType, tensor_shape_proto, type_proto,
};

/// An f32 tensor read out of an initializer (weights, biases, scales).
#[derive(Clone, Debug, PartialEq)]
pub struct F32Tensor {
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

impl F32Tensor {
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Decodes a float, double or half initializer into f32 values.
/// Integer initializers (shapes, axes) are decoded by [`tensor_i64`].
pub fn tensor_f32(t: &TensorProto) -> Option<F32Tensor> {
    let dims: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
    let n: usize = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    let data = match DataType::try_from(t.data_type).ok()? {
        DataType::Float => {
            if !t.raw_data.is_empty() {
                t.raw_data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            } else {
                t.float_data.clone()
            }
        }
        DataType::Double => {
            if !t.raw_data.is_empty() {
                t.raw_data
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32)
                    .collect()
            } else {
                t.double_data.iter().map(|&v| v as f32).collect()
            }
        }
        DataType::Float16 => {
            if !t.raw_data.is_empty() {
                t.raw_data
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect()
            } else {
                t.int32_data
                    .iter()
                    .map(|&v| half::f16::from_bits(v as u16).to_f32())
                    .collect()
            }
        }
        _ => return None,
    };
    (data.len() == n).then_some(F32Tensor { dims, data })
}

/// Decodes an integer initializer (int64, int32, int8, uint8) into i64 values.
pub fn tensor_i64(t: &TensorProto) -> Option<Vec<i64>> {
    let v: Vec<i64> = match DataType::try_from(t.data_type).ok()? {
        DataType::Int64 if !t.raw_data.is_empty() => t
            .raw_data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        DataType::Int64 => t.int64_data.clone(),
        DataType::Int32 if !t.raw_data.is_empty() => t
            .raw_data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
        DataType::Int32 => t.int32_data.iter().map(|&v| v as i64).collect(),
        DataType::Int8 if !t.raw_data.is_empty() => {
            t.raw_data.iter().map(|&b| b as i8 as i64).collect()
        }
        DataType::Int8 => t.int32_data.iter().map(|&v| v as i64).collect(),
        DataType::Uint8 if !t.raw_data.is_empty() => t.raw_data.iter().map(|&b| b as i64).collect(),
        DataType::Uint8 => t.int32_data.iter().map(|&v| v as i64).collect(),
        _ => return None,
    };
    Some(v)
}

/// Number of elements and bytes one element takes, for the parameter count.
pub fn tensor_numel_and_elem_bytes(t: &TensorProto) -> (u64, u64) {
    // Saturating: sizes come from the file; validation refuses the ones that overflow.
    let n: u64 = t
        .dims
        .iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(d.max(0) as u64));
    let b = match DataType::try_from(t.data_type).unwrap_or(DataType::Undefined) {
        DataType::Float | DataType::Int32 | DataType::Uint32 => 4,
        DataType::Double | DataType::Int64 | DataType::Uint64 => 8,
        DataType::Float16 | DataType::Bfloat16 | DataType::Int16 | DataType::Uint16 => 2,
        _ => 1,
    };
    (n, b)
}

pub fn f32_tensor(name: &str, dims: &[usize], data: &[f32]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::Float as i32,
        raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

pub fn i8_tensor(name: &str, dims: &[usize], data: &[i8]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::Int8 as i32,
        raw_data: data.iter().map(|&v| v as u8).collect(),
        ..Default::default()
    }
}

pub fn u8_tensor(name: &str, dims: &[usize], data: &[u8]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::Uint8 as i32,
        raw_data: data.to_vec(),
        ..Default::default()
    }
}

pub fn i32_tensor(name: &str, dims: &[usize], data: &[i32]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::Int32 as i32,
        raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

pub fn i64_tensor(name: &str, dims: &[usize], data: &[i64]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::Int64 as i32,
        raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

pub fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

pub fn attr_i(node: &NodeProto, name: &str) -> Option<i64> {
    attr(node, name).map(|a| a.i)
}

pub fn attr_f(node: &NodeProto, name: &str) -> Option<f32> {
    attr(node, name).map(|a| a.f)
}

pub fn attr_ints(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}

pub fn attr_str(node: &NodeProto, name: &str) -> Option<String> {
    attr(node, name).map(|a| String::from_utf8_lossy(&a.s).into_owned())
}

pub fn str_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::String as i32,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

pub fn float_attr(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Float as i32,
        f: v,
        ..Default::default()
    }
}

pub fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// The shape of a value info: `Some(n)` for a fixed dimension, `None` for a symbolic one.
pub fn value_info_shape(v: &ValueInfoProto) -> Option<Vec<Option<i64>>> {
    let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    let shape = t.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(tensor_shape_proto::dimension::Value::DimValue(n)) if *n > 0 => Some(*n),
                _ => None,
            })
            .collect(),
    )
}

pub fn value_info_elem_type(v: &ValueInfoProto) -> Option<i32> {
    match v.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(t.elem_type),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

pub fn float_value_info(name: &str, shape: Option<&[usize]>) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: shape.map(|s| TensorShapeProto {
                    dim: s
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn data_type_name(t: i32) -> &'static str {
    match DataType::try_from(t).unwrap_or(DataType::Undefined) {
        DataType::Float => "float32",
        DataType::Float16 => "float16",
        DataType::Double => "float64",
        DataType::Int8 => "int8",
        DataType::Uint8 => "uint8",
        DataType::Int32 => "int32",
        DataType::Int64 => "int64",
        DataType::Bool => "bool",
        _ => "other",
    }
}

/// The element type node `n`'s subgraph attribute `attr` declares for its output `k`.
fn subgraph_output_type(n: &pb::NodeProto, attr: &str, k: usize) -> Option<i32> {
    let g = n.attribute.iter().find(|a| a.name == attr)?.g.as_ref()?;
    let o = g.output.get(k)?;
    value_info_elem_type(o)
        .filter(|t| *t != 0)
        .or_else(|| tensor_types(g).get(&o.name).copied())
}

/// Element type of every tensor, from the graph's inputs, initializers and value infos, then
/// propagated through the nodes in order by each op's typing rule.
pub fn tensor_types(g: &pb::GraphProto) -> HashMap<String, i32> {
    let mut types: HashMap<String, i32> = HashMap::new();
    for v in g.input.iter().chain(&g.value_info).chain(&g.output) {
        if let Some(t) = value_info_elem_type(v).filter(|t| *t != 0) {
            types.insert(v.name.clone(), t);
        }
    }
    for t in &g.initializer {
        types.insert(t.name.clone(), t.data_type);
    }
    for n in &g.node {
        let of = |slot: usize| n.input.get(slot).and_then(|t| types.get(t)).copied();
        let attr_type = |a: &str| attr_i(n, a).map(|v| v as i32);
        let value_attr = || {
            n.attribute.iter().find_map(|a| match a.name.as_str() {
                "value" => a.t.as_ref().map(|t| t.data_type),
                "value_float" | "value_floats" => Some(DataType::Float as i32),
                "value_int" | "value_ints" => Some(DataType::Int64 as i32),
                _ => None,
            })
        };
        let first: Option<i32> = match n.op_type.as_str() {
            "Cast" => attr_type("to"),
            "CastLike" => of(1),
            "Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin" => Some(DataType::Int64 as i32),
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "Not" | "And"
            | "Or" | "Xor" | "IsNaN" | "IsInf" => Some(DataType::Bool as i32),
            "Constant" => value_attr(),
            "ConstantOfShape" => value_attr().or(Some(DataType::Float as i32)),
            "QuantizeLinear" => of(2).or(Some(DataType::Uint8 as i32)),
            "DequantizeLinear" => of(1).or(Some(DataType::Float as i32)),
            "RandomNormal" | "RandomUniform" | "RandomNormalLike" | "RandomUniformLike"
            | "EyeLike" => attr_type("dtype")
                .or(of(0))
                .or(Some(DataType::Float as i32)),
            "Where" => of(1),
            "OneHot" => of(2),
            _ => of(0),
        };
        let output_type = |k: usize| -> Option<i32> {
            match (n.op_type.as_str(), k) {
                ("TopK" | "MaxPool", 1) => Some(DataType::Int64 as i32),
                // Output k is the branch's output k; a Loop's k-th output is its k-th carried
                // value (input 2 + k), or a scan output (the body's output 1 + k).
                ("If", _) => subgraph_output_type(n, "then_branch", k),
                ("Loop", _) => of(2 + k).or_else(|| subgraph_output_type(n, "body", 1 + k)),
                _ => first,
            }
        };
        let typed: Vec<Option<i32>> = (0..n.output.len()).map(output_type).collect();
        for (o, t) in n.output.iter().zip(typed) {
            if let Some(t) = t.filter(|_| !o.is_empty()) {
                types.entry(o.clone()).or_insert(t);
            }
        }
    }
    types
}
