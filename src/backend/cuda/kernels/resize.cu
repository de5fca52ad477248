// Resize over NHWC: nearest, linear and cubic, every ONNX coordinate mode.

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
