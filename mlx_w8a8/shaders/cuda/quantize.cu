// Per-token symmetric int8 quantization of activations (docs/numerics.md).
//
// File layout: the text before the first "// @@ body" line is the `header=` of
// mx.fast.cuda_kernel; each "// @@ body NAME" line starts one kernel's `source=`.
//
// Bodies plain / rowsum / sums: one block per row; each thread handles 8 consecutive
// elements at a time (one 16-byte load for float16/bfloat16, two for float32). Pass 1
// finds amax, pass 2 re-reads the row (it is at most a few tens of KiB, so the re-read
// hits L1/L2: DRAM sees x once) and writes the codes, plus per-group row sums when
// GS > 0, or the full-row sum R_m = sum_k q_mk (int32) when RSUM (the per-channel GEMM's
// unsigned-weight correction, gemm.cu). Body rowsum_warp: the rowsum outputs with one
// warp per row and no block barrier (quantize_row_warp below).
//
// Invariants the launcher guarantees (kernels/cuda/quantize.py: the definitions' refusals
// and launch specs):
// K % 8 == 0 (and K % GS == 0), rows 16-byte aligned (row-contiguous input, K * sizeof(T)
// a multiple of 16), blockDim.x a multiple of 32.
//
// Exactness: quantize.cuh's AbsMax and RowQuantizer (the codes of an IEEE division,
// rounded half to even; its fast path and why it is exact are written there).
// @@ requires quantize.cuh

namespace w8a8 {

// RSUM (only with GS == 0): row_sums is [M] and receives the whole row's code sum;
// |R_m| <= 127 K fits int32 for any K the launchers accept. U8 (only with GS > 0): the
// codes are written as a + 128 (uint8; the sign bit flipped), the sums stay those of a.
template <typename T, int GS, bool RSUM = false, bool U8 = false>
__device__ __forceinline__ void quantize_row(const T* x, int K, int8_t* q, float* scale,
                                             int32_t* row_sums) {
  static_assert(!(RSUM && GS > 0), "full-row sum and group sums are separate bodies");
  static_assert(!U8 || GS > 0, "unsigned codes for the group sums' bodies");
  __shared__ uint32_t warp_max[32];
  __shared__ int warp_sum[32];
  const int row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nwarps = blockDim.x >> 5;
  const int chunks = K >> 3;
  const T* xr = x + (size_t)row * K;

  // The first kCached chunks of each thread stay in registers (raw) between the passes
  // (8 chunks of 16-bit T, 4 of float32: 32 registers; the launcher sizes the block so
  // that is the whole row for K <= 8 * kCached * 1024, quantize.quant_cached); chunks
  // past them are re-read (L1/L2 hits).
  // Hazard (measured on an H200, ncu): a load consumed inside its own `if (c < chunks)`
  // makes the compiler wait for it before issuing the next, one DRAM latency per chunk
  // (the kernel ran at 41% of DRAM bandwidth, stalled on the L1TEX scoreboard). So all
  // kCached loads are issued first, unconditionally, a chunk past the row reading the
  // row's last chunk again (harmless to the max; never emitted), then used.
  constexpr int kCached = sizeof(T) == 4 ? 4 : 8;
  Raw8<T> cache[kCached];
#pragma unroll
  for (int i = 0; i < kCached; ++i)
    cache[i] = load_raw8(xr + min(tid + i * (int)blockDim.x, chunks - 1) * 8);
  AbsMax<T> amax;
#pragma unroll
  for (int i = 0; i < kCached; ++i) amax.add(cache[i]);
  for (int c = tid + kCached * blockDim.x; c < chunks; c += blockDim.x) amax.add(load_raw8(xr + c * 8));
  amax.reduce_block(warp_max);
  const float a = amax.value();
  const RowQuantizer qz = RowQuantizer::of(a);
  // 16-bit rows whose maximum allows it take one multiply-add per value and no check
  // (quantize.cuh tie_free_rate); uniform across the block.
  const float rate = tie_free_rate<T>(amax, a, qz);
  if (tid == 0) scale[row] = qz.s;

  int8_t* qr = q + (size_t)row * K;
  int total = 0;  // RSUM: this thread's share of the row sum
  // Every step's bound is uniform across the block so whole warps stay converged for the
  // row-sum shuffles: a group (GS / 8 consecutive chunks = consecutive lanes) is either
  // entirely inside K or entirely outside it, because K % GS == 0.
  auto emit = [&](int c, const float (&f)[8]) {
    const bool active = c < chunks;
    int sum = 0;
    // Written out, not RowQuantizer::store_codes8: through it ptxas schedules the plain,
    // rowsum and sums bodies differently (bench/sass_diff.py), and tuning tables were
    // measured on this machine code.
    if (active) {
      uint32_t packed[2];
      sum = qz.codes8(f, packed);
      if constexpr (U8) {
        packed[0] ^= 0x80808080u;
        packed[1] ^= 0x80808080u;
      }
      *reinterpret_cast<uint2*>(qr + c * 8) = make_uint2(packed[0], packed[1]);
    }
    total += sum;
    if constexpr (GS > 0) {
      constexpr int kLanes = GS / 8;  // 4, 8 or 16 lanes hold one group
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (active && (lane & (kLanes - 1)) == 0) row_sums[(size_t)row * (K / GS) + c / kLanes] = sum;
    }
  };
  // The common case, straight-line: the block's threads hold exactly the row (the
  // launcher's block for K a multiple of 2048 16-bit or 1024 float32 values, e.g. 4096
  // and 14336) and its scale takes the fast path, so no chunk needs a bounds check and
  // each thread's stores advance one pointer. Uniform across the block; the same bits
  // as the general loops below, which it skips. Measured on an H200 (bfloat16, kernel
  // time): M = 2048, K = 4096 9.5 us against 10.4 without it, although it raises the
  // kernel from 71 to 80 registers (NVIDIA H200, 2026-12-01).
  const bool straight = GS == 0 && qz.fast && kCached * (int)blockDim.x == chunks;
  if constexpr (GS == 0) {
    if (straight) {
      uint2* out = reinterpret_cast<uint2*>(qr) + tid;
      // One loop for both code functions (each call site unrolled on its own).
      auto run = [&](auto codes8) {
#pragma unroll
        for (int i = 0; i < kCached; ++i) {
          float f[8];
          decode8(cache[i], f);
          uint32_t packed[2];
          total += codes8(f, packed);
          out[i * blockDim.x] = make_uint2(packed[0], packed[1]);
        }
      };
      if (rate != 0.f) {
        run([&](const float (&f)[8], uint32_t (&p)[2]) { return RowQuantizer::rate_codes8(f, rate, p); });
      } else {
        run([&](const float (&f)[8], uint32_t (&p)[2]) { return qz.fast_codes8(f, p); });
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kCached; ++i) {
    if (straight || i * (int)blockDim.x >= chunks) break;  // uniform
    float f[8];
    decode8(cache[i], f);  // chunks past the row are never read: codes8 skips them
    emit(tid + i * blockDim.x, f);
  }
  for (int base = straight ? chunks : kCached * blockDim.x; base < chunks; base += blockDim.x) {
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (base + tid < chunks) load8(xr + (base + tid) * 8, f);
    emit(base + tid, f);
  }
  if constexpr (RSUM) {
    // Block reduction of the row sum: every thread of the block reaches this point (all
    // loop bounds above are uniform), so the barrier is safe.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) warp_sum[warp] = total;
    __syncthreads();
    if (tid == 0) {
      int r = 0;
      for (int w = 0; w < nwarps; ++w) r += warp_sum[w];
      row_sums[row] = r;
    }
  }
}

// One warp per row (blockDim.x / 32 rows per block), no shared memory and no block
// barrier: the per-channel GEMM's quantize pass as one streaming pass over x. Each lane
// first issues the 16-byte loads of up to kCached chunks of 8 elements (chunks lane,
// lane + 32, ...; 16 chunks = 4096 bfloat16 elements per row for the whole warp, 8 for
// float32) and keeps them raw in registers, so a warp has 16 loads in flight and a row
// of K <= 4096 (float16/bfloat16) or 2048 (float32) is read from DRAM once; chunks past
// the cache are read again in the second pass (L1/L2 hits). Codes are written as 8-byte
// words (a warp stores 256 contiguous bytes), scale and the row sum R_m by lane 0.
// Same functions as quantize_row (AbsMax, RowQuantizer), so the same bits.
template <typename T>
__device__ __forceinline__ void quantize_row_warp(const T* x, int M, int K, int8_t* q,
                                                  float* scale, int32_t* row_sums) {
  constexpr int kCached = sizeof(T) == 4 ? 8 : 16;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= M) return;  // the whole warp
  const int chunks = K >> 3;
  const T* xr = x + (size_t)row * K;
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
  int8_t* qr = q + (size_t)row * K;
  int total = 0;
#pragma unroll
  for (int i = 0; i < kCached; ++i) {
    const int c = lane + 32 * i;
    if (c < chunks) {
      float f[8];
      decode8(cache[i], f);
      total += qz.store_codes8(f, qr + c * 8);
    }
  }
  for (int c = lane + 32 * kCached; c < chunks; c += 32) {
    float f[8];
    load8(xr + c * 8, f);
    total += qz.store_codes8(f, qr + c * 8);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  if (lane == 0) {
    scale[row] = qz.s;
    row_sums[row] = total;
  }
}

// Activation groups (docs/numerics.md, "Activation groups"): each group of GS
// consecutive values of a row quantized by itself, scale t_mg = amax_g / 127, the codes
// and their sum R_mg as a row's are (the same AbsMax and RowQuantizer, on the group). One
// block per row, one pass: a group's GS / 8 chunks are GS / 8 consecutive lanes of one
// warp in one step of the loop (the block is whole warps and K % GS == 0, so a group
// never straddles a step or a warp, and lies wholly inside or wholly past K), so the
// group's max and sum are shuffles among those lanes and no block barrier is needed.
// Every lane of a warp runs every step (the shuffles take the full mask); a lane past K
// holds zeros and its group's results are not stored.
// scale [M, K / GS] f32 and sums [M * K / GS] int32, row-major.
template <typename T, int GS>
__device__ __forceinline__ void quantize_row_groups(const T* x, int K, int8_t* q, float* scale,
                                                    int32_t* sums) {
  static_assert(GS == 32 || GS == 64 || GS == 128, "group sizes 32, 64, 128");
  constexpr int kLanes = GS / 8;  // 4, 8 or 16 lanes hold one group
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const int chunks = K >> 3, groups = K / GS;
  const T* xr = x + (size_t)row * K;
  int8_t* qr = q + (size_t)row * K;
  for (int base = 0; base < chunks; base += blockDim.x) {  // uniform across the block
    const int c = base + tid;
    const bool active = c < chunks;
    Raw8<T> raw{};
    if (active) raw = load_raw8(xr + c * 8);
    AbsMax<T> amax;
    amax.add(raw);
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1)
      amax.m = AbsMax<T>::merge(amax.m, __shfl_xor_sync(0xffffffffu, amax.m, o));
    const RowQuantizer qz = RowQuantizer::of(amax.value());
    float f[8];
    decode8(raw, f);
    uint32_t packed[2];
    int sum = qz.codes8(f, packed);
    if (active) *reinterpret_cast<uint2*>(qr + c * 8) = make_uint2(packed[0], packed[1]);
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (active && (lane & (kLanes - 1)) == 0) {
      const size_t at = (size_t)row * groups + c / kLanes;
      scale[at] = qz.s;
      sums[at] = sum;
    }
  }
}

}  // namespace w8a8

// @@ body plain
// x [M, K] float (T); outputs q [M, K] int8, scale [M, 1] f32.
w8a8::quantize_row<T, 0>(x, x_shape[x_ndim - 1], q, scale, nullptr);

// @@ body rowsum
// As `plain`, plus the sum of each row's codes (the unsigned-code GEMMs' correction), all
// in one output: xa [R, K] int8 (shape.cuh rowsum_acts), its map area zero.
const int qk = x_shape[x_ndim - 1], qm = w8a8::rows(x_shape, x_ndim);
const w8a8::RowsumOut o = w8a8::rowsum_out(xa, qm, qk);
w8a8::quantize_row<T, 0, true>(x, qk, o.q, o.scale, o.sums);
w8a8::rowsum_zero_tail(xa, qm, qk);

// @@ body sums
// As `plain`, plus row_sums [M, K / GS] int32.
w8a8::quantize_row<T, GS>(x, x_shape[x_ndim - 1], q, scale, row_sums);

// @@ body sums_u8
// As `sums` with the codes written as a + 128: q [M, K] uint8 (the subnormal promotion's
// activations, gemm_grouped_ws.cu).
w8a8::quantize_row<T, GS, false, true>(x, x_shape[x_ndim - 1], reinterpret_cast<int8_t*>(q),
                                       scale, row_sums);

// @@ body rowsum_warp
// As `rowsum` (the same array, the same bits), one warp per row: x [..., K] float (T).
const int qk = x_shape[x_ndim - 1], qm = w8a8::rows(x_shape, x_ndim);
const w8a8::RowsumOut o = w8a8::rowsum_out(xa, qm, qk);
w8a8::rowsum_zero_tail(xa, qm, qk);
w8a8::quantize_row_warp<T>(x, qm, qk, o.q, o.scale, o.sums);

// @@ body groups
// Activation groups: x [..., K] float (T); q [..., K] int8, scale [M, K / GS] f32 (one
// per row and group), sums: the group code sums in quantize.grouped_sums_shape's
// array (A's map area after them, untouched here).
w8a8::quantize_row_groups<T, GS>(x, x_shape[x_ndim - 1], q, scale, sums);
