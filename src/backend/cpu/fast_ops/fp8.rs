//! FP8 E4M3 numerics on the CPU: [`RoundE4m3`] puts each value of a quantized activation on
//! the E4M3 grid of its scale (`round_e4m3(x / scale) * scale`), what a QuantizeLinear ->
//! DequantizeLinear pair to `float8e4m3fn` computes. The lowering (`lower::lower_fp8`) puts
//! one where the Q/DQ model has such a pair; tract then runs the float layers around it.

use rayon::prelude::*;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::*;
use tract_onnx::tract_core::ops::element_wise::{ElementWiseMiniOp, ElementWiseOp};

use super::{on_tract_pool, tract_is_parallel};
use crate::quant::fp8::round_e4m3;

/// The ONNX op type the lowering writes (quantscope's own; never in an exported model).
pub const OP_TYPE: &str = "QsRoundE4m3";

/// `x -> round_e4m3(x / scale) * scale` on f32 values, in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundE4m3 {
    /// The scale's f32 bits (tract's ops compare with `Eq`).
    scale_bits: u32,
}

impl RoundE4m3 {
    pub fn new(scale: f32) -> RoundE4m3 {
        RoundE4m3 {
            scale_bits: scale.to_bits(),
        }
    }
    fn scale(&self) -> f32 {
        f32::from_bits(self.scale_bits)
    }
    fn round(&self, v: &mut [f32]) {
        let s = self.scale();
        for x in v {
            // Division, not multiplication by 1/s: QuantizeLinear divides, and the two can
            // differ in the last bit, which moves a value across a rounding boundary.
            *x = round_e4m3(*x / s) * s;
        }
    }
}

impl ElementWiseMiniOp for RoundE4m3 {
    fn name(&self) -> String {
        "RoundE4m3".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("scale: {}", self.scale())])
    }

    fn eval_in_place(&self, t: &mut Tensor, _out_dt: Option<DatumType>) -> TractResult<()> {
        ensure!(t.datum_type() == f32::datum_type(), "RoundE4m3 takes f32");
        let mut ram = t.try_as_plain_ram_mut()?;
        let v = ram.as_slice_mut::<f32>()?;
        // Big tensors are split over the threads, as the FP16 rounding is.
        const CHUNK: usize = 1 << 15;
        if v.len() > 2 * CHUNK && tract_is_parallel() {
            on_tract_pool(|| v.par_chunks_mut(CHUNK).for_each(|c| self.round(c)));
        } else {
            self.round(v);
        }
        Ok(())
    }
}

/// Lets tract's ONNX parser read the lowering's [`OP_TYPE`] nodes (attribute `scale`).
pub fn register(onnx: &mut tract_onnx::Onnx) {
    use tract_onnx::tract_hir::internal::ElementWiseIntoHir;
    onnx.op_register.insert(OP_TYPE, |_ctx, node| {
        let scale = node
            .attribute
            .iter()
            .find(|a| a.name == "scale")
            .map(|a| a.f)
            .ok_or_else(|| anyhow::anyhow!("{OP_TYPE} node `{}` has no scale", node.name))?;
        let op = ElementWiseOp(Box::new(RoundE4m3::new(scale)), None);
        Ok((op.into_hir(), vec![]))
    });
}
