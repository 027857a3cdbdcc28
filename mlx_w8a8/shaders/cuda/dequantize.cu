// Dequantize MLX's affine weights as stored (8-bit or 4-bit codes q, per-group scales s
// and biases b of the activation dtype T, bfloat16 or float16) into a float weight
//   w[n, k] = T(s[n, g(k)] q[n, k] + b[n, g(k)])      (one rounding: dequant.cuh)
// for MLX's float GEMM to multiply (kernels/cuda/dequant_matmul.py: the weight is a
// temporary of one linear call).
//
// One thread per 16 consecutive codes of the row-major [N, K] weight: 16 bytes of 8-bit
// codes (one 16-byte load) or 8 of 4-bit ones (one 8-byte load), the group's (s, b) as
// one T pair each, 16 weights of T written as two 16-byte stores. A memory-bound pass:
// per weight 1 (or 0.5) byte read and 2 written.
//
// Invariants (kernels/cuda/dequant_matmul.py): K % GS == 0 and GS in {32, 64, 128}, so
// K % 16 == 0 and a thread's 16 codes lie in one row and one group; the codes' rows are
// K * BITS / 32 words; grid of ceil(N K / 16) threads (those past the end return);
// MLX's arrays are 16-byte aligned, so a thread's loads and stores are aligned.
// @@ requires dequant.cuh

namespace w8a8 {

template <typename T, int BITS, int GS>
__device__ __forceinline__ void dequantize_weight(const uint32_t* w, const T* ws, const T* wb,
                                                  T* y, int N, int K) {
  static_assert(BITS == 8 || BITS == 4, "8-bit or 4-bit codes");
  static_assert(GS % 16 == 0, "a thread's 16 codes lie in one group");
  const size_t chunk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (chunk >= (size_t)N * (K / 16)) return;
  const size_t e = chunk * 16;  // the first code's element index
  const size_t row = e / K;
  const size_t g = row * (K / GS) + (e - row * K) / GS;
  const uint16_t sb = reinterpret_cast<const uint16_t*>(ws)[g];
  const uint16_t bb = reinterpret_cast<const uint16_t*>(wb)[g];
  const uint32_t s2 = sb | ((uint32_t)sb << 16), b2 = bb | ((uint32_t)bb << 16);
  uint32_t out[8];  // weight pairs in code order
  if constexpr (BITS == 8) {
    const uint4 v = reinterpret_cast<const uint4*>(w)[chunk];  // codes 16 c .. 16 c + 15
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    uint32_t lo0, hi0, lo2, hi2;
    DqType<T>::selectors(0, lo0, hi0);
    DqType<T>::selectors(2, lo2, hi2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = DqType<T>::fma2(DqType<T>::codes8(words[i], lo0, hi0), s2, b2);
      out[2 * i + 1] = DqType<T>::fma2(DqType<T>::codes8(words[i], lo2, hi2), s2, b2);
    }
  } else {
    const uint2 v = reinterpret_cast<const uint2*>(w)[chunk];  // 16 nibbles, low first
    const uint32_t words[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int b = 0; b < 4; ++b)
        out[4 * i + b] = DqType<T>::fma2(dq_codes4<T>(words[i], 0x4440u | b), s2, b2);
  }
  uint4* dst = reinterpret_cast<uint4*>(y + e);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace w8a8

// @@ body dequantize
// w [N, K * BITS / 32] uint32 (MLX's packed codes), ws, wb [N, K / GS] (T) -> y [N, K] (T).
w8a8::dequantize_weight<T, BITS, GS>(w, ws, wb, y, ws_shape[0], ws_shape[1] * GS);
