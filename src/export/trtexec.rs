//! Ready `trtexec` command lines for exported models: the strongly typed build TensorRT 10/11
//! takes (precision written into the ONNX model: Q/DQ for INT8, FP16 tensors and Casts for
//! FP16) and, for a calibration cache, the implicit-INT8 build of TensorRT 8.6–10 (`--int8
//! --calib`, deprecated in TensorRT 10 and removed in TensorRT 11).
//!
//! Flags as trtexec's own help lists them: `--onnx=<file>`, `--stronglyTyped`,
//! `--shapes=spec`, `--saveEngine=<file>`, `--exportProfile=<file>` (per-layer times, JSON),
//! `--exportLayerInfo=<file>` (per-layer precision and tactic, JSON),
//! `--profilingVerbosity=detailed` (layer info needs it), `--int8`, `--calib=<file>`.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The image input a command builds for: its name, the shape quantscope ran, and whether the
/// file leaves a dimension dynamic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    pub name: String,
    pub dims: Vec<usize>,
    /// trtexec refuses `--shapes` for a model whose inputs are all static ("Static model does
    /// not take explicit shapes"), so the flag is written only when the file has a dynamic
    /// dimension.
    pub dynamic: bool,
}

impl InputSpec {
    /// From the model's first input as the file declares it and the shape quantscope ran.
    pub fn new(info: &crate::model::ModelInfo, dims: &[usize]) -> InputSpec {
        let input = info.inputs.first();
        InputSpec {
            name: input.map(|i| i.name.clone()).unwrap_or_default(),
            dims: dims.to_vec(),
            dynamic: input.is_none_or(|i| i.shape.iter().any(Option::is_none)),
        }
    }

    fn shapes_flag(&self) -> Option<String> {
        if !self.dynamic {
            return None;
        }
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        // trtexec splits the spec at ':'; a name holding one is wrapped in escaped quotes.
        let name = if self.name.contains(':') || self.name.contains(',') {
            format!("\\'{}\\'", self.name)
        } else {
            self.name.clone()
        };
        Some(format!("--shapes={name}:{}", dims.join("x")))
    }
}

/// The engine, profile and layer-info files a command writes, beside the model.
fn outputs(onnx: &Path, tag: &str) -> [String; 3] {
    let stem = onnx.with_extension("");
    let s = stem.display();
    [
        format!("--saveEngine={s}{tag}.engine"),
        format!("--exportProfile={s}{tag}.profile.json"),
        format!("--exportLayerInfo={s}{tag}.layers.json"),
    ]
}

/// `trtexec --onnx=FILE --stronglyTyped ...`: TensorRT 10 and 11 build each layer in the type
/// the model says (FP32, FP16, or INT8 where Q/DQ sit).
pub fn strongly_typed(onnx: &Path, input: &InputSpec) -> String {
    let mut args = vec![
        "trtexec".to_string(),
        format!("--onnx={}", onnx.display()),
        "--stronglyTyped".into(),
    ];
    args.extend(input.shapes_flag());
    args.extend(outputs(onnx, ""));
    args.push("--profilingVerbosity=detailed".into());
    join(&args)
}

/// `trtexec --onnx=FP32_MODEL --int8 --calib=CACHE ...`: TensorRT 8.6–10 implicit INT8 from
/// the float model the cache was calibrated on (TensorRT 11 removed it). Layers without a
/// scale in the cache run in FP32, as in quantscope's INT8 engine; adding `--fp16` lets them
/// run in FP16.
pub fn implicit_int8(fp32_onnx: &Path, cache: &Path, input: &InputSpec) -> String {
    let mut args = vec![
        "trtexec".to_string(),
        format!("--onnx={}", fp32_onnx.display()),
        "--int8".into(),
        format!("--calib={}", cache.display()),
    ];
    args.extend(input.shapes_flag());
    args.extend(outputs(cache, "_implicit"));
    args.push("--profilingVerbosity=detailed".into());
    join(&args)
}

/// Joins arguments into a line a POSIX shell reads back as the same arguments.
fn join(args: &[String]) -> String {
    args.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(a: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c);
    // `\'` (an escaped quote around a `--shapes` name) reaches trtexec as `'`: leave it be.
    if a.replace("\\'", "").chars().all(safe) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dynamic: bool) -> InputSpec {
        InputSpec {
            name: "input".into(),
            dims: vec![1, 3, 257, 257],
            dynamic,
        }
    }

    #[test]
    fn strongly_typed_line_for_a_dynamic_model() {
        let cmd = strongly_typed(Path::new("out/deeplab_fp16.onnx"), &spec(true));
        assert_eq!(
            cmd,
            "trtexec --onnx=out/deeplab_fp16.onnx --stronglyTyped --shapes=input:1x3x257x257 \
             --saveEngine=out/deeplab_fp16.engine --exportProfile=out/deeplab_fp16.profile.json \
             --exportLayerInfo=out/deeplab_fp16.layers.json --profilingVerbosity=detailed"
        );
    }

    #[test]
    fn static_models_get_no_shapes_flag() {
        let cmd = strongly_typed(Path::new("m_int8_max.onnx"), &spec(false));
        assert!(!cmd.contains("--shapes"), "{cmd}");
        assert!(cmd.contains("--stronglyTyped"));
    }

    #[test]
    fn implicit_line_reads_the_cache_with_the_float_model() {
        let cmd = implicit_int8(
            Path::new("models/m.onnx"),
            Path::new("out/m_int8_mse.cache"),
            &spec(true),
        );
        assert_eq!(
            cmd,
            "trtexec --onnx=models/m.onnx --int8 --calib=out/m_int8_mse.cache \
             --shapes=input:1x3x257x257 --saveEngine=out/m_int8_mse_implicit.engine \
             --exportProfile=out/m_int8_mse_implicit.profile.json \
             --exportLayerInfo=out/m_int8_mse_implicit.layers.json --profilingVerbosity=detailed"
        );
        assert!(!cmd.contains("--stronglyTyped"));
    }

    #[test]
    fn paths_with_spaces_are_quoted_and_tf_names_escaped() {
        let s = InputSpec {
            name: "input:0".into(),
            dims: vec![1, 224, 224, 3],
            dynamic: true,
        };
        let cmd = strongly_typed(Path::new("my models/a.onnx"), &s);
        assert!(cmd.contains("'--onnx=my models/a.onnx'"), "{cmd}");
        assert!(cmd.contains(r"--shapes=\'input:0\':1x224x224x3"), "{cmd}");
    }
}
