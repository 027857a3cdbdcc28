// What the two GEMV files (gemv.cu, gemv_mma.cu) share: MLX's packed 4-bit codes
// expanded to bytes in registers, the exact int-to-float step of a group's sums, and the
// members of a sibling launch. A header-only file ("// @@ requires gemv.cuh").

namespace w8a8 {

// Integer sums that start from kBiased instead of 0 (an MMA's or dp4a's accumulator)
// hold v + 0x4B400000 for their value v, and for -2^22 <= v < 2^22 those bits read as a
// float32 are 1.5 * 2^23 + v exactly, so biased_to_float returns float(v) with one
// exact float subtract. The conversion it replaces (I2FP, cvt.rn.f32.s32) runs on
// sm_90's quarter-rate conversion pipe, and the grouped GEMVs convert every group's
// sums (on an H100 the tensor-core GEMV's time did not change with it: docs/cuda.md).
// Invariant (callers): |v| < 2^22. A group's sum of at most 128 products of int8 codes
// and q - 128 (or 4-bit codes) is at most 128 * 127 * 128 < 2^21; activation-code sums
// are smaller.
constexpr int kBiased = 0x4B400000;
__device__ __forceinline__ float biased_to_float(int biased) {
  return __fsub_rn(__int_as_float(biased), 12582912.0f);  // 1.5 * 2^23
}

// Eight 4-bit codes of one word (code j in bits 4j .. 4j + 3) as eight bytes in element
// order: lo holds codes 0, 2, 4, 6 and hi codes 1, 3, 5, 7 in their bytes; the permutes
// interleave them (selector nibble i picks byte i of the result: 0-3 from lo, 4-7 from hi).
__device__ __forceinline__ void expand_word4(uint32_t w, uint32_t& b0, uint32_t& b1) {
  const uint32_t lo = w & 0x0F0F0F0Fu;
  const uint32_t hi = (w >> 4) & 0x0F0F0F0Fu;
  b0 = __byte_perm(lo, hi, 0x5140);  // codes 0, 1, 2, 3
  b1 = __byte_perm(lo, hi, 0x7362);  // codes 4, 5, 6, 7
}


// The weights of a sibling launch (q/k/v, gate/up: 2 or 3 members fed the same x):
// member g is w[g] [n[g], K * WB / 32] codes with its scales ws[g], offsets wo[g]
// (grouped; null per-channel), bias[g] (null without) and output y[g] [M, n[g]]. Members
// are selected with unrolled compile-time indices only (a runtime index would put the
// arrays in local memory).
template <typename T, typename ST, int G, typename OT = float>
struct GemvMembers {
  const uint32_t* w[G];
  const ST* ws[G];
  const OT* wo[G];
  const float* bias[G];
  T* y[G];
  int n[G];
};

}  // namespace w8a8
