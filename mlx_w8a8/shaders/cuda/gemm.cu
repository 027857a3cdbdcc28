// Int8 GEMM on tensor cores (mma.sync m16n8k32, s8 x s8 or s8 x u8), fused epilogues.
//
// File layout (read by mlx_w8a8/kernels/cuda/launch.py and tests/test_cuda_compile.py):
// the text before the first "// @@ body" line is the `header=` of mx.fast.cuda_kernel;
// each "// @@ body NAME" line starts the `source=` (function body) of one kernel. MLX
// wraps a body as `__global__ void custom_kernel_<name>(inputs..., outputs...) { <template
// constants> <body> }` inside namespace mlx::core::cu, so the bodies only call the
// templates defined here. The code every GEMM file shares (copies, tile layout, stores,
// the per-channel epilogue) is in common.cuh, put before this header by the launcher:
// @@ requires common.cuh
// @@ requires mma.cuh
//
// C[m, n] = sum_k A[m, k] * B[n, k]; A [M, K] int8 (activation codes). B, by WB:
//   kWeightS8   B [N, K] int8 (the raw int8_matmul).
//   kWeightFlip the stored uint8 weight codes q read as q ^ 0x80 (= q - 128 as int8).
//   kWeightU8   the stored codes q multiplied as UNSIGNED (mma .s8.u8: no flip) and the
//               signed result recovered exactly in int32 by the epilogue:
//                 sum_k a_k (q_k - 128) = sum_k a_k q_k - 128 R,  R = sum_k a_k
//               (R from the quantize kernel: the full-row sum, or per group).
//               EXACTNESS: |a q| <= 127 * 255, so the unsigned int32 sum is exact only
//               while K * 127 * 255 < 2^31, i.e. K <= 66311 (launch.U8_MAX_K); the
//               per-channel launcher takes kWeightFlip above that. The grouped kernel resets its int32
//               accumulators every group (GS <= 128), so it is exact for any K.
//
// Tiling: a block computes a BM x BN tile with (BM/WTM) x (BN/WTN) warps, each warp a
// WTM x WTN sub-tile as (WTM/16) x (WTN/8) mma tiles. K advances in steps of BK = 128
// bytes through a STAGES-deep cp.async ring in dynamic shared memory.
//
// Invariants the launcher guarantees (the definitions' refusals in mlx_w8a8/kernels/cuda/, their launch specs):
//   * K % 16 == 0, so every 16-byte cp.async chunk is either fully inside K or fully
//     outside (zero-filled); A and B rows start 16-byte aligned (row-contiguous inputs,
//     K a multiple of 16).
//   * M and N are arbitrary: rows past M / N are zero-filled on load and never stored.
//   * |A|, |B| <= 128 and K < 2^17, so the signed int32 accumulator cannot overflow;
//     kWeightU8 additionally needs K <= 66311 per accumulation run (see above).
//   * dynamic shared memory = STAGES * (BM + BN) * BK bytes (passed as shared_memory).

namespace w8a8 {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The main loop: accumulates the warp's sub-tile. MODE 2 (grouped) folds the int32
// partial sums of each weight group into float accumulators; see gemm_grouped.
template <int BM, int BN, int WTM, int WTN, int STAGES, int WB>
struct Gemm : TileOperands<BM, BN, (BM / WTM) * (BN / WTN) * 32> {
  using Tiles = TileOperands<BM, BN, (BM / WTM) * (BN / WTN) * 32>;
  static constexpr int kWarpsN = BN / WTN;
  static constexpr int kThreads = Tiles::kThreads;
  static constexpr int MT = WTM / 16;
  static constexpr int NT = WTN / 8;
  static constexpr int kStageBytes = Tiles::kStageBytes;
  static_assert(NT % 2 == 0, "B fragments are loaded for pairs of n8 tiles");
  using Tiles::smem;

  // One k32 step (ks = 0..3 within the stage) for the warp at (wm, wn): fragments + MMAs.
  __device__ __forceinline__ void step(int stage, int ks, int wm, int wn,
                                       int (&acc)[MT][NT][4]) const {
    const int lane = threadIdx.x & 31;
    const unsigned char* sa = smem + stage * kStageBytes;
    const unsigned char* sb = sa + BM * kBK;
    uint32_t af[MT][4];
    uint32_t bf[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // ldmatrix x4 on a 16 x 32-byte block: matrices (rows 0-7 | 8-15) x (chunk 0 | 1),
      // which is exactly the s8 A fragment {a0, a1, a2, a3} of m16n8k32.
      const int row = wm * WTM + mt * 16 + (lane & 15);
      const int chunk = ks * 2 + (lane >> 4);
      ldmatrix_x4(af[mt], smem_addr(sa + swz(row, chunk)));
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      // Matrices: (n 0-7, chunk 0), (n 0-7, chunk 1), (n 8-15, chunk 0), (n 8-15, chunk 1)
      // = {b0, b1} of n-tile 2*np and of n-tile 2*np + 1.
      const int row = wn * WTN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
      const int chunk = ks * 2 + ((lane >> 3) & 1);
      uint32_t r[4];
      ldmatrix_x4(r, smem_addr(sb + swz(row, chunk)));
      if constexpr (WB == kWeightFlip) {
#pragma unroll
        for (int j = 0; j < 4; ++j) r[j] ^= 0x80808080u;  // uint8 code q -> int8 q - 128
      }
      bf[2 * np][0] = r[0];
      bf[2 * np][1] = r[1];
      bf[2 * np + 1][0] = r[2];
      bf[2 * np + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mma_i8<WB == kWeightU8>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
  }
};

// Fills acc (int32) for the whole K. Returns through acc; the caller owns the epilogue.
// Pipeline hazard: the stage refilled at iteration kt is the one consumed at kt - 1;
// the __syncthreads after the wait makes every warp finish reading it first.
template <int BM, int BN, int WTM, int WTN, int STAGES, int WB, typename Fold>
__device__ __forceinline__ void mainloop(
    const Gemm<BM, BN, WTM, WTN, STAGES, WB>& g, int wm, int wn,
    int (&acc)[WTM / 16][WTN / 8][4], Fold fold) {
  const int ktiles = (g.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) g.template load_stage<true>(s, s);
    cp_async_commit();  // always commit so the group count stays STAGES - 1 ahead
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < ktiles) g.template load_stage<true>(next % STAGES, next);
    cp_async_commit();
    const int stage = kt % STAGES;
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      g.step(stage, ks, wm, wn, acc);
      fold(kt * kBK + ks * 32 + 32);  // k consumed so far (grouped epilogue hook)
    }
  }
  cp_async_wait<0>();
}

struct NoFold {
  __device__ __forceinline__ void operator()(int) const {}
};

// MODE 0: raw int32 C. MODE 1: per-channel dequant y = acc * row_scale[m] * col_scale[n]
// (+ bias[n]) in float32, stored as T; with WB == kWeightU8, acc = U - 128 * row_sums[m]
// first (int32, exact: the signed dot product, see the top of the file).
template <int MODE, bool HAS_BIAS, typename T, int BM, int BN, int WTM, int WTN, int STAGES,
          int WB>
__device__ __forceinline__ void gemm(const int8_t* a, const int8_t* b, int M, int N, int K,
                                     const float* row_scale, const int32_t* row_sums,
                                     const float* col_scale, const float* bias, T* out) {
  extern __shared__ __align__(128) unsigned char w8a8_smem[];
  using G = Gemm<BM, BN, WTM, WTN, STAGES, WB>;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int tm, tn;
  tile_coords(blockIdx.x, tiles_m, tiles_n, tm, tn);
  G g{a, b, M, N, K, tm * BM, tn * BN, w8a8_smem};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / G::kWarpsN, wn = warp % G::kWarpsN;
  int acc[G::MT][G::NT][4];
#pragma unroll
  for (int i = 0; i < G::MT; ++i)
#pragma unroll
    for (int j = 0; j < G::NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0;
  mainloop(g, wm, wn, acc, NoFold{});

  // Epilogue straight from the mma C fragments: c0, c1 at (row g, cols 2t, 2t+1),
  // c2, c3 at (row g + 8, same cols).
  const ChannelEpilogue<MODE, HAS_BIAS, WB> epi{row_scale, row_sums, col_scale, bias};
  const int gq = lane >> 2, tq = lane & 3;
  const bool even_n = (N & 1) == 0;
  typename ChannelEpilogue<MODE, HAS_BIAS, WB>::Row rows[G::MT][2];
#pragma unroll
  for (int mt = 0; mt < G::MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[mt][h] = epi.row(g.m0 + wm * WTM + mt * 16 + gq + h * 8, M);
#pragma unroll
  for (int nt = 0; nt < G::NT; ++nt) {
    const int n = g.n0 + wn * WTN + nt * 8 + tq * 2;
    if (n >= N) continue;
    const bool second = n + 1 < N;
    const auto c0 = epi.col(n, N), c1 = epi.col(n + 1, N);
#pragma unroll
    for (int mt = 0; mt < G::MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = g.m0 + wm * WTM + mt * 16 + gq + h * 8;
        if (m >= M) continue;
        store2(out, (size_t)m * N + n, epi(acc[mt][nt][2 * h], rows[mt][h], c0),
               epi(acc[mt][nt][2 * h + 1], rows[mt][h], c1), even_n && second, second);
      }
    }
  }
}

// Grouped W8A8 (general affine 8-bit weights), docs/numerics.md:
//   y[m, n] = row_scale[m] * sum_g (s[n, g] * P[m, n, g] + b'[n, g] * R[m, g]) (+ bias[n])
// P is the exact int32 dot product over group g; after each group's last k32 step the
// int32 accumulators are folded into float32 ones and reset. GS (32, 64, 128) divides
// BK = 128, so a group never straddles a pipeline stage boundary in a way that matters:
// the fold is keyed on the k consumed so far. The K tail is zero-filled, and K is a
// multiple of GS, so no fold sees a partial group of real data.
// The weight codes are multiplied unsigned (kWeightU8): the int32 accumulator holds
// U = sum_{k in g} a_k q_k (|U| <= 127 * 255 * GS, exact) and the fold takes
// P = U - 128 R[m, g] (exact int32, the same P as with flipped codes) before any float.
template <bool HAS_BIAS, typename T, typename ST, int GS, int BM, int BN, int WTM, int WTN,
          int STAGES>
__device__ __forceinline__ void gemm_grouped(const int8_t* a, const int8_t* b, int M, int N,
                                             int K, const float* row_scale,
                                             const int32_t* row_sums, const ST* scales,
                                             const float* offsets, const float* bias, T* out) {
  extern __shared__ __align__(128) unsigned char w8a8_smem[];
  using G = Gemm<BM, BN, WTM, WTN, STAGES, kWeightU8>;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int tm, tn;
  tile_coords(blockIdx.x, tiles_m, tiles_n, tm, tn);
  G g{a, b, M, N, K, tm * BM, tn * BN, w8a8_smem};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp / G::kWarpsN, wn = warp % G::kWarpsN;
  const int gq = lane >> 2, tq = lane & 3;
  const int groups = K / GS;

  int acc[G::MT][G::NT][4];
  float facc[G::MT][G::NT][4];
#pragma unroll
  for (int i = 0; i < G::MT; ++i)
#pragma unroll
    for (int j = 0; j < G::NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc[i][j][r] = 0;
        facc[i][j][r] = 0.f;
      }

  // Clamped indices: rows/cols past M/N read row/col 0's metadata (never stored).
  auto fold = [&](int kdone) {
    if (kdone % GS != 0) return;
    const int grp = kdone / GS - 1;
    if (grp >= groups) return;  // zero-filled K tail past the last group
    float s[G::NT][2], o[G::NT][2];
#pragma unroll
    for (int nt = 0; nt < G::NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int n = g.n0 + wn * WTN + nt * 8 + tq * 2 + j;
        n = n < N ? n : 0;
        s[nt][j] = to_f32(scales[(size_t)n * groups + grp]);
        o[nt][j] = offsets[(size_t)n * groups + grp];
      }
    int ri[G::MT][2];
#pragma unroll
    for (int mt = 0; mt < G::MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int m = g.m0 + wm * WTM + mt * 16 + gq + h * 8;
        m = m < M ? m : 0;
        ri[mt][h] = row_sums[(size_t)m * groups + grp];
      }
#pragma unroll
    for (int mt = 0; mt < G::MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < G::NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int h = i >> 1, j = i & 1;
          const int p = acc[mt][nt][i] - 128 * ri[mt][h];  // signed group sum, exact
          facc[mt][nt][i] += s[nt][j] * static_cast<float>(p) +
                             o[nt][j] * static_cast<float>(ri[mt][h]);
          acc[mt][nt][i] = 0;
        }
  };
  mainloop(g, wm, wn, acc, fold);

  const bool even_n = (N & 1) == 0;
#pragma unroll
  for (int nt = 0; nt < G::NT; ++nt) {
    const int n = g.n0 + wn * WTN + nt * 8 + tq * 2;
    if (n >= N) continue;
    const bool second = n + 1 < N;
    float b0 = 0.f, b1 = 0.f;
    if constexpr (HAS_BIAS) {
      b0 = bias[n];
      b1 = second ? bias[n + 1] : 0.f;
    }
#pragma unroll
    for (int mt = 0; mt < G::MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = g.m0 + wm * WTM + mt * 16 + gq + h * 8;
        if (m >= M) continue;
        const float rs = row_scale[m];
        float v0 = rs * facc[mt][nt][2 * h], v1 = rs * facc[mt][nt][2 * h + 1];
        if constexpr (HAS_BIAS) {
          v0 += b0;
          v1 += b1;
        }
        store2(out, (size_t)m * N + n, v0, v1, even_n && second, second);
      }
  }
}

}  // namespace w8a8

// @@ body int32
// Raw int8 GEMM: inputs a [M, K] int8, b [N, K] int8; output c [M, N] int32.
w8a8::gemm<0, false, int32_t, BM, BN, WTM, WTN, STAGES, w8a8::kWeightS8>(
    a, b, w8a8::rows(a_shape, a_ndim), b_shape[0], a_shape[a_ndim - 1], nullptr, nullptr, nullptr, nullptr, c);

// @@ body channel
// Per-channel W8A8 with flipped codes (any K < 2^17; the launcher uses it for
// K > 66311): xq [M, K] int8, xs [M, 1] f32, w [N, K/4] uint32 codes, ws [N] f32.
w8a8::gemm<1, false, T, BM, BN, WTM, WTN, STAGES, w8a8::kWeightFlip>(
    xq, reinterpret_cast<const int8_t*>(w), w8a8::rows(xq_shape, xq_ndim), w_shape[0], xq_shape[xq_ndim - 1], xs,
    nullptr, ws, nullptr, y);

// @@ body channel_bias
// As `channel`, plus bias [N] f32.
w8a8::gemm<1, true, T, BM, BN, WTM, WTN, STAGES, w8a8::kWeightFlip>(
    xq, reinterpret_cast<const int8_t*>(w), w8a8::rows(xq_shape, xq_ndim), w_shape[0], xq_shape[xq_ndim - 1], xs,
    nullptr, ws, bias, y);

// @@ body channel_u8
// Per-channel W8A8 on the unsigned codes (K <= 66311 only): xa, the quantize's array of
// codes, scales and row sums (shape.cuh rowsum_acts), w [N, K/4] uint32 codes, ws [N] f32.
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm<1, false, T, BM, BN, WTM, WTN, STAGES, w8a8::kWeightU8>(
    acts.q, reinterpret_cast<const int8_t*>(w), acts.m, w_shape[0], acts.k, acts.scale, acts.sums,
    ws, nullptr, y);

// @@ body channel_u8_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm<1, true, T, BM, BN, WTM, WTN, STAGES, w8a8::kWeightU8>(
    acts.q, reinterpret_cast<const int8_t*>(w), acts.m, w_shape[0], acts.k, acts.scale, acts.sums,
    ws, bias, y);

// @@ body grouped
// Grouped W8A8: xq [M, K] int8, xs [M, 1] f32, xr [M, G] int32 row sums, w [N, K/4] uint32,
// ws [N, G] scales (ST), wo [N, G] f32 offsets b + 128 s.
w8a8::gemm_grouped<false, T, ST, GS, BM, BN, WTM, WTN, STAGES>(
    xq, reinterpret_cast<const int8_t*>(w), w8a8::rows(xq_shape, xq_ndim), w_shape[0], xq_shape[xq_ndim - 1], xs, xr, ws,
    wo, nullptr, y);

// @@ body grouped_bias
w8a8::gemm_grouped<true, T, ST, GS, BM, BN, WTM, WTN, STAGES>(
    xq, reinterpret_cast<const int8_t*>(w), w8a8::rows(xq_shape, xq_ndim), w_shape[0], xq_shape[xq_ndim - 1], xs, xr, ws,
    wo, bias, y);
