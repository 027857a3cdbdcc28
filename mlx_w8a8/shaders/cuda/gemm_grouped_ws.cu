// Group-wise W8A8 GEMM on Hopper: the per-channel TMA GEMM's mainloop (gemm_ws.cu: a TMA
// producer, two consumer warpgroups issuing wgmma, a persistent grid) with each weight
// group's exact int32 dot product promoted into float32 accumulators (sm_90a only).
//
// File layout: as gemm.cu. It shares ws.cuh with gemm_ws.cu (mbarriers, store8, the
// per-warp staged epilogue ws_epilogue, the launch-bounds redefinition of __global__), the
// tensor maps of tma.cuh and the wgmma of wgmma.cuh, all put before this header by the
// launcher:
// @@ requires ws.cuh
//
// The math (docs/numerics.md, grouped W8A8 linear): with int8 activation codes a_mk
// (row scale t_m), the stored unsigned weight codes q_nk in [0, 255], the group's scale
// s_ng and offset o_ng = b_ng + 128 s_ng (float32) and the quantize's group code sums
// R_mg = sum_{k in g} a_mk:
//   U_mng = sum_{k in g} a_mk q_nk     (int32 from s8 x u8 wgmma, exact: |U| <= 127 * 255
//                                       * 128 < 2^22)
//   P_mng = U_mng - 128 R_mg           (int32, exact: the signed-code sum of gemm.cu)
//   f_mn  = sum_g ( s_ng P_mng + o_ng R_mg )     (float32, groups in K order)
//   y_mn  = t_m f_mn (+ bias_n)                  (float32, then the output type)
// the terms of gemm.cu's grouped kernel, summed as f = fma(o, R, fma(s, P, f)) group by
// group (within the 2G + 4 roundings of docs/numerics.md: each of the 2G terms is
// rounded at most once by its FMA and then by the later FMAs of the chain). P (not U
// with the stored bias b_ng) is what is scaled: s U and b R nearly cancel for the usual
// b ~ -128 s, and their roundings would then be relative to terms ~128x larger than
// the result; P and o keep the terms at the product's own magnitude.
//
// Tile K. A stage holds kBK = 128 bytes of K (the 128-byte swizzle row of wgmma.cuh;
// one TMA box of the per-channel kernel), so a k-tile holds kBK / GS = 4, 2 or 1 whole
// groups (GS = 32, 64, 128) and each group is GS / 32 consecutive k32 wgmma steps: a
// group never straddles two stages, so its promotion reads one stage's terms, and a
// stage is released once its groups are promoted. The launcher requires K % 128 == 0
// (every k-tile whole: no tail group, no zero-filled K); K % GS == 0 follows.
//
// Block: 256 + 32 PW threads (PW = 4: the producer warpgroup gives its registers to the
// consumers, setmaxnreg 40 / 232, warps 9-11 exit; PW = 1: no reallocation, ptxas's cap
// of 168 under launch_bounds(384, 1)). Tiles are 128 x BN, BN = 128, 64 or 32: a
// consumer thread holds an int32 accumulator set and a float32 one of BN / 2 values
// each (128 registers at BN = 128, hence PW = 4 there).
//  * Producer (lane 0 of warp 8): per k-tile it waits for the ring stage to be free
//    (empty[s]), arms full[s] with the stage's bytes (A's box rows + BN) * 128 + the
//    terms' kGroups * BN * 8, and issues three loads completing on full[s]: A's box and
//    B's box (tma_load_2d, as gemm_ws.cu) and the tile's terms of the k-tile's groups
//    (one 1-D bulk copy: the launcher's terms array is laid out [tiles_n][G][BN][2] of
//    float32 (s, o) pairs, so a k-tile's groups for one tile column are contiguous).
//    It never waits for the MMAs: it runs up to STAGES k-tiles ahead, across tiles.
//  * Consumers: warpgroup wg computes rows [64 wg, 64 wg + 64) of every tile of the
//    block (cooperative, as gemm_ws.cu without PP). For each group of a tile, in K
//    order: wgmma.fence, the group's GS / 32 wgmmas into the int32 set (the first with
//    scale-d 0: the set is overwritten, no zeroing), one commit, wgmma.wait_group 0, an
//    empty asm that "modifies" each register of the set (so the compiler cannot move a
//    read above the wait), then the promotion f += s P + o R. The next group's
//    wgmma.fence orders the promotion's reads of the set before its wgmmas overwrite it.
//    DeepGEMM's promotion order: the tensor cores idle during a warpgroup's promotion
//    while the other warpgroup's MMAs may run (PIPE below overlaps its own).
//  * Pipelined promotion (PIPE = 2 or 4, template argument of the tma_groupwise bodies;
//    0: off). A tile's groups run in runs of PIPE (the launcher's invariant: PIPE
//    divides K / GS). Within a run, group g + u's wgmmas go into int32 set u % 2 (two
//    sets: BN / 2 more registers), the next group's are issued and committed before
//    wgmma.wait_group 1, and group g + u is promoted while they run; the run's last
//    group waits with wait_group 0. The arithmetic is unchanged (outputs equal the
//    plain tile's bit for bit); PIPE - 1 of every PIPE promotions overlap the
//    warpgroup's own MMAs. Two hazards of ptxas shape it: a wgmma whose accumulators
//    are still in flight across the loop's back edge while later code reads them (one
//    run per iteration, both sets ending it with wait_group 0, was the fix; an in-flight
//    set across the back edge made ptxas serialize every wgmma, C7514), and a set whose
//    stale values are live into its next first wgmma (NVVM then copies them into the
//    instruction's registers and ptxas injects a warpgroup wait, C7517): the sets are
//    declared per run and each group's first wgmma is wgmma_first (write-only d).
//    PIPE = 4 at BN = 128 spills (three sets of 64 registers), so the launcher allows
//    it only at BN <= 64.
//  * MMA order (ORD, template argument of the tma_groupwise bodies): left alone, the
//    two warpgroups issue a group's MMAs together, the tensor cores run both sets
//    interleaved, both complete at once and both promote while the tensor cores idle:
//    a group then costs its MMAs plus its promotion. With ORD the warpgroups take
//    turns (named barriers 1 and 2, 256 threads): a warpgroup issues a group's MMAs
//    only once the other's previous MMAs completed, and signals its own completion
//    before promoting, so each warpgroup's promotion runs under the other's MMAs.
//    The arithmetic is unchanged: outputs equal the unordered kernel's bit for bit.
//    Warpgroup 0's first group waits for nothing; warpgroup 1's last signal is not
//    made (nothing would wait for it), so both barriers end balanced.
//  * Rows past M (LIVE, template argument of the tma_groupwise bodies): a consumer warp
//    owns 16 rows of each tile, and in a tile's last row block of a short M (decode
//    batches: M <= 64 leaves warpgroup 1's four warps and M <= 16 seven of the eight
//    without a row) a warp whose rows all lie past M would promote and stage values
//    never stored: the promotion, a few CUDA-core instructions per accumulator and
//    group, is what bounds this kernel. With LIVE such a warp (row_base >= M,
//    warp-uniform) skips its promotions and its epilogue; it still issues its share of
//    the warpgroup's wgmmas (warpgroup-collective), waits for them, keeps the MMA
//    order's barriers and releases every stage as the others do. Stored outputs are
//    unchanged bit for bit (the rows it skips are never stored).
//  * Stage release: stage s holds k-tile kt's A, B and terms. After promoting kt's last
//    group, each consumer warp arrives once on empty[s] (count 8): its wgmmas on the
//    stage are complete (wait_group 0), and __syncwarp orders its lanes' shared-memory
//    reads of the terms before lane 0's arrive (a release at CTA scope).
//  * Terms and R: s and o reach a consumer from shared memory (the stage's slab, one
//    16-byte load per 2 columns: (s_n, o_n, s_n+1, o_n+1); the 8 lanes of a quad row
//    read the same 16 bytes, a broadcast), R from global memory (2 loads per group, rows
//    clamped to M - 1: rows past M are computed, never stored), loaded one group ahead
//    so their latency hides behind the previous group's MMAs and promotion. The group
//    loop is not unrolled (it indexes addresses only): unrolled, ptxas hoisted several
//    groups' terms loads and the 128 x 128 body spilled.
//  * Epilogue: ws_epilogue (gemm_ws.cu) on the float32 accumulators' bits with
//    GroupedEpilogue: y = t_m f (+ bias_n), rows past M and columns past N never stored.
//
// 4-bit weights (WB = 4: MLX's affine 4-bit format as stored, bodies tma_groupwise*): the
// same mainloop on u8 codes 0..15 expanded on chip. Per k-tile, the tile's BN packed rows
// (64 bytes each: K / 2 bytes a row, two codes a byte, low nibble first: weight.py) arrive
// by one TMA box into the stage's packed buffer, unswizzled (the weight's map is made from
// its map array's second prototype: tma.weight_maps), completing on packed[s];
// rows past N read as zeros. The producer warpgroup's 128 threads (all four warps stay,
// with kWsProducerRegs registers each) then expand them: thread t takes row t % BN and
// BN / 32 of the row's 16-byte packed chunks, each becoming two 16-byte code chunks
// written to B's place of the stage in the 128-byte swizzled layout TMA would have written
// (common.cuh swz); after a proxy fence each warp arrives on full[s] (count 1 + 4: the
// A/terms arm and the four warps). Every producer thread waits on empty[s] itself before
// writing B's place of stage s. The consumers are unchanged but for the shift: P = U (no
// 128 offset: the codes are unsigned as stored, |U| <= 127 * 15 * 128 < 2^18) and the
// terms' second value is the stored bias b (docs/numerics.md, W4A8 linear).
//
// Activation groups (AG, bodies tma_groupwise* with AG = true; either code width): one
// activation scale per row and group, t_mg ([M, G] f32 in row_scale, the quantize's
// `groups` body), loaded one group ahead as R is; the promotion becomes
// f = fma(t, fma(s, P, o R), f) and the epilogue's row scale 1 (docs/numerics.md,
// activation groups). The bodies tma_grouped* (WB = 8, AG = false) are the ones the
// shipped table measured; tma_groupwise* take WB and AG as template arguments.
//
// The subnormal promotion (SUB, template argument of gemm_grouped_ws; its bodies are
// gemm_subnormal.cu's tma_subnormal*, either code width; docs/numerics.md, the subnormal
// promotion). The activation codes arrive as u = a + 128 (uint8, the quantize's sums_u8
// body) and the wgmmas are u8 x u8, so a group's int32 sum U = sum u q is >= 0 and below
// 2^23 (255 * 255 * 128): its bits read as a float32 are the subnormal U 2^-149, and the
// promotion is one fma per accumulator, f = fma(U as float, S_n, f) with S_n = s 2^E_n
// (E_n per weight row, gemm_grouped.subnormal_terms; stored as bfloat16, which holds it
// exactly: s is bfloat16 and S_n a normal float32), the product exact inside the fma
// (fma.rn.f32 without .ftz: a flush-to-zero build would zero U). The rest of the group
// term, b_g A_g - 128 s_g Q_g (A_g the quantize's sum of a, Q_g the weight's code sum),
// is not promoted per group: per offset block of GB groups (whole k-tiles; GB = 6 at
// group size 64, else 4) one bfloat16 wgmma m64nBNk16 adds it into f, A from registers
// (each row's A_g as the exact pair (A_g >> 7, A_g & 127), and three columns of 1)
// against the block's pieces in shared memory (columns 128 b', b' per group,
// b' = b 2^(E_n - 149), exact for bfloat16 biases; the block's constant in three
// bfloat16 pieces; BN x 16, unswizzled), which the producer copies with the block's first
// k-tile after the k-tile's S rows. The epilogue takes t_m and the column scale
// 2^(149 - E_n) off. The consumers' mainloop is gemm_subnormal.cu's subnormal_tile: per
// block the offset wgmma with the first group's u8 x u8 wgmmas, then each group's
// promotion (one fma per accumulator where the other forms need four CUDA-core
// instructions) under the next group's wgmmas, in two int32 sets, its S loaded (as
// bfloat16 pairs: half the shared-memory wavefronts of float32) during the group before.
//
// Synchronization as gemm_ws.cu's TMA producer: full[s] count 1 (the expect_tx arrive;
// the phase completes when the three loads' bytes landed), phase r of full[s] is k-tile
// r * STAGES + s; empty[s] count 8 (the consumer warps). TMA and bulk copies write shared
// memory through the async proxy and complete on full[s]: no proxy fence before wgmma
// or the terms' loads. The consumers never use a block-wide barrier after the start.
//
// Maps (tma.cuh): A's map goes into the row sums' array (xr, the quantize's per-group
// sums followed by a 256-byte map area: quantize.grouped_sums_shape), at the first
// 128-byte aligned address after the M * G sums; each weight's into its map array
// (tma.weight_maps, whose first 128 bytes are A's prototype). Every launch on
// one xr writes the same bytes there (one address, one M, one K), every launch on one
// weight the same bytes into its map array.
//
// Sibling launches (bodies tma_grouped_group2/3): 2 or 3 weights fed the same x (q/k/v,
// gate/up) in one persistent grid, the launch's tile columns the members' one after
// another (GroupedMembers, as gemm_ws.cu's Members): the producer loads the tile
// member's B box and terms, the consumers store into its output. A member's outputs
// equal its own launch's bit for bit: a group's float32 chain does not depend on the
// tile.
//
// Invariants the launcher guarantees (kernels/cuda/gemm_grouped.py _grouped_tma_checked,
// gemm_grouped_tma_spec): K % 128 == 0, 0 < K < 2^17, GS in {32, 64, 128}, with PIPE
// (K / GS) % PIPE == 0 and BN <= 64 where PIPE == 4; blocks of
// exactly 256 + 32 PW threads, at most one per SM (PW = 4 where WB = 4); the tile's code
// width that of the weight (GroupedTmaConfig.bits); dynamic shared memory
// GroupedTmaConfig.shared_memory(GS); with AG, xs holds [M, K / GS] scales.

namespace w8a8 {

// 1-D bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global
// memory to shared memory at `dst`, completing its bytes on the mbarrier `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}

// 16 bytes of shared memory at `addr` (16-byte aligned). A volatile load, kept in
// program order: the promotion's BN / 8 loads are not all hoisted ahead of its
// arithmetic (BN / 2 more live registers next to the accumulators).
__device__ __forceinline__ float4 lds_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

// 8 bytes of shared memory at `addr` (8-byte aligned), volatile as lds_f4.
__device__ __forceinline__ float2 lds_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.volatile.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// 4 bytes of shared memory at `addr` (4-byte aligned), volatile as lds_f4.
__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.volatile.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// 16 bytes of shared memory at `addr` (16-byte aligned): a load, and a store.
__device__ __forceinline__ uint4 lds_u4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts_u4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Eight 4-bit codes (one packed word, code j in bits 4j .. 4j + 3) as eight bytes in
// code order: bytes (q0, q1, q2, q3) and (q4, q5, q6, q7).
__device__ __forceinline__ uint2 expand4(uint32_t w) {
  const uint32_t lo = w & 0x0F0F0F0Fu;         // q0, q2, q4, q6
  const uint32_t hi = (w >> 4) & 0x0F0F0F0Fu;  // q1, q3, q5, q7
  return make_uint2(__byte_perm(lo, hi, 0x5140), __byte_perm(lo, hi, 0x7362));
}

// f += s P + o R for one group's int32 set `d` (AG: f += t (s P + o R)), the stage's
// terms at shared address `ts` (group j of the k-tile: its (s, o) for the tile's BN
// columns from ts + j BN 8), its rows' R (and t): the
// promotion of the consumers' paragraph, identical wherever a group is promoted. The
// caller has completed the set's wgmmas (wgmma.wait_group) and pinned its registers.
// P = U - 128 R is exact in int32 and |P| <= 127 * 128 * 128 = 2^21, so float(P) is
// (U - 128 R + 0x4B400000) read as a float minus 1.5 * 2^23, exactly: an integer and a
// float add instead of an I2F (a quarter-rate conversion on sm_90, BN / 2 per thread and
// group). 4-bit codes are not offset (P = U, the terms hold the stored bias b).
template <int BN, bool W4, bool AG>
__device__ __forceinline__ void grouped_promote(float (&f)[BN / 2], const int (&d)[BN / 2],
                                                uint32_t ts, int j, int tq, int r_lo, int r_hi,
                                                float t_lo, float t_hi) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23, bits 0x4B400000
  const float rlo = static_cast<float>(r_lo), rhi = static_cast<float>(r_hi);
  constexpr int kShift = W4 ? 0 : 128;
  const int clo = 0x4B400000 - kShift * r_lo, chi = 0x4B400000 - kShift * r_hi;
#pragma unroll
  for (int c = 0; c < BN / 8; ++c) {
    const float4 t = lds_f4(ts + (j * BN + 8 * c + 2 * tq) * 8);  // s0, o0, s1, o1
    const float p0 = __fsub_rn(__int_as_float(d[4 * c] + clo), kRound);
    const float p1 = __fsub_rn(__int_as_float(d[4 * c + 1] + clo), kRound);
    const float p2 = __fsub_rn(__int_as_float(d[4 * c + 2] + chi), kRound);
    const float p3 = __fsub_rn(__int_as_float(d[4 * c + 3] + chi), kRound);
    if constexpr (AG) {
      // f += t (s P + o R) as f = fma(t, fma(s, P, o R), f): one rounding for o R,
      // one for the group's term, one for the chain (docs/numerics.md).
      f[4 * c] = __fmaf_rn(t_lo, __fmaf_rn(t.x, p0, __fmul_rn(t.y, rlo)), f[4 * c]);
      f[4 * c + 1] = __fmaf_rn(t_lo, __fmaf_rn(t.z, p1, __fmul_rn(t.w, rlo)), f[4 * c + 1]);
      f[4 * c + 2] = __fmaf_rn(t_hi, __fmaf_rn(t.x, p2, __fmul_rn(t.y, rhi)), f[4 * c + 2]);
      f[4 * c + 3] = __fmaf_rn(t_hi, __fmaf_rn(t.z, p3, __fmul_rn(t.w, rhi)), f[4 * c + 3]);
    } else {
      f[4 * c] = __fmaf_rn(t.y, rlo, __fmaf_rn(t.x, p0, f[4 * c]));
      f[4 * c + 1] = __fmaf_rn(t.w, rlo, __fmaf_rn(t.z, p1, f[4 * c + 1]));
      f[4 * c + 2] = __fmaf_rn(t.y, rhi, __fmaf_rn(t.x, p2, f[4 * c + 2]));
      f[4 * c + 3] = __fmaf_rn(t.w, rhi, __fmaf_rn(t.z, p3, f[4 * c + 3]));
    }
  }
}


// wgmma_rs.cuh's register-A wgmma and unswizzled descriptor, declared here and defined
// there: gemm_subnormal.cu (the SUB bodies) requires that header after this file's, so
// the bodies of this file compile without it (its text in their translation units
// changed ptxas's register numbering of every one of them: bench/sass_diff.py).
template <bool BF16, int BN>
__device__ __forceinline__ void wgmma_rs(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t db,
                                         int accumulate);
__device__ __forceinline__ uint64_t wgmma_desc_plain(uint32_t smem_byte_addr);

// fma.rn.f32 without .ftz: a subnormal operand is used as it is, whatever the
// compiler's flush-to-zero setting.
__device__ __forceinline__ float fma_keep_subnormal(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;\n" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

// SUB: group j's S for this thread's columns 8 c + 2 tq, + 1 (c < BN / 8) from the stage's
// terms at ts (S rows [kGroups][BN] bfloat16): BN / 8 pairs, one 4-byte load each (a
// warp's load is one wavefront, where the float32 pair took two).
template <int BN>
__device__ __forceinline__ void subnormal_s(uint32_t (&p)[BN / 8], uint32_t ts, int j, int tq) {
#pragma unroll
  for (int c = 0; c < BN / 8; ++c) p[c] = lds_u32(ts + (j * BN + 8 * c + 2 * tq) * 2);
}

// SUB: f += S U for one group's int32 set d (U >= 0 and < 2^23, so its bits read as a
// float32 are the subnormal U 2^-149), S_n = s_n 2^E_n the group's bfloat16 pairs p
// (subnormal_s; S_n in the low half, S_n+1 in the high half, each a float32's top 16
// bits): one fma per accumulator, the product exact inside it.
template <int BN>
__device__ __forceinline__ void subnormal_promote(float (&f)[BN / 2], const int (&d)[BN / 2],
                                                  const uint32_t (&p)[BN / 8]) {
#pragma unroll
  for (int c = 0; c < BN / 8; ++c) {
    const float s0 = __uint_as_float(p[c] << 16), s1 = __uint_as_float(p[c] & 0xFFFF0000u);
    f[4 * c] = fma_keep_subnormal(__int_as_float(d[4 * c]), s0, f[4 * c]);
    f[4 * c + 1] = fma_keep_subnormal(__int_as_float(d[4 * c + 1]), s1, f[4 * c + 1]);
    f[4 * c + 2] = fma_keep_subnormal(__int_as_float(d[4 * c + 2]), s0, f[4 * c + 2]);
    f[4 * c + 3] = fma_keep_subnormal(__int_as_float(d[4 * c + 3]), s1, f[4 * c + 3]);
  }
}

// SUB: one A register of an offset block's k16 step for one row: the bfloat16 pair of
// piece columns k, k + 1 (k even). Columns 2 i, 2 i + 1 (i < GB) hold the block's group
// i code sum R = 128 (R >> 7) + (R & 127) as (R >> 7, R & 127), r the row's R of that
// group (0 past the last group); columns 2 GB .. 2 GB + 2 are 1 (the block's constant in
// three pieces), the rest 0. Every value is an integer of magnitude <= 128: exact in
// bfloat16, whose bits are the float's top half.
template <int GB>
__device__ __forceinline__ uint32_t piece_pair(int k, int r) {
  float lo = 0.f, hi = 0.f;  // columns k and k + 1
  if (k < 2 * GB) {
    lo = static_cast<float>(r >> 7);
    hi = static_cast<float>(r & 127);
  } else if (k == 2 * GB) {
    lo = hi = 1.f;
  } else if (k == 2 * GB + 2) {
    lo = 1.f;
  }
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xFFFF0000u);
}

// SUB's int8 wgmma: unsigned activation codes (a + 128) times the unsigned weight codes,
// so every group's int32 sum is >= 0; otherwise wgmma_step.
template <int BN>
__device__ __forceinline__ void wgmma_uu_step(int (&d)[BN / 2], uint32_t sa, uint32_t sb, int step,
                                              int accumulate) {
  static_assert(BN == 128 || BN == 64 || BN == 32, "tile widths in use");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const uint64_t da = wgmma_desc(sa + step * 32), db = wgmma_desc(sb + step * 32);
  if constexpr (BN == 128) W8A8_WGMMA("128", "u8.u8", W8A8_S64, W8A8_O64(0), "64", "65", "66");
  else if constexpr (BN == 64) W8A8_WGMMA("64", "u8.u8", W8A8_S32, W8A8_O32(0), "32", "33", "34");
  else W8A8_WGMMA("32", "u8.u8", W8A8_S16, W8A8_O16(0), "16", "17", "18");
#else
  __trap();
#endif
}

// SUB: the terms stage s of k-tile kt carries for a tile column, in bytes: the k-tile's
// kGroups rows of S, and at an offset block's first k-tile the block's pieces (BN x 16
// bfloat16, wgmma_desc_plain's layout) after them.
template <int BN, int GS, int GB>
__device__ __forceinline__ uint32_t sub_term_bytes(int kt) {
  constexpr int kGroups = kBK / GS, kBlockTiles = GB / kGroups;
  return kGroups * BN * 2 + (kt % kBlockTiles == 0 ? BN * 32 : 0);
}

// SUB: one tile column's terms in the member's terms array (gemm_grouped.subnormal_terms,
// whose sections are S [tiles][G][BN] bfloat16, the pieces [tiles][blocks][BN * 16] bfloat16 and
// the column scales [tiles][BN], tiles = ceil(n / BN)): where its S rows start and its
// first block's pieces.
struct SubTerms {
  const float* s;
  const float* pieces;
};
template <int BN, int GB>
__device__ __forceinline__ SubTerms sub_terms(const float* terms, int n, int tn, int groups) {
  const int tiles = (n + BN - 1) / BN, blocks = (groups + GB - 1) / GB;
  return {terms + static_cast<size_t>(tn) * groups * BN / 2,
          terms + static_cast<size_t>(tiles) * groups * BN / 2 +
              static_cast<size_t>(tn) * blocks * 8 * BN};
}

// SUB: issues the copies of sub_term_bytes(kt) into dst, completing on bar.
template <int BN, int GS, int GB>
__device__ __forceinline__ void load_sub_terms(uint32_t dst, SubTerms st, int kt, uint32_t bar) {
  constexpr int kGroups = kBK / GS, kBlockTiles = GB / kGroups;
  bulk_load(dst, st.s + static_cast<size_t>(kt) * kGroups * BN / 2, kGroups * BN * 2, bar);
  if (kt % kBlockTiles == 0)
    bulk_load(dst + kGroups * BN * 2, st.pieces + static_cast<size_t>(kt / kBlockTiles) * BN * 8,
              BN * 32, bar);
}

// SUB: a tile's mainloop (gemm_subnormal.cu, defined there for the reason wgmma_rs is):
// f += every group's and offset block's terms of rows [64 wg, 64 wg + 64); `it` advances
// by the tile's k-tiles.
template <int BN, int STAGES, int GS, int GB>
__device__ __forceinline__ void subnormal_tile(float (&f)[BN / 2], int& it, unsigned char* smem,
                                               unsigned char* term_smem, uint32_t full0,
                                               uint32_t empty0, int wg, int lane,
                                               const int32_t* r_lo, const int32_t* r_hi,
                                               int groups, int ktiles);

// Pin: the compiler may not move reads of `d` above the wgmma.wait_group just before.
template <int BN>
__device__ __forceinline__ void pin_set(int (&d)[BN / 2]) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

template <int BN>
__device__ __forceinline__ void pin_set(float (&f)[BN / 2]) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+f"(f[i])::"memory");
}

// Named barriers 1 and 2 (0 is __syncthreads'), for the consumers' MMA order (ORD):
// `count` threads in all arrive, those of bar_sync waiting for the rest. Warp-uniform
// calls only; `count` a multiple of 32.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The grouped epilogue for ws_epilogue: `acc` holds a float32 accumulator's bits.
// Rows past M get scale 0 and columns past N bias 0 (never stored).
template <bool HAS_BIAS, bool AG = false>
struct GroupedEpilogue {
  using Value = float;
  struct Row {
    float scale;
  };
  struct Col {
    float bias;
  };
  const float* row_scale;
  const float* bias;

  __device__ __forceinline__ Row row(int m, int M) const {
    if constexpr (AG) return Row{m < M ? 1.f : 0.f};  // t_mg is in the promotion
    return Row{m < M ? row_scale[m] : 0.f};
  }
  __device__ __forceinline__ Col col(int n, int N) const {
    Col c{0.f};
    if constexpr (HAS_BIAS) {
      if (n < N) c.bias = bias[n];
    }
    return c;
  }
  __device__ __forceinline__ float operator()(int acc, Row r, Col c) const {
    float y = __int_as_float(acc) * r.scale;
    if constexpr (HAS_BIAS) y += c.bias;
    return y;
  }
};

// The subnormal promotion's epilogue (SUB): as GroupedEpilogue, each column's
// accumulators carrying the factor 2^(E_n - 149), taken off by its column scale
// 2^(149 - E_n) (col_scale: the terms' last section, zero past N), exactly: a power of two.
template <bool HAS_BIAS>
struct SubnormalEpilogue {
  using Value = float;
  struct Row {
    float scale;
  };
  struct Col {
    float bias, scale;
  };
  const float* row_scale;
  const float* bias;
  const float* col_scale;

  __device__ __forceinline__ Row row(int m, int M) const {
    return Row{m < M ? row_scale[m] : 0.f};
  }
  __device__ __forceinline__ Col col(int n, int N) const {
    Col c{0.f, col_scale[n]};
    if constexpr (HAS_BIAS) {
      if (n < N) c.bias = bias[n];
    }
    return c;
  }
  __device__ __forceinline__ float operator()(int acc, Row r, Col c) const {
    float y = __int_as_float(acc) * r.scale * c.scale;
    if constexpr (HAS_BIAS) y += c.bias;
    return y;
  }
};

// One tile column's member: its pointers, N, the tile column within the member and the
// member's index g (its B map is map_b[g]).
template <typename T>
struct GroupedMember {
  const int8_t* b;
  const float* terms;
  const float* bias;
  T* out;
  int n, tn, g;
};

// The weights one launch multiplies the activation by (ws.cuh member_tiles), as gemm_ws.cu's
// Members: NM members (1, or 2-3 sibling projections fed the same x: q/k/v, gate/up),
// member g b[g] [n[g], K] uint8 codes with its terms (gemm_grouped.grouped_terms:
// [ceil(n[g] / BN)] [G][BN][2] f32 (s, o), zero past n[g]), bias [n[g]] f32 or null, output
// out[g] [..., n[g]] and map array wmap[g] (tma.weight_maps, uint8 [512]).
template <typename T, int NM>
struct GroupedMembers {
  const int8_t* b[NM];
  const float* terms[NM];
  const float* bias[NM];
  T* out[NM];
  int n[NM];
  const uint8_t* wmap[NM];
};

// The member of the launch's tile column tn (ws.cuh member_tiles), as gemm_ws.cu's
// member_of.
template <int BN, typename T, int NM>
__device__ __forceinline__ GroupedMember<T> member_of(const GroupedMembers<T, NM>& ms, int tn) {
  GroupedMember<T> m{ms.b[0], ms.terms[0], ms.bias[0], ms.out[0], ms.n[0], tn, 0};
  int first = 0;  // the first tile column of member g
#pragma unroll
  for (int g = 1; g < NM; ++g) {
    first += (ms.n[g - 1] + BN - 1) / BN;
    if (tn >= first)
      m = GroupedMember<T>{ms.b[g], ms.terms[g], ms.bias[g], ms.out[g], ms.n[g], tn - first, g};
  }
  return m;
}

// The producer warpgroup of the 4-bit GEMM (gemm_grouped_ws with WB = 4, the "4-bit
// weights" paragraph above): per k-tile, lane 0 of warp 8 arms full[s] with A's box and
// the terms and loads them, and arms packed[s] with the packed box and loads it; then all
// 128 threads expand the packed rows into B's place of the stage and arrive on full[s],
// one arrive per warp.
template <int BN, int STAGES, int GS, bool SUB, int GB, typename T, int NM>
__device__ __forceinline__ void grouped4_produce(const int8_t* a, int M, int K, const int32_t* sums,
                                                 const GroupedMembers<T, NM>& ms,
                                                 unsigned char* smem, unsigned char* term_smem,
                                                 unsigned char* pack_smem, uint64_t* bars) {
  constexpr int BM = 128;
  constexpr int kGroups = kBK / GS;
  constexpr int kStageBytes = (BM + BN) * kBK;
  constexpr int kTermBytes = SUB ? kGroups * BN * 2 + BN * 32 : kGroups * BN * 8;
  constexpr int kPackRow = kBK / 2;  // packed bytes of a row per k-tile (the map's box)
  constexpr int kPackBytes = BN * kPackRow;
  constexpr int kChunks = BN / 32;  // 16-byte packed chunks per thread and k-tile
  const uint32_t full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES),
                 packed0 = smem_addr(bars + 2 * STAGES);
  const int pt = threadIdx.x - 32 * kWsProducerWarp;  // 0 .. 127
  const int lane = pt & 31;
  const bool loader = pt == 0;  // lane 0 of warp 8 issues every load
  const int tiles_m = (M + BM - 1) / BM, tiles_n = member_tiles<BN>(ms);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = K / kBK;
  const int groups = K / GS;
  void* map_a = reinterpret_cast<void*>(tma_aligned(sums + static_cast<size_t>(M) * groups));
  const void* map_b[NM];
  if (pt < 32) {  // warp 8 makes the maps (warp-collective), as the 8-bit producer
    unsigned char* stage = reinterpret_cast<unsigned char*>(tma_aligned(bars + 3 * STAGES));
    tma_make_maps(map_a, a, M, ms.b, ms.wmap, stage, map_b);
    if (loader) tma_acquire_maps(map_a, map_b);
  }
  const uint32_t stage_tx = tma_box_rows_a(M) * kBK + kTermBytes;
  // This thread's row of the tile and first packed chunk; chunks are visited rotated by
  // row / 2 so the 8 threads of a 16-byte load phase hit distinct banks (BN = 128).
  const int row = pt % BN, c0 = (pt / BN) * kChunks;
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % STAGES;
      const uint32_t phase = (it / STAGES) & 1;
      mbar_wait(empty0 + 8 * s, phase ^ 1);  // every thread: it writes B's place below
      const uint32_t sa = smem_addr(smem + s * kStageBytes);
      const uint32_t pk = smem_addr(pack_smem + s * kPackBytes);
      if (loader) {
        const GroupedMember<T> mb = member_of<BN>(ms, tn);
        if constexpr (SUB) {
          mbar_arrive_expect_tx(full0 + 8 * s,
                                tma_box_rows_a(M) * kBK + sub_term_bytes<BN, GS, GB>(kt));
          tma_load_2d(sa, map_a, kt * kBK, tm * kTmaTileRowsA, full0 + 8 * s);
          load_sub_terms<BN, GS, GB>(smem_addr(term_smem + s * kTermBytes),
                                     sub_terms<BN, GB>(mb.terms, mb.n, mb.tn, groups), kt,
                                     full0 + 8 * s);
        } else {
          const float* tile_terms = mb.terms + static_cast<size_t>(mb.tn) * groups * BN * 2;
          mbar_arrive_expect_tx(full0 + 8 * s, stage_tx);
          tma_load_2d(sa, map_a, kt * kBK, tm * kTmaTileRowsA, full0 + 8 * s);
          bulk_load(smem_addr(term_smem + s * kTermBytes),
                    tile_terms + static_cast<size_t>(kt) * kGroups * BN * 2, kTermBytes,
                    full0 + 8 * s);
        }
        // The packed box: BN rows x 64 bytes, all counted (rows past N read as zeros).
        mbar_arrive_expect_tx(packed0 + 8 * s, kPackBytes);
        tma_load_2d(pk, member_map(map_b, mb.g), kt * kPackRow, mb.tn * BN, packed0 + 8 * s);
      }
      mbar_wait(packed0 + 8 * s, phase);
      const uint32_t prow = pk + row * kPackRow;  // 32-bit shared addresses: few registers
      const uint32_t sb = sa + BM * kBK;
#pragma unroll 1  // one chunk's registers at a time: the warpgroup has kWsProducerRegs
      for (int i = 0; i < kChunks; ++i) {
        const int c = c0 + (i + (row >> 1)) % kChunks;  // packed chunk: codes 32 c .. 32 c + 31
        const uint4 v = lds_u4(prow + 16 * c);
        const uint2 e0 = expand4(v.x), e1 = expand4(v.y), e2 = expand4(v.z), e3 = expand4(v.w);
        sts_u4(sb + swz(row, 2 * c), make_uint4(e0.x, e0.y, e1.x, e1.y));
        sts_u4(sb + swz(row, 2 * c + 1), make_uint4(e2.x, e2.y, e3.x, e3.y));
      }
      fence_proxy_async();  // the codes written here are read by wgmma (async proxy)
      __syncwarp();
      if (lane == 0) mbar_arrive(full0 + 8 * s);
    }
  }
}

// a [M, K] int8 codes, row_scale [M] f32, sums [M * G] int32 then the map area (A's map),
// ms: the weights (GroupedMembers), out [M, n[g]] T per member.
template <bool HAS_BIAS, typename T, int BN, int STAGES, int PW, int GS, int NM, int WB = 8,
          bool AG = false, bool ORD = false, bool LIVE = false, int PIPE = 0, bool SUB = false,
          int GB = 0>
__device__ __forceinline__ void gemm_grouped_ws(const int8_t* a, int M, int K,
                                                const float* row_scale, const int32_t* sums,
                                                const GroupedMembers<T, NM>& ms) {
  static_assert(GS == 32 || GS == 64 || GS == 128, "group sizes 32, 64, 128");
  static_assert(BN == 128 || BN == 64 || BN == 32, "an int32 and a float32 set of BN / 2");
  static_assert(PW == 1 || PW == 4, "one producer warp or a warpgroup");
  static_assert(NM >= 1 && NM <= kMaxMembers, "1 to kMaxMembers members");
  static_assert(WB == 8 || (WB == 4 && PW == 4), "8-bit codes, or 4-bit ones expanded by 4 warps");
  static_assert(PIPE == 0 || ((PIPE == 2 || PIPE == 4) && !ORD),
                "runs of 2 or 4 groups, without the MMA order");
  static_assert(!SUB || (!AG && !ORD && !LIVE && PIPE == 0 && BN >= 64),
                "the subnormal promotion alone, on tiles of 64 or more columns");
  static_assert(!SUB || (GB > 0 && 2 * GB + 3 <= 16 && GB % (kBK / GS) == 0),
                "an offset block: whole k-tiles, its pieces and constant in one k16 step");
  constexpr bool kW4 = WB == 4;
  constexpr int BM = 128;
  static_assert(BM == kTmaTileRowsA, "A's box rows (tma_box_rows_a) are the tile's rows");
  constexpr int kGroups = kBK / GS;  // whole groups per k-tile
  constexpr int kSteps = GS / 32;    // k32 wgmma steps per group
  constexpr int kStageBytes = (BM + BN) * kBK;  // a multiple of 1024: swizzle atoms aligned
  // The k-tile's (s, o) pairs for BN columns; SUB: its S rows and an offset block's pieces.
  constexpr int kTermBytes = SUB ? kGroups * BN * 2 + BN * 32 : kGroups * BN * 8;
  constexpr int kPackBytes = kW4 ? BN * kBK / 2 : 0;  // a stage's packed 4-bit rows
  constexpr bool kRealloc = PW == 4;
  unsigned char* smem = wgmma_smem();
  unsigned char* term_smem = smem + STAGES * kStageBytes;
  unsigned char* pack_smem = term_smem + STAGES * kTermBytes;
  unsigned char* epi_smem = pack_smem + STAGES * kPackBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(epi_smem + 8 * kWsEpiWarpBytes);
  const uint32_t full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = member_tiles<BN>(ms);
  const int tiles = tiles_m * tiles_n;
  const int ktiles = K / kBK;
  const int groups = K / GS;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, kW4 ? 1 + 4 : 1);  // the arm (+ the expanding warps)
      mbar_init(empty0 + 8 * s, 8);  // the consumer warps
      if constexpr (kW4) mbar_init(empty0 + 8 * (STAGES + s), 1);  // packed[s]
    }
  }
  __syncthreads();

  if constexpr (kW4) {
    if (warp >= kWsProducerWarp) {
      setmaxnreg_dec<kWsProducerRegs>();  // all four warps stay: they expand the codes
      grouped4_produce<BN, STAGES, GS, SUB, GB>(a, M, K, sums, ms, smem, term_smem, pack_smem, bars);
      return;
    }
  } else if (warp >= kWsProducerWarp) {
    if (!ws_producer_start<kRealloc>(warp)) return;  // warps 9-11 gave their registers
    // This launch's maps, staged in shared memory after the barriers (one stage per map)
    // and published to global memory (warp-collective: every lane of warp 8). A's
    // prototype is the first member's (every member's is the same: [128, K]).
    unsigned char* stage = reinterpret_cast<unsigned char*>(tma_aligned(bars + 2 * STAGES));
    void* map_a = reinterpret_cast<void*>(tma_aligned(sums + static_cast<size_t>(M) * groups));
    const void* map_b[NM];
    tma_make_maps(map_a, a, M, ms.b, ms.wmap, stage, map_b);
    if (lane != 0) return;
    tma_acquire_maps(map_a, map_b);
    // A's box has tma_box_rows_a(M) rows: below BM the stage rows past M keep stale bytes
    // that only reach accumulator rows >= M (gemm_ws.cu).
    const uint32_t stage_tx = (tma_box_rows_a(M) + BN) * kBK + kTermBytes;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      int tm, tn;
      tile_coords(tile, tiles_m, tiles_n, tm, tn);
      const GroupedMember<T> mb = member_of<BN>(ms, tn);
      const void* mb_map = member_map(map_b, mb.g);
      // The tile column's terms: [G][BN][2] floats; k-tile kt's groups start at kt kGroups.
      const float* tile_terms = mb.terms + static_cast<size_t>(mb.tn) * groups * BN * 2;
      SubTerms st{};
      if constexpr (SUB) st = sub_terms<BN, GB>(mb.terms, mb.n, mb.tn, groups);
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
        const uint32_t sa = smem_addr(smem + s * kStageBytes);
        if constexpr (SUB) {
          ws_tma_load_stage<BN>(sa, full0 + 8 * s,
                                stage_tx - kTermBytes + sub_term_bytes<BN, GS, GB>(kt), map_a,
                                mb_map, kt, tm, mb.tn);
          load_sub_terms<BN, GS, GB>(smem_addr(term_smem + s * kTermBytes), st, kt, full0 + 8 * s);
        } else {
          ws_tma_load_stage<BN>(sa, full0 + 8 * s, stage_tx, map_a, mb_map, kt, tm, mb.tn);
          bulk_load(smem_addr(term_smem + s * kTermBytes),
                    tile_terms + static_cast<size_t>(kt) * kGroups * BN * 2, kTermBytes,
                    full0 + 8 * s);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup wg, rows [64 wg, 64 wg + 64) of each tile; this thread's rows
  // are 16 (warp % 4) + lane / 4 and 8 below, its columns 8 j + 2 (lane % 4) + {0, 1}
  // (wgmma_k32's accumulator layout).
  const int wg = warp >> 2;
  if constexpr (kRealloc) setmaxnreg_inc<kWsConsumerRegs>();
  unsigned char* stage_buf = epi_smem + warp * kWsEpiWarpBytes;
  const int tq = lane & 3;
  int d[BN / 2];
  float f[BN / 2];
  int it = 0;
  // ORD: this block's groups in order (seq) and how many (last: WG 1's final arrive would
  // have no wait to meet, so it is not made).
  const int my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int last = my_tiles * ktiles * kGroups - 1;
  int seq = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    const GroupedMember<T> mb = member_of<BN>(ms, tn);
    const int row_base = tm * BM + wg * 64 + (warp & 3) * 16;
    // LIVE: a warp whose 16 rows of this tile all lie past M promotes nothing and stores
    // nothing (warp-uniform; below).
    const bool live = !LIVE || row_base < M;
    const int32_t* r_lo = sums + static_cast<size_t>(min(row_base + (lane >> 2), M - 1)) * groups;
    const int32_t* r_hi = sums + static_cast<size_t>(min(row_base + (lane >> 2) + 8, M - 1)) * groups;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) f[i] = 0.f;
    // R of the group being computed, loaded one group ahead (its latency hides behind the
    // previous group's MMAs and promotion).
    int cur_lo = r_lo[0], cur_hi = r_hi[0];
    // AG: the rows' group scales t_mg ([M, G] in row_scale), loaded as R is.
    const float* t_lo = row_scale;
    const float* t_hi = row_scale;
    float tcur_lo = 0.f, tcur_hi = 0.f;
    if constexpr (AG) {
      t_lo = row_scale + (r_lo - sums);
      t_hi = row_scale + (r_hi - sums);
      tcur_lo = t_lo[0];
      tcur_hi = t_hi[0];
    }
    if constexpr (SUB) {
      // The subnormal promotion (the paragraph at the top of the file; gemm_subnormal.cu).
      subnormal_tile<BN, STAGES, GS, GB>(f, it, smem, term_smem, full0, empty0, wg, lane, r_lo,
                                         r_hi, groups, ktiles);
      (void)cur_lo;
      (void)cur_hi;
    } else if constexpr (PIPE > 0) {
      // Pipelined promotion (PIPE; the paragraph at the top of the file): runs of PIPE
      // groups, each group's promotion under the next group's wgmmas but the run's last.
      const int it0 = it;  // ring position of the tile's first k-tile
      int next_lo = 0, next_hi = 0;  // the last issued group's R (and t)
      float tnext_lo = 0.f, tnext_hi = 0.f;
      auto issue = [&](int (&acc)[BN / 2], int g) {
        const int pos = it0 + g / kGroups, j = g % kGroups, s = pos % STAGES;
        if (j == 0) mbar_wait(full0 + 8 * s, (pos / STAGES) & 1);
        const uint32_t sa = smem_addr(smem + s * kStageBytes) + wg * 64 * kBK;
        const uint32_t sb = smem_addr(smem + s * kStageBytes + BM * kBK);
        wgmma_fence();  // this set's promotion two groups back: before the writes
        wgmma_first<true, BN>(acc, sa, sb, j * kSteps);  // acc only written
#pragma unroll
        for (int ks = 1; ks < kSteps; ++ks)
          wgmma_step<true, BN>(acc, sa, sb, j * kSteps + ks, 1);
        wgmma_commit();
        next_lo = r_lo[g];
        next_hi = r_hi[g];
        if constexpr (AG) {
          tnext_lo = t_lo[g];
          tnext_hi = t_hi[g];
        }
      };
      // Group g's set, complete (the wait_group just before it); the k-tile's stage is
      // released after its last group: the wgmmas in flight then read the next stage.
      auto promote = [&](int (&acc)[BN / 2], int g) {
        const int pos = it0 + g / kGroups, j = g % kGroups, s = pos % STAGES;
        pin_set<BN>(acc);
        if (live)
          grouped_promote<BN, kW4, AG>(f, acc, smem_addr(term_smem + s * kTermBytes), j, tq,
                                       cur_lo, cur_hi, tcur_lo, tcur_hi);
        if (j == kGroups - 1) {
          __syncwarp();
          if (lane == 0) mbar_arrive(empty0 + 8 * s);
        }
        cur_lo = next_lo;
        cur_hi = next_hi;
        tcur_lo = tnext_lo;
        tcur_hi = tnext_hi;
      };
#pragma unroll 1
      for (int g = 0; g < groups; g += PIPE) {  // a run of PIPE groups (PIPE divides groups)
        // The run's two int32 sets, dead between runs (each group's first wgmma has
        // scale-d 0): no value of them crosses the loop's back edge.
        int s0[BN / 2], s1[BN / 2];
        issue(s0, g);
        cur_lo = next_lo;
        cur_hi = next_hi;
        tcur_lo = tnext_lo;
        tcur_hi = tnext_hi;
#pragma unroll
        for (int u = 0; u < PIPE; ++u) {  // group g + u is in set u % 2, in flight
          if (u + 1 < PIPE) {
            if (u % 2 == 0) issue(s1, g + u + 1);
            else issue(s0, g + u + 1);
            wgmma_wait<1>();  // group g + u complete, g + u + 1 in flight
          } else {
            wgmma_wait<0>();  // the run's last group complete
          }
          if (u % 2 == 0) promote(s0, g + u);
          else promote(s1, g + u);
        }
      }
      it = it0 + ktiles;
    } else {
#pragma unroll 1
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
        const uint32_t sa = smem_addr(smem + s * kStageBytes) + wg * 64 * kBK;
        const uint32_t sb = smem_addr(smem + s * kStageBytes + BM * kBK);
        const uint32_t ts = smem_addr(term_smem + s * kTermBytes);
#pragma unroll 1
        for (int j = 0; j < kGroups; ++j, ++seq) {  // j indexes addresses only: no register arrays
          const int grp = kt * kGroups + j;
          // ORD: wait until the other warpgroup's MMAs of its previous group completed
          // (warpgroup 0's first group waits for nothing).
          if constexpr (ORD)
            if (wg == 1 || seq > 0) bar_sync(1 + wg, 256);
          wgmma_fence();  // the promotion below read d: order it before the next writes
#pragma unroll
          for (int ks = 0; ks < kSteps; ++ks)
            wgmma_step<true, BN>(d, sa, sb, j * kSteps + ks, ks != 0);
          wgmma_commit();
          const int nxt = min(grp + 1, groups - 1);
          const int next_lo = r_lo[nxt], next_hi = r_hi[nxt];
          float tnext_lo = 0.f, tnext_hi = 0.f;
          if constexpr (AG) {
            tnext_lo = t_lo[nxt];
            tnext_hi = t_hi[nxt];
          }
          wgmma_wait<0>();
          pin_set<BN>(d);
          // ORD: this group's MMAs are complete: the other warpgroup may issue its next.
          if constexpr (ORD)
            if (wg == 0 || seq < last) bar_arrive(2 - wg, 256);
          if (live)
            grouped_promote<BN, kW4, AG>(f, d, ts, j, tq, cur_lo, cur_hi, tcur_lo, tcur_hi);
          tcur_lo = tnext_lo;
          tcur_hi = tnext_hi;
          cur_lo = next_lo;
          cur_hi = next_hi;
        }
        // k-tile kt is read (its wgmmas complete, its terms loaded by every lane of a live
        // warp): release its stage, one arrive per warp.
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * s);
      }
    }  // PIPE

    int bits[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) bits[i] = __float_as_int(f[i]);
    if constexpr (SUB) {
      const int cols = (mb.n + BN - 1) / BN;  // the member's tile columns
      const int blocks = (groups + GB - 1) / GB;
      const SubnormalEpilogue<HAS_BIAS> epi{
          row_scale, mb.bias, mb.terms + static_cast<size_t>(cols) * (groups * BN / 2 + blocks * 8 * BN)};
      ws_epilogue<BN>(bits, epi, mb.out, row_base, mb.tn * BN, M, mb.n, lane, stage_buf);
    } else {
      const GroupedEpilogue<HAS_BIAS, AG> epi{row_scale, mb.bias};
      if (live) ws_epilogue<BN>(bits, epi, mb.out, row_base, mb.tn * BN, M, mb.n, lane, stage_buf);
    }
  }
}

}  // namespace w8a8

// @@ body tma_grouped
// Grouped W8A8 with the TMA producer: xq [..., K] int8 codes, xs [..., 1] f32 scales,
// xr int32 [M * K / GS + 64] (the quantize's group sums, then A's map area:
// quantize.grouped_sums_shape), w [N, K/4] uint32 codes, wt f32 terms
// (gemm_grouped.grouped_terms), wmap uint8 [512] (tma.weight_maps) -> y [..., N].
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 1>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {nullptr}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_grouped_bias
// As tma_grouped, plus bias [N] f32.
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 1>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {bias}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_grouped_group2
// tma_grouped for two weights fed the same activation (e.g. gate/up): w0, wt0, w1, wt1,
// wmap0, wmap1 -> y0 [..., N0], y1 [..., N1].
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 2>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_grouped_group2_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 2>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_grouped_group3
// Three weights fed the same activation (e.g. q/k/v).
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 3>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});

// @@ body tma_grouped_group3_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 3>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});

// @@ body tma_groupwise
// The group-wise TMA GEMM with its code width WB (8, or 4: MLX's 4-bit weights, packed
// w [N, K/8] uint32) and activation scaling AG (0: per token, xs [..., 1]; 1: per token
// and group, xs [M, K / GS] f32 from the quantize's `groups` body) as template
// arguments, with the MMA order ORD, the rows-past-M skip LIVE and the pipelined
// promotion PIPE (the consumers' paragraphs above); inputs as tma_grouped (wt:
// gemm_grouped.grouped_terms for the width).
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 1, WB, AG, ORD, LIVE, PIPE>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {nullptr}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_groupwise_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 1, WB, AG, ORD, LIVE, PIPE>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {bias}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_groupwise_group2
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 2, WB, AG, ORD, LIVE, PIPE>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_groupwise_group2_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 2, WB, AG, ORD, LIVE, PIPE>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_groupwise_group3
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 3, WB, AG, ORD, LIVE, PIPE>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});

// @@ body tma_groupwise_group3_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 3, WB, AG, ORD, LIVE, PIPE>(
    xq, w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});
