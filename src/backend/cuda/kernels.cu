// quantscope CUDA backend: every non-GEMM kernel, compiled once per process with NVRTC.
// Tensors carry a dtype code (0 = f32, 1 = f16, 2 = i8 with a scale, 3 = i32); kernels
// branch on it uniformly, so one kernel serves every precision.
#include <cuda_fp16.h>

typedef long long i64;
#define QS_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float ld(const void* p, int t, i64 i, float scale) {
  switch (t) {
    case 0: return ((const float*)p)[i];
    case 1: return __half2float(((const __half*)p)[i]);
    case 2: return (float)((const signed char*)p)[i] * scale;
    default: return (float)((const int*)p)[i];
  }
}

__device__ __forceinline__ void st(void* p, int t, i64 i, float v, float scale) {
  switch (t) {
    case 0: ((float*)p)[i] = v; break;
    case 1: ((__half*)p)[i] = __float2half_rn(v); break;
    case 2: {
      float q = rintf(v / scale);
      q = fminf(fmaxf(q, -128.f), 127.f);
      ((signed char*)p)[i] = (signed char)q;
      break;
    }
    default: ((int*)p)[i] = (int)v; break;
  }
}

// act: 0 none, 1 relu, 2 clip(a, b), 3 sigmoid, 4 hardswish, 5 hardsigmoid(a = alpha, b = beta)
__device__ __forceinline__ float act_f(float v, int act, float a, float b) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);
    case 2: return fminf(fmaxf(v, a), b);
    case 3: return 1.f / (1.f + expf(-v));
    case 4: return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f;
    case 5: return fminf(fmaxf(a * v + b, 0.f), 1.f);
    default: return v;
  }
}

// Position of element i of an NHWC [n, oh, ow, c] tensor; with c the row length, also the
// (b, y, x) of row i / c of im2col's [n * oh * ow, c] matrix and the column within it.
struct Pos {
  int b, y, x;
  i64 c;
};
__device__ __forceinline__ Pos nhwc_pos(i64 i, int oh, int ow, i64 c) {
  Pos p;
  p.c = i % c;
  i64 t = i / c;
  p.x = t % ow;
  t /= ow;
  p.y = t % oh;
  p.b = t / oh;
  return p;
}

// Conv epilogue over an NHWC output [M, C]: raw is [M, raw_ld].
// out = act(raw * alpha[c] + bias[c] + res) stored as out_t.
extern "C" __global__ void epilogue(const void* raw, int raw_t, i64 raw_ld, const float* alpha,
                                    const float* bias, const void* res, int res_t, float res_scale,
                                    void* out, int out_t, float out_scale, i64 m, i64 c, int act,
                                    float a0, float a1) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * c) return;
  i64 r = i / c, ch = i - r * c;
  float v = ld(raw, raw_t, r * raw_ld + ch, 1.f);
  v = v * alpha[ch] + bias[ch];
  if (res_t >= 0) v += ld(res, res_t, i, res_scale);
  v = act_f(v, act, a0, a1);
  st(out, out_t, i, v, out_scale);
}

// Direct convolution, NHWC, weights [Cout, KH, KW, Cin/g] as f32 (float inputs) or i8 (i8
// inputs, exact integer accumulation), with the epilogue fused. One thread per output.
extern "C" __global__ void conv_direct(const void* x, int x_t, float x_scale, const void* w,
                                       const float* alpha, const float* bias, const void* res,
                                       int res_t, float res_scale, void* y, int y_t, float y_scale,
                                       int n, int h, int wd, int cin, int oh, int ow, int cout,
                                       int kh, int kw, int sh, int sw, int ph, int pw, int dh,
                                       int dw, int groups, int act, float a0, float a1) {
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

// im2col for NHWC: cols [M = n*oh*ow, kpad] with k = (ky*kw + kx)*cin + ci; zero padding.
// esize: element bytes (1, 2 or 4).
extern "C" __global__ void im2col(const void* x, void* cols, int esize, int n, int h, int wd,
                                  int cin, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                                  int pw, int dh, int dw, i64 kpad) {
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
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  st(y, y_t, i, act_f(ld(x, x_t, i, x_scale), act, a0, a1), y_scale);
}

// y = a (op) b, b broadcast by mode: 0 full, 1 scalar, 2 per channel, 3 per (n, c).
// layout: 0 NHWC (channel innermost), 1 plain NCHW-order. op: 0 add, 1 mul, 2 sub, 3 div.
// b_t < 0: b is an f32 constant buffer.
extern "C" __global__ void binary(const void* a, int a_t, float a_scale, const void* b, int b_t,
                                  float b_scale, int mode, void* y, int y_t, float y_scale, i64 n,
                                  i64 c, i64 hw, int layout, int op, int act, float a0, float a1) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  i64 ch, bn;
  if (layout == 0) {
    ch = i % c;
    bn = i / (c * hw);
  } else {
    ch = (i / hw) % c;
    bn = i / (c * hw);
  }
  i64 bi = mode == 0 ? i : mode == 1 ? 0 : mode == 2 ? ch : bn * c + ch;
  float va = ld(a, a_t, i, a_scale);
  float vb = b_t < 0 ? ((const float*)b)[bi] : ld(b, b_t, bi, b_scale);
  float v = op == 0 ? va + vb : op == 1 ? va * vb : op == 2 ? va - vb : va / vb;
  st(y, y_t, i, act_f(v, act, a0, a1), y_scale);
}

// General permutation of a rank <= 6 tensor with type conversion. in_strides are the input
// strides permuted into output order; out_dims the output dims.
struct Perm { i64 out_dims[6]; i64 in_strides[6]; int rank; };
extern "C" __global__ void transpose(const void* x, int x_t, float x_scale, void* y, int y_t,
                                     float y_scale, i64 n, Perm p) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  i64 rem = i, src = 0;
  for (int d = p.rank - 1; d >= 0; d--) {
    i64 idx = rem % p.out_dims[d];
    rem /= p.out_dims[d];
    src += idx * p.in_strides[d];
  }
  st(y, y_t, i, ld(x, x_t, src, x_scale), y_scale);
}

// Pooling over NHWC. kind 0 max, 1 average.
extern "C" __global__ void pool(const void* x, int x_t, float x_scale, void* y, int y_t,
                                float y_scale, int n, int h, int wd, int c, int oh, int ow, int kh,
                                int kw, int sh, int sw, int ph, int pw, int kind,
                                int count_include_pad) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * c;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, c);
  int ch = p.c, ox = p.x, oy = p.y, b = p.b;
  float acc = kind == 0 ? -QS_INF : 0.f;
  int cnt = 0;
  for (int ky = 0; ky < kh; ky++) {
    int iy = oy * sh - ph + ky;
    for (int kx = 0; kx < kw; kx++) {
      int ix = ox * sw - pw + kx;
      bool in = iy >= 0 && iy < h && ix >= 0 && ix < wd;
      if (in) {
        float v = ld(x, x_t, (((i64)b * h + iy) * wd + ix) * c + ch, x_scale);
        acc = kind == 0 ? fmaxf(acc, v) : acc + v;
        cnt++;
      } else if (count_include_pad && iy < h + ph && ix < wd + pw) {
        cnt++;
      }
    }
  }
  if (kind == 1) acc = cnt > 0 ? acc / cnt : 0.f;
  st(y, y_t, i, acc, y_scale);
}

// Global average pool over NHWC. Block: 32 channels x 32 pixel lanes, each lane summing every
// 32nd pixel, then the lanes reduced in shared memory; grid: (ceil(c / 32), n). One thread per
// channel (looping over all pixels) left most of the GPU idle on DeepLab's 65x65x2048 ASPP pool.
extern "C" __global__ void global_avg_pool(const void* x, int x_t, float x_scale, void* y,
                                           int y_t, float y_scale, int n, i64 hw, int c) {
  __shared__ float part[32][33];
  int cl = threadIdx.x & 31, lane = threadIdx.x >> 5;
  int ch = blockIdx.x * 32 + cl;
  i64 b = blockIdx.y;
  float acc = 0.f;
  if (ch < c && b < n)
    for (i64 p = lane; p < hw; p += 32) acc += ld(x, x_t, (b * hw + p) * c + ch, x_scale);
  part[lane][cl] = acc;
  __syncthreads();
  if (lane == 0 && ch < c && b < n) {
    float s = 0.f;
    for (int l = 0; l < 32; l++) s += part[l][cl];
    st(y, y_t, b * c + ch, s / (float)hw, y_scale);
  }
}

// Concat one input into the output: out[(o * total + off + j) * inner + k] = in[(o * len + j) * inner + k].
extern "C" __global__ void concat_part(const void* x, int x_t, float x_scale, void* y, int y_t,
                                       float y_scale, i64 outer, i64 len, i64 total, i64 off,
                                       i64 inner) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * len * inner) return;
  i64 k = i % inner;
  i64 t = i / inner;
  i64 j = t % len, o = t / len;
  st(y, y_t, (o * total + off + j) * inner + k, ld(x, x_t, i, x_scale), y_scale);
}

// Resize over NHWC. mode 0 nearest, 1 linear. coord: 0 half_pixel, 1 asymmetric,
// 2 align_corners, 3 pytorch_half_pixel. nearest: 0 round_prefer_floor, 1 round_prefer_ceil,
// 2 floor, 3 ceil.
__device__ float src_coord(int o, int in_len, int out_len, float scale, int coord) {
  switch (coord) {
    case 1: return o / scale;
    case 2: return out_len > 1 ? o * (float)(in_len - 1) / (float)(out_len - 1) : 0.f;
    case 3: return out_len > 1 ? (o + 0.5f) / scale - 0.5f : 0.f;
    default: return (o + 0.5f) / scale - 0.5f;
  }
}
extern "C" __global__ void resize(const void* x, int x_t, float x_scale, void* y, int y_t,
                                  float y_scale, int n, int h, int wd, int c, int oh, int ow,
                                  float scale_h, float scale_w, int mode, int coord, int nearest) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * c;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, c);
  int ch = p.c, ox = p.x, oy = p.y, b = p.b;
  float fy = src_coord(oy, h, oh, scale_h, coord), fx = src_coord(ox, wd, ow, scale_w, coord);
  i64 base = (i64)b * h * wd * c + ch;
  float v;
  if (mode == 0) {
    float ry, rx;
    switch (nearest) {
      case 1: ry = ceilf(fy - 0.5f); rx = ceilf(fx - 0.5f); if (fy - floorf(fy) != 0.5f) { ry = rintf(fy); } if (fx - floorf(fx) != 0.5f) { rx = rintf(fx); } break;
      case 2: ry = floorf(fy); rx = floorf(fx); break;
      case 3: ry = ceilf(fy); rx = ceilf(fx); break;
      default: ry = (fy - floorf(fy) == 0.5f) ? floorf(fy) : rintf(fy); rx = (fx - floorf(fx) == 0.5f) ? floorf(fx) : rintf(fx); break;
    }
    int iy = min(max((int)ry, 0), h - 1), ix = min(max((int)rx, 0), wd - 1);
    v = ld(x, x_t, base + ((i64)iy * wd + ix) * c, x_scale);
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

// Softmax over the middle axis of [outer, len, inner]; one thread per (outer, inner).
extern "C" __global__ void softmax(const void* x, int x_t, float x_scale, void* y, int y_t,
                                   float y_scale, i64 outer, i64 len, i64 inner) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * inner) return;
  i64 o = i / inner, k = i % inner;
  i64 base = o * len * inner + k;
  float m = -QS_INF;
  for (i64 j = 0; j < len; j++) m = fmaxf(m, ld(x, x_t, base + j * inner, x_scale));
  float s = 0.f;
  for (i64 j = 0; j < len; j++) s += expf(ld(x, x_t, base + j * inner, x_scale) - m);
  for (i64 j = 0; j < len; j++)
    st(y, y_t, base + j * inner, expf(ld(x, x_t, base + j * inner, x_scale) - m) / s, y_scale);
}

// Constant padding over NHWC (spatial pads only).
extern "C" __global__ void pad_nhwc(const void* x, int x_t, float x_scale, void* y, int y_t,
                                    float y_scale, int n, int h, int wd, int c, int oh, int ow,
                                    int top, int left, float value) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 total = (i64)n * oh * ow * c;
  if (i >= total) return;
  Pos p = nhwc_pos(i, oh, ow, c);
  int ch = p.c, ox = p.x, oy = p.y, b = p.b;
  int iy = oy - top, ix = ox - left;
  float v = value;
  if (iy >= 0 && iy < h && ix >= 0 && ix < wd) v = ld(x, x_t, (((i64)b * h + iy) * wd + ix) * c + ch, x_scale);
  st(y, y_t, i, v, y_scale);
}
