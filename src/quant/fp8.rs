//! FP8 E4M3 (ONNX `float8e4m3fn`, NVIDIA's E4M3): the codes, rounding to them, and scales.
//! One sign bit, four exponent bits (bias 7), three mantissa bits; no infinities; 0x7f / 0xff
//! are NaN; the largest finite value is 448, the smallest subnormal 2^-9. Conversion rounds to
//! nearest, ties to even, and saturates to ±448, as ONNX's QuantizeLinear (`saturate` = 1, its
//! default), CUDA's `__nv_cvt_float_to_fp8(.., __NV_SATFINITE, __NV_E4M3)` and TensorRT do.
//! The CUDA kernels (`f8_from_f32`/`f8_to_f32` in cuda/kernels/common.cuh) do the same arithmetic.

use crate::model::proto;

/// Largest finite E4M3 value: FP8 scales are amax / 448.
pub const E4M3_MAX: f32 = 448.0;

/// ONNX `TensorProto.DataType` of `float8e4m3fn` (IR version 9, opset 19).
pub const ONNX_FLOAT8E4M3FN: i32 = 17;

/// The E4M3 code nearest to `x` (ties to even), saturating to ±448; NaN stays NaN.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // f32's unbiased exponent of `a` (subnormal f32s read as -127: below E4M3's range).
    let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    // Below 2^-6 E4M3 is subnormal: steps of 2^-9, and the code is the step count. Above,
    // steps of 2^(e-3); the code is (e + 7) << 3 plus the mantissa, and a round-up to the
    // next power of two carries into the exponent by plain addition. Dividing by a power of
    // two is exact, so the only rounding is `round_ties_even`.
    let code = if e < -6 {
        (a * 512.0).round_ties_even() as i32
    } else {
        let q = (a * (2f32).powi(3 - e)).round_ties_even() as i32; // 8..=16
        ((e + 7) << 3) + q - 8
    };
    sign | code.min(0x7e) as u8
}

/// The value of an E4M3 code.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let mag = code & 0x7f;
    if mag == 0x7f {
        return f32::NAN;
    }
    let (e, m) = ((mag >> 3) as i32, (mag & 7) as f32);
    let v = if e == 0 {
        m * (2f32).powi(-9)
    } else {
        (8.0 + m) * (2f32).powi(e - 10)
    };
    if code & 0x80 != 0 { -v } else { v }
}

/// `x` rounded to the nearest E4M3 value (saturating): `e4m3_to_f32(e4m3_from_f32(x))`,
/// computed on f32's bits (the CPU's FP8 simulation runs it on every quantized activation).
/// Normal values keep 3 of f32's 23 mantissa bits, rounded to nearest even by adding half a
/// step (less one, plus the kept lowest bit) and truncating; a carry moves into the exponent,
/// as it should. Below 2^-6 the step is the subnormal 2^-9.
pub fn round_e4m3(x: f32) -> f32 {
    let a = x.abs();
    if a.is_nan() {
        return x;
    }
    let r = if a >= E4M3_MAX {
        E4M3_MAX
    } else if a < 0.015625 {
        (a * 512.0).round_ties_even() / 512.0
    } else {
        let b = a.to_bits();
        let r = f32::from_bits((b + 0x7_FFFF + ((b >> 20) & 1)) & !0xF_FFFF);
        // 464 and above round to 480, past the largest finite value: saturate.
        r.min(E4M3_MAX)
    };
    r.copysign(x)
}

/// Activation scale from amax: amax / 448 (a dead, all-zero tensor gets scale 1).
pub fn act_scale(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

/// Per-channel FP8 quantization of a weight along `axis`: scale = amax / 448 per channel.
/// Returns (E4M3 codes, scales).
pub fn quantize_weight(w: &proto::F32Tensor, axis: usize) -> (Vec<u8>, Vec<f32>) {
    let channels = w.dims.get(axis).copied().unwrap_or(1).max(1);
    let inner: usize = w.dims.iter().skip(axis + 1).product::<usize>().max(1);
    let channel_of = |i: usize| (i / inner) % channels;
    let mut amax = vec![0f32; channels];
    for (i, v) in w.data.iter().enumerate() {
        let c = channel_of(i);
        amax[c] = amax[c].max(v.abs());
    }
    let scales: Vec<f32> = amax.iter().map(|&a| act_scale(a)).collect();
    let codes = w
        .data
        .iter()
        .enumerate()
        .map(|(i, v)| e4m3_from_f32(v / scales[channel_of(i)]))
        .collect();
    (codes, scales)
}

/// An ONNX `float8e4m3fn` initializer holding `codes`.
pub fn f8_tensor(name: &str, dims: &[usize], codes: &[u8]) -> tract_onnx::pb::TensorProto {
    tract_onnx::pb::TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: ONNX_FLOAT8E4M3FN,
        raw_data: codes.to_vec(),
        ..Default::default()
    }
}

/// The codes of a `float8e4m3fn` initializer (raw bytes, or one code per `int32_data` entry
/// as ONNX also allows).
pub fn tensor_codes(t: &tract_onnx::pb::TensorProto) -> Option<Vec<u8>> {
    if t.data_type != ONNX_FLOAT8E4M3FN {
        return None;
    }
    if !t.raw_data.is_empty() {
        Some(t.raw_data.clone())
    } else {
        Some(t.int32_data.iter().map(|&v| v as u8).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_values_are_ordered() {
        let mut last = -1.0f32;
        for code in 0u8..0x7f {
            let v = e4m3_to_f32(code);
            assert_eq!(e4m3_from_f32(v), code, "code {code:#x} ({v})");
            assert_eq!(e4m3_from_f32(-v), code | 0x80, "code {code:#x} negated");
            assert!(v > last, "codes increase: {code:#x}");
            last = v;
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        // Between 1 (0x38) and 1.125 (0x39): the midpoint goes to the even code.
        assert_eq!(e4m3_from_f32(1.0625), 0x38);
        assert_eq!(e4m3_from_f32(1.0626), 0x39);
        // Between 1.125 (0x39) and 1.25 (0x3a): the midpoint goes up, to even 0x3a.
        assert_eq!(e4m3_from_f32(1.1875), 0x3a);
        // 15.5 lies between 15 and 16: ties to even rounds up into the next exponent.
        assert_eq!(round_e4m3(15.5), 16.0);
        assert_eq!(round_e4m3(1000.0), 448.0);
        assert_eq!(round_e4m3(-1e30), -448.0);
        assert_eq!(round_e4m3(f32::INFINITY), 448.0);
        assert_eq!(round_e4m3(460.0), 448.0);
        // Subnormals: steps of 2^-9; half a step rounds to 0 (even).
        assert_eq!(round_e4m3(2f32.powi(-10)), 0.0);
        assert_eq!(round_e4m3(3.0 * 2f32.powi(-10)), 2.0 * 2f32.powi(-9));
        assert_eq!(round_e4m3(1e-30), 0.0);
        assert!(round_e4m3(f32::NAN).is_nan());
        // Relative error at most 2^-4 for normal values.
        for i in 1..2000 {
            let x = 0.02 * i as f32 + 0.001;
            assert!((round_e4m3(x) - x).abs() <= x / 16.0 + 1e-7, "{x}");
        }
    }

    /// The bit-level rounding equals decoding the encoded code, on every f32 between codes
    /// (both sides of each midpoint) and on pseudo-random values across the range.
    #[test]
    fn fast_rounding_equals_the_code_round_trip() {
        let slow = |x: f32| e4m3_to_f32(e4m3_from_f32(x));
        let mut xs = vec![
            0.0f32,
            -0.0,
            448.0,
            464.0,
            463.99,
            480.0,
            1e-12,
            2f32.powi(-10),
        ];
        for c in 0u8..0x7f {
            let v = e4m3_to_f32(c);
            let next = e4m3_to_f32(c + 1);
            let mid = if c + 1 < 0x7f {
                (v + next) / 2.0
            } else {
                464.0
            };
            for m in [
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ] {
                xs.push(m);
            }
            xs.push(v);
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let e = (state % 40) as i32 - 20;
            let m = (state >> 20) as f32 / (1u64 << 44) as f32;
            xs.push(m * 2f32.powi(e));
        }
        for x in xs {
            for x in [x, -x] {
                let (f, s) = (round_e4m3(x), slow(x));
                assert!(
                    f == s && f.is_sign_negative() == s.is_sign_negative(),
                    "{x:e}: {f} vs {s}"
                );
            }
        }
        assert!(round_e4m3(f32::NAN).is_nan());
        assert_eq!(round_e4m3(f32::NEG_INFINITY), -448.0);
    }

    #[test]
    fn weights_quantize_per_channel_with_the_largest_at_448() {
        let w = proto::F32Tensor {
            dims: vec![2, 3],
            data: vec![1.0, -0.5, 0.25, 100.0, 3.0, -7.0],
        };
        let (codes, scales) = quantize_weight(&w, 0);
        assert_eq!(scales, vec![1.0 / 448.0, 100.0 / 448.0]);
        assert_eq!(e4m3_to_f32(codes[0]), 448.0);
        assert_eq!(e4m3_to_f32(codes[2]), 112.0);
        assert_eq!(e4m3_to_f32(codes[3]), 448.0);
        let back = e4m3_to_f32(codes[5]) * scales[1];
        assert!((back + 7.0).abs() < 7.0 / 16.0, "{back}");
    }
}
