//! Small pre-quantized models in the forms other tools write them (PyTorch's eager-mode export,
//! ONNX Runtime's `quantize_static`, modelopt's INT8 and FP8), built in code so that the tests
//! of their loading need neither PyTorch nor model files.

use tract_onnx::pb;

use super::fp8;
use crate::model::proto;
use crate::model::testing::{GraphBuilder, values};

/// Which tool's Q/DQ form a test model imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `torch.onnx.export` of an eager-mode quantized model (opset 13): uint8 activations with
    /// zero point 128 behind `Cast`s, int8 per-channel weights, int32 biases whose zero point
    /// is computed by `ConstantOfShape → Cast`, one DequantizeLinear per reader.
    Torch,
    /// ONNX Runtime's `quantize_static` QDQ: uint8 activations with data-dependent zero points
    /// (0 after the ReLU), int32 biases, a DequantizeLinear shared by its readers.
    OrtAsymmetric,
    /// modelopt's INT8: int8 activations with zero point 0, float weights quantized in the
    /// graph (QuantizeLinear → DequantizeLinear), float biases.
    ModeloptInt8,
    /// modelopt's FP8 (opset 19): `float8e4m3fn` activations and weights, float biases.
    ModeloptFp8,
}

impl Form {
    pub const ALL: [Form; 4] = [
        Form::Torch,
        Form::OrtAsymmetric,
        Form::ModeloptInt8,
        Form::ModeloptFp8,
    ];

    pub fn opset(self) -> i64 {
        if self == Form::ModeloptFp8 { 19 } else { 13 }
    }
}

/// The input shape of every [`prequantized`] model.
pub const INPUT: [usize; 4] = [1, 3, 8, 8];

/// A classifier quantized as `form` writes it: input [1, 3, 8, 8] in [-2, 2) → Q/DQ → 3x3 conv
/// (3 → 4) → ReLU → Q/DQ → global average pool + global max pool → Add → Flatten → Q/DQ →
/// Gemm (4 → 5) → `y` (PyTorch's form also quantizes `y`). Returns the ONNX bytes.
pub fn prequantized(form: Form) -> Vec<u8> {
    let mut q = Quantizer {
        b: GraphBuilder::new(&INPUT),
        form,
        k: 0,
        last_scale: 1.0,
    };
    let x = q.activation("x", 2.0, false, 1)[0].clone();
    let w = q.weight("conv.w", &[4, 3, 3, 3], 0.4);
    let conv_b = q.bias("conv.b", 4, &w.1);
    let c = q.b.node(
        "Conv",
        "conv",
        &[&x, &w.0, &conv_b],
        vec![
            proto::ints_attr("pads", &[1, 1, 1, 1]),
            proto::ints_attr("kernel_shape", &[3, 3]),
        ],
    );
    let r = q.b.op("Relu", "relu", &[&c]);
    let rq = q.activation(&r, 3.0, true, 2);
    let avg = q.b.op("GlobalAveragePool", "avg", &[&rq[0]]);
    let max = q.b.op("GlobalMaxPool", "gmax", &[&rq[1]]);
    let sum = q.b.op("Add", "sum", &[&avg, &max]);
    let f =
        q.b.node("Flatten", "flat", &[&sum], vec![proto::int_attr("axis", 1)]);
    let fq = q.activation(&f, 5.0, true, 1)[0].clone();
    let fc_w = q.weight("fc.w", &[5, 4], 0.5);
    let fc_b = q.bias("fc.b", 5, &fc_w.1);
    let y = q.b.node(
        "Gemm",
        "fc",
        &[&fq, &fc_w.0, &fc_b],
        vec![proto::int_attr("transB", 1)],
    );
    let y = if form == Form::Torch {
        q.activation(&y, 4.0, false, 1)[0].clone()
    } else {
        y
    };
    q.b.graph
        .node
        .push(proto::node("Identity", "out", &[&y], &["y"], vec![]));
    q.b.output("y");
    q.b.to_bytes(form.opset())
}

/// Writes Q/DQ the way `form` does.
struct Quantizer {
    b: GraphBuilder,
    form: Form,
    /// A counter for unique names.
    k: usize,
    /// The scale of the last activation quantized (a bias's input scale).
    last_scale: f32,
}

impl Quantizer {
    fn name(&mut self, base: &str) -> String {
        self.k += 1;
        format!("{base}_{}", self.k)
    }

    fn push(&mut self, t: pb::TensorProto) -> String {
        let name = t.name.clone();
        self.b.graph.initializer.push(t);
        name
    }

    /// A constant as PyTorch writes it: a `Constant` node (other forms: an initializer).
    fn constant(&mut self, t: pb::TensorProto) -> String {
        if self.form != Form::Torch {
            return self.push(t);
        }
        let out = t.name.clone();
        let attr = pb::AttributeProto {
            name: "value".into(),
            r#type: pb::attribute_proto::AttributeType::Tensor as i32,
            t: Some(t),
            ..Default::default()
        };
        let n = self.name("Constant");
        self.b
            .graph
            .node
            .push(proto::node("Constant", &n, &[], &[&out], vec![attr]));
        out
    }

    /// The scale and zero point of an activation in [-amax, amax) (or [0, amax) when
    /// `non_negative`), as this form chooses them.
    fn act_qparams(&mut self, amax: f32, non_negative: bool) -> (String, String) {
        let (scale, zp) = match self.form {
            Form::Torch => (
                amax / 127.0,
                proto::u8_tensor(&self.name("zp"), &[], &[128]),
            ),
            Form::OrtAsymmetric if non_negative => {
                (amax / 255.0, proto::u8_tensor(&self.name("zp"), &[], &[0]))
            }
            // An asymmetric range as ONNX Runtime's MinMax picks it for a signed tensor.
            Form::OrtAsymmetric => (
                2.0 * amax / 255.0,
                proto::u8_tensor(&self.name("zp"), &[], &[127]),
            ),
            Form::ModeloptInt8 => (amax / 127.0, proto::i8_tensor(&self.name("zp"), &[], &[0])),
            Form::ModeloptFp8 => (
                fp8::act_scale(amax),
                fp8::f8_tensor(&self.name("zp"), &[], &[0]),
            ),
        };
        self.last_scale = scale;
        let s = proto::f32_tensor(&self.name("scale"), &[], &[scale]);
        (self.constant(s), self.constant(zp))
    }

    /// Q then DQ of `x`; returns what `readers` readers read (PyTorch: a Cast and a DQ each;
    /// ONNX Runtime: one shared DQ; modelopt: one DQ each).
    fn activation(
        &mut self,
        x: &str,
        amax: f32,
        non_negative: bool,
        readers: usize,
    ) -> Vec<String> {
        let (s, z) = self.act_qparams(amax, non_negative);
        let qn = self.name("QuantizeLinear");
        let q = self.b.node("QuantizeLinear", &qn, &[x, &s, &z], vec![]);
        let mut out: Vec<String> = vec![];
        for r in 0..readers {
            if self.form == Form::OrtAsymmetric && r > 0 {
                out.push(out[0].clone());
                continue;
            }
            let src = if self.form == Form::Torch {
                let cn = self.name("Cast");
                self.b
                    .node("Cast", &cn, &[&q], vec![proto::int_attr("to", 2)])
            } else {
                q.clone()
            };
            let dn = self.name("DequantizeLinear");
            out.push(
                self.b
                    .node("DequantizeLinear", &dn, &[&src, &s, &z], vec![]),
            );
        }
        out
    }

    /// A weight quantized per output channel (axis 0): (what the layer reads, the scales).
    fn weight(&mut self, name: &str, dims: &[usize], amplitude: f32) -> (String, Vec<f32>) {
        let n: usize = dims.iter().product();
        let w: Vec<f32> = values(n, n as u64 + 7)
            .iter()
            .map(|v| v * amplitude)
            .collect();
        let per = n / dims[0];
        let amax: Vec<f32> = w
            .chunks(per)
            .map(|c| c.iter().fold(1e-6f32, |m, v| m.max(v.abs())))
            .collect();
        let fp8 = self.form == Form::ModeloptFp8;
        let scales: Vec<f32> = amax
            .iter()
            .map(|a| if fp8 { a / 448.0 } else { a / 127.0 })
            .collect();
        let s = self.constant(proto::f32_tensor(
            &format!("{name}.scale"),
            &[dims[0]],
            &scales,
        ));
        let zp_name = format!("{name}.zp");
        let zp = self.constant(if fp8 {
            fp8::f8_tensor(&zp_name, &[dims[0]], &vec![0; dims[0]])
        } else {
            proto::i8_tensor(&zp_name, &[dims[0]], &vec![0; dims[0]])
        });
        let stored = match self.form {
            // Float weights quantized in the graph.
            Form::ModeloptInt8 => {
                let f = self.push(proto::f32_tensor(name, dims, &w));
                let qn = format!("{name}.quantize");
                self.b.node(
                    "QuantizeLinear",
                    &qn,
                    &[&f, &s, &zp],
                    vec![proto::int_attr("axis", 0)],
                )
            }
            Form::ModeloptFp8 => {
                let codes: Vec<u8> = w
                    .iter()
                    .enumerate()
                    .map(|(k, v)| fp8::e4m3_from_f32(v / scales[k / per]))
                    .collect();
                self.constant(fp8::f8_tensor(&format!("{name}.q"), dims, &codes))
            }
            _ => {
                let qv: Vec<i8> = w
                    .iter()
                    .enumerate()
                    .map(|(k, v)| (v / scales[k / per]).round().clamp(-127.0, 127.0) as i8)
                    .collect();
                self.constant(proto::i8_tensor(&format!("{name}.q"), dims, &qv))
            }
        };
        let dn = format!("{name}.dequantize");
        let read = self.b.node(
            "DequantizeLinear",
            &dn,
            &[&stored, &s, &zp],
            vec![proto::int_attr("axis", 0)],
        );
        (read, scales)
    }

    /// A bias of `channels`: float for modelopt; int32 at input scale × weight scale behind a
    /// DequantizeLinear for PyTorch (zero point from `ConstantOfShape → Cast`) and ONNX Runtime.
    fn bias(&mut self, name: &str, channels: usize, w_scales: &[f32]) -> String {
        let input_scale = self.last_scale;
        let b: Vec<f32> = values(channels, 99 + channels as u64)
            .iter()
            .map(|v| v * 0.2)
            .collect();
        if matches!(self.form, Form::ModeloptInt8 | Form::ModeloptFp8) {
            return self.push(proto::f32_tensor(name, &[channels], &b));
        }
        let scales: Vec<f32> = w_scales.iter().map(|s| s * input_scale).collect();
        let qb: Vec<i32> = b
            .iter()
            .zip(&scales)
            .map(|(v, s)| (v / s).round() as i32)
            .collect();
        let q = self.constant(proto::i32_tensor(&format!("{name}.q"), &[channels], &qb));
        let s = self.constant(proto::f32_tensor(
            &format!("{name}.scale"),
            &[channels],
            &scales,
        ));
        let zp = if self.form == Form::Torch {
            let shape = self.constant(proto::i64_tensor(
                &format!("{name}.shape"),
                &[1],
                &[channels as i64],
            ));
            let zeros = self.b.node(
                "ConstantOfShape",
                &format!("{name}.zeros"),
                &[&shape],
                vec![],
            );
            self.b.node(
                "Cast",
                &format!("{name}.zp_cast"),
                &[&zeros],
                vec![proto::int_attr("to", 6)],
            )
        } else {
            self.push(proto::i32_tensor(
                &format!("{name}.zp"),
                &[channels],
                &vec![0; channels],
            ))
        };
        let dn = format!("{name}.dequantize");
        self.b.node(
            "DequantizeLinear",
            &dn,
            &[&q, &s, &zp],
            vec![proto::int_attr("axis", 0)],
        )
    }
}
