// The batched matmul of computed tensors (`Step::MatMul`, the planner's `ops::matmul`): float
// tiles in shared memory, operands of any dtype.

// Batched row-major matmul: y[bt] (m x n) = a[bt] (m x k) * B[bt], B k x n, or n x k when
// trans_b; a_stride / b_stride: elements between batches (0 broadcasts). b_t < 0: B is an f32
// constant buffer. 32 x 32 output tiles in shared memory, block (32, 8), each thread 4 rows;
// f32 accumulation; grid (n tiles, m tiles, batch), grid-stride over m tiles and batches.
#define MM_T 32
extern "C" __global__ void matmul(const void* a, int a_t, float a_scale, const void* b, int b_t,
                                  float b_scale, void* y, int y_t, float y_scale, i64 batch, int m,
                                  int n, int k, i64 a_stride, i64 b_stride, int trans_b) {
  pdl_enter();
  __shared__ float as[MM_T][MM_T + 1];
  __shared__ float bs[MM_T][MM_T + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int col0 = blockIdx.x * MM_T;
  for (i64 bt = blockIdx.z; bt < batch; bt += gridDim.z) {
    i64 ab = bt * a_stride, bb = bt * b_stride;
    for (i64 row0 = (i64)blockIdx.y * MM_T; row0 < m; row0 += (i64)gridDim.y * MM_T) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < k; k0 += MM_T) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
          int rr = ty + 8 * r;
          i64 gr = row0 + rr;
          int gk = k0 + tx;
          as[rr][tx] = (gr < m && gk < k) ? ld(a, a_t, ab + gr * k + gk, a_scale) : 0.f;
          if (trans_b) {
            // B is n x k: read along k so a warp's loads are contiguous.
            int gc = col0 + rr;
            bs[tx][rr] = (gc < n && gk < k) ? ldc(b, b_t, bb + (i64)gc * k + gk, b_scale) : 0.f;
          } else {
            int bk = k0 + rr, gc = col0 + tx;
            bs[rr][tx] = (bk < k && gc < n) ? ldc(b, b_t, bb + (i64)bk * n + gc, b_scale) : 0.f;
          }
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < MM_T; kk++) {
          float bv = bs[kk][tx];
#pragma unroll
          for (int r = 0; r < 4; r++) acc[r] += as[ty + 8 * r][kk] * bv;
        }
        __syncthreads();
      }
#pragma unroll
      for (int r = 0; r < 4; r++) {
        i64 gr = row0 + ty + 8 * r;
        int gc = col0 + tx;
        if (gr < m && gc < n) st(y, y_t, (bt * m + gr) * n + gc, acc[r], y_scale);
      }
    }
  }
}
