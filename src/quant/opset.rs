//! Per-channel DequantizeLinear needs opset 13, FP8 QuantizeLinear/DequantizeLinear opset 19.
//! Older models are moved up by rewriting the ops whose signature changed on the way
//! (attributes that became inputs, Softmax's axis).

use tract_onnx::pb;

use crate::model::proto;

/// Raises the default-domain opset to 13, rewriting ops whose meaning changed before 13.
pub fn ensure_opset13(p: &mut pb::ModelProto) -> Result<(), String> {
    let Some(entry) = p
        .opset_import
        .iter_mut()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
    else {
        return Err("the model names no default-domain opset".into());
    };
    let old = entry.version;
    if old >= 13 {
        return Ok(());
    }
    entry.version = 13;
    if p.ir_version < 7 {
        p.ir_version = 7;
    }
    let g = p.graph.as_mut().ok_or("no graph")?;
    let mut out = Vec::with_capacity(g.node.len());
    let mut inits = vec![];
    for mut n in std::mem::take(&mut g.node) {
        let name = n.name.clone();
        let take_attr = |n: &mut pb::NodeProto, a: &str| {
            let i = n.attribute.iter().position(|x| x.name == a)?;
            Some(n.attribute.remove(i))
        };
        match n.op_type.as_str() {
            "Clip" if old < 11 => {
                let min = take_attr(&mut n, "min").map(|a| a.f).unwrap_or(f32::MIN);
                let max = take_attr(&mut n, "max").map(|a| a.f).unwrap_or(f32::MAX);
                let (a, b) = (format!("{name}_min"), format!("{name}_max"));
                inits.push(proto::f32_tensor(&a, &[], &[min]));
                inits.push(proto::f32_tensor(&b, &[], &[max]));
                n.input.truncate(1);
                n.input.extend([a, b]);
                out.push(n);
            }
            "Squeeze" | "Unsqueeze" | "ReduceSum" => {
                if let Some(axes) = take_attr(&mut n, "axes") {
                    let a = format!("{name}_axes");
                    inits.push(proto::i64_tensor(&a, &[axes.ints.len()], &axes.ints));
                    n.input.truncate(1);
                    n.input.push(a);
                }
                out.push(n);
            }
            "Split" => {
                if let Some(split) = take_attr(&mut n, "split") {
                    let a = format!("{name}_split");
                    inits.push(proto::i64_tensor(&a, &[split.ints.len()], &split.ints));
                    n.input.truncate(1);
                    n.input.push(a);
                }
                out.push(n);
            }
            "Pad" if old < 11 => {
                let pads = take_attr(&mut n, "pads")
                    .map(|a| a.ints)
                    .unwrap_or_default();
                let value = take_attr(&mut n, "value").map(|a| a.f).unwrap_or(0.0);
                let (a, b) = (format!("{name}_pads"), format!("{name}_value"));
                inits.push(proto::i64_tensor(&a, &[pads.len()], &pads));
                inits.push(proto::f32_tensor(&b, &[], &[value]));
                n.input.truncate(1);
                n.input.extend([a, b]);
                out.push(n);
            }
            "Slice" if old < 10 => {
                let mut add = |attr: &str, n: &mut pb::NodeProto| {
                    let v = take_attr(n, attr).map(|a| a.ints);
                    v.map(|v| {
                        let a = format!("{name}_{attr}");
                        inits.push(proto::i64_tensor(&a, &[v.len()], &v));
                        a
                    })
                };
                let starts = add("starts", &mut n).unwrap_or_default();
                let ends = add("ends", &mut n).unwrap_or_default();
                let axes = add("axes", &mut n);
                n.input.truncate(1);
                n.input.extend([starts, ends]);
                n.input.extend(axes);
                out.push(n);
            }
            "Softmax" | "LogSoftmax" | "Hardmax" => {
                // Before 13 these flatten to 2-D at `axis` (default 1); 13 works on one axis.
                // Flatten -> op(axis=-1) -> Reshape back keeps the old meaning exactly.
                let axis = take_attr(&mut n, "axis").map(|a| a.i).unwrap_or(1);
                let x = n.input[0].clone();
                let y = n.output[0].clone();
                let (flat, soft, shape) = (
                    format!("{name}_flat"),
                    format!("{name}_2d"),
                    format!("{name}_shape"),
                );
                out.push(proto::node(
                    "Flatten",
                    &format!("{name}_flatten"),
                    &[&x],
                    &[&flat],
                    vec![proto::int_attr("axis", axis)],
                ));
                out.push(proto::node(
                    &n.op_type,
                    &name,
                    &[&flat],
                    &[&soft],
                    vec![proto::int_attr("axis", -1)],
                ));
                out.push(proto::node(
                    "Shape",
                    &format!("{name}_shapeof"),
                    &[&x],
                    &[&shape],
                    vec![],
                ));
                out.push(proto::node(
                    "Reshape",
                    &format!("{name}_restore"),
                    &[&soft, &shape],
                    &[&y],
                    vec![],
                ));
            }
            "Upsample" | "Scatter" => {
                return Err(format!(
                    "node `{name}` ({}) has no opset-13 form; per-channel Q/DQ needs opset 13: re-export the model with opset >= 13",
                    n.op_type
                ));
            }
            _ => out.push(n),
        }
    }
    g.node = out;
    g.initializer.extend(inits);
    Ok(())
}

/// Reduce ops (other than ReduceSum, moved at 13) whose `axes` became an input at opset 18.
const REDUCE_AXES_AT_18: [&str; 8] = [
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
];

/// Raises the default-domain opset to 19 (FP8 Q/DQ), through 13: between 13 and 19 only the
/// reductions' `axes` moved (attribute to input, at 18); every other change adds types or
/// attributes whose defaults keep the old meaning. IR version 9 carries the float8 types.
pub fn ensure_opset19(p: &mut pb::ModelProto) -> Result<(), String> {
    ensure_opset13(p)?;
    let entry = p
        .opset_import
        .iter_mut()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .ok_or("the model names no default-domain opset")?;
    let old = entry.version;
    if old >= 19 {
        return Ok(());
    }
    entry.version = 19;
    p.ir_version = p.ir_version.max(9);
    if old >= 18 {
        return Ok(());
    }
    let g = p.graph.as_mut().ok_or("no graph")?;
    let mut inits = vec![];
    for n in g.node.iter_mut() {
        if !REDUCE_AXES_AT_18.contains(&n.op_type.as_str()) {
            continue;
        }
        if let Some(i) = n.attribute.iter().position(|a| a.name == "axes") {
            let axes = n.attribute.remove(i).ints;
            // Output names are unique where node names may be empty.
            let name = format!("{}_axes", n.output.first().map_or(&n.name, |o| o));
            inits.push(proto::i64_tensor(&name, &[axes.len()], &axes));
            n.input.truncate(1);
            n.input.push(name);
        }
    }
    g.initializer.extend(inits);
    Ok(())
}
