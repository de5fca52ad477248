// What every kernel file uses: the dtype codes' loads and stores, FP8 codes, activations,
// block reductions, index arithmetic, and the argument structs the host mirrors.
//
// quantscope CUDA backend: every non-library kernel is in this folder, a family a file,
// compiled once per process with NVRTC as one program (C++17): kernel_source.rs puts this
// file first, then epi_i8.cuh, then the kernel files (the engine's unit test compiles it for
// compute_90 and compute_75 without a GPU). Tensors carry a dtype code (0 = f32, 1 = f16,
// 2 = i8 with a scale, 3 = i32, 4 = FP8 E4M3 with a scale); kernels branch on it uniformly,
// so one kernel serves every precision. Where an operand may be a constant the host
// uploaded, dtype -1 means an f32 buffer (`ldc`). Argument structs (`ViewArgs`, `NaryArgs`,
// `PadArgs`, below) are mirrored field for field in engine.rs. Linear indices are 64-bit
// wherever a tensor may pass 2^31 elements.
#include <cuda_fp16.h>

typedef long long i64;
#define QS_INF __int_as_float(0x7f800000)

// Programmatic dependent launch (sm_90 on; the host launches every kernel of these files that
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

// The strided kernels' arguments, mirrored field for field in engine.rs (its unit test checks
// their sizes): dims in stored order, innermost last, each with its FastDiv.
// `view` (movement.cu): y[i] = x[offset + sum_d idx_d * strides[d]], idx = i unravelled over
// dims.
struct ViewArgs {
  i64 dims[QS_MAX_RANK];
  i64 strides[QS_MAX_RANK];
  i64 offset;
  int rank;
  int pad_;
  FastDiv div;
};
// `nary` and `nary4` .. `nary16` (elementwise.cu): dims are y's stored dims, strides[k]
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
// `pad_nd` (movement.cu): out_dims / in_dims the stored dims, begin the pads before each axis
// (negative crops). mode: 0 constant (value), 1 reflect, 2 edge, 3 wrap.
struct PadArgs {
  i64 out_dims[QS_MAX_RANK];
  i64 in_dims[QS_MAX_RANK];
  i64 begin[QS_MAX_RANK];
  int rank;
  int mode;
  FastDiv div;
};
