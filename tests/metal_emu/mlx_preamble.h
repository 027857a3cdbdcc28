// Stand-in for MLX's Metal preamble: MLX compiles every metal_kernel library as
// `metal::utils() + source`, where metal::utils() is MLX's kernels/utils.h (with
// bf16.h and complex.h) expanded. It puts `using namespace metal` and these names in
// the global namespace, so a kernel header that defines one of them again fails to
// compile on a Mac; the emulator declares them so it fails here too. Bodies are only
// given where a kernel could plausibly call the helper.
#pragma once

using namespace metal;

struct mlx_emu_bfloat16 {  // bf16.h: the bfloat16 type (no arithmetic emulated)
  uint16_t bits;
};
typedef mlx_emu_bfloat16 bfloat16_t;
struct complex64_t {  // complex.h
  float real, imag;
};

template <typename U> struct Limits;  // utils.h: type limits
template <> struct Limits<float> {
  static constexpr float max = __builtin_inff(), min = -__builtin_inff();
  static constexpr float finite_max = 3.402823466e38f, finite_min = -3.402823466e38f;
};
template <> struct Limits<int> {
  static constexpr int max = 2147483647, min = -2147483647 - 1;
};

// utils.h: indexing helpers (names only matter for collisions).
inline size_t elem_to_loc(uint elem, const __attribute__((address_space(1))) int* shape,
                          const __attribute__((address_space(1))) int64_t* strides, int ndim) {
  size_t loc = 0;
  for (int i = ndim - 1; i >= 0; --i) {
    loc += (elem % shape[i]) * strides[i];
    elem /= shape[i];
  }
  return loc;
}
inline size_t elem_to_loc(uint elem, const __attribute__((address_space(2))) int* shape,
                          const __attribute__((address_space(2))) int64_t* strides, int ndim) {
  size_t loc = 0;
  for (int i = ndim - 1; i >= 0; --i) {
    loc += (elem % shape[i]) * strides[i];
    elem /= shape[i];
  }
  return loc;
}
template <typename T, typename U> inline T ceildiv(T n, U m) { return (n + m - 1) / m; }
template <typename U, int N = 8> struct WorkPerThread {
  static constexpr int n = N;
};
