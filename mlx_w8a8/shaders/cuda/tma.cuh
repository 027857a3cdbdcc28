// Tensor Memory Accelerator (TMA, sm_90a only): tensor maps made on the device from
// host-encoded prototypes, and the 2-D tile load completing on an mbarrier. A header-only
// file, required by ws.cuh ("// @@ requires tma.cuh") for gemm_ws.cu and gemm_grouped_ws.cu.
//
// Why maps are made on the device: a tensor map holds the global address of its tensor,
// and MLX only knows an array's address at launch (mx.fast.cuda_kernel passes arrays as
// pointers, never a __grid_constant__ CUtensorMap). So the launcher encodes a prototype
// per operand on the host (kernels/tensormap.py: cuTensorMapEncodeTiled with the
// operand's rows, K, box and 128-byte swizzle, and a placeholder address), and each block
// of the GEMM copies it to shared memory, writes the real address in (tensormap.replace;
// for the activations also their rows and box rows, so their prototype does not depend
// on M) and copies it to global memory (tensormap.cp_fenceproxy, a release of the
// tensormap proxy: tma_make_map), because cp.async.bulk.tensor reads a map from global,
// constant or parameter memory only. The thread issuing loads then acquires each map
// (fence.proxy.tensormap) before its first load.
//
// Where the maps go (gemm_ws.cu TmaMaps): every launch makes its maps from the addresses
// it receives, so no map outlives the launch that made it. A map kept across launches
// is unsafe: MLX's CUDA allocator may move an array's buffer (to unified memory when the
// host first reads it), and a kept map would still name the old one (maps kept across
// launches failed that way: docs/history.md).
//  * The per-channel bodies write A's map into the activation array's map area
//    (shape.cuh rowsum_map) and each weight's into that weight's map array
//    (tma.weight_maps: its prototypes, then room for the map). Both are inputs,
//    not outputs (an output costs a launch about 2.7 us of host time). Every launch
//    reading one activation array writes the same bytes into its area (one address,
//    one M, A's prototype depends on K only), and every launch on one weight the same
//    bytes into its map array, so launches that run at once (sibling members on one
//    array, independent calls of one layer in one graph) write identical bytes: no
//    launch can see another's map differ from its own.
//  * The int32 body (int8_matmul: operands from the caller, no activation array) writes
//    each block's maps into its slot of a scratch output.
//
// Hazards:
//  * A map object must be 128-byte aligned in shared memory and 64-byte aligned in global
//    memory; the callers round both up (every array holding a map has 127 bytes to spare).
//  * cp_fenceproxy is .sync.aligned: every lane of the warp executes it, under uniform
//    control flow.
//  * A tile load's bytes are counted on its mbarrier in full, also for the parts of the
//    box past the tensor's end (filled with zeros): the expected byte count of a stage is
//    the boxes' sizes, fixed per launch (the prototype's box rows and the kernel's count
//    must agree, or the barrier never completes).
// @@ requires common.cuh

namespace w8a8 {

constexpr int kTmaMapBytes = 128;

// Write `address` into the map at shared-memory address `map` (a generic-proxy write).
__device__ __forceinline__ void tma_replace_address(uint32_t map, const void* address) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(
                   map),
               "l"(reinterpret_cast<uint64_t>(address))
               : "memory");
#endif
}

// Write the rows of a [rows, K] operand and its box's rows into the map at shared-memory
// address `map` (dimension 1; dimension 0, K, is the prototype's). Activations' maps are
// encoded once per K on the host (tma._tma_prototypes) and each launch writes its
// M in here, as it writes the address: a prompt of a new length encodes nothing. The
// values are the sizes themselves (rows >= 1, 1 <= box_rows <= 256), as the driver's
// cuTensorMapEncodeTiled takes them.
__device__ __forceinline__ void tma_replace_rows(uint32_t map, int rows, int box_rows) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;\n" ::"r"(map),
               "r"(rows)
               : "memory");
  asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 1, %1;\n" ::"r"(map),
               "r"(box_rows)
               : "memory");
#endif
}

// Copy the map at shared-memory address `src` to `dst` (global) and release it to the
// tensormap proxy; every lane of the warp executes it.
__device__ __forceinline__ void tma_publish(void* dst, uint32_t src) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned "
      "[%0], [%1], 128;\n" ::"l"(dst),
      "r"(src)
      : "memory");
#endif
}

// Acquire the map at `map` (global) for this thread's later tile loads.
__device__ __forceinline__ void tma_acquire(const void* map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(map) : "memory");
#endif
}

// The activations' box rows for M rows: the GEMM's 128-row tile, or M below it (a box
// mostly past M measured slower: gemm_ws.cu). The map holds them and the GEMM counts the
// same rows in each stage's expected bytes; they must agree.
constexpr int kTmaTileRowsA = 128;
__device__ __forceinline__ int tma_box_rows_a(int m) { return m < kTmaTileRowsA ? m : kTmaTileRowsA; }

// The first 128-byte aligned address at or after p.
__device__ __forceinline__ uintptr_t tma_aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) + 127) & ~static_cast<uintptr_t>(127);
}

// Warp-collective (every lane, under uniform control flow): the map `proto` (128 bytes,
// global, any alignment of 4) with `address` written in and, when rows > 0, its rows and
// box rows, copied to `dst` (global, 128-byte aligned) through `stage` (128 bytes of
// shared memory, 128-byte aligned, not shared with another map in flight) and released
// to the tensormap proxy.
__device__ __forceinline__ void tma_make_map(void* dst, const uint8_t* proto, const void* address,
                                             int rows, int box_rows, unsigned char* stage) {
  const int lane = threadIdx.x & 31;
  reinterpret_cast<uint32_t*>(stage)[lane] = reinterpret_cast<const uint32_t*>(proto)[lane];
  __syncwarp();
  if (lane == 0) {
    tma_replace_address(smem_addr(stage), address);
    if (rows > 0) tma_replace_rows(smem_addr(stage), rows, box_rows);
  }
  __syncwarp();
  tma_publish(dst, smem_addr(stage));
}

// Warp-collective (as tma_make_map): a launch's maps. A's map, for a [M, K] with
// tma_box_rows_a(M) box rows, is made from `proto_a` and goes to `map_a`; weight g's map
// (b[g]'s address) from proto_b(g) to dst_b(g), which map_b[g] then holds. `stage`: 1 + G
// map stages of kTmaMapBytes (shared memory, as tma_make_map's).
template <int G, typename ProtoB, typename DstB>
__device__ __forceinline__ void tma_make_maps(void* map_a, const uint8_t* proto_a,
                                              const int8_t* a, int M, const int8_t* const (&b)[G],
                                              ProtoB proto_b, DstB dst_b, unsigned char* stage,
                                              const void* (&map_b)[G]) {
  tma_make_map(map_a, proto_a, a, M, tma_box_rows_a(M), stage);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    void* dst = dst_b(g);
    tma_make_map(dst, proto_b(g), b[g], 0, 0, stage + (1 + g) * kTmaMapBytes);
    map_b[g] = dst;
  }
}

// tma_make_maps for weights that carry their own map arrays (tma.weight_maps,
// uint8 [512] per weight: bytes [0, 128) A's prototype ([128, K] codes), [128, 256) the
// weight's ([N_g, K], BN-row boxes), then room for its map): A's prototype is the first
// array's (every member's is the same), weight g's map goes to the first 128-byte
// aligned byte of its array from 256.
template <int G, int NW>
__device__ __forceinline__ void tma_make_maps(void* map_a, const int8_t* a, int M,
                                              const int8_t* const (&b)[G],
                                              const uint8_t* const (&wmap)[NW],
                                              unsigned char* stage, const void* (&map_b)[G]) {
  static_assert(G <= NW, "a map array per weight");
  tma_make_maps(
      map_a, wmap[0], a, M, b, [&](int g) { return wmap[g] + kTmaMapBytes; },
      [&](int g) { return reinterpret_cast<void*>(tma_aligned(wmap[g] + 2 * kTmaMapBytes)); },
      stage, map_b);
}

// Acquire A's map and the G weights' maps (tma_acquire) for this thread's tile loads.
template <int G>
__device__ __forceinline__ void tma_acquire_maps(const void* map_a, const void* const (&map_b)[G]) {
  tma_acquire(map_a);
#pragma unroll
  for (int g = 0; g < G; ++g) tma_acquire(map_b[g]);
}

// Load the box at element coordinates (c0 along K, c1 along rows) of the map at `map`
// (global) into shared memory at `dst`, completing `bytes` of transactions on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1,
                                            uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}

}  // namespace w8a8
