//! Models stored in FP16 (float16 initializers, tensors and graph I/O, as `model.half()`
//! exports them): upcast to FP32 at load, exactly (every f16 value is an f32 value), so every
//! later stage sees one float type. The FP32 rows then compute from the FP16 weights; the
//! FP16 engines round them back without loss.

use tract_onnx::pb;
use tract_onnx::pb::tensor_proto::DataType;

use super::proto;

/// Rewrites float16 (and bfloat16) initializers, I/O and value types, Cast targets and
/// tensor attributes of `graph` to float; returns how many initializers were upcast.
pub fn upcast(graph: &mut pb::GraphProto) -> usize {
    let half = |t: i32| t == DataType::Float16 as i32 || t == DataType::Bfloat16 as i32;
    let mut count = 0;
    for t in graph.initializer.iter_mut() {
        if half(t.data_type)
            && let Some(f) = upcast_tensor(t)
        {
            *t = f;
            count += 1;
        }
    }
    for v in graph
        .input
        .iter_mut()
        .chain(graph.output.iter_mut())
        .chain(graph.value_info.iter_mut())
    {
        if let Some(pb::type_proto::Value::TensorType(tt)) =
            v.r#type.as_mut().and_then(|t| t.value.as_mut())
            && half(tt.elem_type)
        {
            tt.elem_type = DataType::Float as i32;
        }
    }
    for n in graph.node.iter_mut() {
        for a in n.attribute.iter_mut() {
            if n.op_type == "Cast" && a.name == "to" && half(a.i as i32) {
                a.i = DataType::Float as i64;
            }
            if let Some(t) = a.t.as_mut()
                && half(t.data_type)
                && let Some(f) = upcast_tensor(t)
            {
                *t = f;
            }
        }
    }
    count
}

fn upcast_tensor(t: &pb::TensorProto) -> Option<pb::TensorProto> {
    let f = if t.data_type == DataType::Bfloat16 as i32 {
        let raw: Vec<f32> = if t.raw_data.is_empty() {
            t.int32_data
                .iter()
                .map(|&v| half::bf16::from_bits(v as u16).to_f32())
                .collect()
        } else {
            t.raw_data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        };
        proto::F32Tensor {
            dims: t.dims.iter().map(|&d| d.max(0) as usize).collect(),
            data: raw,
        }
    } else {
        proto::tensor_f32(t)?
    };
    Some(proto::f32_tensor(&t.name, &f.dims, &f.data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_initializers_io_and_casts_become_float_exactly() {
        let vals = [0.5f32, -2.0, 65504.0, 1.0 / 1024.0];
        let raw: Vec<u8> = vals
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let mut g = pb::GraphProto {
            initializer: vec![pb::TensorProto {
                name: "w".into(),
                dims: vec![4],
                data_type: DataType::Float16 as i32,
                raw_data: raw,
                ..Default::default()
            }],
            input: vec![proto::float_value_info("x", Some(&[1, 4]))],
            node: vec![proto::node(
                "Cast",
                "c",
                &["x"],
                &["y"],
                vec![proto::int_attr("to", DataType::Float16 as i64)],
            )],
            ..Default::default()
        };
        if let Some(pb::type_proto::Value::TensorType(tt)) =
            g.input[0].r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            tt.elem_type = DataType::Float16 as i32;
        }
        assert_eq!(upcast(&mut g), 1);
        assert_eq!(g.initializer[0].data_type, DataType::Float as i32);
        assert_eq!(
            proto::tensor_f32(&g.initializer[0]).map(|t| t.data),
            Some(vals.to_vec())
        );
        assert_eq!(
            proto::value_info_elem_type(&g.input[0]),
            Some(DataType::Float as i32)
        );
        assert_eq!(
            proto::attr_i(&g.node[0], "to"),
            Some(DataType::Float as i64)
        );
    }
}
