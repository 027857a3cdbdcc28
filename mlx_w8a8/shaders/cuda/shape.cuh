// Sizes of a kernel's activation arrays, shared by every kernel file (required by
// common.cuh and quantize.cuh). A header-only file.
//
// Activations reach the kernels as MLX gives them, [..., K] of any rank (a model's
// [B, L, K]), never reshaped to 2-D first: a reshape is a node of MLX's graph, and its
// host cost per call is what this package removes from the hot path. Row-contiguous
// inputs (the launchers ask MLX for them) make [..., K] the same bytes as [M, K].

namespace w8a8 {

// M: the product of every dimension but the last (1 for a 1-D array).
template <typename S>
__device__ __forceinline__ int rows(const S& shape, int ndim) {
  int m = 1;
  for (int i = 0; i + 1 < ndim; ++i) m *= shape[i];
  return m;
}

// The per-channel GEMM's activation array (quantize.rowsum_shape): the unsigned-code
// GEMMs' one activation input and the `rowsum` quantize bodies' one output. Each array a
// launch names costs host time on every call (measured on an NVIDIA H200: about 2.7 us
// per output, 0.5 us per input; docs/cuda.md "Host time per launch"), so the codes, the
// scales, the row sums and room for the TMA GEMM's tensor map of the codes travel as one
// int8 array [R, K], R = M + ceil((8 M + 256) / K):
//   bytes [0, M K)            the codes q [M, K]
//   bytes [M K, M K + 4 M)    the float32 scales s [M]
//   bytes [M K + 4 M, + 4 M)  the int32 row sums R_m = sum_k q_mk [M]
//   bytes up to R K           the map area (kRowsumMapArea bytes, then fewer than K):
//                             zero as the quantize writes it; a TMA GEMM reading the
//                             array writes A's tensor map into it (128 bytes at the
//                             first 128-byte aligned address at or after the row sums'
//                             end: rowsum_map), every launch from its own address
//                             (gemm_ws.cu TmaMaps)
// Two dimensions, not one of M (K + 8) + 256 bytes, so that no dimension passes MLX's
// int32 limit before M itself would (R < 2^31: quantize.ROWSUM_MAX_ROWS).
// Alignment: K % 8 == 0 (the quantize's bound), so the scales start 8-byte aligned and the
// row sums 4-byte aligned. The map's place depends on the array's address, not only on M
// and K: the GEMM computes it from the pointer it receives.
//
// M from R: R K = M (K + 8) + 256 + e with e = ceil((8 M + 256) / K) K - 8 M - 256 in
// [0, K), so M = floor((R K - 256) / (K + 8)) exactly, for every M
// (quantize.rowsum_rows_m). The kernels compute it in 32-bit integers, never dividing
// 64-bit ones (a 64-bit division is a subroutine call, which cost the rowsum quantize 16
// registers: 96 against 80): with R = q (K + 8) + r,
// floor((R K - 256) / (K + 8)) = q K + r - ceil((8 r + 256) / (K + 8)), every term below
// 2^31 (q K <= M; 8 r + 256 < 8 (K + 8) + 256). tests/test_cuda_compile.py models this
// arithmetic with its bounds.
constexpr int kRowsumMapArea = 256;  // 128 map bytes + up to 127 to align them

__device__ __forceinline__ long long rowsum_scales_at(int m, int k) { return (long long)m * k; }

__device__ __forceinline__ long long rowsum_sums_at(int m, int k) {
  return (long long)m * k + 4ll * m;
}

__device__ __forceinline__ int rowsum_m(int r, int k) {
  const int q = r / (k + 8), rem = r % (k + 8);
  return q * k + rem - (8 * rem + kRowsumMapArea + k + 7) / (k + 8);
}

// The bytes after the row sums: ceil((8 M + 256) / K) K - 8 M = ceil((8 t + 256) / K) K -
// 8 t with t = M mod K (8 M and 8 t differ by a multiple of 8 K): 256 to 256 + K - 1.
__device__ __forceinline__ int rowsum_tail(int m, int k) {
  const int t = m % k;
  return (8 * t + kRowsumMapArea + k - 1) / k * k - 8 * t;
}

// A's tensor map in the array at xa of M rows: 128 bytes at the first 128-byte aligned
// address at or after the row sums' end (inside the map area: at most 127 + 128 bytes).
__device__ __forceinline__ uintptr_t rowsum_map(const int8_t* xa, int m, int k) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(xa + rowsum_sums_at(m, k) + 4ll * m);
  return (end + 127) & ~static_cast<uintptr_t>(127);
}

// A GEMM's view of the array: codes, M, K, scales, row sums and the place of A's tensor
// map (written only by the TMA GEMM: gemm_ws.cu TmaMaps).
struct RowsumActs {
  const int8_t* q;
  int m;
  int k;
  const float* scale;
  const int32_t* sums;
  uintptr_t map;
};

template <typename S>
__device__ __forceinline__ RowsumActs rowsum_acts(const int8_t* xa, const S& shape) {
  const int k = shape[1];
  const int m = rowsum_m(shape[0], k);
  return {xa, m, k, reinterpret_cast<const float*>(xa + rowsum_scales_at(m, k)),
          reinterpret_cast<const int32_t*>(xa + rowsum_sums_at(m, k)), rowsum_map(xa, m, k)};
}

// The quantize's view of the array it writes (M, K: its input's rows and row length).
struct RowsumOut {
  int8_t* q;
  float* scale;
  int32_t* sums;
};

__device__ __forceinline__ RowsumOut rowsum_out(int8_t* xa, int m, int k) {
  return {xa, reinterpret_cast<float*>(xa + rowsum_scales_at(m, k)),
          reinterpret_cast<int32_t*>(xa + rowsum_sums_at(m, k))};
}

// Block 0 zeroes the bytes after the row sums (rowsum_tail): the array is then defined in
// every byte, whichever quantize body wrote it. Call it where the whole block may return
// (it has no barrier).
__device__ __forceinline__ void rowsum_zero_tail(int8_t* xa, int m, int k) {
  if (blockIdx.x != 0) return;
  int8_t* tail = xa + rowsum_sums_at(m, k) + 4ll * m;
  for (int i = threadIdx.x, n = rowsum_tail(m, k); i < n; i += blockDim.x) tail[i] = 0;
}

}  // namespace w8a8
