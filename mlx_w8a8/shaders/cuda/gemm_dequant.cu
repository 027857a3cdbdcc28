// Dequantizing GEMM on Hopper (wgmma, sm_90a only): MLX's affine weights as stored (8-bit
// or 4-bit codes q, per-group scales s and biases b in the activation dtype T, bfloat16
// or float16) times the float activations x, with no quantization of x:
//   y[m, n] = sum_k x[m, k] * T(s[n, g(k)] q[n, k] + b[n, g(k)])  (+ bias[n])
// each weight rounded once to T (a fused multiply-add of the exact code), the products
// summed by the tensor cores in float32, y rounded once to T. What mx.quantized_matmul
// computes, with the weight's rounding at most as coarse (docs/numerics.md, "Dequantized
// weights").
//
// Why this layout ("swap AB"): a wgmma reads its B operand from shared memory only, its
// A operand from registers or shared memory. The weights take the A side (64 output
// features per warpgroup, the m64 rows) so that each consumer thread dequantizes its own
// fragment in registers, straight from the stored codes in shared memory, and the
// activations take the B side (the tokens, wgmma's n) unchanged from global memory. So no
// int8 or float copy of the weight exists anywhere, and the group scale costs a few
// instructions per weight element per token tile (not per accumulator, as in the
// group-wise W8A8 GEMM's promotion).
//
// Block: 384 threads, one block per SM, a persistent grid walking tiles of 128 features x
// BN tokens (BN = 64, 128 or 256) in common.cuh's grouped order (token tiles fastest, so
// blocks running together read the same weight tile).
//  * Warps 8-11 produce. They give their registers to the consumers (setmaxnreg 40 / 232,
//    as ws.cuh's TMA producers: a consumer thread holds BN / 2 float32 sums and two
//    fragment sets, 128 + 32 registers at BN = 256); warps 9-11 then leave. Warp 8 makes
//    the launch's two tensor maps (tma.cuh: the activations as bytes [M, 2K] in boxes of
//    BN rows x 128 bytes, 128-byte swizzle, wgmma's B layout; the codes as bytes
//    [N, K BITS / 8] in boxes of 128 rows x 64 or 32 bytes, TMA's 64- or 32-byte swizzle,
//    which is dq_wswz) in this block's slot of the scratch output, and its lane 0 issues,
//    per k-tile (64 elements of K), after ring stage s is free (empty[s]), the two box
//    loads completing on full[s] (armed with the stage's bytes: rows past M or N arrive
//    as zeros and count in full).
//  * Warps 0-7 consume, warpgroup wg the features [64 wg, 64 wg + 64) of the tile: per
//    k-tile each thread builds its four m64k16 A fragments (rows 16 w + lane / 4 and 8
//    below, columns 2 (lane % 4) + {0, 1} and 8 more, the mma.sync A layout) from the
//    codes and the group's (s, b), fences, issues the four wgmma.m64nBNk16 on the stage's
//    activations and commits; then waits for the previous k-tile's MMAs
//    (wgmma.wait_group 1) and releases its stage. The fragments alternate between two
//    register sets (k-tiles of even and odd index), so a k-tile's are built while the
//    previous k-tile's MMAs still read theirs.
//  * Epilogue (per warp): 32 tokens at a time, the float32 sums (+ bias) rounded to T and
//    transposed through the warp's 1 KB staging buffer, then each lane stores one token's
//    16 features (32 bytes, two 16-byte stores where N allows).
//
// Synchronization: full[s] (count 1: the producer's expect_tx arrive; the phase completes
// when both boxes' bytes landed; phase r of stage s is k-tile r * STAGES + s, consumers
// wait on parity (i / STAGES) & 1), empty[s] (count 8: one arrival per consumer warp once
// the MMAs reading the stage completed; the producer's round r waits for parity
// ((i / STAGES) & 1) ^ 1, round 0 passing at once). TMA writes through the async proxy
// and completes on full[s], so the fragments' shared-memory loads after the wait see the
// codes and the wgmmas the activations with no proxy fence.
//
// Codes to T: dequant.cuh (DqType, dq_codes4), shared with dequantize.cu.
//
// Invariants: K % 64 == 0 (whole k-tiles; group size 32, 64 or 128 divides K), scales and
// biases of dtype T ([N, K / GS], row-major), M >= 1; x and the codes 16-byte aligned (TMA);
// proto holds the two maps' prototypes (gemm_dequant.dequant_prototypes, for this BN, K,
// N and BITS) and scratch (2 gridDim.x + 1) 128 bytes; launched with 384 threads and
// tiles.DequantConfig.shared_memory(BITS) bytes of dynamic shared memory.
// @@ requires ws.cuh
// @@ requires dequant.cuh
// @@ requires wgmma_rs.cuh

namespace w8a8 {

constexpr int kDqRows = 128;     // weight rows (output features) per tile: two m64 warpgroups
constexpr int kDqK = 64;         // K per k-tile: one 128-byte row of 16-bit activations
constexpr int kDqEpiBytes = 1024;  // per-warp staging: 32 tokens x 16 features of T

// The weight tile's swizzle: 16-byte chunk c of row r. 8-bit rows are 64 bytes (chunk c:
// k16 step c), 4-bit rows 32 (chunk c: steps 2c, 2c + 1); the 8 rows a warp's
// fragment loads read at once land in 8 different 16-byte bank groups.
template <int BITS>
__device__ __forceinline__ int dq_wswz(int r, int c) {
  if constexpr (BITS == 8) return r * 64 + ((c ^ ((r >> 1) & 3)) << 4);
  else return r * 32 + ((c ^ ((r >> 2) & 1)) << 4);
}

__device__ __forceinline__ uint32_t dq_lds(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint2 dq_lds2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

// One k-tile's (s, b) pairs of a row: for steps 0-1 (index 0) and 2-3 (index 1); equal
// unless GS == 32 (two groups per k-tile). Raw: the T bits as loaded.
struct DqTerms {
  uint32_t s[2], b[2];
};

template <int GS>
__device__ __forceinline__ void dq_load_terms(const uint16_t* ws, const uint16_t* wb, int n, int G,
                                              int kt, bool valid, uint32_t& rs, uint32_t& rb) {
  rs = 0;
  rb = 0;
  if (!valid) return;
  if constexpr (GS == 32) {  // groups 2 kt, 2 kt + 1: one aligned word (G is even)
    const size_t at = (size_t)n * G + 2 * kt;
    rs = *reinterpret_cast<const uint32_t*>(ws + at);
    rb = *reinterpret_cast<const uint32_t*>(wb + at);
  } else {
    const size_t at = (size_t)n * G + (kt * kDqK) / GS;
    rs = ws[at];
    rb = wb[at];
  }
}

template <int GS>
__device__ __forceinline__ DqTerms dq_terms(uint32_t rs, uint32_t rb) {
  if constexpr (GS == 32)
    return DqTerms{{__byte_perm(rs, 0, 0x1010), __byte_perm(rs, 0, 0x3232)},
                   {__byte_perm(rb, 0, 0x1010), __byte_perm(rb, 0, 0x3232)}};
  const uint32_t s = __byte_perm(rs, 0, 0x1010), b = __byte_perm(rb, 0, 0x1010);
  return DqTerms{{s, s}, {b, b}};
}

template <typename T, int BITS, int GS, int BN, int STAGES, bool HAS_BIAS>
__device__ __forceinline__ void gemm_dequant(const T* x, int M, int K, const uint32_t* wq,
                                             const T* wsc, const T* wbi, const float* bias, T* y,
                                             int N, const uint8_t* proto, uint8_t* scratch) {
  static_assert(BITS == 8 || BITS == 4, "8-bit or 4-bit codes");
  static_assert(GS == 32 || GS == 64 || GS == 128, "group sizes 32, 64, 128");
  constexpr int BM = kDqRows;
  constexpr int kWRow = kDqK * BITS / 8;  // bytes of a weight row per k-tile: 64 or 32
  constexpr int kActBytes = BN * 128;
  constexpr int kStageBytes = kActBytes + BM * kWRow;
  static_assert(kStageBytes % 1024 == 0, "stages keep the 1024-byte alignment of the swizzle");
  unsigned char* smem = wgmma_smem();
  unsigned char* epi_smem = smem + STAGES * kStageBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(epi_smem + 8 * kDqEpiBytes);
  const uint32_t full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles_m = (M + BN - 1) / BN, tiles_n = (N + BM - 1) / BM;
  const int tiles = tiles_m * tiles_n;
  const int ktiles = K / kDqK;
  const int G = K / GS;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 8);
    }
  }
  __syncthreads();

  if (warp >= kWsProducerWarp) {
    if (!ws_producer_start<true>(warp)) return;  // warps 9-11 gave their registers
    // This block's two maps: made through shared memory after the barriers, published to
    // its slot of the scratch output (warp-collective: every lane of warp 8).
    unsigned char* stage = reinterpret_cast<unsigned char*>(tma_aligned(bars + 2 * STAGES));
    unsigned char* map_x = reinterpret_cast<unsigned char*>(tma_aligned(scratch)) +
                           static_cast<size_t>(blockIdx.x) * 2 * kTmaMapBytes;
    unsigned char* map_w = map_x + kTmaMapBytes;
    tma_make_map(map_x, proto, x, M, BN, stage);
    tma_make_map(map_w, proto + kTmaMapBytes, wq, 0, 0, stage + kTmaMapBytes);
    if (lane != 0) return;
    tma_acquire(map_x);
    tma_acquire(map_w);
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      int tm, tn;
      tile_coords(tile, tiles_m, tiles_n, tm, tn);
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
        const uint32_t sa = smem_addr(smem + s * kStageBytes);
        mbar_arrive_expect_tx(full0 + 8 * s, kStageBytes);
        tma_load_2d(sa, map_x, kt * 128, tm * BN, full0 + 8 * s);
        tma_load_2d(sa + kActBytes, map_w, kt * kWRow, tn * BM, full0 + 8 * s);
      }
    }
    return;
  }

  // Consumers.
  setmaxnreg_inc<kWsConsumerRegs>();
  const int wg = warp >> 2, gq = lane >> 2, tq = lane & 3;
  const int r0 = 64 * wg + 16 * (warp & 3) + gq;  // this thread's first tile row; r0 + 8
  const uint16_t* ws16 = reinterpret_cast<const uint16_t*>(wsc);
  const uint16_t* wb16 = reinterpret_cast<const uint16_t*>(wbi);
  unsigned char* stage_buf = epi_smem + warp * kDqEpiBytes;
  uint32_t sel_lo, sel_hi;  // 8-bit: bytes 2 (tq & 1), + 1 of the fragment's words
  DqType<T>::selectors(2 * (tq & 1), sel_lo, sel_hi);
  const uint32_t sel4 = 0x4440u | tq;  // 4-bit: byte tq of the step's words
  // Byte offsets of the thread's rows in a stage's weight tile, at chunk 0.
  const int wx = BITS == 8 ? (r0 >> 1) & 3 : (r0 >> 2) & 1;  // the rows' swizzle (r0 + 8 alike)
  float d[BN / 2];
  uint32_t a0[4][4], a1[4][4];
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * BN, n0 = tn * BM;
    const int na = n0 + r0, nb = na + 8;
    const bool va = na < N, vb = nb < N;
    uint32_t rsa, rba, rsb, rbb;  // the next k-tile's raw terms, loaded one k-tile ahead
    dq_load_terms<GS>(ws16, wb16, na, G, 0, va, rsa, rba);
    dq_load_terms<GS>(ws16, wb16, nb, G, 0, vb, rsb, rbb);

    // The stage of ring position it - 1, its MMAs complete: released (one arrive per warp).
    auto release_previous = [&]() {
      if (lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
    };
    // k-tile kt at ring position i: fragments into a, MMAs issued, k-tile kt - 1 released.
    auto kstep = [&](uint32_t (&a)[4][4], int kt) {
      const int s = it % STAGES;
      const DqTerms ta = dq_terms<GS>(rsa, rba), tb = dq_terms<GS>(rsb, rbb);
      if (kt + 1 < ktiles) {
        dq_load_terms<GS>(ws16, wb16, na, G, kt + 1, va, rsa, rba);
        dq_load_terms<GS>(ws16, wb16, nb, G, kt + 1, vb, rsb, rbb);
      }
      mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
      const uint32_t sa = smem_addr(smem + s * kStageBytes);
      const uint32_t wa = sa + kActBytes + r0 * kWRow, wb = wa + 8 * kWRow;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const int h = ks >> 1;  // the terms' index (GS == 32: the k-tile's second group)
        if constexpr (BITS == 8) {
          const uint32_t off = ((ks ^ wx) << 4) + 4 * (tq >> 1);
          const uint32_t x0 = dq_lds(wa + off), x1 = dq_lds(wb + off);
          const uint32_t x2 = dq_lds(wa + off + 8), x3 = dq_lds(wb + off + 8);
          a[ks][0] = DqType<T>::fma2(DqType<T>::codes8(x0, sel_lo, sel_hi), ta.s[h], ta.b[h]);
          a[ks][1] = DqType<T>::fma2(DqType<T>::codes8(x1, sel_lo, sel_hi), tb.s[h], tb.b[h]);
          a[ks][2] = DqType<T>::fma2(DqType<T>::codes8(x2, sel_lo, sel_hi), ta.s[h], ta.b[h]);
          a[ks][3] = DqType<T>::fma2(DqType<T>::codes8(x3, sel_lo, sel_hi), tb.s[h], tb.b[h]);
        } else {
          const uint32_t off = (((ks >> 1) ^ wx) << 4) + 8 * (ks & 1);
          const uint2 x0 = dq_lds2(wa + off), x1 = dq_lds2(wb + off);
          a[ks][0] = DqType<T>::fma2(dq_codes4<T>(x0.x, sel4), ta.s[h], ta.b[h]);
          a[ks][1] = DqType<T>::fma2(dq_codes4<T>(x1.x, sel4), tb.s[h], tb.b[h]);
          a[ks][2] = DqType<T>::fma2(dq_codes4<T>(x0.y, sel4), ta.s[h], ta.b[h]);
          a[ks][3] = DqType<T>::fma2(dq_codes4<T>(x1.y, sel4), tb.s[h], tb.b[h]);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_rs<DqType<T>::kBf16, BN>(d, a[ks], wgmma_desc(sa + ks * 32), kt != 0 || ks != 0);
      wgmma_commit();
      if (kt > 0) {
        wgmma_wait<1>();  // k-tile kt - 1's MMAs are done: its stage and fragments are free
        release_previous();
      }
      ++it;
    };
    for (int kt = 0; kt < ktiles; kt += 2) {
      kstep(a0, kt);
      if (kt + 1 < ktiles) kstep(a1, kt + 1);
    }
    wgmma_wait<0>();
    release_previous();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");

    // Epilogue: 32 tokens per pass through the warp's staging buffer ([token][16 features]
    // of T, 32 bytes a token), then lane l stores token l's 16 features.
    const float ba = HAS_BIAS && va ? bias[na] : 0.f, bb = HAS_BIAS && vb ? bias[nb] : 0.f;
    T* st = reinterpret_cast<T*>(stage_buf);
    const int nf = n0 + 64 * wg + 16 * (warp & 3);  // the warp's first feature
    const bool vec_ok = (N * (int)sizeof(T)) % 16 == 0 && nf + 16 <= N;
#pragma unroll
    for (int pass = 0; pass < BN / 32; ++pass) {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * pass + jj, t = 8 * jj + 2 * tq;
        st[t * 16 + gq] = static_cast<T>(d[4 * j] + ba);
        st[(t + 1) * 16 + gq] = static_cast<T>(d[4 * j + 1] + ba);
        st[t * 16 + gq + 8] = static_cast<T>(d[4 * j + 2] + bb);
        st[(t + 1) * 16 + gq + 8] = static_cast<T>(d[4 * j + 3] + bb);
      }
      __syncwarp();
      const int m = m0 + 32 * pass + lane;
      if (m < M) {
        T* dst = y + (size_t)m * N + nf;
        const uint4* src = reinterpret_cast<const uint4*>(stage_buf + lane * 32);
        if (vec_ok) {
          reinterpret_cast<uint4*>(dst)[0] = src[0];
          reinterpret_cast<uint4*>(dst)[1] = src[1];
        } else {
#pragma unroll
          for (int u = 0; u < 16; ++u)
            if (nf + u < N) dst[u] = st[lane * 16 + u];
        }
      }
      __syncwarp();
    }
  }
}

}  // namespace w8a8

// @@ body dequant
// x [..., K] (T), w [N, K * BITS / 32] uint32 (MLX's packed codes), ws, wb [N, K / GS]
// (T: the stored scales and biases), proto uint8 [256] (the two maps' prototypes)
// -> y [..., N] (T), scratch uint8 [(2 blocks + 1) * 128] (the blocks' maps).
w8a8::gemm_dequant<T, BITS, GS, BN, STAGES, false>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1], w, ws, wb, nullptr, y, w_shape[0],
    proto, scratch);

// @@ body dequant_bias
// As dequant, with bias [N] float32 after proto.
w8a8::gemm_dequant<T, BITS, GS, BN, STAGES, true>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1], w, ws, wb, bias, y, w_shape[0],
    proto, scratch);
