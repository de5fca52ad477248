// quantscope CUDA backend: every non-library kernel, compiled once per process with NVRTC
// (C++17; the engine's unit test compiles it for compute_90 and compute_75 without a GPU).
// Tensors carry a dtype code (0 = f32, 1 = f16, 2 = i8 with a scale, 3 = i32, 4 = FP8 E4M3
// with a scale); kernels
// branch on it uniformly, so one kernel serves every precision. Where an operand may be a
// constant the host uploaded, dtype -1 means an f32 buffer (`ldc`). Argument structs
// (`ViewArgs`, `NaryArgs`, `PadArgs`) are mirrored field for field in engine.rs. Linear
// indices are 64-bit wherever a tensor may pass 2^31 elements.
#include <cuda_fp16.h>

typedef long long i64;
#define QS_INF __int_as_float(0x7f800000)

// Programmatic dependent launch (sm_90 on; the host launches every kernel of this file that
// way there, `Kernel::launch`). A kernel's blocks may then be scheduled while the kernel
// before it in the stream is still finishing: each block lets the next kernel start once
// every block of this one is running (`launch_dependents`), and waits for the previous
// kernel to complete, its writes visible (`griddepcontrol.wait`), before it reads an
// activation or writes anything. Only what no earlier kernel writes (weights, alphas,
// biases, index arithmetic) may come before the wait. Without the launch attribute (other
// GPUs, QUANTSCOPE_CUDA_PDL=off, library kernels between) both are no-ops.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_enter() {
  pdl_trigger();
  pdl_wait();
}

// FP8 E4M3 (ONNX float8e4m3fn) codes, bit for bit as quant::fp8 in Rust: round to nearest
// even, saturate to +-448 (ONNX's QuantizeLinear default, CUDA's __NV_SATFINITE), NaN kept.
// Below 2^-6 the code is the count of 2^-9 steps; above, (e + 7) << 3 plus the mantissa, and
// a round-up to the next power of two carries into the exponent by plain addition.
__device__ __forceinline__ unsigned char f8_from_f32(float x) {
  if (isnan(x)) return 0x7f;
  unsigned char sign = signbit(x) ? 0x80 : 0;
  float a = fabsf(x);
  if (a >= 448.f) return sign | 0x7e;
  int e = ((__float_as_int(a) >> 23) & 0xff) - 127;
  int code = e < -6 ? (int)rintf(a * 512.f) : ((e + 7) << 3) + (int)rintf(ldexpf(a, 3 - e)) - 8;
  return sign | (unsigned char)min(code, 0x7e);
}
// Decoding is one multiply: the code's exponent and mantissa bits, placed at f32's exponent
// and mantissa positions, read as 2^(e - 127) * (1 + m / 8), or as the f32 subnormal
// m / 8 * 2^-126 where e = 0; times 2^120 (exact) that is E4M3's 2^(e - 7) * (1 + m / 8), or
// its subnormal m * 2^-9. (The kernels keep f32 subnormals: no --use_fast_math.)
__device__ __forceinline__ float f8_to_f32(unsigned char c) {
  if ((c & 0x7f) == 0x7f) return __int_as_float(0x7fc00000);
  return __int_as_float(((c & 0x80) << 24) | ((c & 0x7f) << 20)) * 1.329227995784916e36f;
}

__device__ __forceinline__ float ld(const void* p, int t, i64 i, float scale) {
  switch (t) {
    case 0: return ((const float*)p)[i];
    case 1: return __half2float(((const __half*)p)[i]);
    case 2: return (float)((const signed char*)p)[i] * scale;
    case 4: return f8_to_f32(((const unsigned char*)p)[i]) * scale;
    default: return (float)((const int*)p)[i];
  }
}

// int8 code of v given the reciprocal `inv` of its scale: round half to even, saturate
// (QuantizeLinear). QuantizeLinear divides by the scale; an IEEE division is a multi-
// instruction sequence per element in kernels whose cost is mostly instructions, and
// v * (1 / scale) differs from it only where v / scale is within an ulp of a rounding
// boundary, well inside what the engine's FP16 arithmetic already moves.
__device__ __forceinline__ signed char q8(float v, float inv) {
  return (signed char)fminf(fmaxf(rintf(v * inv), -128.f), 127.f);
}

__device__ __forceinline__ void st(void* p, int t, i64 i, float v, float scale) {
  switch (t) {
    case 0: ((float*)p)[i] = v; break;
    case 1: ((__half*)p)[i] = __float2half_rn(v); break;
    case 2: ((signed char*)p)[i] = q8(v, __frcp_rn(scale)); break;
    case 4: ((unsigned char*)p)[i] = f8_from_f32(v * __frcp_rn(scale)); break;
    default: ((int*)p)[i] = (int)v; break;
  }
}

// Four consecutive elements as one 4-, 8- or 16-byte access (i a multiple of 4; the
// vectorized NHWC kernels need c % 4 == 0).
__device__ __forceinline__ float4 ld4(const void* p, int t, i64 i, float scale) {
  if (t == 2) {
    char4 q = *(const char4*)((const signed char*)p + i);
    return make_float4(q.x * scale, q.y * scale, q.z * scale, q.w * scale);
  }
  if (t == 1) {
    uint2 raw = *(const uint2*)((const __half*)p + i);
    float2 lo = __half22float2(*(const __half2*)&raw.x);
    float2 hi = __half22float2(*(const __half2*)&raw.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  if (t == 0) return *(const float4*)((const float*)p + i);
  if (t == 4) {
    uchar4 q = *(const uchar4*)((const unsigned char*)p + i);
    return make_float4(f8_to_f32(q.x) * scale, f8_to_f32(q.y) * scale, f8_to_f32(q.z) * scale,
                       f8_to_f32(q.w) * scale);
  }
  return make_float4(ld(p, t, i, scale), ld(p, t, i + 1, scale), ld(p, t, i + 2, scale),
                     ld(p, t, i + 3, scale));
}

__device__ __forceinline__ void st4(void* p, int t, i64 i, float4 v, float scale) {
  float inv = __frcp_rn(scale);
  if (t == 2) {
    char4 q = make_char4(q8(v.x, inv), q8(v.y, inv), q8(v.z, inv), q8(v.w, inv));
    *(char4*)((signed char*)p + i) = q;
  } else if (t == 1) {
    __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
    uint2 raw;
    raw.x = *(unsigned int*)&lo;
    raw.y = *(unsigned int*)&hi;
    *(uint2*)((__half*)p + i) = raw;
  } else if (t == 0) {
    *(float4*)((float*)p + i) = v;
  } else if (t == 4) {
    *(uchar4*)((unsigned char*)p + i) = make_uchar4(
        f8_from_f32(v.x * inv), f8_from_f32(v.y * inv), f8_from_f32(v.z * inv),
        f8_from_f32(v.w * inv));
  } else {
    st(p, t, i, v.x, scale);
    st(p, t, i + 1, v.y, scale);
    st(p, t, i + 2, v.z, scale);
    st(p, t, i + 3, v.w, scale);
  }
}

// Activation codes as `Act::code` gives them (host reference: `Act::apply` in plan.rs):
// 0 none, 1 relu, 2 clip(a, b), 3 sigmoid, 4 hardswish, 5 hardsigmoid(alpha a, beta b),
// 6 tanh, 7 erf, 8 gelu (erf form), 9 gelu (tanh form), 10 exp, 11 log, 12 sqrt,
// 13 reciprocal, 14 neg, 15 abs, 16 softplus, 17 leaky relu(a), 18 elu(a), 19 not,
// 20 floor, 21 ceil, 22 round (half to even), 23 sign, 24 silu, 25 sin, 26 cos,
// 27 selu(alpha a, gamma b), 28 softsign, 29 mish.
__device__ __forceinline__ float softplus_f(float v) { return v > 20.f ? v : log1pf(expf(v)); }
// The activations that conv epilogues do not fuse, out of line: inlined at every call site
// (four per output group, unrolled over rows in the tensor-core conv's epilogue) the whole
// switch made kernels hundreds of KB of code, past what the SM's instruction caches hold.
// conv_i8_mma was 432 KB of sm_90 code; at 84 KB (this, and the rarer load and store types
// out of line too) its smallest launches took 11 instead of 16 us on an H200.
__device__ __noinline__ float act_rare(float v, int act, float a, float b) {
  switch (act) {
    case 6: return tanhf(v);
    case 7: return erff(v);
    case 10: return expf(v);
    case 11: return logf(v);
    case 12: return sqrtf(v);
    case 13: return 1.f / v;
    case 14: return -v;
    case 15: return fabsf(v);
    case 16: return softplus_f(v);
    case 18: return v >= 0.f ? v : a * (expf(v) - 1.f);
    case 19: return v == 0.f ? 1.f : 0.f;
    case 20: return floorf(v);
    case 21: return ceilf(v);
    case 22: return rintf(v);
    case 23: return v > 0.f ? 1.f : (v < 0.f ? -1.f : 0.f);
    case 25: return sinf(v);
    case 26: return cosf(v);
    case 27: return b * (v > 0.f ? v : a * (expf(v) - 1.f));
    case 28: return v / (1.f + fabsf(v));
    case 29: return v * tanhf(softplus_f(v));
    default: return v;
  }
}
// Sigmoid and SiLU, which EfficientNet fuses into every conv's epilogue, use the fast exp
// and division intrinsics (a few ulp of f32, against an accurate expf and an IEEE division
// that are each a multi-instruction sequence); hard swish multiplies by 1/6.
__device__ __forceinline__ float act_f(float v, int act, float a, float b) {
  switch (act) {
    case 0: return v;
    case 1: return fmaxf(v, 0.f);
    case 2: return fminf(fmaxf(v, a), b);
    case 3: return __fdividef(1.f, 1.f + __expf(-v));
    case 4: return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) * (1.f / 6.f);
    case 5: return fminf(fmaxf(a * v + b, 0.f), 1.f);
    // GELU stays inline: it is the elementwise op of every transformer's MLP.
    case 8: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case 9: return 0.5f * v * (1.f + tanhf(0.7978846f * (v + 0.044715f * v * v * v)));
    case 17: return v >= 0.f ? v : a * v;
    case 24: return __fdividef(v, 1.f + __expf(-v));
    default: return act_rare(v, act, a, b);
  }
}

// A read that also takes f32 constant buffers (dtype < 0), as the host uploads constants.
__device__ __forceinline__ float ldc(const void* p, int t, i64 i, float scale) {
  return t < 0 ? ((const float*)p)[i] : ld(p, t, i, scale);
}

// Most dimensions of the strided kernels (`MAX_RANK` in plan.rs).
#define QS_MAX_RANK 8

// Block-wide reductions. comb: 0 sum, 1 max, 2 min, 3 product. blockDim.x must be a multiple
// of 32 (every launch uses whole warps); `sh` holds 32 floats. Every thread gets the result.
__device__ __forceinline__ float comb_f(int comb, float a, float b) {
  switch (comb) {
    case 1: return fmaxf(a, b);
    case 2: return fminf(a, b);
    case 3: return a * b;
    default: return a + b;
  }
}
__device__ __forceinline__ float comb_init(int comb) {
  return comb == 1 ? -QS_INF : comb == 2 ? QS_INF : comb == 3 ? 1.f : 0.f;
}
__device__ __forceinline__ float warp_reduce(float v, int comb) {
  for (int o = 16; o > 0; o >>= 1) v = comb_f(comb, v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float block_reduce(float v, int comb, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, comb);
  __syncthreads();  // `sh` may still be read from the previous call
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : comb_init(comb);
    v = warp_reduce(v, comb);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

// rem % d, leaving rem / d in rem: in 32-bit arithmetic where `small` says the index fits (a
// 64-bit division costs several 32-bit ones, and the strided kernels do one per dimension
// per element).
__device__ __forceinline__ i64 next_idx(i64& rem, i64 d, bool small) {
  if (small) {
    unsigned r = (unsigned)rem, dd = (unsigned)d;
    rem = r / dd;
    return r % dd;
  }
  i64 idx = rem % d;
  rem /= d;
  return idx;
}
#define QS_SMALL(n) ((n) <= 0xffffffffll)
// Each dim of a strided kernel's unravelling as a multiply-high and a shift (Granlund and
// Montgomery; `FastDiv` in engine.rs computes them, magic 0 for a dim of 1), exact for
// indices below 2^31. The generic copies spend much of their time on index arithmetic: on an
// H200 this took ResNet-50's batch-32 input layout copy (19 MB read) from 38 to 27 us.
struct FastDiv {
  unsigned magic[QS_MAX_RANK];
  unsigned shift[QS_MAX_RANK];
};
#define QS_FAST(n) ((n) <= 0x7fffffffll)
__device__ __forceinline__ i64 next_idx_fast(i64& rem, i64 d, bool fast, const FastDiv& f,
                                             int k) {
  if (fast) {
    unsigned r = (unsigned)rem;
    unsigned q = f.magic[k] ? __umulhi(r, f.magic[k]) >> f.shift[k] : r;
    rem = q;
    return r - q * (unsigned)d;
  }
  i64 idx = rem % d;
  rem /= d;
  return idx;
}
// Position of element i of an NHWC [n, oh, ow, c] tensor; with c the row length, also the
// (b, y, x) of row i / c of im2col's [n * oh * ow, c] matrix and the column within it.
struct Pos {
  int b, y, x;
  i64 c;
};
__device__ __forceinline__ Pos nhwc_pos(i64 i, int oh, int ow, i64 c) {
  Pos p;
  bool small = QS_SMALL(i);
  i64 t = i;
  p.c = next_idx(t, c, small);
  p.x = (int)next_idx(t, ow, small);
  p.y = (int)next_idx(t, oh, small);
  p.b = (int)t;
  return p;
}

// The int8 conv kernels' epilogue where the output is int8, the residual int8 or absent and
// the activation ReLU, clip, SiLU or none (the int8 layers of ResNets, MobileNets and
// EfficientNets): all in output steps (alpha, bias and the residual's scale times 1 / scale,
// once a thread), the activation's clip and int8 saturation one min / max pair, four codes
// packed into a word. The generic path (act_f, ld4, st4) spends several times the
// instructions, which are most of a memory-bound layer's.
//
// No conversion-unit instructions per element: on sm_90 the int8 <-> float conversions
// (I2F.S8, F2I) issue at a quarter of the FMA rate, and with eight an output word they were
// the tensor-core kernel's bottleneck on ResNet-50's memory-bound 1x1 layers (Nsight: the
// epilogue two thirds of the samples). A residual byte is sign-extended by one PRMT
// (`sext_byte`) and converted from int32 (I2FP, full rate); the rounding is an add of EPI_ROUND, after which the
// int8 code is the sum's low byte.
struct EpiI8 {
  float4 al, bi;
  float rsc, lo, hi, y_scale;
  bool silu;
};
// 1.5 * 2^23: a float of magnitude below 2^22 plus this has an ulp of 1, so the sum is the
// value rounded to an integer (to nearest even, as __float2int_rn), and that integer in two's
// complement is the low bits of the sum's bit pattern. Clamping the sum to the rounded bounds
// is clamping the value then rounding (rounding is monotone); larger values land past the
// bounds either way.
#define EPI_ROUND 12582912.f
__device__ __forceinline__ bool epi_i8_ok(int y_t, int res_t, int act) {
  return y_t == 2 && (res_t < 0 || res_t == 2) && (act <= 2 || act == 24);
}
// The epilogue constants of four channels whose alphas and biases are al and bi.
__device__ __forceinline__ EpiI8 epi_i8_of(float4 al, float4 bi, float res_scale,
                                           float y_scale, int act, float a0, float a1) {
  EpiI8 e;
  float inv = __frcp_rn(y_scale);
  e.al = make_float4(al.x * inv, al.y * inv, al.z * inv, al.w * inv);
  e.bi = make_float4(bi.x * inv, bi.y * inv, bi.z * inv, bi.w * inv);
  e.rsc = res_scale * inv;
  e.lo = (act == 1 ? 0.f : act == 2 ? fmaxf(a0 * inv, -128.f) : -128.f) + EPI_ROUND;
  e.hi = (act == 2 ? fminf(a1 * inv, 127.f) : 127.f) + EPI_ROUND;
  e.y_scale = y_scale;
  e.silu = act == 24;
  return e;
}
// Channels c .. c + 3.
__device__ __forceinline__ EpiI8 epi_i8(const float* alpha, const float* bias, int c,
                                        float res_scale, float y_scale, int act, float a0,
                                        float a1) {
  return epi_i8_of(*(const float4*)(alpha + c), *(const float4*)(bias + c), res_scale, y_scale,
                   act, a0, a1);
}
// Byte `k` of the word r sign-extended to int32 in one PRMT: a selector nibble with its high
// bit set replicates the selected byte's sign (PTX prmt; CUDA's __byte_perm masks that bit
// off, and two shifts were twice the integer instructions on the epilogue's busiest pipe).
__device__ __forceinline__ int sext_byte(unsigned r, int k) {
  int v;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(v) : "r"(r), "r"(0x8880 + 0x1111 * k));
  return v;
}
// Sum s and the residual byte at bit `sh` of the word r -> a word whose low byte is the
// output code. Without RES the residual is not read (the callers that may run without one and
// branch once outside their loop: a zero residual word still cost a PRMT, a conversion and an
// FFMA an element, a third of a residual-free layer's epilogue).
template <bool SILU, bool RES = true>
__device__ __forceinline__ unsigned epi_i8_one(const EpiI8& e, int s, float al, float bi,
                                               unsigned r, int sh) {
  float v = RES ? fmaf((float)s, al, fmaf((float)sext_byte(r, sh >> 3), e.rsc, bi))
                : fmaf((float)s, al, bi);
  if (SILU) v = __fdividef(v, 1.f + __expf(-v * e.y_scale));
  return __float_as_uint(fminf(fmaxf(v + EPI_ROUND, e.lo), e.hi));
}
template <bool SILU, bool RES = true>
__device__ __forceinline__ unsigned epi_i8_word_as(const EpiI8& e, int4 s, unsigned r) {
  unsigned q0 = epi_i8_one<SILU, RES>(e, s.x, e.al.x, e.bi.x, r, 0),
           q1 = epi_i8_one<SILU, RES>(e, s.y, e.al.y, e.bi.y, r, 8),
           q2 = epi_i8_one<SILU, RES>(e, s.z, e.al.z, e.bi.z, r, 16),
           q3 = epi_i8_one<SILU, RES>(e, s.w, e.al.w, e.bi.w, r, 24);
  return __byte_perm(__byte_perm(q0, q1, 0x0040), __byte_perm(q2, q3, 0x0040), 0x5410);
}
// Four int32 sums of channels c .. c + 3 and their residual codes (a word, zero if none) ->
// the output word. One branch a word on the activation: a test a channel was 4 of the 50
// instructions of conv_i8_mma's epilogue word (sm_90 SASS), the compiler not hoisting it.
__device__ __forceinline__ unsigned epi_i8_word(const EpiI8& e, int4 s, unsigned r) {
  return e.silu ? epi_i8_word_as<true>(e, s, r) : epi_i8_word_as<false>(e, s, r);
}

// Conv epilogue over an NHWC output [M, C]: raw is [M, raw_ld].
// out = act(raw * alpha[c] + bias[c] + res) stored as out_t. With `vec4` (c and raw_ld
// multiples of 4) each thread does four channels of a row with vector loads and stores; the
// row is a 32-bit division where the index fits. (One element a thread with a 64-bit division
// made this pass more than twice as slow as a SiLU pass over the same bytes on an H200.)
extern "C" __global__ void epilogue(const void* raw, int raw_t, i64 raw_ld, const float* alpha,
                                    const float* bias, const void* res, int res_t, float res_scale,
                                    void* out, int out_t, float out_scale, i64 m, i64 c, int act,
                                    float a0, float a1, int vec4) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 e = vec4 ? i * 4 : i;
  if (e >= m * c) return;
  i64 r = QS_SMALL(e) ? (i64)((unsigned)e / (unsigned)c) : e / c, ch = e - r * c;
  i64 at = r * raw_ld + ch;
  if (!vec4) {
    float v = ld(raw, raw_t, at, 1.f) * alpha[ch] + bias[ch];
    if (res_t >= 0) v += ld(res, res_t, e, res_scale);
    st(out, out_t, e, act_f(v, act, a0, a1), out_scale);
    return;
  }
  float4 v = ld4(raw, raw_t, at, 1.f);
  float4 al = *(const float4*)(alpha + ch), bi = *(const float4*)(bias + ch);
  float4 rs = res_t >= 0 ? ld4(res, res_t, e, res_scale) : make_float4(0.f, 0.f, 0.f, 0.f);
  v = make_float4(act_f(v.x * al.x + bi.x + rs.x, act, a0, a1),
                  act_f(v.y * al.y + bi.y + rs.y, act, a0, a1),
                  act_f(v.z * al.z + bi.z + rs.z, act, a0, a1),
                  act_f(v.w * al.w + bi.w + rs.w, act, a0, a1));
  st4(out, out_t, e, v, out_scale);
}

// Direct convolution, NHWC, weights [Cout, KH, KW, Cin/g] as f32 (float inputs) or i8 (i8
// inputs, exact integer accumulation), with the epilogue fused. One thread per output.
extern "C" __global__ void conv_direct(const void* x, int x_t, float x_scale, const void* w,
                                       const float* alpha, const float* bias, const void* res,
                                       int res_t, float res_scale, void* y, int y_t, float y_scale,
                                       int n, int h, int wd, int cin, int oh, int ow, int cout,
                                       int kh, int kw, int sh, int sw, int ph, int pw, int dh,
                                       int dw, int groups, int act, float a0, float a1) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * cout;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, cout);
  int co = p.c, ox = p.x, oy = p.y, b = p.b;
  int cpg = cin / groups, opg = cout / groups, g = co / opg;
  float accf = 0.f;
  int acci = 0;
  for (int ky = 0; ky < kh; ky++) {
    int iy = oy * sh - ph + ky * dh;
    if (iy < 0 || iy >= h) continue;
    for (int kx = 0; kx < kw; kx++) {
      int ix = ox * sw - pw + kx * dw;
      if (ix < 0 || ix >= wd) continue;
      i64 xb = (((i64)b * h + iy) * wd + ix) * cin + g * cpg;
      i64 wb = (((i64)co * kh + ky) * kw + kx) * cpg;
      if (x_t == 2) {
        const signed char* xp = (const signed char*)x + xb;
        const signed char* wp = (const signed char*)w + wb;
        for (int ci = 0; ci < cpg; ci++) acci += (int)xp[ci] * (int)wp[ci];
      } else {
        const float* wp = (const float*)w + wb;
        for (int ci = 0; ci < cpg; ci++) accf += ld(x, x_t, xb + ci, 1.f) * wp[ci];
      }
    }
  }
  float v = x_t == 2 ? (float)acci : accf;
  v = v * alpha[co] + bias[co];
  if (res_t >= 0) v += ld(res, res_t, i, res_scale);
  v = act_f(v, act, a0, a1);
  st(y, y_t, i, v, y_scale);
}

// Depthwise convolution (groups = channels, one output per channel), NHWC: each thread
// computes four channels (one 4-, 8- or 16-byte vector per read and write) of DW_PX adjacent
// outputs along x, so each tap's weights are read once for DW_PX outputs. int8 input with i8
// weights [ceil(KH * KW / 4), C, 4] (exact int32 sums through __dp4a, fewer instructions than
// widening each byte: DeepLab's 17 int8 depthwise layers went from 0.52 to 0.49 ms at batch 8
// on an H100), or f16 / f32 input with f32 weights [KH * KW, C]
// (tap-major: a warp's weight reads are contiguous). The epilogue is conv_direct's. c % 4 == 0,
// and the host keeps input and output under 2^31 elements, so indices are 32-bit (conv_direct's
// 64-bit divisions per output cost more than the arithmetic of a 3x3 depthwise tap).
#define DW_PX 4
// The depthwise kernels' epilogue over a thread's exact int32 sums (int8 input) of `np`
// outputs along x, DW_PX at most, the first at element offset o0 of y (channels ch .. ch + 3):
// the int8 epilogue where it applies, else conv_direct's (any output type, activation and
// residual; EfficientNets' depthwise outputs feed a squeeze-excite pool in float).
__device__ __forceinline__ void dw_epilogue_i32(const int acc[DW_PX][4], int np, int o0, int c,
                                                int ch, const float* alpha, const float* bias,
                                                const void* res, int res_t, float res_scale,
                                                void* y, int y_t, float y_scale, int act,
                                                float a0, float a1) {
  if (epi_i8_ok(y_t, res_t, act)) {
    const EpiI8 e = epi_i8(alpha, bias, ch, res_scale, y_scale, act, a0, a1);
#pragma unroll
    for (int p = 0; p < DW_PX; p++) {
      if (p >= np) break;
      int o = o0 + p * c;
      unsigned r = res_t == 2 ? *(const unsigned*)((const signed char*)res + o) : 0u;
      *(unsigned*)((signed char*)y + o) =
          epi_i8_word(e, make_int4(acc[p][0], acc[p][1], acc[p][2], acc[p][3]), r);
    }
    return;
  }
  float4 al = *(const float4*)(alpha + ch), bi = *(const float4*)(bias + ch);
  float av[4] = {al.x, al.y, al.z, al.w}, bv[4] = {bi.x, bi.y, bi.z, bi.w};
#pragma unroll
  for (int p = 0; p < DW_PX; p++) {
    if (p >= np) break;
    int o = o0 + p * c;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float s = (float)acc[p][j] * av[j] + bv[j];
      if (res_t >= 0) s += ld(res, res_t, o + j, res_scale);
      v[j] = act_f(s, act, a0, a1);
    }
    st4(y, y_t, o, make_float4(v[0], v[1], v[2], v[3]), y_scale);
  }
}
// A depthwise thread's outputs: image b, output row oy, the DW_PX columns from ox0, channels
// ch .. ch + 3 (consecutive threads take consecutive channel groups); false past the last.
__device__ __forceinline__ bool dw_place(int n, int oh, int ow, int c, int& b, int& oy,
                                         int& ox0, int& ch) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int c4 = c >> 2, owp = (ow + DW_PX - 1) / DW_PX;
  if (i >= n * oh * owp * c4) return false;
  ch = (i % c4) * 4;
  int t = i / c4;
  ox0 = (t % owp) * DW_PX;
  t /= owp;
  oy = t % oh;
  b = t / oh;
  return true;
}
extern "C" __global__ void conv_dw4(const void* x, int x_t, const void* w, const float* alpha,
                                    const float* bias, const void* res, int res_t,
                                    float res_scale, void* y, int y_t, float y_scale, int n,
                                    int h, int wd, int c, int oh, int ow, int kh, int kw, int sh,
                                    int sw, int ph, int pw, int dh, int dw, int act, float a0,
                                    float a1) {
  pdl_enter();
  int b, oy, ox0, ch;
  if (!dw_place(n, oh, ow, c, b, oy, ox0, ch)) return;
  float acc[DW_PX][4] = {};
  int acci[DW_PX][4] = {};
  if (x_t == 2) {
    // int8: taps in groups of four, one __dp4a per channel and group. The four loaded words
    // (one per tap, four channels each) are transposed with byte permutes into one word per
    // channel (four taps each); weights come as [tap group][C][4] (zeros past the last tap).
    int taps = kh * kw;
    for (int t0 = 0; t0 < taps; t0 += 4) {
      int4 wq = *(const int4*)((const signed char*)w + ((t0 >> 2) * c + ch) * 4);
      int xw[4][DW_PX];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        int t = t0 + j, ky = t / kw, kx = t - ky * kw;
        int iy = oy * sh - ph + ky * dh;
        bool row_ok = t < taps && iy >= 0 && iy < h;
        int row = (b * h + iy) * wd;
#pragma unroll
        for (int p = 0; p < DW_PX; p++) {
          int ix = (ox0 + p) * sw - pw + kx * dw;
          bool ok = row_ok && ox0 + p < ow && ix >= 0 && ix < wd;
          xw[j][p] = ok ? *(const int*)((const signed char*)x + (row + ix) * c + ch) : 0;
        }
      }
#pragma unroll
      for (int p = 0; p < DW_PX; p++) {
        unsigned a = __byte_perm(xw[0][p], xw[1][p], 0x5140);
        unsigned bb = __byte_perm(xw[0][p], xw[1][p], 0x7362);
        unsigned cc = __byte_perm(xw[2][p], xw[3][p], 0x5140);
        unsigned d = __byte_perm(xw[2][p], xw[3][p], 0x7362);
        acci[p][0] = __dp4a((int)__byte_perm(a, cc, 0x5410), wq.x, acci[p][0]);
        acci[p][1] = __dp4a((int)__byte_perm(a, cc, 0x7632), wq.y, acci[p][1]);
        acci[p][2] = __dp4a((int)__byte_perm(bb, d, 0x5410), wq.z, acci[p][2]);
        acci[p][3] = __dp4a((int)__byte_perm(bb, d, 0x7632), wq.w, acci[p][3]);
      }
    }
  } else {
    for (int ky = 0; ky < kh; ky++) {
      int iy = oy * sh - ph + ky * dh;
      if (iy < 0 || iy >= h) continue;
      int row = (b * h + iy) * wd;
      for (int kx = 0; kx < kw; kx++) {
        float4 wv = *(const float4*)((const float*)w + (ky * kw + kx) * c + ch);
#pragma unroll
        for (int p = 0; p < DW_PX; p++) {
          int ix = (ox0 + p) * sw - pw + kx * dw;
          if (ox0 + p >= ow || ix < 0 || ix >= wd) continue;
          float4 xv = ld4(x, x_t, (row + ix) * c + ch, 1.f);
          acc[p][0] += xv.x * wv.x;
          acc[p][1] += xv.y * wv.y;
          acc[p][2] += xv.z * wv.z;
          acc[p][3] += xv.w * wv.w;
        }
      }
    }
  }
  int o0 = ((b * oh + oy) * ow + ox0) * c + ch;
  if (x_t == 2) {
    dw_epilogue_i32(acci, min(DW_PX, ow - ox0), o0, c, ch, alpha, bias, res, res_t, res_scale, y,
                    y_t, y_scale, act, a0, a1);
    return;
  }
  float4 al = *(const float4*)(alpha + ch), bi = *(const float4*)(bias + ch);
  float av[4] = {al.x, al.y, al.z, al.w}, bv[4] = {bi.x, bi.y, bi.z, bi.w};
#pragma unroll
  for (int p = 0; p < DW_PX; p++) {
    if (ox0 + p >= ow) break;
    int o = o0 + p * c;
    float v[4];
    for (int j = 0; j < 4; j++) {
      float s = acc[p][j] * av[j] + bv[j];
      if (res_t >= 0) s += ld(res, res_t, o + j, res_scale);
      v[j] = act_f(s, act, a0, a1);
    }
    st4(y, y_t, o, make_float4(v[0], v[1], v[2], v[3]), y_scale);
  }
}

// Int8 depthwise convolution (conv_dw4's epilogue, any output type) a row of taps at a
// time: square KW x KW kernels, stride S both ways, dilation 1. A thread computes four channels
// of DW_PX adjacent outputs along x as conv_dw4 does, but loads each input row's NCOL words
// (four channels each) once and transposes them, four columns at a time, into one word per
// channel; an output's taps in that row are then byte windows of those words (a funnel shift)
// for __dp4a against weights [KW rows][ceil(KW / 4) groups][C][4] (zeros past the row's last
// tap, where the windows read past the row). For 3x3 stride 1 a thread makes 18 loads (6 a
// row) where conv_dw4 makes 36 (each of four outputs' nine taps). Entry points per (KW, S)
// keep each instance's registers its own. 32-bit indices (the host keeps tensors under 2^31
// elements).
template <int KW, int S>
__device__ __forceinline__ void conv_dw_i8_body(const signed char* x, const int* w,
                                                const float* alpha, const float* bias,
                                                const void* res, int res_t, float res_scale,
                                                void* y, int y_t, float y_scale, int n, int h,
                                                int wd, int c, int oh, int ow, int ph, int pw,
                                                int act, float a0, float a1) {
  pdl_enter();
  constexpr int TG = (KW + 3) / 4;
  constexpr int NCOL = (DW_PX - 1) * S + KW;
  // Words a channel's columns take, covering the last window's last byte.
  constexpr int NW = ((DW_PX - 1) * S + 4 * TG + 3) / 4;
  int b, oy, ox0, ch;
  if (!dw_place(n, oh, ow, c, b, oy, ox0, ch)) return;
  int ix0 = ox0 * S - pw;
  bool inside = ix0 >= 0 && ix0 + NCOL <= wd;
  int acc[DW_PX][4] = {};
#pragma unroll
  for (int ky = 0; ky < KW; ky++) {
    int iy = oy * S - ph + ky;
    if (iy < 0 || iy >= h) continue;
    const signed char* row = x + ((b * h + iy) * wd + ix0) * c + ch;
    unsigned col[NW * 4];
#pragma unroll
    for (int k = 0; k < NW * 4; k++) {
      bool ok = k < NCOL && (inside || (ix0 + k >= 0 && ix0 + k < wd));
      col[k] = ok ? *(const unsigned*)(row + k * c) : 0u;
    }
    unsigned tr[NW][4];
#pragma unroll
    for (int g = 0; g < NW; g++) {
      unsigned a = __byte_perm(col[4 * g], col[4 * g + 1], 0x5140);
      unsigned bb = __byte_perm(col[4 * g], col[4 * g + 1], 0x7362);
      unsigned cc = __byte_perm(col[4 * g + 2], col[4 * g + 3], 0x5140);
      unsigned d = __byte_perm(col[4 * g + 2], col[4 * g + 3], 0x7362);
      tr[g][0] = __byte_perm(a, cc, 0x5410);
      tr[g][1] = __byte_perm(a, cc, 0x7632);
      tr[g][2] = __byte_perm(bb, d, 0x5410);
      tr[g][3] = __byte_perm(bb, d, 0x7632);
    }
#pragma unroll
    for (int tg = 0; tg < TG; tg++) {
      int4 wq = *(const int4*)(w + (ky * TG + tg) * c + ch);
      int wv[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
      for (int p = 0; p < DW_PX; p++) {
        const int o = p * S + 4 * tg, g = o >> 2, sh = 8 * (o & 3);
#pragma unroll
        for (int j = 0; j < 4; j++) {
          unsigned win = sh == 0 ? tr[g][j] : __funnelshift_r(tr[g][j], tr[g + 1][j], sh);
          acc[p][j] = __dp4a((int)win, wv[j], acc[p][j]);
        }
      }
    }
  }
  dw_epilogue_i32(acc, min(DW_PX, ow - ox0), ((b * oh + oy) * ow + ox0) * c + ch, c, ch, alpha,
                  bias, res, res_t, res_scale, y, y_t, y_scale, act, a0, a1);
}
#define DW_I8_PARAMS                                                                          \
  const signed char *x, const int *w, const float *alpha, const float *bias, const void *res, \
      int res_t, float res_scale, void *y, int y_t, float y_scale, int n, int h, int wd, int c, \
      int oh, int ow, int ph, int pw, int act, float a0, float a1
#define DW_I8_ARGS                                                                             \
  x, w, alpha, bias, res, res_t, res_scale, y, y_t, y_scale, n, h, wd, c, oh, ow, ph, pw, act, \
      a0, a1
extern "C" __global__ void conv_dw_i8_k3s1(DW_I8_PARAMS) { conv_dw_i8_body<3, 1>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k3s2(DW_I8_PARAMS) { conv_dw_i8_body<3, 2>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k5s1(DW_I8_PARAMS) { conv_dw_i8_body<5, 1>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k5s2(DW_I8_PARAMS) { conv_dw_i8_body<5, 2>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k7s1(DW_I8_PARAMS) { conv_dw_i8_body<7, 1>(DW_I8_ARGS); }

// Pointwise (1x1, stride 1) int8 convolution, and Gemm / MatMul as one, on __dp4a: x int8
// [m, k] (NHWC pixels or rows), weights as 32-bit words [k / 4, cout] (word v * cout + c holds
// w[c][4v .. 4v + 4], the layout conv_pw_i8_word reads), exact int32 sums, then conv_direct's
// epilogue. Each thread computes PW_CO output channels of one pixel; grid
// (ceil(m / blockDim.x), ceil(cout / PW_CO)); the block's PW_CO weight rows sit in shared
// memory (PW_CO * k bytes, dynamic, zero past cout), read as warp-wide broadcasts.
// For some memory-bound 1x1 layers of MobileNets at high resolution (k and cout of 16 to
// 144) cuBLASLt's int8 GEMMs took twice FP16's time on an H200 (a tile of 16 or 24 output
// channels wastes most of an int8 tensor-core tile, and an unfused epilogue costs a pass);
// the builder times this kernel against them. (Staging whole tiles of pixels in shared
// memory for line-wide loads and stores timed slower on an H200.)
// k % 4 == 0 (16-byte reads where k % 16 == 0), cout % 4 == 0, m * k and m * cout < 2^31.
#define PW_CO 16
extern "C" __global__ void conv_pw_i8(const signed char* x, const int* w, const float* alpha,
                                      const float* bias, const void* res, int res_t,
                                      float res_scale, void* y, int y_t, float y_scale, int m,
                                      int k, int cout, int act, float a0, float a1) {
  pdl_enter();
  extern __shared__ int sw[];
  int kw4 = k >> 2, co0 = blockIdx.y * PW_CO;
  for (int j = threadIdx.x; j < PW_CO * kw4; j += blockDim.x) {
    int o = j / kw4, v = j - o * kw4;
    sw[j] = co0 + o < cout ? w[(i64)v * cout + co0 + o] : 0;
  }
  __syncthreads();
  int px = blockIdx.x * blockDim.x + threadIdx.x;
  if (px >= m) return;
  int acc[PW_CO];
#pragma unroll
  for (int o = 0; o < PW_CO; o++) acc[o] = 0;
  if ((k & 15) == 0) {
    const int4* xr = (const int4*)(x + px * k);
    for (int v = 0; v < (k >> 4); v++) {
      int4 a = xr[v];
#pragma unroll
      for (int o = 0; o < PW_CO; o++) {
        int4 b = ((const int4*)sw)[o * (k >> 4) + v];
        acc[o] = __dp4a(a.x, b.x, acc[o]);
        acc[o] = __dp4a(a.y, b.y, acc[o]);
        acc[o] = __dp4a(a.z, b.z, acc[o]);
        acc[o] = __dp4a(a.w, b.w, acc[o]);
      }
    }
  } else {
    const int* xr = (const int*)(x + px * k);
    for (int v = 0; v < kw4; v++) {
      int a = xr[v];
#pragma unroll
      for (int o = 0; o < PW_CO; o++) acc[o] = __dp4a(a, sw[o * kw4 + v], acc[o]);
    }
  }
  if (epi_i8_ok(y_t, res_t, act)) {
#pragma unroll
    for (int o = 0; o < PW_CO; o += 4) {
      int c = co0 + o;
      if (c >= cout) break;
      i64 at = (i64)px * cout + c;
      unsigned r = res_t == 2 ? *(const unsigned*)((const signed char*)res + at) : 0u;
      *(unsigned*)((signed char*)y + at) =
          epi_i8_word(epi_i8(alpha, bias, c, res_scale, y_scale, act, a0, a1),
                      make_int4(acc[o], acc[o + 1], acc[o + 2], acc[o + 3]), r);
    }
    return;
  }
#pragma unroll
  for (int o = 0; o < PW_CO; o += 4) {
    int c = co0 + o;
    if (c >= cout) break;
    i64 at = (i64)px * cout + c;
    float4 al = *(const float4*)(alpha + c), bi = *(const float4*)(bias + c);
    float4 r = res_t >= 0 ? ld4(res, res_t, at, res_scale) : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v = make_float4(act_f(acc[o] * al.x + bi.x + r.x, act, a0, a1),
                           act_f(acc[o + 1] * al.y + bi.y + r.y, act, a0, a1),
                           act_f(acc[o + 2] * al.z + bi.z + r.z, act, a0, a1),
                           act_f(acc[o + 3] * al.w + bi.w + r.w, act, a0, a1));
    st4(y, y_t, at, v, y_scale);
  }
}

// Pointwise int8 convolution as conv_pw_i8 computes it (same weights, same epilogue), one
// thread per four output channels of one pixel, that is one 32-bit word of an int8 output:
// consecutive threads write consecutive words. In an expansion layer (k of 16 to 40 in, four
// to six times as many channels out, at high resolution: MobileNetV2's and EfficientNet's)
// the output is most of the traffic, and conv_pw_i8's thread per pixel stores it a word at a
// time cout bytes apart. Each thread reads its four weight rows as one int4 per input word
// (through L1: a layer's weights are a few KB) and its pixel's input words, which the
// threads sharing the pixel get in one broadcast. k % 4 == 0 (16-byte input reads where
// k % 16 == 0), cout % 4 == 0, m * cout < 2^31; (magic, shift) divide by cout / 4 as
// FastDiv does (magic 0: by 1).
extern "C" __global__ void conv_pw_i8_word(const signed char* x, const int* w,
                                           const float* alpha, const float* bias,
                                           const void* res, int res_t, float res_scale, void* y,
                                           int y_t, float y_scale, int m, int k, int cout,
                                           int act, float a0, float a1, unsigned magic,
                                           unsigned shift) {
  pdl_enter();
  int cg = cout >> 2;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * cg) return;
  int px = magic ? __umulhi((unsigned)i, magic) >> shift : i, g = i - px * cg;
  const int4* wr = (const int4*)w + g;
  int a0c = 0, a1c = 0, a2c = 0, a3c = 0;
#define PW_WORD(a, v)                         \
  {                                           \
    int4 b = __ldg(wr + (v) * cg);            \
    a0c = __dp4a(a, b.x, a0c);                \
    a1c = __dp4a(a, b.y, a1c);                \
    a2c = __dp4a(a, b.z, a2c);                \
    a3c = __dp4a(a, b.w, a3c);                \
  }
  if ((k & 15) == 0) {
    const int4* xr = (const int4*)(x + (i64)px * k);
#pragma unroll 2
    for (int v = 0; v < (k >> 4); v++) {
      int4 a = __ldg(xr + v);
      PW_WORD(a.x, 4 * v)
      PW_WORD(a.y, 4 * v + 1)
      PW_WORD(a.z, 4 * v + 2)
      PW_WORD(a.w, 4 * v + 3)
    }
  } else {
    const int* xr = (const int*)(x + (i64)px * k);
#pragma unroll 4
    for (int v = 0; v < (k >> 2); v++) {
      int a = __ldg(xr + v);
      PW_WORD(a, v)
    }
  }
#undef PW_WORD
  int c = 4 * g;
  i64 at = (i64)i * 4;
  if (epi_i8_ok(y_t, res_t, act)) {
    unsigned r = res_t == 2 ? *(const unsigned*)((const signed char*)res + at) : 0u;
    *(unsigned*)((signed char*)y + at) = epi_i8_word(
        epi_i8(alpha, bias, c, res_scale, y_scale, act, a0, a1), make_int4(a0c, a1c, a2c, a3c), r);
    return;
  }
  float4 al = *(const float4*)(alpha + c), bi = *(const float4*)(bias + c);
  float4 r = res_t >= 0 ? ld4(res, res_t, at, res_scale) : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 v = make_float4(act_f(a0c * al.x + bi.x + r.x, act, a0, a1),
                         act_f(a1c * al.y + bi.y + r.y, act, a0, a1),
                         act_f(a2c * al.z + bi.z + r.z, act, a0, a1),
                         act_f(a3c * al.w + bi.w + r.w, act, a0, a1));
  st4(y, y_t, at, v, y_scale);
}

// Int8 convolution (groups 1, any kernel, stride, padding and dilation), and Gemm / MatMul
// as a 1x1 one, as an implicit GEMM on the int8 tensor cores: mma.sync m16n8k32 (exact
// int32 sums, as __dp4a's), then the pointwise kernels' epilogue. x int8 NHWC [n, h, wd,
// cin] (or rows [m, cin]); weights int8 OHWI rows [cout rounded up to MMA_BN][kpad = kh * kw * cin rounded
// up to MMA_BK], zero past the reduction and cout. A block computes BM output pixels (MMA_BM,
// or half that in conv_i8_mma64) by MMA_BN channels, its four warps BM / 2 x 32 each. The x
// and weight tiles go through shared
// memory in MMA_STAGES cp.async stages of MMA_BK bytes of the reduction, each 16-byte piece
// of an x row one tap's channels (cin % 16 == 0), zero-filled outside the input; rows are
// padded to MMA_LD bytes so that each 8-row phase of ldmatrix hits distinct banks. The sums
// are staged in shared memory again so that the epilogue reads the residual and writes the
// output four channels a thread, 16 threads a row. On an H200, ResNet-50's memory-bound 1x1
// layers at batch 32 (k 64 to 128, the residual and ReLU fused) took cuBLASLt's int8 GEMM
// with its own epilogue longer than its FP16 GEMM with twice the bytes, and the __dp4a
// kernels longer still; this kernel takes 34 us where cuBLASLt takes 59 on layer1's
// 64 -> 256 expansions (27 on conv_i8_mmas, below, which streams pixel tiles), and 69 us where
// cuDNN's int8 graph took 122 on the regrouped stem.
// cuDNN's int8 graph convs stay about twice as fast on the 3x3 layers and most reductions
// (the builder times them all). cout % 4 == 0; grid (cout_pad / MMA_BN, ceil(m / BM)),
// MMA_THREADS threads, so the blocks sharing a tile of x run together. Needs sm_80 (cp.async,
// the int8 m16n8k32 shape); the host offers it from there.
//
// Shared memory is dynamic (mma_smem_bytes on the host): the stages, then the block's 64
// alphas and biases, then (where the launch gives it room) its BM x 64 tile of an int8
// residual. Those two are copied with the first stage, so the epilogue reads them from
// shared memory. Read from global memory after the main loop, their latency came once a
// block for alpha and bias and once every MMA_EPI_ROWS rows for the residual, after all of
// the block's tensor-core work: a 1x1 layer of reduction 64 has one stage of it. ResNet-50's
// layer1 expansions at batch 32 on an H200 issued 2 instructions a cycle an SM and used a
// quarter of the DRAM bandwidth (Nsight Compute), a third of their warps' stalls waiting on
// those loads; they went from 38 to 34 us.
#define MMA_BM 128
#define MMA_BN 64
#define MMA_BK 64
#define MMA_LD (MMA_BK + 16)
#define MMA_STAGES 3
#define MMA_THREADS 128
#define MMA_OUT_LD (MMA_BN + 8)
#define MMA_EPI_ROWS 8
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool full) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(full ? 16 : 0));
}
__device__ __forceinline__ void ldsm_x4(unsigned r[4], const void* p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void mma_s8(int d[4], const unsigned a[4], const unsigned b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// A block's MMA_BN alphas and biases from channel n0 into shared memory (the first 32 threads
// a 16-byte copy each; channels past cout, a multiple of 4, zero-filled by a copy of 0 bytes
// from the array's start).
__device__ __forceinline__ void copy_alpha_bias(float* s_al, float* s_bi, const float* alpha,
                                                const float* bias, int n0, int cout) {
  const int tid = threadIdx.x;
  if (tid < 2 * MMA_BN / 4) {
    const int q = tid & (MMA_BN / 4 - 1), cc = n0 + 4 * q;
    const float* src = tid < MMA_BN / 4 ? alpha : bias;
    cp_async16((tid < MMA_BN / 4 ? s_al : s_bi) + 4 * q, src + (cc < cout ? cc : 0), cc < cout);
  }
}
// A warp's MI 16-row fragments by four 8-column tiles of int32 sums, zeroed.
template <int MI>
__device__ __forceinline__ void zero_acc(int (&acc)[MI][4][4]) {
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0;
}
// One 32-byte step of the reduction for a warp's MI 16-row fragments by 32 columns (four
// 8-column tiles): the A rows at sa, lda bytes apart, and the B rows (the output channels) at
// sb, ldb bytes apart, both already at the step's offset, through ldmatrix into m16n8k32.
template <int MI>
__device__ __forceinline__ void mma_k32(int (&acc)[MI][4][4], const unsigned char* sa, int lda,
                                        const unsigned char* sb, int ldb, int lane) {
  unsigned af[MI][4], bf[4][2];
#pragma unroll
  for (int i = 0; i < MI; i++)
    ldsm_x4(af[i], sa + (i * 16 + (lane & 15)) * lda + (lane >> 4) * 16);
#pragma unroll
  for (int j = 0; j < 2; j++) {
    unsigned r[4];
    ldsm_x4(r, sb + (j * 16 + ((lane >> 4) << 3) + (lane & 7)) * ldb + ((lane >> 3) & 1) * 16);
    bf[2 * j][0] = r[0];
    bf[2 * j][1] = r[1];
    bf[2 * j + 1][0] = r[2];
    bf[2 * j + 1][1] = r[3];
  }
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) mma_s8(acc[i][j], af[i], bf[j]);
}
#endif
// The tensor-core kernels' epilogue: the block's int32 sums, staged in shared memory `so`
// (MMA_OUT_LD a row) for `rows` output pixels from m0 by MMA_BN channels from n0, with the
// alphas and biases (and, with `res_smem`, the int8 residual tile) the block copied into
// shared memory, to the output.
#define MMA_EPI_PARAMS                                                                       \
  const void *res, int res_t, float res_scale, void *y, int y_t, float y_scale, int cout,   \
      int act, float a0, float a1
#define MMA_EPI_ARGS res, res_t, res_scale, y, y_t, y_scale, cout, act, a0, a1
// The int8 epilogue's rows (below): this thread's words of channels cl .. cl + 3 in rows r0,
// r0 + row_step, ..., yp and rp (with RES) at row r0, step bytes a row_step rows.
template <bool SILU, bool RES>
__device__ __forceinline__ void mma_epi_i8_rows(const EpiI8& e, const int* so,
                                                const unsigned char* s_res, bool res_smem,
                                                int rows, int r0, int cl, unsigned* yp,
                                                const unsigned* rp, i64 step) {
  constexpr int row_step = MMA_THREADS / (MMA_BN / 4);
#pragma unroll 1
  for (int rb = r0; rb < rows; rb += row_step * MMA_EPI_ROWS) {
    unsigned rq[MMA_EPI_ROWS];
    if (RES) {
#pragma unroll
      for (int i = 0; i < MMA_EPI_ROWS; i++) {
        const int r = rb + i * row_step;
        rq[i] = res_smem ? *(const unsigned*)(s_res + r * MMA_BN + cl) : r < rows ? *rp : 0u;
        rp = (const unsigned*)((const signed char*)rp + step);
      }
    }
#pragma unroll
    for (int i = 0; i < MMA_EPI_ROWS; i++) {
      int r = rb + i * row_step;
      if (r >= rows) break;
      *yp = epi_i8_word_as<SILU, RES>(e, *(const int4*)&so[r * MMA_OUT_LD + cl],
                                      RES ? rq[i] : 0u);
      yp = (unsigned*)((signed char*)yp + step);
    }
  }
}
__device__ __forceinline__ void mma_epilogue(const int* so, const float* s_al, const float* s_bi,
                                             const unsigned char* s_res, bool res_smem, int m0,
                                             int rows, int n0, MMA_EPI_PARAMS) {
  const int tid = threadIdx.x;
  // A thread's four channels are the same in every row it writes (MMA_THREADS is a multiple
  // of MMA_BN / 4): their alpha and bias are read once. On the int8 path the residual reads
  // of MMA_EPI_ROWS rows go out together before any store (the output may alias the
  // residual as far as the compiler knows, so it would not move a read above a store itself).
  const int cl = (tid % (MMA_BN / 4)) * 4, c = n0 + cl, r0 = tid / (MMA_BN / 4);
  const int row_step = MMA_THREADS / (MMA_BN / 4);
  if (c >= cout) return;
  if (epi_i8_ok(y_t, res_t, act)) {
    const EpiI8 e = epi_i8(s_al, s_bi, cl, res_scale, y_scale, act, a0, a1);
    // The output and residual words step by row_step rows: pointer increments, not a 64-bit
    // row * cout product a word (several instructions a word in the SASS).
    const i64 step = (i64)row_step * cout, at = (i64)(m0 + r0) * cout + c;
    unsigned* yp = (unsigned*)((signed char*)y + at);
    const unsigned* rp = (const unsigned*)((const signed char*)res + (res_t == 2 ? at : 0));
    // One loop for each activation and residual, chosen once.
    if (e.silu) {
      if (res_t == 2)
        mma_epi_i8_rows<true, true>(e, so, s_res, res_smem, rows, r0, cl, yp, rp, step);
      else
        mma_epi_i8_rows<true, false>(e, so, s_res, res_smem, rows, r0, cl, yp, rp, step);
    } else if (res_t == 2) {
      mma_epi_i8_rows<false, true>(e, so, s_res, res_smem, rows, r0, cl, yp, rp, step);
    } else {
      mma_epi_i8_rows<false, false>(e, so, s_res, res_smem, rows, r0, cl, yp, rp, step);
    }
    return;
  }
  // Every other output, residual and activation (float outputs of layers that feed float
  // ops, mostly): one row at a time, through the generic conversions.
  const float4 al = *(const float4*)(s_al + cl), bi = *(const float4*)(s_bi + cl);
  for (int r = r0; r < rows; r += row_step) {
    i64 at = (i64)(m0 + r) * cout + c;
    int4 s = *(const int4*)&so[r * MMA_OUT_LD + cl];
    float4 rs = res_t >= 0 ? ld4(res, res_t, at, res_scale) : make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v = make_float4(act_f(s.x * al.x + bi.x + rs.x, act, a0, a1),
                           act_f(s.y * al.y + bi.y + rs.y, act, a0, a1),
                           act_f(s.z * al.z + bi.z + rs.z, act, a0, a1),
                           act_f(s.w * al.w + bi.w + rs.w, act, a0, a1));
    st4(y, y_t, at, v, y_scale);
  }
}

// The tensor-core kernel's parameters, and the same names passed on to its body.
#define MMA_PARAMS                                                                          \
  const signed char* x, const signed char* w, const float* alpha, const float* bias,       \
      const void* res, int res_t, float res_scale, void* y, int y_t, float y_scale, int m,  \
      int cin, int kpad, int cout, int act, float a0, float a1, int h, int wd, int oh,      \
      int ow, int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw,               \
      unsigned img_magic, unsigned img_shift, unsigned row_magic, unsigned row_shift
#define MMA_ARGS                                                                            \
  x, w, alpha, bias, res, res_t, res_scale, y, y_t, y_scale, m, cin, kpad, cout, act, a0, a1, \
      h, wd, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, img_magic, img_shift, row_magic,       \
      row_shift
template <int BM>
__device__ __forceinline__ void conv_i8_mma_body(unsigned char* smem, MMA_PARAMS) {
#if __CUDA_ARCH__ >= 800
  pdl_trigger();
  // BM / 32 rows of the x tile a thread copies; a warp's share of the tile is BM / 2 rows
  // (MI 16-row fragments) by 32 channels.
  constexpr int XR = BM / 32, MI = BM / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * MMA_BN, m0 = blockIdx.y * BM;
  // Copies: four threads a row, each one 16-byte piece of the stage's MMA_BK bytes, so that a
  // warp's copy reads eight rows' 64 bytes each (contiguous within a tap). A thread a row,
  // reading 16 bytes every cin bytes, touched twice the L2 sectors it used (Nsight, ResNet-50
  // at batch 32). A quarter warp's eight pieces are rows r and r + 4, whose 16-byte columns
  // are disjoint bank groups with MMA_LD-byte rows. A thread's rows are crow + 32 i: XR of
  // the x tile, two of the weight tile.
  const int piece = lane & 3, crow = warp * 8 + (lane >> 3) + ((lane >> 2) & 1) * 4;
  const int k = kh * kw * cin;
  // Per x row: the byte offset of its first tap (which may lie in the padding) and where
  // that tap is (iy0, ix0); rows past m get an iy0 no tap reaches inside. The divisions by
  // oh * ow and ow are FastDiv's multiply-shifts (magic 0: by 1): eight integer divisions a
  // thread were more instructions than a one-tile layer's tensor-core work. Offsets are 32-bit
  // (the host offers the kernel inputs of fewer than 2^31 bytes), a few instructions a copy
  // fewer than 64-bit products.
  int xo[XR], iy0[XR], ix0[XR];
#pragma unroll
  for (int i = 0; i < XR; i++) {
    int arow = m0 + crow + 32 * i;
    unsigned ua = (unsigned)min(arow, m - 1);
    int b = img_magic ? __umulhi(ua, img_magic) >> img_shift : ua, r = ua - b * oh * ow;
    int oy = row_magic ? __umulhi((unsigned)r, row_magic) >> row_shift : r;
    iy0[i] = arow < m ? oy * sh - pt : -(1 << 30);
    ix0[i] = (r - oy * ow) * sw - pl;
    xo[i] = arow < m ? ((b * h + iy0[i]) * wd + ix0[i]) * cin : 0;
  }
  // The epilogue's operands (see above), in the first copy group: 32 threads copy the alphas
  // and biases, every thread BM / 32 pieces of the residual tile (four a row). Channels past
  // cout (a multiple of 4) and rows past m are zero-filled (a copy of 0 bytes from the
  // array's start).
  float* s_al = (float*)(smem + MMA_STAGES * (BM + MMA_BN) * MMA_LD);
  float* s_bi = s_al + MMA_BN;
  unsigned char* s_res = (unsigned char*)(s_bi + MMA_BN);
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  // Everything above is index arithmetic and constants; the residual and x are the previous
  // kernels' outputs.
  pdl_wait();
  // For the int8 epilogue only, where the launch gave the tile room (not on GPUs whose
  // shared memory it would cost blocks), and 16-byte copies need 16-byte rows; otherwise the
  // epilogue reads the residual from global memory.
  unsigned smem_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
  const bool res_smem = epi_i8_ok(y_t, res_t, act) && res_t == 2 && (cout & 15) == 0 &&
                        ((size_t)res & 15) == 0 &&
                        smem_bytes >= (unsigned)(s_res - smem) + BM * MMA_BN;
  if (res_smem) {
#pragma unroll
    for (int i = 0; i < BM / 32; i++) {
      const int q = tid + MMA_THREADS * i, r = q >> 2, cc = n0 + (q & 3) * 16;
      const bool in = m0 + r < m && cc < cout;
      cp_async16(s_res + r * MMA_BN + (q & 3) * 16,
                 (const signed char*)res + (in ? (i64)(m0 + r) * cout + cc : 0), in);
    }
  }
  // This thread's weight rows (crow and crow + 32) at its next piece.
  const signed char* wp = w + (i64)(n0 + crow) * kpad + piece * 16;
  const i64 w32 = (i64)32 * kpad;
  const int ktiles = kpad / MMA_BK;
  // Where this thread's next piece starts in the reduction: channel ci of tap (ky, kx). Tiles
  // are copied in order, so this steps along instead of dividing per piece (two integer
  // divisions a piece would be more instructions than the tile's tensor-core work).
  int ci = piece * 16, kx = 0, ky = 0;
  auto step_tap = [&](int by) {
    for (ci += by; ci >= cin; ci -= cin)
      if (++kx == kw) {
        kx = 0;
        ky++;
      }
  };
  step_tap(0);
  // Copies the next tile into stage `fill` (tiles go in order, stages round robin).
  int kpos = piece * 16, fill = 0;
  auto load = [&]() {
    unsigned char* sa = smem + fill * (BM + MMA_BN) * MMA_LD + crow * MMA_LD + piece * 16;
    unsigned char* sb = sa + BM * MMA_LD;
    const bool kin = kpos < k;
    const int dy = ky * dh, dx = kx * dw, toff = (dy * wd + dx) * cin + ci;
#pragma unroll
    for (int i = 0; i < XR; i++) {
      int iy = iy0[i] + dy, ix = ix0[i] + dx;
      bool in = kin && (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)wd;
      cp_async16(sa + 32 * i * MMA_LD, x + (unsigned)(in ? xo[i] + toff : 0), in);
    }
    cp_async16(sb, wp, true);
    cp_async16(sb + 32 * MMA_LD, wp + w32, true);
    wp += MMA_BK;
    kpos += MMA_BK;
    fill = fill == MMA_STAGES - 1 ? 0 : fill + 1;
    step_tap(MMA_BK);
  };
  int acc[MI][4][4];
  zero_acc<MI>(acc);
#pragma unroll
  for (int s = 0; s < MMA_STAGES - 1; s++) {
    if (s < ktiles) load();
    asm volatile("cp.async.commit_group;\n" ::);
  }
  const int wm = (warp >> 1) * (BM / 2), wn = (warp & 1) * 32;
  for (int kt = 0, use = 0; kt < ktiles; kt++, use = use == MMA_STAGES - 1 ? 0 : use + 1) {
    // Tile kt (in stage `use`) has landed; every warp is done with the stage the next copy
    // overwrites.
    asm volatile("cp.async.wait_group %0;\n" ::"n"(MMA_STAGES - 2));
    __syncthreads();
    if (kt + MMA_STAGES - 1 < ktiles) load();
    asm volatile("cp.async.commit_group;\n" ::);
    const unsigned char* sa = smem + use * (BM + MMA_BN) * MMA_LD;
    const unsigned char* sb = sa + BM * MMA_LD;
#pragma unroll
    for (int ks = 0; ks < MMA_BK; ks += 32)
      mma_k32<MI>(acc, sa + wm * MMA_LD + ks, MMA_LD, sb + wn * MMA_LD + ks, MMA_LD, lane);
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  int* so = (int*)smem;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int r = wm + i * 16 + g, c = wn + j * 8 + 2 * t4;
      *(int2*)&so[r * MMA_OUT_LD + c] = make_int2(acc[i][j][0], acc[i][j][1]);
      *(int2*)&so[(r + 8) * MMA_OUT_LD + c] = make_int2(acc[i][j][2], acc[i][j][3]);
    }
  __syncthreads();
  mma_epilogue(so, s_al, s_bi, s_res, res_smem, m0, min(BM, m - m0), n0,
                            MMA_EPI_ARGS);
#else
  __trap();
#endif
}

extern __shared__ __align__(16) unsigned char mma_smem[];
// MMA_BM-pixel tiles (a warp 64 x 32; 128 registers, no spills on sm_90), four blocks an SM.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 4) conv_i8_mma(MMA_PARAMS) {
  conv_i8_mma_body<MMA_BM>(mma_smem, MMA_ARGS);
}
// Half-height tiles (a warp 32 x 32, 80 registers): six blocks an SM, twice the blocks a
// layer. For layers whose few pixel tiles leave SMs idle or whose blocks wait on memory with
// little tensor-core work between (the builder times both).
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 6) conv_i8_mma64(MMA_PARAMS) {
  conv_i8_mma_body<MMA_BM / 2>(mma_smem, MMA_ARGS);
}

// Int8 stride-1 conv over 16-channel NHWC input (the stems `space_to_depth_stem` regroups:
// ResNets' 7x7/2 as a 4x4 conv, MobileNets' and EfficientNets' 3x3/2 as a 2x2 one) on the
// int8 tensor cores, a row of output pixels at a time. conv_i8_mma copies every tap of every
// output pixel from L2, kh * kw times the input (16 taps of 16 bytes a pixel in ResNet-50's
// stem, whose 77 us at batch 32 on an H200 were the engine's longest layer). Here a block
// copies a row's input window (kh input rows of ow + kw - 1 pixels, zero outside the input)
// into shared memory once and builds the tensor-core A fragments from it: with 16 channels,
// taps kx and kx + 1 of a pixel are 32 contiguous bytes of the window, one m16n8k32 step, and
// consecutive pixels are 16 bytes apart, the rows ldmatrix wants, bank-conflict free. A block
// keeps its MMA_BN channels' weights in shared memory and steps over output rows (grid-
// stride), copying the next row's window while it computes and writes the current one; each
// of its warps computes the whole row for 16 channels (a warp whose channels are all past
// cout skips that). The epilogue is conv_i8_mma's. On an H200, ResNet-50's stem at batch 32
// took 56 us this way against conv_i8_mma's 77; eight warps a block (16 channels of every
// other pixel tile each) took 63, and with the sums written out half a row at a time (four
// blocks an SM, 64 registers, some spilled) 76. Needs
// ow <= ROWS_MAX_OW, kw even, the weights as conv_i8_mma's (kpad = kh * kw * 16 rounded up to
// MMA_BK); dynamic shared memory as `rows_smem_bytes` on the host.
#define ROWS_MAX_OW 128
#define ROWS_MT (ROWS_MAX_OW / 16)
// Bytes a pixel of a row's staged int8 codes: MMA_BN and 16 more, so that the eight rows of a
// quarter warp's 2-byte stores (rows 80 bytes apart) fall in distinct banks.
#define ROWS_CODE_LD (MMA_BN + 16)
#if __CUDA_ARCH__ >= 800
// A warp's int8 epilogue of its row sums in registers (the m16n8 accumulator layout: pixel
// i * 16 + g and g + 8, channels c0 + j * 8 and the next), each pair of codes a 2-byte store
// into the row's staged codes. Staging the int32 sums instead took 31.5 KiB of shared memory
// a block on ResNet-50's stem (three blocks an SM where this allows five) and a shared-memory
// round trip a word: that stem took 57 us at batch 32 on an H200, this way 43.
template <bool SILU>
__device__ __forceinline__ void rows_codes(const int (&acc)[ROWS_MT][2][4], int mt,
                                           unsigned char* s_out, int g, int c0,
                                           const float2* al, const float2* bi, float y_scale,
                                           int act, float a0, float a1) {
#pragma unroll
  for (int j = 0; j < 2; j++) {
    const int c = c0 + j * 8;
    const float2 a = al[c / 2], b = bi[c / 2];
    // The same two channels in both rows of a fragment: x, y for pixel g, z, w for g + 8.
    const EpiI8 e = epi_i8_of(make_float4(a.x, a.y, a.x, a.y), make_float4(b.x, b.y, b.x, b.y),
                              0.f, y_scale, act, a0, a1);
#pragma unroll
    for (int i = 0; i < ROWS_MT; i++) {
      if (i < mt) {
        const unsigned q = epi_i8_word_as<SILU, false>(
            e, make_int4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]), 0u);
        unsigned char* p = s_out + (i * 16 + g) * ROWS_CODE_LD + c;
        *(unsigned short*)p = (unsigned short)q;
        *(unsigned short*)(p + 8 * ROWS_CODE_LD) = (unsigned short)(q >> 16);
      }
    }
  }
}
// The staged codes of a row's `ow` pixels, `cw` channels each, to y (pixel stride `cout`
// bytes): 16-byte pieces where the rows allow, else words (cout is a multiple of 4).
__device__ __forceinline__ void rows_store(const unsigned char* s_out, signed char* y, int ow,
                                           int cw, int cout) {
  if ((cout & 15) == 0 && (cw & 15) == 0 && ((size_t)y & 15) == 0) {
    const int per = cw >> 4;
    for (int q = threadIdx.x; q < ow * per; q += blockDim.x) {
      const int px = q / per, p = q - px * per;
      *(uint4*)(y + (i64)px * cout + p * 16) =
          *(const uint4*)(s_out + px * ROWS_CODE_LD + p * 16);
    }
  } else {
    const int per = cw >> 2;
    for (int q = threadIdx.x; q < ow * per; q += blockDim.x) {
      const int px = q / per, p = q - px * per;
      *(unsigned*)(y + (i64)px * cout + p * 4) =
          *(const unsigned*)(s_out + px * ROWS_CODE_LD + p * 4);
    }
  }
}
#endif
extern "C" __global__ void __launch_bounds__(MMA_THREADS)
    conv_i8_rows(const signed char* x, const signed char* w, const float* alpha,
                 const float* bias, MMA_EPI_PARAMS, int nrows, int h, int wd, int oh, int ow,
                 int kh, int kw, int pt, int pl, int kpad) {
#if __CUDA_ARCH__ >= 800
  pdl_trigger();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * MMA_BN;
  // Weight rows 16 bytes longer than kpad (a multiple of 64), so that ldmatrix's eight rows
  // fall in distinct banks; a window has 16 pixels of slack after its last row for the
  // padding rows of a row's last 16-pixel tile (read, never written out).
  const int wld = kpad + 16, pw = ow + kw - 1, win = (kh * pw + 16) * 16, mt = (ow + 15) >> 4;
  // An int8 output without a residual (the stems) takes its epilogue in registers and stages
  // the row's codes (ROWS_CODE_LD bytes a pixel); anything else stages the int32 sums for
  // mma_epilogue. The host sizes shared memory the same way (`rows_smem_bytes`).
  const bool codes = epi_i8_ok(y_t, res_t, act) && res_t < 0;
  unsigned char* s_w = mma_smem;
  unsigned char* s_win = s_w + MMA_BN * wld;
  unsigned char* s_out = s_win + 2 * win;
  int* so = (int*)s_out;
  float* s_al = (float*)(s_out + mt * 16 * (codes ? ROWS_CODE_LD : MMA_OUT_LD * 4));
  float* s_bi = s_al + MMA_BN;
  for (int q = tid; q < MMA_BN * (kpad / 16); q += MMA_THREADS) {
    const int r = q / (kpad / 16), p = q - r * (kpad / 16);
    cp_async16(s_w + r * wld + p * 16, w + (i64)(n0 + r) * kpad + p * 16, true);
  }
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  // The weights, alphas and biases are constants: their copies overlap the previous kernel's
  // end. The windows are its output.
  pdl_wait();
  // Output row `row` (image row / oh, row row % oh): its window into buffer `b`.
  auto load_window = [&](int row, int b) {
    const int img = row / oh, oy = row - img * oh;
    unsigned char* dst = s_win + b * win;
    for (int q = tid; q < kh * pw; q += MMA_THREADS) {
      const int ky = q / pw, px = q - ky * pw, iy = oy - pt + ky, ix = px - pl;
      const bool in = (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)wd;
      cp_async16(dst + q * 16, x + (in ? ((i64)(img * h + iy) * wd + ix) * 16 : 0), in);
    }
  };
  int row = blockIdx.y;
  if (row < nrows) load_window(row, 0);
  asm volatile("cp.async.commit_group;\n" ::);
  const int g = lane >> 2, t4 = lane & 3;
  // This warp's 16 channels.
  const int wc = warp * 16;
  const bool busy = n0 + wc < cout;
  for (int buf = 0; row < nrows; row += gridDim.y, buf ^= 1) {
    // This row's window (and, the first time, the weights) has landed; every thread is done
    // with the last row's sums and with the window the next copy overwrites.
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (row + (int)gridDim.y < nrows) load_window(row + gridDim.y, buf ^ 1);
    asm volatile("cp.async.commit_group;\n" ::);
    const unsigned char* wnd = s_win + buf * win;
    int acc[ROWS_MT][2][4];
#pragma unroll
    for (int i = 0; i < ROWS_MT; i++)
#pragma unroll
      for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][j][e] = 0;
    for (int ky = 0; ky < kh && busy; ky++)
      for (int kx = 0; kx < kw; kx += 2) {
        unsigned r4[4];
        ldsm_x4(r4, s_w + (wc + ((lane >> 4) << 3) + (lane & 7)) * wld + (ky * kw + kx) * 16 +
                        ((lane >> 3) & 1) * 16);
        const unsigned b0[2] = {r4[0], r4[1]}, b1[2] = {r4[2], r4[3]};
        const unsigned char* a0p = wnd + (ky * pw + (lane & 15) + kx + (lane >> 4)) * 16;
#pragma unroll
        for (int i = 0; i < ROWS_MT; i++) {
          if (i < mt) {
            unsigned af[4];
            ldsm_x4(af, a0p + i * 256);
            mma_s8(acc[i][0], af, b0);
            mma_s8(acc[i][1], af, b1);
          }
        }
      }
    if (codes) {
      if (busy) {
        const float2 *al = (const float2*)s_al, *bi = (const float2*)s_bi;
        const int c0 = wc + 2 * t4;
        if (act == 24)
          rows_codes<true>(acc, mt, s_out, g, c0, al, bi, y_scale, act, a0, a1);
        else
          rows_codes<false>(acc, mt, s_out, g, c0, al, bi, y_scale, act, a0, a1);
      }
      __syncthreads();
      rows_store(s_out, (signed char*)y + (i64)row * ow * cout + n0, ow, min(MMA_BN, cout - n0),
                 cout);
      continue;
    }
#pragma unroll
    for (int i = 0; i < ROWS_MT; i++) {
      if (i < mt) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int r = i * 16 + g, c = wc + j * 8 + 2 * t4;
          *(int2*)&so[r * MMA_OUT_LD + c] = make_int2(acc[i][j][0], acc[i][j][1]);
          *(int2*)&so[(r + 8) * MMA_OUT_LD + c] = make_int2(acc[i][j][2], acc[i][j][3]);
        }
      }
    }
    __syncthreads();
    mma_epilogue(so, s_al, s_bi, nullptr, false, row * ow, ow, n0, MMA_EPI_ARGS);
  }
#else
  __trap();
#endif
}

// Int8 1x1 conv (stride 1, no padding) or Gemm / MatMul rows, int8 out, on the int8 tensor
// cores with the weights resident: the memory-bound expansions and reductions of bottleneck
// networks (ResNet-50's layer1 64 -> 256 at batch 32: 6 MB in, 26 MB of residual and 26 MB
// out for 1.6 G multiply-adds). conv_i8_mma there runs one pixel tile a block: it copies the
// tile, waits, computes, stages int32 sums in shared memory and writes, each block's memory
// traffic and its arithmetic in turn. Here a block keeps its MMA_BN channels' weights (kpad
// <= 256 bytes a row) and alphas in shared memory and steps over pixel tiles (grid-stride,
// as many blocks as fit the SMs at once): it copies the next tile's x rows and int8 residual
// while it computes and writes the current one.
//
// The epilogue runs on the accumulator fragments in registers. In the m16n8 layout a thread
// holds rows g and g + 8 of a 16-row fragment at columns 2 t4 and 2 t4 + 1 of each 8-column
// tile; the block's weight rows are permuted as they are copied (`mmas_channel`) so that
// columns 2 t4, 2 t4 + 1 of tiles 2 jp and 2 jp + 1 are channels 4 t4 .. 4 t4 + 3 of group jp:
// a thread's four sums of a row are four consecutive channels, one word of residual codes in
// and one of output codes out (two-byte pieces took a shift and twice the shared-memory
// accesses a word). The words go through the tile's staged residual, each code replacing its
// residual, then out in 16-byte pieces. Shared memory (mmas_smem_bytes on the host): the
// weights, two x tiles of kpad + 16 bytes a row (ldmatrix's eight rows in distinct banks), two
// residual / code tiles of ROWS_CODE_LD bytes a row (a quarter warp's eight rows in distinct
// banks), the alphas and biases. Needs cin % 16 == 0, kpad in {64, 128, 256}, cout % 16 == 0,
// (m + BM) * cin and (m + BM) * cout below 2^31 (32-bit offsets to the last tile's end),
// 16-byte aligned tensors (buffer starts), an int8 output and residual (or none) and an
// activation the int8 epilogue computes (epi_i8_ok); grid (cout_pad / MMA_BN, blocks),
// MMA_THREADS threads.
#if __CUDA_ARCH__ >= 800
// The channel (within the block's MMA_BN) whose weights go to column `col` of the block's
// B tiles: in each 16, column 8 h + 2 t4 + e (8-column tile h) holds channel 4 t4 + 2 h + e.
__device__ __forceinline__ int mmas_channel(int col) {
  return (col & ~15) | ((col & 6) << 1) | ((col >> 2) & 2) | (col & 1);
}
template <int BM, bool SILU, bool RES>
__device__ __forceinline__ void mmas_tiles(unsigned char* smem, const signed char* x,
                                           const signed char* res, float res_scale,
                                           signed char* y, float y_scale, int cout, int act,
                                           float a0, float a1, int m, int cin, int kpad) {
  constexpr int MI = BM / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * MMA_BN, tiles = (m + BM - 1) / BM, ld = kpad + 16;
  const unsigned char* s_w = smem;
  unsigned char* s_x = smem + MMA_BN * ld;
  unsigned char* s_c = s_x + 2 * BM * ld;
  const float* s_al = (const float*)(s_c + 2 * BM * ROWS_CODE_LD);
  const float* s_bi = s_al + MMA_BN;
  // A thread copies 16-byte piece xp of x rows xr, xr + xstep, ... (kpad / 16 pieces a row, a
  // power of two dividing MMA_THREADS), and piece rp of residual rows rr + 32 i; it writes
  // the same pieces of the tile's output rows.
  const int pieces = kpad >> 4, xp = tid & (pieces - 1), xr = tid / pieces,
            xstep = MMA_THREADS / pieces;
  const bool xin = xp * 16 < cin;
  const int rp = tid & 3, rr = tid >> 2, rc = n0 + rp * 16;
  const bool rin = rc < cout;
  auto load = [&](int t, int b) {
    unsigned char* sx = s_x + b * BM * ld + xr * ld + xp * 16;
    int row = t * BM + xr, off = row * cin + xp * 16;
    for (int r = xr; r < BM; r += xstep, row += xstep, off += xstep * cin, sx += xstep * ld) {
      const bool in = xin && row < m;
      cp_async16(sx, x + (in ? off : 0), in);
    }
    if (RES) {
      unsigned char* sc = s_c + b * BM * ROWS_CODE_LD + rr * ROWS_CODE_LD + rp * 16;
      const int row0 = t * BM + rr;
#pragma unroll
      for (int i = 0; i < BM / 32; i++) {
        const bool in = rin && row0 + 32 * i < m;
        cp_async16(sc + 32 * i * ROWS_CODE_LD, res + (in ? (row0 + 32 * i) * cout + rc : 0), in);
      }
    }
  };
  int t = blockIdx.y;
  if (t < tiles) load(t, 0);
  asm volatile("cp.async.commit_group;\n" ::);
  const int wm = (warp >> 1) * (BM / 2), wn = (warp & 1) * 32, g = lane >> 2, t4 = lane & 3;
  for (int b = 0; t < tiles; t += gridDim.y, b ^= 1) {
    // Tile t (and, the first time, the weights and alphas) has landed; every thread is done
    // with the buffers the next copy overwrites (the tile before's codes went out).
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (t + (int)gridDim.y < tiles) load(t + gridDim.y, b ^ 1);
    asm volatile("cp.async.commit_group;\n" ::);
    int acc[MI][4][4];
    zero_acc<MI>(acc);
    const unsigned char* sa = s_x + b * BM * ld;
#pragma unroll 1
    for (int ks = 0; ks < kpad; ks += 32)
      mma_k32<MI>(acc, sa + wm * ld + ks, ld, s_w + wn * ld + ks, ld, lane);
    // Each fragment's row g and row g + 8 words of channels c .. c + 3: the residual codes
    // read, the output codes written in their place.
    unsigned char* sc = s_c + b * BM * ROWS_CODE_LD;
#pragma unroll
    for (int jp = 0; jp < 2; jp++) {
      const int c = wn + jp * 16 + 4 * t4;
      const EpiI8 e = epi_i8(s_al, s_bi, c, res_scale, y_scale, act, a0, a1);
#pragma unroll
      for (int i = 0; i < MI; i++) {
        unsigned* p = (unsigned*)(sc + (wm + i * 16 + g) * ROWS_CODE_LD + c);
        unsigned* p8 = p + 8 * ROWS_CODE_LD / 4;
        const int(&lo)[4] = acc[i][2 * jp], (&hi)[4] = acc[i][2 * jp + 1];
        const unsigned r = RES ? *p : 0u, r8 = RES ? *p8 : 0u;
        *p = epi_i8_word_as<SILU, RES>(e, make_int4(lo[0], lo[1], hi[0], hi[1]), r);
        *p8 = epi_i8_word_as<SILU, RES>(e, make_int4(lo[2], lo[3], hi[2], hi[3]), r8);
      }
    }
    __syncthreads();
    const int row0 = t * BM + rr;
#pragma unroll
    for (int i = 0; i < BM / 32; i++) {
      if (rin && row0 + 32 * i < m)
        *(uint4*)(y + (row0 + 32 * i) * cout + rc) =
            *(const uint4*)(sc + (rr + 32 * i) * ROWS_CODE_LD + rp * 16);
    }
  }
}
#endif
template <int BM>
__device__ __forceinline__ void conv_i8_mmas_body(const signed char* x, const signed char* w,
                                                  const float* alpha, const float* bias,
                                                  MMA_EPI_PARAMS, int m, int cin, int kpad) {
#if __CUDA_ARCH__ >= 800
  pdl_trigger();
  const int tid = threadIdx.x, n0 = blockIdx.x * MMA_BN, ld = kpad + 16, pieces = kpad >> 4;
  unsigned char* smem = mma_smem;
  float* s_al = (float*)(smem + MMA_BN * ld + 2 * BM * (ld + ROWS_CODE_LD));
  float* s_bi = s_al + MMA_BN;
  for (int q = tid; q < MMA_BN * pieces; q += MMA_THREADS) {
    const int col = q / pieces, p = q - col * pieces;
    cp_async16(smem + col * ld + p * 16, w + (i64)(n0 + mmas_channel(col)) * kpad + p * 16,
               true);
  }
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  // The weights, alphas and biases are constants: their copies overlap the previous kernel's
  // end. x and the residual are its output.
  pdl_wait();
  const signed char* r8 = (const signed char*)res;
  signed char* y8 = (signed char*)y;
  // One tile loop for each activation and residual, chosen once.
  if (act == 24) {
    if (res_t == 2)
      mmas_tiles<BM, true, true>(smem, x, r8, res_scale, y8, y_scale, cout, act, a0, a1, m, cin,
                                 kpad);
    else
      mmas_tiles<BM, true, false>(smem, x, r8, res_scale, y8, y_scale, cout, act, a0, a1, m,
                                  cin, kpad);
  } else if (res_t == 2) {
    mmas_tiles<BM, false, true>(smem, x, r8, res_scale, y8, y_scale, cout, act, a0, a1, m, cin,
                                kpad);
  } else {
    mmas_tiles<BM, false, false>(smem, x, r8, res_scale, y8, y_scale, cout, act, a0, a1, m, cin,
                                 kpad);
  }
#else
  __trap();
#endif
}
#define MMAS_PARAMS                                                                          \
  const signed char *x, const signed char *w, const float *alpha, const float *bias,        \
      MMA_EPI_PARAMS, int m, int cin, int kpad
#define MMAS_ARGS x, w, alpha, bias, MMA_EPI_ARGS, m, cin, kpad
// 128-pixel tiles (a warp 64 x 32 of them, as conv_i8_mma's), four blocks an SM at kpad 64.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 4) conv_i8_mmas(MMAS_PARAMS) {
  conv_i8_mmas_body<MMA_BM>(MMAS_ARGS);
}
// Half-height tiles: half the shared memory, more blocks an SM.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 6) conv_i8_mmas64(MMAS_PARAMS) {
  conv_i8_mmas_body<MMA_BM / 2>(MMAS_ARGS);
}

// im2col for NHWC: cols [M = n*oh*ow, kpad] with k = (ky*kw + kx)*cin + ci; zero padding.
// esize: element bytes (1, 2 or 4).
extern "C" __global__ void im2col(const void* x, void* cols, int esize, int n, int h, int wd,
                                  int cin, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                                  int pw, int dh, int dw, i64 kpad) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * kpad;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, kpad);
  i64 k = p.c;
  int ox = p.x, oy = p.y, b = p.b;
  bool inside = false;
  i64 src = 0;
  if (k < (i64)kh * kw * cin) {
    int ci = k % cin;
    int kk = k / cin;
    int kx = kk % kw, ky = kk / kw;
    int iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
    if (iy >= 0 && iy < h && ix >= 0 && ix < wd) {
      inside = true;
      src = (((i64)b * h + iy) * wd + ix) * cin + ci;
    }
  }
  if (esize == 1) ((signed char*)cols)[i] = inside ? ((const signed char*)x)[src] : 0;
  else if (esize == 2) ((unsigned short*)cols)[i] = inside ? ((const unsigned short*)x)[src] : 0;
  else ((float*)cols)[i] = inside ? ((const float*)x)[src] : 0.f;
}

// im2col in 16-byte vectors, when a pixel's channels are whole vectors (cin * esize % 16 == 0)
// and rows need no padding: cin_v vectors per pixel, a row is kh * kw * cin_v vectors.
extern "C" __global__ void im2col_v16(const int4* x, int4* cols, int n, int h, int wd, int cin_v,
                                      int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                                      int pw, int dh, int dw) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 row = (i64)kh * kw * cin_v;
  if (i >= (i64)n * oh * ow * row) return;
  Pos p = nhwc_pos(i, oh, ow, row);
  int k = (int)p.c, ox = p.x, oy = p.y, b = p.b;
  int cv = k % cin_v, kk = k / cin_v;
  int kx = kk % kw, ky = kk / kw;
  int iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
  cols[i] = (iy >= 0 && iy < h && ix >= 0 && ix < wd)
                ? x[(((i64)b * h + iy) * wd + ix) * cin_v + cv]
                : make_int4(0, 0, 0, 0);
}

// Elementwise conversion / activation: y = act(x) (also quantize, dequantize, cast, copy).
extern "C" __global__ void unary(const void* x, int x_t, float x_scale, void* y, int y_t,
                                 float y_scale, i64 n, int act, float a0, float a1) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  st(y, y_t, i, act_f(ld(x, x_t, i, x_scale), act, a0, a1), y_scale);
}

// `unary` four elements a thread (n4 groups of 4): one 4-, 8- or 16-byte load and store each.
extern "C" __global__ void unary4(const void* x, int x_t, float x_scale, void* y, int y_t,
                                  float y_scale, i64 n4, int act, float a0, float a1) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  float4 v = ld4(x, x_t, i * 4, x_scale);
  st4(y, y_t, i * 4,
      make_float4(act_f(v.x, act, a0, a1), act_f(v.y, act, a0, a1), act_f(v.z, act, a0, a1),
                  act_f(v.w, act, a0, a1)),
      y_scale);
}

// Strided read (transpose, slice, expand, tile, layout change, depth-to-space) with type
// conversion: y[i] = x[offset + sum_d idx_d * strides[d]], idx = i unravelled over dims.
struct ViewArgs {
  i64 dims[QS_MAX_RANK];
  i64 strides[QS_MAX_RANK];
  i64 offset;
  int rank;
  int pad_;
  FastDiv div;
};
extern "C" __global__ void view(const void* x, int x_t, float x_scale, void* y, int y_t,
                                float y_scale, i64 n, ViewArgs p) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  i64 rem = i, src = p.offset;
  bool fast = QS_FAST(n);
#pragma unroll
  for (int d = QS_MAX_RANK - 1; d >= 0; d--) {
    if (d >= p.rank) continue;
    src += next_idx_fast(rem, p.dims[d], fast, p.div, d) * p.strides[d];
  }
  st(y, y_t, i, ld(x, x_t, src, x_scale), y_scale);
}

// Elementwise op of `EwOp` (host reference `EwOp::apply`), before the activation.
__device__ __forceinline__ float ew_f(int op, float a, float b, float c) {
  switch (op) {
    case 0: return a + b;
    case 1: return a * b;
    case 2: return a - b;
    case 3: return a / b;
    case 4: return powf(a, b);
    case 5: return fmaxf(a, b);
    case 6: return fminf(a, b);
    case 7: return a == b ? 1.f : 0.f;
    case 8: return a < b ? 1.f : 0.f;
    case 9: return a > b ? 1.f : 0.f;
    case 10: return a <= b ? 1.f : 0.f;
    case 11: return a >= b ? 1.f : 0.f;
    case 12: return (a != 0.f && b != 0.f) ? 1.f : 0.f;
    case 13: return (a != 0.f || b != 0.f) ? 1.f : 0.f;
    case 14: return ((a != 0.f) != (b != 0.f)) ? 1.f : 0.f;
    case 15: return fmodf(a, b);
    case 16: {
      float r = fmodf(a, b);
      return (r != 0.f && ((r < 0.f) != (b < 0.f))) ? r + b : r;
    }
    case 17: return a != 0.f ? b : c;
    case 18: return a >= 0.f ? a : a * b;
    default: return a;
  }
}

// v[j] = act(op(v[j], b[j], c[j])) for N elements, op and act uniform: one switch each, around
// the element loop, so that a thread's path through the code is one case's loop. (With
// ew_f and act_f inlined per element, every case sat in the loop N times over and the path
// jumped through all of them: sixteen elements a thread were 12.5 K instructions.)
template <int N>
__device__ __forceinline__ void ew_act_n(int op, int act, float a0, float a1, float* v,
                                         const float* b, const float* c) {
  switch (op) {
#define QS_EW(k)                                                                   \
  case k:                                                                          \
    _Pragma("unroll") for (int j = 0; j < N; j++) v[j] = ew_f(k, v[j], b[j], c[j]); \
    break;
    QS_EW(0) QS_EW(1) QS_EW(2) QS_EW(3) QS_EW(4) QS_EW(5) QS_EW(6) QS_EW(7) QS_EW(8) QS_EW(9)
    QS_EW(10) QS_EW(11) QS_EW(12) QS_EW(13) QS_EW(14) QS_EW(15) QS_EW(16) QS_EW(17) QS_EW(18)
#undef QS_EW
    default: break;  // ew_f's default: the first operand
  }
  switch (act) {
    case 0: break;
#define QS_ACT(k)                                                               \
  case k:                                                                       \
    _Pragma("unroll") for (int j = 0; j < N; j++) v[j] = act_f(v[j], k, a0, a1); \
    break;
    QS_ACT(1) QS_ACT(2) QS_ACT(3) QS_ACT(4) QS_ACT(5) QS_ACT(8) QS_ACT(9) QS_ACT(17) QS_ACT(24)
#undef QS_ACT
    default:
      for (int j = 0; j < N; j++) v[j] = act_rare(v[j], act, a0, a1);
  }
}

// y = act(op(in0, in1, in2)) with NumPy broadcasting: dims are y's stored dims, strides[k]
// input k's element strides over them (0 where it broadcasts). t[k] < 0: input k is an f32
// constant buffer. Inputs past `nin` are not read.
struct NaryArgs {
  i64 dims[QS_MAX_RANK];
  i64 strides[3][QS_MAX_RANK];
  const void* in[3];
  int t[3];
  float scale[3];
  int rank;
  int nin;
  FastDiv div;
};
// Each input's element offset at index i of p's dims (i unravelled, innermost dim last).
__device__ __forceinline__ void nary_offsets(const NaryArgs& p, i64 i, bool fast, i64 off[3]) {
  off[0] = off[1] = off[2] = 0;
  i64 rem = i;
#pragma unroll
  for (int d = QS_MAX_RANK - 1; d >= 0; d--) {
    if (d >= p.rank) continue;
    i64 idx = next_idx_fast(rem, p.dims[d], fast, p.div, d);
#pragma unroll
    for (int k = 0; k < 3; k++) off[k] += idx * p.strides[k][d];
  }
}
extern "C" __global__ void nary(NaryArgs p, void* y, int y_t, float y_scale, i64 n, int op,
                                int act, float a0, float a1) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  i64 off[3];
  nary_offsets(p, i, QS_FAST(n), off);
  float a = ldc(p.in[0], p.t[0], off[0], p.scale[0]);
  float b = p.nin > 1 ? ldc(p.in[1], p.t[1], off[1], p.scale[1]) : 0.f;
  float c = p.nin > 2 ? ldc(p.in[2], p.t[2], off[2], p.scale[2]) : 0.f;
  st(y, y_t, i, act_f(ew_f(op, a, b, c), act, a0, a1), y_scale);
}

// `nary` N elements a thread (N = 4, 8 or 16) where y's innermost stored dim is whole groups
// of N and each input either runs along it (bit k of `vec` set: stride 1 there, every other
// stride a multiple of N, read as vectors) or is constant along it (one read for the group: a
// per-channel gate or bias over NHWC). p's innermost dim and strides count groups (dims / N,
// strides * N). The host picks N so that a group of y's type is 16 bytes where it can (f32 4,
// f16 8, int8 and FP8 16), each thread then reading and writing whole 16-byte words and a
// warp whole lines, with a 16-byte aligned y and vector inputs; else 4.
// EfficientNet-B0's squeeze-excite multiply at batch 32 (14 M FP16 elements) took 0.12 ms
// with a thread per element and 0.05 ms four a thread (profiled layer times, H200).
template <int N>
__device__ __forceinline__ void ld_n(const void* p, int t, i64 i, float scale, float* v) {
  if (N == 16 && (t == 2 || t == 4)) {
    int4 q = *(const int4*)((const signed char*)p + i);
    int w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 16; j++) {
      int b = w[j >> 2] >> (8 * (j & 3));
      v[j] = (t == 2 ? (float)(signed char)b : f8_to_f32((unsigned char)b)) * scale;
    }
    return;
  }
  if (N == 8 && t == 1) {
    uint4 q = *(const uint4*)((const __half*)p + i);
    unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float2 f = __half22float2(*(const __half2*)&w[j]);
      v[2 * j] = f.x, v[2 * j + 1] = f.y;
    }
    return;
  }
#pragma unroll
  for (int g = 0; g < N / 4; g++) {
    float4 f = ld4(p, t, i + 4 * g, scale);
    v[4 * g] = f.x, v[4 * g + 1] = f.y, v[4 * g + 2] = f.z, v[4 * g + 3] = f.w;
  }
}
template <int N>
__device__ __forceinline__ void st_n(void* p, int t, i64 i, const float* v, float scale) {
  if (N == 16 && t == 2) {
    float inv = __frcp_rn(scale);
    unsigned w[4];
#pragma unroll
    for (int g = 0; g < 4; g++) {
      unsigned b0 = (unsigned char)q8(v[4 * g], inv), b1 = (unsigned char)q8(v[4 * g + 1], inv),
               b2 = (unsigned char)q8(v[4 * g + 2], inv), b3 = (unsigned char)q8(v[4 * g + 3], inv);
      w[g] = __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
    }
    *(int4*)((signed char*)p + i) = make_int4(w[0], w[1], w[2], w[3]);
    return;
  }
  if (N == 8 && t == 1) {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
      w[j] = *(unsigned*)&h;
    }
    *(uint4*)((__half*)p + i) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
#pragma unroll
  for (int g = 0; g < N / 4; g++)
    st4(p, t, i + 4 * g, make_float4(v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]), scale);
}
template <int N>
__device__ __forceinline__ void nary_ld_n(const NaryArgs& p, int k, i64 off, int vec, float* v) {
  if (k < p.nin && (vec >> k & 1))
    return ld_n<N>(p.in[k], p.t[k] < 0 ? 0 : p.t[k], off, p.scale[k], v);
  float c = k < p.nin ? ldc(p.in[k], p.t[k], off, p.scale[k]) : 0.f;
#pragma unroll
  for (int j = 0; j < N; j++) v[j] = c;
}
template <int N>
__device__ __forceinline__ void nary_n(const NaryArgs& p, void* y, int y_t, float y_scale,
                                       i64 groups, int op, int act, float a0, float a1, int vec) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= groups) return;
  i64 off[3];
  nary_offsets(p, i, QS_FAST(groups), off);
  float a[N], b[N], c[N];
  nary_ld_n<N>(p, 0, off[0], vec, a);
  nary_ld_n<N>(p, 1, off[1], vec, b);
  nary_ld_n<N>(p, 2, off[2], vec, c);
  ew_act_n<N>(op, act, a0, a1, a, b, c);
  st_n<N>(y, y_t, i * N, a, y_scale);
}
#define NARY_N_PARAMS                                                                       \
  NaryArgs p, void *y, int y_t, float y_scale, i64 groups, int op, int act, float a0, float a1, \
      int vec
#define NARY_N_ARGS p, y, y_t, y_scale, groups, op, act, a0, a1, vec
extern "C" __global__ void nary4(NARY_N_PARAMS) { nary_n<4>(NARY_N_ARGS); }
extern "C" __global__ void nary8(NARY_N_PARAMS) { nary_n<8>(NARY_N_ARGS); }
extern "C" __global__ void nary16(NARY_N_PARAMS) { nary_n<16>(NARY_N_ARGS); }

// Reductions of `ReduceOp`: 0 mean, 1 sum, 2 max, 3 min, 4 l2, 5 sum of squares, 6 product,
// 7 l1, 8 log-sum-exp. `red_comb` is how partial results combine; `red_map` what each element
// contributes (m: the row maximum, for log-sum-exp); `red_fin` the final value.
__device__ __forceinline__ int red_comb(int op) {
  return op == 2 ? 1 : op == 3 ? 2 : op == 6 ? 3 : 0;
}
__device__ __forceinline__ float red_map(int op, float v, float m) {
  switch (op) {
    case 4: case 5: return v * v;
    case 7: return fabsf(v);
    case 8: return expf(v - m);
    default: return v;
  }
}
__device__ __forceinline__ float red_fin(int op, float acc, i64 len, float m) {
  switch (op) {
    case 0: return acc / (float)len;
    case 4: return sqrtf(acc);
    case 8: return m + logf(acc);
    default: return acc;
  }
}

// [outer, len, inner] -> [outer, inner], one thread per output (inner > 1: neighbouring
// threads read neighbouring elements).
extern "C" __global__ void reduce(const void* x, int x_t, float x_scale, void* y, int y_t,
                                  float y_scale, i64 outer, i64 len, i64 inner, int op) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * inner) return;
  i64 o = i / inner, k = i - o * inner;
  i64 base = o * len * inner + k;
  float m = 0.f;
  if (op == 8) {
    m = -QS_INF;
    for (i64 j = 0; j < len; j++) m = fmaxf(m, ld(x, x_t, base + j * inner, x_scale));
  }
  int comb = red_comb(op);
  float acc = comb_init(comb);
  for (i64 j = 0; j < len; j++)
    acc = comb_f(comb, acc, red_map(op, ld(x, x_t, base + j * inner, x_scale), m));
  st(y, y_t, i, red_fin(op, acc, len, m), y_scale);
}

// [rows, len] -> [rows] (inner == 1: LayerNorm-like rows), a block per row (grid-stride over
// rows), the row reduced across the block.
extern "C" __global__ void reduce_rows(const void* x, int x_t, float x_scale, void* y, int y_t,
                                       float y_scale, i64 rows, i64 len, int op) {
  pdl_enter();
  __shared__ float sh[32];
  int comb = red_comb(op);
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    i64 base = r * len;
    float m = 0.f;
    if (op == 8) {
      float v = -QS_INF;
      for (i64 j = threadIdx.x; j < len; j += blockDim.x) v = fmaxf(v, ld(x, x_t, base + j, x_scale));
      m = block_reduce(v, 1, sh);
    }
    float acc = comb_init(comb);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x)
      acc = comb_f(comb, acc, red_map(op, ld(x, x_t, base + j, x_scale), m));
    acc = block_reduce(acc, comb, sh);
    if (threadIdx.x == 0) st(y, y_t, r, red_fin(op, acc, len, m), y_scale);
  }
}

// Normalises each contiguous row of `len` (a block per row, grid-stride over rows): mean, then
// variance of (x - mean) (two passes, as accurate as the CPU's), y = (x - mean) / sqrt(var +
// eps), then * gamma[j] + beta[j] where given (null pointers: absent).
extern "C" __global__ void norm_rows(const void* x, int x_t, float x_scale, void* y, int y_t,
                                     float y_scale, i64 rows, i64 len, float eps,
                                     const float* gamma, const float* beta) {
  pdl_enter();
  __shared__ float sh[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    i64 base = r * len;
    float s = 0.f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += ld(x, x_t, base + j, x_scale);
    float mean = block_reduce(s, 0, sh) / (float)len;
    float s2 = 0.f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      float d = ld(x, x_t, base + j, x_scale) - mean;
      s2 += d * d;
    }
    float inv = 1.f / sqrtf(block_reduce(s2, 0, sh) / (float)len + eps);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      float v = (ld(x, x_t, base + j, x_scale) - mean) * inv;
      if (gamma) v *= gamma[j];
      if (beta) v += beta[j];
      st(y, y_t, base + j, v, y_scale);
    }
  }
}

// Softmax (log_sm: LogSoftmax) over the middle axis of [outer, len, inner]; one thread per
// (outer, inner), for inner > 1.
extern "C" __global__ void softmax(const void* x, int x_t, float x_scale, void* y, int y_t,
                                   float y_scale, i64 outer, i64 len, i64 inner, int log_sm) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * inner) return;
  i64 o = i / inner, k = i % inner;
  i64 base = o * len * inner + k;
  float m = -QS_INF;
  for (i64 j = 0; j < len; j++) m = fmaxf(m, ld(x, x_t, base + j * inner, x_scale));
  float s = 0.f;
  for (i64 j = 0; j < len; j++) s += expf(ld(x, x_t, base + j * inner, x_scale) - m);
  float ls = logf(s);
  for (i64 j = 0; j < len; j++) {
    float d = ld(x, x_t, base + j * inner, x_scale) - m;
    st(y, y_t, base + j * inner, log_sm ? d - ls : expf(d) / s, y_scale);
  }
}

// Softmax over contiguous rows (inner == 1: attention rows), a block per row (grid-stride).
extern "C" __global__ void softmax_rows(const void* x, int x_t, float x_scale, void* y, int y_t,
                                        float y_scale, i64 rows, i64 len, int log_sm) {
  pdl_enter();
  __shared__ float sh[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    i64 base = r * len;
    float m = -QS_INF;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, ld(x, x_t, base + j, x_scale));
    m = block_reduce(m, 1, sh);
    float s = 0.f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += expf(ld(x, x_t, base + j, x_scale) - m);
    s = block_reduce(s, 0, sh);
    float ls = logf(s);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      float d = ld(x, x_t, base + j, x_scale) - m;
      st(y, y_t, base + j, log_sm ? d - ls : expf(d) / s, y_scale);
    }
  }
}

// Batched row-major matmul: y[bt] (m x n) = a[bt] (m x k) * B[bt], B k x n, or n x k when
// trans_b; a_stride / b_stride: elements between batches (0 broadcasts). b_t < 0: B is an f32
// constant buffer. 32 x 32 output tiles in shared memory, block (32, 8), each thread 4 rows;
// f32 accumulation; grid (n tiles, m tiles, batch), grid-stride over m tiles and batches.
#define MM_T 32
extern "C" __global__ void matmul(const void* a, int a_t, float a_scale, const void* b, int b_t,
                                  float b_scale, void* y, int y_t, float y_scale, i64 batch, int m,
                                  int n, int k, i64 a_stride, i64 b_stride, int trans_b) {
  pdl_enter();
  __shared__ float as[MM_T][MM_T + 1];
  __shared__ float bs[MM_T][MM_T + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int col0 = blockIdx.x * MM_T;
  for (i64 bt = blockIdx.z; bt < batch; bt += gridDim.z) {
    i64 ab = bt * a_stride, bb = bt * b_stride;
    for (i64 row0 = (i64)blockIdx.y * MM_T; row0 < m; row0 += (i64)gridDim.y * MM_T) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < k; k0 += MM_T) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
          int rr = ty + 8 * r;
          i64 gr = row0 + rr;
          int gk = k0 + tx;
          as[rr][tx] = (gr < m && gk < k) ? ld(a, a_t, ab + gr * k + gk, a_scale) : 0.f;
          if (trans_b) {
            // B is n x k: read along k so a warp's loads are contiguous.
            int gc = col0 + rr;
            bs[tx][rr] = (gc < n && gk < k) ? ldc(b, b_t, bb + (i64)gc * k + gk, b_scale) : 0.f;
          } else {
            int bk = k0 + rr, gc = col0 + tx;
            bs[rr][tx] = (bk < k && gc < n) ? ldc(b, b_t, bb + (i64)bk * n + gc, b_scale) : 0.f;
          }
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < MM_T; kk++) {
          float bv = bs[kk][tx];
#pragma unroll
          for (int r = 0; r < 4; r++) acc[r] += as[ty + 8 * r][kk] * bv;
        }
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < 4; r++) {
        i64 gr = row0 + ty + 8 * r;
        int gc = col0 + tx;
        if (gr < m && gc < n) st(y, y_t, (bt * m + gr) * n + gc, acc[r], y_scale);
      }
    }
  }
}

// y[o, j, i] = x[o, idx[j], i] over [outer, axis_len, inner]; idx_t < 0: f32 constant indices,
// else a device tensor of any dtype. Negative indices count from the end; out of range reads 0.
extern "C" __global__ void gather(const void* x, int x_t, float x_scale, const void* idx,
                                  int idx_t, float idx_scale, void* y, int y_t, float y_scale,
                                  i64 outer, i64 axis_len, i64 count, i64 inner) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * count * inner) return;
  i64 k = i % inner, t = i / inner;
  i64 j = t % count, o = t / count;
  i64 ix = (i64)rintf(ldc(idx, idx_t, j, idx_scale));
  if (ix < 0) ix += axis_len;
  float v = (ix >= 0 && ix < axis_len) ? ld(x, x_t, (o * axis_len + ix) * inner + k, x_scale) : 0.f;
  st(y, y_t, i, v, y_scale);
}

// N-d pad in stored order: out_dims / in_dims the stored dims, begin the pads before each axis
// (negative crops). mode: 0 constant (value), 1 reflect, 2 edge, 3 wrap.
struct PadArgs {
  i64 out_dims[QS_MAX_RANK];
  i64 in_dims[QS_MAX_RANK];
  i64 begin[QS_MAX_RANK];
  int rank;
  int mode;
  FastDiv div;
};
extern "C" __global__ void pad_nd(const void* x, int x_t, float x_scale, void* y, int y_t,
                                  float y_scale, i64 n, PadArgs p, float value) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  i64 rem = i, src = 0, in_stride = 1;
  bool inside = true, fast = QS_FAST(n);
#pragma unroll
  for (int d = QS_MAX_RANK - 1; d >= 0; d--) {
    if (d >= p.rank) continue;
    i64 o = next_idx_fast(rem, p.out_dims[d], fast, p.div, d);
    i64 len = p.in_dims[d];
    i64 s = o - p.begin[d];
    if (s < 0 || s >= len) {
      switch (p.mode) {
        case 1: {
          // Reflect without repeating the edge: period 2 (len - 1), as numpy does.
          i64 period = 2 * (len - 1);
          if (period <= 0) {
            s = 0;
          } else {
            s %= period;
            if (s < 0) s += period;
            if (s >= len) s = period - s;
          }
          break;
        }
        case 2: s = s < 0 ? 0 : len - 1; break;
        case 3: s %= len; if (s < 0) s += len; break;
        default: inside = false; break;
      }
    }
    src += s * in_stride;
    in_stride *= len;
  }
  st(y, y_t, i, inside ? ld(x, x_t, src, x_scale) : value, y_scale);
}

// A stem conv's input regrouped into s x s blocks (`Step::SpaceToDepth`): y[b, j, i, (bh * s +
// bw) * cp + c] = x[b, c, s * j + bh - pt, s * i + bw - pl], zero outside x and for c >= cin;
// y NHWC with s * s * cp channels (cp a multiple of 4), x read through its logical (b, c, h,
// w) strides (the host's NCHW f32 input, or NHWC) and converted to y's type and scale. One
// thread per four output channels, one vector store each: one pass where a layout copy, a
// pad and a strided copy of 2-byte elements took 0.12 ms for ResNet-50's batch-32 input.
extern "C" __global__ void space_to_depth(const void* x, int x_t, float x_scale, i64 sb, i64 sc,
                                          i64 sh, i64 sw, int h, int wd, int cin, void* y,
                                          int y_t, float y_scale, int n, int hs, int ws, int s,
                                          int cp, int pt, int pl) {
  pdl_enter();
  i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  int quads = s * s * cp / 4;
  if (q >= (i64)n * hs * ws * quads) return;
  // 32-bit divisions where the index allows (a 64-bit one is several times the instructions).
  bool small = QS_SMALL(q);
  i64 b = q;
  int k = (int)next_idx(b, quads, small);
  int i = (int)next_idx(b, ws, small);
  int j = (int)next_idx(b, hs, small);
  int cell = k / (cp / 4), c0 = k % (cp / 4) * 4;
  int yy = s * j + cell / s - pt, xx = s * i + cell % s - pl;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (yy >= 0 && yy < h && xx >= 0 && xx < wd) {
    i64 base = b * sb + (i64)yy * sh + (i64)xx * sw;
#pragma unroll
    for (int e = 0; e < 4; e++)
      if (c0 + e < cin) v[e] = ld(x, x_t, base + (i64)(c0 + e) * sc, x_scale);
  }
  st4(y, y_t, q * 4, make_float4(v[0], v[1], v[2], v[3]), y_scale);
}

// The int8 stem's regrouping where the tensor-core kernel runs (s = 2, four channels a cell:
// 16 bytes a pixel), a thread per output pixel: one 16-byte store and the index arithmetic
// once, not per cell (the general kernel above, a thread a cell, took 20 us to regroup
// ResNet-50's batch-32 input on an H200 while moving 26 MB). Same quantization as st4.
extern "C" __global__ void space_to_depth16(const void* x, int x_t, float x_scale, i64 sb,
                                            i64 sc, i64 sh, i64 sw, int h, int wd, int cin,
                                            uint4* y, float y_scale, int n, int hs, int ws,
                                            int pt, int pl) {
  pdl_enter();
  int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= n * hs * ws) return;
  int i = q % ws, t = q / ws, j = t % hs, b = t / hs;
  float inv = __frcp_rn(y_scale);
  unsigned v[4];
#pragma unroll
  for (int cell = 0; cell < 4; cell++) {
    int yy = 2 * j + (cell >> 1) - pt, xx = 2 * i + (cell & 1) - pl;
    bool in = yy >= 0 && yy < h && xx >= 0 && xx < wd;
    i64 base = b * sb + (i64)yy * sh + (i64)xx * sw;
    unsigned word = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      float f = in && c < cin ? ld(x, x_t, base + (i64)c * sc, x_scale) : 0.f;
      word |= (unsigned)(unsigned char)q8(f, inv) << (8 * c);
    }
    v[cell] = word;
  }
  y[q] = make_uint4(v[0], v[1], v[2], v[3]);
}

// Transposed convolution, plain NCHW in and out, weights [cin, cout / groups, kh, kw] (ONNX
// order, f32), gathered per output: output (oy, ox) takes input (iy, ix) at tap (ky, kx) when
// oy + ph - ky * dh == iy * sh (and likewise for x). Bias may be null. One thread per output.
extern "C" __global__ void conv_transpose(const void* x, int x_t, float x_scale, const float* w,
                                          const float* bias, void* y, int y_t, float y_scale,
                                          int n, int cin, int h, int wd, int cout, int oh, int ow,
                                          int kh, int kw, int sh, int sw, int ph, int pw, int dh,
                                          int dw, int groups, int act, float a0, float a1) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (i64)n * cout * oh * ow) return;
  int ox = i % ow;
  i64 t = i / ow;
  int oy = t % oh;
  t /= oh;
  int co = t % cout;
  i64 b = t / cout;
  int cpg = cin / groups, opg = cout / groups, g = co / opg, col = co - g * opg;
  float acc = bias ? bias[co] : 0.f;
  for (int ky = 0; ky < kh; ky++) {
    int ty = oy + ph - ky * dh;
    if (ty < 0 || ty % sh != 0) continue;
    int iy = ty / sh;
    if (iy >= h) continue;
    for (int kx = 0; kx < kw; kx++) {
      int tx = ox + pw - kx * dw;
      if (tx < 0 || tx % sw != 0) continue;
      int ix = tx / sw;
      if (ix >= wd) continue;
      for (int cg = 0; cg < cpg; cg++) {
        int ci = g * cpg + cg;
        float xv = ld(x, x_t, (((b * cin + ci) * h + iy) * wd + ix), x_scale);
        acc += xv * w[(((i64)ci * opg + col) * kh + ky) * kw + kx];
      }
    }
  }
  st(y, y_t, i, act_f(acc, act, a0, a1), y_scale);
}

// Pooling over NHWC. kind 0 max, 1 average. Pads top (pt), left (pl), bottom (pb), right (pr);
// windows running past the padded input (ceil mode) are clipped. Average: count_include_pad
// counts the window's positions inside the padded input (as ONNX Runtime and PyTorch do),
// otherwise only those inside the input.
extern "C" __global__ void pool(const void* x, int x_t, float x_scale, void* y, int y_t,
                                float y_scale, int n, int h, int wd, int c, int oh, int ow, int kh,
                                int kw, int sh, int sw, int pt, int pl, int pb, int pr, int dh,
                                int dw, int kind, int count_include_pad) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * c;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, c);
  int ch = p.c, ox = p.x, oy = p.y, b = p.b;
  float acc = kind == 0 ? -QS_INF : 0.f;
  int cnt = 0;
  for (int ky = 0; ky < kh; ky++) {
    int iy = oy * sh - pt + ky * dh;
    if (iy >= h + pb) break;
    for (int kx = 0; kx < kw; kx++) {
      int ix = ox * sw - pl + kx * dw;
      if (ix >= wd + pr) break;
      if (iy >= 0 && iy < h && ix >= 0 && ix < wd) {
        float v = ld(x, x_t, (((i64)b * h + iy) * wd + ix) * c + ch, x_scale);
        acc = kind == 0 ? fmaxf(acc, v) : acc + v;
        cnt++;
      } else if (count_include_pad) {
        cnt++;
      }
    }
  }
  if (kind == 1) acc = cnt > 0 ? acc / cnt : 0.f;
  st(y, y_t, i, acc, y_scale);
}

// `pool` with four channels per thread and vector accesses (c % 4 == 0): the plain kernel's
// byte- or half-wide reads took ResNet-50's stem max pool 6x longer than its bytes need.
extern "C" __global__ void pool4(const void* x, int x_t, float x_scale, void* y, int y_t,
                                 float y_scale, int n, int h, int wd, int c, int oh, int ow,
                                 int kh, int kw, int sh, int sw, int pt, int pl, int pb, int pr,
                                 int dh, int dw, int kind, int count_include_pad) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  int c4 = c >> 2;
  i64 total = (i64)n * oh * ow * c4;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, c4);
  float init = kind == 0 ? -QS_INF : 0.f;
  float4 acc = make_float4(init, init, init, init);
  int cnt = 0;
  for (int ky = 0; ky < kh; ky++) {
    int iy = p.y * sh - pt + ky * dh;
    if (iy >= h + pb) break;
    for (int kx = 0; kx < kw; kx++) {
      int ix = p.x * sw - pl + kx * dw;
      if (ix >= wd + pr) break;
      if (iy >= 0 && iy < h && ix >= 0 && ix < wd) {
        float4 v = ld4(x, x_t, (((i64)p.b * h + iy) * wd + ix) * c + p.c * 4, x_scale);
        if (kind == 0) {
          acc = make_float4(fmaxf(acc.x, v.x), fmaxf(acc.y, v.y), fmaxf(acc.z, v.z),
                            fmaxf(acc.w, v.w));
        } else {
          acc = make_float4(acc.x + v.x, acc.y + v.y, acc.z + v.z, acc.w + v.w);
        }
        cnt++;
      } else if (count_include_pad) {
        cnt++;
      }
    }
  }
  if (kind == 1) {
    float d = (float)cnt;
    acc = cnt > 0 ? make_float4(acc.x / d, acc.y / d, acc.z / d, acc.w / d)
                  : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  st4(y, y_t, i * 4, acc, y_scale);
}

// Max pooling over NHWC on raw 16-byte vectors of one type (f32, f16 or int8 codes): the
// max of the values is the value of the max code, and an int8 output at another scale is
// the max code requantized (requantizing is monotone), exactly as `pool` computes it. `pool4`
// converts every element to float and back (to requantize) and reads 4 bytes of int8 per
// thread: ResNet-50's batch-32 stem max pool took 58 us in int8 and 46 us in FP16 on an H200. cv: vectors per pixel (c * bytes / 16); the host keeps the
// input and output under 2^31 vectors.
__device__ __forceinline__ unsigned max_word(unsigned a, unsigned b, int t) {
  if (t == 2) return __vmaxs4(a, b);
  if (t == 1) {
    __half2 m = __hmax2(*(__half2*)&a, *(__half2*)&b);
    return *(unsigned*)&m;
  }
  return __float_as_uint(fmaxf(__uint_as_float(a), __uint_as_float(b)));
}
__device__ __forceinline__ unsigned requant_word(unsigned w, float xs, float ys) {
  char4 c = *(char4*)&w;
  float inv = __frcp_rn(ys);
  char4 q =
      make_char4(q8(c.x * xs, inv), q8(c.y * xs, inv), q8(c.z * xs, inv), q8(c.w * xs, inv));
  return *(unsigned*)&q;
}
extern "C" __global__ void max_pool16(const uint4* x, int t, float x_scale, uint4* y,
                                      float y_scale, int n, int h, int wd, int cv, int oh,
                                      int ow, int kh, int kw, int sh, int sw, int pt, int pl,
                                      int dh, int dw) {
  pdl_enter();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * oh * ow * cv) return;
  int v = i % cv, q = i / cv;
  int ox = q % ow;
  q /= ow;
  int oy = q % oh, b = q / oh;
  // The lowest value of the type: int8 -128, f16 and f32 -inf (what `pool` stores for a
  // window with no input position).
  unsigned lo = t == 2 ? 0x80808080u : t == 1 ? 0xfc00fc00u : 0xff800000u;
  uint4 acc = make_uint4(lo, lo, lo, lo);
  for (int ky = 0; ky < kh; ky++) {
    int iy = oy * sh - pt + ky * dh;
    if (iy < 0 || iy >= h) continue;
    for (int kx = 0; kx < kw; kx++) {
      int ix = ox * sw - pl + kx * dw;
      if (ix < 0 || ix >= wd) continue;
      uint4 a = x[((b * h + iy) * wd + ix) * cv + v];
      acc = make_uint4(max_word(acc.x, a.x, t), max_word(acc.y, a.y, t),
                       max_word(acc.z, a.z, t), max_word(acc.w, a.w, t));
    }
  }
  if (t == 2 && x_scale != y_scale)
    acc = make_uint4(requant_word(acc.x, x_scale, y_scale), requant_word(acc.y, x_scale, y_scale),
                     requant_word(acc.z, x_scale, y_scale), requant_word(acc.w, x_scale, y_scale));
  y[i] = acc;
}

// Global average pool over NHWC. Block: 32 channels x `lanes` pixel lanes (blockDim.x / 32, at
// most 32), each lane summing every lanes-th pixel, then the lanes reduced in shared memory;
// grid: (ceil(c / 32), n, splits). The host gives a lane about six pixels at least: with 32
// lanes for ResNet-50's 49-pixel pool each thread loaded one or two, and the reduction's
// serial sums outweighed the loads (0.0145 ms for 6.4 MB at batch 32, H200). One
// thread per channel (looping over all pixels) left most of the GPU idle on DeepLab's
// 65x65x2048 ASPP pool; and a block per image and 32 channels still used 32 of an H200's 132
// SMs on EfficientNet-B0's 32-channel squeeze-excite pools at batch 32, so the pixels are
// also split across `splits` blocks: each writes its f32 sums to part[b][split][c] and
// `gap_finish` adds them up (splits 1: the block writes y itself).
template <typename T, typename F>
__device__ __forceinline__ float gap_lane_sum(const T* x, i64 at, i64 step, int count, F value) {
  float acc = 0.f;
#pragma unroll 4
  for (int k = 0; k < count; k++, at += step) acc += value(x[at]);
  return acc;
}
extern "C" __global__ void global_avg_pool(const void* x, int x_t, float x_scale, void* y,
                                           int y_t, float y_scale, int n, i64 hw, int c,
                                           int splits, float* part_sums) {
  pdl_enter();
  __shared__ float part[32][33];
  int cl = threadIdx.x & 31, lane = threadIdx.x >> 5, lanes = blockDim.x >> 5;
  int ch = blockIdx.x * 32 + cl;
  i64 b = blockIdx.y;
  i64 chunk = (hw + splits - 1) / splits, p0 = blockIdx.z * chunk;
  i64 p1 = min(hw, p0 + chunk);
  float acc = 0.f;
  if (ch < c && b < n) {
    int count = p1 > p0 + lane ? (int)((p1 - p0 - lane + lanes - 1) / lanes) : 0;
    i64 at = (b * hw + p0 + lane) * c + ch, step = (i64)lanes * c;
    // The common types in their own counted loops, whose loads unroll ahead of their adds
    // (through `ld`'s switch, or to p1 in runtime steps, they ran one after another); int8
    // codes summed as integers in f32 (exact to 2^24) and scaled once.
    if (x_t == 1)
      acc = gap_lane_sum((const __half*)x, at, step, count,
                         [](__half v) { return __half2float(v); });
    else if (x_t == 2)
      acc = x_scale * gap_lane_sum((const signed char*)x, at, step, count,
                                   [](signed char v) { return (float)v; });
    else if (x_t == 0)
      acc = gap_lane_sum((const float*)x, at, step, count, [](float v) { return v; });
    else
      for (int k = 0; k < count; k++, at += step) acc += ld(x, x_t, at, x_scale);
  }
  part[lane][cl] = acc;
  __syncthreads();
  if (lane == 0 && ch < c && b < n) {
    float s = 0.f;
    // Unrolled over the 32 rows the shared array has (a loop to the runtime lane count runs
    // its loads one after another).
#pragma unroll
    for (int l = 0; l < 32; l++)
      if (l < lanes) s += part[l][cl];
    if (splits == 1)
      st(y, y_t, b * c + ch, s / (float)hw, y_scale);
    else
      part_sums[(b * splits + blockIdx.z) * c + ch] = s;
  }
}

// The average of global_avg_pool's split sums: one thread per (image, channel).
extern "C" __global__ void gap_finish(const float* part_sums, int splits, void* y, int y_t,
                                      float y_scale, int n, i64 hw, int c) {
  pdl_enter();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * c) return;
  int b = i / c, ch = i - b * c;
  float s = 0.f;
  for (int z = 0; z < splits; z++) s += part_sums[((i64)b * splits + z) * c + ch];
  st(y, y_t, i, s / (float)hw, y_scale);
}

// Concat one input into the output: out[(o * total + off + j) * inner + k] = in[(o * len + j) * inner + k].
extern "C" __global__ void concat_part(const void* x, int x_t, float x_scale, void* y, int y_t,
                                       float y_scale, i64 outer, i64 len, i64 total, i64 off,
                                       i64 inner) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * len * inner) return;
  i64 k = i % inner;
  i64 t = i / inner;
  i64 j = t % len, o = t / len;
  st(y, y_t, (o * total + off + j) * inner + k, ld(x, x_t, i, x_scale), y_scale);
}

// Resize over NHWC. mode 0 nearest, 1 linear, 2 cubic (Keys kernel, coefficient cubic_a;
// exclude_outside: taps outside the input get weight 0 and the rest are renormalised; taps
// are clamped to the edge). coord: 0 half_pixel, 1 asymmetric, 2 align_corners,
// 3 pytorch_half_pixel, 4 tf_half_pixel_for_nearest, 5 half_pixel_symmetric. nearest:
// 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil.
__device__ float src_coord(int o, int in_len, int out_len, float scale, int coord) {
  switch (coord) {
    case 1: return o / scale;
    case 2: return out_len > 1 ? o * (float)(in_len - 1) / (float)(out_len - 1) : 0.f;
    case 3: return out_len > 1 ? (o + 0.5f) / scale - 0.5f : 0.f;
    case 4: return (o + 0.5f) / scale;
    case 5: {
      float adj = (float)out_len / (scale * (float)in_len);
      float center = (float)in_len * 0.5f;
      return center * (1.f - adj) + (o + 0.5f) / scale - 0.5f;
    }
    default: return (o + 0.5f) / scale - 0.5f;
  }
}
__device__ __forceinline__ float nearest_f(float f, int mode) {
  switch (mode) {
    case 1: return (f - floorf(f) == 0.5f) ? ceilf(f) : rintf(f);
    case 2: return floorf(f);
    case 3: return ceilf(f);
    default: return (f - floorf(f) == 0.5f) ? floorf(f) : rintf(f);
  }
}
// Keys cubic weights of the 4 taps floor(f) - 1 .. floor(f) + 2, t = f - floor(f).
__device__ void cubic_taps(float f, int len, float a, int excl, int idx[4], float wt[4]) {
  float fl = floorf(f), t = f - fl;
  int x0 = (int)fl;
  float d[4] = {1.f + t, t, 1.f - t, 2.f - t};
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float s = d[j];
    float v = s <= 1.f ? ((a + 2.f) * s - (a + 3.f)) * s * s + 1.f
                       : ((a * s - 5.f * a) * s + 8.f * a) * s - 4.f * a;
    int ix = x0 - 1 + j;
    if (excl && (ix < 0 || ix >= len)) v = 0.f;
    wt[j] = v;
    sum += v;
    idx[j] = min(max(ix, 0), len - 1);
  }
  if (excl && sum != 0.f)
#pragma unroll
    for (int j = 0; j < 4; j++) wt[j] /= sum;
}
extern "C" __global__ void resize(const void* x, int x_t, float x_scale, void* y, int y_t,
                                  float y_scale, int n, int h, int wd, int c, int oh, int ow,
                                  float scale_h, float scale_w, int mode, int coord, int nearest,
                                  float cubic_a, int exclude_outside) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * c;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, c);
  int ch = p.c, ox = p.x, oy = p.y, b = p.b;
  float fy = src_coord(oy, h, oh, scale_h, coord), fx = src_coord(ox, wd, ow, scale_w, coord);
  i64 base = (i64)b * h * wd * c + ch;
  float v;
  if (mode == 0) {
    int iy = min(max((int)nearest_f(fy, nearest), 0), h - 1);
    int ix = min(max((int)nearest_f(fx, nearest), 0), wd - 1);
    v = ld(x, x_t, base + ((i64)iy * wd + ix) * c, x_scale);
  } else if (mode == 2) {
    int iy[4], ix[4];
    float wy[4], wx[4];
    cubic_taps(fy, h, cubic_a, exclude_outside, iy, wy);
    cubic_taps(fx, wd, cubic_a, exclude_outside, ix, wx);
    v = 0.f;
    for (int r = 0; r < 4; r++) {
      if (wy[r] == 0.f) continue;
      float row = 0.f;
      for (int q = 0; q < 4; q++)
        row += wx[q] * ld(x, x_t, base + ((i64)iy[r] * wd + ix[q]) * c, x_scale);
      v += wy[r] * row;
    }
  } else {
    fy = fminf(fmaxf(fy, 0.f), (float)(h - 1));
    fx = fminf(fmaxf(fx, 0.f), (float)(wd - 1));
    int y0 = (int)floorf(fy), x0 = (int)floorf(fx);
    int y1 = min(y0 + 1, h - 1), x1 = min(x0 + 1, wd - 1);
    float ly = fy - y0, lx = fx - x0;
    float v00 = ld(x, x_t, base + ((i64)y0 * wd + x0) * c, x_scale);
    float v01 = ld(x, x_t, base + ((i64)y0 * wd + x1) * c, x_scale);
    float v10 = ld(x, x_t, base + ((i64)y1 * wd + x0) * c, x_scale);
    float v11 = ld(x, x_t, base + ((i64)y1 * wd + x1) * c, x_scale);
    v = (v00 * (1.f - lx) + v01 * lx) * (1.f - ly) + (v10 * (1.f - lx) + v11 * lx) * ly;
  }
  st(y, y_t, i, v, y_scale);
}
