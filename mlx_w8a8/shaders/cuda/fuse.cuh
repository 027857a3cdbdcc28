// The activation quantize inside the TMA GEMM (gemm_ws.cu's FUSE bodies): one launch per
// W8A8 linear instead of quantize + GEMM. A header-only file ("// @@ requires fuse.cuh").
//
// Why: every mx.fast.cuda_kernel launch costs the host several microseconds to build and
// encode (docs/cuda.md, twentieth set: 3.4-4.3 us of Python and 7-8 us of encode per
// launch), which a chain of linears pays before the GPU starts.
//
// How: a block's warps first quantize rows of x (quantize.cuh's quantize_row_warp: the
// codes xq, scale xs and row sum xr of the unfused launch, bit for bit), then run the
// GEMM on xq. A tile needs the codes of 128 rows that other blocks may have quantized, so
// blocks wait for each other. The rules that keep that free of deadlock:
//  * Rows are claimed from a counter (one atomicAdd per row, by warp), never assigned by
//    block index: a row is only ever claimed by a warp that is running, and a warp
//    quantizes the row it claimed without waiting for anything. So every row a producer
//    waits for is being quantized by a running warp, whether or not the grid's other
//    blocks are resident (MLX may run other kernels beside this one).
//  * Each 128-row block of x has a ready counter; a quantizing warp adds 1 after its
//    row's stores (stores, __syncwarp, then lane 0: red.release.gpu). The TMA producer waits until the counter holds the row block's rows
//    (ld.acquire.gpu), then fence.proxy.async.global (the codes were written through the
//    generic proxy; TMA reads through the async proxy), then loads. The consumers read
//    xs and xr in the epilogue through L2 (__ldcg, FusedEpilogue): the tile's full[]
//    barrier orders those reads after the producer's acquire.
//  * Counters must be zero when a launch starts, and MLX cannot zero an output without
//    filling every output. So they live in a table of this module (one per compiled
//    kernel, zero at load): kFuseSlots slots, a launch using slot hash(y) (the address of
//    its first output; two launches in flight never write the same buffer). The first
//    block to arrive tags the slot with that address (atomicCAS); each block's producer,
//    once its loads are issued and all its block's warps have stopped claiming, adds 1 to
//    `done`, and the last block zeroes the counters and frees the tag.
//  * Two launches in flight whose addresses hash to the same slot: the later one's blocks
//    wait for the slot (spin). That launch took the slot first, so at least one of its
//    blocks runs; it needs all its blocks to run before it frees the slot. Hazard: that
//    relies on the GPU dispatching a launch's blocks before those of a launch made after
//    it (what NVIDIA GPUs do for kernels of one priority; not a documented guarantee).
//    With the 256 slots, two launches in flight at once collide with probability 1/256.
//
// Limits (the launcher's fused_spec checks them): M <= 128 * kFuseRowBlocks, and the
// grid's blocks each hold at least one tile (a persistent grid of min(tiles, SMs)).
// @@ requires common.cuh
// @@ requires quantize.cuh

namespace w8a8 {

constexpr int kFuseSlots = 256;  // a power of two
constexpr int kFuseRowBlocks = 128;  // 128-row blocks per launch: M <= 16384

struct FuseSlot {
  unsigned long long tag;  // the launch's first output address; 0: free
  unsigned claim;          // next row to quantize (ends at M + the warps that asked)
  unsigned done;           // blocks whose producer finished
  unsigned ready[kFuseRowBlocks];  // rows of each 128-row block quantized
};

// Zero at module load (a __device__ array without initializer is zero-initialized).
__device__ FuseSlot w8a8_fuse_slots[kFuseSlots];

// The fused launch's activation and its quantized forms (outputs of the launch).
template <typename T>
struct FuseIn {
  const T* x;
  int8_t* xq;
  float* xs;
  int32_t* xr;
};

// The slot of the launch whose first output is `out`; thread 0 of each block. A slot
// tagged by another launch is waited for (see the hazard above).
__device__ __forceinline__ int fuse_join(const void* out) {
  const unsigned long long tag = reinterpret_cast<uintptr_t>(out);
  const int i = static_cast<int>(((tag >> 8) ^ (tag >> 20) ^ (tag >> 32)) & (kFuseSlots - 1));
  for (;;) {
    const unsigned long long old = atomicCAS(&w8a8_fuse_slots[i].tag, 0ull, tag);
    if (old == 0ull || old == tag) break;
    __nanosleep(256);
  }
  __threadfence();  // the counters are read after the tag was seen
  return i;
}

// Every warp of the block: claim rows and quantize them until none are left, then count
// the warp on `warps_done` (shared). M <= 128 * kFuseRowBlocks. A warp asks for its next
// row as it starts one (lane 0's atomic returns while the row is quantized), so a row
// costs no claim round trip; the row asked for is still quantized without any wait.
template <typename T>
__device__ __forceinline__ void fuse_quantize(FuseSlot* slot, const FuseIn<T>& f, int M, int K,
                                              int* warps_done) {
  const int lane = threadIdx.x & 31;
  unsigned next = 0u;
  if (lane == 0) next = atomicAdd(&slot->claim, 1u);
  for (;;) {
    const int row = static_cast<int>(__shfl_sync(0xffffffffu, next, 0));
    if (row >= M) break;  // the whole warp
    if (lane == 0) next = atomicAdd(&slot->claim, 1u);
    quantize_row_warp(f.x, row, K, f.xq, f.xs, f.xr);
    __syncwarp();
    if (lane == 0) {
      // release: the warp's codes, scale and row sum (ordered before lane 0 by the
      // __syncwarp) before the count
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(&slot->ready[row >> 7])
                   : "memory");
    }
  }
  if (lane == 0) {
    __threadfence();  // the last claim before the count the producer waits for
    atomicAdd(warps_done, 1);
  }
  __syncwarp();
}

// The producer thread, before its first load of row block tm's codes.
__device__ __forceinline__ void fuse_wait(const FuseSlot* slot, int tm, int M) {
  const unsigned need = static_cast<unsigned>(min(128, M - 128 * tm));
  const unsigned* p = &slot->ready[tm];
  for (;;) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    if (v >= need) break;
    __nanosleep(64);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// The producer thread, after its last load: once all `warps` warps of the block have
// stopped claiming rows, count the block done; the last block zeroes the slot's first
// `row_blocks` counters and frees it.
__device__ __forceinline__ void fuse_leave(FuseSlot* slot, const int* warps_done, int warps,
                                           int row_blocks) {
  while (*reinterpret_cast<const volatile int*>(warps_done) < warps) __nanosleep(64);
  __threadfence();
  if (atomicAdd(&slot->done, 1u) != gridDim.x - 1) return;
  __threadfence();  // every block's claims and waits are over
  for (int i = 0; i < row_blocks; ++i) slot->ready[i] = 0u;
  slot->claim = 0u;
  slot->done = 0u;
  __threadfence();
  atomicExch(&slot->tag, 0ull);
}

// ChannelEpilogue with the row terms read through L2: the fused launch writes xs and xr
// in other blocks during the launch, so they must not come from a stale L1 line.
template <int MODE, bool HAS_BIAS, int WB>
struct FusedEpilogue {
  using Base = ChannelEpilogue<MODE, HAS_BIAS, WB>;
  using Value = typename Base::Value;
  using Row = typename Base::Row;
  using Col = typename Base::Col;
  Base base;

  __device__ __forceinline__ Row row(int m, int M) const {
    Row r{0.f, 0};
    if (m < M) {
      if constexpr (MODE == 1) r.scale = __ldcg(base.row_scale + m);
      if constexpr (WB == kWeightU8) r.corr = 128 * __ldcg(base.row_sums + m);
    }
    return r;
  }
  __device__ __forceinline__ Col col(int n, int N) const { return base.col(n, N); }
  __device__ __forceinline__ Value operator()(int acc, Row r, Col c) const {
    return base(acc, r, c);
  }
};

// The epilogue a GEMM body runs: `c` itself, or (FUSE) c reading its row terms via L2.
template <bool FUSE, int MODE, bool HAS_BIAS, int WB>
__device__ __forceinline__ auto epilogue_of(const ChannelEpilogue<MODE, HAS_BIAS, WB>& c) {
  if constexpr (FUSE) {
    return FusedEpilogue<MODE, HAS_BIAS, WB>{c};
  } else {
    return c;
  }
}

}  // namespace w8a8
