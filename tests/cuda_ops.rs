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

mod common;

use common::cuda::{cpu_fp32_engine, cpu_int8_run, gpu, input_for, max_qdq};
use quantscope::backend::cuda::CudaBackend;
use quantscope::backend::{Backend, BuildInput, BuildSpec, Output, Precision};
use quantscope::model::Model;
use quantscope::model::proto;
use quantscope::model::testing::{GraphBuilder, float_attr, values};
use quantscope::quant;
use tract_onnx::pb::AttributeProto;

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

// ---- elementwise ---------------------------------------------------------------------------

fn elementwise_broadcast_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    // [1, C, 1, 1] constants in both operand orders.
    for op in ["Add", "Mul", "Sub", "Div", "Max", "Min"] {
        for const_first in [false, true] {
            cases.push(graph(
                &format!(
                    "{op} [1,C,1,1] const {}",
                    if const_first { "first" } else { "second" }
                ),
                &s,
                13,
                |b, x| {
                    let v: Vec<f32> = values(4, 3).iter().map(|v| 0.75 + 0.5 * v).collect();
                    let c = b.constant("c", &[1, 4, 1, 1], &v);
                    let ins = if const_first { [&c, x] } else { [x, &c] };
                    b.op(op, "ew", &[ins[0], ins[1]])
                },
            ));
        }
    }
    // Squeeze-excite: a computed [1, C, 1, 1] scale over [1, C, H, W], both orders.
    for scale_first in [false, true] {
        cases.push(graph(
            &format!(
                "SE Mul, scale {}",
                if scale_first { "first" } else { "second" }
            ),
            &s,
            13,
            |b, x| {
                let p = b.op("GlobalAveragePool", "gap", &[x]);
                let sg = b.op("Sigmoid", "sg", &[&p]);
                let ins = if scale_first { [&sg, x] } else { [x, &sg] };
                b.op("Mul", "se", &[ins[0], ins[1]])
            },
        ));
    }
    // The same after a conv (NHWC input on the GPU).
    cases.push(graph("SE Mul after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let p = b.op("GlobalAveragePool", "gap", &[&c]);
        let sg = b.op("HardSigmoid", "sg", &[&p]);
        b.op("Mul", "se", &[&c, &sg])
    }));
    // Whole groups of 16 channels after a conv (`nary8` in FP16, `nary16` in INT8: a
    // thread's 16 bytes of output read and written at once): a gate over two images, a
    // per-channel constant, a tensor plus itself.
    let wide = [2, 32, 5, 6];
    cases.push(graph(
        "SE Mul after conv, 32 channels",
        &wide,
        13,
        |b, x| {
            let c = after_conv(b, x, 32);
            let p = b.op("GlobalAveragePool", "gap", &[&c]);
            let sg = b.op("Sigmoid", "sg", &[&p]);
            b.op("Mul", "se", &[&sg, &c])
        },
    ));
    cases.push(graph(
        "Add [1,C,1,1] const, 32 channels",
        &wide,
        13,
        |b, x| {
            let c = after_conv(b, x, 32);
            let v: Vec<f32> = values(32, 5).iter().map(|v| 0.5 * v).collect();
            let k = b.constant("k", &[1, 32, 1, 1], &v);
            b.op("Add", "ew", &[&c, &k])
        },
    ));
    cases.push(graph(
        "Add tensor to itself, 32 channels",
        &wide,
        13,
        |b, x| {
            let c = after_conv(b, x, 32);
            b.op("Add", "ew", &[&c, &c])
        },
    ));
    // Scalar and row vectors (last axis), tensor [1, C, H, 1] against [1, C, H, W].
    cases.push(graph("Add scalar", &s, 13, |b, x| {
        let c = b.constant("c", &[], &[0.25]);
        b.op("Add", "ew", &[x, &c])
    }));
    cases.push(graph("Sub scalar first", &s, 13, |b, x| {
        let c = b.constant("c", &[], &[0.25]);
        b.op("Sub", "ew", &[&c, x])
    }));
    for op in ["Max", "Min", "Mul"] {
        cases.push(graph(&format!("{op} row vector"), &s, 13, |b, x| {
            let c = b.random("row", &[6], 1.0);
            b.op(op, "ew", &[x, &c])
        }));
    }
    cases.push(graph("Add [1,C,H,1] tensor", &s, 13, |b, x| {
        let m = b.node("ReduceMean", "mean", &[x], vec![ints("axes", &[3])]);
        let t = b.op("Tanh", "t", &[&m]);
        b.op("Add", "ew", &[&t, x])
    }));
    // Pow: a per-channel exponent of a positive base, and squaring.
    cases.push(graph("Pow per channel", &s, 13, |b, x| {
        let base = b.op("Sigmoid", "sg", &[x]);
        let e = b.constant("e", &[1, 4, 1, 1], &[0.5, 1.0, 2.0, 3.0]);
        b.op("Pow", "pow", &[&base, &e])
    }));
    cases.push(graph("Pow 2", &s, 13, |b, x| {
        let e = b.constant("e", &[], &[2.0]);
        b.op("Pow", "pow", &[x, &e])
    }));
    // Where on comparisons (bool tensors inside the graph).
    cases.push(graph("Where(Greater)", &s, 13, |b, x| {
        let c = b.random("c", &[1, 4, 1, 1], 0.5);
        let gt = b.op("Greater", "gt", &[x, &c]);
        let n = b.op("Neg", "neg", &[x]);
        b.op("Where", "where", &[&gt, x, &n])
    }));
    cases.push(graph("Where(Equal)", &s, 13, |b, x| {
        let two = b.constant("two", &[], &[2.0]);
        let m = b.op("Mul", "m2", &[x, &two]);
        let f = b.op("Floor", "floor", &[&m]);
        let zero = b.constant("zero", &[], &[0.0]);
        let eq = b.op("Equal", "eq", &[&f, &zero]);
        let row = b.random("row", &[6], 1.0);
        b.op("Where", "where", &[&eq, &row, x])
    }));
    cases
}

fn activations_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    type Build = fn(&mut GraphBuilder, &str) -> String;
    let acts: Vec<(&str, Build)> = vec![
        ("Erf", |b, x| b.op("Erf", "a", &[x])),
        ("Gelu (PyTorch's Div/Erf/Add/Mul export)", |b, x| {
            let s2 = b.constant("sqrt2", &[], &[std::f32::consts::SQRT_2]);
            let d = b.op("Div", "div", &[x, &s2]);
            let e = b.op("Erf", "erf", &[&d]);
            let one = b.constant("one", &[], &[1.0]);
            let a = b.op("Add", "add", &[&e, &one]);
            let m = b.op("Mul", "mul", &[x, &a]);
            let half = b.constant("half", &[], &[0.5]);
            b.op("Mul", "mul2", &[&m, &half])
        }),
        ("Tanh", |b, x| b.op("Tanh", "a", &[x])),
        ("Sigmoid", |b, x| b.op("Sigmoid", "a", &[x])),
        ("HardSigmoid", |b, x| {
            b.node(
                "HardSigmoid",
                "a",
                &[x],
                vec![float_attr("alpha", 0.25), float_attr("beta", 0.4)],
            )
        }),
        ("SiLU (x * Sigmoid(x))", |b, x| {
            let s = b.op("Sigmoid", "sg", &[x]);
            b.op("Mul", "a", &[x, &s])
        }),
        ("LeakyRelu", |b, x| {
            b.node("LeakyRelu", "a", &[x], vec![float_attr("alpha", 0.1)])
        }),
        ("PRelu", |b, x| {
            let slope = b.constant("slope", &[4, 1, 1], &[0.1, 0.2, -0.3, 0.25]);
            b.op("PRelu", "a", &[x, &slope])
        }),
        ("Softplus", |b, x| b.op("Softplus", "a", &[x])),
        ("Exp", |b, x| b.op("Exp", "a", &[x])),
        ("Log", |b, x| {
            let a = b.op("Abs", "abs", &[x]);
            let c = b.constant("c", &[], &[0.5]);
            let p = b.op("Add", "add", &[&a, &c]);
            b.op("Log", "a", &[&p])
        }),
        ("Sqrt", |b, x| {
            let a = b.op("Abs", "abs", &[x]);
            b.op("Sqrt", "a", &[&a])
        }),
        ("Reciprocal", |b, x| {
            let a = b.op("Abs", "abs", &[x]);
            let c = b.constant("c", &[], &[0.5]);
            let p = b.op("Add", "add", &[&a, &c]);
            b.op("Reciprocal", "a", &[&p])
        }),
        ("Neg", |b, x| b.op("Neg", "a", &[x])),
        ("Abs", |b, x| b.op("Abs", "a", &[x])),
        ("Clip", |b, x| {
            let lo = b.constant("lo", &[], &[-0.5]);
            let hi = b.constant("hi", &[], &[1.0]);
            b.op("Clip", "a", &[x, &lo, &hi])
        }),
        ("Elu", |b, x| {
            b.node("Elu", "a", &[x], vec![float_attr("alpha", 0.7)])
        }),
        ("Relu after conv", |b, x| {
            let c = after_conv(b, x, 4);
            b.op("Relu", "a", &[&c])
        }),
        ("SiLU after conv (Mul(Sigmoid(y), y))", |b, x| {
            let c = after_conv(b, x, 4);
            let s = b.op("Sigmoid", "sg", &[&c]);
            b.op("Mul", "a", &[&s, &c])
        }),
        ("Erf after conv", |b, x| {
            let c = after_conv(b, x, 4);
            b.op("Erf", "a", &[&c])
        }),
    ];
    let mut cases: Vec<Case> = acts
        .into_iter()
        .map(|(name, f)| graph(name, &s, 13, f))
        .collect();
    // HardSwish came in opset 14 (ONNX Runtime refuses it in an opset-13 model).
    cases.push(graph("HardSwish", &s, 14, |b, x| {
        b.op("HardSwish", "a", &[x])
    }));
    // The Gelu op itself (opset 20).
    cases.push(graph("Gelu op", &s, 20, |b, x| b.op("Gelu", "a", &[x])));
    cases.push(graph("Gelu op, tanh", &s, 20, |b, x| {
        b.node("Gelu", "a", &[x], vec![string("approximate", "tanh")])
    }));
    cases
}

// ---- normalization -------------------------------------------------------------------------

fn layer_normalization_cases() -> Vec<Case> {
    let s = [1, 4, 6, 8];
    let mut cases = vec![];
    cases.push(graph("LayerNormalization axis -1", &s, 17, |b, x| {
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.node(
            "LayerNormalization",
            "ln",
            &[x, &g, &be],
            vec![int("axis", -1), float_attr("epsilon", 1e-5)],
        )
    }));
    cases.push(graph("LayerNormalization, no bias", &s, 17, |b, x| {
        let g = b.random("g", &[8], 1.0);
        b.node("LayerNormalization", "ln", &[x, &g], vec![int("axis", -1)])
    }));
    cases.push(graph(
        "LayerNormalization axis 1 (C, H, W)",
        &s,
        17,
        |b, x| {
            let g = b.random("g", &[4, 6, 8], 1.0);
            let be = b.random("b", &[4, 6, 8], 0.5);
            b.node(
                "LayerNormalization",
                "ln",
                &[x, &g, &be],
                vec![int("axis", 1)],
            )
        },
    ));
    // ConvNeXt: permute to channels-last, normalise over C, permute back.
    cases.push(graph("ConvNeXt LayerNorm over C", &s, 17, |b, x| {
        let c = after_conv(b, x, 4);
        let t = b.node(
            "Transpose",
            "to_nhwc",
            &[&c],
            vec![ints("perm", &[0, 2, 3, 1])],
        );
        let g = b.random("g", &[4], 1.0);
        let be = b.random("b", &[4], 0.5);
        let ln = b.node(
            "LayerNormalization",
            "ln",
            &[&t, &g, &be],
            vec![int("axis", -1), float_attr("epsilon", 1e-6)],
        );
        b.node(
            "Transpose",
            "to_nchw",
            &[&ln],
            vec![ints("perm", &[0, 3, 1, 2])],
        )
    }));
    // The decomposed pattern older exporters write.
    cases.push(graph("ReduceMean/Sub/Pow/Sqrt/Div", &s, 13, |b, x| {
        let m = b.node("ReduceMean", "mean", &[x], vec![ints("axes", &[-1])]);
        let d = b.op("Sub", "sub", &[x, &m]);
        let two = b.constant("two", &[], &[2.0]);
        let p = b.op("Pow", "pow", &[&d, &two]);
        let v = b.node("ReduceMean", "var", &[&p], vec![ints("axes", &[-1])]);
        let eps = b.constant("eps", &[], &[1e-5]);
        let ve = b.op("Add", "add_eps", &[&v, &eps]);
        let sd = b.op("Sqrt", "sqrt", &[&ve]);
        let n = b.op("Div", "div", &[&d, &sd]);
        let g = b.random("g", &[8], 1.0);
        let gm = b.op("Mul", "gamma", &[&n, &g]);
        let be = b.random("b", &[8], 0.5);
        b.op("Add", "beta", &[&gm, &be])
    }));
    cases
}

fn instance_and_group_normalization_cases() -> Vec<Case> {
    let s = [2, 8, 4, 5];
    let mut cases = vec![];
    cases.push(graph("InstanceNormalization", &s, 13, |b, x| {
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.node(
            "InstanceNormalization",
            "in",
            &[x, &g, &be],
            vec![float_attr("epsilon", 1e-5)],
        )
    }));
    cases.push(graph("InstanceNormalization after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 8);
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.op("InstanceNormalization", "in", &[&c, &g, &be])
    }));
    // Opset 18: scale and bias per group.
    cases.push(graph("GroupNormalization opset 18", &s, 18, |b, x| {
        let g = b.random("g", &[4], 1.0);
        let be = b.random("b", &[4], 0.5);
        b.node(
            "GroupNormalization",
            "gn",
            &[x, &g, &be],
            vec![int("num_groups", 4), float_attr("epsilon", 1e-5)],
        )
    }));
    // Opset 21: scale and bias per channel.
    cases.push(graph("GroupNormalization opset 21", &s, 21, |b, x| {
        let g = b.random("g", &[8], 1.0);
        let be = b.random("b", &[8], 0.5);
        b.node(
            "GroupNormalization",
            "gn",
            &[x, &g, &be],
            vec![int("num_groups", 2), float_attr("epsilon", 1e-5)],
        )
    }));
    cases
}

fn softmax_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    for op in ["Softmax", "LogSoftmax"] {
        for axis in [1, -1, 2] {
            cases.push(graph(&format!("{op} axis {axis}"), &s, 13, |b, x| {
                b.node(op, "sm", &[x], vec![int("axis", axis)])
            }));
        }
        cases.push(graph(&format!("{op} axis 1 after conv"), &s, 13, |b, x| {
            let c = after_conv(b, x, 4);
            b.node(op, "sm", &[&c], vec![int("axis", 1)])
        }));
    }
    // Attention rows: 64 long, scaled scores.
    cases.push(graph(
        "Softmax attention rows",
        &[2, 4, 8, 64],
        13,
        |b, x| {
            let c = b.constant("scale", &[], &[3.0]);
            let m = b.op("Mul", "scale", &[x, &c]);
            b.node("Softmax", "sm", &[&m], vec![int("axis", -1)])
        },
    ));
    cases
}

// ---- matmul --------------------------------------------------------------------------------

fn matmul_and_gemm_cases() -> Vec<Case> {
    let mut cases = vec![];
    // Attention's Q.K^T: tensor x tensor, batch dims [2, 4].
    cases.push(graph(
        "MatMul [2,4,8,16] x [2,4,16,8]",
        &[2, 4, 8, 16],
        13,
        |b, x| {
            let a = b.op("Sigmoid", "q", &[x]);
            let t = b.op("Tanh", "k", &[x]);
            let kt = b.node("Transpose", "kt", &[&t], vec![ints("perm", &[0, 1, 3, 2])]);
            b.op("MatMul", "qk", &[&a, &kt])
        },
    ));
    // attn.V: [2,4,8,8] x [2,4,8,16].
    cases.push(graph("MatMul softmax x V", &[2, 4, 8, 16], 13, |b, x| {
        let kt = b.node("Transpose", "kt", &[x], vec![ints("perm", &[0, 1, 3, 2])]);
        let s = b.op("MatMul", "qk", &[x, &kt]);
        let p = b.node("Softmax", "sm", &[&s], vec![int("axis", -1)]);
        b.op("MatMul", "av", &[&p, x])
    }));
    // Batch broadcast: [1, 4, 8, 16] x [4, 16, 8] (rank 4 x rank 3, the batch of 1 stretched).
    cases.push(graph(
        "MatMul batch broadcast",
        &[1, 4, 8, 16],
        13,
        |b, x| {
            let r = b.ints("shape", &[3], &[4, 16, 8]);
            let t = b.node("Transpose", "t", &[x], vec![ints("perm", &[0, 1, 3, 2])]);
            let w = b.op("Reshape", "r", &[&t, &r]);
            let w2 = b.op("Tanh", "tw", &[&w]);
            b.op("MatMul", "mm", &[x, &w2])
        },
    ));
    // Linear layer: rank 3 x constant 2-D.
    cases.push(graph(
        "MatMul rank-3 x const",
        &[1, 4, 8, 16],
        13,
        |b, x| {
            let r = b.ints("shape", &[3], &[1, 32, 16]);
            let x3 = b.op("Reshape", "r", &[x, &r]);
            let w = b.random("w", &[16, 12], 0.5);
            let mm = b.op("MatMul", "mm", &[&x3, &w]);
            let bias = b.random("bias", &[12], 0.1);
            b.op("Add", "add_bias", &[&mm, &bias])
        },
    ));
    cases.push(graph(
        "MatMul rank-4 x const",
        &[2, 4, 8, 16],
        13,
        |b, x| {
            let w = b.random("w", &[16, 8], 0.5);
            b.op("MatMul", "mm", &[x, &w])
        },
    ));
    // Classifier heads: Gemm with transB, and with transA / alpha / beta.
    cases.push(graph("Gemm transB", &[2, 4, 4, 4], 13, |b, x| {
        let f = b.op("Flatten", "f", &[x]);
        let w = b.random("w", &[10, 64], 0.3);
        let bias = b.random("bias", &[10], 0.1);
        b.node("Gemm", "fc", &[&f, &w, &bias], vec![int("transB", 1)])
    }));
    cases.push(graph(
        "Gemm transA alpha beta",
        &[2, 4, 4, 4],
        13,
        |b, x| {
            let f = b.node("Flatten", "f", &[x], vec![int("axis", 1)]);
            let ft = b.node("Transpose", "ft", &[&f], vec![ints("perm", &[1, 0])]);
            let w = b.random("w", &[64, 10], 0.3);
            let bias = b.random("bias", &[10], 0.1);
            b.node(
                "Gemm",
                "fc",
                &[&ft, &w, &bias],
                vec![
                    int("transA", 1),
                    float_attr("alpha", 0.5),
                    float_attr("beta", 2.0),
                ],
            )
        },
    ));
    cases
}

// ---- data movement -------------------------------------------------------------------------

fn transpose_and_reshape_family_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    for perm in [
        [0, 2, 3, 1],
        [0, 3, 1, 2],
        [0, 2, 1, 3],
        [3, 1, 0, 2],
        [1, 0, 3, 2],
    ] {
        cases.push(graph(&format!("Transpose {perm:?}"), &s, 13, |b, x| {
            b.node("Transpose", "t", &[x], vec![ints("perm", &perm)])
        }));
        cases.push(graph(
            &format!("Transpose {perm:?} after conv"),
            &s,
            13,
            |b, x| {
                let c = after_conv(b, x, 4);
                b.node("Transpose", "t", &[&c], vec![ints("perm", &perm)])
            },
        ));
    }
    cases.push(graph("Transpose rank 5", &s, 13, |b, x| {
        let r = b.ints("shape", &[5], &[1, 2, 2, 5, 6]);
        let x5 = b.op("Reshape", "r", &[x, &r]);
        b.node(
            "Transpose",
            "t",
            &[&x5],
            vec![ints("perm", &[0, 3, 1, 4, 2])],
        )
    }));
    cases.push(graph("Reshape [1, 4, 30] + Relu", &s, 13, |b, x| {
        let r = b.ints("shape", &[3], &[1, 4, -1]);
        let y = b.op("Reshape", "r", &[x, &r]);
        b.op("Relu", "relu", &[&y])
    }));
    cases.push(graph("Reshape after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let r = b.ints("shape", &[3], &[0, 2, -1]);
        b.op("Reshape", "r", &[&c, &r])
    }));
    cases.push(graph("Flatten axis 2", &s, 13, |b, x| {
        let f = b.node("Flatten", "f", &[x], vec![int("axis", 2)]);
        b.op("Tanh", "t", &[&f])
    }));
    cases.push(graph("Unsqueeze, Squeeze", &s, 13, |b, x| {
        let ax = b.ints("ax0", &[1], &[0]);
        let u = b.op("Unsqueeze", "u", &[x, &ax]);
        let t = b.op("Sigmoid", "sg", &[&u]);
        let ax2 = b.ints("ax2", &[2], &[0, 1]);
        b.op("Squeeze", "s", &[&t, &ax2])
    }));
    cases.push(graph("Identity, Dropout", &s, 13, |b, x| {
        let i = b.op("Identity", "id", &[x]);
        let d = b.op("Dropout", "drop", &[&i]);
        b.op("Neg", "neg", &[&d])
    }));
    cases
}

fn expand_tile_gather_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    cases.push(graph("Expand [1,4,1,6] -> [2,4,5,6]", &s, 13, |b, x| {
        let m = b.node("ReduceMean", "m", &[x], vec![ints("axes", &[2])]);
        let shape = b.ints("shape", &[4], &[2, 4, 5, 6]);
        b.op("Expand", "e", &[&m, &shape])
    }));
    cases.push(graph("Expand rank up", &s, 13, |b, x| {
        let shape = b.ints("shape", &[5], &[3, 1, 4, 5, 6]);
        b.op("Expand", "e", &[x, &shape])
    }));
    cases.push(graph("Tile", &s, 13, |b, x| {
        let r = b.ints("reps", &[4], &[1, 2, 1, 3]);
        b.op("Tile", "t", &[x, &r])
    }));
    // Channel shuffle (ShuffleNet): constant indices on axis 1.
    cases.push(graph("Gather axis 1", &s, 13, |b, x| {
        let i = b.ints("idx", &[4], &[2, 0, 3, 1]);
        b.node("Gather", "g", &[x, &i], vec![int("axis", 1)])
    }));
    cases.push(graph("Gather axis 1 after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let i = b.ints("idx", &[6], &[3, 2, 1, 0, 0, 1]);
        b.node("Gather", "g", &[&c, &i], vec![int("axis", 1)])
    }));
    cases.push(graph(
        "Gather scalar index (ViT class token)",
        &s,
        13,
        |b, x| {
            let i = b.ints("idx", &[], &[2]);
            b.node("Gather", "g", &[x, &i], vec![int("axis", 2)])
        },
    ));
    cases.push(graph("Gather negative indices axis -1", &s, 13, |b, x| {
        let i = b.ints("idx", &[2, 2], &[-1, 0, 2, -3]);
        b.node("Gather", "g", &[x, &i], vec![int("axis", -1)])
    }));
    cases.push(graph("Gather axis 0 of a 2-D table", &s, 13, |b, x| {
        let r = b.ints("shape", &[2], &[20, 6]);
        let t = b.op("Reshape", "r", &[x, &r]);
        let i = b.ints("idx", &[3], &[19, 0, 7]);
        b.node("Gather", "g", &[&t, &i], vec![int("axis", 0)])
    }));
    cases
}

fn slice_split_concat_cases() -> Vec<Case> {
    let s = [1, 4, 6, 8];
    let mut cases = vec![];
    cases.push(graph("Slice step 2", &s, 13, |b, x| {
        let st = b.ints("starts", &[1], &[1]);
        let en = b.ints("ends", &[1], &[8]);
        let ax = b.ints("axes", &[1], &[3]);
        let sp = b.ints("steps", &[1], &[2]);
        b.op("Slice", "sl", &[x, &st, &en, &ax, &sp])
    }));
    cases.push(graph("Slice reversed (step -1)", &s, 13, |b, x| {
        let st = b.ints("starts", &[1], &[-1]);
        let en = b.ints("ends", &[1], &[i64::MIN]);
        let ax = b.ints("axes", &[1], &[2]);
        let sp = b.ints("steps", &[1], &[-1]);
        b.op("Slice", "sl", &[x, &st, &en, &ax, &sp])
    }));
    cases.push(graph("Slice negative starts, two axes", &s, 13, |b, x| {
        let st = b.ints("starts", &[2], &[-5, 1]);
        let en = b.ints("ends", &[2], &[i64::MAX, 3]);
        let ax = b.ints("axes", &[2], &[3, 1]);
        b.op("Slice", "sl", &[x, &st, &en, &ax])
    }));
    cases.push(graph("Slice step -2 after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let st = b.ints("starts", &[1], &[6]);
        let en = b.ints("ends", &[1], &[0]);
        let ax = b.ints("axes", &[1], &[3]);
        let sp = b.ints("steps", &[1], &[-2]);
        b.op("Slice", "sl", &[&c, &st, &en, &ax, &sp])
    }));
    cases.push(graph("Split [1, 3] + Concat swapped", &s, 13, |b, x| {
        let sp = b.ints("split_sizes", &[2], &[1, 3]);
        let parts = b.node_n("Split", "split", &[x, &sp], 2, vec![int("axis", 1)]);
        let r = b.op("Relu", "relu", &[&parts[0]]);
        let t = b.op("Sigmoid", "sg", &[&parts[1]]);
        b.node("Concat", "cat", &[&t, &r], vec![int("axis", 1)])
    }));
    cases.push(graph("Split equal on the last axis", &s, 13, |b, x| {
        let parts = b.node_n("Split", "split", &[x], 2, vec![int("axis", -1)]);
        b.op("Sub", "sub", &[&parts[0], &parts[1]])
    }));
    for axis in [1, 2, -1, 0] {
        cases.push(graph(&format!("Concat axis {axis}"), &s, 13, |b, x| {
            let t = b.op("Tanh", "t", &[x]);
            b.node("Concat", "cat", &[x, &t, x], vec![int("axis", axis)])
        }));
    }
    cases.push(graph("Concat conv outputs axis 1", &s, 13, |b, x| {
        let c1 = b.conv("c1", x, 4, 4, 1);
        let c2 = b.conv("c2", x, 4, 6, 3);
        b.node("Concat", "cat", &[&c1, &c2], vec![int("axis", 1)])
    }));
    cases
}

fn pad_cases() -> Vec<Case> {
    let s = [1, 4, 5, 6];
    let mut cases = vec![];
    let pads: [(&str, [i64; 8]); 2] = [
        ("spatial", [0, 0, 1, 2, 0, 0, 2, 1]),
        ("channels too", [0, 1, 1, 0, 0, 2, 0, 1]),
    ];
    let pad = |b: &mut GraphBuilder, x: &str, p: &[i64], mode: &str| {
        let pp = b.ints("pads", &[8], p);
        let v = b.constant("value", &[], &[0.5]);
        let ins: Vec<&str> = if mode == "constant" {
            vec![x, &pp, &v]
        } else {
            vec![x, &pp]
        };
        b.node("Pad", "pad", &ins, vec![string("mode", mode)])
    };
    for mode in ["constant", "reflect", "edge"] {
        for (what, p) in pads {
            cases.push(graph(&format!("Pad {mode} {what}"), &s, 13, |b, x| {
                pad(b, x, &p, mode)
            }));
        }
        // Negative pads crop. tract panics on them (overflow in its Pad), so the CPU runs the
        // same as a Slice then a Pad.
        let crop = graph(&format!("Pad {mode} negative (crop)"), &s, 13, |b, x| {
            pad(b, x, &[0, 0, -1, 2, 0, 0, 1, -2], mode)
        });
        let reference = graph("crop reference", &s, 13, |b, x| {
            let st = b.ints("starts", &[2], &[1, 0]);
            let en = b.ints("ends", &[2], &[i64::MAX, 4]);
            let ax = b.ints("axes", &[2], &[2, 3]);
            let sl = b.op("Slice", "slice", &[x, &st, &en, &ax]);
            pad(b, &sl, &[0, 0, 0, 2, 0, 0, 1, 0], mode)
        });
        cases.push(crop.with_reference(reference));
        cases.push(graph(&format!("Pad {mode} after conv"), &s, 13, |b, x| {
            let c = after_conv(b, x, 4);
            let pp = b.ints("pads", &[8], &[0, 0, 2, 1, 0, 0, 1, 2]);
            b.node("Pad", "pad", &[&c, &pp], vec![string("mode", mode)])
        }));
    }
    cases
}

fn depth_to_space_and_space_to_depth_cases() -> Vec<Case> {
    let mut cases = vec![];
    for mode in ["DCR", "CRD"] {
        cases.push(graph(
            &format!("DepthToSpace {mode}"),
            &[1, 8, 4, 5],
            13,
            |b, x| {
                b.node(
                    "DepthToSpace",
                    "d2s",
                    &[x],
                    vec![int("blocksize", 2), string("mode", mode)],
                )
            },
        ));
    }
    cases.push(graph(
        "DepthToSpace after conv",
        &[1, 8, 4, 5],
        13,
        |b, x| {
            let c = after_conv(b, x, 8);
            b.node("DepthToSpace", "d2s", &[&c], vec![int("blocksize", 2)])
        },
    ));
    cases.push(graph("SpaceToDepth", &[1, 2, 4, 6], 13, |b, x| {
        b.node("SpaceToDepth", "s2d", &[x], vec![int("blocksize", 2)])
    }));
    cases
}

// ---- pooling and reductions ----------------------------------------------------------------

/// A 3x3 stride-2 MaxPool node on `x` with `pads` (top, left, bottom, right).
fn max_pool_3x3_stride_2(b: &mut GraphBuilder, x: &str, pads: [i64; 4], ceil: bool) -> String {
    b.node(
        "MaxPool",
        "mp",
        &[x],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("strides", &[2, 2]),
            ints("pads", &pads),
            int("ceil_mode", ceil as i64),
        ],
    )
}

fn pooling_cases() -> Vec<Case> {
    let s = [1, 4, 7, 7];
    let mut cases = vec![];
    // SqueezeNet: 3x3 stride 2 ceil mode.
    cases.push(graph("MaxPool ceil_mode", &s, 13, |b, x| {
        max_pool_3x3_stride_2(b, x, [0; 4], true)
    }));
    cases.push(graph(
        "MaxPool ceil_mode after conv",
        &[1, 4, 8, 8],
        13,
        |b, x| {
            let c = after_conv(b, x, 4);
            max_pool_3x3_stride_2(b, &c, [1, 1, 0, 0], true)
        },
    ));
    // ResNet's stem pool over 16 channels between convs: whole 16-byte vectors in FP32, FP16
    // and int8, the raw max kernel's (int8 requantized where the output's scale differs).
    cases.push(graph(
        "MaxPool 3x3/2 pad 1 after conv, 16 channels",
        &[2, 16, 9, 9],
        13,
        |b, x| {
            let c = after_conv(b, x, 16);
            let p = max_pool_3x3_stride_2(b, &c, [1, 1, 1, 1], false);
            // A conv reading the pool, so that in INT8 its output is int8 too.
            b.conv("post", &p, 16, 16, 1)
        },
    ));
    // TensorFlow's image pooling: a window as large as the input (a global average pool).
    cases.push(graph(
        "AveragePool over the whole input",
        &[2, 8, 5, 6],
        13,
        |b, x| {
            let c = after_conv(b, x, 8);
            b.node(
                "AveragePool",
                "ap",
                &[&c],
                vec![ints("kernel_shape", &[5, 6])],
            )
        },
    ));
    cases.push(graph("MaxPool dilation 2", &s, 13, |b, x| {
        b.node(
            "MaxPool",
            "mp",
            &[x],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("dilations", &[2, 2]),
                ints("pads", &[2, 2, 2, 2]),
            ],
        )
    }));
    cases.push(graph("MaxPool asymmetric pads", &s, 13, |b, x| {
        b.node(
            "MaxPool",
            "mp",
            &[x],
            vec![
                ints("kernel_shape", &[2, 3]),
                ints("strides", &[2, 1]),
                ints("pads", &[0, 1, 1, 2]),
            ],
        )
    }));
    for cip in [0, 1] {
        cases.push(graph(
            &format!("AveragePool count_include_pad {cip}"),
            &s,
            13,
            |b, x| {
                b.node(
                    "AveragePool",
                    "ap",
                    &[x],
                    vec![
                        ints("kernel_shape", &[3, 3]),
                        ints("strides", &[2, 2]),
                        ints("pads", &[1, 1, 1, 1]),
                        int("count_include_pad", cip),
                    ],
                )
            },
        ));
        cases.push(graph(
            &format!("AveragePool ceil_mode count_include_pad {cip}"),
            &s,
            13,
            |b, x| {
                b.node(
                    "AveragePool",
                    "ap",
                    &[x],
                    vec![
                        ints("kernel_shape", &[3, 3]),
                        ints("strides", &[2, 2]),
                        ints("pads", &[1, 1, 1, 1]),
                        int("ceil_mode", 1),
                        int("count_include_pad", cip),
                    ],
                )
            },
        ));
    }
    cases.push(graph("GlobalMaxPool", &s, 13, |b, x| {
        b.op("GlobalMaxPool", "gmp", &[x])
    }));
    // The first three run a block per image and 32 channels (the first two with fewer pixel
    // lanes than 32, the third with 32 lanes each summing several pixels); the fourth has few
    // images and channels over many pixels, so the pixels are split across blocks (2 to 8
    // splits, by the element size) and a second kernel adds the split sums up.
    for (name, shape) in [
        ("GlobalAveragePool after conv", s),
        (
            "GlobalAveragePool after conv, 7 x 7 (8 pixel lanes)",
            [2, 40, 7, 7],
        ),
        (
            "GlobalAveragePool after conv, a block per image",
            [2, 8, 20, 20],
        ),
        (
            "GlobalAveragePool after conv, pixels split across blocks",
            [2, 8, 128, 128],
        ),
    ] {
        cases.push(graph(name, &shape, 13, |b, x| {
            let c = after_conv(b, x, shape[1]);
            b.op("GlobalAveragePool", "gap", &[&c])
        }));
    }
    cases
}

fn reductions_cases() -> Vec<Case> {
    let s = [2, 4, 5, 6];
    let mut cases = vec![];
    for (op, axes, keep) in [
        ("ReduceMean", vec![2, 3], 1),
        ("ReduceMean", vec![1], 0),
        ("ReduceMax", vec![-1], 1),
        ("ReduceMax", vec![1, 2], 0),
        ("ReduceMin", vec![3], 1),
        ("ReduceL2", vec![1, 2], 0),
        ("ReduceL2", vec![3], 1),
        ("ReduceSumSquare", vec![2], 1),
        ("ReduceL1", vec![1], 1),
        ("ReduceLogSumExp", vec![-1], 1),
    ] {
        cases.push(graph(
            &format!("{op} axes {axes:?} keepdims {keep}"),
            &s,
            13,
            |b, x| {
                b.node(
                    op,
                    "r",
                    &[x],
                    vec![ints("axes", &axes), int("keepdims", keep)],
                )
            },
        ));
    }
    // Opset 13 ReduceSum takes its axes as an input.
    for (axes, keep) in [(vec![1i64], 0), (vec![2, 3], 1), (vec![-1], 1)] {
        cases.push(graph(
            &format!("ReduceSum axes {axes:?} keepdims {keep}"),
            &s,
            13,
            |b, x| {
                let a = b.ints("axes", &[axes.len()], &axes);
                b.node("ReduceSum", "r", &[x, &a], vec![int("keepdims", keep)])
            },
        ));
    }
    cases.push(graph("ReduceMean over C after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        b.node("ReduceMean", "r", &[&c], vec![ints("axes", &[1])])
    }));
    cases
}

// ---- resize --------------------------------------------------------------------------------

/// What a Resize case resizes to.
#[derive(Clone, Copy)]
enum Target {
    Scales([f32; 4]),
    Sizes([i64; 4]),
}

fn resize_modes_cases() -> Vec<Case> {
    let s = [1, 4, 6, 8];
    let mut cases = vec![];
    let coords = [
        "half_pixel",
        "asymmetric",
        "align_corners",
        "pytorch_half_pixel",
    ];
    // Up by 2, down by 2 (scales), and to 9 x 12 (sizes: a scale of 1.5).
    let targets = [
        ("x2", Target::Scales([1.0, 1.0, 2.0, 2.0])),
        ("x0.5", Target::Scales([1.0, 1.0, 0.5, 0.5])),
        ("to 9x12", Target::Sizes([1, 4, 9, 12])),
    ];
    let add = |cases: &mut Vec<Case>, name: String, attrs: Vec<AttributeProto>, t: Target| {
        cases.push(graph(&name, &s, 13, move |b, x| {
            let roi = b.constant("roi", &[0], &[]);
            let ins: Vec<String> = match t {
                Target::Scales(sc) => vec![roi, b.constant("scales", &[4], &sc)],
                Target::Sizes(sz) => {
                    let empty = b.constant("no_scales", &[0], &[]);
                    vec![roi, empty, b.ints("sizes", &[4], &sz)]
                }
            };
            let mut refs: Vec<&str> = vec![x];
            refs.extend(ins.iter().map(|s| s.as_str()));
            b.node("Resize", "rs", &refs, attrs)
        }));
    };
    for (what, t) in targets {
        for coord in coords {
            for mode in ["linear", "cubic"] {
                add(
                    &mut cases,
                    format!("Resize {mode} {coord} {what}"),
                    vec![
                        string("mode", mode),
                        string("coordinate_transformation_mode", coord),
                    ],
                    t,
                );
            }
        }
        for (coord, nearest) in [
            ("asymmetric", "floor"),
            ("half_pixel", "round_prefer_floor"),
            ("half_pixel", "round_prefer_ceil"),
            ("align_corners", "round_prefer_floor"),
            ("pytorch_half_pixel", "ceil"),
        ] {
            add(
                &mut cases,
                format!("Resize nearest {coord} {nearest} {what}"),
                vec![
                    string("mode", "nearest"),
                    string("coordinate_transformation_mode", coord),
                    string("nearest_mode", nearest),
                ],
                t,
            );
        }
        // Cubic as PyTorch (a = -0.75) and as TensorFlow (a = -0.5, exclude_outside).
        add(
            &mut cases,
            format!("Resize cubic a -0.5 exclude_outside {what}"),
            vec![
                string("mode", "cubic"),
                float_attr("cubic_coeff_a", -0.5),
                int("exclude_outside", 1),
            ],
            t,
        );
    }
    cases.push(graph("Resize linear after conv", &s, 13, |b, x| {
        let c = after_conv(b, x, 4);
        let roi = b.constant("roi", &[0], &[]);
        let sc = b.constant("scales", &[4], &[1.0, 1.0, 2.0, 2.0]);
        b.node(
            "Resize",
            "rs",
            &[&c, &roi, &sc],
            vec![string("mode", "linear")],
        )
    }));
    cases
}

// ---- convolutions --------------------------------------------------------------------------

fn conv_node(
    b: &mut GraphBuilder,
    name: &str,
    x: &str,
    w_dims: [usize; 4],
    bias: bool,
    attrs: Vec<AttributeProto>,
) -> String {
    let fan_in = (w_dims[1] * w_dims[2] * w_dims[3]) as f32;
    let w = b.random(&format!("{name}.w"), &w_dims, 3.0 / fan_in);
    let mut ins = vec![x.to_string(), w];
    if bias {
        ins.push(b.random(&format!("{name}.b"), &[w_dims[0]], 0.1));
    }
    let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
    b.node("Conv", name, &refs, attrs)
}

fn grouped_and_dilated_conv_cases() -> Vec<Case> {
    let s = [2, 4, 9, 9];
    let mut cases = vec![];
    cases.push(graph("Conv groups 2", &s, 13, |b, x| {
        conv_node(
            b,
            "conv",
            x,
            [6, 2, 3, 3],
            true,
            vec![ints("pads", &[1, 1, 1, 1]), int("group", 2)],
        )
    }));
    cases.push(graph("Conv dilation 2", &s, 13, |b, x| {
        conv_node(
            b,
            "conv",
            x,
            [8, 4, 3, 3],
            true,
            vec![ints("pads", &[2, 2, 2, 2]), ints("dilations", &[2, 2])],
        )
    }));
    cases.push(graph(
        "Depthwise stride 2 asymmetric pads",
        &s,
        13,
        |b, x| {
            conv_node(
                b,
                "conv",
                x,
                [4, 1, 3, 3],
                false,
                vec![
                    ints("pads", &[0, 1, 1, 0]),
                    ints("strides", &[2, 2]),
                    int("group", 4),
                ],
            )
        },
    ));
    // Stems: 3 input channels at stride 2 or 4, which the planner regroups into blocks
    // (space to depth) so the conv runs at stride 1 over 16 channels.
    let rgb = [2, 3, 17, 15];
    for (what, k, st, pads) in [
        ("Stem 7x7/2 pad 3", 7, 2, [3, 3, 3, 3]),
        ("Stem 3x3/2 pad 1", 3, 2, [1, 1, 1, 1]),
        ("Stem 3x3/2 SAME pads", 3, 2, [0, 0, 1, 1]),
        ("Patchify 4x4/4", 4, 4, [0, 0, 0, 0]),
    ] {
        cases.push(graph(what, &rgb, 13, |b, x| {
            let y = conv_node(
                b,
                "stem",
                x,
                [16, 3, k, k],
                true,
                vec![ints("strides", &[st, st]), ints("pads", &pads)],
            );
            b.op("Relu", "relu", &[&y])
        }));
    }
    cases.push(graph("Conv 1x5 then 5x1", &s, 13, |b, x| {
        let a = conv_node(
            b,
            "c1",
            x,
            [8, 4, 1, 5],
            true,
            vec![ints("pads", &[0, 2, 0, 2])],
        );
        let r = b.op("Relu", "relu", &[&a]);
        conv_node(
            b,
            "c2",
            &r,
            [8, 8, 5, 1],
            true,
            vec![ints("pads", &[2, 0, 2, 0])],
        )
    }));
    cases
}

fn conv_transpose_cases() -> Vec<Case> {
    let s = [1, 4, 5, 5];
    let mut cases = vec![];
    let ct =
        |b: &mut GraphBuilder, x: &str, w: [usize; 4], bias: bool, attrs: Vec<AttributeProto>| {
            let fan_in = (w[0] * w[2] * w[3]) as f32;
            let wn = b.random("ct.w", &w, 3.0 / fan_in);
            let mut ins = vec![x.to_string(), wn];
            if bias {
                ins.push(b.random("ct.b", &[w[1] * groups_of(&attrs)], 0.1));
            }
            let refs: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
            b.node("ConvTranspose", "ct", &refs, attrs)
        };
    cases.push(graph("ConvTranspose stride 2", &s, 13, |b, x| {
        ct(
            b,
            x,
            [4, 3, 3, 3],
            true,
            vec![
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
                ints("output_padding", &[1, 1]),
            ],
        )
    }));
    cases.push(graph("ConvTranspose stride 2 groups 2", &s, 13, |b, x| {
        ct(
            b,
            x,
            [4, 2, 4, 4],
            true,
            vec![
                ints("strides", &[2, 2]),
                ints("pads", &[1, 1, 1, 1]),
                int("group", 2),
            ],
        )
    }));
    cases.push(graph(
        "ConvTranspose dilation 2, no bias",
        &s,
        13,
        |b, x| {
            ct(
                b,
                x,
                [4, 2, 3, 3],
                false,
                vec![ints("dilations", &[2, 2]), ints("pads", &[0, 1, 1, 0])],
            )
        },
    ));
    cases.push(graph(
        "ConvTranspose after conv, then Relu",
        &s,
        13,
        |b, x| {
            let c = after_conv(b, x, 4);
            let y = ct(b, &c, [4, 4, 2, 2], true, vec![ints("strides", &[2, 2])]);
            b.op("Relu", "relu", &[&y])
        },
    ));
    cases
}

fn groups_of(attrs: &[AttributeProto]) -> usize {
    attrs
        .iter()
        .find(|a| a.name == "group")
        .map_or(1, |a| a.i as usize)
}

// ---- shape subgraphs -----------------------------------------------------------------------

/// Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as PyTorch exports `x.view(x.size(0),
/// -1)`: folded at build time, so none of its nodes is a step of the CUDA engine.
fn shape_cases() -> Vec<Case> {
    let mut cases = vec![];
    for batch in [1usize, 2] {
        cases.push(graph(
            &format!("x.view(x.size(0), -1), batch {batch}"),
            &[batch, 4, 5, 6],
            13,
            |b, x| {
                let c = after_conv(b, x, 4);
                let s = b.op("Shape", "shape", &[&c]);
                let i = b.ints("zero", &[], &[0]);
                let n = b.node("Gather", "shape.gather", &[&s, &i], vec![int("axis", 0)]);
                let ax = b.ints("ax", &[1], &[0]);
                let u = b.op("Unsqueeze", "shape.unsqueeze", &[&n, &ax]);
                let m1 = b.ints("minus1", &[1], &[-1]);
                let cat = b.node("Concat", "shape.concat", &[&u, &m1], vec![int("axis", 0)]);
                let r = b.op("Reshape", "reshape", &[&c, &cat]);
                b.op("Relu", "relu", &[&r])
            },
        ));
    }
    // ConstantOfShape + Range, as ViT exports its position ids.
    cases.push(graph(
        "ConstantOfShape + Range",
        &[1, 4, 5, 6],
        13,
        |b, x| {
            let s = b.op("Shape", "shape", &[x]);
            let i = b.ints("idx", &[1], &[1]);
            let c = b.node("Gather", "shape.gather", &[&s, &i], vec![int("axis", 0)]);
            let z = b.op("ConstantOfShape", "shape.zeros", &[&c]);
            let zf = b.node("Cast", "shape.cast_zeros", &[&z], vec![int("to", 1)]);
            let zero = b.ints("start", &[], &[0]);
            let one = b.ints("delta", &[], &[1]);
            let four = b.ints("limit", &[], &[4]);
            let r = b.op("Range", "shape.range", &[&zero, &four, &one]);
            let rf = b.node("Cast", "shape.cast_range", &[&r], vec![int("to", 1)]);
            let f = b.op("Add", "shape.add", &[&zf, &rf]);
            let shp = b.ints("shp", &[4], &[1, 4, 1, 1]);
            let fr = b.op("Reshape", "shape.reshape", &[&f, &shp]);
            b.op("Mul", "mul", &[x, &fr])
        },
    ));
    cases
}

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
