//! Layer-by-layer quantization effects: a model in which every quantized layer gets a twin fed
//! by Q/DQ of its FP32 inputs, so one pass gives each layer's output "when only it is
//! quantized". Sensitivity ranks layers with it, and per-layer bias correction
//! (`prepare::bias`) measures its shifts with it.

use std::collections::HashMap;

use tract_onnx::pb;

use crate::backend::reference::{Activation, Interpreter};
use crate::calib::Ranges;
use crate::model::{Graph, Model, proto};
use crate::quant::{self, QuantPlan};

/// A model with isolated twins, and per layer (node, FP32 output name, twin output name).
pub type Isolated = (pb::ModelProto, Vec<(String, String, String)>);

/// Adds, for every quantized layer, a twin fed by Q/DQ of its FP32 inputs: one pass then
/// gives each layer's output "when only it is quantized". Returns the model and, per layer,
/// (node, FP32 output name, twin output name).
pub fn isolated_model(
    model: &Model,
    plan: &QuantPlan,
    ranges: &Ranges,
) -> Result<Isolated, String> {
    isolated_model_from(model, model, plan, ranges)
}

/// [`isolated_model`] whose twins take their weights and biases from `int8` (the same graph as
/// `model` with other weight values: the INT8 path's, GPTQ-rounded), everything else from
/// `model` (its FP32 form): each twin is then the layer as the INT8 engine computes it, fed
/// by FP32 inputs.
pub fn isolated_model_from(
    model: &Model,
    int8: &Model,
    plan: &QuantPlan,
    ranges: &Ranges,
) -> Result<Isolated, String> {
    let mut p = model.proto.clone();
    crate::quant::ensure_opset13(&mut p)?;
    let g0 = model.graph().clone();
    let g = Graph::new(&g0);
    let g8 = Graph::new(int8.graph());
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
                let w = g8
                    .initializer(t)
                    .and_then(proto::tensor_f32)
                    .ok_or("weight unreadable")?;
                let (q, s) = quant::quantize_weight(&w, axis);
                let bias_of = |g: &Graph| {
                    n.input
                        .get(2)
                        .and_then(|b| g.initializer(b))
                        .and_then(proto::tensor_f32)
                        .map(|b| b.data)
                };
                // A centered input: the twin's bias folds the shift for its rounded weights,
                // as the Q/DQ build does. GPTQ may have moved the INT8 path's bias too.
                let fold = match plan.centered.get(&n.input[0]) {
                    Some(&c) => Some(
                        quant::centered::int8_fold(c, &w, &q, &s, axis)
                            .ok_or("weight scales do not match its channels")?,
                    ),
                    None => None,
                };
                let own = bias_of(&g8);
                if fold.is_some() || own != bias_of(&g) {
                    let channels = fold.as_ref().map_or(0, Vec::len);
                    let mut b = own.unwrap_or_else(|| vec![0.0; channels]);
                    if let Some(fold) = &fold {
                        b.iter_mut().zip(fold).for_each(|(x, y)| *x += y);
                    }
                    let bn = format!("{}_bias", twin.name);
                    gp.initializer.push(proto::f32_tensor(&bn, &[b.len()], &b));
                    twin.input.resize(3, String::new());
                    twin.input[2] = bn;
                }
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
pub fn outputs_of(m: &dyn Interpreter, input: &[f32]) -> Result<Vec<Vec<f32>>, String> {
    let (_, rest) = m.run(input).map_err(|e| e.to_string())?;
    Ok(rest.into_iter().map(Activation::into_vec).collect())
}
