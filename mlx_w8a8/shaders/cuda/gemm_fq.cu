// Small-M W8A8 linear in one launch (wgmma, sm_90a only): every block quantizes all M
// rows of x into shared memory, then multiplies them by the stored unsigned weight codes
// as gemm_ws.cu does (a cp.async producer feeding an mbarrier ring, a persistent grid,
// the shared epilogue). No quantize launch and no codes, scales or row sums in global
// memory: a linear is one launch with x, the weight codes and scales (and bias).
//
// File layout: as gemm.cu. The ring, barriers, Members, the tile order and the epilogue
// are gemm_ws.cu's (its header, required below); the quantizer quantize.cuh's:
// @@ requires gemm_ws.cu
// @@ requires quantize.cuh
//
// Block: 256 threads, at most one block per SM, each block walking tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... of 64 x BN (the rows [0, 64) hold M <= MP real rows).
//  * Warps 4-7 are the producer: for every k-tile of every tile of the block they wait
//    until ring stage s is free (empty[s]), issue the stage's 16-byte cp.async copies of
//    the weight tile (BN rows of 128 bytes of K, 128-byte swizzle, rows past N and the K
//    tail zero-filled) and end with cp.async.mbarrier.arrive.noinc on full[s]. They
//    issue the first STAGES stages before the prologue below, so the weights stream in
//    while x is quantized.
//  * Prologue (all 8 warps): warp w quantizes rows w, w + 8, ... < M of x with
//    quantize.cuh's AbsMax and RowQuantizer (the quantize kernel's functions, so the
//    same codes, scales and row sums bit for bit: docs/numerics.md), one warp per row as
//    quantize.cu's rowsum_warp, and writes the codes into `codes`, the scale and the row
//    sum R_m into shared arrays; then every thread arrives on `ready` (count 256).
//  * Warps 0-3 are one consumer warpgroup: after `ready` (and fence.proxy.async: the
//    codes were written through the generic proxy, wgmma reads through the async one),
//    each k-tile is 4 wgmma.m64n{BN}k32 (A: the k-tile's codes, B: the ring stage),
//    one group kept in flight (wgmma.wait_group 1), the stage released by one arrive
//    per warp on empty[s]; then gemm_ws.cu's epilogue with the row terms from shared
//    memory (ChannelEpilogue reads them through generic pointers).
//
// The codes' layout: k-tile kt of the activation is region kt, MP rows of 128 bytes at
// codes + kt * MP * 128 (1024-byte aligned: MP is a multiple of 8), in common.cuh's
// 128-byte swizzle. An m64 wgmma reads 64 rows, 8 atoms of 8 rows 1024 bytes apart, from
// its region's start: rows past MP are the next regions' rows (and, for the last
// regions, (64 - MP) rows of padding after the codes). Hazard, and why it is harmless:
// those rows, and rows [M, MP) (never written), are other or stale bytes; a row of A
// only reaches the same row of the accumulator, and rows >= M are never stored. The
// K tail of the last region is stale too; B's K tail is zero-filled, so it adds 0.
//
// Synchronization: full[s] (count 128: the producer threads' cp.async arrives) and
// empty[s] (count 4: the consumer warps) as gemm_ws.cu's cooperative tiles; ready
// (count 256) once, parity 0. The consumers use no block-wide barrier after the start;
// the producer exits after its last copies have landed (cp.async.wait_all).
//
// Invariants the launcher guarantees (cuda_launch.gemm_fused_spec): 1 <= M <= MP,
// K % 16 == 0, K <= kWeightU8's bound (the unsigned-code correction is exact in int32),
// rows of x 16-byte aligned, exactly 256 threads, and dynamic shared memory of
// 1024 + STAGES * BN * 128 + ceil(K / 128) * MP * 128 + (64 - MP) * 128 + 4 * 2560
// + 8 MP + 8 (2 STAGES + 1) bytes (FqConfig.shared_memory).

namespace w8a8 {

constexpr int kFqProducerWarp = 4;  // warps 0-3 consume, 4-7 produce

// Quantize row m of x (K elements of T) with the calling warp: codes into the k-tile
// regions of `codes` (MP rows each), the scale and the row sum R_m into scale[m] and
// rsum[m]. Same steps as quantize_row_warp (quantize.cu): the first kCached chunks of 8
// elements of each lane stay in registers between the passes, later ones are read again.
template <typename T, int MP>
__device__ __forceinline__ void fq_quantize_row(const T* xr, int m, int K, unsigned char* codes,
                                                float* scale, int32_t* rsum) {
  constexpr int kCached = sizeof(T) == 4 ? 8 : 16;
  const int lane = threadIdx.x & 31;
  const int chunks = K >> 3;
  Raw8<T> cache[kCached];
  AbsMax<T> amax;
#pragma unroll
  for (int i = 0; i < kCached; ++i) {
    const int c = lane + 32 * i;
    if (c < chunks) {
      cache[i] = load_raw8(xr + c * 8);
      amax.add(cache[i]);
    }
  }
  for (int c = lane + 32 * kCached; c < chunks; c += 32) amax.add(load_raw8(xr + c * 8));
  amax.reduce_warp();
  const RowQuantizer qz = RowQuantizer::of(amax.value());
  int total = 0;
  // Chunk c (elements 8c ..) is 8 bytes of k-tile c / 16's row m: 16-byte chunk
  // (c % 16) / 2 of the row in the swizzle, its low or high half.
  auto put = [&](int c, const float (&f)[8]) {
    uint32_t packed[2];
    total += qz.codes8(f, packed);
    unsigned char* region = codes + (size_t)(c >> 4) * MP * kBK;
    *reinterpret_cast<uint2*>(region + swz(m, (c & 15) >> 1) + (c & 1) * 8) =
        make_uint2(packed[0], packed[1]);
  };
#pragma unroll
  for (int i = 0; i < kCached; ++i) {
    const int c = lane + 32 * i;
    if (c < chunks) {
      float f[8];
      decode8(cache[i], f);
      put(c, f);
    }
  }
  for (int c = lane + 32 * kCached; c < chunks; c += 32) {
    float f[8];
    load8(xr + c * 8, f);
    put(c, f);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  if (lane == 0) {
    scale[m] = qz.s;
    rsum[m] = total;
  }
}

// x: [M, K] (any leading shape with M rows) of T, M <= MP; the members' outputs T.
template <bool HAS_BIAS, typename T, int BN, int STAGES, int MP, int G>
__device__ __forceinline__ void gemm_fq(const T* x, int M, int K, const Members<T, G>& ms) {
  static_assert(MP == 8 || MP == 16 || MP == 32 || MP == 64, "MP: whole 8-row atoms, <= 64");
  static_assert(BN == 32 || BN == 64 || BN == 128, "tile widths");
  constexpr int kStageBytes = BN * kBK;
  constexpr int BM = 64;
  extern __shared__ __align__(128) unsigned char w8a8_smem[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(w8a8_smem) + 1023) & ~static_cast<uintptr_t>(1023));
  const int ktiles = (K + kBK - 1) / kBK;
  unsigned char* codes = smem + STAGES * kStageBytes;  // 1024-aligned: BN * 128 is
  unsigned char* epi_smem = codes + (size_t)ktiles * MP * kBK + (BM - MP) * kBK;
  float* row_scale = reinterpret_cast<float*>(epi_smem + 4 * kWsEpiWarpBytes);
  int32_t* row_sums = reinterpret_cast<int32_t*>(row_scale + MP);
  uint64_t* bars = reinterpret_cast<uint64_t*>(row_sums + MP);  // 8-byte aligned
  const uint32_t full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);
  const uint32_t ready = smem_addr(bars + 2 * STAGES);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = member_tiles<BN>(ms);  // one tile row: M <= 64
  const int mine = tiles > (int)blockIdx.x ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  const int total = mine * ktiles;  // this block's k-tiles, all tiles

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 128);
      mbar_init(empty0 + 8 * s, 4);
    }
    mbar_init(ready, 256);
  }
  __syncthreads();

  auto prologue = [&]() {
    for (int m = warp; m < M; m += 8)
      fq_quantize_row<T, MP>(x + (size_t)m * K, m, K, codes, row_scale, row_sums);
    fence_proxy_async();  // this thread's codes, for the consumers' wgmmas (async proxy)
    mbar_arrive(ready);
  };

  if (warp >= kFqProducerWarp) {
    // Producer thread t (0 .. 127) copies 16-byte chunk t % 8 of rows t / 8 + 16 i of
    // each weight tile (as gemm_ws.cu's cp.async producer with 4 warps).
    const int ptid = tid - 32 * kFqProducerWarp;
    const int chunk = ptid & 7, r0 = ptid >> 3;
    const size_t kstep = 16 * static_cast<size_t>(K);
    auto issue = [&](int it) {
      const int g = it / ktiles, kt = it - g * ktiles;
      const Member<T> mb = member_of<BN>(ms, blockIdx.x + g * gridDim.x);
      const int8_t* pb = mb.b + (size_t)(mb.tn * BN + r0) * K + chunk * 16;
      const int k0 = kt * kBK;
      const bool kok = k0 + chunk * 16 < K;
      const int s = it % STAGES;
      const uint32_t sb = smem_addr(smem + s * kStageBytes);
      // Every copy is issued, predicated by its src-size (0: 16 zero bytes): as gemm_ws.cu.
#pragma unroll
      for (int i = 0; i < BN / 16; ++i) {
        const bool ok = kok && mb.tn * BN + r0 + 16 * i < mb.n;
        cp_async_16(sb + swz(r0 + 16 * i, chunk), ok ? pb + i * kstep + k0 : mb.b, ok);
      }
      cp_async_arrive_noinc(full0 + 8 * s);
    };
    int it = 0;
    for (; it < total && it < STAGES; ++it) issue(it);  // round 0: every stage is free
    prologue();
    for (; it < total; ++it) {
      mbar_wait(empty0 + 8 * (it % STAGES), ((it / STAGES) & 1) ^ 1);
      issue(it);
    }
    cp_async_wait_all();
    return;
  }

  prologue();
  mbar_wait(ready, 0);
  fence_proxy_async();  // and on this side of the barrier, as after every full[s] wait
  unsigned char* stage_buf = epi_smem + warp * kWsEpiWarpBytes;
  int d[BN / 2];
  int it = 0;
  for (int g = 0; g < mine; ++g) {
    const Member<T> mb = member_of<BN>(ms, blockIdx.x + g * gridDim.x);
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % STAGES;
      mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
      fence_proxy_async();
      const uint32_t sa = smem_addr(codes + (size_t)kt * MP * kBK);
      const uint32_t sb = smem_addr(smem + s * kStageBytes);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBK / 32; ++ks)
        wgmma_k32<true, BN>(d, wgmma_desc(sa + ks * 32), wgmma_desc(sb + ks * 32),
                            kt != 0 || ks != 0);
      wgmma_commit();
      if (kt > 0) {
        wgmma_wait<1>();  // k-tile it - 1 has been read: release its stage
        if (lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      }
    }
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) asm volatile("" : "+r"(d[i])::"memory");
    const ChannelEpilogue<1, HAS_BIAS, kWeightU8> epi{row_scale, row_sums, mb.col_scale, mb.bias};
    ws_epilogue<BN>(d, epi, mb.out, (warp & 3) * 16, mb.tn * BN, M, mb.n, lane, stage_buf);
  }
}

}  // namespace w8a8

// @@ body channel_u8
// x [..., K] float (T), M <= MP rows; w [N, K/4] uint32 unsigned codes, ws [N] f32;
// y [..., N] (T).
w8a8::gemm_fq<false, T, BN, STAGES, MP, 1>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1],
    w8a8::Members<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {ws}, {nullptr}, {y},
                        {w_shape[0]}});

// @@ body channel_u8_bias
w8a8::gemm_fq<true, T, BN, STAGES, MP, 1>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1],
    w8a8::Members<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {ws}, {bias}, {y},
                        {w_shape[0]}});

// @@ body group2
// channel_u8 for two weights fed the same x (e.g. gate/up): w0 [N0, K/4], ws0 [N0], w1,
// ws1 -> y0 [..., N0], y1 [..., N1].
w8a8::gemm_fq<false, T, BN, STAGES, MP, 2>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1],
    w8a8::Members<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {ws0, ws1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}});

// @@ body group2_bias
w8a8::gemm_fq<true, T, BN, STAGES, MP, 2>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1],
    w8a8::Members<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {ws0, ws1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}});

// @@ body group3
// Three weights fed the same x (e.g. q/k/v).
w8a8::gemm_fq<false, T, BN, STAGES, MP, 3>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1],
    w8a8::Members<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {ws0, ws1, ws2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}});

// @@ body group3_bias
w8a8::gemm_fq<true, T, BN, STAGES, MP, 3>(
    x, w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1],
    w8a8::Members<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {ws0, ws1, ws2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}});
