// Pointwise (1x1) int8 convolution and Gemm / MatMul on __dp4a: a thread per pixel
// (conv_pw_i8) or per output word (conv_pw_i8_word), and a warp per four output channels of
// a few rows (conv_pw_i8_gemv).

// One output word of the pointwise kernels (conv_pw_i8_word's, conv_pw_i8_gemv's): channels
// c .. c + 3 of the output at element `at`, from their int32 sums s, through the int8
// epilogue where it applies, else the generic conversions (conv_pw_i8 runs the same two
// paths, chosen once for its PW_CO channels).
__device__ __forceinline__ void pw_store_word(int4 s, i64 at, int c, const float* alpha,
                                              const float* bias, const void* res, int res_t,
                                              float res_scale, void* y, int y_t, float y_scale,
                                              int act, float a0, float a1) {
  if (epi_i8_ok(y_t, res_t, act)) {
    unsigned r = res_t == 2 ? *(const unsigned*)((const signed char*)res + at) : 0u;
    *(unsigned*)((signed char*)y + at) =
        epi_i8_word(epi_i8(alpha, bias, c, res_scale, y_scale, act, a0, a1), s, r);
    return;
  }
  float4 al = *(const float4*)(alpha + c), bi = *(const float4*)(bias + c);
  float4 r = res_t >= 0 ? ld4(res, res_t, at, res_scale) : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 v = make_float4(act_f(s.x * al.x + bi.x + r.x, act, a0, a1),
                         act_f(s.y * al.y + bi.y + r.y, act, a0, a1),
                         act_f(s.z * al.z + bi.z + r.z, act, a0, a1),
                         act_f(s.w * al.w + bi.w + r.w, act, a0, a1));
  st4(y, y_t, at, v, y_scale);
}

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
  pw_store_word(make_int4(a0c, a1c, a2c, a3c), (i64)i * 4, 4 * g, alpha, bias, res, res_t,
                res_scale, y, y_t, y_scale, act, a0, a1);
}

// Int8 1x1 conv or Gemm / MatMul rows of at most GV_MAX_M output pixels (a classifier at
// batch 1 to 4, the squeeze-excitation convs of a pooled vector) as a weight-streaming GEMV on
// __dp4a, conv_pw_i8's epilogue. Such a layer is its weights' bytes: ResNet-50's fc at batch
// 1 is 2 MB of weights for 2 M multiply-adds, and the tensor-core kernels ran it on 16
// tiles of 64 channels, 16 SMs streaming 128 KB each in 64-byte stages (10.3 us in an engine's
// run on an H200). Here each warp computes four output channels (whole epilogue words) for
// every row: its lanes read the four weight rows in coalesced V-byte pieces (16, or 4 where k
// is no multiple of 16: the squeezed side of a squeeze-excitation), GV_UNROLL warp-wide steps
// of each row in flight, so that every block's weights are requested at once. The first
// weights load before the programmatic-launch wait (constants: the copy overlaps the kernel
// before), the rows after it. The partial sums are reduced across the warp (exact int32), and
// lane r writes row r. Each row costs its reads of x from L2 and its __dp4a: on an H200 a
// version taking 32 rows (8 at a time) ran ResNet-50's fc at batch 32 in 31 us against 7 on
// the tensor cores, and EfficientNet-B0's squeeze-excitation convs 4-10x slower than the
// fastest candidate; at batch 1 it is the fastest or within 0.2 us of it. Weights int8
// [cout][k] row-major; k % 4 == 0, cout % 4 == 0, m <= GV_MAX_M, m * k and m * cout < 2^31;
// grid ceil(cout / (4 * GV_THREADS / 32)), GV_THREADS threads (eight blocks an SM in the
// launch bounds: without them ptxas spilled a few bytes for sm_90a).
#define GV_MAX_M 4
#define GV_THREADS 64
#define GV_UNROLL 4
// V bytes at p (16-byte or 4-byte aligned) as an int4, zeros past them.
template <int V>
__device__ __forceinline__ int4 gv_load(const signed char* p) {
  if (V == 16) return __ldg((const int4*)p);
  return make_int4(__ldg((const int*)p), 0, 0, 0);
}
template <int V>
__device__ __forceinline__ void gv_dot(int& acc, int4 a, int4 b) {
  acc = __dp4a(a.x, b.x, acc);
  if (V == 16) {
    acc = __dp4a(a.y, b.y, acc);
    acc = __dp4a(a.z, b.z, acc);
    acc = __dp4a(a.w, b.w, acc);
  }
}
// The sums of this lane's pieces for rows 0 .. m - 1 and channels c0 .. c0 + 3 (`live`: c0 is
// inside cout), the weights' first step requested before the programmatic-launch wait.
template <int V>
__device__ __forceinline__ void gv_sums(int (&acc)[GV_MAX_M][4], const signed char* x,
                                        const signed char* wr, bool live, int m, int k,
                                        int lane) {
  constexpr int STEP = 32 * V;
  int4 wv[GV_UNROLL][4];
  // The weights of steps base .. base + GV_UNROLL (zero past k or past cout).
  auto load_w = [&](int base) {
#pragma unroll
    for (int u = 0; u < GV_UNROLL; u++) {
      const int kk = base + u * STEP + lane * V;
#pragma unroll
      for (int j = 0; j < 4; j++)
        wv[u][j] = live && kk < k ? gv_load<V>(wr + (i64)j * k + kk) : make_int4(0, 0, 0, 0);
    }
  };
  load_w(0);
  pdl_wait();
  for (int base = 0; base < k; base += GV_UNROLL * STEP) {
#pragma unroll
    for (int u = 0; u < GV_UNROLL; u++) {
      const int kk = base + u * STEP + lane * V;
      if (kk >= k) break;
#pragma unroll
      for (int r = 0; r < GV_MAX_M; r++) {
        if (r >= m) break;
        const int4 a = gv_load<V>(x + (i64)r * k + kk);
#pragma unroll
        for (int j = 0; j < 4; j++) gv_dot<V>(acc[r][j], a, wv[u][j]);
      }
    }
    if (base + GV_UNROLL * STEP < k) load_w(base + GV_UNROLL * STEP);
  }
}
extern "C" __global__ void __launch_bounds__(GV_THREADS, 8)
    conv_pw_i8_gemv(const signed char* x, const signed char* w, const float* alpha,
                    const float* bias, const void* res, int res_t, float res_scale, void* y,
                    int y_t, float y_scale, int m, int k, int cout, int act, float a0,
                    float a1) {
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int c0 = (blockIdx.x * (GV_THREADS / 32) + (threadIdx.x >> 5)) * 4;
  const bool live = c0 < cout;
  const signed char* wr = w + (i64)(live ? c0 : 0) * k;
  int acc[GV_MAX_M][4];
#pragma unroll
  for (int r = 0; r < GV_MAX_M; r++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[r][j] = 0;
  if ((k & 15) == 0)
    gv_sums<16>(acc, x, wr, live, m, k, lane);
  else
    gv_sums<4>(acc, x, wr, live, m, k, lane);
  // Every lane ends with the warp's totals; lane r keeps row r's (selects, not a register
  // array indexed by the lane, which would go through local memory).
  int4 s = make_int4(0, 0, 0, 0);
#pragma unroll
  for (int r = 0; r < GV_MAX_M; r++) {
    if (r >= m) break;
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
    if (lane == r) s = make_int4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
  }
  if (!live || lane >= m) return;
  pw_store_word(s, (i64)lane * cout + c0, c0, alpha, bias, res, res_t, res_scale, y, y_t,
                y_scale, act, a0, a1);
}
