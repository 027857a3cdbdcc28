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

}  // namespace w8a8
