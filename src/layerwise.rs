//! Layer-by-layer quantization effects: a model in which every quantized layer gets a twin fed
//! by Q/DQ of its FP32 inputs, so one pass gives each layer's output "when only it is
//! quantized". Sensitivity ranks layers with it; the pipeline's bias correction uses it too.

use std::collections::{BTreeMap, HashMap};

use tract_onnx::pb;

use crate::backend::cpu::TractModel;
use crate::calib::Ranges;
use crate::model::{Graph, Model, proto};
use crate::quant::{self, QuantPlan};

/// Adds, for every quantized layer, a twin fed by Q/DQ of its FP32 inputs: one pass then
/// gives each layer's output "when only it is quantized". Returns the model and, per layer,
/// (FP32 output name, twin output name).
pub fn isolated_model(
    model: &Model,
    plan: &QuantPlan,
    ranges: &Ranges,
) -> Result<(pb::ModelProto, Vec<(String, String, String)>), String> {
    let mut p = model.proto.clone();
    crate::quant::ensure_opset13(&mut p)?;
    let g0 = model.graph().clone();
    let g = Graph::new(&g0);
    let gp = p.graph.as_mut().ok_or("no graph")?;
    let zp = "iso_zero_i8";
    gp.initializer.push(proto::i8_tensor(zp, &[], &[0]));
    let mut pairs = vec![];
    let weights: HashMap<&str, usize> = plan
        .weights
        .iter()
        .map(|w| (w.tensor.as_str(), w.axis))
        .collect();
    for n in g0
        .node
        .iter()
        .filter(|n| plan.quantized_nodes.contains(&n.name))
    {
        let mut twin = n.clone();
        twin.name = format!("{}_isolated", n.name);
        for slot in 0..2.min(n.input.len()) {
            let t = &n.input[slot];
            let dq = format!("{}_iso_{slot}_{t}", n.name);
            if let Some(&axis) = weights.get(t.as_str()) {
                let w = g
                    .initializer(t)
                    .and_then(proto::tensor_f32)
                    .ok_or("weight unreadable")?;
                let (q, s) = quant::quantize_weight(&w, axis);
                let (qn, sn, zn) = (format!("{dq}_q"), format!("{dq}_s"), format!("{dq}_z"));
                gp.initializer.push(proto::i8_tensor(&qn, &w.dims, &q));
                gp.initializer.push(proto::f32_tensor(&sn, &[s.len()], &s));
                gp.initializer
                    .push(proto::i8_tensor(&zn, &[s.len()], &vec![0; s.len()]));
                gp.node.push(proto::node(
                    "DequantizeLinear",
                    &format!("{dq}_DQ"),
                    &[&qn, &sn, &zn],
                    &[&dq],
                    vec![proto::int_attr("axis", axis as i64)],
                ));
            } else {
                let scale = quant::act_scale(ranges.amax.get(t).copied().unwrap_or(0.0));
                let (sn, qn) = (format!("{dq}_s"), format!("{dq}_q"));
                gp.initializer.push(proto::f32_tensor(&sn, &[], &[scale]));
                gp.node.push(proto::node(
                    "QuantizeLinear",
                    &format!("{dq}_Q"),
                    &[t, &sn, zp],
                    &[&qn],
                    vec![],
                ));
                gp.node.push(proto::node(
                    "DequantizeLinear",
                    &format!("{dq}_DQ"),
                    &[&qn, &sn, zp],
                    &[&dq],
                    vec![],
                ));
            }
            twin.input[slot] = dq;
        }
        let out = format!("{}_isolated_out", n.name);
        twin.output = vec![out.clone()];
        gp.node.push(twin);
        pairs.push((n.name.clone(), n.output[0].clone(), out));
    }
    Ok((p, pairs))
}

/// The values of every output but the first (the graph's own) for one input.
pub fn outputs_of(m: &TractModel, input: &[f32]) -> Result<Vec<Vec<f32>>, String> {
    let outs = m.run_all(input).map_err(|e| format!("{e:#}"))?;
    outs.iter()
        .skip(1)
        .map(|v| {
            let v = v.cast_to::<f32>().map_err(|e| format!("{e:#}"))?;
            let s = v
                .try_as_plain_ram()
                .map_err(|e| format!("{e:#}"))?
                .as_slice::<f32>()
                .map_err(|e| format!("{e:#}"))?
                .to_vec();
            Ok(s)
        })
        .collect()
}

/// Empirical bias correction: per quantized layer and output channel, the mean of
/// (FP32 output - output with only this layer quantized) over `inputs`. Added to the float
/// bias, it removes the systematic shift quantization gives each channel.
pub fn bias_corrections(
    model: &Model,
    hw: [usize; 2],
    plan: &QuantPlan,
    ranges: &Ranges,
    inputs: &[Vec<f32>],
) -> Result<BTreeMap<String, Vec<f32>>, String> {
    let (iso, pairs) = isolated_model(model, plan, ranges)?;
    let shape = model.input_shape(1, hw);
    let mut names: Vec<String> = pairs.iter().map(|x| x.1.clone()).collect();
    names.extend(pairs.iter().map(|x| x.2.clone()));
    let m = TractModel::new(
        &Model {
            proto: iso,
            ..model.clone()
        }
        .with_fixed_input(1, hw),
        shape,
        &names,
    )
    .map_err(|e| format!("{e:#}"))?;
    let n = pairs.len();
    let mut sums: Vec<Vec<f64>> = vec![vec![]; n];
    let channels = |len: usize, k: usize| -> usize {
        let node = model.graph().node.iter().find(|x| x.name == pairs[k].0);
        let w = node
            .and_then(|x| x.input.get(1))
            .and_then(|w| model.initializer(w));
        match (node.map(|x| x.op_type.as_str()), w) {
            (Some("Gemm"), Some(w)) if node.and_then(|x| proto::attr_i(x, "transB")) == Some(1) => {
                w.dims[0]
            }
            (Some("Gemm"), Some(w)) | (Some("MatMul"), Some(w)) => *w.dims.last().unwrap_or(&len),
            (Some("ConvTranspose"), Some(w)) => {
                w.dims[1]
                    * proto::attr_i(node.unwrap_or(&Default::default()), "group").unwrap_or(1)
                        as usize
            }
            (_, Some(w)) => w.dims[0],
            _ => len,
        }
    };
    for x in inputs {
        let outs = outputs_of(&m, x)?;
        for k in 0..n {
            let (f, q) = (&outs[k], &outs[n + k]);
            let c = channels(f.len(), k).max(1);
            let per = f.len() / c;
            if sums[k].is_empty() {
                sums[k] = vec![0.0; c];
            }
            let last_axis = model
                .graph()
                .node
                .iter()
                .any(|x| x.name == pairs[k].0 && x.op_type == "MatMul");
            for (i, (a, b)) in f.iter().zip(q).enumerate() {
                // Conv: NCHW (batch 1), channel-major blocks; Gemm [1, C]; MatMul: channel last.
                let ch = if last_axis { i % c } else { i / per.max(1) };
                sums[k][ch.min(c - 1)] += (a - b) as f64 / per.max(1) as f64;
            }
        }
    }
    Ok(pairs
        .iter()
        .enumerate()
        .map(|(k, (node, _, _))| {
            (
                node.clone(),
                sums[k]
                    .iter()
                    .map(|v| (v / inputs.len().max(1) as f64) as f32)
                    .collect(),
            )
        })
        .collect())
}
