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
// act_f with ACT known, but SiLU through the flush-to-zero forms of ex2 and rcp: without
// `.ftz` each takes a range test and two scalings for denormals, which an FP16 output rounds
// to the same value (below FP16's least subnormal, 6e-8, either way).
template <int ACT>
__device__ __forceinline__ float dw_act(float v, float a0, float a1) {
  if (ACT != 24) return act_f(v, ACT, a0, a1);
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return v * r;
}
// The FP16 output of a thread's sums with activation ACT known at compile time and no
// residual: EfficientNets' depthwise outputs (SiLU) feed a squeeze-excite pool in float.
// Through conv_direct's epilogue, each of the 16 values of a thread's outputs took the
// activation's switch, and each store st4's reciprocal of a scale FP16 does not use; on
// EfficientNet-B0 at batch 32 that made the depthwise kernels instruction-bound.
template <int ACT>
__device__ __forceinline__ void dw_store_f16(const int acc[DW_PX][4], int np, int o0, int c,
                                             float4 al, float4 bi, __half* y, float a0,
                                             float a1) {
#pragma unroll
  for (int p = 0; p < DW_PX; p++) {
    if (p >= np) break;
    float v0 = dw_act<ACT>((float)acc[p][0] * al.x + bi.x, a0, a1);
    float v1 = dw_act<ACT>((float)acc[p][1] * al.y + bi.y, a0, a1);
    float v2 = dw_act<ACT>((float)acc[p][2] * al.z + bi.z, a0, a1);
    float v3 = dw_act<ACT>((float)acc[p][3] * al.w + bi.w, a0, a1);
    __half2 lo = __floats2half2_rn(v0, v1), hi = __floats2half2_rn(v2, v3);
    uint2 raw;
    raw.x = *(unsigned int*)&lo;
    raw.y = *(unsigned int*)&hi;
    *(uint2*)(y + o0 + p * c) = raw;
  }
}
// The depthwise kernels' epilogue over a thread's exact int32 sums (int8 input) of `np`
// outputs along x, DW_PX at most, the first at element offset o0 of y (channels ch .. ch + 3):
// the int8 epilogue where it applies; FP16 with no residual and the usual activations
// through dw_store_f16; else conv_direct's (any output type, activation and residual).
__device__ __forceinline__ void dw_epilogue_i32(const int acc[DW_PX][4], int np, int o0, int c,
                                                int ch, const float* alpha, const float* bias,
                                                const void* res, int res_t, float res_scale,
                                                void* y, int y_t, float y_scale, int act,
                                                float a0, float a1) {
  if (y_t == 1 && res_t < 0) {
    float4 al = *(const float4*)(alpha + ch), bi = *(const float4*)(bias + ch);
    __half* yh = (__half*)y;
    switch (act) {
      case 0: dw_store_f16<0>(acc, np, o0, c, al, bi, yh, a0, a1); return;
      case 1: dw_store_f16<1>(acc, np, o0, c, al, bi, yh, a0, a1); return;
      case 2: dw_store_f16<2>(acc, np, o0, c, al, bi, yh, a0, a1); return;
      case 4: dw_store_f16<4>(acc, np, o0, c, al, bi, yh, a0, a1); return;
      case 24: dw_store_f16<24>(acc, np, o0, c, al, bi, yh, a0, a1); return;
      default: break;
    }
  }
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
// The index unravels through `f` (the host's FastDiv of [c / 4, ceil(ow / DW_PX), oh]): three
// signed 32-bit divisions were about 90 of a row kernel's 811 instructions a thread.
__device__ __forceinline__ bool dw_place(int n, int oh, int ow, int c, const FastDiv& f, int& b,
                                         int& oy, int& ox0, int& ch) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned c4 = c >> 2, owp = (ow + DW_PX - 1) / DW_PX;
  if (i >= (unsigned)n * oh * owp * c4) return false;
  unsigned q = f.magic[0] ? __umulhi(i, f.magic[0]) >> f.shift[0] : i;
  ch = (int)(i - q * c4) * 4;
  unsigned t = f.magic[1] ? __umulhi(q, f.magic[1]) >> f.shift[1] : q;
  ox0 = (int)(q - t * owp) * DW_PX;
  unsigned bb = f.magic[2] ? __umulhi(t, f.magic[2]) >> f.shift[2] : t;
  oy = (int)(t - bb * oh);
  b = (int)bb;
  return true;
}
extern "C" __global__ void conv_dw4(const void* x, int x_t, const void* w, const float* alpha,
                                    const float* bias, const void* res, int res_t,
                                    float res_scale, void* y, int y_t, float y_scale, int n,
                                    int h, int wd, int c, int oh, int ow, int kh, int kw, int sh,
                                    int sw, int ph, int pw, int dh, int dw, int act, float a0,
                                    float a1, int pad_code, FastDiv div) {
  pdl_enter();
  int b, oy, ox0, ch;
  if (!dw_place(n, oh, ow, c, div, b, oy, ox0, ch)) return;
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
                                                int act, float a0, float a1, int pad_code,
                                                const FastDiv& div) {
  pdl_enter();
  constexpr int TG = (KW + 3) / 4;
  constexpr int NCOL = (DW_PX - 1) * S + KW;
  // Words a channel's columns take, covering the last window's last byte.
  constexpr int NW = ((DW_PX - 1) * S + 4 * TG + 3) / 4;
  int b, oy, ox0, ch;
  if (!dw_place(n, oh, ow, c, div, b, oy, ox0, ch)) return;
  const int ix0 = ox0 * S - pw;
  // Each column's byte offset in a row, clamped into the row so that every load is in
  // bounds, and which columns are inside it: the same for all KW rows. Outside columns and
  // rows take the padding after the load (a select): with the loads conditional, each was a
  // branch of its own, about 20 instructions, and the loads were most of a thread's work.
  int coff[NCOL];
  unsigned cols_in = 0;
#pragma unroll
  for (int k = 0; k < NCOL; k++) {
    int ix = ix0 + k;
    cols_in |= (unsigned)(ix >= 0 && ix < wd) << k;
    coff[k] = min(max(ix, 0), wd - 1) * c;
  }
  int acc[DW_PX][4] = {};
  // The padding's code in each byte (activation centering pads with -c's code, not 0).
  const unsigned pad4 = (unsigned)(pad_code & 0xff) * 0x01010101u;
#pragma unroll
  for (int ky = 0; ky < KW; ky++) {
    int iy = oy * S - ph + ky;
    bool row_in = iy >= 0 && iy < h;
    if (!row_in && pad4 == 0u) continue;
    const unsigned in = row_in ? cols_in : 0u;
    const signed char* row = x + (b * h + min(max(iy, 0), h - 1)) * wd * c + ch;
    unsigned col[NW * 4];
#pragma unroll
    for (int k = 0; k < NW * 4; k++) {
      unsigned v = k < NCOL ? __ldg((const unsigned*)(row + coff[k < NCOL ? k : 0])) : 0u;
      col[k] = k < NCOL && (in >> k & 1u) ? v : pad4;
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
      int oh, int ow, int ph, int pw, int act, float a0, float a1, int pad_code, FastDiv div
#define DW_I8_ARGS                                                                             \
  x, w, alpha, bias, res, res_t, res_scale, y, y_t, y_scale, n, h, wd, c, oh, ow, ph, pw, act, \
      a0, a1, pad_code, div
extern "C" __global__ void conv_dw_i8_k3s1(DW_I8_PARAMS) { conv_dw_i8_body<3, 1>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k3s2(DW_I8_PARAMS) { conv_dw_i8_body<3, 2>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k5s1(DW_I8_PARAMS) { conv_dw_i8_body<5, 1>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k5s2(DW_I8_PARAMS) { conv_dw_i8_body<5, 2>(DW_I8_ARGS); }
extern "C" __global__ void conv_dw_i8_k7s1(DW_I8_PARAMS) { conv_dw_i8_body<7, 1>(DW_I8_ARGS); }

// Int8 depthwise convolution through shared memory, any kernel size, stride and dilation:
// a block takes a tile of toh x tow outputs of one image and a slab of cg channel groups
// (four channels each), copies the input window the tile reads (the padding as pad_code) and
// the slab's weights into shared memory once, then each thread computes four channels of its
// outputs from there, a group of four taps at a time (__dp4a, weights [ceil(KH * KW / 4)][C]
// [4] as conv_dw4's, whose tap offsets in the window the block also keeps). Where the row
// kernels give each thread four outputs along x, this one spreads a tile's outputs over the
// block: on an H200 the builder took it for 13 of EfficientNet-B0's 16 depthwise layers at
// batch 1 (grids of a few hundred blocks), and the row kernel for all 16 at batch 32.
// Shared memory: int4 tap offsets [tg], int4 weights [tg][cg], words [tih][tiw][cg] (the host
// sizes the tile, under 48 KiB). Threads past (blockDim / cg) * cg idle. Blocks: (image, tile
// row, tile column, slab), the slab fastest. 256 threads, at most 48 registers so that five
// blocks fit an SM (53 unbounded, four blocks; 40 spilled).
extern "C" __global__ void __launch_bounds__(256, 5)
    conv_dw_i8_tile(const signed char* x, const int* w, const float* alpha, const float* bias,
                    const void* res, int res_t, float res_scale, void* y, int y_t,
                    float y_scale, int n, int h, int wd, int c, int oh, int ow, int kh, int kw,
                    int sh, int sw, int ph, int pw, int dh, int dw, int act, float a0, float a1,
                    int pad_code, int toh, int tow, int cg) {
  extern __shared__ __align__(16) unsigned char dwt_smem[];
  pdl_trigger();
  const int taps = kh * kw, tg = (taps + 3) >> 2, c4 = c >> 2;
  const int tih = (toh - 1) * sh + (kh - 1) * dh + 1, tiw = (tow - 1) * sw + (kw - 1) * dw + 1;
  int4* toff = (int4*)dwt_smem;
  int4* wt = toff + tg;
  unsigned* tile = (unsigned*)(wt + tg * cg);
  const int slabs = (c4 + cg - 1) / cg, tiles_x = (ow + tow - 1) / tow;
  const int tiles_y = (oh + toh - 1) / toh;
  int bi = blockIdx.x;
  const int g0 = (bi % slabs) * cg;
  bi /= slabs;
  const int ox0 = (bi % tiles_x) * tow;
  bi /= tiles_x;
  const int oy0 = (bi % tiles_y) * toh, b = bi / tiles_y;
  // Constants first, while the kernel before this one finishes (programmatic launch): each
  // tap's word offset in the window (0 past the last tap, whose weights are 0), the weights.
  for (int i = threadIdx.x; i < tg * 4; i += blockDim.x) {
    int ky = i / kw, kx = i - ky * kw;
    ((int*)toff)[i] = i < taps ? (ky * dh * tiw + kx * dw) * cg : 0;
  }
  for (int i = threadIdx.x; i < tg * cg; i += blockDim.x) {
    int t = i / cg, gg = g0 + i - t * cg;
    wt[i] = gg < c4 ? *(const int4*)(w + (t * c4 + gg) * 4) : make_int4(0, 0, 0, 0);
  }
  pdl_wait();
  // The window, in runs of cg words (a pixel's slab), four pixels a thread at a time so their
  // loads are in flight together. A thread keeps its channel group; its pixels step by np.
  const int np = blockDim.x / cg, gl = threadIdx.x % cg, p0 = threadIdx.x / cg;
  const int iy0 = oy0 * sh - ph, ix0 = ox0 * sw - pw, npix = tih * tiw;
  const unsigned pad4 = (unsigned)(pad_code & 0xff) * 0x01010101u;
  const bool g_ok = g0 + gl < c4;
  if (p0 < np) {
    int r = p0 / tiw, col = p0 - (p0 / tiw) * tiw;
    for (int p = p0; p < npix; p += 4 * np) {
      unsigned v[4];
#pragma unroll
      for (int k = 0; k < 4; k++) {
        int iy = iy0 + r, ix = ix0 + col;
        bool in = iy >= 0 && iy < h && ix >= 0 && ix < wd;
        v[k] = !g_ok ? 0u
               : in  ? *(const unsigned*)(x + ((b * h + iy) * wd + ix) * c + (g0 + gl) * 4)
                     : pad4;
        col += np;
        while (col >= tiw) {
          col -= tiw;
          r++;
        }
      }
#pragma unroll
      for (int k = 0; k < 4; k++) {
        if (p + k * np < npix) tile[(p + k * np) * cg + gl] = v[k];
      }
    }
  }
  __syncthreads();
  if (p0 >= np || !g_ok) return;
  const int ch = (g0 + gl) * 4;
  for (int p = p0; p < toh * tow; p += np) {
    int oyl = p / tow, oxl = p - oyl * tow, oy = oy0 + oyl, ox = ox0 + oxl;
    if (oy >= oh || ox >= ow) continue;
    const unsigned* base = tile + (oyl * sh * tiw + oxl * sw) * cg + gl;
    int acc[DW_PX][4] = {};
    for (int t = 0; t < tg; t++) {
      int4 o = toff[t], wq = wt[t * cg + gl];
      unsigned x0 = base[o.x], x1 = base[o.y], x2 = base[o.z], x3 = base[o.w];
      // Four taps' words (four channels each) into one word per channel (four taps each).
      unsigned a = __byte_perm(x0, x1, 0x5140), bb = __byte_perm(x0, x1, 0x7362);
      unsigned cc = __byte_perm(x2, x3, 0x5140), d = __byte_perm(x2, x3, 0x7362);
      acc[0][0] = __dp4a((int)__byte_perm(a, cc, 0x5410), wq.x, acc[0][0]);
      acc[0][1] = __dp4a((int)__byte_perm(a, cc, 0x7632), wq.y, acc[0][1]);
      acc[0][2] = __dp4a((int)__byte_perm(bb, d, 0x5410), wq.z, acc[0][2]);
      acc[0][3] = __dp4a((int)__byte_perm(bb, d, 0x7632), wq.w, acc[0][3]);
    }
    dw_epilogue_i32(acc, 1, ((b * oh + oy) * ow + ox) * c + ch, c, ch, alpha, bias, res, res_t,
                    res_scale, y, y_t, y_scale, act, a0, a1);
  }
}
