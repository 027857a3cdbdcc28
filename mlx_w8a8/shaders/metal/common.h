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
