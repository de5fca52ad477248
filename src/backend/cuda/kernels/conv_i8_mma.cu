// Int8 convolution on the int8 tensor cores (mma.sync m16n8k32): the implicit GEMM
// (conv_i8_mma), the stems' row kernel (conv_i8_rows) and the streaming 1x1 kernels
// (conv_i8_mmas). Needs sm_80; older targets compile the entry points as traps.

// Int8 convolution (groups 1, any kernel, stride, padding and dilation), and Gemm / MatMul
// as a 1x1 one, as an implicit GEMM on the int8 tensor cores: mma.sync m16n8k32 (exact
// int32 sums, as __dp4a's), then the pointwise kernels' epilogue. x int8 NHWC [n, h, wd,
// cin] (or rows [m, cin]); weights int8 OHWI rows [cout rounded up to MMA_BN][kpad = kh * kw * cin rounded
// up to MMA_BK], zero past the reduction and cout. A block computes BM output pixels (MMA_BM,
// or half that in conv_i8_mma64) by MMA_BN channels, its four warps BM / 2 x 32 each. The x
// and weight tiles go through shared
// memory in MMA_STAGES cp.async stages of MMA_BK bytes of the reduction, each 16-byte piece
// of an x row one tap's channels (cin % 16 == 0), zero-filled outside the input; rows are
// padded to MMA_LD bytes so that each 8-row phase of ldmatrix hits distinct banks. The sums
// are staged in shared memory again so that the epilogue reads the residual and writes the
// output four channels a thread, 16 threads a row. On an H200, ResNet-50's memory-bound 1x1
// layers at batch 32 (k 64 to 128, the residual and ReLU fused) took cuBLASLt's int8 GEMM
// with its own epilogue longer than its FP16 GEMM with twice the bytes, and the __dp4a
// kernels longer still; this kernel takes 34 us where cuBLASLt takes 59 on layer1's
// 64 -> 256 expansions (27 on conv_i8_mmas, below, which streams pixel tiles), and 69 us where
// cuDNN's int8 graph took 122 on the regrouped stem.
// cuDNN's int8 graph convs stay about twice as fast on the 3x3 layers and most reductions
// (the builder times them all). cout % 4 == 0; grid (cout_pad / MMA_BN, ceil(m / BM)),
// MMA_THREADS threads, so the blocks sharing a tile of x run together. Needs sm_80 (cp.async,
// the int8 m16n8k32 shape); the host offers it from there.
//
// Shared memory is dynamic (mma_smem_bytes on the host): the stages, then the block's 64
// alphas and biases, then (where the launch gives it room) its BM x 64 tile of an int8
// residual. Those two are copied with the first stage, so the epilogue reads them from
// shared memory. Read from global memory after the main loop, their latency came once a
// block for alpha and bias and once every MMA_EPI_ROWS rows for the residual, after all of
// the block's tensor-core work: a 1x1 layer of reduction 64 has one stage of it. ResNet-50's
// layer1 expansions at batch 32 on an H200 issued 2 instructions a cycle an SM and used a
// quarter of the DRAM bandwidth (Nsight Compute), a third of their warps' stalls waiting on
// those loads; they went from 38 to 34 us.
#define MMA_BM 128
#define MMA_BN 64
#define MMA_BK 64
#define MMA_LD (MMA_BK + 16)
#define MMA_STAGES 3
#define MMA_THREADS 128
#define MMA_OUT_LD (MMA_BN + 8)
#define MMA_EPI_ROWS 8
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool full) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(full ? 16 : 0));
}
__device__ __forceinline__ void ldsm_x4(unsigned r[4], const void* p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void mma_s8(int d[4], const unsigned a[4], const unsigned b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// A block's MMA_BN alphas and biases from channel n0 into shared memory (the first 32 threads
// a 16-byte copy each; channels past cout, a multiple of 4, zero-filled by a copy of 0 bytes
// from the array's start).
__device__ __forceinline__ void copy_alpha_bias(float* s_al, float* s_bi, const float* alpha,
                                                const float* bias, int n0, int cout) {
  const int tid = threadIdx.x;
  if (tid < 2 * MMA_BN / 4) {
    const int q = tid & (MMA_BN / 4 - 1), cc = n0 + 4 * q;
    const float* src = tid < MMA_BN / 4 ? alpha : bias;
    cp_async16((tid < MMA_BN / 4 ? s_al : s_bi) + 4 * q, src + (cc < cout ? cc : 0), cc < cout);
  }
}
// A warp's MI 16-row fragments by four 8-column tiles of int32 sums, zeroed.
template <int MI>
__device__ __forceinline__ void zero_acc(int (&acc)[MI][4][4]) {
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0;
}
// One 32-byte step of the reduction for a warp's MI 16-row fragments by 32 columns (four
// 8-column tiles): the A rows at sa, lda bytes apart, and the B rows (the output channels) at
// sb, ldb bytes apart, both already at the step's offset, through ldmatrix into m16n8k32.
template <int MI>
__device__ __forceinline__ void mma_k32(int (&acc)[MI][4][4], const unsigned char* sa, int lda,
                                        const unsigned char* sb, int ldb, int lane) {
  unsigned af[MI][4], bf[4][2];
#pragma unroll
  for (int i = 0; i < MI; i++)
    ldsm_x4(af[i], sa + (i * 16 + (lane & 15)) * lda + (lane >> 4) * 16);
#pragma unroll
  for (int j = 0; j < 2; j++) {
    unsigned r[4];
    ldsm_x4(r, sb + (j * 16 + ((lane >> 4) << 3) + (lane & 7)) * ldb + ((lane >> 3) & 1) * 16);
    bf[2 * j][0] = r[0];
    bf[2 * j][1] = r[1];
    bf[2 * j + 1][0] = r[2];
    bf[2 * j + 1][1] = r[3];
  }
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) mma_s8(acc[i][j], af[i], bf[j]);
}
#endif
// The tensor-core kernels' epilogue: the block's int32 sums, staged in shared memory `so`
// (MMA_OUT_LD a row) for `rows` output pixels from m0 by MMA_BN channels from n0, with the
// alphas and biases (and, with `res_smem`, the int8 residual tile) the block copied into
// shared memory, to the output; by MMA_THREADS threads, this one `tid` of them (a block of
// twice the threads runs it on two 64-channel halves).
#define MMA_EPI_PARAMS                                                                       \
  const void *res, int res_t, float res_scale, void *y, int y_t, float y_scale, int cout,   \
      int act, float a0, float a1
#define MMA_EPI_ARGS res, res_t, res_scale, y, y_t, y_scale, cout, act, a0, a1
// The int8 epilogue's rows (below): this thread's words of channels cl .. cl + 3 in rows r0,
// r0 + row_step, ..., yp and rp (with RES) at row r0, step bytes a row_step rows.
template <int EA, bool RES>
__device__ __forceinline__ void mma_epi_i8_rows(const EpiI8& e, const int* so,
                                                const unsigned char* s_res, bool res_smem,
                                                int rows, int r0, int cl, unsigned* yp,
                                                const unsigned* rp, i64 step) {
  constexpr int row_step = MMA_THREADS / (MMA_BN / 4);
#pragma unroll 1
  for (int rb = r0; rb < rows; rb += row_step * MMA_EPI_ROWS) {
    unsigned rq[MMA_EPI_ROWS];
    if (RES) {
#pragma unroll
      for (int i = 0; i < MMA_EPI_ROWS; i++) {
        const int r = rb + i * row_step;
        rq[i] = res_smem ? *(const unsigned*)(s_res + r * MMA_BN + cl) : r < rows ? *rp : 0u;
        rp = (const unsigned*)((const signed char*)rp + step);
      }
    }
#pragma unroll
    for (int i = 0; i < MMA_EPI_ROWS; i++) {
      int r = rb + i * row_step;
      if (r >= rows) break;
      *yp = epi_i8_word_as<EA, RES>(e, *(const int4*)&so[r * MMA_OUT_LD + cl],
                                    RES ? rq[i] : 0u);
      yp = (unsigned*)((signed char*)yp + step);
    }
  }
}
__device__ __forceinline__ void mma_epilogue(const int tid, const int* so, const float* s_al,
                                             const float* s_bi, const unsigned char* s_res,
                                             bool res_smem, int m0, int rows, int n0,
                                             MMA_EPI_PARAMS) {
  // A thread's four channels are the same in every row it writes (MMA_THREADS is a multiple
  // of MMA_BN / 4): their alpha and bias are read once. On the int8 path the residual reads
  // of MMA_EPI_ROWS rows go out together before any store (the output may alias the
  // residual as far as the compiler knows, so it would not move a read above a store itself).
  const int cl = (tid % (MMA_BN / 4)) * 4, c = n0 + cl, r0 = tid / (MMA_BN / 4);
  const int row_step = MMA_THREADS / (MMA_BN / 4);
  if (c >= cout) return;
  if (epi_i8_ok(y_t, res_t, act)) {
    const EpiI8 e = epi_i8(s_al, s_bi, cl, res_scale, y_scale, act, a0, a1);
    // The output and residual words step by row_step rows: pointer increments, not a 64-bit
    // row * cout product a word (several instructions a word in the SASS).
    const i64 step = (i64)row_step * cout, at = (i64)(m0 + r0) * cout + c;
    unsigned* yp = (unsigned*)((signed char*)y + at);
    const unsigned* rp = (const unsigned*)((const signed char*)res + (res_t == 2 ? at : 0));
    // One loop for each activation and residual, chosen once.
#define QS_EPI_ROWS(EA)                                                                \
  if (res_t == 2)                                                                      \
    mma_epi_i8_rows<EA, true>(e, so, s_res, res_smem, rows, r0, cl, yp, rp, step);   \
  else                                                                                 \
    mma_epi_i8_rows<EA, false>(e, so, s_res, res_smem, rows, r0, cl, yp, rp, step);
    switch (e.kind) {
      case EPI_SILU: QS_EPI_ROWS(EPI_SILU) break;
      case EPI_HSWISH: QS_EPI_ROWS(EPI_HSWISH) break;
      default: QS_EPI_ROWS(EPI_LINEAR)
    }
#undef QS_EPI_ROWS
    return;
  }
  // Every other output, residual and activation (float outputs of layers that feed float
  // ops, mostly), through the generic conversions. As on the int8 path, a batch of rows'
  // residuals is read before any of their stores: read and stored a row at a time, each row
  // waited a memory latency: ResNet-50's last conv (FP16 output for the pool, int8
  // residual) took 19-26 us on these kernels at batch 32 on an H200, where its int8-output
  // twins took 10 (before this change; the builder still keeps cuBLASLt's 18.6 us there).
  const float4 al = *(const float4*)(s_al + cl), bi = *(const float4*)(s_bi + cl);
#pragma unroll 1
  for (int rb = r0; rb < rows; rb += row_step * MMA_EPI_ROWS) {
    float4 rs[MMA_EPI_ROWS];
#pragma unroll
    for (int i = 0; i < MMA_EPI_ROWS; i++) {
      const int r = rb + i * row_step;
      if (res_t < 0 || r >= rows) {
        rs[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      } else if (res_smem) {
        const char4 q = *(const char4*)(s_res + r * MMA_BN + cl);
        rs[i] = make_float4(q.x * res_scale, q.y * res_scale, q.z * res_scale, q.w * res_scale);
      } else {
        rs[i] = ld4(res, res_t, (i64)(m0 + r) * cout + c, res_scale);
      }
    }
#pragma unroll
    for (int i = 0; i < MMA_EPI_ROWS; i++) {
      const int r = rb + i * row_step;
      if (r >= rows) break;
      const int4 s = *(const int4*)&so[r * MMA_OUT_LD + cl];
      const float4 v = make_float4(act_f(s.x * al.x + bi.x + rs[i].x, act, a0, a1),
                                   act_f(s.y * al.y + bi.y + rs[i].y, act, a0, a1),
                                   act_f(s.z * al.z + bi.z + rs[i].z, act, a0, a1),
                                   act_f(s.w * al.w + bi.w + rs[i].w, act, a0, a1));
      st4(y, y_t, (i64)(m0 + r) * cout + c, v, y_scale);
    }
  }
}

// A global average pool fused into an implicit GEMM conv (`ConvStep::pool_hw` on the host):
// the conv's output is read by the pool alone, so it is never stored. Its tiles then hold
// one image each (`gap_tile_rows`): an image of hw pixels in ceil(hw / BM) tiles, the rows
// past its end computed and left out. The epilogue sums the tile's rows; an image in one
// tile is averaged into y ([n, cout], any type) there and then. An image in several has each
// tile's sums go to part[tile * cout + channel] (tile: blockIdx.y), and the last of its tiles
// to finish (a count for every column of tiles and image, count[blockIdx.x * n + image], which
// that block resets for the next launch) averages them, in tile order. No float atomics: the
// same input gives the same codes every run. With tiles that straddled images, every block
// of ResNet-50's 7x7 images in 64-pixel tiles waited on a fence and an atomic; with tiles of
// one image, an image that fits a tile needs neither. On an H200 that conv then took 14.6 us
// at batch 32 and 3.4 at batch 1, where the FP16-output conv and the pool had taken 18.6 + 7.3
// and 7.7 + 3.5. A null `part`: the plain epilogue.
struct GapFuse {
  float* part;
  unsigned* count;
  int hw;
};
// Bytes of shared memory pool_tile_sums takes for a 64-channel half: a float per row group
// and channel.
#define GAP_RED_BYTES (MMA_THREADS / (MMA_BN / 4) * MMA_BN * 4)
#if __CUDA_ARCH__ >= 800
// The first row of this block's tile of bm rows (x) and the rows its epilogue writes (y): bm
// from blockIdx.y * bm, or with a fused pool the tile's part of one image.
__device__ __forceinline__ int2 gap_tile_rows(const GapFuse& gap, int bm, int m) {
  if (!gap.part) {
    const int m0 = blockIdx.y * bm;
    return make_int2(m0, min(bm, m - m0));
  }
  const int tiles = (gap.hw + bm - 1) / bm, img = blockIdx.y / tiles,
            t = blockIdx.y - img * tiles;
  return make_int2(img * gap.hw + t * bm, min(bm, gap.hw - t * bm));
}
// The pooled epilogue's activation: EPI_LINEAR (none, ReLU, clip: a clip to lo, hi), SiLU
// and hard swish inline, as act_f computes them; any other (GAP_ANY) out of line.
#define GAP_ANY 3
__device__ __noinline__ float act_out_of_line(float v, int act, float a, float b) {
  return act_f(v, act, a, b);
}
template <int EA>
__device__ __forceinline__ float pool_act(float v, float lo, float hi, int act, float a,
                                          float b) {
  if (EA == EPI_LINEAR) return fminf(fmaxf(v, lo), hi);
  if (EA == EPI_SILU) return __fdividef(v, 1.f + __expf(-v));
  if (EA == EPI_HSWISH) return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) * (1.f / 6.f);
  return act_out_of_line(v, act, a, b);
}
// A thread's sum of its four channels (cl of the half, c of the output) over its rows of the
// tile (every row_step-th from r0, below `rows`): the value the plain epilogue stores, before
// its conversion to the output type. The residual comes from the block's tile in shared
// memory (from global memory, a latency a row, only where the launch gave the tile no room
// on a GPU of small shared memory). A row at a time, in a loop for each activation kind
// chosen once: the code a block runs once is fetched cold. With act_f's switch inline for
// each element of eight unrolled rows, or even a clip, the pooled kernels grew from 215 to
// 325-340 KB of code, and ResNet-50's pooled last conv took 22-35 us at batch 32 on an H200
// (7.1 at batch 1), against 10 (2.8) for its int8-output twins.
template <int EA>
__device__ __forceinline__ float4 pool_rows(const int* so, const unsigned char* s_res,
                                            bool res_smem, int m0, int rows, int r0, int cl,
                                            int c, float4 al, float4 bi, float lo, float hi,
                                            MMA_EPI_PARAMS) {
  constexpr int row_step = MMA_THREADS / (MMA_BN / 4);
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
  for (int r = r0; r < rows; r += row_step) {
    float4 rv = make_float4(0.f, 0.f, 0.f, 0.f);
    if (res_t >= 0) {
      if (res_smem) {
        const char4 q = *(const char4*)(s_res + r * MMA_BN + cl);
        rv = make_float4(q.x * res_scale, q.y * res_scale, q.z * res_scale, q.w * res_scale);
      } else {
        rv = ld4(res, res_t, (i64)(m0 + r) * cout + c, res_scale);
      }
    }
    const int4 v = *(const int4*)&so[r * MMA_OUT_LD + cl];
    sum.x += pool_act<EA>(v.x * al.x + bi.x + rv.x, lo, hi, act, a0, a1);
    sum.y += pool_act<EA>(v.y * al.y + bi.y + rv.y, lo, hi, act, a0, a1);
    sum.z += pool_act<EA>(v.z * al.z + bi.z + rv.z, lo, hi, act, a0, a1);
    sum.w += pool_act<EA>(v.w * al.w + bi.w + rv.w, lo, hi, act, a0, a1);
  }
  return sum;
}
// mma_epilogue's operands, pooled instead of stored, by the same threads in the same layout
// (four channels, every row_step-th row from r0): each thread sums its rows of the tile (all
// of one image), `s_red` (GAP_RED_BYTES) gathers the row groups' sums and the first MMA_BN
// threads add them up in order, into the image's average where the tile holds all of it,
// else into the tile's partial sums. Every thread of the block calls it (its barrier): both
// halves of a 128-channel tile have the same rows.
__device__ __forceinline__ void pool_tile_sums(const int tid, const int* so, const float* s_al,
                                               const float* s_bi, const unsigned char* s_res,
                                               bool res_smem, int m0, int rows, int n0,
                                               float* s_red, const GapFuse& gap,
                                               MMA_EPI_PARAMS) {
  constexpr int row_step = MMA_THREADS / (MMA_BN / 4);
  const int cl = (tid % (MMA_BN / 4)) * 4, c = n0 + cl, r0 = tid / (MMA_BN / 4);
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c < cout) {
    const float4 al = *(const float4*)(s_al + cl), bi = *(const float4*)(s_bi + cl);
    const float lo = act == 1 ? 0.f : act == 2 ? a0 : -QS_INF, hi = act == 2 ? a1 : QS_INF;
#define QS_POOL_ROWS(EA)                                                                    \
  sum = pool_rows<EA>(so, s_res, res_smem, m0, rows, r0, cl, c, al, bi, lo, hi, MMA_EPI_ARGS)
    if (act <= 2)
      QS_POOL_ROWS(EPI_LINEAR);
    else if (act == 24)
      QS_POOL_ROWS(EPI_SILU);
    else if (act == 4)
      QS_POOL_ROWS(EPI_HSWISH);
    else
      QS_POOL_ROWS(GAP_ANY);
#undef QS_POOL_ROWS
  }
  *(float4*)&s_red[r0 * MMA_BN + cl] = sum;
  __syncthreads();
  if (tid < MMA_BN && n0 + tid < cout) {
    float t = 0.f;
#pragma unroll
    for (int g = 0; g < row_step; g++) t += s_red[g * MMA_BN + tid];
    if (rows == gap.hw)
      st(y, y_t, (i64)(m0 / gap.hw) * cout + n0 + tid, t / (float)gap.hw, y_scale);
    else
      gap.part[(i64)blockIdx.y * cout + n0 + tid] = t;
  }
}
// After pool_tile_sums: where the tile's image has other tiles (of bm pixels), the last of
// them to finish averages their sums of the bn channels from blockIdx.x * bn. All of the
// block's threads call it.
__device__ __forceinline__ void pool_split_images(const GapFuse& gap, int bm, int bn, int m,
                                                  void* y, int y_t, float y_scale, int cout) {
  const int tiles = (gap.hw + bm - 1) / bm, img = blockIdx.y / tiles, n = m / gap.hw;
  if (tiles == 1) return;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(&gap.count[blockIdx.x * n + img], 1u) == (unsigned)tiles - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int q = threadIdx.x; q < bn; q += blockDim.x) {
    const int c = blockIdx.x * bn + q;
    if (c >= cout) continue;
    float s = 0.f;
    for (int t = img * tiles; t < (img + 1) * tiles; t++)
      s += __ldcg(&gap.part[(i64)t * cout + c]);
    st(y, y_t, (i64)img * cout + c, s / (float)gap.hw, y_scale);
  }
  if (threadIdx.x == 0) gap.count[blockIdx.x * n + img] = 0;
}
#endif
// The tensor-core kernel's parameters, and the same names passed on to its body.
#define MMA_PARAMS                                                                          \
  const signed char* x, const signed char* w, const float* alpha, const float* bias,       \
      const void* res, int res_t, float res_scale, void* y, int y_t, float y_scale, int m,  \
      int cin, int kpad, int cout, int act, float a0, float a1, int h, int wd, int oh,      \
      int ow, int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw,               \
      unsigned img_magic, unsigned img_shift, unsigned row_magic, unsigned row_shift,     \
      GapFuse gap
#define MMA_ARGS                                                                            \
  x, w, alpha, bias, res, res_t, res_scale, y, y_t, y_scale, m, cin, kpad, cout, act, a0, a1, \
      h, wd, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, img_magic, img_shift, row_magic,       \
      row_shift, gap
#if __CUDA_ARCH__ >= 800
// The implicit GEMM kernels' x rows (conv_i8_mma's and conv_i8_wgmma's): for a thread's XR
// rows of a tile, output pixels row0 + rstep i, the byte offset of each row's first tap
// (which may lie in the padding) and where that tap is (iy0, ix0); rows past m get an iy0 no
// tap reaches inside. The divisions by oh * ow and ow are FastDiv's multiply-shifts (magic
// 0: by 1): eight integer divisions a thread were more instructions than a one-tile layer's
// tensor-core work. Offsets are 32-bit (the host offers the kernels inputs of fewer than 2^31
// bytes), a few instructions a copy fewer than 64-bit products.
template <int XR>
__device__ __forceinline__ void first_taps(int (&xo)[XR], int (&iy0)[XR], int (&ix0)[XR],
                                           int row0, int rstep, MMA_PARAMS) {
#pragma unroll
  for (int i = 0; i < XR; i++) {
    int arow = row0 + rstep * i;
    unsigned ua = (unsigned)min(arow, m - 1);
    int b = img_magic ? __umulhi(ua, img_magic) >> img_shift : ua, r = ua - b * oh * ow;
    int oy = row_magic ? __umulhi((unsigned)r, row_magic) >> row_shift : r;
    iy0[i] = arow < m ? oy * sh - pt : -(1 << 30);
    ix0[i] = (r - oy * ow) * sw - pl;
    xo[i] = arow < m ? ((b * h + iy0[i]) * wd + ix0[i]) * cin : 0;
  }
}
// Where a thread's next 16-byte piece of the reduction starts: channel ci of tap (ky, kx).
// Tiles are copied in order, so this steps along instead of dividing per piece (two integer
// divisions a piece would be more instructions than the tile's tensor-core work).
struct TapPos {
  int ci, kx, ky;
  __device__ __forceinline__ void step(int by, int cin, int kw) {
    for (ci += by; ci >= cin; ci -= cin)
      if (++kx == kw) {
        kx = 0;
        ky++;
      }
  }
};
// A thread's XR x pieces of a tile (rows `row_bytes` apart in shared memory from sa) at tap
// position t: zero-filled outside the input and past the reduction (`kin` false).
template <int XR>
__device__ __forceinline__ void copy_x_pieces(unsigned char* sa, int row_bytes,
                                              const signed char* x, const int (&xo)[XR],
                                              const int (&iy0)[XR], const int (&ix0)[XR],
                                              TapPos t, bool kin, int h, int wd, int cin,
                                              int dh, int dw) {
  const int dy = t.ky * dh, dx = t.kx * dw, toff = (dy * wd + dx) * cin + t.ci;
#pragma unroll
  for (int i = 0; i < XR; i++) {
    int iy = iy0[i] + dy, ix = ix0[i] + dx;
    bool in = kin && (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)wd;
    cp_async16(sa + row_bytes * i, x + (unsigned)(in ? xo[i] + toff : 0), in);
  }
}
// Whether the epilogue reads the int8 residual from a tile in shared memory, whose end is
// `need` bytes into the block's dynamic shared memory: where the launch gave the tile room
// (not on GPUs whose shared memory it would cost blocks) and 16-byte copies need 16-byte
// rows; otherwise it reads the residual from global memory. Any output type: both epilogue
// paths read the tile.
__device__ __forceinline__ bool res_tile_in_smem(int res_t, const void* res, int cout,
                                                 unsigned need) {
  unsigned smem_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
  return res_t == 2 && (cout & 15) == 0 &&
         ((size_t)res & 15) == 0 && smem_bytes >= need;
}
// That tile, BM rows from m0 by MMA_BN channels from n0, copied by MMA_THREADS threads (four
// a row); rows past m and channels past cout (a multiple of 4) zero-filled.
template <int BM>
__device__ __forceinline__ void copy_res_tile(unsigned char* s_res, const void* res, int m0,
                                              int n0, int m, int cout) {
#pragma unroll
  for (int i = 0; i < BM / 32; i++) {
    const int q = threadIdx.x + MMA_THREADS * i, r = q >> 2, cc = n0 + (q & 3) * 16;
    const bool in = m0 + r < m && cc < cout;
    cp_async16(s_res + r * MMA_BN + (q & 3) * 16,
               (const signed char*)res + (in ? (i64)(m0 + r) * cout + cc : 0), in);
  }
}
#endif
template <int BM>
__device__ __forceinline__ void conv_i8_mma_body(unsigned char* smem, MMA_PARAMS) {
#if __CUDA_ARCH__ >= 800
  pdl_trigger();
  // BM / 32 rows of the x tile a thread copies; a warp's share of the tile is BM / 2 rows
  // (MI 16-row fragments) by 32 channels.
  constexpr int XR = BM / 32, MI = BM / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int2 tile = gap_tile_rows(gap, BM, m);
  const int n0 = blockIdx.x * MMA_BN, m0 = tile.x;
  // Copies: four threads a row, each one 16-byte piece of the stage's MMA_BK bytes, so that a
  // warp's copy reads eight rows' 64 bytes each (contiguous within a tap). A thread a row,
  // reading 16 bytes every cin bytes, touched twice the L2 sectors it used (Nsight, ResNet-50
  // at batch 32). A quarter warp's eight pieces are rows r and r + 4, whose 16-byte columns
  // are disjoint bank groups with MMA_LD-byte rows. A thread's rows are crow + 32 i: XR of
  // the x tile, two of the weight tile.
  const int piece = lane & 3, crow = warp * 8 + (lane >> 3) + ((lane >> 2) & 1) * 4;
  const int k = kh * kw * cin;
  int xo[XR], iy0[XR], ix0[XR];
  first_taps<XR>(xo, iy0, ix0, m0 + crow, 32, MMA_ARGS);
  // The epilogue's operands (see above), in the first copy group: 32 threads copy the alphas
  // and biases, every thread BM / 32 pieces of the residual tile (four a row). Channels past
  // cout (a multiple of 4) and rows past m are zero-filled (a copy of 0 bytes from the
  // array's start).
  float* s_al = (float*)(smem + MMA_STAGES * (BM + MMA_BN) * MMA_LD);
  float* s_bi = s_al + MMA_BN;
  unsigned char* s_res = (unsigned char*)(s_bi + MMA_BN);
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  // Everything above is index arithmetic and constants; the residual and x are the previous
  // kernels' outputs.
  pdl_wait();
  const bool res_smem =
      res_tile_in_smem(res_t, res, cout, (unsigned)(s_res - smem) + BM * MMA_BN);
  if (res_smem) copy_res_tile<BM>(s_res, res, m0, n0, m, cout);
  // This thread's weight rows (crow and crow + 32) at its next piece.
  const signed char* wp = w + (i64)(n0 + crow) * kpad + piece * 16;
  const i64 w32 = (i64)32 * kpad;
  const int ktiles = kpad / MMA_BK;
  // Where this thread's next piece starts in the reduction.
  TapPos tap = {piece * 16, 0, 0};
  tap.step(0, cin, kw);
  // Copies the next tile into stage `fill` (tiles go in order, stages round robin).
  int kpos = piece * 16, fill = 0;
  auto load = [&]() {
    unsigned char* sa = smem + fill * (BM + MMA_BN) * MMA_LD + crow * MMA_LD + piece * 16;
    unsigned char* sb = sa + BM * MMA_LD;
    copy_x_pieces<XR>(sa, 32 * MMA_LD, x, xo, iy0, ix0, tap, kpos < k, h, wd, cin, dh, dw);
    cp_async16(sb, wp, true);
    cp_async16(sb + 32 * MMA_LD, wp + w32, true);
    wp += MMA_BK;
    kpos += MMA_BK;
    fill = fill == MMA_STAGES - 1 ? 0 : fill + 1;
    tap.step(MMA_BK, cin, kw);
  };
  int acc[MI][4][4];
  zero_acc<MI>(acc);
#pragma unroll
  for (int s = 0; s < MMA_STAGES - 1; s++) {
    if (s < ktiles) load();
    asm volatile("cp.async.commit_group;\n" ::);
  }
  const int wm = (warp >> 1) * (BM / 2), wn = (warp & 1) * 32;
  for (int kt = 0, use = 0; kt < ktiles; kt++, use = use == MMA_STAGES - 1 ? 0 : use + 1) {
    // Tile kt (in stage `use`) has landed; every warp is done with the stage the next copy
    // overwrites.
    asm volatile("cp.async.wait_group %0;\n" ::"n"(MMA_STAGES - 2));
    __syncthreads();
    if (kt + MMA_STAGES - 1 < ktiles) load();
    asm volatile("cp.async.commit_group;\n" ::);
    const unsigned char* sa = smem + use * (BM + MMA_BN) * MMA_LD;
    const unsigned char* sb = sa + BM * MMA_LD;
#pragma unroll
    for (int ks = 0; ks < MMA_BK; ks += 32)
      mma_k32<MI>(acc, sa + wm * MMA_LD + ks, MMA_LD, sb + wn * MMA_LD + ks, MMA_LD, lane);
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  int* so = (int*)smem;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int r = wm + i * 16 + g, c = wn + j * 8 + 2 * t4;
      *(int2*)&so[r * MMA_OUT_LD + c] = make_int2(acc[i][j][0], acc[i][j][1]);
      *(int2*)&so[(r + 8) * MMA_OUT_LD + c] = make_int2(acc[i][j][2], acc[i][j][3]);
    }
  __syncthreads();
  if (gap.part) {
    // The row groups' sums after the staged int32 sums, in what were the stages.
    float* s_red = (float*)(smem + BM * MMA_OUT_LD * 4);
    pool_tile_sums(tid, so, s_al, s_bi, s_res, res_smem, m0, tile.y, n0, s_red, gap,
                   MMA_EPI_ARGS);
    pool_split_images(gap, BM, MMA_BN, m, y, y_t, y_scale, cout);
    return;
  }
  mma_epilogue(tid, so, s_al, s_bi, s_res, res_smem, m0, tile.y, n0, MMA_EPI_ARGS);
#else
  __trap();
#endif
}

extern __shared__ __align__(16) unsigned char mma_smem[];
// MMA_BM-pixel tiles (a warp 64 x 32; 128 registers, no spills on sm_90), four blocks an SM.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 4) conv_i8_mma(MMA_PARAMS) {
  conv_i8_mma_body<MMA_BM>(mma_smem, MMA_ARGS);
}
// Half-height tiles (a warp 32 x 32, 80 registers): six blocks an SM, twice the blocks a
// layer. For layers whose few pixel tiles leave SMs idle or whose blocks wait on memory with
// little tensor-core work between (the builder times both).
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 6) conv_i8_mma64(MMA_PARAMS) {
  conv_i8_mma_body<MMA_BM / 2>(mma_smem, MMA_ARGS);
}

// Int8 stride-1 conv over 16-channel NHWC input (the stems `space_to_depth_stem` regroups:
// ResNets' 7x7/2 as a 4x4 conv, MobileNets' and EfficientNets' 3x3/2 as a 2x2 one) on the
// int8 tensor cores, a row of output pixels at a time. conv_i8_mma copies every tap of every
// output pixel from L2, kh * kw times the input (16 taps of 16 bytes a pixel in ResNet-50's
// stem, whose 77 us at batch 32 on an H200 were the engine's longest layer). Here a block
// copies a row's input window (kh input rows of ow + kw - 1 pixels, zero outside the input)
// into shared memory once and builds the tensor-core A fragments from it: with 16 channels,
// taps kx and kx + 1 of a pixel are 32 contiguous bytes of the window, one m16n8k32 step, and
// consecutive pixels are 16 bytes apart, the rows ldmatrix wants, bank-conflict free. A block
// keeps its MMA_BN channels' weights in shared memory and steps over output rows (grid-
// stride), copying the next row's window while it computes and writes the current one; each
// of its warps computes the whole row for 16 channels (a warp whose channels are all past
// cout skips that). The epilogue is conv_i8_mma's. On an H200, ResNet-50's stem at batch 32
// took 56 us this way against conv_i8_mma's 77; eight warps a block (16 channels of every
// other pixel tile each) took 63, and with the sums written out half a row at a time (four
// blocks an SM, 64 registers, some spilled) 76. Needs
// ow <= ROWS_MAX_OW, kw even, the weights as conv_i8_mma's (kpad = kh * kw * 16 rounded up to
// MMA_BK); dynamic shared memory as `rows_smem_bytes` on the host.
#define ROWS_MAX_OW 128
#define ROWS_MT (ROWS_MAX_OW / 16)
// Bytes a pixel of a row's staged int8 codes: MMA_BN and 16 more, so that the eight rows of a
// quarter warp's 2-byte stores (rows 80 bytes apart) fall in distinct banks.
#define ROWS_CODE_LD (MMA_BN + 16)
#if __CUDA_ARCH__ >= 800
// A warp's int8 epilogue of its row sums in registers (the m16n8 accumulator layout: pixel
// i * 16 + g and g + 8, channels c0 + j * 8 and the next), each pair of codes a 2-byte store
// into the row's staged codes. Staging the int32 sums instead took 31.5 KiB of shared memory
// a block on ResNet-50's stem (three blocks an SM where this allows five) and a shared-memory
// round trip a word: that stem took 57 us at batch 32 on an H200, this way 43.
template <int EA>
__device__ __forceinline__ void rows_codes(const int (&acc)[ROWS_MT][2][4], int mt,
                                           unsigned char* s_out, int g, int c0,
                                           const float2* al, const float2* bi, float y_scale,
                                           int act, float a0, float a1) {
#pragma unroll
  for (int j = 0; j < 2; j++) {
    const int c = c0 + j * 8;
    const float2 a = al[c / 2], b = bi[c / 2];
    // The same two channels in both rows of a fragment: x, y for pixel g, z, w for g + 8.
    const EpiI8 e = epi_i8_of(make_float4(a.x, a.y, a.x, a.y), make_float4(b.x, b.y, b.x, b.y),
                              0.f, y_scale, act, a0, a1);
#pragma unroll
    for (int i = 0; i < ROWS_MT; i++) {
      if (i < mt) {
        const unsigned q = epi_i8_word_as<EA, false>(
            e, make_int4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]), 0u);
        unsigned char* p = s_out + (i * 16 + g) * ROWS_CODE_LD + c;
        *(unsigned short*)p = (unsigned short)q;
        *(unsigned short*)(p + 8 * ROWS_CODE_LD) = (unsigned short)(q >> 16);
      }
    }
  }
}
// The staged codes of a row's `ow` pixels, `cw` channels each, to y (pixel stride `cout`
// bytes): 16-byte pieces where the rows allow, else words (cout is a multiple of 4).
__device__ __forceinline__ void rows_store(const unsigned char* s_out, signed char* y, int ow,
                                           int cw, int cout) {
  if ((cout & 15) == 0 && (cw & 15) == 0 && ((size_t)y & 15) == 0) {
    const int per = cw >> 4;
    for (int q = threadIdx.x; q < ow * per; q += blockDim.x) {
      const int px = q / per, p = q - px * per;
      *(uint4*)(y + (i64)px * cout + p * 16) =
          *(const uint4*)(s_out + px * ROWS_CODE_LD + p * 16);
    }
  } else {
    const int per = cw >> 2;
    for (int q = threadIdx.x; q < ow * per; q += blockDim.x) {
      const int px = q / per, p = q - px * per;
      *(unsigned*)(y + (i64)px * cout + p * 4) =
          *(const unsigned*)(s_out + px * ROWS_CODE_LD + p * 4);
    }
  }
}
#endif
extern "C" __global__ void __launch_bounds__(MMA_THREADS)
    conv_i8_rows(const signed char* x, const signed char* w, const float* alpha,
                 const float* bias, MMA_EPI_PARAMS, int nrows, int h, int wd, int oh, int ow,
                 int kh, int kw, int pt, int pl, int kpad) {
#if __CUDA_ARCH__ >= 800
  pdl_trigger();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * MMA_BN;
  // Weight rows 16 bytes longer than kpad (a multiple of 64), so that ldmatrix's eight rows
  // fall in distinct banks; a window has 16 pixels of slack after its last row for the
  // padding rows of a row's last 16-pixel tile (read, never written out).
  const int wld = kpad + 16, pw = ow + kw - 1, win = (kh * pw + 16) * 16, mt = (ow + 15) >> 4;
  // An int8 output without a residual (the stems) takes its epilogue in registers and stages
  // the row's codes (ROWS_CODE_LD bytes a pixel); anything else stages the int32 sums for
  // mma_epilogue. The host sizes shared memory the same way (`rows_smem_bytes`).
  const bool codes = epi_i8_ok(y_t, res_t, act) && res_t < 0;
  unsigned char* s_w = mma_smem;
  unsigned char* s_win = s_w + MMA_BN * wld;
  unsigned char* s_out = s_win + 2 * win;
  int* so = (int*)s_out;
  float* s_al = (float*)(s_out + mt * 16 * (codes ? ROWS_CODE_LD : MMA_OUT_LD * 4));
  float* s_bi = s_al + MMA_BN;
  for (int q = tid; q < MMA_BN * (kpad / 16); q += MMA_THREADS) {
    const int r = q / (kpad / 16), p = q - r * (kpad / 16);
    cp_async16(s_w + r * wld + p * 16, w + (i64)(n0 + r) * kpad + p * 16, true);
  }
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  // The weights, alphas and biases are constants: their copies overlap the previous kernel's
  // end. The windows are its output.
  pdl_wait();
  // Output row `row` (image row / oh, row row % oh): its window into buffer `b`.
  auto load_window = [&](int row, int b) {
    const int img = row / oh, oy = row - img * oh;
    unsigned char* dst = s_win + b * win;
    for (int q = tid; q < kh * pw; q += MMA_THREADS) {
      const int ky = q / pw, px = q - ky * pw, iy = oy - pt + ky, ix = px - pl;
      const bool in = (unsigned)iy < (unsigned)h && (unsigned)ix < (unsigned)wd;
      cp_async16(dst + q * 16, x + (in ? ((i64)(img * h + iy) * wd + ix) * 16 : 0), in);
    }
  };
  int row = blockIdx.y;
  if (row < nrows) load_window(row, 0);
  asm volatile("cp.async.commit_group;\n" ::);
  const int g = lane >> 2, t4 = lane & 3;
  // This warp's 16 channels.
  const int wc = warp * 16;
  const bool busy = n0 + wc < cout;
  for (int buf = 0; row < nrows; row += gridDim.y, buf ^= 1) {
    // This row's window (and, the first time, the weights) has landed; every thread is done
    // with the last row's sums and with the window the next copy overwrites.
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (row + (int)gridDim.y < nrows) load_window(row + gridDim.y, buf ^ 1);
    asm volatile("cp.async.commit_group;\n" ::);
    const unsigned char* wnd = s_win + buf * win;
    int acc[ROWS_MT][2][4];
#pragma unroll
    for (int i = 0; i < ROWS_MT; i++)
#pragma unroll
      for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][j][e] = 0;
    for (int ky = 0; ky < kh && busy; ky++)
      for (int kx = 0; kx < kw; kx += 2) {
        unsigned r4[4];
        ldsm_x4(r4, s_w + (wc + ((lane >> 4) << 3) + (lane & 7)) * wld + (ky * kw + kx) * 16 +
                        ((lane >> 3) & 1) * 16);
        const unsigned b0[2] = {r4[0], r4[1]}, b1[2] = {r4[2], r4[3]};
        const unsigned char* a0p = wnd + (ky * pw + (lane & 15) + kx + (lane >> 4)) * 16;
#pragma unroll
        for (int i = 0; i < ROWS_MT; i++) {
          if (i < mt) {
            unsigned af[4];
            ldsm_x4(af, a0p + i * 256);
            mma_s8(acc[i][0], af, b0);
            mma_s8(acc[i][1], af, b1);
          }
        }
      }
    if (codes) {
      if (busy) {
        const float2 *al = (const float2*)s_al, *bi = (const float2*)s_bi;
        const int c0 = wc + 2 * t4;
        if (act == 24)
          rows_codes<EPI_SILU>(acc, mt, s_out, g, c0, al, bi, y_scale, act, a0, a1);
        else if (act == 4)
          rows_codes<EPI_HSWISH>(acc, mt, s_out, g, c0, al, bi, y_scale, act, a0, a1);
        else
          rows_codes<EPI_LINEAR>(acc, mt, s_out, g, c0, al, bi, y_scale, act, a0, a1);
      }
      __syncthreads();
      rows_store(s_out, (signed char*)y + (i64)row * ow * cout + n0, ow, min(MMA_BN, cout - n0),
                 cout);
      continue;
    }
#pragma unroll
    for (int i = 0; i < ROWS_MT; i++) {
      if (i < mt) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const int r = i * 16 + g, c = wc + j * 8 + 2 * t4;
          *(int2*)&so[r * MMA_OUT_LD + c] = make_int2(acc[i][j][0], acc[i][j][1]);
          *(int2*)&so[(r + 8) * MMA_OUT_LD + c] = make_int2(acc[i][j][2], acc[i][j][3]);
        }
      }
    }
    __syncthreads();
    mma_epilogue(tid, so, s_al, s_bi, nullptr, false, row * ow, ow, n0, MMA_EPI_ARGS);
  }
#else
  __trap();
#endif
}

// Int8 1x1 conv (stride 1, no padding) or Gemm / MatMul rows, int8 out, on the int8 tensor
// cores with the weights resident: the memory-bound expansions and reductions of bottleneck
// networks (ResNet-50's layer1 64 -> 256 at batch 32: 6 MB in, 26 MB of residual and 26 MB
// out for 1.6 G multiply-adds). conv_i8_mma there runs one pixel tile a block: it copies the
// tile, waits, computes, stages int32 sums in shared memory and writes, each block's memory
// traffic and its arithmetic in turn. Here a block keeps its MMA_BN channels' weights (kpad
// <= 256 bytes a row) and alphas in shared memory and steps over pixel tiles (grid-stride,
// as many blocks as fit the SMs at once): it copies the next tile's x rows and int8 residual
// while it computes and writes the current one.
//
// The epilogue runs on the accumulator fragments in registers. In the m16n8 layout a thread
// holds rows g and g + 8 of a 16-row fragment at columns 2 t4 and 2 t4 + 1 of each 8-column
// tile; the block's weight rows are permuted as they are copied (`mmas_channel`) so that
// columns 2 t4, 2 t4 + 1 of tiles 2 jp and 2 jp + 1 are channels 4 t4 .. 4 t4 + 3 of group jp:
// a thread's four sums of a row are four consecutive channels, one word of residual codes in
// and one of output codes out (two-byte pieces took a shift and twice the shared-memory
// accesses a word). The words go through the tile's staged residual, each code replacing its
// residual, then out in 16-byte pieces. Shared memory (mmas_smem_bytes on the host): the
// weights, two x tiles of kpad + 16 bytes a row (ldmatrix's eight rows in distinct banks), two
// residual / code tiles of ROWS_CODE_LD bytes a row (a quarter warp's eight rows in distinct
// banks), the alphas and biases. Needs cin % 16 == 0, kpad in {64, 128, 256}, cout % 16 == 0,
// (m + BM) * cin and (m + BM) * cout below 2^31 (32-bit offsets to the last tile's end),
// 16-byte aligned tensors (buffer starts), an int8 output and residual (or none) and an
// activation the int8 epilogue computes (epi_i8_ok); grid (cout_pad / MMA_BN, blocks),
// MMA_THREADS threads.
#if __CUDA_ARCH__ >= 800
// The channel (within the block's MMA_BN) whose weights go to column `col` of the block's
// B tiles: in each 16, column 8 h + 2 t4 + e (8-column tile h) holds channel 4 t4 + 2 h + e.
__device__ __forceinline__ int mmas_channel(int col) {
  return (col & ~15) | ((col & 6) << 1) | ((col >> 2) & 2) | (col & 1);
}
template <int BM, int EA, bool RES>
__device__ __forceinline__ void mmas_tiles(unsigned char* smem, const signed char* x,
                                           const signed char* res, float res_scale,
                                           signed char* y, float y_scale, int cout, int act,
                                           float a0, float a1, int m, int cin, int kpad) {
  constexpr int MI = BM / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * MMA_BN, tiles = (m + BM - 1) / BM, ld = kpad + 16;
  const unsigned char* s_w = smem;
  unsigned char* s_x = smem + MMA_BN * ld;
  unsigned char* s_c = s_x + 2 * BM * ld;
  const float* s_al = (const float*)(s_c + 2 * BM * ROWS_CODE_LD);
  const float* s_bi = s_al + MMA_BN;
  // A thread copies 16-byte piece xp of x rows xr, xr + xstep, ... (kpad / 16 pieces a row, a
  // power of two dividing MMA_THREADS), and piece rp of residual rows rr + 32 i; it writes
  // the same pieces of the tile's output rows.
  const int pieces = kpad >> 4, xp = tid & (pieces - 1), xr = tid / pieces,
            xstep = MMA_THREADS / pieces;
  const bool xin = xp * 16 < cin;
  const int rp = tid & 3, rr = tid >> 2, rc = n0 + rp * 16;
  const bool rin = rc < cout;
  auto load = [&](int t, int b) {
    unsigned char* sx = s_x + b * BM * ld + xr * ld + xp * 16;
    int row = t * BM + xr, off = row * cin + xp * 16;
    for (int r = xr; r < BM; r += xstep, row += xstep, off += xstep * cin, sx += xstep * ld) {
      const bool in = xin && row < m;
      cp_async16(sx, x + (in ? off : 0), in);
    }
    if (RES) {
      unsigned char* sc = s_c + b * BM * ROWS_CODE_LD + rr * ROWS_CODE_LD + rp * 16;
      const int row0 = t * BM + rr;
#pragma unroll
      for (int i = 0; i < BM / 32; i++) {
        const bool in = rin && row0 + 32 * i < m;
        cp_async16(sc + 32 * i * ROWS_CODE_LD, res + (in ? (row0 + 32 * i) * cout + rc : 0), in);
      }
    }
  };
  int t = blockIdx.y;
  if (t < tiles) load(t, 0);
  asm volatile("cp.async.commit_group;\n" ::);
  const int wm = (warp >> 1) * (BM / 2), wn = (warp & 1) * 32, g = lane >> 2, t4 = lane & 3;
  for (int b = 0; t < tiles; t += gridDim.y, b ^= 1) {
    // Tile t (and, the first time, the weights and alphas) has landed; every thread is done
    // with the buffers the next copy overwrites (the tile before's codes went out).
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (t + (int)gridDim.y < tiles) load(t + gridDim.y, b ^ 1);
    asm volatile("cp.async.commit_group;\n" ::);
    int acc[MI][4][4];
    zero_acc<MI>(acc);
    const unsigned char* sa = s_x + b * BM * ld;
#pragma unroll 1
    for (int ks = 0; ks < kpad; ks += 32)
      mma_k32<MI>(acc, sa + wm * ld + ks, ld, s_w + wn * ld + ks, ld, lane);
    // Each fragment's row g and row g + 8 words of channels c .. c + 3: the residual codes
    // read, the output codes written in their place.
    unsigned char* sc = s_c + b * BM * ROWS_CODE_LD;
#pragma unroll
    for (int jp = 0; jp < 2; jp++) {
      const int c = wn + jp * 16 + 4 * t4;
      const EpiI8 e = epi_i8(s_al, s_bi, c, res_scale, y_scale, act, a0, a1);
#pragma unroll
      for (int i = 0; i < MI; i++) {
        unsigned* p = (unsigned*)(sc + (wm + i * 16 + g) * ROWS_CODE_LD + c);
        unsigned* p8 = p + 8 * ROWS_CODE_LD / 4;
        const int(&lo)[4] = acc[i][2 * jp], (&hi)[4] = acc[i][2 * jp + 1];
        const unsigned r = RES ? *p : 0u, r8 = RES ? *p8 : 0u;
        *p = epi_i8_word_as<EA, RES>(e, make_int4(lo[0], lo[1], hi[0], hi[1]), r);
        *p8 = epi_i8_word_as<EA, RES>(e, make_int4(lo[2], lo[3], hi[2], hi[3]), r8);
      }
    }
    __syncthreads();
    const int row0 = t * BM + rr;
#pragma unroll
    for (int i = 0; i < BM / 32; i++) {
      if (rin && row0 + 32 * i < m)
        *(uint4*)(y + (row0 + 32 * i) * cout + rc) =
            *(const uint4*)(sc + (rr + 32 * i) * ROWS_CODE_LD + rp * 16);
    }
  }
}
#endif
template <int BM>
__device__ __forceinline__ void conv_i8_mmas_body(const signed char* x, const signed char* w,
                                                  const float* alpha, const float* bias,
                                                  MMA_EPI_PARAMS, int m, int cin, int kpad) {
#if __CUDA_ARCH__ >= 800
  pdl_trigger();
  const int tid = threadIdx.x, n0 = blockIdx.x * MMA_BN, ld = kpad + 16, pieces = kpad >> 4;
  unsigned char* smem = mma_smem;
  float* s_al = (float*)(smem + MMA_BN * ld + 2 * BM * (ld + ROWS_CODE_LD));
  float* s_bi = s_al + MMA_BN;
  for (int q = tid; q < MMA_BN * pieces; q += MMA_THREADS) {
    const int col = q / pieces, p = q - col * pieces;
    cp_async16(smem + col * ld + p * 16, w + (i64)(n0 + mmas_channel(col)) * kpad + p * 16,
               true);
  }
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  // The weights, alphas and biases are constants: their copies overlap the previous kernel's
  // end. x and the residual are its output.
  pdl_wait();
  const signed char* r8 = (const signed char*)res;
  signed char* y8 = (signed char*)y;
  // One tile loop for each activation and residual, chosen once.
#define QS_MMAS_TILES(EA)                                                                   \
  if (res_t == 2)                                                                           \
    mmas_tiles<BM, EA, true>(smem, x, r8, res_scale, y8, y_scale, cout, act, a0, a1, m, cin, \
                             kpad);                                                         \
  else                                                                                      \
    mmas_tiles<BM, EA, false>(smem, x, r8, res_scale, y8, y_scale, cout, act, a0, a1, m, cin, \
                              kpad);
  EPI_I8_BY_ACT(act, QS_MMAS_TILES)
#undef QS_MMAS_TILES
#else
  __trap();
#endif
}
#define MMAS_PARAMS                                                                          \
  const signed char *x, const signed char *w, const float *alpha, const float *bias,        \
      MMA_EPI_PARAMS, int m, int cin, int kpad
#define MMAS_ARGS x, w, alpha, bias, MMA_EPI_ARGS, m, cin, kpad
// 128-pixel tiles (a warp 64 x 32 of them, as conv_i8_mma's), four blocks an SM at kpad 64.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 4) conv_i8_mmas(MMAS_PARAMS) {
  conv_i8_mmas_body<MMA_BM>(MMAS_ARGS);
}
// Half-height tiles: half the shared memory, more blocks an SM.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 6) conv_i8_mmas64(MMAS_PARAMS) {
  conv_i8_mmas_body<MMA_BM / 2>(MMAS_ARGS);
}
