// Hopper warpgroup MMA with A from registers (sm_90a only): wgmma.m64nNk16 on 16-bit
// floats (bfloat16 or float16) with float32 accumulators, and the descriptor of an
// unswizzled K-major operand. A header-only file, required by gemm_dequant.cu (its
// dequantized weight fragments) and gemm_grouped_ws.cu (the subnormal promotion's offset
// pieces); the launcher puts it, once, after wgmma.cuh.
//
// A's fragment (PTX ISA, wgmma .m64nNk16 register fragments): four 32-bit registers of
// T pairs, the lower k in the low half; warp w of the warpgroup owns rows 16 w + lane / 4
// (registers 0 and 2) and 8 below (1 and 3), columns 2 (lane % 4) + {0, 1} (registers 0
// and 1) and 8 more (2 and 3). The accumulators are wgmma_k32's layout, in float32.
// @@ requires wgmma.cuh

namespace w8a8 {

#define W8A8_DQ4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define W8A8_DQ16(i) W8A8_DQ4(i), W8A8_DQ4(i + 4), W8A8_DQ4(i + 8), W8A8_DQ4(i + 12)
#define W8A8_DQ32(i) W8A8_DQ16(i), W8A8_DQ16(i + 16)
#define W8A8_DQ64(i) W8A8_DQ32(i), W8A8_DQ32(i + 32)
#define W8A8_DQ128(i) W8A8_DQ64(i), W8A8_DQ64(i + 64)
#define W8A8_WGMMA_RS(N, TY, REGS, OUTS, A0, A1, A2, A3, DB, P)                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                            \
               "wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " {" REGS "}, {%" \
               A0 ", %" A1 ", %" A2 ", %" A3 "}, %" DB ", p, 1, 1, 0;\n}\n"                 \
               : OUTS                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate))

// d (+)= A (64 x 16, registers, bfloat16 if BF16 else float16) * B (BN x 16)^T, B by
// descriptor db. accumulate == 0 overwrites d.
template <bool BF16, int BN>
__device__ __forceinline__ void wgmma_rs(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t db,
                                         int accumulate) {
  static_assert(BN == 256 || BN == 128 || BN == 64, "tile widths in use");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (BN == 256) {
    if constexpr (BF16)
      W8A8_WGMMA_RS("256", "bf16", W8A8_S128, W8A8_DQ128(0), "128", "129", "130", "131", "132",
                    "133");
    else
      W8A8_WGMMA_RS("256", "f16", W8A8_S128, W8A8_DQ128(0), "128", "129", "130", "131", "132",
                    "133");
  } else if constexpr (BN == 128) {
    if constexpr (BF16)
      W8A8_WGMMA_RS("128", "bf16", W8A8_S64, W8A8_DQ64(0), "64", "65", "66", "67", "68", "69");
    else
      W8A8_WGMMA_RS("128", "f16", W8A8_S64, W8A8_DQ64(0), "64", "65", "66", "67", "68", "69");
  } else {
    if constexpr (BF16)
      W8A8_WGMMA_RS("64", "bf16", W8A8_S32, W8A8_DQ32(0), "32", "33", "34", "35", "36", "37");
    else
      W8A8_WGMMA_RS("64", "f16", W8A8_S32, W8A8_DQ32(0), "32", "33", "34", "35", "36", "37");
  }
#else
  __trap();
#endif
}

// Descriptor of an unswizzled K-major operand of 16-byte rows: core matrices of 8 rows x
// 16 bytes (row r at + 16 r), the two of a k16 step's halves 128 bytes apart (leading
// byte offset), 8-row groups 256 bytes apart (stride byte offset), swizzle mode 0. The
// start address must be 16-byte aligned.
__device__ __forceinline__ uint64_t wgmma_desc_plain(uint32_t smem_byte_addr) {
  uint64_t desc = 0;
  desc |= (uint64_t)((smem_byte_addr & 0x3FFFF) >> 4);
  desc |= (uint64_t)(128 >> 4) << 16;
  desc |= (uint64_t)(256 >> 4) << 32;
  return desc;
}

}  // namespace w8a8
