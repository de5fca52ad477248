// Convolution kernels for any dtype: im2col and the epilogue around the library GEMMs, direct
// convolution, and transposed convolution.

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
