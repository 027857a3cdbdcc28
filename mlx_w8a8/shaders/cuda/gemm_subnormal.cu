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

// One offset block of NT k-tiles (NT * kBK / GS groups) of a tile, pipelined. The block's
// bfloat16 offset wgmma (accumulating into f) and its first group's u8 x u8 wgmmas are
// issued together; wait_group 1 completes the offsets (group 0 still running). Then each
// group's successor is issued (into the other of two int32 sets) before the group is
// waited for (wait_group 1) and promoted, so each promotion runs under the next group's
// MMAs; the block's last group waits with wait_group 0. A group's S pairs are loaded into
// registers after the previous group's promotion (pinned there: loaded earlier, both
// groups' would be live), so their latency passes under that group's wait.
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
template <int BN, int STAGES, int GS, int GB, int NT>
__device__ __forceinline__ void subnormal_block(float (&f)[BN / 2], int it, unsigned char* smem,
                                                unsigned char* term_smem, uint32_t full0,
                                                uint32_t empty0, int wg, int lane,
                                                const uint32_t (&a)[4]) {
  constexpr int BM = 128;
  constexpr int kGroups = kBK / GS, kSteps = GS / 32, kNG = NT * kGroups;
  constexpr int kStageBytes = (BM + BN) * kBK;
  constexpr int kTermBytes = kGroups * BN * 2 + BN * 32;
  const int tq = lane & 3;
  auto stage_of = [&](int u) { return (opaque(it) + u / kGroups) % STAGES; };
  auto issue = [&](int (&d)[BN / 2], int u) {
    const int pos = opaque(it) + u / kGroups, s = pos % STAGES, j = u % kGroups;
    if (j == 0 && u != 0) mbar_wait(full0 + 8 * s, (pos / STAGES) & 1);
    const uint32_t sa = smem_addr(smem + s * kStageBytes) + wg * 64 * kBK;
    const uint32_t sb = smem_addr(smem + s * kStageBytes + BM * kBK);
    wgmma_fence();  // this set's promotion two groups back: before the writes
    wgmma_uu_step<BN>(d, sa, sb, j * kSteps, 0);
#pragma unroll
    for (int ks = 1; ks < kSteps; ++ks) wgmma_uu_step<BN>(d, sa, sb, j * kSteps + ks, 1);
    wgmma_commit();
  };
  uint32_t sp[BN / 8];  // the S pairs of the group to be promoted next
  auto load_s = [&](int u) {
    subnormal_s<BN>(sp, smem_addr(term_smem + stage_of(u) * kTermBytes), u % kGroups, tq);
  };
  auto promote = [&](int (&d)[BN / 2], int u) {
    const int s = stage_of(u), j = u % kGroups;
    pin_set<BN>(d);
    subnormal_promote<BN>(f, d, sp);
    if (j == kGroups - 1) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
  };
  {
    const int s = it % STAGES;
    mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
    wgmma_fence();  // f and a were written by this thread: before the wgmma reads them
    wgmma_rs<true, BN>(f, a, wgmma_desc_plain(smem_addr(term_smem + s * kTermBytes) +
                                              kGroups * BN * 2), 1);
    wgmma_commit();
  }
  int d0[BN / 2], d1[BN / 2];
  issue(d0, 0);
  load_s(0);
  wgmma_wait<1>();  // the offsets in f complete, group 0 in flight
  pin_set<BN>(f);
#pragma unroll
  for (int u = 0; u < kNG; ++u) {  // group u is in set u % 2, in flight
    if (u + 1 < kNG) {
      if (u % 2 == 0) issue(d1, u + 1);
      else issue(d0, u + 1);
      wgmma_wait<1>();  // group u complete, u + 1 in flight
    } else {
      wgmma_wait<0>();  // the block's last group complete
    }
    if (u % 2 == 0) promote(d0, u);
    else promote(d1, u);
    if (u + 1 < kNG) {
      pin_set<BN>(f);  // the promotion's fmas before the next group's S loads
      load_s(u + 1);
    }
  }
}

// The shorter last block of `rest` (1 .. NT) k-tiles, its count as a template argument
// (each an unrolled block).
template <int BN, int STAGES, int GS, int GB, int NT>
__device__ __forceinline__ void subnormal_rest(int rest, float (&f)[BN / 2], int it,
                                               unsigned char* smem, unsigned char* term_smem,
                                               uint32_t full0, uint32_t empty0, int wg, int lane,
                                               const uint32_t (&a)[4]) {
  if constexpr (NT >= 1) {
    if (rest == NT)
      subnormal_block<BN, STAGES, GS, GB, NT>(f, it, smem, term_smem, full0, empty0, wg, lane, a);
    else
      subnormal_rest<BN, STAGES, GS, GB, NT - 1>(rest, f, it, smem, term_smem, full0, empty0, wg,
                                                 lane, a);
  }
}

// SUB: a tile's mainloop (declared in gemm_grouped_ws.cu): its offset blocks of GB groups
// (kBlockTiles k-tiles) in order, the last one shorter where GB groups do not divide the
// k-tiles. This thread's A columns 2 tq, 2 tq + 1 and 2 tq + 8, 2 tq + 9 are the block's
// groups tq and tq + 4 where they are piece columns (piece_pair); their R (rows lo, hi) are
// loaded one block ahead.
template <int BN, int STAGES, int GS, int GB>
__device__ __forceinline__ void subnormal_tile(float (&f)[BN / 2], int& it, unsigned char* smem,
                                               unsigned char* term_smem, uint32_t full0,
                                               uint32_t empty0, int wg, int lane,
                                               const int32_t* r_lo, const int32_t* r_hi,
                                               int groups, int ktiles) {
  constexpr int kGroups = kBK / GS, kBlockTiles = GB / kGroups;
  static_assert(kBlockTiles >= 1 && kBlockTiles <= 6, "an offset block of 1 to 6 k-tiles");
  const int tq = lane & 3;
  const int c0 = 2 * tq, c1 = 2 * tq + 8;
  int pr[4];
  auto block_sums = [&](int g0) {
    const int g_a = g0 + c0 / 2, g_b = g0 + c1 / 2;
    const bool ok_a = c0 < 2 * GB && g_a < groups, ok_b = c1 < 2 * GB && g_b < groups;
    pr[0] = ok_a ? r_lo[g_a] : 0;
    pr[1] = ok_a ? r_hi[g_a] : 0;
    pr[2] = ok_b ? r_lo[g_b] : 0;
    pr[3] = ok_b ? r_hi[g_b] : 0;
  };
  auto block_a = [&](uint32_t (&a)[4]) {  // the loaded R as the block's A registers
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
    subnormal_block<BN, STAGES, GS, GB, kBlockTiles>(f, it, smem, term_smem, full0, empty0, wg,
                                                     lane, a);
  }
  const int rest = ktiles - kb;  // 0 .. kBlockTiles - 1 k-tiles in a shorter last block
  if (rest > 0) {
    uint32_t a[4];
    block_a(a);
    subnormal_rest<BN, STAGES, GS, GB, kBlockTiles - 1>(rest, f, it, smem, term_smem, full0,
                                                        empty0, wg, lane, a);
    it += rest;
  }
}

}  // namespace w8a8

// @@ body tma_subnormal
// The subnormal promotion (SUB) with code width WB: xq [..., K] uint8 codes a + 128 (the
// quantize's sums_u8 body), xs, xr as tma_grouped; wt: gemm_grouped.subnormal_terms.
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 1, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {nullptr}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_subnormal_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 1, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {bias}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_subnormal_group2
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 2, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_subnormal_group2_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 2, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_subnormal_group3
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 3, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});

// @@ body tma_subnormal_group3_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 3, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});
