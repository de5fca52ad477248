// The int8 epilogue in integer steps, shared by the depthwise, pointwise and tensor-core int8
// convs (conv_dw.cu, conv_pw_i8.cu, conv_i8_mma.cu).

// The int8 conv kernels' epilogue where the output is int8, the residual int8 or absent and
// the activation ReLU, clip, SiLU, hard swish or none (the int8 layers of ResNets, MobileNets
// and EfficientNets): all in output steps (alpha, bias and the residual's scale times 1 / scale,
// once a thread), the activation's clip and int8 saturation one min / max pair, four codes
// packed into a word. The generic path (act_f, ld4, st4) spends several times the
// instructions, which are most of a memory-bound layer's.
//
// No conversion-unit instructions per element: on sm_90 the int8 <-> float conversions
// (I2F.S8, F2I) issue at a quarter of the FMA rate, and with eight an output word they were
// the tensor-core kernel's bottleneck on ResNet-50's memory-bound 1x1 layers (Nsight: the
// epilogue two thirds of the samples). A residual byte is sign-extended by one PRMT
// (`sext_byte`) and converted from int32 (I2FP, full rate); the rounding is an add of EPI_ROUND, after which the
// int8 code is the sum's low byte.
// The activations it computes beyond the clip of lo and hi (ReLU and clip are that clip): the
// template argument EA of the functions below, `kind` of EpiI8.
#define EPI_LINEAR 0
#define EPI_SILU 1
#define EPI_HSWISH 2
struct EpiI8 {
  float4 al, bi;
  float rsc, lo, hi, y_scale;
  int kind;
};
// 1.5 * 2^23: a float of magnitude below 2^22 plus this has an ulp of 1, so the sum is the
// value rounded to an integer (to nearest even, as __float2int_rn), and that integer in two's
// complement is the low bits of the sum's bit pattern. Clamping the sum to the rounded bounds
// is clamping the value then rounding (rounding is monotone); larger values land past the
// bounds either way.
#define EPI_ROUND 12582912.f
// Runs M(EA), a kernel's loop for activation EA, for activation code `act` (24 SiLU, 4 hard
// swish, the rest linear, as epi_i8_of maps them): the test is made once, outside the loop.
#define EPI_I8_BY_ACT(act, M) \
  if ((act) == 24) {          \
    M(EPI_SILU)               \
  } else if ((act) == 4) {    \
    M(EPI_HSWISH)             \
  } else {                    \
    M(EPI_LINEAR)             \
  }
__device__ __forceinline__ bool epi_i8_ok(int y_t, int res_t, int act) {
  return y_t == 2 && (res_t < 0 || res_t == 2) && (act <= 2 || act == 4 || act == 24);
}
// The epilogue constants of four channels whose alphas and biases are al and bi.
__device__ __forceinline__ EpiI8 epi_i8_of(float4 al, float4 bi, float res_scale,
                                           float y_scale, int act, float a0, float a1) {
  EpiI8 e;
  float inv = __frcp_rn(y_scale);
  e.al = make_float4(al.x * inv, al.y * inv, al.z * inv, al.w * inv);
  e.bi = make_float4(bi.x * inv, bi.y * inv, bi.z * inv, bi.w * inv);
  e.rsc = res_scale * inv;
  e.lo = (act == 1 ? 0.f : act == 2 ? fmaxf(a0 * inv, -128.f) : -128.f) + EPI_ROUND;
  e.hi = (act == 2 ? fminf(a1 * inv, 127.f) : 127.f) + EPI_ROUND;
  e.y_scale = y_scale;
  e.kind = act == 24 ? EPI_SILU : act == 4 ? EPI_HSWISH : EPI_LINEAR;
  return e;
}
// Channels c .. c + 3.
__device__ __forceinline__ EpiI8 epi_i8(const float* alpha, const float* bias, int c,
                                        float res_scale, float y_scale, int act, float a0,
                                        float a1) {
  return epi_i8_of(*(const float4*)(alpha + c), *(const float4*)(bias + c), res_scale, y_scale,
                   act, a0, a1);
}
// Byte `k` of the word r sign-extended to int32 in one PRMT: a selector nibble with its high
// bit set replicates the selected byte's sign (PTX prmt; CUDA's __byte_perm masks that bit
// off, and two shifts were twice the integer instructions on the epilogue's busiest pipe).
__device__ __forceinline__ int sext_byte(unsigned r, int k) {
  int v;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(v) : "r"(r), "r"(0x8880 + 0x1111 * k));
  return v;
}
// Sum s and the residual byte at bit `sh` of the word r -> a word whose low byte is the
// output code. Without RES the residual is not read (the callers that may run without one and
// branch once outside their loop: a zero residual word still cost a PRMT, a conversion and an
// FFMA an element, a third of a residual-free layer's epilogue).
// Hard swish in output steps v (x = v * y_scale): x * clip(x + 3, 0, 6) / 6 is
// v * clip(x + 3, 0, 6) / 6 steps. MobileNetV3's int8 layers took the generic path without it.
template <int EA, bool RES = true>
__device__ __forceinline__ unsigned epi_i8_one(const EpiI8& e, int s, float al, float bi,
                                               unsigned r, int sh) {
  float v = RES ? fmaf((float)s, al, fmaf((float)sext_byte(r, sh >> 3), e.rsc, bi))
                : fmaf((float)s, al, bi);
  if (EA == EPI_SILU) v = __fdividef(v, 1.f + __expf(-v * e.y_scale));
  if (EA == EPI_HSWISH)
    v = v * fminf(fmaxf(fmaf(v, e.y_scale, 3.f), 0.f), 6.f) * (1.f / 6.f);
  return __float_as_uint(fminf(fmaxf(v + EPI_ROUND, e.lo), e.hi));
}
template <int EA, bool RES = true>
__device__ __forceinline__ unsigned epi_i8_word_as(const EpiI8& e, int4 s, unsigned r) {
  unsigned q0 = epi_i8_one<EA, RES>(e, s.x, e.al.x, e.bi.x, r, 0),
           q1 = epi_i8_one<EA, RES>(e, s.y, e.al.y, e.bi.y, r, 8),
           q2 = epi_i8_one<EA, RES>(e, s.z, e.al.z, e.bi.z, r, 16),
           q3 = epi_i8_one<EA, RES>(e, s.w, e.al.w, e.bi.w, r, 24);
  return __byte_perm(__byte_perm(q0, q1, 0x0040), __byte_perm(q2, q3, 0x0040), 0x5410);
}
// Four int32 sums of channels c .. c + 3 and their residual codes (a word, zero if none) ->
// the output word. One branch a word on the activation: a test a channel was 4 of the 50
// instructions of conv_i8_mma's epilogue word (sm_90 SASS), the compiler not hoisting it.
__device__ __forceinline__ unsigned epi_i8_word(const EpiI8& e, int4 s, unsigned r) {
  switch (e.kind) {
    case EPI_SILU: return epi_i8_word_as<EPI_SILU>(e, s, r);
    case EPI_HSWISH: return epi_i8_word_as<EPI_HSWISH>(e, s, r);
    default: return epi_i8_word_as<EPI_LINEAR>(e, s, r);
  }
}
