// Elementwise kernels: conversions and activations (unary), and ops of up to three broadcast
// inputs with an activation fused (nary).

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
// y = act(op(in0, in1, in2)) with NumPy broadcasting over `NaryArgs` (common.cuh).
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
  // FP16 in 16-byte words: a squeeze-excite multiply writing int8 (N 16) read its FP16 input
  // 8 bytes a load through ld4.
  if ((N == 8 || N == 16) && t == 1) {
#pragma unroll
    for (int g = 0; g < N / 8; g++) {
      uint4 q = *(const uint4*)((const __half*)p + i + 8 * g);
      unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        float2 f = __half22float2(*(const __half2*)&w[j]);
        v[8 * g + 2 * j] = f.x, v[8 * g + 2 * j + 1] = f.y;
      }
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
