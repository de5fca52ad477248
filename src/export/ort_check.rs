//! Runs an exported model in ONNX Runtime (python3 + onnxruntime, basic graph optimisation so
//! Q/DQ arithmetic is exact) and compares its output with quantscope's engine for the same
//! plan: the check the CLI prints after an export and the tests assert.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The FP16 model against quantscope's FP16 engine: max |difference| ≤ 1 % of the largest
/// |output|. The two round at different places (the export keeps sensitive ops in FP32; the
/// engine rounds every activation), so they differ by about FP16's own error, well under this;
/// a wrong weight, cast or op would be far over it.
pub const FP16_TOLERANCE_REL: f64 = 0.01;

/// The mixed model against quantscope's INT8 engine of the same Q/DQ model (float layers in
/// FP32): 5 % of the largest |output|, or the INT8 engine's own max |difference| from the
/// FP32 engine on the same input when that is larger. FP16 rounding before a QuantizeLinear
/// moves values across rounding boundaries, one INT8 step each, and deep networks carry those
/// steps to the output: noise of the same kind and size as quantization's own, so the
/// quantization error is the fair bound; a wrong scale, weight or cast exceeds it.
pub const MIXED_TOLERANCE_REL: f64 = 0.05;

/// Reads a raw f32 input, runs the model, writes its first output as raw f32. Exit code 3:
/// onnxruntime or numpy is missing.
const SCRIPT: &str = r#"
import sys
try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(f"python3 has no onnxruntime/numpy ({e}); pip install onnxruntime numpy", file=sys.stderr)
    sys.exit(3)
model, inp, shape, out = sys.argv[1:5]
opts = ort.SessionOptions()
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
x = np.fromfile(inp, dtype=np.float32).reshape([int(d) for d in shape.split(",")])
y = sess.run(None, {sess.get_inputs()[0].name: x})[0]
np.asarray(y, dtype=np.float32).tofile(out)
"#;

#[derive(Debug, thiserror::Error)]
pub enum OrtError {
    /// python3 or onnxruntime is not installed: the check is skipped, with this reason.
    #[error("ONNX Runtime unavailable: {0}")]
    Unavailable(String),
    #[error("ONNX Runtime could not run {model}: {stderr}")]
    Failed { model: String, stderr: String },
    #[error("ONNX Runtime check of {model}: {what}")]
    Io { model: String, what: String },
}

/// The outcome of one comparison, as the report shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrtCheck {
    pub max_abs_diff: f64,
    /// Absolute tolerance: the relative tolerance times the largest |output| of our engine.
    pub tolerance: f64,
    pub within: bool,
    /// What ONNX Runtime's output was compared with.
    pub against: String,
    /// SQNR (dB) of ONNX Runtime's output against ours: how closely an independent runtime
    /// reproduces our engine (None: identical, or the lengths differ).
    #[serde(default)]
    pub sqnr_db: Option<f64>,
    /// For a quantized engine, SQNR (dB) of our output against our FP32 engine's on the same
    /// input: the quantization's own error, which `sqnr_db` should sit well above.
    #[serde(default)]
    pub quantized_sqnr_db: Option<f64>,
}

impl OrtCheck {
    pub fn line(&self) -> String {
        let agreement = match (self.sqnr_db, self.quantized_sqnr_db) {
            (Some(a), Some(q)) => {
                format!("; ORT's output against it: SQNR {a:.1} dB, its own against FP32 {q:.1} dB")
            }
            (Some(a), None) => format!("; ORT's output against it: SQNR {a:.1} dB"),
            (None, _) => String::new(),
        };
        format!(
            "ORT check vs {}: max abs diff {:.3e}, {} tolerance {:.3e}{agreement}",
            self.against,
            self.max_abs_diff,
            if self.within { "within" } else { "OUTSIDE" },
            self.tolerance
        )
    }
}

/// Runs `model` in ONNX Runtime on one input of `shape`; returns the first output.
pub fn run_onnxruntime(model: &Path, input: &[f32], shape: &[usize]) -> Result<Vec<f32>, OrtError> {
    let name = model.display().to_string();
    let io = |what: String| OrtError::Io {
        model: name.clone(),
        what,
    };
    let dir = tempfile::tempdir().map_err(|e| io(format!("temporary folder: {e}")))?;
    let (inp, out) = (dir.path().join("input.f32"), dir.path().join("output.f32"));
    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&inp, bytes).map_err(|e| io(format!("writing {}: {e}", inp.display())))?;
    let shape_arg: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let result = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(model)
        .arg(&inp)
        .arg(shape_arg.join(","))
        .arg(&out)
        .output()
        .map_err(|e| OrtError::Unavailable(format!("python3 could not be started ({e})")))?;
    let stderr = String::from_utf8_lossy(&result.stderr).trim().to_string();
    match result.status.code() {
        Some(0) => {}
        Some(3) => return Err(OrtError::Unavailable(stderr)),
        _ => {
            // The last lines say what went wrong; the traceback above them does not.
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            return Err(OrtError::Failed {
                model: name,
                stderr: tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
            });
        }
    }
    let raw = std::fs::read(&out).map_err(|e| io(format!("reading {}: {e}", out.display())))?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// SQNR (dB) of `test` against `reference`; None where they are identical or their lengths
/// differ.
pub fn sqnr_db(reference: &[f32], test: &[f32]) -> Option<f64> {
    if reference.len() != test.len() {
        return None;
    }
    let mut s = crate::eval::Sqnr::default();
    s.add(reference, test);
    s.db()
}

/// Compares ONNX Runtime's output with ours; `rel` scales the tolerance by ours' largest |v|.
pub fn compare(ort: &[f32], ours: &[f32], rel: f64, against: &str) -> OrtCheck {
    let max_ref = ours.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let tolerance = rel * max_ref.max(1e-6);
    let max_abs_diff = if ort.len() == ours.len() {
        ort.iter()
            .zip(ours)
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .fold(
                0f64,
                |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
            )
    } else {
        f64::INFINITY
    };
    OrtCheck {
        max_abs_diff,
        tolerance,
        within: max_abs_diff <= tolerance,
        against: against.to_string(),
        sqnr_db: sqnr_db(ours, ort),
        quantized_sqnr_db: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_scales_the_tolerance_and_catches_length_and_nan() {
        let ours = [1.0, -4.0, 2.0];
        let c = compare(&[1.01, -4.0, 2.0], &ours, 0.01, "x");
        assert!((c.tolerance - 0.04).abs() < 1e-12 && c.within, "{c:?}");
        assert!(!compare(&[1.1, -4.0, 2.0], &ours, 0.01, "x").within);
        assert!(!compare(&[1.0, -4.0], &ours, 0.01, "x").within);
        assert!(!compare(&[f32::NAN, -4.0, 2.0], &ours, 0.01, "x").within);
        // Signal 1 + 16 + 4, noise 0.01²: 10 log10(21 / 1e-4) = 53.2 dB.
        let db = c.sqnr_db.expect("differs");
        assert!((db - 10.0 * (21.0f64 / 1e-4).log10()).abs() < 0.1, "{db}");
        assert_eq!(compare(&ours, &ours, 0.01, "x").sqnr_db, None);
        assert!(c.line().contains("SQNR"), "{}", c.line());
    }
}
