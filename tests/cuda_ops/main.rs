//! CUDA op coverage (issue 12): for each op family, small random ONNX graphs run on the CPU
//! backend (tract) and on the CUDA backend, compared. Without a usable GPU every test prints
//! why it skips and passes. Every case of a family runs even when an earlier one fails; the
//! test then fails listing all of them.
//!
//! Tolerances (error = max |cuda - cpu| / max |cpu| over the output):
//! - FP32 within 1e-4 relative, against the CPU FP32 engine;
//! - FP16 within 2e-2 relative, against the CPU FP32 engine (f16 storage, f32 arithmetic);
//! - INT8, for graphs with a layer the Q/DQ plan quantizes (Conv, ConvTranspose, MatMul,
//!   Gemm): both engines built from the same Q/DQ model (`quant::build_qdq`, max calibration),
//!   max |cuda - cpu| within two quantization steps of the output (a step: max |cpu int8| /
//!   127). One step for the int8 arithmetic itself; the second because the float layers
//!   between int8 ones (Softmax before attn·V) run in FP16 on the GPU, as TensorRT runs them,
//!   and in FP32 on the CPU, so a value near a rounding boundary of the next quantizer lands
//!   one level apart (measured on the H100: 1.02 steps on softmax·V).
//!
//! This file holds the harness and the tests; each op family's cases are a file of their own
//! beside it, named as the planner's modules in `src/backend/cuda/ops/` are.

#[path = "../common/mod.rs"]
mod common;
mod conv;
mod elementwise;
mod matmul;
mod movement;
mod norm;
mod pool;
mod resize;
mod shape;

use common::cuda::{cpu_fp32_engine, cpu_int8_run, gpu, input_for, max_qdq};
use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildInput, BuildSpec, Output, Precision};
use quantscope::model::Model;
use quantscope::model::proto;
use quantscope::model::testing::{GraphBuilder, float_attr, values};
use quantscope::quant;
use tract_onnx::pb::AttributeProto;

use conv::{conv_transpose_cases, grouped_and_dilated_conv_cases};
use elementwise::{activations_cases, elementwise_broadcast_cases};
use matmul::matmul_and_gemm_cases;
use movement::{
    depth_to_space_and_space_to_depth_cases, expand_tile_gather_cases, pad_cases,
    slice_split_concat_cases, transpose_and_reshape_family_cases,
};
use norm::{instance_and_group_normalization_cases, layer_normalization_cases, softmax_cases};
use pool::{pooling_cases, reductions_cases};
use resize::resize_modes_cases;
use shape::shape_cases;

const FP32_TOL: f64 = 1e-4;
const FP16_TOL: f64 = 2e-2;

fn int(name: &str, v: i64) -> AttributeProto {
    proto::int_attr(name, v)
}
fn ints(name: &str, v: &[i64]) -> AttributeProto {
    proto::ints_attr(name, v)
}
fn string(name: &str, v: &str) -> AttributeProto {
    proto::str_attr(name, v)
}

/// One graph to compare: its model and whether it has layers the Q/DQ plan quantizes.
struct Case {
    name: String,
    model: Model,
    batch: usize,
    hw: [usize; 2],
    int8: bool,
    /// The graph the CPU runs instead, where tract cannot run the op itself (same output).
    cpu_model: Option<Model>,
}

impl Case {
    /// `b` with `out` as its graph output, at `opset`; batch and size from its input.
    fn new(name: impl Into<String>, mut b: GraphBuilder, out: &str, opset: i64) -> Case {
        b.output(out);
        let dims: Vec<usize> = proto::value_info_shape(&b.graph.input[0])
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.unwrap_or(1) as usize)
            .collect();
        let int8 = b.graph.node.iter().any(|n| {
            matches!(
                n.op_type.as_str(),
                "Conv" | "ConvTranspose" | "MatMul" | "Gemm"
            )
        });
        Case {
            name: name.into(),
            model: b.model_opset(opset),
            batch: dims[0],
            hw: [dims[2], dims[3]],
            int8,
            cpu_model: None,
        }
    }

    /// The CPU reference is `reference` (an equivalent graph of ops tract runs).
    fn with_reference(mut self, reference: Case) -> Case {
        self.cpu_model = Some(reference.model);
        self
    }

    fn cpu_model(&self) -> &Model {
        self.cpu_model.as_ref().unwrap_or(&self.model)
    }
}

/// (relative error, absolute error) of `a` against `b`.
fn errors(a: &Output, b: &Output) -> Result<(f64, f64), String> {
    if a.shape != b.shape {
        return Err(format!("shape {:?}, cpu {:?}", a.shape, b.shape));
    }
    let m = b.data.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let mut abs = 0f64;
    for (x, y) in a.data.iter().zip(&b.data) {
        let d = (*x as f64 - *y as f64).abs();
        if d.is_nan() || (x.is_nan() != y.is_nan()) {
            return Err(format!("NaN: cuda {x} cpu {y}"));
        }
        abs = abs.max(d);
    }
    Ok((abs / m.max(1e-12), abs))
}

/// The CPU FP32 output of a case (on input seed 7), a panic in the CPU backend included.
fn cpu_run(c: &Case) -> Result<Output, String> {
    let spec = BuildSpec {
        batch: c.batch,
        hw: c.hw,
    };
    let x = input_for(&c.model, c.batch, c.hw, 7);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cpu_fp32_engine(c.cpu_model(), spec)?
            .run(&x)
            .map_err(|e| format!("cpu run: {e:#}"))
    }))
    .unwrap_or_else(|_| Err("the CPU backend panicked".into()))
}

/// Q/DQ model calibrated (max) on a few random inputs.
fn qdq_of(m: &Model, hw: [usize; 2]) -> Result<Option<quant::QdqModel>, String> {
    if quant::plan(m, &[]).tensors().is_empty() {
        return Ok(None);
    }
    max_qdq(m, hw, 4).map(Some)
}

/// Runs one case in FP32, FP16 and (where it applies) INT8; `Err` lists what failed.
fn run_case(g: &CudaBackend, c: &Case) -> Result<(), String> {
    let spec = BuildSpec {
        batch: c.batch,
        hw: c.hw,
    };
    let x = input_for(&c.model, c.batch, c.hw, 7);
    let reference = cpu_run(c)?;
    let mut fails = vec![];
    for (p, tol) in [(Precision::Fp32, FP32_TOL), (Precision::Fp16, FP16_TOL)] {
        let got = g
            .build(
                BuildInput::Float {
                    model: &c.model,
                    precision: p,
                    keep_fp32: &[],
                },
                spec,
            )
            .map_err(|e| format!("build: {e:#}"))
            .and_then(|mut e| e.run(&x).map_err(|e| format!("run: {e:#}")))
            .and_then(|out| errors(&out, &reference));
        match got {
            Ok((rel, _)) if rel <= tol => eprintln!("  {} {p}: rel err {rel:.2e}", c.name),
            Ok((rel, _)) => fails.push(format!("{p}: rel err {rel:.3e} > {tol:.0e}")),
            Err(e) => fails.push(format!("{p}: {e}")),
        }
    }
    if c.int8 {
        match int8_err(g, c, &x) {
            Ok(Some((abs, step))) if abs <= 2.0 * step => {
                eprintln!("  {} int8: max abs err {abs:.3e}, step {step:.3e}", c.name)
            }
            Ok(Some((abs, step))) => fails.push(format!(
                "int8: max abs err {abs:.3e} over two steps of {step:.3e}"
            )),
            Ok(None) => eprintln!("  {} int8: nothing quantized", c.name),
            Err(e) => fails.push(format!("int8: {e}")),
        }
    }
    if fails.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", c.name, fails.join("; ")))
    }
}

/// INT8 on both backends from one Q/DQ model: (max abs difference, output step).
fn int8_err(g: &CudaBackend, c: &Case, x: &[f32]) -> Result<Option<(f64, f64)>, String> {
    let Some(qdq) = qdq_of(&c.model, c.hw)? else {
        return Ok(None);
    };
    let spec = BuildSpec {
        batch: c.batch,
        hw: c.hw,
    };
    let cpu = cpu_int8_run(&c.model, &qdq, spec, x)?;
    let input = BuildInput::Quantized {
        model: &c.model,
        qdq: &qdq,
        keep_fp32: &[],
    };
    let cuda = g
        .build(input, spec)
        .map_err(|e| format!("build: {e:#}"))?
        .run(x)
        .map_err(|e| format!("run: {e:#}"))?;
    let (_, abs) = errors(&cuda, &cpu)?;
    let step = cpu.data.iter().fold(0f64, |m, v| m.max(v.abs() as f64)) / 127.0;
    Ok(Some((abs, step)))
}

/// Runs every case of a family; fails listing each case that failed.
fn run_family(family: &str, cases: Vec<Case>) {
    let Some(g) = gpu() else { return };
    eprintln!("{family}: {} cases", cases.len());
    let fails: Vec<String> = cases.iter().filter_map(|c| run_case(&g, c).err()).collect();
    assert!(
        fails.is_empty(),
        "{family}: {} of {} cases failed:\n{}",
        fails.len(),
        cases.len(),
        fails.join("\n")
    );
}

/// A graph on input `shape` whose output `f` makes from the input.
fn graph(
    name: &str,
    shape: &[usize],
    opset: i64,
    f: impl FnOnce(&mut GraphBuilder, &str) -> String,
) -> Case {
    let mut b = GraphBuilder::new(shape);
    let y = f(&mut b, "x");
    Case::new(name, b, &y, opset)
}

/// A 1x1 conv (c -> c) in front, so the op reads a conv's output (NHWC on the GPU, int8 in
/// INT8 engines where the plan allows).
fn after_conv(b: &mut GraphBuilder, x: &str, c: usize) -> String {
    b.conv("pre", x, c, c, 1)
}

// ---- the tests -----------------------------------------------------------------------------

/// Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as PyTorch exports `x.view(x.size(0),
/// -1)`, and ConstantOfShape / Range: folded at build time, so none of their nodes is a step of
/// the CUDA engine.
#[test]
fn shape_subgraph_folds() {
    let Some(g) = gpu() else { return };
    let cases = shape_cases();
    let mut fails = vec![];
    for c in &cases {
        if let Err(e) = run_case(&g, c) {
            fails.push(e);
            continue;
        }
        let spec = BuildSpec {
            batch: c.batch,
            hw: c.hw,
        };
        match g.build(
            BuildInput::Float {
                model: &c.model,
                precision: Precision::Fp32,
                keep_fp32: &[],
            },
            spec,
        ) {
            Ok(e) => {
                let left: Vec<&str> = e
                    .info()
                    .layer_times
                    .iter()
                    .map(|l| l.layer.as_str())
                    .filter(|l| l.starts_with("shape"))
                    .collect();
                if !left.is_empty() {
                    fails.push(format!("{}: shape nodes left as steps: {left:?}", c.name));
                }
            }
            Err(e) => fails.push(format!("{}: build: {e:#}", c.name)),
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

// ---- the tests -----------------------------------------------------------------------------

#[test]
fn elementwise_broadcast() {
    run_family("elementwise", elementwise_broadcast_cases());
}

#[test]
fn activations() {
    run_family("activations", activations_cases());
}

#[test]
fn layer_normalization() {
    run_family("layer_normalization", layer_normalization_cases());
}

#[test]
fn instance_and_group_normalization() {
    run_family(
        "instance_group_normalization",
        instance_and_group_normalization_cases(),
    );
}

#[test]
fn softmax() {
    run_family("softmax", softmax_cases());
}

#[test]
fn matmul_and_gemm() {
    run_family("matmul", matmul_and_gemm_cases());
}

#[test]
fn transpose_and_reshape_family() {
    run_family("transpose_reshape", transpose_and_reshape_family_cases());
}

#[test]
fn expand_tile_gather() {
    run_family("expand_tile_gather", expand_tile_gather_cases());
}

#[test]
fn slice_split_concat() {
    run_family("slice_split_concat", slice_split_concat_cases());
}

#[test]
fn pad() {
    run_family("pad", pad_cases());
}

#[test]
fn depth_to_space_and_space_to_depth() {
    run_family("depth_space", depth_to_space_and_space_to_depth_cases());
}

#[test]
fn pooling() {
    run_family("pooling", pooling_cases());
}

#[test]
fn reductions() {
    run_family("reductions", reductions_cases());
}

#[test]
fn resize_modes() {
    run_family("resize", resize_modes_cases());
}

#[test]
fn grouped_and_dilated_conv() {
    run_family("conv", grouped_and_dilated_conv_cases());
}

#[test]
fn conv_transpose() {
    run_family("conv_transpose", conv_transpose_cases());
}

/// Every case builds and runs on the CPU backend (the reference), so a bad test graph shows up
/// on machines without a GPU too.
#[test]
fn every_case_runs_on_the_cpu_backend() {
    let all: Vec<Case> = [
        elementwise_broadcast_cases(),
        activations_cases(),
        layer_normalization_cases(),
        instance_and_group_normalization_cases(),
        softmax_cases(),
        matmul_and_gemm_cases(),
        transpose_and_reshape_family_cases(),
        expand_tile_gather_cases(),
        slice_split_concat_cases(),
        pad_cases(),
        depth_to_space_and_space_to_depth_cases(),
        pooling_cases(),
        reductions_cases(),
        resize_modes_cases(),
        grouped_and_dilated_conv_cases(),
        conv_transpose_cases(),
        shape_cases(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let fails: Vec<String> = all
        .iter()
        .filter_map(|c| cpu_run(c).err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    eprintln!("{} cases run on the CPU backend", all.len());
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}
