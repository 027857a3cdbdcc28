// Shared helpers for the W8A8 Metal kernels (prepended to every kernel's header).
//
// Activations and outputs of dtype bfloat16 travel as their uint16 bit patterns (the
// launch code views them as uint16): widening bfloat16 -> float32 is a 16-bit shift
// and narrowing rounds to nearest even here, bit for bit as MLX's astype does.
// MLX binds an input of fewer than 8 elements in `constant` memory and larger ones in
// `device` memory (mlx/backend/common/metal_kernel.cpp, max_constant_array_size), so a
// helper that takes an input pointer is either address-space generic or overloaded for
// both spaces, and no kernel casts an input pointer to another address space: Metal
// rejects every such cast, even in a branch that is never taken at run time.
#include <metal_stdlib>
using namespace metal;

// float32 -> bfloat16 bits, round to nearest even; a NaN stays a (quiet) NaN.
METAL_FUNC uint16_t w8a8_bf16_bits(float v) {
  uint u = as_type<uint>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return uint16_t((u >> 16) | 0x40u);
  }
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bfloat16 bits -> float32 (exact).
METAL_FUNC float w8a8_bf16_float(uint bits) {
  return as_type<float>(bits << 16);
}

// A quiet float32 NaN (the scale of a row holding NaN or +-Inf).
METAL_FUNC float w8a8_nan() {
  return as_type<float>(0x7fc00000u);
}

// Stored weight code -> signed int8 weight: q ^ 0x80 == q - 128 for q in [0, 255].
// FLIP is false when the operand already is int8 (the raw int8_matmul op).
#define W8A8_WEIGHT(FLIP, v) ((FLIP) ? int(int8_t(uint8_t(v) ^ uint8_t(0x80))) : int(int8_t(v)))

// Read element i of an activation array as float; BF16 when it holds bfloat16 bits.
#define W8A8_LOAD_F(BF16, ptr, i) ((BF16) ? w8a8_bf16_float(uint(ptr[i])) : float(ptr[i]))

// Four consecutive 8-bit values starting at p. From `device` memory one 4-byte vector
// load (p must be 4-byte aligned); from `constant` memory (an input of fewer than 8
// elements) four scalar loads. Overload resolution on the pointer's address space picks
// the load at compile time, so the vector cast is only ever written for `device`.
METAL_FUNC char4 w8a8_load4(const device int8_t* p) {
  return *((const device char4*)p);
}
METAL_FUNC char4 w8a8_load4(const constant int8_t* p) {
  return char4(int8_t(p[0]), int8_t(p[1]), int8_t(p[2]), int8_t(p[3]));
}
METAL_FUNC uchar4 w8a8_load4(const device uint8_t* p) {
  return *((const device uchar4*)p);
}
METAL_FUNC uchar4 w8a8_load4(const constant uint8_t* p) {
  return uchar4(uint8_t(p[0]), uint8_t(p[1]), uint8_t(p[2]), uint8_t(p[3]));
}

// Weight operands, overloaded on the stored element type (resolved at compile time, so
// one kernel body serves every format; MODE 2's per-group promotion is the same for
// 8-bit and 4-bit codes):
// - int8_t / uint8_t: an [N, K] matrix of 8-bit values (raw int8, or stored 8-bit codes
//   the caller flips with W8A8_WEIGHT);
// - uint32_t: MLX's packed 4-bit codes, [N, K / 8] words, code j of a word in bits
//   4j .. 4j + 3 (element 2i is the low nibble of byte i). K % 8 == 0. The codes are
//   unsigned, 0..15, used as they are (no flip; FLIP is false for them).
// w8a8_weight(p, n, k, K): element (n, k). w8a8_weights4(p, n, k, K): elements
// (n, k .. k + 3), k % 4 == 0; for 8-bit values row n must start 4-byte aligned
// (K % 4 == 0 and an aligned buffer): one 4-byte load. For 4-bit codes the four lie in
// one word (k % 4 == 0), one 4-byte load whatever K.
METAL_FUNC uchar4 w8a8_nibbles4(uint word, int k) {
  const uint h = word >> (4 * (k & 7));
  return uchar4(uchar(h & 0xFu), uchar((h >> 4) & 0xFu), uchar((h >> 8) & 0xFu), uchar((h >> 12) & 0xFu));
}
METAL_FUNC uint w8a8_nibble(uint word, int k) {
  return (word >> (4 * (k & 7))) & 0xFu;
}
METAL_FUNC int8_t w8a8_weight(const device int8_t* p, int n, int k, int K) { return p[size_t(n) * K + k]; }
METAL_FUNC int8_t w8a8_weight(const constant int8_t* p, int n, int k, int K) { return p[size_t(n) * K + k]; }
METAL_FUNC uint8_t w8a8_weight(const device uint8_t* p, int n, int k, int K) { return p[size_t(n) * K + k]; }
METAL_FUNC uint8_t w8a8_weight(const constant uint8_t* p, int n, int k, int K) { return p[size_t(n) * K + k]; }
METAL_FUNC uint8_t w8a8_weight(const device uint32_t* p, int n, int k, int K) {
  return uint8_t(w8a8_nibble(p[size_t(n) * (K / 8) + k / 8], k));
}
METAL_FUNC uint8_t w8a8_weight(const constant uint32_t* p, int n, int k, int K) {
  return uint8_t(w8a8_nibble(p[size_t(n) * (K / 8) + k / 8], k));
}
METAL_FUNC char4 w8a8_weights4(const device int8_t* p, int n, int k, int K) {
  return w8a8_load4(p + size_t(n) * K + k);
}
METAL_FUNC char4 w8a8_weights4(const constant int8_t* p, int n, int k, int K) {
  return w8a8_load4(p + size_t(n) * K + k);
}
METAL_FUNC uchar4 w8a8_weights4(const device uint8_t* p, int n, int k, int K) {
  return w8a8_load4(p + size_t(n) * K + k);
}
METAL_FUNC uchar4 w8a8_weights4(const constant uint8_t* p, int n, int k, int K) {
  return w8a8_load4(p + size_t(n) * K + k);
}
METAL_FUNC uchar4 w8a8_weights4(const device uint32_t* p, int n, int k, int K) {
  return w8a8_nibbles4(p[size_t(n) * (K / 8) + k / 8], k);
}
METAL_FUNC uchar4 w8a8_weights4(const constant uint32_t* p, int n, int k, int K) {
  return w8a8_nibbles4(p[size_t(n) * (K / 8) + k / 8], k);
}
