// The subnormal promotion's bodies (SUB: gemm_grouped_ws.cu's mainloop with the
// promotion of its "subnormal promotion" paragraph): the group-wise TMA GEMM's header,
// then wgmma_rs.cuh for the offset blocks' register-A wgmma. A file of its own so that
// gemm_grouped_ws.cu's bodies compile without that header (see the declarations there).
// @@ requires gemm_grouped_ws.cu
// @@ requires wgmma_rs.cuh

namespace w8a8 {

// x, computed where this is in program order: the addresses derived from it are not
// hoisted above the wgmmas before it (ptxas, unrolling a block's groups, otherwise kept
// every group's descriptors live from its start and spilled).
__device__ __forceinline__ int opaque(int x) {
  int r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

// SW: d (+)= A (64 x 16) * B (128 x 16)^T on bfloat16, both by descriptor
// (wgmma_desc_plain's layout): the swapped offset block's wgmma.
__device__ __forceinline__ void wgmma_ss_bf16_128(float (&d)[64], uint64_t da, uint64_t db,
                                                  int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" W8A8_S64 "}, %64, %65, "
               "p, 1, 1, 0, 0;\n}\n"
               : W8A8_DQ64(0)
               : "l"(da), "l"(db), "r"(accumulate));
#else
  __trap();
#endif
}

// SW: f += S U for one group's transposed set d: the thread's rows are weight rows r and
// r + 8 (d[4 c], d[4 c + 1] of row r, d[4 c + 2], d[4 c + 3] of r + 8), their S the
// stage's terms (group j's BN values from ts + 4 j BN), loaded by the caller.
__device__ __forceinline__ void subswap_promote(float (&f)[64], const int (&d)[64], float s_lo,
                                                float s_hi) {
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    f[4 * c] = fma_keep_subnormal(__int_as_float(d[4 * c]), s_lo, f[4 * c]);
    f[4 * c + 1] = fma_keep_subnormal(__int_as_float(d[4 * c + 1]), s_lo, f[4 * c + 1]);
    f[4 * c + 2] = fma_keep_subnormal(__int_as_float(d[4 * c + 2]), s_hi, f[4 * c + 2]);
    f[4 * c + 3] = fma_keep_subnormal(__int_as_float(d[4 * c + 3]), s_hi, f[4 * c + 3]);
  }
}

// 4 bytes of shared memory at `addr`, volatile as lds_f2.
__device__ __forceinline__ float lds_f1(uint32_t addr) {
  float v;
  asm volatile("ld.volatile.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
  return v;
}

// One offset block of NT k-tiles (NT * kBK / GS groups) of a tile, pipelined. The block's
// bfloat16 offset wgmma (accumulating into f) and its first group's u8 x u8 wgmmas are
// issued together; wait_group 1 completes the offsets (group 0 still running). Then each
// group's successor is issued (into the other of two int32 sets) before the group is
// waited for (wait_group 1) and promoted, so each promotion runs under the next group's
// MMAs; the block's last group waits with wait_group 0.
// Hazards this shape keeps clear of (ptxas, sm_90a):
//  * no set is in flight across a loop's back edge (the block is unrolled, its sets
//    declared in it and complete at its end; an in-flight set across a back edge made
//    ptxas serialize every wgmma, C7514);
//  * the groups' first wgmmas read their set (scale-d 0 by predicate, "+r" operands):
//    with write-only operands (wgmma.cuh's wgmma_first) ptxas serialized every wgmma
//    here (C7512, "insufficient register resources");
//  * the addresses of a group's wgmmas and terms are derived where they are used
//    (opaque): unrolled, ptxas otherwise kept every group's from the block's start and
//    spilled.
// `it` is the ring position of the block's first k-tile; a k-tile's stage is released
// once its last group is promoted (the wgmma then in flight reads the next stage).
// SW (gemm_grouped_ws.cu, swapped operands): the warpgroup's 64 weight rows are the
// wgmmas' A and the tile's 128 rows their B; the offset wgmma reads both operands from
// the stage (a unused); a group's two S are loaded before its wait.
template <int BN, int STAGES, int GS, int GB, int NT, bool SW>
__device__ __forceinline__ void subnormal_block(float (&f)[BN / 2], int it, unsigned char* smem,
                                                unsigned char* term_smem, uint32_t full0,
                                                uint32_t empty0, int wg, int rw, int lane,
                                                const uint32_t (&a)[4]) {
  constexpr int BM = 128;
  constexpr int kGroups = kBK / GS, kSteps = GS / 32, kNG = NT * kGroups;
  constexpr int kStageBytes = (BM + BN) * kBK;
  constexpr int kTermBytes = kSubStageTermBytes<BN, GS, SW>;
  const int tq = lane & 3;
  const int row = wg * 64 + rw * 16 + (lane >> 2);  // SW: this thread's first weight row
  auto stage_of = [&](int u) { return (opaque(it) + u / kGroups) % STAGES; };
  auto issue = [&](int (&d)[BN / 2], int u) {
    const int pos = opaque(it) + u / kGroups, s = pos % STAGES, j = u % kGroups;
    if (j == 0 && u != 0) mbar_wait(full0 + 8 * s, (pos / STAGES) & 1);
    // A (64 rows of this warpgroup) and B (every row of the other operand's tile).
    uint32_t sa = smem_addr(smem + s * kStageBytes) + wg * 64 * kBK;
    uint32_t sb = smem_addr(smem + s * kStageBytes + BM * kBK);
    if constexpr (SW) {
      sa = smem_addr(smem + s * kStageBytes + BM * kBK) + wg * 64 * kBK;
      sb = smem_addr(smem + s * kStageBytes);
    }
    wgmma_fence();  // this set's promotion two groups back: before the writes
    wgmma_uu_step<BN>(d, sa, sb, j * kSteps, 0);
#pragma unroll
    for (int ks = 1; ks < kSteps; ++ks) wgmma_uu_step<BN>(d, sa, sb, j * kSteps + ks, 1);
    wgmma_commit();
  };
  float s_lo = 0.f, s_hi = 0.f;  // SW: the S of the group promoted next
  auto load_s = [&](int u) {
    if constexpr (SW) {
      const uint32_t ts = smem_addr(term_smem + stage_of(u) * kTermBytes) +
                          ((u % kGroups) * BN + row) * 4;
      s_lo = lds_f1(ts);
      s_hi = lds_f1(ts + 32);
    }
  };
  auto promote = [&](int (&d)[BN / 2], int u) {
    const int s = stage_of(u), j = u % kGroups;
    pin_set<BN>(d);
    if constexpr (SW) subswap_promote(f, d, s_lo, s_hi);
    else subnormal_promote<BN>(f, d, smem_addr(term_smem + s * kTermBytes), j, tq);
    if (j == kGroups - 1) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
  };
  {
    const int s = it % STAGES;
    mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
    // SW: f's registers settled before the fence (ptxas otherwise copied them between the
    // fence and the wgmma in the shorter last block and injected a warpgroup.arrive, C7519).
    if constexpr (SW) pin_set<BN>(f);
    wgmma_fence();  // f and a were written by this thread: before the wgmma reads them
    const uint32_t pieces = smem_addr(term_smem + s * kTermBytes) + kGroups * BN * 4;
    if constexpr (SW)  // the weight pieces of this warpgroup's rows, the tile rows' pieces
      wgmma_ss_bf16_128(f, wgmma_desc_plain(pieces + wg * 64 * 32),
                        wgmma_desc_plain(pieces + BN * 32), 1);
    else
      wgmma_rs<true, BN>(f, a, wgmma_desc_plain(pieces), 1);
    wgmma_commit();
  }
  int d0[BN / 2], d1[BN / 2];
  issue(d0, 0);
  wgmma_wait<1>();  // the offsets in f complete, group 0 in flight
  pin_set<BN>(f);
#pragma unroll
  for (int u = 0; u < kNG; ++u) {  // group u is in set u % 2, in flight
    load_s(u);
    if (u + 1 < kNG) {
      if (u % 2 == 0) issue(d1, u + 1);
      else issue(d0, u + 1);
      wgmma_wait<1>();  // group u complete, u + 1 in flight
    } else {
      wgmma_wait<0>();  // the block's last group complete
    }
    if (u % 2 == 0) promote(d0, u);
    else promote(d1, u);
  }
}

// The shorter last block of `rest` (1 .. NT) k-tiles, its count as a template argument
// (each an unrolled block).
template <int BN, int STAGES, int GS, int GB, int NT, bool SW>
__device__ __forceinline__ void subnormal_rest(int rest, float (&f)[BN / 2], int it,
                                               unsigned char* smem, unsigned char* term_smem,
                                               uint32_t full0, uint32_t empty0, int wg, int rw,
                                               int lane, const uint32_t (&a)[4]) {
  if constexpr (NT >= 1) {
    if (rest == NT)
      subnormal_block<BN, STAGES, GS, GB, NT, SW>(f, it, smem, term_smem, full0, empty0, wg, rw,
                                                  lane, a);
    else
      subnormal_rest<BN, STAGES, GS, GB, NT - 1, SW>(rest, f, it, smem, term_smem, full0, empty0,
                                                     wg, rw, lane, a);
  }
}

// SUB: a tile's mainloop (declared in gemm_grouped_ws.cu): its offset blocks of GB groups
// (kBlockTiles k-tiles) in order, the last one shorter where GB groups do not divide the
// k-tiles. This thread's A columns 2 tq, 2 tq + 1 and 2 tq + 8, 2 tq + 9 are the block's
// groups tq and tq + 4 where they are piece columns (piece_pair); their R (rows lo, hi) are
// loaded one block ahead.
template <int BN, int STAGES, int GS, int GB, bool SW>
__device__ __forceinline__ void subnormal_tile(float (&f)[BN / 2], int& it, unsigned char* smem,
                                               unsigned char* term_smem, uint32_t full0,
                                               uint32_t empty0, int wg, int rw, int lane,
                                               const int32_t* r_lo, const int32_t* r_hi,
                                               int groups, int ktiles) {
  constexpr int kGroups = kBK / GS, kBlockTiles = GB / kGroups;
  static_assert(kBlockTiles >= 1 && kBlockTiles <= 6, "an offset block of 1 to 6 k-tiles");
  const int tq = lane & 3;
  const int c0 = 2 * tq, c1 = 2 * tq + 8;
  int pr[4];
  auto block_sums = [&](int g0) {
    if constexpr (SW) return;  // the producer writes the rows' pieces
    const int g_a = g0 + c0 / 2, g_b = g0 + c1 / 2;
    const bool ok_a = c0 < 2 * GB && g_a < groups, ok_b = c1 < 2 * GB && g_b < groups;
    pr[0] = ok_a ? r_lo[g_a] : 0;
    pr[1] = ok_a ? r_hi[g_a] : 0;
    pr[2] = ok_b ? r_lo[g_b] : 0;
    pr[3] = ok_b ? r_hi[g_b] : 0;
  };
  auto block_a = [&](uint32_t (&a)[4]) {  // the loaded R as the block's A registers
    if constexpr (SW) {  // unused: the offset wgmma's B is in the stage
      a[0] = a[1] = a[2] = a[3] = 0;
      return;
    }
    a[0] = piece_pair<GB>(c0, pr[0]);
    a[1] = piece_pair<GB>(c0, pr[1]);
    a[2] = piece_pair<GB>(c1, pr[2]);
    a[3] = piece_pair<GB>(c1, pr[3]);
  };
  block_sums(0);
  int kb = 0;
#pragma unroll 1
  for (; kb + kBlockTiles <= ktiles; kb += kBlockTiles, it += kBlockTiles) {
    uint32_t a[4];
    block_a(a);
    block_sums((kb / kBlockTiles + 1) * GB);
    subnormal_block<BN, STAGES, GS, GB, kBlockTiles, SW>(f, it, smem, term_smem, full0, empty0,
                                                         wg, rw, lane, a);
  }
  const int rest = ktiles - kb;  // 0 .. kBlockTiles - 1 k-tiles in a shorter last block
  if (rest > 0) {
    uint32_t a[4];
    block_a(a);
    subnormal_rest<BN, STAGES, GS, GB, kBlockTiles - 1, SW>(rest, f, it, smem, term_smem, full0,
                                                            empty0, wg, rw, lane, a);
    it += rest;
  }
}

// SW: the producer warpgroup (gemm_grouped_ws.cu, swapped operands). Lane 0 of warp 8
// makes the maps and per k-tile arms full[s] with A's and B's boxes and the k-tile's
// terms and loads them, as the 8-bit producer; at an offset block's first k-tile each of
// the 128 threads writes its tile row's pieces (piece_pair's 16 bfloat16 from the block's
// group sums, wgmma_desc_plain's layout: row r's two 16-byte halves at 256 (r / 8) +
// 16 (r % 8) and 128 bytes on) after the weight pieces. Every thread waits for the stage
// to be free before writing it; each warp arrives on full[s] after a proxy fence.
template <int BN, int STAGES, int GS, int GB, typename T, int NM>
__device__ __forceinline__ void subswap_produce(const int8_t* a, int M, int K, const int32_t* sums,
                                                const GroupedMembers<T, NM>& ms,
                                                unsigned char* smem, unsigned char* term_smem,
                                                uint64_t* bars) {
  constexpr int BM = 128;
  constexpr int kGroups = kBK / GS, kBlockTiles = GB / kGroups;
  constexpr int kStageBytes = (BM + BN) * kBK;
  constexpr int kTermBytes = kSubStageTermBytes<BN, GS, true>;
  const uint32_t full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);
  const int pt = threadIdx.x - 32 * kWsProducerWarp;  // 0 .. 127: the tile row it writes
  const int lane = pt & 31;
  const bool loader = pt == 0;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = member_tiles<BN>(ms);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = K / kBK;
  const int groups = K / GS;
  void* map_a = reinterpret_cast<void*>(tma_aligned(sums + static_cast<size_t>(M) * groups));
  const void* map_b[NM];
  if (pt < 32) {  // warp 8 makes the maps (warp-collective)
    unsigned char* stage = reinterpret_cast<unsigned char*>(tma_aligned(bars + 2 * STAGES));
    tma_make_maps(map_a, a, M, ms.b, ms.wmap, stage, map_b);
    if (loader) tma_acquire_maps(map_a, map_b);
  }
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % STAGES;
      // An offset block's first k-tile: its group sums are loaded before the wait for the
      // stage, so their latency passes while the consumers free it (loaded after it, they
      // held full[s] back by a global load per block: Nsight Compute, docs/cuda.md).
      const bool first = kt % kBlockTiles == 0;
      uint32_t p[8];
      if (first) {
        // Recomputed here, not kept across the loop: the warpgroup has kWsProducerRegs
        // registers (kept, they took ptxas past them: a spilled grid stride).
        const int32_t* r = sums + static_cast<size_t>(min(tm * BM + pt, M - 1)) * groups;
        const int g0 = (kt / kBlockTiles) * GB;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          p[i] = piece_pair<GB>(2 * i, i < GB && g0 + i < groups ? r[g0 + i] : 0);
      }
      mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);  // every thread: it writes below
      const uint32_t ts = smem_addr(term_smem + s * kTermBytes);
      if (loader) {
        const GroupedMember<T> mb = member_of<BN>(ms, tn);
        const uint32_t sa = smem_addr(smem + s * kStageBytes);
        ws_tma_load_stage<BN>(sa, full0 + 8 * s,
                              (tma_box_rows_a(M) + BN) * kBK + sub_term_bytes<BN, GS, GB>(kt),
                              map_a, member_map(map_b, mb.g), kt, tm, mb.tn);
        load_sub_terms<BN, GS, GB>(ts, sub_terms<BN, GB>(mb.terms, mb.n, mb.tn, groups), kt,
                                   full0 + 8 * s);
      }
      if (first) {
        // This thread's piece row (two 16-byte halves 128 bytes apart).
        const uint32_t dst = ts + (kGroups * BN * 4) + (BN + (pt & ~7)) * 32 + (pt & 7) * 16;
        sts_u4(dst, make_uint4(p[0], p[1], p[2], p[3]));
        sts_u4(dst + 128, make_uint4(p[4], p[5], p[6], p[7]));
        fence_proxy_async();  // the pieces written here are read by wgmma (async proxy)
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(full0 + 8 * s);
    }
  }
}

// SW: the transposed epilogue of one warp: its accumulators (weight rows n0 + gq and
// n0 + gq + 8, tokens m0 + 8 j + 2 tq + {0, 1}) staged 32 tokens at a time as 16 rows of
// tokens (ws_epilogue's staging), then lane l stores token m0 + 32 p + l's 16 outputs
// (two 16-byte stores where N allows). Rows past M and columns past N are never stored.
template <bool HAS_BIAS, typename T>
__device__ __forceinline__ void subswap_epilogue(const int (&d)[64],
                                                 const SubnormalEpilogue<HAS_BIAS>& epi, T* out,
                                                 int m0, int n0, int M, int N, int lane,
                                                 unsigned char* stage_buf) {
  constexpr int kRowBytes = 160;
  const int gq = lane >> 2, tq = lane & 3;
  const bool vec_ok = (N * (int)sizeof(T)) % 16 == 0;  // every row starts 16-byte aligned
  typename SubnormalEpilogue<HAS_BIAS>::Col col[16];
#pragma unroll
  for (int u = 0; u < 16; ++u) col[u] = epi.col(n0 + u, N);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * p + jj;
      store_pair(reinterpret_cast<int32_t*>(stage_buf + gq * kRowBytes) + 8 * jj + 2 * tq,
                 d[4 * j], d[4 * j + 1]);
      store_pair(reinterpret_cast<int32_t*>(stage_buf + (gq + 8) * kRowBytes) + 8 * jj + 2 * tq,
                 d[4 * j + 2], d[4 * j + 3]);
    }
    __syncwarp();
    const int m = m0 + 32 * p + lane;
    if (m < M) {
      const auto row = epi.row(m, M);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + 8 * h;
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
          v[u] = epi(*reinterpret_cast<const int*>(stage_buf + (8 * h + u) * kRowBytes + 4 * lane),
                     row, col[8 * h + u]);
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

// @@ body tma_subnormal
// The subnormal promotion (SUB) with code width WB: xq [..., K] uint8 codes a + 128 (the
// quantize's sums_u8 body), xs, xr as tma_grouped; wt: gemm_grouped.subnormal_terms.
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 1, WB, false, false, false, 0, true, GB, SW>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {nullptr}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_subnormal_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 1, WB, false, false, false, 0, true, GB, SW>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {bias}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_subnormal_group2
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 2, WB, false, false, false, 0, true, GB, SW>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_subnormal_group2_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 2, WB, false, false, false, 0, true, GB, SW>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_subnormal_group3
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 3, WB, false, false, false, 0, true, GB, SW>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});

// @@ body tma_subnormal_group3_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 3, WB, false, false, false, 0, true, GB, SW>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});
