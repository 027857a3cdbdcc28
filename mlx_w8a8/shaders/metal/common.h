// Shared helpers for the W8A8 Metal kernels (prepended to every kernel's header).
//
// Activations and outputs of dtype bfloat16 travel as their uint16 bit patterns (the
// launch code views them as uint16): widening bfloat16 -> float32 is a 16-bit shift
// and narrowing rounds to nearest even here, bit for bit as MLX's astype does.
// Pointers are never spelled with an address space in these helpers: MLX binds an
// input of fewer than 8 elements in `constant` memory and larger ones in `device`
// memory, so a helper taking `const device T*` would not compile for a small input.
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
