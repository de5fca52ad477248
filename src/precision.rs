//! `Precision` (FP32, FP16, INT8, FP8): the vocabulary shared by the low stages (quant's Q/DQ
//! formats) and the backends that build engines at a precision. It lives here, below both, so
//! that `quant` needs no backend to name one; `backend` re-exports it for its callers.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Fp16,
    Int8,
    /// FP8 E4M3 Q/DQ (Hopper and Ada GPUs): per-tensor activations, per-channel weights,
    /// scales amax / 448.
    Fp8,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Fp16,
        Precision::Int8,
        Precision::Fp8,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Int8 => "int8",
            Precision::Fp8 => "fp8",
        }
    }
    /// Built from a Q/DQ model (INT8, FP8), with calibrated scales.
    pub fn is_quantized(self) -> bool {
        matches!(self, Precision::Int8 | Precision::Fp8)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown precision `{s}` (expected fp32, fp16, int8 or fp8)"))
    }
}
