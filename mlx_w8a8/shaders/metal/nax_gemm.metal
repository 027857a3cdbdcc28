// Int8 GEMM on the M5 GPU's neural accelerators: mpp::tensor_ops::matmul2d with an
// int8 x int8 -> int32 16x32x16 descriptor on cooperative tensors (Metal 4,
// macOS 26.2+), the pattern of MLX's steel/gemm/gemm_nax.h and Cider's W8A8 kernel.
// The int32 accumulator is exact for any K up to 2^17.
//
// C[m, n] = sum_k A[m, k] * B[n, k]: A [M, K] int8, B [N, K] int8 (or uint8 codes with
// FLIP, B = code ^ 0x80; or, TB = uint32_t, MLX's packed 4-bit codes [N, K / 8] words,
// B = code in 0..15, no FLIP: W4A8).
// 4-bit codes are unpacked into the int8 right operand in registers: Apple's matmul2d
// table pairs int8_t left operands only with the signed int4b_format (unsigned
// uint4b_format goes with uint8_t), and a packed operand is loaded through a tensor whose
// in-register layout the emulator does not model (tests/metal_emu/metal_emu.h), so the
// 0..15 codes enter an int8 x int8 -> int32 matmul2d as small int8 values.
// B is the right operand read with transpose_right = true, so both operands are read
// along K: every lane loads runs of 4 consecutive bytes (or 4 codes of one 4-bit word).
//
// Fragment layout (MLX's steel/gemm/nax.h, BaseNAXFrag): a 16 x 16 fragment gives lane
// l the 8 elements (fr + 8 i, fc + j), i < 2, j < 4, at index 4 i + j, with qid = l / 4,
// fr = (qid & 4) | ((l / 2) & 3), fc = ((qid & 2) | (l & 1)) * 4. The left operand is
// one fragment (rows m, columns k); the transposed right operand is two fragments (rows
// n, columns k; n 0..15 at indices 0..7, n 16..31 at 8..15); the destination is two
// fragments (rows m, columns n; n 0..15 at indices 0..7, 16..31 at 8..15).
//
// Tiling: a threadgroup of WM x WN SIMD-groups computes BM x BN; every SIMD-group a
// 32 x 32 block (2 x 2 fragments). K runs in blocks of BK = 256 (one mem_none barrier
// each: it keeps the SIMD-groups of a group near each other in K, so the rows they
// share stay in cache; it orders no memory, none is shared) and, inside a block, in
// steps of SK = 32 (2 fragments of K). Each operand has its own guard: a SIMD-group
// whose 32 rows of A lie inside M loads A unguarded for every full K step, and one whose
// 32 rows of B lie inside N loads B unguarded, so a ragged M edge block still reads B
// without checks (and a ragged N edge block A); the last partial K step and the rows
// past M or N take the guarded path (elements outside M, N or K read as 0).
// Threadgroups are swizzled: 2^swz consecutive threadgroups in x walk down M, so
// threadgroups running together share B columns; swz (0..2) follows from the number of
// M tiles, here and in the launch code (metal.nax_swizzle), not a template parameter,
// so it does not multiply the kernel's instantiations.
//
// MODE 0: out = C as int32. MODE 1: out = float(C) * sa[m] * sw[n] (+ bias[n]).
// MODE 2: out = sa[m] * sum_g (ws[g,n] * C_g + wo[g,n] * rs[m,g]) (+ bias[n]); each
//         group's exact int32 sums are folded into float32 every GS / SK steps. With AG
//         (activation groups) sa is [M, G] and each fold is weighed by sa[m,g] instead.
// The epilogue loads its per-row and per-column values once per lane (4 rows, 8
// columns), not once per element.
//
// Template parameters: BM, BN, WM, WN, TB (int8_t / uint8_t / uint32_t: 4-bit codes,
// MODE 2 only), FLIP, MODE, GS (32 unless MODE 2), AG (MODE 2),
// TO (output element type; uint16_t carries bfloat16 bits), OUT_BF16, HAS_BIAS.
// Inputs: a [M, K] int8, b [N, K] TB ([N, K / 8] for uint32_t), sa [M, 1] f32, sw [N] f32,
// ws [G, N] f32, wo [G, N] f32 (group-major: a group's scales of neighbouring columns are
// adjacent; 8-bit: b + 128 s, 4-bit: b), rs [M, G] int32, bias [N] f32 (unused ones: any 1-element array).
// Grid: ((ceil(N / BN) << swz) * WM * WN * 32, ceil(ceil(M / BM) / 2^swz), 1),
// threadgroup (WM * WN * 32, 1, 1).
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

#define W8A8_UNROLL _Pragma("clang loop unroll(full)")

// (column, row) of this lane's first element in a 16 x 16 fragment.
METAL_FUNC short2 w8a8_nax_lane_coord(uint lane) {
  const short l = short(lane);
  const short qid = short(l >> 2);
  const short fr = short((qid & 4) | ((l >> 1) & 3));
  const short fc = short(((qid & 2) | (l & 1)) * 4);
  return short2(fc, fr);
}

// @@ body nax_gemm
constexpr int SM = BM / WM, SN = BN / WN;  // one SIMD-group's block: 32 x 32
static_assert(SM == 32 && SN == 32, "nax_gemm: every SIMD-group computes 32 x 32");
constexpr int TM = SM / 16, TN = SN / 16;  // 2 x 2 fragments
constexpr int SK = 32, TK = SK / 16;       // K per step: 2 fragments
constexpr int BK = 256;                    // K per block
const int M = a_shape[0];
const int K = a_shape[1];
const int N = b_shape[0];
const int G = MODE == 2 ? K / GS : 1;
const uint lane = thread_index_in_simdgroup;
const uint sg = simdgroup_index_in_threadgroup;

// Swizzled tile of this threadgroup; a threadgroup past the last M tile does nothing
// (the whole group returns, so no barrier is left waiting).
const int tiles_m = (M + BM - 1) / BM;
const uint swz = tiles_m >= 8 ? 2u : (tiles_m >= 2 ? 1u : 0u);  // = metal.nax_swizzle(tiles_m)
const uint tgx = threadgroup_position_in_grid.x;
const int tile_n = int(tgx >> swz);
const int tile_m = int((threadgroup_position_in_grid.y << swz) + (tgx & ((1u << swz) - 1u)));
if (tile_m >= tiles_m) {
  return;
}
const int m_sg = tile_m * BM + int(sg / WN) * SM;
const int n_sg = tile_n * BN + int(sg % WN) * SN;
const short2 lc = w8a8_nax_lane_coord(lane);
const int fr = lc.y, fc = lc.x;
const bool a_inside = m_sg + SM <= M;  // uniform across the SIMD-group
const bool b_inside = n_sg + SN <= N;

constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
    16, 32, 16, false, true, true,
    mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> op;
auto ct_a = op.get_left_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_b = op.get_right_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_c = op.get_destination_cooperative_tensor<
    metal::remove_addrspace_t<decltype(ct_a)>, metal::remove_addrspace_t<decltype(ct_b)>, int32_t>();

// Accumulators: fragment (mm, nn) at [mm * TN + nn], element 4 i + j is
// (m_sg + 16 mm + fr + 8 i, n_sg + 16 nn + fc + j).
int acc[TM * TN][8];
float yf[TM * TN][8];
W8A8_UNROLL for (int f = 0; f < TM * TN; ++f) {
  W8A8_UNROLL for (int e = 0; e < 8; ++e) {
    acc[f][e] = 0;
    yf[f][e] = 0.0f;
  }
}

for (int kb = 0; kb < K; kb += BK) {
  threadgroup_barrier(mem_flags::mem_none);
  const int kb_end = min(kb + BK, K);
  for (int k0 = kb; k0 < kb_end; k0 += SK) {
    int8_t fa[TM][TK][8];
    int8_t fb[TN][TK][8];
    const bool full_k = k0 + SK <= K;
    if (a_inside && full_k) {
      // Aligned path: no bounds checks; 4 consecutive bytes per row per fragment.
      W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
        W8A8_UNROLL for (int i = 0; i < 2; ++i) {
          const size_t row = size_t(m_sg + 16 * mm + fr + 8 * i) * K + k0 + fc;
          W8A8_UNROLL for (int kk = 0; kk < TK; ++kk) {
            W8A8_UNROLL for (int j = 0; j < 4; ++j) {
              fa[mm][kk][4 * i + j] = a[row + 16 * kk + j];
            }
          }
        }
      }
    } else {
      // Guarded path: rows past M and the last partial K step.
      W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
        W8A8_UNROLL for (int i = 0; i < 2; ++i) {
          const int m = m_sg + 16 * mm + fr + 8 * i;
          W8A8_UNROLL for (int kk = 0; kk < TK; ++kk) {
            W8A8_UNROLL for (int j = 0; j < 4; ++j) {
              const int k = k0 + 16 * kk + fc + j;
              fa[mm][kk][4 * i + j] = (m < M && k < K) ? a[size_t(m) * K + k] : int8_t(0);
            }
          }
        }
      }
    }
    if (b_inside && full_k) {
      W8A8_UNROLL for (int nn = 0; nn < TN; ++nn) {
        W8A8_UNROLL for (int i = 0; i < 2; ++i) {
          const int n = n_sg + 16 * nn + fr + 8 * i;
          W8A8_UNROLL for (int kk = 0; kk < TK; ++kk) {
            W8A8_UNROLL for (int j = 0; j < 4; ++j) {
              fb[nn][kk][4 * i + j] = int8_t(W8A8_WEIGHT(FLIP, w8a8_weight(b, n, k0 + fc + 16 * kk + j, K)));
            }
          }
        }
      }
    } else {
      // Guarded path: rows past N and the last partial K step.
      W8A8_UNROLL for (int nn = 0; nn < TN; ++nn) {
        W8A8_UNROLL for (int i = 0; i < 2; ++i) {
          const int n = n_sg + 16 * nn + fr + 8 * i;
          W8A8_UNROLL for (int kk = 0; kk < TK; ++kk) {
            W8A8_UNROLL for (int j = 0; j < 4; ++j) {
              const int k = k0 + 16 * kk + fc + j;
              fb[nn][kk][4 * i + j] = (n < N && k < K) ? int8_t(W8A8_WEIGHT(FLIP, w8a8_weight(b, n, k, K))) : int8_t(0);
            }
          }
        }
      }
    }
    // SIMD-group collectives: reached by all 32 lanes (the branches above are uniform).
    W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
      W8A8_UNROLL for (int nn = 0; nn < TN; nn += 2) {
        W8A8_UNROLL for (int kk = 0; kk < TK; ++kk) {
          const int c0 = mm * TN + nn, c1 = c0 + 1;
          W8A8_UNROLL for (int e = 0; e < 8; ++e) {
            ct_a[e] = fa[mm][kk][e];
            ct_b[e] = fb[nn][kk][e];
            ct_b[8 + e] = fb[nn + 1][kk][e];
            ct_c[e] = acc[c0][e];
            ct_c[8 + e] = acc[c1][e];
          }
          op.run(ct_a, ct_b, ct_c);
          W8A8_UNROLL for (int e = 0; e < 8; ++e) {
            acc[c0][e] = ct_c[e];
            acc[c1][e] = ct_c[8 + e];
          }
        }
      }
    }
    if (MODE == 2 && (k0 + SK) % GS == 0) {
      // Group g complete: fold its exact sums into float32 and restart them at zero.
      const int g = k0 / GS;
      float s_n[TN][4], o_n[TN][4], r_m[TM][2], t_m[TM][2];
      W8A8_UNROLL for (int nn = 0; nn < TN; ++nn) {
        W8A8_UNROLL for (int j = 0; j < 4; ++j) {
          const int n = n_sg + 16 * nn + fc + j;
          s_n[nn][j] = n < N ? ws[size_t(g) * N + n] : 0.0f;
          o_n[nn][j] = n < N ? wo[size_t(g) * N + n] : 0.0f;
        }
      }
      W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
        W8A8_UNROLL for (int i = 0; i < 2; ++i) {
          const int m = m_sg + 16 * mm + fr + 8 * i;
          r_m[mm][i] = m < M ? float(rs[size_t(m) * G + g]) : 0.0f;
          t_m[mm][i] = (AG && m < M) ? sa[size_t(m) * G + g] : 0.0f;
        }
      }
      W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
        W8A8_UNROLL for (int nn = 0; nn < TN; ++nn) {
          W8A8_UNROLL for (int e = 0; e < 8; ++e) {
            const int i = e / 4, j = e % 4;
            if (AG) {
              yf[mm * TN + nn][e] += t_m[mm][i] * (s_n[nn][j] * float(acc[mm * TN + nn][e]) + o_n[nn][j] * r_m[mm][i]);
            } else {
              yf[mm * TN + nn][e] += s_n[nn][j] * float(acc[mm * TN + nn][e]) + o_n[nn][j] * r_m[mm][i];
            }
            acc[mm * TN + nn][e] = 0;
          }
        }
      }
    }
  }
}

// Epilogue: this lane's 4 rows and 8 columns, loaded once.
float sa_m[TM][2], sw_n[TN][4], b_n[TN][4];
W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
  W8A8_UNROLL for (int i = 0; i < 2; ++i) {
    const int m = m_sg + 16 * mm + fr + 8 * i;
    sa_m[mm][i] = (MODE != 0 && !AG && m < M) ? sa[m] : 0.0f;
  }
}
W8A8_UNROLL for (int nn = 0; nn < TN; ++nn) {
  W8A8_UNROLL for (int j = 0; j < 4; ++j) {
    const int n = n_sg + 16 * nn + fc + j;
    sw_n[nn][j] = (MODE == 1 && n < N) ? sw[n] : 0.0f;
    b_n[nn][j] = (HAS_BIAS && n < N) ? bias[n] : 0.0f;
  }
}
W8A8_UNROLL for (int mm = 0; mm < TM; ++mm) {
  W8A8_UNROLL for (int nn = 0; nn < TN; ++nn) {
    W8A8_UNROLL for (int e = 0; e < 8; ++e) {
      const int i = e / 4, j = e % 4;
      const int m = m_sg + 16 * mm + fr + 8 * i, n = n_sg + 16 * nn + fc + j;
      if (m < M && n < N) {
        const size_t o = size_t(m) * N + n;
        if (MODE == 0) {
          out[o] = TO(acc[mm * TN + nn][e]);
        } else {
          float y = MODE == 1 ? float(acc[mm * TN + nn][e]) * sa_m[mm][i] * sw_n[nn][j]
                              : (AG ? yf[mm * TN + nn][e] : yf[mm * TN + nn][e] * sa_m[mm][i]);
          if (HAS_BIAS) {
            y += b_n[nn][j];
          }
          out[o] = OUT_BF16 ? TO(w8a8_bf16_bits(y)) : TO(y);
        }
      }
    }
  }
}
