// Int8 convolution on Hopper's warpgroup tensor-core instructions (wgmma.mma_async, sm_90a):
// conv_i8_mma's implicit GEMM and epilogue, with the tensor cores reading both operands from
// shared memory themselves. Other targets compile the entry points as traps.

// conv_i8_wgmma (BM x BN = 128 x 64 tiles), conv_i8_wgmma64 (64 x 64) and conv_i8_wgmma_wide
// (128 x 128, cout % 128 == 0): the convs conv_i8_mma takes (groups 1, any kernel, stride,
// padding and dilation, cin % 16 == 0, cout % 4 == 0; Gemm / MatMul rows as 1x1 images), the
// same parameters and weights (int8 OHWI rows [cout rounded up to MMA_BN][kpad]), grid
// (cout_pad / BN, ceil(m / BM)), a warpgroup of MMA_THREADS threads for every 64 channels of
// the tile.
//
// conv_i8_mma feeds mma.sync m16n8k32 through ldmatrix, each warp moving its operand
// fragments into registers for every 32 bytes of the reduction; cuDNN's int8 graph convs
// took about half its time on ResNet-50's 3x3 layers on an H200. Here the x and weight tiles
// are copied (cp.async, a 16-byte piece a thread, zero-filled outside the input and past the
// reduction) into shared memory in the layout the tensor cores read with a matrix descriptor:
// K-major rows of WG_BK = 128 bytes, each 16-byte piece p of row r stored at piece p ^ (r & 7)
// (the 128-byte swizzle, which spreads a column of pieces over every bank), stages on
// 1024-byte boundaries (the pattern follows address bits 7-9). Each 32-byte step of the
// reduction is one wgmma m64n64k32 (m64n128k32 in the wide kernel) per 64-row half of the
// tile, the descriptor's start moved 32 bytes along the rows. A block's BM x BN int32 sums
// stay in registers until the epilogue, which is conv_i8_mma's: staged through shared memory,
// then bias, residual, activation and requantization, four channels a thread.
//
// The main loop keeps WG_STAGES - 2 tiles of copies in flight and one tile's wgmma running
// behind the next: a tile's copies land (each thread's cp.async group, then
// fence.proxy.async so that the tensor cores' reads, which go through the async proxy, see
// them, then a barrier), the copy of a later tile goes into the stage two tiles back, the
// tile's wgmma are issued, and the step waits for the wgmma before them only. Dynamic shared
// memory as `wgmma_smem_bytes` on the host: 1 KiB of slack to align the stages, WG_STAGES
// stages of (BM + BN) rows, the alphas and biases, and in 64-channel tiles the int8 residual
// tile (read from global memory where the launch gave it no room, and in the wide kernel).
//
// On an H200 (ResNet-50 INT8 at batch 32, the builder's timings) the 3x3 convs took 38-61 %
// less time than on conv_i8_mma, but 11-54 % more than on cuDNN's int8 graph conv: the tiles
// come through L2 at about 7 TB/s (layer3's 3x3 conv, 128 x 64 tiles: 87 MB in 12.1 us), and
// the 128 x 128 tiles that halve those bytes leave SMs idle on layer3's and layer4's grids.
// TMA copies (im2col mode, multicast across a cluster) and larger tiles are the way on. Reads
// in halos (8 x 8 output pixels a tile, their input copied once and every tap a descriptor
// into it; bench/results/2026-12-01-nvidia-h200-halo-experiment.txt) were right but did not
// pay: inside conv_i8_wgmma_stream slower than cuDNN on every 3x3 conv (layer3 23.0 us against
// 9.4; one warpgroup a tile at a time, the tensor cores idle 75-85 % of the time), and as a
// kernel of two warpgroups a block 1-3 % faster than cuDNN alone on layer1 but slower in the
// engine's run. Warp specialization and wider wgmma come first.
//
// A layer of fewer tiles than the SMs hold runs with its reduction split: grid z and the
// cluster's z dimension are the number of blocks a tile, each running its share of the
// reduction tiles, then adding its share of the tile's rows from every block's staged sums
// (split_sums) before its epilogue. On an H200, ResNet-50's layer4 3x3 convs at batch 1 (8
// tiles of 64 x 64, a reduction of 36 tiles) took 4.5-4.7 us split 8 ways, 8.9 unsplit and
// 7.7 on cuDNN's graph conv.
#define WG_BM 128
#define WG_BK 128
#define WG_STAGES 4
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A shared-memory matrix descriptor of a K-major operand of CB-byte rows (128 or 64) at
// address `at`: the start address / 16 (bits 0-13), the leading byte offset (unused by
// swizzled K-major operands: 1, as CUTLASS sets it), the stride byte offset 8 CB / 16 (bits
// 32-45: 8 rows apart) and the CB-byte swizzle (bits 62-63: 1 for 128 bytes, 2 for 64). CB is
// a constant of each tile loop: read from a parameter (the streaming kernel's first version
// with 64-byte windows), it had ptxas compute the descriptors in vector registers and move
// them to uniform ones before every wgmma, and ResNet-50's 1x1 layers took 11-27 % longer on
// an H200.
template <int CB = WG_BK>
__device__ __forceinline__ unsigned long long wg_desc(unsigned at) {
  constexpr unsigned long long bits =
      (1ull << 16) | ((unsigned long long)(8 * CB >> 4) << 32) | ((CB == 128 ? 1ull : 2ull) << 62);
  return bits | ((at & 0x3FFFF) >> 4);
}
// d += A * B^T for a 64-row A tile and a 64- or 128-row B tile (both K-major, 32 bytes of
// the reduction): a warpgroup's 64 x N int32 sums, N / 2 a thread (warp w rows 16 w +
// lane / 4 and + 8, columns 8 j + 2 (lane % 4) and + 1 in d[4 j .. 4 j + 3], the m16n8
// accumulator layout repeated along the columns).
__device__ __forceinline__ void wg_mma(int (&d)[32], unsigned long long da,
                                       unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]),
        "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]),
        "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(da), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_mma(int (&d)[64], unsigned long long da,
                                       unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
        "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]),
        "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]),
        "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),
        "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]),
        "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]),
        "+r"(d[63])
      : "l"(da), "l"(db), "r"(1));
}
// Keeps the compiler from moving reads or writes of the accumulators across the
// asynchronous wgmma that own them (between wgmma.fence and wgmma.wait_group).
template <int MH, int N>
__device__ __forceinline__ void wg_hold(int (&d)[MH][N]) {
#pragma unroll
  for (int h = 0; h < MH; h++)
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(d[h][i])::"memory");
}
// Every thread of every block of the cluster arrives; this block's shared-memory writes
// before it are visible to the cluster's reads after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// A reduction split over a cluster (gridDim.z blocks, cluster dims (1, 1, gridDim.z), block
// blockIdx.z summing reduction tiles blockIdx.z * ktiles / gridDim.z onwards): each block has
// staged its partial sums of the whole tile in `so` (BM rows of MMA_OUT_LD for each of the
// `halves` 64-channel halves). This one adds rows r0 .. r1 of every block's (distributed
// shared memory: the SMs' network, no global memory, no atomics; int32 sums, so the same
// result in any order) into its own, which its epilogue then writes. No other block reads
// those rows of this block's, and the second barrier keeps every block's shared memory alive
// until the cluster's reads are done.
template <int BM>
__device__ __forceinline__ void split_sums(int* so, int halves, int r0, int r1) {
  cluster_sync();
  constexpr int per_row = MMA_BN / 4;
  const int rows = r1 - r0, n = halves * rows * per_row, splits = gridDim.z;
  for (int q = threadIdx.x; q < n; q += blockDim.x) {
    const int half = q / (rows * per_row), rest = q - half * rows * per_row;
    int* p = so + (half * BM + r0 + rest / per_row) * MMA_OUT_LD + (rest % per_row) * 4;
    const unsigned local = (unsigned)__cvta_generic_to_shared(p);
    int4 s = make_int4(0, 0, 0, 0);
    for (int b = 0; b < splits; b++) {
      unsigned remote;
      int4 v;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(b));
      asm volatile("ld.shared::cluster.v4.s32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(remote)
                   : "memory");
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
    *(int4*)p = s;
  }
  cluster_sync();
}
#endif
// The kernel for BM-pixel by BN-channel tiles: BN / 64 warpgroups of MMA_THREADS threads,
// each computing BM / (BN / 64) rows of the tile across its BN channels (MH 64-row halves),
// and copying its share of every tile; the epilogue runs on each 64-channel half with one
// warpgroup's threads.
template <int BM, int BN>
__device__ __forceinline__ void conv_i8_wgmma_body(MMA_PARAMS) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_trigger();
  // Copies: eight threads a row, each one 16-byte piece of the stage's WG_BK bytes; a
  // thread's rows are crow + RS i (RS a multiple of 8), all with the same swizzled piece.
  constexpr int WGS = BN / 64, THREADS = WGS * MMA_THREADS, RS = THREADS / 8;
  constexpr int XR = BM / RS, WR = BN / RS, MH = BM / 64 / WGS, STAGE = (BM + BN) * WG_BK;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int2 tile = gap_tile_rows(gap, BM, m);
  const int n0 = blockIdx.x * BN, m0 = tile.x;
  const int piece = tid & 7, crow = tid >> 3, swz = ((piece ^ (crow & 7)) << 4);
  const unsigned raw = (unsigned)__cvta_generic_to_shared(mma_smem);
  unsigned char* smem = mma_smem + (((raw + 1023u) & ~1023u) - raw);
  const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
  const int k = kh * kw * cin;
  int xo[XR], iy0[XR], ix0[XR];
  first_taps<XR>(xo, iy0, ix0, m0 + crow, RS, MMA_ARGS);
  float* s_al = (float*)(smem + WG_STAGES * STAGE);
  float* s_bi = s_al + BN;
  unsigned char* s_res = (unsigned char*)(s_bi + BN);
#pragma unroll
  for (int c = 0; c < WGS; c++)
    copy_alpha_bias(s_al + c * MMA_BN, s_bi + c * MMA_BN, alpha, bias, n0 + c * MMA_BN, cout);
  pdl_wait();
  // The residual tile in shared memory: 64-channel tiles only (the epilogue's layout).
  const bool res_smem =
      BN == MMA_BN &&
      res_tile_in_smem(res_t, res, cout, (unsigned)(s_res - mma_smem) + BM * MMA_BN);
  if (res_smem) copy_res_tile<BM>(s_res, res, m0, n0, m, cout);
  // This thread's weight rows (crow + RS j) at its next piece; pieces past kpad (the last
  // tile of a reduction that is not a multiple of WG_BK) are zero-filled.
  const signed char* wp = w + (i64)(n0 + crow) * kpad + piece * 16;
  const i64 wstep = (i64)RS * kpad;
  // This block's reduction tiles: all of them, or with the reduction split over a cluster
  // (split_sums) its share, kt0 onwards.
  const int kall = (kpad + WG_BK - 1) / WG_BK, kt0 = blockIdx.z * kall / gridDim.z;
  const int ktiles = (blockIdx.z + 1) * kall / gridDim.z - kt0;
  wp += kt0 * WG_BK;
  TapPos tap = {piece * 16, 0, 0};
  tap.step(kt0 * WG_BK, cin, kw);
  // Copies the next tile into stage `fill` (tiles go in order, stages round robin).
  int kpos = piece * 16 + kt0 * WG_BK, fill = 0;
  auto load = [&]() {
    unsigned char* sa = smem + fill * STAGE + crow * WG_BK + swz;
    unsigned char* sb = sa + BM * WG_BK;
    const bool win = kpos < kpad;
    copy_x_pieces<XR>(sa, RS * WG_BK, x, xo, iy0, ix0, tap, kpos < k, h, wd, cin, dh, dw);
#pragma unroll
    for (int j = 0; j < WR; j++)
      cp_async16(sb + RS * j * WG_BK, win ? wp + j * wstep : w, win);
    wp += WG_BK;
    kpos += WG_BK;
    fill = fill == WG_STAGES - 1 ? 0 : fill + 1;
    tap.step(WG_BK, cin, kw);
  };
  // This warpgroup's rows: halves wg * MH .. of the tile.
  const int wg = warp >> 2;
  int acc[MH][BN / 2];
#pragma unroll
  for (int hh = 0; hh < MH; hh++)
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[hh][i] = 0;
  // The pipeline: tiles kt + 1 .. kt + AHEAD copying while tile kt's wgmma are issued and
  // tile kt - 1's may still run (each step waits for all but its own group), so a copy goes
  // into the stage of tile kt - 2, which every warp is done with once it passes the barrier.
  constexpr int AHEAD = WG_STAGES - 2;
#pragma unroll
  for (int s = 0; s < AHEAD; s++) {
    if (s < ktiles) load();
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int kt = 0, use = 0; kt < ktiles; kt++, use = use == WG_STAGES - 1 ? 0 : use + 1) {
    // Tile kt has landed (this thread's copies, visible to the async proxy, then everyone's).
    asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (kt + AHEAD < ktiles) load();
    asm volatile("cp.async.commit_group;\n" ::);
    const unsigned a = sbase + use * STAGE + wg * MH * 64 * WG_BK, b = sbase + use * STAGE + BM * WG_BK;
    wg_hold(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < WG_BK; ks += 32) {
      const unsigned long long db = wg_desc(b + ks);
#pragma unroll
      for (int hh = 0; hh < MH; hh++) wg_mma(acc[hh], wg_desc(a + hh * 64 * WG_BK + ks), db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    wg_hold(acc);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  wg_hold(acc);
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  // The sums, a BM x MMA_OUT_LD block of shared memory for each 64-channel half.
  int* so = (int*)smem;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int hh = 0; hh < MH; hh++)
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
      const int r = (wg * MH + hh) * 64 + (warp & 3) * 16 + g, c = (j & 7) * 8 + 2 * t4;
      int* sc = so + (j >> 3) * BM * MMA_OUT_LD;
      *(int2*)&sc[r * MMA_OUT_LD + c] = make_int2(acc[hh][4 * j], acc[hh][4 * j + 1]);
      *(int2*)&sc[(r + 8) * MMA_OUT_LD + c] = make_int2(acc[hh][4 * j + 2], acc[hh][4 * j + 3]);
    }
  __syncthreads();
  if (gap.part) {
    // In what were the stages, after the staged sums: each half's row-group sums, then
    // (where the launch left it in global memory, as in 128-channel tiles) the int8 residual
    // tile, a 64-channel tile for each half, copied at once: the pooled epilogue reads a row
    // at a time, which from global memory would wait a latency a row.
    unsigned char* s_free = smem + WGS * BM * MMA_OUT_LD * 4;
    const unsigned char* s_rt = s_res;
    bool rt_smem = res_smem;
    if (!res_smem && res_tile_in_smem(res_t, res, cout, 0)) {
      unsigned char* dst = s_free + WGS * GAP_RED_BYTES;
      for (int q = tid; q < BM * BN / 16; q += THREADS) {
        const int half = q / (BM * 4), r = (q >> 2) % BM, p = q & 3;
        const int cc = n0 + half * MMA_BN + p * 16;
        const bool in = m0 + r < m && cc < cout;
        cp_async16(dst + (half * BM + r) * MMA_BN + p * 16,
                   (const signed char*)res + (in ? (i64)(m0 + r) * cout + cc : 0), in);
      }
      asm volatile("cp.async.commit_group;\n" ::);
      asm volatile("cp.async.wait_group 0;\n" ::);
      __syncthreads();
      s_rt = dst + wg * BM * MMA_BN;
      rt_smem = true;
    }
    pool_tile_sums(tid & (MMA_THREADS - 1), so + wg * BM * MMA_OUT_LD, s_al + wg * MMA_BN,
                   s_bi + wg * MMA_BN, s_rt, rt_smem, m0, tile.y, n0 + wg * MMA_BN,
                   (float*)(s_free + wg * GAP_RED_BYTES), gap, MMA_EPI_ARGS);
    pool_split_images(gap, BM, BN, m, y, y_t, y_scale, cout);
    return;
  }
  // A split reduction: this block sums and writes rows e0 .. of the tile, its share.
  int e0 = 0, erows = tile.y;
  if (gridDim.z > 1) {
    const int r0 = blockIdx.z * BM / gridDim.z, r1 = (blockIdx.z + 1) * BM / gridDim.z;
    split_sums<BM>(so, WGS, r0, r1);
    e0 = r0;
    erows = max(0, min(tile.y, r1) - r0);
  }
  mma_epilogue(tid & (MMA_THREADS - 1), so + (wg * BM + e0) * MMA_OUT_LD, s_al + wg * MMA_BN,
               s_bi + wg * MMA_BN, s_res + e0 * MMA_BN, res_smem, m0 + e0, erows,
               n0 + wg * MMA_BN, MMA_EPI_ARGS);
#else
  // Never launched here (the host offers it on compute capability 9.0 only); it waits as
  // every kernel of these files does, which the compile check asserts.
  pdl_enter();
  __trap();
#endif
}
// WG_BM-pixel by 64-channel tiles (64 sums a thread), two blocks an SM.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 2) conv_i8_wgmma(MMA_PARAMS) {
  conv_i8_wgmma_body<WG_BM, MMA_BN>(MMA_ARGS);
}
// Half-height tiles (32 sums a thread), three blocks an SM.
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 3) conv_i8_wgmma64(MMA_PARAMS) {
  conv_i8_wgmma_body<WG_BM / 2, MMA_BN>(MMA_ARGS);
}
// WG_BM-pixel by 128-channel tiles, two warpgroups (64 sums a thread), one block an SM: each
// tile of x copied serves twice the channels.
extern "C" __global__ void __launch_bounds__(2 * MMA_THREADS, 1) conv_i8_wgmma_wide(MMA_PARAMS) {
  conv_i8_wgmma_body<WG_BM, 2 * MMA_BN>(MMA_ARGS);
}

// Int8 1x1 conv (stride 1, no padding) or Gemm / MatMul rows, int8 out, on wgmma with the
// block's weights resident and pixel tiles streamed through a ring of TMA copy stages:
// conv_i8_mmas's way on Hopper. On an H200 (ResNet-50 INT8 at batch 32) the expansions that
// add the block's input took 12.5-16.7 us in layer3 on conv_i8_wgmma (a reduction of two
// 128-byte tiles: each block waits for its copies, computes briefly, then waits for its
// residual and its stores; three waves of such blocks) and 26 us in layer1 on conv_i8_mmas
// (one tile in flight a block), for 14 and 58 MB of traffic. A version of this kernel that
// copied with cp.async, as the implicit GEMMs do, took 40 us on layer1's expansion with five
// tiles in flight a block: the `fence.proxy.async` that must follow cp.async's writes before
// wgmma reads them compiles to MEMBAR.ALL.CTA (sm_90a SASS), and by the layer's time it
// waited for every copy the thread had in flight, the later tiles' too, a whole copy latency
// a tile. Here the tensor memory accelerator writes the tiles (the async proxy the tensor
// cores read through: no fence), one thread issuing a tile's copies, an mbarrier a stage
// counting their bytes.
//
// A block keeps its MMA_BN channels' weights (kpad <= WGS_MAX_KPAD bytes a row, in the wgmma
// kernels' 128-byte-swizzled K-major layout, a 64-row block of it for each 128 bytes of the
// reduction; copied with cp.async once, fenced once) and steps over WGS_BM-pixel tiles
// (grid-stride, as many blocks as run at once; stages and blocks an SM are the host's,
// `wgs_plans`). Each stage holds a tile's x rows (a TMA box of 128 bytes by WGS_BM rows for
// each 128 bytes of the reduction, 128-byte swizzle, zeros past cin and past m) and its int8
// residual (a box of MMA_BN channels by WGS_BM rows, 64-byte swizzle, so that the
// epilogue's reads are bank-conflict free); a stage is refilled with the tile `stages` on as
// soon as its tile is consumed, so all `stages` tiles are in flight while the block works.
//
// A tile is one wgmma m64n64k32 for each 32 bytes of the reduction. The weight rows are
// permuted as conv_i8_mmas's are (`mmas_channel`), so that the accumulator's columns 2 t4,
// 2 t4 + 1 of 8-column tiles 2 jp and 2 jp + 1 are channels 4 t4 .. 4 t4 + 3 of group jp: the
// epilogue runs on the sums in registers, a word of codes at a time, staged in one of two
// code tiles (ROWS_CODE_LD bytes a row), then out in 16-byte pieces. Needs what
// conv_i8_mmas needs but kpad: a multiple of MMA_BK up to WGS_MAX_KPAD. Dynamic shared
// memory as `wgs_smem_bytes` on the host: 1 KiB of slack to align, then `WgsSmem`.
//
// The kernel also runs a regrouped stem (`space_to_depth_stem` on the host: a stride-1 conv,
// no padding, filter rows of kw x cin = 64 or 128 bytes, over an input padded by the
// regrouping), whose window rows are contiguous: output pixel (y, x)'s taps of filter row a
// are the kw x cin bytes from input pixel (y + a, x) on. The x map's rows are then those
// windows, one an input position (rows cin bytes apart, overlapping), in boxes of kw x cin
// bytes (that swizzle);
// a tile is 64 output pixels of a row, tap a's box the windows of input row y + a, and a
// block walks down a strip of rows, copying one box a tile (`wgs_windows`). Positions past the
// output's width compute windows that wrap into the next row, and are not written. On an
// H200, ResNet-50's stem at batch 32 (a 4 x 4 conv of 16 channels over 115 x 115 blocks)
// took 44.7 us alone on the best other kernel, conv_i8_rows; 43.3 here with four boxes a
// tile and 45.9 with the ring, both computing the epilogue's constants every tile and the
// ring's slots by division (Nsight Compute: half the issue slots busy, 7.1 cycles between a
// warp's instructions); with those once a block and counted on, 35.2-35.4 in the engine's
// run, against 51.6-51.9 on conv_i8_rows.
#define WGS_BM 64
#define WGS_MAX_KPAD 1024
#define WGS_MAX_STAGES 6
#define WGS_MAX_BLOCKS 4
// A CUtensorMap as the driver encodes it (`cuTensorMapEncodeTiled`), passed by value.
struct __align__(64) TmaMap {
  unsigned long long v[16];
};
// A block's shared memory (from the 1024-aligned start): the weights (`xt` bytes: the x tile's
// room, 64 rows of 128 bytes for each 128 bytes of the reduction), the stages (each an x
// tile and a residual tile of 64 rows of MMA_BN bytes; for windows, `window` > 0, a box of 64
// rows of `window` bytes), two code tiles, the alphas and biases, an mbarrier a stage. The
// host's `wgs_smem_bytes` is this layout's end.
struct WgsSmem {
  int xt, stage, code, alpha, bar;
  __device__ __forceinline__ WgsSmem(int kpad, int stages, int window) {
    xt = (kpad + WG_BK - 1) / WG_BK * WGS_BM * WG_BK;
    stage = window > 0 ? WGS_BM * window : xt + WGS_BM * MMA_BN;
    code = xt + stages * stage;
    alpha = code + 2 * WGS_BM * ROWS_CODE_LD;
    bar = alpha + 2 * MMA_BN * 4;
  }
};
// How the kernel reads its input: kh == 0, a 1x1 conv's rows (`wgs_tiles`); else a stem's
// windows (`wgs_windows`): `cb` bytes a window row (128 or 64: the swizzle, the wgmma
// descriptors' layout), kh filter rows, the padded input's `vw` x `vh` positions an image and
// the output's `ow` x `oh` pixels.
struct WgsGeom {
  int cb, kh, vw, vh, ow, oh;
};
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// This thread's arrival, expecting `bytes` more of copies to complete the phase.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// Waits for the phase of parity `phase` to complete.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned phase) {
  asm volatile(
      "{\n.reg .pred p;\nWGS_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WGS_WAIT;\n}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
}
// The box of `map` at (c0 innermost, c1) into shared memory at dst, its bytes counted on bar.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap* map, int c0, int c1,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The int8 codes of a tile's sums: rows 16 warp + g and + 8, channels c .. c + 3 of each 16,
// the residual codes read from sr (16-byte piece jp of row r at piece jp ^ ((r >> 1) & 3),
// the 64-byte swizzle), the output codes staged in code tile sc. `base`: the epilogue's
// constants but the channels'; s_al, s_bi: the alphas and biases already divided by the
// output's scale (`epi_i8_of`'s, computed once a block, not a reciprocal and eight multiplies
// for every 16 channels of every tile).
template <int EA, bool RES>
__device__ __forceinline__ void wgs_codes(const int (&acc)[1][MMA_BN / 2], const unsigned char* sr,
                                          unsigned char* sc, const float* s_al, const float* s_bi,
                                          const EpiI8& base) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int r = (threadIdx.x >> 5) * 16 + g, sw = (r >> 1) & 3;
#pragma unroll
  for (int jp = 0; jp < MMA_BN / 16; jp++) {
    const int c = jp * 16 + 4 * t4;
    EpiI8 e = base;
    e.al = *(const float4*)(s_al + c);
    e.bi = *(const float4*)(s_bi + c);
    const int rp = ((jp ^ sw) << 4) + 4 * t4;
    const unsigned rv = RES ? *(const unsigned*)(sr + r * MMA_BN + rp) : 0u;
    const unsigned rv8 = RES ? *(const unsigned*)(sr + (r + 8) * MMA_BN + rp) : 0u;
    const int* lo = acc[0] + 8 * jp;
    const int* hi = lo + 4;
    *(unsigned*)(sc + r * ROWS_CODE_LD + c) =
        epi_i8_word_as<EA, RES>(e, make_int4(lo[0], lo[1], hi[0], hi[1]), rv);
    *(unsigned*)(sc + (r + 8) * ROWS_CODE_LD + c) =
        epi_i8_word_as<EA, RES>(e, make_int4(lo[2], lo[3], hi[2], hi[3]), rv8);
  }
}
// A 1x1 conv's (or Gemm rows') tiles: tile t's x rows, its reduction in boxes of WG_BK bytes,
// and its residual in a stage; tiles t, t + gridDim.y, ... in stages 0, 1, ... round robin.
template <int EA, bool RES>
__device__ __forceinline__ void wgs_tiles(unsigned char* smem, const WgsSmem& L,
                                          const TmaMap* xmap, const TmaMap* rmap,
                                          const EpiI8& base, signed char* y, int cout, int m,
                                          int kpad, int stages) {
  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * MMA_BN, tiles = (m + WGS_BM - 1) / WGS_BM;
  const int chunks = (kpad + WG_BK - 1) / WG_BK, chunk = WGS_BM * WG_BK;
  unsigned char* s_st = smem + L.xt;
  unsigned char* s_code = smem + L.code;
  const float* s_al = (const float*)(smem + L.alpha);
  const float* s_bi = s_al + MMA_BN;
  const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
  const unsigned st0 = sbase + L.xt, bar0 = sbase + L.bar;
  const unsigned tx = (unsigned)(RES ? L.stage : L.xt);
  // Tile `t` into stage `b` (one thread).
  auto load = [&](int t, int b) {
    const unsigned bar = bar0 + 8 * b, st = st0 + b * L.stage;
    mbar_expect_tx(bar, tx);
    for (int c = 0; c < chunks; c++) tma_load_2d(st + c * chunk, xmap, c * WG_BK, t * WGS_BM, bar);
    if (RES) tma_load_2d(st + L.xt, rmap, n0, t * WGS_BM, bar);
  };
  int t = blockIdx.y;
  if (tid == 0)
    for (int s = 0; s < stages; s++)
      if (t + s * (int)gridDim.y < tiles) load(t + s * gridDim.y, s);
  unsigned phases = 0;
  for (int b = 0, i = 0; t < tiles; t += gridDim.y, b = b == stages - 1 ? 0 : b + 1, i++) {
    mbar_wait(bar0 + 8 * b, (phases >> b) & 1);
    phases ^= 1u << b;
    int acc[1][MMA_BN / 2];
#pragma unroll
    for (int q = 0; q < MMA_BN / 2; q++) acc[0][q] = 0;
    const unsigned a = st0 + b * L.stage;
    wg_hold(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    // 64 bytes of the reduction a step (kpad is a multiple of MMA_BK = 64): a uniform trip
    // count, no test inside (ptxas serializes wgmma behind a branch around one).
    for (int kk = 0; kk < kpad; kk += 64) {
      const int off = (kk >> 7) * chunk + (kk & 127);
      wg_mma(acc[0], wg_desc(a + off), wg_desc(sbase + off));
      wg_mma(acc[0], wg_desc(a + off + 32), wg_desc(sbase + off + 32));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wg_hold(acc);
    unsigned char* sc = s_code + (i & 1) * WGS_BM * ROWS_CODE_LD;
    wgs_codes<EA, RES>(acc, s_st + b * L.stage + L.xt, sc, s_al, s_bi, base);
    // Every thread is done with stage b (its wgmma waited for, its residual read) and has
    // staged its codes; the stage takes the tile `stages` on. The code tile written two tiles
    // from now is this one, past the next tile's barrier.
    __syncthreads();
    const int ahead = t + stages * gridDim.y;
    if (tid == 0 && ahead < tiles) load(ahead, b);
    for (int q = tid; q < WGS_BM * 4; q += MMA_THREADS) {
      const int rr = q >> 2, p = q & 3, row = t * WGS_BM + rr, cc = n0 + p * 16;
      if (row < m && cc < cout)
        *(uint4*)(y + row * cout + cc) = *(const uint4*)(sc + rr * ROWS_CODE_LD + p * 16);
    }
  }
}
// A regrouped stem's tiles (its windows: G): tile k is output row yy of strip s (64 output
// pixels from u * 64 of image img's rows), its taps the window rows of input rows yy .. yy +
// kh - 1 from the same pixel, each a box of WGS_BM map rows of CB bytes. A block takes tiles
// k0 .. k1 - 1 (strip after strip, row after row) and keeps the boxes in a ring of `slots`
// box slots, an mbarrier each: a tile after the first of a strip needs one box more (the row
// below), so each input row is copied once a strip's stretch, not kh times. Box j goes in slot
// j % slots; after tile k the boxes no later tile needs are released (the first of its
// window, or all of them where the next tile starts a strip), and thread 0 copies the boxes
// up to `slots` past them. Tiles, strips and slots are counted on, not divided out (the
// kernel's note on the stem's time says why).
struct WgsCursor {
  int yy, u, img;
  // The next tile's place: the row below, or the next strip's first row.
  __device__ __forceinline__ void next(const WgsGeom& G, int xs) {
    if (++yy < G.oh) return;
    yy = 0;
    if (++u < xs) return;
    u = 0;
    img++;
  }
};
template <int EA, int CB>
__device__ __forceinline__ void wgs_windows(unsigned char* smem, const WgsSmem& L, WgsGeom G,
                                            const TmaMap* xmap, const EpiI8& base,
                                            signed char* y, int cout, int m, int slots) {
  const int tid = threadIdx.x, n0 = blockIdx.x * MMA_BN;
  constexpr int chunk = WGS_BM * CB;
  unsigned char* s_code = smem + L.code;
  const float* s_al = (const float*)(smem + L.alpha);
  const float* s_bi = s_al + MMA_BN;
  const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
  const unsigned slot0 = sbase + L.xt, bar0 = sbase + L.bar;
  const int xs = (G.ow + WGS_BM - 1) / WGS_BM, plane = G.vh * G.vw;
  const int total = m / plane * xs * G.oh, per = (total + gridDim.y - 1) / gridDim.y;
  const int k0 = blockIdx.y * per, k1 = min(total, k0 + per);
  if (k0 >= k1) return;
  const int s0 = k0 / G.oh;
  const WgsCursor first = {k0 - s0 * G.oh, s0 % xs, s0 / xs};
  // Thread 0's copies: box lj (in slot ls) is new row li of tile lk at lc (a strip's first
  // tile: its kh rows; the others: the row below their window).
  int lk = k0, li = 0, lj = 0, ls = 0;
  WgsCursor lc = first;
  auto issue = [&](int upto) {
    for (; lj < upto && lk < k1; lj++, ls = ls == slots - 1 ? 0 : ls + 1) {
      const bool fresh = lk == k0 || lc.yy == 0;
      const int row = lc.yy + (fresh ? li : G.kh - 1);
      mbar_expect_tx(bar0 + 8 * ls, chunk);
      tma_load_2d(slot0 + ls * chunk, xmap, 0, lc.img * plane + row * G.vw + lc.u * WGS_BM,
                  bar0 + 8 * ls);
      if (!fresh || ++li == G.kh) {
        li = 0;
        lk++;
        lc.next(G, xs);
      }
    }
  };
  if (tid == 0) issue(slots);
  // Boxes j0 .. jl are this tile's window, j0 in slot s0w; the boxes up to jw - 1 have been
  // waited for, box jw is in slot sw (its phase parity: bit sw of `phases`).
  WgsCursor c = first;
  unsigned phases = 0;
  for (int k = k0, i = 0, jl = -1, j0 = 0, s0w = 0, jw = 0, sw = 0; k < k1;
       k++, i++, c.next(G, xs)) {
    const int fresh = k == k0 || c.yy == 0 ? G.kh : 1;
    jl += fresh;
    if (fresh > 1) {
      j0 = jl - G.kh + 1;
      s0w = sw;
    } else if (k > k0) {  // a tile down the strip (k0's is fresh: the host asks kh >= 2)
      j0++;
      s0w = s0w == slots - 1 ? 0 : s0w + 1;
    }
    for (; jw <= jl; jw++, sw = sw == slots - 1 ? 0 : sw + 1) {
      mbar_wait(bar0 + 8 * sw, (phases >> sw) & 1);
      phases ^= 1u << sw;
    }
    int acc[1][MMA_BN / 2];
#pragma unroll
    for (int q = 0; q < MMA_BN / 2; q++) acc[0][q] = 0;
    wg_hold(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    // Tap a: its box's rows by the weights' chunk a, 32 bytes a wgmma.
    for (int a = 0, slot = s0w; a < G.kh; a++, slot = slot == slots - 1 ? 0 : slot + 1) {
      const unsigned xa = slot0 + slot * chunk, wa = sbase + a * chunk;
#pragma unroll
      for (int kb = 0; kb < CB; kb += 32) wg_mma(acc[0], wg_desc<CB>(xa + kb), wg_desc<CB>(wa + kb));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wg_hold(acc);
    unsigned char* sc = s_code + (i & 1) * WGS_BM * ROWS_CODE_LD;
    wgs_codes<EA, false>(acc, nullptr, sc, s_al, s_bi, base);
    // Every thread is done with this tile's boxes and has staged its codes.
    __syncthreads();
    if (tid == 0) issue((k + 1 < k1 && c.yy + 1 < G.oh ? j0 : jl) + 1 + slots);
    const int x0 = c.u * WGS_BM, orow = (c.img * G.oh + c.yy) * G.ow;
    for (int q = tid; q < WGS_BM * 4; q += MMA_THREADS) {
      const int rr = q >> 2, p = q & 3, cc = n0 + p * 16;
      if (x0 + rr < G.ow && cc < cout)
        *(uint4*)(y + (orow + x0 + rr) * cout + cc) =
            *(const uint4*)(sc + rr * ROWS_CODE_LD + p * 16);
    }
  }
}
#endif
// xmap: x as rows of boxes of cb bytes by WGS_BM rows, cb-byte swizzle (a 1x1 conv's: m rows
// of cin bytes, boxes of WG_BK; a stem's: its windows, `wgs_read` on the host); rmap: the
// int8 residual as [m rows of cout bytes], boxes of MMA_BN x WGS_BM, 64-byte swizzle (not read
// without a residual); both zero-filled out of bounds. m: a 1x1 conv's rows, or the padded
// input's positions for windows (images x vh x vw).
extern "C" __global__ void __launch_bounds__(MMA_THREADS, WGS_MAX_BLOCKS)
    conv_i8_wgmma_stream(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap rmap,
                         const signed char* w, const float* alpha, const float* bias,
                         MMA_EPI_PARAMS, int m, int kpad, int stages, WgsGeom geom) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_trigger();
  const int tid = threadIdx.x, n0 = blockIdx.x * MMA_BN, pieces = kpad >> 4;
  const unsigned raw = (unsigned)__cvta_generic_to_shared(mma_smem);
  unsigned char* smem = mma_smem + (((raw + 1023u) & ~1023u) - raw);
  const WgsSmem L(kpad, stages, geom.kh == 0 ? 0 : geom.cb);
  float* s_al = (float*)(smem + L.alpha);
  float* s_bi = s_al + MMA_BN;
  if (tid == 0) {
    const unsigned bar0 = (unsigned)__cvta_generic_to_shared(smem + L.bar);
    for (int s = 0; s < stages; s++) mbar_init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // Weight row (channel) mmas_channel(col) into B row col, in the x tiles' chunks of 64 rows
  // of cb bytes, swizzled as they are: 16-byte piece pp of row col at pp ^ (the row's bits
  // 7 on of its offset within 8 rows: col & 7 for 128-byte rows, (col >> 1) & 3 for 64).
  const int per = geom.cb >> 4, chunk = WGS_BM * geom.cb;
  for (int q = tid; q < MMA_BN * pieces; q += MMA_THREADS) {
    const int col = q / pieces, p = q - col * pieces, pp = p % per;
    const int at = (p / per) * chunk + col * geom.cb + ((pp ^ ((col * geom.cb >> 7) & (per - 1))) << 4);
    cp_async16(smem + at, w + (i64)(n0 + mmas_channel(col)) * kpad + p * 16, true);
  }
  copy_alpha_bias(s_al, s_bi, alpha, bias, n0, cout);
  asm volatile("cp.async.commit_group;\n" ::);
  // The weights, alphas and biases are constants: their copies overlap the previous kernel's
  // end. x and the residual are its output. The weights are the generic proxy's writes, read
  // by the tensor cores: fenced once, with no other copy of this thread in flight.
  pdl_wait();
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  // The alphas and biases divided by the output's scale once (as epi_i8_of divides them; one
  // a thread: MMA_THREADS is 2 * MMA_BN, the biases follow the alphas), the other constants
  // in `base`.
  const EpiI8 base = epi_i8_of(make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f),
                               res_scale, y_scale, act, a0, a1);
  s_al[tid] *= __frcp_rn(y_scale);
  __syncthreads();
  signed char* y8 = (signed char*)y;
  // One tile loop for each activation, residual and window width, chosen once (windows come
  // without a residual: the host offers none).
#define QS_WGS_TILES(EA)                                                                   \
  if (geom.kh == 0 && res_t == 2)                                                          \
    wgs_tiles<EA, true>(smem, L, &xmap, &rmap, base, y8, cout, m, kpad, stages);           \
  else if (geom.kh == 0)                                                                   \
    wgs_tiles<EA, false>(smem, L, &xmap, &rmap, base, y8, cout, m, kpad, stages);          \
  else if (geom.cb == WG_BK)                                                               \
    wgs_windows<EA, WG_BK>(smem, L, geom, &xmap, base, y8, cout, m, stages);               \
  else                                                                                     \
    wgs_windows<EA, 64>(smem, L, geom, &xmap, base, y8, cout, m, stages);
  EPI_I8_BY_ACT(act, QS_WGS_TILES)
#undef QS_WGS_TILES
#else
  pdl_enter();
  __trap();
#endif
}
