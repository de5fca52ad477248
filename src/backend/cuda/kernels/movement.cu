// Data movement with type conversion: strided views, gather, pad, the stems' space-to-depth
// regrouping, and concatenation.

// Strided read (transpose, slice, expand, tile, layout change, depth-to-space) with type
// conversion: y[i] = x[offset + sum_d idx_d * strides[d]], idx = i unravelled over dims
// (`ViewArgs`, common.cuh).
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

// N-d pad in stored order (`PadArgs`, common.cuh): mode 0 pads with `value`.
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
