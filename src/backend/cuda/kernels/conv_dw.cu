// Depthwise convolution kernels (NHWC): float and int8 taps one at a time (conv_dw4), and int8
// taps a row at a time (conv_dw_i8_k{K}s{S}).

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
                                    float a1, int pad_code) {
  pdl_enter();
  int b, oy, ox0, ch;
  if (!dw_place(n, oh, ow, c, b, oy, ox0, ch)) return;
  float acc[DW_PX][4] = {};
  int acci[DW_PX][4] = {};
  if (x_t == 2) {
    // int8: taps in groups of four, one __dp4a per channel and group. The four loaded words
    // (one per tap, four channels each) are transposed with byte permutes into one word per
    // channel (four taps each); weights come as [tap group][C][4] (zeros past the last tap).
    // The padding reads pad_code in each byte (activation centering pads with -c's code).
    const int pad4 = (int)((unsigned)(pad_code & 0xff) * 0x01010101u);
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
          xw[j][p] = ok ? *(const int*)((const signed char*)x + (row + ix) * c + ch) : pad4;
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
                                                int act, float a0, float a1, int pad_code) {
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
  // The padding's code in each byte (activation centering pads with -c's code, not 0).
  const unsigned pad4 = (unsigned)(pad_code & 0xff) * 0x01010101u;
#pragma unroll
  for (int ky = 0; ky < KW; ky++) {
    int iy = oy * S - ph + ky;
    bool row_in = iy >= 0 && iy < h;
    if (!row_in && pad4 == 0u) continue;
    const signed char* row = x + ((b * h + (row_in ? iy : 0)) * wd + ix0) * c + ch;
    unsigned col[NW * 4];
#pragma unroll
    for (int k = 0; k < NW * 4; k++) {
      bool ok = row_in && k < NCOL && (inside || (ix0 + k >= 0 && ix0 + k < wd));
      col[k] = ok ? *(const unsigned*)(row + k * c) : pad4;
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
      int oh, int ow, int ph, int pw, int act, float a0, float a1, int pad_code
#define DW_I8_ARGS                                                                             \
  x, w, alpha, bias, res, res_t, res_scale, y, y_t, y_scale, n, h, wd, c, oh, ow, ph, pw, act, \
      a0, a1, pad_code
extern "C" __global__ void conv_dw_i8_k3s1(DW_I8_PARAMS) { conv_dw_i8_body<3, 1>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k3s2(DW_I8_PARAMS) { conv_dw_i8_body<3, 2>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k5s1(DW_I8_PARAMS) { conv_dw_i8_body<5, 1>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k5s2(DW_I8_PARAMS) { conv_dw_i8_body<5, 2>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k7s1(DW_I8_PARAMS) { conv_dw_i8_body<7, 1>(DW_I8_ARGS); }
