// Int8 GEMM on Hopper's warpgroup tensor-core instruction (wgmma, sm_90a only).
//
// File layout: as gemm.cu, whose header (cp.async, the swizzled tile layout, tile
// rasterization, stores) this file requires.
// @@ requires gemm.cu
//
// Block: 128 x 256 output tile, 256 threads = 2 warpgroups; warpgroup g computes rows
// [64 g, 64 g + 64) x all 256 columns with wgmma.m64n256k32.s32.s8.{s8,u8}, both operands
// read by the tensor cores straight from shared memory (no ldmatrix, no register staging),
// 128 int32 accumulators per thread.
//
// Weight operand (WB, gemm.cu's kWeight*): kWeightS8 raw int8 B; kWeightU8 the stored uint8
// codes multiplied unsigned (.s8.u8) and corrected in the epilogue by - 128 * R_m
// (exact while K <= 66311: see gemm.cu); kWeightFlip the codes flipped to int8 in shared
// memory (an extra pass over every stage; only for K > 66311).
//
// Shared-memory layout = gemm.cu's: rows of kBK = 128 bytes, 16-byte chunk c of row r
// stored at chunk c ^ (r & 7). That is exactly wgmma's 128-byte swizzle for K-major
// operands when each 8-row x 128-byte atom starts 1024-byte aligned, so the tile base is
// rounded up to 1024 bytes (the launcher adds 1024 bytes of slack). A k32 step is the
// 32-byte column slice ks of each row: the descriptor start address advances by 32 bytes
// (the hardware applies the swizzle to the absolute address).
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

__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_byte_addr) {
  // Matrix descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4 (bits
  // 16-29; unused for swizzled K-major, set to 1), stride byte offset >> 4 (bits 32-45:
  // 1024 bytes between 8-row atoms), swizzle mode 128B (bits 62-63 = 1).
  uint64_t desc = 0;
  desc |= (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4);
  desc |= (uint64_t)1 << 16;
  desc |= (uint64_t)(1024 >> 4) << 32;
  desc |= (uint64_t)1 << 62;
  return desc;
}

// TYPES: the A and B type suffixes ("s8.s8" or "s8.u8"); the rest of the instruction and
// its 131 operands are the same.
#define W8A8_WGMMA_M64N256K32(TYPES)                                                      \
  asm volatile(                                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                        \
      "wgmma.mma_async.sync.aligned.m64n256k32.s32." TYPES " {"                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "    \
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "    \
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "    \
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "    \
      "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "    \
      "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "    \
      "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "        \
      "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "      \
      "%124, %125, %126, %127"                                                              \
      "}, %128, %129, p;\n}\n"                                                              \
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]),             \
        "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]),           \
        "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]),       \
        "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),       \
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]),       \
        "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]),       \
        "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),       \
        "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),       \
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]),       \
        "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]),       \
        "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), "+r"(d[64]), "+r"(d[65]),       \
        "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),       \
        "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]),       \
        "+r"(d[78]), "+r"(d[79]), "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]),       \
        "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), "+r"(d[88]), "+r"(d[89]),       \
        "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),       \
        "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]),     \
        "+r"(d[102]), "+r"(d[103]), "+r"(d[104]), "+r"(d[105]), "+r"(d[106]),               \
        "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),               \
        "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]),               \
        "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), "+r"(d[121]),               \
        "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]),               \
        "+r"(d[127])                                                                        \
      : "l"(da), "l"(db), "r"(accumulate))

// d += A * B (accumulate != 0) or d = A * B; A signed, B unsigned when U8.
template <bool U8>
__device__ __forceinline__ void wgmma_m64n256k32(int (&d)[128], uint64_t da, uint64_t db,
                                                 int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (U8) {
    W8A8_WGMMA_M64N256K32("s8.u8");
  } else {
    W8A8_WGMMA_M64N256K32("s8.s8");
  }
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

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
  extern __shared__ __align__(128) unsigned char w8a8_smem[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(w8a8_smem) + 1023) & ~static_cast<uintptr_t>(1023));
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  int tm, tn;
  tile_coords(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup 0 or 1
  const int ktiles = (K + kBK - 1) / kBK;

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    unsigned char* sa = smem + stage * kStageBytes;
    unsigned char* sb = sa + BM * kBK;
#pragma unroll
    for (int i = 0; i < (BM * 8) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int row = idx >> 3, chunk = idx & 7;
      const int gm = m0 + row, gk = k0 + chunk * 16;
      const bool ok = gm < M && gk < K;
      cp_async_16(smem_addr(sa + swz(row, chunk)), ok ? a + (size_t)gm * K + gk : a, ok);
    }
#pragma unroll
    for (int i = 0; i < (BN * 8) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int row = idx >> 3, chunk = idx & 7;
      const int gn = n0 + row, gk = k0 + chunk * 16;
      const bool ok = gn < N && gk < K;
      cp_async_16(smem_addr(sb + swz(row, chunk)), ok ? b + (size_t)gn * K + gk : b, ok);
    }
  };
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
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    const int stage = kt % STAGES;
    cp_async_wait<STAGES - 2>();
    flip_stage(stage);
    fence_proxy_async();
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < ktiles) load_stage(next % STAGES, next);
    cp_async_commit();
    const uint32_t sa = smem_addr(smem + stage * kStageBytes) + wg * 64 * kBK;
    const uint32_t sb = smem_addr(smem + stage * kStageBytes + BM * kBK);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks)
      wgmma_m64n256k32<WB == kWeightU8>(d, wgmma_desc(sa + ks * 32), wgmma_desc(sb + ks * 32),
                                        1);
    wgmma_commit();
    wgmma_wait0();
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
    a, b, a_shape[0], b_shape[0], a_shape[1], nullptr, nullptr, nullptr, nullptr, c);

// @@ body channel
// Per-channel W8A8 with codes flipped in shared memory (the launcher's path for
// K > 66311): xq [M, K] int8, xs [M, 1] f32, w [N, K/4] uint32 codes, ws [N] f32.
w8a8::gemm_wgmma<1, false, T, STAGES, w8a8::kWeightFlip>(
    xq, reinterpret_cast<const int8_t*>(w), xq_shape[0], w_shape[0], xq_shape[1], xs, nullptr,
    ws, nullptr, y);

// @@ body channel_bias
w8a8::gemm_wgmma<1, true, T, STAGES, w8a8::kWeightFlip>(
    xq, reinterpret_cast<const int8_t*>(w), xq_shape[0], w_shape[0], xq_shape[1], xs, nullptr,
    ws, bias, y);

// @@ body channel_u8
// Per-channel W8A8 on the unsigned codes (K <= 66311 only): as `channel`, plus
// xr [M, 1] int32 activation row sums.
w8a8::gemm_wgmma<1, false, T, STAGES, w8a8::kWeightU8>(
    xq, reinterpret_cast<const int8_t*>(w), xq_shape[0], w_shape[0], xq_shape[1], xs, xr, ws,
    nullptr, y);

// @@ body channel_u8_bias
w8a8::gemm_wgmma<1, true, T, STAGES, w8a8::kWeightU8>(
    xq, reinterpret_cast<const int8_t*>(w), xq_shape[0], w_shape[0], xq_shape[1], xs, xr, ws,
    bias, y);
