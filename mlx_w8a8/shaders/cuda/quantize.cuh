// Per-token int8 quantization, the element-level steps shared by the quantize kernels
// (quantize.cu) and the fused decode kernel (gemv.cu): 16-byte loads of 8 elements, the
// row scale and the codes of docs/numerics.md. A header-only file ("// @@ requires
// quantize.cuh").
//
// Exactness: scale = amax / 127 and x / scale are IEEE round-to-nearest divisions
// (__fdiv_rn, never a reciprocal multiply, which fast-math could substitute), and
// rintf rounds half to even, so codes match the float64 oracle bit for bit.
// @@ requires shape.cuh

namespace w8a8 {

// Eight consecutive elements of T as raw 16-byte words (one for float16/bfloat16, two
// for float32), and their float values.
template <typename T>
struct Raw8 {
  uint4 w[sizeof(T) / 2];
};

template <typename T>
__device__ __forceinline__ Raw8<T> load_raw8(const T* p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 2); ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}

__device__ __forceinline__ void decode8(const Raw8<__half>& r, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&r.w[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ void decode8(const Raw8<__nv_bfloat16>& r, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r.w[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ void decode8(const Raw8<float>& r, float (&f)[8]) {
  const float4 u = reinterpret_cast<const float4&>(r.w[0]);
  const float4 v = reinterpret_cast<const float4&>(r.w[1]);
  f[0] = u.x; f[1] = u.y; f[2] = u.z; f[3] = u.w;
  f[4] = v.x; f[5] = v.y; f[6] = v.z; f[7] = v.w;
}

template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&f)[8]) {
  decode8(load_raw8(p), f);
}

// |v| with NaN mapped to +inf, so a max over it is not-finite iff the row holds NaN/Inf
// (fmaxf alone would drop NaNs).
__device__ __forceinline__ float abs_or_inf(float v) {
  const float a = fabsf(v);
  return a == a ? a : __int_as_float(0x7f800000);
}

// The row scale from amax: (scale, usable). Not-finite amax -> NaN scale, codes 0;
// amax 0 -> scale 0, codes 0.
__device__ __forceinline__ float row_scale(float amax, bool& usable) {
  const bool finite = amax <= 3.402823466e38f;  // false for +inf
  usable = finite && amax > 0.f;
  return finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);
}

// Codes of 8 values, packed little-endian into two words; returns their sum.
__device__ __forceinline__ int quantize8(const float (&f)[8], float s, bool usable,
                                         uint32_t (&packed)[2]) {
  int sum = 0;
  packed[0] = packed[1] = 0u;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int v = 0;
    if (usable) {
      float r = rintf(__fdiv_rn(f[i], s));
      r = fminf(fmaxf(r, -127.f), 127.f);
      v = static_cast<int>(r);
    }
    sum += v;
    packed[i >> 2] |= (static_cast<uint32_t>(v) & 0xffu) << ((i & 3) * 8);
  }
  return sum;
}

}  // namespace w8a8
