//! FP16's overflow guard: the layers an FP16 computation keeps in FP32 because the values they
//! read, write or accumulate on the calibration images leave FP16's safe range. One list, made
//! once per run, applied by every FP16 consumer: the CUDA engine (FP16 engines, and the float
//! layers of INT8/FP8 engines, which it runs in FP16), the CPU's FP16 numerics, and the
//! strongly typed FP16 and mixed exports.
//!
//! The rule (modelopt AutoCast's, with its default threshold) keeps a node in FP32 when
//! 1. any float input or output reached |x| > [`DATA_MAX`] (512, AutoCast's `data_max`) on the
//!    calibration images: 128× below FP16's largest value (65504), the headroom for images
//!    that drive a layer harder than the calibration set did;
//! 2. it is a Conv, Gemm or MatMul whose partial sums can pass FP16's largest value: the
//!    input's peak times the largest L1 norm of a weight row (constant weights), or the two
//!    inputs' peaks times the reduction length (two computed tensors). An FP16 accumulator
//!    (some CPU kernels and TensorRT tactics) overflows there before the output does. Linear
//!    attention's `Kᵀ·V` over thousands of tokens is the case this catches.
//!
//! Nodes that only move data (Reshape, Transpose, Slice...) follow rule 1 like any other: they
//! cannot overflow, but an FP16 copy of a value beyond FP16's range already has.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use tract_onnx::pb::{self, tensor_proto::DataType};

use crate::model::{Graph, proto};

/// Rule 1's threshold: AutoCast's default `data_max`.
pub const DATA_MAX: f32 = 512.0;
/// FP16's largest finite value (rule 2's threshold).
pub const FP16_MAX: f32 = 65504.0;

/// The largest |value| each float tensor reached over a set of images.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Images the peaks were taken over.
    pub images: usize,
    /// Tensor name → max |x| (infinite where a value was NaN or ±Inf).
    pub abs_max: BTreeMap<String, f32>,
}

impl Peaks {
    /// Folds one image's (or batch's) values of `tensor` in.
    pub fn add(&mut self, tensor: &str, values: &[f32]) {
        let peak = values.iter().fold(0f32, |m, &v| {
            if v.is_finite() {
                m.max(v.abs())
            } else {
                f32::INFINITY
            }
        });
        let e = self.abs_max.entry(tensor.to_string()).or_insert(0.0);
        *e = e.max(peak);
    }

    pub fn get(&self, tensor: &str) -> Option<f32> {
        self.abs_max.get(tensor).copied()
    }
}

/// A node kept in FP32 in an otherwise FP16 computation, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeptFp32 {
    pub node: String,
    pub op: String,
    pub reason: String,
}

/// The guard's lists a run measured, each `None` where the run needed none: the report keeps
/// them so that a later export (the GUI's) keeps the same layers in FP32.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Guards {
    /// For the FP16 engine and export, and the FP8 engines' float layers (the model as loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float: Option<Vec<KeptFp32>>,
    /// For the INT8 engines' float layers and the mixed export (the INT8-prepared model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8: Option<Vec<KeptFp32>>,
}

impl Guards {
    pub fn is_empty(&self) -> bool {
        self.float.is_none() && self.int8.is_none()
    }
}

/// The tensors whose peaks the guard reads: the graph's float input and every float tensor a
/// node computes (constants and Q/DQ excepted).
pub fn measured_tensors(model: &pb::ModelProto) -> Vec<String> {
    let Some(g) = model.graph.as_ref() else {
        return vec![];
    };
    let types = proto::tensor_types(g);
    let float = |t: &String| types.get(t) == Some(&(DataType::Float as i32));
    let mut out: Vec<String> = g
        .input
        .iter()
        .map(|i| i.name.clone())
        .filter(float)
        .collect();
    for n in &g.node {
        if matches!(
            n.op_type.as_str(),
            "Constant" | "QuantizeLinear" | "DequantizeLinear"
        ) {
            continue;
        }
        out.extend(
            n.output
                .iter()
                .filter(|o| !o.is_empty() && float(o))
                .cloned(),
        );
    }
    out
}

/// The nodes of `model` the rule keeps in FP32, in graph order. `shapes` (inferred) gives a
/// MatMul of two tensors its reduction length; without it rule 2 skips those.
pub fn keep_fp32(
    model: &pb::ModelProto,
    peaks: &Peaks,
    shapes: Option<&HashMap<String, Vec<usize>>>,
) -> Vec<KeptFp32> {
    let Some(g) = model.graph.as_ref() else {
        return vec![];
    };
    let graph = Graph::new(g);
    let mut kept = vec![];
    for n in &g.node {
        if matches!(
            n.op_type.as_str(),
            "Constant" | "QuantizeLinear" | "DequantizeLinear"
        ) {
            continue;
        }
        let io = n
            .input
            .iter()
            .map(|t| ("input", t))
            .chain(n.output.iter().map(|t| ("output", t)))
            .filter_map(|(what, t)| peaks.get(t).map(|p| (what, t, p)))
            .max_by(|a, b| a.2.total_cmp(&b.2));
        let reason = if let Some((what, t, p)) = io.filter(|(_, _, p)| *p > DATA_MAX) {
            Some(format!(
                "its {what} `{t}` reaches {} on the calibration images, beyond FP16's safe {DATA_MAX} (AutoCast's data_max; FP16's largest value is {FP16_MAX})",
                magnitude(p)
            ))
        } else {
            partial_sum_bound(n, &graph, peaks, shapes)
                .filter(|b| *b > FP16_MAX)
                .map(|b| {
                    format!(
                        "its partial sums can reach {} (input peak × weight row sum): past FP16's largest value {FP16_MAX}",
                        magnitude(b)
                    )
                })
        };
        if let Some(reason) = reason {
            kept.push(KeptFp32 {
                node: n.name.clone(),
                op: n.op_type.clone(),
                reason,
            });
        }
    }
    kept
}

/// Rule 2's bound on the magnitude of any partial sum of a Conv, Gemm or MatMul.
fn partial_sum_bound(
    n: &pb::NodeProto,
    graph: &Graph,
    peaks: &Peaks,
    shapes: Option<&HashMap<String, Vec<usize>>>,
) -> Option<f32> {
    if !matches!(n.op_type.as_str(), "Conv" | "Gemm" | "MatMul") {
        return None;
    }
    let a = n.input.first()?;
    let b = n.input.get(1)?;
    let peak_a = peaks.get(a)?;
    match graph.initializer(b).and_then(proto::tensor_f32) {
        Some(w) if !w.dims.is_empty() => {
            // Rows of the weight: Conv [O, I, kh, kw] -> O rows; MatMul [K, N] and Gemm
            // (transB 0) [K, N] -> N columns; Gemm with transB [N, K] -> N rows.
            let trans_b = proto::attr_i(n, "transB").unwrap_or(0) == 1;
            let by_rows = n.op_type == "Conv" || (n.op_type == "Gemm" && trans_b);
            let row_sum = if by_rows {
                let per = w.len() / w.dims[0].max(1);
                w.data
                    .chunks(per.max(1))
                    .map(|r| r.iter().map(|v| v.abs()).sum::<f32>())
                    .fold(0f32, f32::max)
            } else {
                let cols = *w.dims.last()?;
                let mut sums = vec![0f32; cols];
                for (i, v) in w.data.iter().enumerate() {
                    sums[i % cols.max(1)] += v.abs();
                }
                sums.into_iter().fold(0f32, f32::max)
            };
            Some(peak_a * row_sum)
        }
        Some(_) => None,
        None => {
            let peak_b = peaks.get(b)?;
            let k = *shapes?.get(a)?.last()?;
            Some(peak_a * peak_b * k as f32)
        }
    }
}

/// 3.2e5 for large values, 1234.5 below 1e4.
fn magnitude(v: f32) -> String {
    if !v.is_finite() {
        "a non-finite value".into()
    } else if v >= 1e4 {
        format!("{v:.2e}")
    } else {
        format!("{v:.1}")
    }
}

/// One line for a report or log: how many layers the guard kept for `what` ("the FP16
/// engine") and the first few, with why.
pub fn describe(kept: &[KeptFp32], images: usize, what: &str) -> Option<String> {
    if kept.is_empty() {
        return None;
    }
    const SHOWN: usize = 4;
    let list: Vec<String> = kept
        .iter()
        .take(SHOWN)
        .map(|k| format!("{} ({}): {}", k.node, k.op, k.reason))
        .collect();
    let more = kept.len().saturating_sub(SHOWN);
    Some(format!(
        "FP16 overflow guard: {} layer{} of {what} kept in FP32, from their ranges on {images} calibration image{}: {}{}",
        kept.len(),
        if kept.len() == 1 { "" } else { "s" },
        if images == 1 { "" } else { "s" },
        list.join("; "),
        if more > 0 {
            format!("; and {more} more (the JSON report lists all)")
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::{GraphBuilder, gram_classifier};

    fn peaks_of(m: &crate::model::Model) -> Peaks {
        let names = measured_tensors(&m.proto);
        let probe = crate::backend::reference::open_model(m, [16, 16], &names).expect("reference");
        let x: Vec<f32> = crate::model::testing::values(3 * 16 * 16, 3)
            .iter()
            .map(|v| v * 2.0)
            .collect();
        let (_, acts) = probe.run(&x).expect("run");
        let mut p = Peaks {
            images: 1,
            ..Default::default()
        };
        for (n, a) in names.iter().zip(&acts) {
            p.add(n, a.as_ref());
        }
        p
    }

    #[test]
    fn keeps_the_layers_whose_ranges_leave_fp16_and_only_those() {
        let m = gram_classifier(3, 16, 100.0).model();
        let peaks = peaks_of(&m);
        let shapes = crate::model::infer_shapes(&m, [16, 16]).ok();
        let kept = keep_fp32(&m.proto, &peaks, shapes.as_ref());
        let names: Vec<&str> = kept.iter().map(|k| k.node.as_str()).collect();
        // The Gram matrix writes far more than 512, and the square root reads it.
        assert!(names.contains(&"gram"), "{kept:?}");
        assert!(names.contains(&"root"), "{kept:?}");
        assert!(
            !names.contains(&"conv") && !names.contains(&"relu"),
            "{kept:?}"
        );
        assert!(
            kept[0].reason.contains("calibration images"),
            "{}",
            kept[0].reason
        );

        // The same graph at a gentle gain: nothing leaves FP16's range.
        let m = gram_classifier(3, 16, 0.01).model();
        let kept = keep_fp32(&m.proto, &peaks_of(&m), shapes.as_ref());
        assert!(kept.is_empty(), "{kept:?}");
    }

    #[test]
    fn partial_sums_are_bounded_by_the_weight_rows() {
        // A 1x1 conv of 512 input channels, every weight 1, input peak 200 (under 512): its
        // output could reach 102400 in an accumulator, past 65504.
        let mut b = GraphBuilder::new(&[1, 512, 2, 2]);
        let w = b.constant("w", &[4, 512, 1, 1], &vec![1.0; 4 * 512]);
        let y = b.op("Conv", "sum", &["x", &w]);
        b.output(&y);
        let m = b.model();
        let mut peaks = Peaks::default();
        peaks.add("x", &[200.0]);
        peaks.add(&y, &[300.0]);
        let kept = keep_fp32(&m.proto, &peaks, None);
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(
            kept[0].reason.contains("partial sums"),
            "{}",
            kept[0].reason
        );
        let mut small = Peaks::default();
        small.add("x", &[100.0]);
        small.add(&y, &[300.0]);
        assert!(keep_fp32(&m.proto, &small, None).is_empty());
    }

    #[test]
    fn non_finite_peaks_count_as_beyond_range() {
        let mut p = Peaks::default();
        p.add("t", &[1.0, f32::NAN]);
        assert_eq!(p.get("t"), Some(f32::INFINITY));
        assert!(magnitude(f32::INFINITY).contains("non-finite"));
    }
}
