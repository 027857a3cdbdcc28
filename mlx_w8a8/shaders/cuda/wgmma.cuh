// Hopper warpgroup MMA (wgmma, sm_90a only): shared-memory matrix descriptors, the
// m64nNk32 int8 instruction for the tile widths the GEMMs use, and the fences around it.
// A header-only file, required by gemm_wgmma.cu and ws.cuh ("// @@ requires
// wgmma.cuh"); the launcher puts it, once, after common.cuh.
//
// Both operands come from shared memory in common.cuh's layout: K-major rows of 128 bytes,
// 16-byte chunk c of row r at c ^ (r & 7). That is wgmma's 128-byte swizzle when each
// 8-row atom starts 1024-byte aligned (callers round the tile base up to 1024 bytes); a
// k32 step is the 32-byte column slice ks of every row, so a descriptor's start address
// advances by 32 bytes per step (the hardware applies the swizzle to the absolute address).
// Other targets than sm_90a compile these to traps (instructions) or nothing (fences):
// the launchers only use them on compute capability 9.0.
// @@ requires common.cuh

namespace w8a8 {

__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_byte_addr) {
  // Matrix descriptor: start address >> 4 (bits 0-13), leading byte offset >> 4 (bits
  // 16-29; unused for swizzled K-major, set to 1), stride byte offset >> 4 (bits 32-45:
  // 1024 bytes between 8-row atoms), swizzle mode 128B (bits 62-63 = 1).
  uint64_t desc = 0;
  desc |= (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4);
  desc |= (uint64_t)1 << 16;
  desc |= (uint64_t)(1024 >> 4) << 32;
  desc |= (uint64_t)1 << 62;
  return desc;
}

// The block's dynamic shared memory from its first 1024-byte aligned byte, where the
// wgmma GEMMs put their operand stages (the 128-byte swizzle's 8-row atoms must start
// 1024-byte aligned; the launchers add 1024 bytes of slack).
__device__ __forceinline__ unsigned char* wgmma_smem() {
  extern __shared__ __align__(128) unsigned char w8a8_smem[];
  return reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(w8a8_smem) + 1023) & ~static_cast<uintptr_t>(1023));
}

// The instruction's operand lists: accumulator registers %0 .. %(R-1) ("+r"(d[i]), R =
// N / 2 per thread), then the two descriptors and the accumulate flag.
#define W8A8_S16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define W8A8_S32 W8A8_S16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, " \
  "%28, %29, %30, %31"
#define W8A8_S64 W8A8_S32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
  "%61, %62, %63"
#define W8A8_S128 W8A8_S64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, " \
  "%76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, " \
  "%93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, " \
  "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, " \
  "%122, %123, %124, %125, %126, %127"
#define W8A8_O4(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3])
#define W8A8_O16(i) W8A8_O4(i), W8A8_O4(i + 4), W8A8_O4(i + 8), W8A8_O4(i + 12)
#define W8A8_O32(i) W8A8_O16(i), W8A8_O16(i + 16)
#define W8A8_O64(i) W8A8_O32(i), W8A8_O32(i + 32)
#define W8A8_O128 W8A8_O64(0), W8A8_O64(64)
// N: the tile width; TYPES: "s8.s8" or "s8.u8"; REGS / OUTS: the lists above for R = N / 2;
// DA, DB, P: the operand numbers R, R + 1, R + 2 as text.
#define W8A8_WGMMA(N, TYPES, REGS, OUTS, DA, DB, P)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                          \
               "wgmma.mma_async.sync.aligned.m64n" N "k32.s32." TYPES " {" REGS "}, %" DA \
               ", %" DB ", p;\n}\n"                                                      \
               : OUTS                                                                    \
               : "l"(da), "l"(db), "r"(accumulate))

// d (+)= A (64 x 32, signed) * B (BN x 32)^T for one k32 step of one warpgroup; B signed,
// or unsigned when U8 (the stored weight codes). accumulate == 0 overwrites d.
// Accumulator layout (like mma's C fragment): warp w of the warpgroup owns rows 16 w +
// lane / 4 (+ 8); d[4 j + {0, 1}] are columns 8 j + 2 (lane % 4) + {0, 1} of the first
// row, d[4 j + {2, 3}] of the second.
template <bool U8, int BN>
__device__ __forceinline__ void wgmma_k32(int (&d)[BN / 2], uint64_t da, uint64_t db,
                                          int accumulate) {
  static_assert(BN == 256 || BN == 128 || BN == 64 || BN == 32, "tile widths in use");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (BN == 256) {
    if constexpr (U8) W8A8_WGMMA("256", "s8.u8", W8A8_S128, W8A8_O128, "128", "129", "130");
    else W8A8_WGMMA("256", "s8.s8", W8A8_S128, W8A8_O128, "128", "129", "130");
  } else if constexpr (BN == 128) {
    if constexpr (U8) W8A8_WGMMA("128", "s8.u8", W8A8_S64, W8A8_O64(0), "64", "65", "66");
    else W8A8_WGMMA("128", "s8.s8", W8A8_S64, W8A8_O64(0), "64", "65", "66");
  } else if constexpr (BN == 64) {
    if constexpr (U8) W8A8_WGMMA("64", "s8.u8", W8A8_S32, W8A8_O32(0), "32", "33", "34");
    else W8A8_WGMMA("64", "s8.s8", W8A8_S32, W8A8_O32(0), "32", "33", "34");
  } else {
    if constexpr (U8) W8A8_WGMMA("32", "s8.u8", W8A8_S16, W8A8_O16(0), "16", "17", "18");
    else W8A8_WGMMA("32", "s8.s8", W8A8_S16, W8A8_O16(0), "16", "17", "18");
  }
#else
  __trap();
#endif
}

// As W8A8_WGMMA with scale-d 0 and the accumulators as write-only operands ("=r"(d[i])
// lists: W8A8_W*): the instruction reads no d, so no earlier value of d is live into it.
#define W8A8_W4(i) "=r"(d[i]), "=r"(d[i + 1]), "=r"(d[i + 2]), "=r"(d[i + 3])
#define W8A8_W16(i) W8A8_W4(i), W8A8_W4(i + 4), W8A8_W4(i + 8), W8A8_W4(i + 12)
#define W8A8_W32(i) W8A8_W16(i), W8A8_W16(i + 16)
#define W8A8_W64(i) W8A8_W32(i), W8A8_W32(i + 32)
#define W8A8_WGMMA_FIRST(N, TYPES, REGS, OUTS, DA, DB)                                  \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" N "k32.s32." TYPES " {" REGS "}, %" DA \
               ", %" DB ", 0;\n"                                                      \
               : OUTS                                                                    \
               : "l"(da), "l"(db))

// k32 step `step` of a k-tile in common.cuh's layout: d (+)= A * B^T for A's 64 rows at
// shared address sa and B's BN rows at sb, both descriptors at the step's 32-byte column
// slice (step * 32 bytes into every 128-byte row).
template <bool U8, int BN>
__device__ __forceinline__ void wgmma_step(int (&d)[BN / 2], uint32_t sa, uint32_t sb, int step,
                                           int accumulate) {
  wgmma_k32<U8, BN>(d, wgmma_desc(sa + step * 32), wgmma_desc(sb + step * 32), accumulate);
}

// d = A * B^T for k32 step `step` (wgmma_step with accumulate 0) with d write-only: a
// register set that is dead before it (the group-wise GEMM's pipelined sets) then needs
// no copy into the instruction's registers, which ptxas would otherwise fence with an
// injected warpgroup.arrive / wait (C7519, C7517).
template <bool U8, int BN>
__device__ __forceinline__ void wgmma_first(int (&d)[BN / 2], uint32_t sa, uint32_t sb, int step) {
  static_assert(BN == 128 || BN == 64 || BN == 32, "tile widths in use");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const uint64_t da = wgmma_desc(sa + step * 32), db = wgmma_desc(sb + step * 32);
  if constexpr (BN == 128) {
    if constexpr (U8) W8A8_WGMMA_FIRST("128", "s8.u8", W8A8_S64, W8A8_W64(0), "64", "65");
    else W8A8_WGMMA_FIRST("128", "s8.s8", W8A8_S64, W8A8_W64(0), "64", "65");
  } else if constexpr (BN == 64) {
    if constexpr (U8) W8A8_WGMMA_FIRST("64", "s8.u8", W8A8_S32, W8A8_W32(0), "32", "33");
    else W8A8_WGMMA_FIRST("64", "s8.s8", W8A8_S32, W8A8_W32(0), "32", "33");
  } else {
    if constexpr (U8) W8A8_WGMMA_FIRST("32", "s8.u8", W8A8_S16, W8A8_W16(0), "16", "17");
    else W8A8_WGMMA_FIRST("32", "s8.s8", W8A8_S16, W8A8_W16(0), "16", "17");
  }
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Register reallocation between warpgroups: every warp of a warpgroup executes it; dec
// returns registers above R to the block's pool, inc waits until R are available. ptxas
// allocates the code after each to R registers.
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R) : "memory");
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R) : "memory");
#endif
}
// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before
// later async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace w8a8
