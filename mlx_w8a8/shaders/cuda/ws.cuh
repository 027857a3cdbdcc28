// The warp-specialized persistent GEMMs' shared parts, required by gemm_ws.cu (the
// per-channel kernel) and gemm_grouped_ws.cu (the group-wise one) with
// "// @@ requires ws.cuh": the warp roles, the mbarriers of the producer/consumer ring,
// the members of a sibling launch, the per-warp staged epilogue (ws_epilogue) and the
// launch bounds of their kernels. A header-only file.
//
// MLX writes the kernel as `__global__ void custom_kernel_...(...)` with no launch bounds;
// without them ptxas may give each thread more registers than a 288- or 384-thread block
// can have and the launch fails. Every kernel of a file requiring this header has at most
// 384 threads, so it redefines __global__ to carry __launch_bounds__(384, 1) (no
// __global__ function is defined before the kernel's own): ptxas caps registers at 168 per
// thread (with 288 threads it chose the same cap: it allocates for whole warpgroups); the
// cp.async 128 x 256 bodies with a bias or siblings spill up to 868 bytes, the others none
// or a few (tests/test_cuda_compile.py prints ptxas's counts).
// @@ requires wgmma.cuh
// @@ requires tma.cuh
#undef __global__
#define __global__ __attribute__((global)) __attribute__((launch_bounds(384, 1)))

namespace w8a8 {

constexpr int kWsProducerWarp = 8;  // warps 0-7 consume, 8 .. 8 + PW - 1 produce
constexpr int kWsEpiWarpBytes = 16 * 160;  // per-warp staging: 16 rows of 160 bytes

// A producer warpgroup that only issues TMA loads (PW == 4) gives registers to the
// consumers: the block's registers at launch, 384 x 168 (ptxas's cap under
// launch_bounds(384, 1)), are re-dealt (setmaxnreg) as 128 x kWsProducerRegs + 256 x
// kWsConsumerRegs; one thread issues every load, so the producers need few.
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;
static_assert(128 * kWsProducerRegs + 256 * kWsConsumerRegs <= 384 * 168, "register pool");

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}

// Arrive on `bar` and add `bytes` to the transactions its current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// The start of the producer warps (warp >= kWsProducerWarp): with a producer warpgroup
// whose registers go to the consumers (REALLOC) every warp of it gives them up; returns
// whether this warp produces (warps 9-11 then only gave their registers and must leave).
template <bool REALLOC>
__device__ __forceinline__ bool ws_producer_start(int warp) {
  if constexpr (REALLOC) {
    setmaxnreg_dec<kWsProducerRegs>();
    return warp == kWsProducerWarp;
  }
  return true;
}

// The TMA producer's loads of k-tile kt into the ring stage at shared address sa, on its
// mbarrier full: arms it with stage_tx bytes (the boxes' bytes and whatever else the
// caller loads on it), then A's box (its rows from tm * kTmaTileRowsA, the tile's) and
// the tile member's B box (its rows from tn * BN, tn the member's tile column) behind it.
template <int BN>
__device__ __forceinline__ void ws_tma_load_stage(uint32_t sa, uint32_t full, uint32_t stage_tx,
                                                  const void* map_a, const void* map_b, int kt,
                                                  int tm, int tn) {
  mbar_arrive_expect_tx(full, stage_tx);
  tma_load_2d(sa, map_a, kt * kBK, tm * kTmaTileRowsA, full);
  tma_load_2d(sa + kTmaTileRowsA * kBK, map_b, kt * kBK, tn * BN, full);
}

// Eight consecutive outputs from 8 values, 16-byte aligned: one 16-byte store for 16-bit
// types, two for 32-bit ones (rounded to nearest even, as the pair stores of gemm.cu).
__device__ __forceinline__ void store8(int32_t* p, const int (&v)[8]) {
  reinterpret_cast<int4*>(p)[0] = make_int4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<int4*>(p)[1] = make_int4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 w;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = w;
}
__device__ __forceinline__ void store8(__half* p, const float (&v)[8]) {
  uint4 w;
  __half2* h = reinterpret_cast<__half2*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = w;
}

constexpr int kMaxMembers = 3;  // launch.MAX_SIBLINGS

// The members of a launch (gemm_ws.cu Members, gemm_grouped_ws.cu GroupedMembers): G
// weights fed the same activation (1 for a single linear, 2 or 3 for sibling projections,
// e.g. q/k/v or gate/up), member g with n[g] output columns. The launch's tile columns
// are the members' tile columns one after another (a tile never straddles two members),
// so one persistent grid covers all of them and the small members (k/v: N = 1024) fill
// SMs the big one leaves idle. Each file's member_of finds a tile column's member with
// unrolled compile-time indices, never a runtime index into the arrays (that would put
// them in local memory).
template <int BN, template <typename, int> class Ms, typename T, int G>
__device__ __forceinline__ int member_tiles(const Ms<T, G>& ms) {
  int t = 0;
#pragma unroll
  for (int g = 0; g < G; ++g) t += (ms.n[g] + BN - 1) / BN;
  return t;
}

// The map of member g among the maps of G members, g selected without a runtime index.
template <int G>
__device__ __forceinline__ const void* member_map(const void* const (&maps)[G], int g) {
  const void* m = maps[0];
#pragma unroll
  for (int i = 1; i < G; ++i)
    if (g == i) m = maps[i];
  return m;
}

// The epilogue of one warp's 16 rows (row_base ..) x BN columns (n0 ..) of a tile, from
// its m64 accumulators d (wgmma_k32's layout: d[4 j + {0, 1}] are row lane / 4, columns
// 8 j + 2 (lane % 4) + {0, 1}; d[4 j + {2, 3}] the row 8 below), 32 columns per pass, no
// block barrier.
// Step 1: the raw int32 accumulators go to the warp's staging buffer (rows of 32 int32
// padded to 160 bytes: the 8-byte stores of a half-warp hit 32 distinct banks).
// Step 2: lane l takes 8 consecutive columns (8 (l % 4) ...) of rows l / 4 and l / 4 + 8
// (the rows whose terms it already holds), applies the shared epilogue and stores 8
// outputs: one 16-byte store (16-bit T) or two (32-bit T), 4 lanes covering a row's 32
// columns contiguously. The 8 columns' terms are loaded once for both rows (the output
// stores between them could alias the column arrays, so the compiler would load them
// again). Scalar stores only at a column tail or when rows are not 16-byte aligned.
template <int BN, typename T, typename Epi>
__device__ __forceinline__ void ws_epilogue(const int (&d)[BN / 2], const Epi& epi, T* out,
                                            int row_base, int n0, int M, int N, int lane,
                                            unsigned char* stage_buf) {
  constexpr int kRowBytes = 160;
  const int gq = lane >> 2, tq = lane & 3;
  const bool vec_ok = (N * (int)sizeof(T)) % 16 == 0;  // every row starts 16-byte aligned
  const auto r0 = epi.row(row_base + gq, M), r1 = epi.row(row_base + gq + 8, M);
#pragma unroll
  for (int p = 0; p < BN / 32; ++p) {
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * p + jj;
      store_pair(reinterpret_cast<int32_t*>(stage_buf + gq * kRowBytes) + 8 * jj + 2 * tq,
                 d[4 * j], d[4 * j + 1]);
      store_pair(reinterpret_cast<int32_t*>(stage_buf + (gq + 8) * kRowBytes) + 8 * jj + 2 * tq,
                 d[4 * j + 2], d[4 * j + 3]);
    }
    __syncwarp();
    const int n = n0 + 32 * p + 8 * tq;
    typename Epi::Col col[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) col[u] = epi.col(n + u, N);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = gq + 8 * h;
      const int m = row_base + r;
      const int4 lo = *reinterpret_cast<const int4*>(stage_buf + r * kRowBytes + 32 * tq);
      const int4 hi = *reinterpret_cast<const int4*>(stage_buf + r * kRowBytes + 32 * tq + 16);
      const int acc[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      if (m < M && n < N) {
        const auto row = h ? r1 : r0;
        typename Epi::Value v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = epi(acc[u], row, col[u]);
        T* dst = out + (size_t)m * N + n;
        if (vec_ok && n + 8 <= N) {
          store8(dst, v);
        } else {
#pragma unroll
          for (int u = 0; u < 8; ++u)
            if (n + u < N) dst[u] = static_cast<T>(v[u]);
        }
      }
    }
    __syncwarp();
  }
}

}  // namespace w8a8
