// What the two GEMV files (gemv.cu, gemv_mma.cu) share: MLX's packed 4-bit codes
// expanded to bytes in registers, and the members of a sibling launch. A header-only
// file ("// @@ requires gemv.cuh").

namespace w8a8 {

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
