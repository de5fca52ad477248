// Pooling over NHWC: max and average windows, max pooling on raw 16-byte vectors, and the
// global average pool.

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
