// Normalisations and reductions (the planner's `ops::norm`): the Reduce ops over an axis,
// Layer / Instance / Group normalisation over contiguous rows (`Step::Norm`), and softmax.

// Reductions of `ReduceOp`: 0 mean, 1 sum, 2 max, 3 min, 4 l2, 5 sum of squares, 6 product,
// 7 l1, 8 log-sum-exp. `red_comb` is how partial results combine; `red_map` what each element
// contributes (m: the row maximum, for log-sum-exp); `red_fin` the final value.
__device__ __forceinline__ int red_comb(int op) {
  return op == 2 ? 1 : op == 3 ? 2 : op == 6 ? 3 : 0;
}
__device__ __forceinline__ float red_map(int op, float v, float m) {
  switch (op) {
    case 4: case 5: return v * v;
    case 7: return fabsf(v);
    case 8: return expf(v - m);
    default: return v;
  }
}
__device__ __forceinline__ float red_fin(int op, float acc, i64 len, float m) {
  switch (op) {
    case 0: return acc / (float)len;
    case 4: return sqrtf(acc);
    case 8: return m + logf(acc);
    default: return acc;
  }
}

// [outer, len, inner] -> [outer, inner], one thread per output (inner > 1: neighbouring
// threads read neighbouring elements).
extern "C" __global__ void reduce(const void* x, int x_t, float x_scale, void* y, int y_t,
                                  float y_scale, i64 outer, i64 len, i64 inner, int op) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * inner) return;
  i64 o = i / inner, k = i - o * inner;
  i64 base = o * len * inner + k;
  float m = 0.f;
  if (op == 8) {
    m = -QS_INF;
    for (i64 j = 0; j < len; j++) m = fmaxf(m, ld(x, x_t, base + j * inner, x_scale));
  }
  int comb = red_comb(op);
  float acc = comb_init(comb);
  for (i64 j = 0; j < len; j++)
    acc = comb_f(comb, acc, red_map(op, ld(x, x_t, base + j * inner, x_scale), m));
  st(y, y_t, i, red_fin(op, acc, len, m), y_scale);
}

// [rows, len] -> [rows] (inner == 1: LayerNorm-like rows), a block per row (grid-stride over
// rows), the row reduced across the block.
extern "C" __global__ void reduce_rows(const void* x, int x_t, float x_scale, void* y, int y_t,
                                       float y_scale, i64 rows, i64 len, int op) {
  pdl_enter();
  __shared__ float sh[32];
  int comb = red_comb(op);
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    i64 base = r * len;
    float m = 0.f;
    if (op == 8) {
      float v = -QS_INF;
      for (i64 j = threadIdx.x; j < len; j += blockDim.x) v = fmaxf(v, ld(x, x_t, base + j, x_scale));
      m = block_reduce(v, 1, sh);
    }
    float acc = comb_init(comb);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x)
      acc = comb_f(comb, acc, red_map(op, ld(x, x_t, base + j, x_scale), m));
    acc = block_reduce(acc, comb, sh);
    if (threadIdx.x == 0) st(y, y_t, r, red_fin(op, acc, len, m), y_scale);
  }
}

// Normalises each contiguous row of `len` (a block per row, grid-stride over rows): mean, then
// variance of (x - mean) (two passes, as accurate as the CPU's), y = (x - mean) / sqrt(var +
// eps), then * gamma[j] + beta[j] where given (null pointers: absent).
extern "C" __global__ void norm_rows(const void* x, int x_t, float x_scale, void* y, int y_t,
                                     float y_scale, i64 rows, i64 len, float eps,
                                     const float* gamma, const float* beta) {
  pdl_enter();
  __shared__ float sh[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    i64 base = r * len;
    float s = 0.f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += ld(x, x_t, base + j, x_scale);
    float mean = block_reduce(s, 0, sh) / (float)len;
    float s2 = 0.f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      float d = ld(x, x_t, base + j, x_scale) - mean;
      s2 += d * d;
    }
    float inv = 1.f / sqrtf(block_reduce(s2, 0, sh) / (float)len + eps);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      float v = (ld(x, x_t, base + j, x_scale) - mean) * inv;
      if (gamma) v *= gamma[j];
      if (beta) v += beta[j];
      st(y, y_t, base + j, v, y_scale);
    }
  }
}

// Softmax (log_sm: LogSoftmax) over the middle axis of [outer, len, inner]; one thread per
// (outer, inner), for inner > 1.
extern "C" __global__ void softmax(const void* x, int x_t, float x_scale, void* y, int y_t,
                                   float y_scale, i64 outer, i64 len, i64 inner, int log_sm) {
  pdl_enter();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= outer * inner) return;
  i64 o = i / inner, k = i % inner;
  i64 base = o * len * inner + k;
  float m = -QS_INF;
  for (i64 j = 0; j < len; j++) m = fmaxf(m, ld(x, x_t, base + j * inner, x_scale));
  float s = 0.f;
  for (i64 j = 0; j < len; j++) s += expf(ld(x, x_t, base + j * inner, x_scale) - m);
  float ls = logf(s);
  for (i64 j = 0; j < len; j++) {
    float d = ld(x, x_t, base + j * inner, x_scale) - m;
    st(y, y_t, base + j * inner, log_sm ? d - ls : expf(d) / s, y_scale);
  }
}

// Softmax over contiguous rows (inner == 1: attention rows), a block per row (grid-stride).
extern "C" __global__ void softmax_rows(const void* x, int x_t, float x_scale, void* y, int y_t,
                                        float y_scale, i64 rows, i64 len, int log_sm) {
  pdl_enter();
  __shared__ float sh[32];
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    i64 base = r * len;
    float m = -QS_INF;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, ld(x, x_t, base + j, x_scale));
    m = block_reduce(m, 1, sh);
    float s = 0.f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += expf(ld(x, x_t, base + j, x_scale) - m);
    s = block_reduce(s, 0, sh);
    float ls = logf(s);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      float d = ld(x, x_t, base + j, x_scale) - m;
      st(y, y_t, base + j, log_sm ? d - ls : expf(d) / s, y_scale);
    }
  }
}
