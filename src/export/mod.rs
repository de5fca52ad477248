//! Writes the deployable models of a run (INT8 Q/DQ + calibration cache, strongly typed FP16,
//! mixed INT8/FP16, FP8 Q/DQ), each with its ready `trtexec` lines, and checks each typed model in ONNX
//! Runtime against quantscope's engine for the same plan.
//!
//! Beside it: [`typed`] writes the strongly typed models, [`trtexec`] their command lines,
//! [`ort_check`] runs them in ONNX Runtime. Those three read only `model` and `quant`, never a
//! backend, so the ONNX Runtime backend can build its FP16 engine from [`typed::fp16_model`]
//! without an import cycle.

pub mod ort_check;
pub mod trtexec;
pub mod typed;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BuildInput, BuildSpec, Precision};
use crate::calib::Method;
use crate::model::Model;
use crate::quant::QdqModel;
use ort_check::{OrtCheck, OrtError};
use trtexec::InputSpec;
use typed::{KeptFp32, TypedModel};

/// Which models an export writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportPrecision {
    /// Strongly typed FP16 model.
    Fp16,
    /// INT8 Q/DQ model and TensorRT calibration cache, per method.
    Int8,
    /// INT8 Q/DQ where INT8, FP16 elsewhere (from the mixed-precision plan when there is one).
    Mixed,
    /// FP8 E4M3 Q/DQ model (opset 19), when the run builds an FP8 engine.
    Fp8,
}

impl ExportPrecision {
    pub const ALL: [ExportPrecision; 4] = [
        ExportPrecision::Fp16,
        ExportPrecision::Int8,
        ExportPrecision::Mixed,
        ExportPrecision::Fp8,
    ];
    pub fn name(self) -> &'static str {
        match self {
            ExportPrecision::Fp16 => "fp16",
            ExportPrecision::Int8 => "int8",
            ExportPrecision::Mixed => "mixed",
            ExportPrecision::Fp8 => "fp8",
        }
    }
}

impl FromStr for ExportPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ExportPrecision::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("unknown export precision `{s}` (expected fp16, int8, mixed or fp8)")
            })
    }
}

/// One exported model, as the report and the window show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportedModel {
    /// `fp16`, `int8`, `mixed` or `fp8`.
    pub kind: String,
    pub method: Option<Method>,
    pub file: PathBuf,
    /// The TensorRT calibration cache written beside an INT8 model.
    pub cache: Option<PathBuf>,
    /// `trtexec --stronglyTyped` (TensorRT 10 and 11).
    pub trtexec: String,
    /// `trtexec --int8 --calib` (TensorRT 8.6–10 implicit INT8; removed in TensorRT 11).
    pub trtexec_implicit: Option<String>,
    pub fp16_nodes: usize,
    pub int8_layers: usize,
    pub kept_fp32: Vec<KeptFp32>,
    pub casts: usize,
    pub ort_check: Option<OrtCheck>,
    /// Why there is no ORT check (ONNX Runtime missing, or it failed on the model).
    pub ort_note: Option<String>,
}

impl ExportedModel {
    /// One line for logs: the file and the ORT check.
    pub fn summary(&self) -> String {
        let check = match (&self.ort_check, &self.ort_note) {
            (Some(c), _) => c.line(),
            (None, Some(n)) => format!("ORT check not run: {n}"),
            (None, None) => "no ORT check (Q/DQ model: tests/qdq_ort.rs checks those)".into(),
        };
        let kept = if self.kept_fp32.is_empty() {
            String::new()
        } else {
            format!(", {} node(s) kept FP32", self.kept_fp32.len())
        };
        format!("wrote {}{kept}; {check}", self.file.display())
    }
}

fn stem(model_path: &Path) -> &str {
    model_path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
}

fn save(path: &Path, bytes: Vec<u8>, model_path: &Path) -> Result<(), String> {
    let err = |e: crate::files::OutputError| e.to_string();
    crate::files::refuse_inputs([path], &[(model_path, "the model")]).map_err(err)?;
    crate::files::write(path, bytes).map_err(err)
}

/// Runs the written model in ONNX Runtime on `input` and compares with `engine_input`'s engine.
fn check(
    out: &mut ExportedModel,
    backend: &dyn Backend,
    engine_input: BuildInput<'_>,
    hw: [usize; 2],
    input: &[f32],
    rel: f64,
) {
    let shape = engine_input.model().input_shape(1, hw);
    let ours = crate::guard::catch("building the engine for the ORT check", || {
        let mut e = backend
            .build(engine_input, BuildSpec { batch: 1, hw })
            .map_err(|e| format!("{e:#}"))?;
        let simulated = e.info().simulated;
        e.run(input)
            .map(|o| (o.data, simulated))
            .map_err(|e| format!("{e:#}"))
    })
    .and_then(|r| r);
    let (ours, simulated) = match ours {
        Ok(v) => v,
        Err(e) => {
            out.ort_note = Some(format!("quantscope's engine could not run: {e}"));
            return;
        }
    };
    let against = format!(
        "quantscope {} engine ({}{})",
        match engine_input.precision() {
            Precision::Int8 => "INT8 (same Q/DQ)",
            Precision::Fp8 => "FP8 (same Q/DQ)",
            p => p.name(),
        },
        backend.kind().name(),
        if simulated { ", simulated" } else { "" }
    );
    // The mixed and FP8 models' tolerance grows to the quantized engine's own distance from
    // FP32 (see `ort_check::MIXED_TOLERANCE_REL`): rounding differences before a Q flip
    // quantization steps, and those flips are quantization noise of the same kind, never more
    // than quantization itself.
    let fp32 = engine_input
        .precision()
        .is_quantized()
        .then(|| {
            let float = BuildInput::Float {
                model: engine_input.model(),
                precision: Precision::Fp32,
                keep_fp32: &[],
            };
            crate::guard::catch("building the FP32 engine for the ORT check", || {
                backend
                    .build(float, BuildSpec { batch: 1, hw })
                    .and_then(|mut e| e.run(input))
                    .map_err(|e| format!("{e:#}"))
            })
            .and_then(|r| r)
            .ok()
        })
        .flatten();
    let quant_err = fp32
        .as_ref()
        .map(|f| ort_check::compare(&f.data, &ours, 0.0, "").max_abs_diff);
    match ort_check::run_onnxruntime(&out.file, input, &shape) {
        Ok(ort) => {
            let mut c = ort_check::compare(&ort, &ours, rel, &against);
            c.quantized_sqnr_db = fp32
                .as_ref()
                .and_then(|f| ort_check::sqnr_db(&f.data, &ours));
            if let Some(q) = quant_err.filter(|q| q.is_finite() && *q > c.tolerance) {
                c.tolerance = q;
                c.within = c.max_abs_diff <= q;
                c.against
                    .push_str(", tolerance = its max abs diff from FP32");
            }
            out.ort_check = Some(c);
        }
        Err(e @ OrtError::Unavailable(_)) => out.ort_note = Some(e.to_string()),
        Err(e) => out.ort_note = Some(e.to_string()),
    }
}

fn typed_entry(
    kind: &str,
    method: Option<Method>,
    file: PathBuf,
    t: &TypedModel,
    input: &InputSpec,
) -> ExportedModel {
    ExportedModel {
        kind: kind.into(),
        method,
        trtexec: trtexec::strongly_typed(&file, input),
        file,
        fp16_nodes: t.fp16_nodes,
        int8_layers: t.int8_layers,
        kept_fp32: t.kept_fp32.clone(),
        casts: t.casts,
        ..Default::default()
    }
}

/// Writes `<model>_fp16.onnx` and checks it against the backend's FP16 engine (`input`: one
/// preprocessed image). `model_path` is the user's file (never overwritten). `guard`: the
/// layers the FP16 overflow guard keeps in FP32, in the file and the engine alike.
pub fn export_fp16(
    dir: &Path,
    model: &Model,
    hw: [usize; 2],
    backend: &dyn Backend,
    input: &[f32],
    guard: &[typed::KeptFp32],
) -> Result<ExportedModel, String> {
    let shapes = crate::model::infer_shapes(model, hw).ok();
    let t = typed::fp16_model(model, shapes.as_ref(), guard).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{}_fp16.onnx", stem(&model.path)));
    save(&file, t.to_bytes(), &model.path)?;
    let spec = InputSpec::new(&model.info, &model.input_shape(1, hw));
    let mut out = typed_entry("fp16", None, file, &t, &spec);
    let engine = BuildInput::Float {
        model,
        precision: Precision::Fp16,
        keep_fp32: guard,
    };
    check(
        &mut out,
        backend,
        engine,
        hw,
        input,
        ort_check::FP16_TOLERANCE_REL,
    );
    Ok(out)
}

/// Writes `<model>_mixed_int8_fp16_<method>.onnx` from `qdq` and checks it against the
/// backend's INT8 engine of the same Q/DQ model. `model` is the model `qdq` was placed on;
/// `guard` as for [`export_fp16`].
#[allow(clippy::too_many_arguments)]
pub fn export_mixed(
    dir: &Path,
    model_path: &Path,
    model: &Model,
    qdq: &QdqModel,
    hw: [usize; 2],
    backend: &dyn Backend,
    input: &[f32],
    guard: &[typed::KeptFp32],
) -> Result<ExportedModel, String> {
    let shapes = crate::model::infer_shapes(model, hw).ok();
    let name = model_path.display().to_string();
    let t = typed::mixed_model(qdq, &name, shapes.as_ref(), guard).map_err(|e| e.to_string())?;
    let m = qdq.method.map(|m| m.name()).unwrap_or("qat");
    let file = dir.join(format!("{}_mixed_int8_fp16_{m}.onnx", stem(model_path)));
    save(&file, t.to_bytes(), model_path)?;
    let spec = InputSpec::new(&model.info, &model.input_shape(1, hw));
    let mut out = typed_entry("mixed", qdq.method, file, &t, &spec);
    let engine = BuildInput::Quantized {
        model,
        qdq,
        keep_fp32: guard,
    };
    check(
        &mut out,
        backend,
        engine,
        hw,
        input,
        ort_check::MIXED_TOLERANCE_REL,
    );
    Ok(out)
}

/// Writes the FP8 Q/DQ model as `<model>_fp8_<method>.onnx` in `dir` (the window's export
/// and [`export_fp8`]); `model_path` (the user's file) is never overwritten.
pub fn write_fp8(dir: &Path, model_path: &Path, qdq: &QdqModel) -> Result<PathBuf, String> {
    let m = qdq.method.map(|m| m.name()).unwrap_or("max");
    let file = dir.join(format!("{}_fp8_{m}.onnx", stem(model_path)));
    save(&file, qdq.to_bytes(), model_path)?;
    Ok(file)
}

/// Writes `<model>_fp8_<method>.onnx` (the FP8 E4M3 Q/DQ model, opset 19) and checks it in
/// ONNX Runtime against the backend's FP8 engine of the same model. There is no calibration
/// cache: TensorRT reads FP8 only from Q/DQ (`--stronglyTyped`).
pub fn export_fp8(
    dir: &Path,
    model_path: &Path,
    model: &Model,
    qdq: &QdqModel,
    hw: [usize; 2],
    backend: &dyn Backend,
    input: &[f32],
) -> Result<ExportedModel, String> {
    let file = write_fp8(dir, model_path, qdq)?;
    let spec = InputSpec::new(&model.info, &model.input_shape(1, hw));
    let mut out = ExportedModel {
        kind: "fp8".into(),
        method: qdq.method,
        trtexec: trtexec::strongly_typed(&file, &spec),
        file,
        int8_layers: qdq.plan.quantized_nodes.len(),
        ..Default::default()
    };
    let engine = BuildInput::Quantized {
        model,
        qdq,
        keep_fp32: &[],
    };
    check(
        &mut out,
        backend,
        engine,
        hw,
        input,
        ort_check::MIXED_TOLERANCE_REL,
    );
    Ok(out)
}

/// Writes a pre-quantized model as its load normalised it (uint8 zero point 128 made int8,
/// PyTorch's Casts and computed zero points folded, int32 biases made float; see
/// [`crate::model::qdq_forms`]) as `<model>_<int8|fp8>_prequantized.onnx`: the TensorRT-ready
/// Q/DQ model a TensorRT user otherwise repairs by hand. Its own scales: no calibration cache
/// (TensorRT reads them from the Q/DQ with `--stronglyTyped`). Checked in ONNX Runtime against
/// the backend's engine of the same model.
pub fn export_prequantized(
    dir: &Path,
    model_path: &Path,
    model: &Model,
    qdq: &QdqModel,
    hw: [usize; 2],
    backend: &dyn Backend,
    input: &[f32],
) -> Result<ExportedModel, String> {
    let kind = qdq.format.precision().name();
    let file = dir.join(format!("{}_{kind}_prequantized.onnx", stem(model_path)));
    save(&file, qdq.to_bytes(), model_path)?;
    let spec = InputSpec::new(&model.info, &model.input_shape(1, hw));
    let mut out = ExportedModel {
        kind: kind.into(),
        method: None,
        trtexec: trtexec::strongly_typed(&file, &spec),
        file,
        int8_layers: crate::quant::carried::quantized_layers(model.graph()).len(),
        ..Default::default()
    };
    let engine = BuildInput::Quantized {
        model,
        qdq,
        keep_fp32: &[],
    };
    check(
        &mut out,
        backend,
        engine,
        hw,
        input,
        ort_check::MIXED_TOLERANCE_REL,
    );
    Ok(out)
}

/// The report entry for an INT8 Q/DQ model and its cache already written by
/// [`crate::pipeline::export_qdq`]. The implicit line needs the float model the cache's ranges
/// belong to: `fp32_for_cache` (the user's file, or the prepared graph written beside it).
pub fn int8_entry(
    files: &[PathBuf; 2],
    qdq: &QdqModel,
    fp32_for_cache: &Path,
    input: &InputSpec,
) -> ExportedModel {
    let [onnx, cache] = files;
    ExportedModel {
        kind: "int8".into(),
        method: qdq.method,
        trtexec: trtexec::strongly_typed(onnx, input),
        trtexec_implicit: Some(trtexec::implicit_int8(fp32_for_cache, cache, input)),
        file: onnx.clone(),
        cache: Some(cache.clone()),
        int8_layers: qdq.plan.quantized_nodes.len(),
        ..Default::default()
    }
}

/// The float model a calibration cache's tensor names and ranges belong to: the user's file
/// when quantscope's preparation left it as it is, else the prepared graph (batch norms
/// folded, cross-layer equalized), written once as `<model>_fp32_for_cache.onnx`.
pub fn fp32_for_cache(
    dir: &Path,
    original: &Path,
    int8_model: &Model,
    equalized: bool,
) -> Result<PathBuf, String> {
    if int8_model.info.batch_norms_folded == 0 && !equalized {
        return Ok(original.to_path_buf());
    }
    let file = dir.join(format!("{}_fp32_for_cache.onnx", stem(original)));
    if !file.exists() {
        save(
            &file,
            prost::Message::encode_to_vec(&int8_model.proto),
            original,
        )?;
    }
    Ok(file)
}

/// The exports section of the Markdown report.
pub fn markdown(exports: &[ExportedModel]) -> String {
    if exports.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## Exported models\n\nTensorRT 10/11 builds each model with `--stronglyTyped` (the precision is in the file); \
         TensorRT 8.6–10 can also build INT8 implicitly from the float model and the calibration cache \
         (`--int8 --calib`, removed in TensorRT 11).\n",
    );
    for e in exports {
        let m = e.method.map(|m| format!(" ({m})")).unwrap_or_default();
        s.push_str(&format!("\n### {}{m}: `{}`\n\n", e.kind, e.file.display()));
        if e.kind == "fp8" {
            s.push_str(&format!(
                "{} FP8 E4M3 layers (opset 19 Q/DQ; no calibration cache: TensorRT builds FP8 only from Q/DQ).\n",
                e.int8_layers
            ));
        } else if e.kind != "int8" {
            s.push_str(&format!(
                "{} FP16 nodes, {} INT8 layers, {} kept FP32, {} casts.\n",
                e.fp16_nodes,
                e.int8_layers,
                e.kept_fp32.len(),
                e.casts
            ));
            for k in &e.kept_fp32 {
                s.push_str(&format!("- `{}` ({}): {}\n", k.node, k.op, k.reason));
            }
        }
        match (&e.ort_check, &e.ort_note) {
            (Some(c), _) => s.push_str(&format!("\n{}\n", c.line())),
            (None, Some(n)) => s.push_str(&format!("\nORT check not run: {n}\n")),
            _ => {}
        }
        s.push_str(&format!("\n```sh\n{}\n```\n", e.trtexec));
        if let Some(i) = &e.trtexec_implicit {
            s.push_str(&format!(
                "\nTensorRT 8.6–10, implicit INT8 from the calibration cache:\n\n```sh\n{i}\n```\n"
            ));
        }
    }
    s
}
