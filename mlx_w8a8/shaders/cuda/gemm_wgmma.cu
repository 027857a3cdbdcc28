// Int8 GEMM on Hopper's warpgroup tensor-core instruction (wgmma, sm_90a only).
//
// File layout: as gemm.cu. The copies, tile layout, stores and epilogue are common.cuh's,
// the instruction, descriptors and fences wgmma.cuh's:
// @@ requires wgmma.cuh
//
// Block: 128 x 256 output tile, 256 threads = 2 warpgroups; warpgroup g computes rows
// [64 g, 64 g + 64) x all 256 columns with wgmma.m64n256k32.s32.s8.{s8,u8}, both operands
// read by the tensor cores straight from shared memory (no ldmatrix, no register staging),
// 128 int32 accumulators per thread.
//
// Weight operand (WB, common.cuh's kWeight*): kWeightS8 raw int8 B; kWeightU8 the stored uint8
// codes multiplied unsigned (.s8.u8) and corrected in the epilogue by - 128 * R_m
// (exact while K <= 66311: see gemm.cu); kWeightFlip the codes flipped to int8 in shared
// memory (an extra pass over every stage; only for K > 66311).
//
// Shared-memory layout: common.cuh's swizzled 128-byte rows, which are wgmma's 128-byte
// swizzle (wgmma.cuh); the tile base is rounded up to 1024 bytes (the launcher adds 1024
// bytes of slack).
//
// Hazards:
//  * cp.async writes shared memory through the generic proxy and wgmma reads it through
//    the async proxy: each thread fences (fence.proxy.async) after its copies land and
//    before the barrier that publishes the stage.
//  * A stage is refilled only after the barrier at the top of the next iteration, which
//    every thread reaches after wgmma.wait_group 0 on that stage: no overwrite in flight.
//  * wgmma.fence before the first wgmma of a k-tile orders prior register accesses to
//    the accumulators.
// Invariants: as gemm.cu (K % 16 == 0, zero-filled tails), plus compute capability 9.0
// with the sm_90a target (the launcher checks the device; other targets trap).

namespace w8a8 {

// MODE 0: raw int32 C; MODE 1: per-channel dequant (+ bias) to T.
// WB == kWeightFlip: B holds uint8 codes q; the int8 value is q - 128 = (q ^ 0x80),
// applied in shared memory because the tensor cores read B there directly: each thread
// flips the 16-byte chunks it copied, after they land and before the proxy fence.
// WB == kWeightU8: the codes are multiplied unsigned, no pass over shared memory; the
// epilogue subtracts 128 * row_sums[m] in int32 (exact for K <= 66311, see gemm.cu).
template <int MODE, bool HAS_BIAS, typename T, int STAGES, int WB>
__device__ __forceinline__ void gemm_wgmma(const int8_t* a, const int8_t* b, int M, int N,
                                           int K, const float* row_scale,
                                           const int32_t* row_sums, const float* col_scale,
                                           const float* bias, T* out) {
  constexpr int BM = 128, BN = 256, kThreads = 256;
  constexpr int kStageBytes = (BM + BN) * kBK;
  unsigned char* smem = wgmma_smem();
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int tm, tn;
  tile_coords(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup 0 or 1
  const int ktiles = (K + kBK - 1) / kBK;

  const TileOperands<BM, BN, kThreads> tiles{a, b, M, N, K, m0, n0, smem};
  // Flip the B chunks this thread copied into `stage` (zero-filled ones included: their
  // flipped value, -128, multiplies a zero-filled A row or column-out-of-range output).
  auto flip_stage = [&](int stage) {
    if constexpr (WB == kWeightFlip) {
      unsigned char* sb = smem + stage * kStageBytes + BM * kBK;
#pragma unroll
      for (int i = 0; i < (BN * 8) / kThreads; ++i) {
        const int idx = tid + i * kThreads;
        uint4* p = reinterpret_cast<uint4*>(sb + swz(idx >> 3, idx & 7));
        uint4 v = *p;
        v.x ^= 0x80808080u; v.y ^= 0x80808080u; v.z ^= 0x80808080u; v.w ^= 0x80808080u;
        *p = v;
      }
    }
  };

  int d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) tiles.template load_stage<false>(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    const int stage = kt % STAGES;
    cp_async_wait<STAGES - 2>();
    flip_stage(stage);
    fence_proxy_async();
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < ktiles) tiles.template load_stage<false>(next % STAGES, next);
    cp_async_commit();
    const uint32_t sa = smem_addr(smem + stage * kStageBytes) + wg * 64 * kBK;
    const uint32_t sb = smem_addr(smem + stage * kStageBytes + BM * kBK);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks)
      wgmma_step<WB == kWeightU8, BN>(d, sa, sb, ks, 1);
    wgmma_commit();
    wgmma_wait<0>();
  }
  cp_async_wait<0>();

  // Accumulator layout (per warpgroup, like mma's C fragment): warp w of the group owns
  // rows 16 w + lane / 4 (+ 8); d[4 j + {0, 1}] are columns 8 j + 2 (lane % 4) + {0, 1}
  // of the first row, d[4 j + {2, 3}] of the second.
  const ChannelEpilogue<MODE, HAS_BIAS, WB> epi{row_scale, row_sums, col_scale, bias};
  const int gq = lane >> 2, tq = lane & 3;
  const bool even_n = (N & 1) == 0;
  const int row0 = m0 + wg * 64 + (warp & 3) * 16 + gq;
  const typename ChannelEpilogue<MODE, HAS_BIAS, WB>::Row rows[2] = {epi.row(row0, M),
                                                                    epi.row(row0 + 8, M)};
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int n = n0 + 8 * j + 2 * tq;
    if (n >= N) continue;
    const bool second = n + 1 < N;
    const auto c0 = epi.col(n, N), c1 = epi.col(n + 1, N);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = row0 + 8 * h;
      if (m >= M) continue;
      store2(out, (size_t)m * N + n, epi(d[4 * j + 2 * h], rows[h], c0),
             epi(d[4 * j + 2 * h + 1], rows[h], c1), even_n && second, second);
    }
  }
}

}  // namespace w8a8

// @@ body int32
// Raw int8 GEMM: a [M, K] int8, b [N, K] int8 -> c [M, N] int32.
w8a8::gemm_wgmma<0, false, int32_t, STAGES, w8a8::kWeightS8>(
    a, b, w8a8::rows(a_shape, a_ndim), b_shape[0], a_shape[a_ndim - 1], nullptr, nullptr, nullptr, nullptr, c);

// @@ body channel
// Per-channel W8A8 with codes flipped in shared memory (the launcher's path for
// K > 66311): xq [M, K] int8, xs [M, 1] f32, w [N, K/4] uint32 codes, ws [N] f32.
w8a8::gemm_wgmma<1, false, T, STAGES, w8a8::kWeightFlip>(
    xq, reinterpret_cast<const int8_t*>(w), w8a8::rows(xq_shape, xq_ndim), w_shape[0], xq_shape[xq_ndim - 1], xs, nullptr,
    ws, nullptr, y);

// @@ body channel_bias
w8a8::gemm_wgmma<1, true, T, STAGES, w8a8::kWeightFlip>(
    xq, reinterpret_cast<const int8_t*>(w), w8a8::rows(xq_shape, xq_ndim), w_shape[0], xq_shape[xq_ndim - 1], xs, nullptr,
    ws, bias, y);

// @@ body channel_u8
// Per-channel W8A8 on the unsigned codes (K <= 66311 only): xa, the quantize's array of
// codes, scales and row sums (shape.cuh rowsum_acts), w [N, K/4] uint32 codes, ws [N] f32.
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_wgmma<1, false, T, STAGES, w8a8::kWeightU8>(
    acts.q, reinterpret_cast<const int8_t*>(w), acts.m, w_shape[0], acts.k, acts.scale, acts.sums, ws,
    nullptr, y);

// @@ body channel_u8_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_wgmma<1, true, T, STAGES, w8a8::kWeightU8>(
    acts.q, reinterpret_cast<const int8_t*>(w), acts.m, w_shape[0], acts.k, acts.scale, acts.sums, ws,
    bias, y);
