// Int8 GEMM on Hopper, warp-specialized and persistent (wgmma, sm_90a only).
//
// File layout: as gemm.cu. The copies, tile layout, rasterization and the per-channel
// epilogue are common.cuh's, the instruction, descriptors and fences wgmma.cuh's, the
// tensor maps tma.cuh's, the mbarriers, members, staged epilogue and launch bounds
// ws.cuh's:
// @@ requires ws.cuh
//
// Block: 256 + 32 PW threads, one block per SM, a persistent grid (at most one block per
// SM; each block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... in common.cuh's
// grouped order). Tiles are 128 x BN, BN = 256, 128, 64 or 32.
//  * Warps 8 .. 8 + PW - 1 are the producer (PW = 4 in the cp.async configs; with one
//    producer warp the kernel measured 0.6x as fast on an H200, its tensor pipe ~30%
//    busy and most stalls on the L1TEX scoreboard: docs/cuda.md): for every k-tile of
//    every tile of the block it waits until
//    ring stage s is free (mbarrier empty[s]), issues the stage's 16-byte cp.async copies
//    (A: 128 rows, B: BN rows, 128 bytes of K each, in the 128-byte swizzle that wgmma
//    reads; rows past M / N and K tails zero-filled) and ends with
//    cp.async.mbarrier.arrive.noinc on full[s],
//    so full[s] completes when the copies have landed. It never waits for the MMAs, so
//    it runs up to STAGES k-tiles ahead, across tile boundaries (it loads the next tile
//    while the consumers run the epilogue).
//  * Warps 0-7 are two consumer warpgroups, in one of two modes:
//    - cooperative (PP false): warpgroup g computes rows [64 g, 64 g + 64) of every
//      tile with wgmma.m64n{BN}k32 (4 per k-tile), both operands straight from shared
//      memory, and both run the epilogue together while the tensor cores idle.
//    - ping-pong (PP, BN <= 128): warpgroup g takes the block's tiles g, g + 2, ... (in
//      the block's sequence) and computes all 128 rows of each as two m64 halves (8
//      wgmmas per k-tile, BN accumulators per thread); the two take turns on the tensor
//      cores, so one's epilogue runs while the other multiplies. The producer's order
//      is unchanged: tile g's k-tiles are ring positions g * ktiles ...
//    After issuing k-tile i a warpgroup waits for k-tile i - 1 only (wgmma.wait_group 1:
//    one group stays in flight) and releases its stage (one arrive per warp on empty[s]).
//    Cooperative tiles may keep ACC (2 or 4) accumulator sets: the 4 wgmmas of a k-tile
//    add into sets 0, 1, .. in turn, so they do not each wait for the previous one's
//    result; the sets are summed (int32, exact) before the epilogue. 128 x 32 with 4
//    sets took 2-14% less time on the cp.async producer at M = 16-512; with TMA, and
//    128 x 64 with 2, within 5% of one set (NVIDIA H200, 2026-12-01).
//  * Epilogue (ws_epilogue: per warp, no block barrier), 32 columns per pass: the warp
//    writes its raw int32 accumulators to its own padded staging buffer in shared memory
//    (conflict-free 8-byte stores), then each lane reads 8 consecutive columns of one
//    row back, applies the shared ChannelEpilogue (common.cuh) and stores them with
//    16-byte stores (one for 16-bit outputs, two for 32-bit ones); 4 lanes write a row's
//    32 columns contiguously (full sectors). Scalar stores only for a column tail or
//    rows not 16-byte aligned.
//
// The TMA producer (TMA = true, the tma_* bodies; PW = 1 or 4): instead of the cp.async
// copies, lane 0 of warp 8 issues two tile loads per stage (cp.async.bulk.tensor: A's
// min(M, 128) x 128-byte box and B's BN x 128-byte box, written in the same 128-byte
// swizzle, rows past M / N and the K tail filled with zeros by the hardware) and one
// mbarrier.arrive.expect_tx of the stage's bytes on full[s] (count 1). Below 128 rows
// the A box holds just the M rows: a 128-row box mostly past M measured 1.5x slower
// at M = 16 on 4096 x 4096 with 128 blocks (18.0 against 11.7 us, 2026-12-01); the
// stage rows past M then keep stale bytes, which only reach accumulator rows >= M,
// never stored. Every block makes the launch's maps at the start from host-encoded
// prototypes (tma.cuh: why and how; TmaMaps: where they go). No
// register or load/store-unit work per copied byte is left to the SM. With PW = 4 the
// producer warpgroup gives registers to the consumers (setmaxnreg: 40 / 232 per thread)
// and warps 9-11 exit; with ptxas's 168 the bias and sibling bodies spilled up to 868
// bytes, with 232 none.
//
// Synchronization:
//  * full[s] (count 32 PW): the producer threads' cp.async.mbarrier.arrive.noinc (TMA:
//    count 1, the expect_tx arrive; the phase completes when the loads' bytes landed);
//    phase r of full[s] is k-tile r * STAGES + s. Consumers wait on parity
//    (i / STAGES) & 1.
//  * empty[s] (count 8, ping-pong 4: the warps that read the stage): one arrive per
//    consumer warp after its wgmma reading stage s completed (wait_group). The
//    producer's round r >= 1 waits for parity ((i / STAGES) & 1) ^ 1; round 0 passes at
//    once (an mbarrier reports the phase before its first as complete).
//  * Ping-pong only, order[0..1] (count 4): a parity wait for phase r of full[s] passes
//    at once while the barrier is still in phase r - 1 (that reads as the completed
//    phase before), so a warpgroup may wait on k-tile i only once k-tile i - STAGES has
//    landed. When that k-tile belongs to the other warpgroup's tile, only that
//    warpgroup's own wait says so: a warpgroup starts its tile g once the other passed
//    the last full[] wait of tile g - 1. It arrives on order[its partner] right after
//    that wait; tile g waits for phase (g - 1) / 2 of its own order barrier.
//  * cp.async writes shared memory through the generic proxy, wgmma reads it through the
//    async proxy: every consumer thread executes fence.proxy.async after acquiring full[s]
//    and before its wgmmas (not with TMA: its loads write through the async proxy).
//  * The accumulators are pinned after wgmma.wait_group 0 (an empty asm that "modifies"
//    each register) so the compiler cannot move epilogue reads above the wait.
// The consumers never use a block-wide barrier after the start (the producer warps have
// left the loop by then), and the producer exits after its last copies have landed.
//
// Invariants: as gemm.cu (K % 16 == 0, zero-filled tails, |A|, |B| <= 128, K < 2^17;
// kWeightU8 K <= 66311); launched with exactly 256 + 32 PW threads and
// STAGES * (128 + BN) * 128 + 8 * 2560 + 16 * STAGES + 16 + 1024 bytes of dynamic shared
// memory (the launcher's WsConfig.shared_memory; TMA configs add room for 1 + G maps).

namespace w8a8 {

// Arrive on `bar` once every cp.async this thread issued so far has landed; .noinc: the
// arrival counts toward the barrier's expected count (32 producer lanes).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// One tile column's member: its pointers, N, the tile column within the member and the
// member's index g (its B map is map 1 + g of the TMA producer).
template <typename T>
struct Member {
  const int8_t* b;
  const float* col_scale;
  const float* bias;
  T* out;
  int n, tn, g;
};

// The weights one launch multiplies the activation by (ws.cuh member_tiles): G members, 1
// for a single linear, 2 or 3 for sibling projections fed the same x. Member g is b[g]
// [n[g], K] with its column scales, bias and output out[g] [..., n[g]].
template <typename T, int G>
struct Members {
  const int8_t* b[G];
  const float* col_scale[G];
  const float* bias[G];
  T* out[G];
  int n[G];
};

// The member of the launch's tile column tn (ws.cuh member_tiles), with its tile column
// within the member.
template <int BN, typename T, int G>
__device__ __forceinline__ Member<T> member_of(const Members<T, G>& ms, int tn) {
  Member<T> m{ms.b[0], ms.col_scale[0], ms.bias[0], ms.out[0], ms.n[0], tn, 0};
  int first = 0;  // the first tile column of member g
#pragma unroll
  for (int g = 1; g < G; ++g) {
    first += (ms.n[g - 1] + BN - 1) / BN;
    if (tn >= first) m = Member<T>{ms.b[g], ms.col_scale[g], ms.bias[g], ms.out[g], ms.n[g],
                                   tn - first, g};
  }
  return m;
}

// The TMA producer's maps (tma.cuh: why they are made in every launch), one of two ways:
//  * the per-channel bodies: a_map, the place of A's map in the activation array
//    (shape.cuh rowsum_map); own[g], member g's map array (tma.weight_maps,
//    uint8 [512]): bytes [0, 128) A's prototype ([128, K] codes), [128, 256) the weight's
//    ([N_g, K], BN-row boxes), and its map at the first 128-byte aligned byte from 256;
//  * the int32 body: proto, 1 + G host-encoded prototypes of 128 bytes (A's, then each
//    member's B); scratch, an output of at least 128 (1 + G gridDim.x + 1) bytes where
//    each block writes its maps into its own slot.
// All null for the cp.async producer.
struct TmaMaps {
  const uint8_t* proto;
  uint8_t* scratch;
  uintptr_t a_map;
  const uint8_t* own[kMaxMembers];
};

// MODE, HAS_BIAS, WB: as gemm_wgmma (MODE 0 raw int32 C with WB == kWeightS8; MODE 1
// per-channel dequant with WB == kWeightU8). T: the output type. a: [M, K] (any leading
// shape with M rows). TMA: the producer issues tensor-map tile loads (PW == 1 or 4,
// `tma` set) instead of cp.async copies. PP: ping-pong consumers (BN <= 128).
template <int MODE, bool HAS_BIAS, typename T, int BN, int STAGES, int PW, int WB, int G,
          bool TMA = false, bool PP = false, int ACC = 1>
__device__ __forceinline__ void gemm_ws(const int8_t* a, int M, int K, const float* row_scale,
                                        const int32_t* row_sums, const Members<T, G>& ms,
                                        TmaMaps tma = {}) {
  static_assert(WB != kWeightFlip, "the flipped-code path is gemm_wgmma.cu's");
  static_assert(PW == 1 || PW == 2 || PW == 4, "1, 2 or 4 producer warps");
  static_assert(!TMA || PW == 1 || PW == 4, "TMA: one producer warp or a warpgroup");
  static_assert(G <= kMaxMembers, "at most kMaxMembers members");
  static_assert(!PP || BN <= 128, "ping-pong: a consumer thread holds BN accumulators");
  static_assert(ACC == 1 || (!PP && (ACC == 2 || ACC == 4) && ACC * BN <= 128),
                "ACC accumulator sets: cooperative tiles, at most 64 registers of them");
  // TMA with a producer warpgroup: registers re-dealt (ws.cuh kWsProducerRegs).
  constexpr bool kRealloc = TMA && PW == 4;
  constexpr int BM = 128;
  static_assert(BM == kTmaTileRowsA, "A's box rows (tma_box_rows_a) are the tile's rows");
  constexpr int kStageBytes = (BM + BN) * kBK;
  constexpr int kHalves = PP ? 2 : 1;  // m64 row halves a consumer warpgroup computes
  // Accumulator sets per consumer thread: the ping-pong's two row halves, or ACC sets
  // of the same rows that the k32 steps of a k-tile take in turn (step ks adds into set
  // ks % ACC), summed before the epilogue.
  constexpr int kSets = PP ? 2 : ACC;
  unsigned char* smem = wgmma_smem();
  unsigned char* epi_smem = smem + STAGES * kStageBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(epi_smem + 8 * kWsEpiWarpBytes);
  const uint32_t full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = member_tiles<BN>(ms);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = (K + kBK - 1) / kBK;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, TMA ? 1 : 32 * PW);
      mbar_init(empty0 + 8 * s, PP ? 4 : 8);  // the warps that read stage s
    }
    if (PP) {
      mbar_init(empty0 + 8 * STAGES, 4);  // order[0], order[1]: the consumers' turns
      mbar_init(empty0 + 8 * STAGES + 8, 4);
    }
  }
  __syncthreads();

  if constexpr (TMA) {
    if (warp >= kWsProducerWarp) {
      if (!ws_producer_start<kRealloc>(warp)) return;  // warps 9-11 gave their registers
      // This launch's maps, staged in shared memory after the barriers (one stage per
      // map) and published to global memory: A's to a_map and each weight's to its map
      // array (written alike by every block and every launch on the same arrays), or all
      // to this block's scratch slot (TmaMaps, tma.cuh).
      unsigned char* stage = reinterpret_cast<unsigned char*>(tma_aligned(bars + 2 * STAGES + 2));
      void* map_a;
      const void* map_b[G];
      if (tma.proto != nullptr) {
        unsigned char* slot = reinterpret_cast<unsigned char*>(tma_aligned(tma.scratch)) +
                              static_cast<size_t>(blockIdx.x) * (1 + G) * kTmaMapBytes;
        map_a = slot;
        tma_make_maps(
            map_a, tma.proto, a, M, ms.b, [&](int g) { return tma.proto + (1 + g) * kTmaMapBytes; },
            [&](int g) { return static_cast<void*>(slot + (1 + g) * kTmaMapBytes); }, stage,
            map_b);
      } else {
        map_a = reinterpret_cast<void*>(tma.a_map);
        tma_make_maps(map_a, a, M, ms.b, tma.own, stage, map_b);
      }
      if (lane != 0) return;
      tma_acquire_maps(map_a, map_b);
      // A's box has tma_box_rows_a(M) rows (written into its map above): below BM rows
      // the rows past M are neither read nor zero-filled; they keep what the stage held
      // before and only feed accumulator rows the epilogue never stores.
      const uint32_t stage_tx = (tma_box_rows_a(M) + BN) * kBK;
      int it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int tm, tn;
        tile_coords(tile, tiles_m, tiles_n, tm, tn);
        const Member<T> mb = member_of<BN>(ms, tn);
        const void* mb_map = member_map(map_b, mb.g);
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const int s = it % STAGES;
          mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
          const uint32_t sa = smem_addr(smem + s * kStageBytes);
          ws_tma_load_stage<BN>(sa, full0 + 8 * s, stage_tx, map_a, mb_map, kt, tm, mb.tn);
        }
      }
      return;
    }
  }
  if (warp >= kWsProducerWarp) {
    // Producer thread t (0 .. 32 PW - 1) copies 16-byte chunk t % 8 of rows t / 8 + kStep i
    // of each operand tile.
    constexpr int kStep = 4 * PW;
    const int ptid = tid - 32 * kWsProducerWarp;
    const int chunk = ptid & 7, r0 = ptid >> 3;
    const size_t kstep = kStep * static_cast<size_t>(K);
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      int tm, tn;
      tile_coords(tile, tiles_m, tiles_n, tm, tn);
      const Member<T> mb = member_of<BN>(ms, tn);
      const int8_t* b = mb.b;
      const int N = mb.n;
      const int m0 = tm * BM, n0 = mb.tn * BN;
      const int8_t* pa = a + (size_t)(m0 + r0) * K + chunk * 16;
      const int8_t* pb = b + (size_t)(n0 + r0) * K + chunk * 16;
      uint32_t amask = 0;
#pragma unroll
      for (int i = 0; i < BM / kStep; ++i) amask |= (m0 + r0 + kStep * i < M ? 1u : 0u) << i;
      uint64_t bmask = 0;
#pragma unroll
      for (int i = 0; i < BN / kStep; ++i)
        bmask |= (uint64_t)(n0 + r0 + kStep * i < N ? 1u : 0u) << i;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
        const int k0 = kt * kBK;
        const bool kok = k0 + chunk * 16 < K;
        const uint32_t sa = smem_addr(smem + s * kStageBytes);
        const uint32_t sb = sa + BM * kBK;
        // Every copy is issued, predicated by its src-size (0: 16 zero bytes, nothing
        // read), never skipped by a branch: skipping the rows past M / N measured 1.5x
        // slower on an H200 (111.4 vs 74.4 us, M = 2048, 4096 x 4096).
#pragma unroll
        for (int i = 0; i < BM / kStep; ++i) {
          const bool ok = kok && ((amask >> i) & 1u);
          cp_async_16(sa + swz(r0 + kStep * i, chunk), ok ? pa + i * kstep + k0 : a, ok);
        }
#pragma unroll
        for (int i = 0; i < BN / kStep; ++i) {
          const bool ok = kok && ((bmask >> i) & 1u);
          cp_async_16(sb + swz(r0 + kStep * i, chunk), ok ? pb + i * kstep + k0 : b, ok);
        }
        cp_async_arrive_noinc(full0 + 8 * s);
      }
    }
    cp_async_wait_all();
    return;
  }

  // Consumers. Cooperative (PP false): both warpgroups take every tile of the block, wg
  // its rows [64 wg, 64 wg + 64). Ping-pong (PP): warpgroup wg takes the block's tiles
  // g = wg, wg + 2, ... (g: the tile's position in the block's sequence, whose k-tiles
  // are ring positions g * ktiles ...), all 128 rows of each as two m64 halves, so one
  // warpgroup's epilogue runs while the other's MMAs keep the tensor cores busy.
  const int wg = warp >> 2;
  if constexpr (kRealloc) setmaxnreg_inc<kWsConsumerRegs>();
  unsigned char* stage_buf = epi_smem + warp * kWsEpiWarpBytes;
  int d[kSets][BN / 2];
  const uint32_t order0 = empty0 + 8 * STAGES;  // PP: order[w], count 4 (see below)
  for (int g = PP ? wg : 0;; g += PP ? 2 : 1) {
    const int tile = blockIdx.x + g * gridDim.x;
    if (tile >= tiles) break;
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    const Member<T> mb = member_of<BN>(ms, tn);
    int it = g * ktiles;
    // PP: the tile's first full[] wait may come only after the other warpgroup passed
    // the last one of its tile g - 1. A warpgroup that ran ahead would wait for phase r
    // of a stage still in phase r - 1 (its previous k-tile, of the other warpgroup's
    // tile, not landed), and the parity wait would pass at once: stale operands, and an
    // early release of the stage. order[wg] completes once per mainloop of the other
    // warpgroup (its 4 warps arrive after their last wait), so the g-th tile waits for
    // phase (g - 1) / 2 of it. The mainloops alternate strictly, so a warpgroup never
    // waits on order[] a phase early either.
    if (PP && g > 0) mbar_wait(order0 + 8 * wg, ((g - 1) >> 1) & 1);
    // Every consumer warpgroup issues its MMAs, even one whose 64 rows all lie past M
    // (M <= 64): a branch around wgmma makes ptxas serialize every wgmma of the kernel
    // ("C7520 ... serialized due to ... divergent path"; measured 1.4x slower on an
    // H200), and tests/test_cuda_compile.py fails on that warning.
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % STAGES;
      mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
      if constexpr (!TMA) fence_proxy_async();
      const uint32_t sa = smem_addr(smem + s * kStageBytes) + (PP ? 0 : wg * 64 * kBK);
      const uint32_t sb = smem_addr(smem + s * kStageBytes + BM * kBK);
      wgmma_fence();
      // Set h + ks % ACC (h: the ping-pong's row half; ACC == 1 there); a set's first
      // step of the tile overwrites it (scale-d 0), every step's operands are in smem
      // (zero-filled K tails), so each set is written before it is read.
#pragma unroll
      for (int ks = 0; ks < kBK / 32; ++ks)
#pragma unroll
        for (int h = 0; h < kHalves; ++h)
          wgmma_step<WB == kWeightU8, BN>(d[h + ks % ACC], sa + h * 64 * kBK, sb, ks,
                                          kt != 0 || ks >= ACC);
      wgmma_commit();
      if (kt > 0) {
        wgmma_wait<1>();  // k-tile it - 1 has been read: release its stage
        if (lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      }
    }
    if (PP && lane == 0) mbar_arrive(order0 + 8 * (wg ^ 1));  // the other's turn
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
#pragma unroll
    for (int h = 0; h < kSets; ++h)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+r"(d[h][i])::"memory");
    // int32 sums wrap modulo 2^32 like the single chain's, so the split is exact.
#pragma unroll
    for (int j = 1; j < ACC; ++j)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) d[0][i] += d[j][i];

    const ChannelEpilogue<MODE, HAS_BIAS, WB> epi{row_scale, row_sums, mb.col_scale, mb.bias};
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
      ws_epilogue<BN>(d[h], epi, mb.out, tm * BM + (PP ? h : wg) * 64 + (warp & 3) * 16,
                      mb.tn * BN, M, mb.n, lane, stage_buf);
  }
}

}  // namespace w8a8

// @@ body int32
// Raw int8 GEMM: a [..., K] int8, b [N, K] int8 -> c [..., N] int32.
w8a8::gemm_ws<0, false, int32_t, BN, STAGES, PW, w8a8::kWeightS8, 1, false, PP != 0, ACC>(
    a, w8a8::rows(a_shape, a_ndim), a_shape[a_ndim - 1], nullptr, nullptr,
    w8a8::Members<int32_t, 1>{{b}, {nullptr}, {nullptr}, {c}, {b_shape[0]}});

// @@ body channel_u8
// Per-channel W8A8 on the unsigned codes (K <= 66311 only): xa, the quantize's array of
// codes, scales and row sums (shape.cuh rowsum_acts), w [N, K/4] uint32 codes, ws [N] f32;
// y [..., N].
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, false, T, BN, STAGES, PW, w8a8::kWeightU8, 1, false, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {ws}, {nullptr}, {y},
                        {w_shape[0]}});

// @@ body channel_u8_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, true, T, BN, STAGES, PW, w8a8::kWeightU8, 1, false, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {ws}, {bias}, {y},
                        {w_shape[0]}});

// @@ body group2
// channel_u8 for two weights fed the same activation (e.g. gate/up): w0 [N0, K/4],
// ws0 [N0], w1, ws1 -> y0 [..., N0], y1 [..., N1].
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, false, T, BN, STAGES, PW, w8a8::kWeightU8, 2, false, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {ws0, ws1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}});

// @@ body group2_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, true, T, BN, STAGES, PW, w8a8::kWeightU8, 2, false, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {ws0, ws1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}});

// @@ body group3
// Three weights fed the same activation (e.g. q/k/v).
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, false, T, BN, STAGES, PW, w8a8::kWeightU8, 3, false, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {ws0, ws1, ws2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}});

// @@ body group3_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, true, T, BN, STAGES, PW, w8a8::kWeightU8, 3, false, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {ws0, ws1, ws2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}});

// @@ body tma_int32
// The bodies above with the TMA producer (gemm_ws<..., true>; TmaMaps). tma_int32: inputs
// as int32's plus proto (uint8, 256 bytes: A's and B's tensor-map prototypes), outputs
// plus tmap (uint8 scratch, 128 (2 gridDim.x + 1) bytes). The per-channel bodies: inputs
// as theirs plus each weight's map array (wmap, or wmap0, wmap1, ...: uint8 [512],
// tma.weight_maps); A's map goes into xa's map area (shape.cuh rowsum_map).
w8a8::gemm_ws<0, false, int32_t, BN, STAGES, PW, w8a8::kWeightS8, 1, true, PP != 0, ACC>(
    a, w8a8::rows(a_shape, a_ndim), a_shape[a_ndim - 1], nullptr, nullptr,
    w8a8::Members<int32_t, 1>{{b}, {nullptr}, {nullptr}, {c}, {b_shape[0]}},
    w8a8::TmaMaps{proto, tmap, 0, {nullptr}});

// @@ body tma_channel_u8
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, false, T, BN, STAGES, PW, w8a8::kWeightU8, 1, true, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {ws}, {nullptr}, {y},
                        {w_shape[0]}},
    w8a8::TmaMaps{nullptr, nullptr, acts.map, {wmap}});

// @@ body tma_channel_u8_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, true, T, BN, STAGES, PW, w8a8::kWeightU8, 1, true, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {ws}, {bias}, {y},
                        {w_shape[0]}},
    w8a8::TmaMaps{nullptr, nullptr, acts.map, {wmap}});

// @@ body tma_group2
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, false, T, BN, STAGES, PW, w8a8::kWeightU8, 2, true, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {ws0, ws1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::TmaMaps{nullptr, nullptr, acts.map, {wmap0, wmap1}});

// @@ body tma_group2_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, true, T, BN, STAGES, PW, w8a8::kWeightU8, 2, true, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {ws0, ws1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::TmaMaps{nullptr, nullptr, acts.map, {wmap0, wmap1}});

// @@ body tma_group3
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, false, T, BN, STAGES, PW, w8a8::kWeightU8, 3, true, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {ws0, ws1, ws2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::TmaMaps{nullptr, nullptr, acts.map, {wmap0, wmap1, wmap2}});

// @@ body tma_group3_bias
const w8a8::RowsumActs acts = w8a8::rowsum_acts(xa, xa_shape);
w8a8::gemm_ws<1, true, T, BN, STAGES, PW, w8a8::kWeightU8, 3, true, PP != 0, ACC>(
    acts.q, acts.m, acts.k, acts.scale, acts.sums,
    w8a8::Members<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {ws0, ws1, ws2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::TmaMaps{nullptr, nullptr, acts.map, {wmap0, wmap1, wmap2}});
