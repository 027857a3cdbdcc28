// Code shared by every int8 GEMM (gemm.cu, gemm_wgmma.cu, gemm_ws.cu): cp.async copies,
// the swizzled shared-memory tile layout, tile rasterization, output stores and the
// per-channel epilogue. A header-only file: the GEMM files name it with
// "// @@ requires common.cuh" and the launcher puts it, once, before their headers.
//
// Operand conventions (B's byte interpretation WB, exactness bounds, zero-filled tails)
// are described at the top of gemm.cu.
// @@ requires shape.cuh

namespace w8a8 {

constexpr int kBK = 128;  // bytes (= int8 elements) of K per pipeline stage

// How B's bytes are multiplied (see the top of the file).
constexpr int kWeightS8 = 0, kWeightFlip = 1, kWeightU8 = 2;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Byte offset of 16-byte chunk `chunk` (0..7) of tile row `row` (rows are kBK = 128 bytes).
// XOR swizzle: the 8 rows one ldmatrix phase reads (same logical chunk) land in 8
// different 16-byte bank groups, so ldmatrix and the cp.async stores are conflict-free.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) << 4);
}

// One block's operand tiles for the cp.async GEMMs (gemm.cu, gemm_wgmma.cu): A [M, K]
// from row m0 and B [N, K] from row n0 (int8, row-major), staged in a ring in shared
// memory at smem, each stage BM rows of A then BN rows of B, kBK bytes of K per row in
// the swizzled layout (swz). load_stage issues this thread's share (THREADS threads) of
// the 16-byte cp.async copies of k-tile kt into a stage; rows past M / N and bytes past K
// are zero-filled (nothing read).
// Hazard: SOURCE_FIRST (the copy's source address computed before its shared-memory
// address, or after) changes nothing but ptxas's schedule, yet it does change it: gemm.cu
// takes true and gemm_wgmma.cu false, the machine code their tuning tables were measured
// on (bench/sass_diff.py). One order for both is a change to re-measure.
template <int BM, int BN, int THREADS>
struct TileOperands {
  static constexpr int kThreads = THREADS;
  static constexpr int kStageBytes = (BM + BN) * kBK;
  static_assert((BM * 8) % THREADS == 0 && (BN * 8) % THREADS == 0, "tile load split");

  const int8_t* a;
  const int8_t* b;
  int M, N, K;
  int m0, n0;  // tile origin
  unsigned char* smem;

  template <bool SOURCE_FIRST>
  __device__ __forceinline__ void load_stage(int stage, int kt) const {
    const int tid = threadIdx.x;
    const int k0 = kt * kBK;
    unsigned char* sa = smem + stage * kStageBytes;
    unsigned char* sb = sa + BM * kBK;
#pragma unroll
    for (int i = 0; i < (BM * 8) / THREADS; ++i) {
      const int idx = tid + i * THREADS;
      const int row = idx >> 3, chunk = idx & 7;
      const int gm = m0 + row, gk = k0 + chunk * 16;
      const bool ok = gm < M && gk < K;
      if constexpr (SOURCE_FIRST) {
        const int8_t* src = ok ? a + (size_t)gm * K + gk : a;
        cp_async_16(smem_addr(sa + swz(row, chunk)), src, ok);
      } else {
        cp_async_16(smem_addr(sa + swz(row, chunk)), ok ? a + (size_t)gm * K + gk : a, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < (BN * 8) / THREADS; ++i) {
      const int idx = tid + i * THREADS;
      const int row = idx >> 3, chunk = idx & 7;
      const int gn = n0 + row, gk = k0 + chunk * 16;
      const bool ok = gn < N && gk < K;
      if constexpr (SOURCE_FIRST) {
        const int8_t* src = ok ? b + (size_t)gn * K + gk : b;
        cp_async_16(smem_addr(sb + swz(row, chunk)), src, ok);
      } else {
        cp_async_16(smem_addr(sb + swz(row, chunk)), ok ? b + (size_t)gn * K + gk : b, ok);
      }
    }
  }
};

// Store two adjacent outputs (n, n + 1) of one row; n is even. `pair` means both columns
// exist and the address is 2-element aligned (N even), so one vector store is legal.
// The pointers may be global or shared (the staged epilogue of gemm_ws.cu).
__device__ __forceinline__ void store_pair(__half* p, float v0, float v1) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(v0, v1);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
}
__device__ __forceinline__ void store_pair(float* p, float v0, float v1) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_pair(int32_t* p, int v0, int v1) {
  *reinterpret_cast<int2*>(p) = make_int2(v0, v1);
}

template <typename T, typename V>
__device__ __forceinline__ void store2(T* out, size_t idx, V v0, V v1, bool pair, bool second) {
  if (pair) {
    store_pair(out + idx, v0, v1);
  } else {
    out[idx] = static_cast<T>(v0);
    if (second) out[idx + 1] = static_cast<T>(v1);
  }
}

// The per-channel epilogue, shared by every GEMM body (gemm.cu, gemm_wgmma.cu,
// gemm_ws.cu) so that all of them compute the same float32 expression:
//   MODE 0: c = acc - corr_m                                  (int32, raw int8 GEMM)
//   MODE 1: y = float(acc - corr_m) * row_scale[m] * col_scale[n] (+ bias[n])
// where corr_m = 128 * row_sums[m] for WB == kWeightU8 (the unsigned-code correction,
// exact in int32: |128 R| <= 128 * 127 * K < 2^31) and 0 otherwise. Row and column terms
// are loaded once per row / column by the caller (rows past M, columns past N get zeros;
// their values are never stored).
template <bool B, typename IfTrue, typename IfFalse>
struct Select {
  using type = IfTrue;
};
template <typename IfTrue, typename IfFalse>
struct Select<false, IfTrue, IfFalse> {
  using type = IfFalse;
};

template <int MODE, bool HAS_BIAS, int WB>
struct ChannelEpilogue {
  using Value = typename Select<MODE == 0, int, float>::type;
  struct Row {
    float scale;
    int corr;
  };
  struct Col {
    float scale, bias;
  };
  const float* row_scale;
  const int32_t* row_sums;
  const float* col_scale;
  const float* bias;

  __device__ __forceinline__ Row row(int m, int M) const {
    Row r{0.f, 0};
    if (m < M) {
      if constexpr (MODE == 1) r.scale = row_scale[m];
      if constexpr (WB == kWeightU8) r.corr = 128 * row_sums[m];
    }
    return r;
  }
  __device__ __forceinline__ Col col(int n, int N) const {
    Col c{0.f, 0.f};
    if constexpr (MODE == 1) {
      if (n < N) {
        c.scale = col_scale[n];
        if constexpr (HAS_BIAS) c.bias = bias[n];
      }
    }
    return c;
  }
  __device__ __forceinline__ Value operator()(int acc, Row r, Col c) const {
    const int v = acc - r.corr;
    if constexpr (MODE == 0) {
      return v;
    } else {
      float y = static_cast<float>(v) * r.scale * c.scale;
      if constexpr (HAS_BIAS) y += c.bias;
      return y;
    }
  }
};

// Coordinates of tile `bid` (a block index, or a persistent block's current tile),
// rasterized in groups of 8 tile-rows so that tiles running together share A and B tiles
// in L2.
__device__ __forceinline__ void tile_coords(int bid, int tiles_m, int tiles_n, int& tm,
                                            int& tn) {
  constexpr int kGroup = 8;
  const int width = kGroup * tiles_n;
  const int first = (bid / width) * kGroup;
  const int rows = min(tiles_m - first, kGroup);
  tm = first + (bid % width) % rows;
  tn = (bid % width) / rows;
}

}  // namespace w8a8
