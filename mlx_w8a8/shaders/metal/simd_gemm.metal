// Int8 GEMM for Apple GPUs without neural accelerators (M1-M4): int8 operands widened
// to half in threadgroup memory, 8x8 simdgroup_matrix multiply-accumulate in float.
//
// Exactness: |a|, |b| <= 128, so every product is an integer of magnitude <= 2^14 and
// exact in half x half -> float. A float accumulator holds every integer up to 2^24
// exactly, so it is flushed into int32 (or, for grouped weights, folded into float32
// with the group's scale) at least every EXACT_K = 1024 values of K:
// 1024 * 2^14 = 2^24. Flushes happen at multiples of BK, so within a flush interval
// every partial sum, whatever order the hardware adds in, stays exact.
//
// C[m, n] = sum_k A[m, k] * B[n, k]  (A [M, K] int8; B [N, K] int8, or uint8 codes with
// FLIP: the stored affine codes, B = code ^ 0x80; or, TB = uint32_t, MLX's packed 4-bit
// codes [N, K / 8] words read in place, B = code in 0..15, no FLIP: W4A8). 4-bit
// products are <= 127 * 15 in magnitude, so the same flush bound holds with room.
// MODE 0: out = C as int32.
// MODE 1: out = float(C) * sa[m] * sw[n] (+ bias[n])          (per-channel W8A8)
// MODE 2: out = sa[m] * sum_g (ws[g,n] * C_g + wo[g,n] * rs[m,g]) (+ bias[n])  (grouped)
//         with C_g the exact int32 dot product over group g (GS values of K); with AG
//         (activation groups) sa is [M, G]: out = sum_g sa[m,g] * (...) (+ bias[n]).
//
// Template parameters: TB (int8_t / uint8_t / uint32_t: 4-bit codes, MODE 2 only), FLIP,
// MODE, GS (MODE 2), AG (MODE 2), TO (output element type; uint16_t carries bfloat16 bits), OUT_BF16, HAS_BIAS, VEC (rows of a and
// b start 4-byte aligned and K % 4 == 0: stage with 4-byte loads).
// Inputs: a [M, K] int8, b [N, K] TB ([N, K / 8] for uint32_t), sa [M, 1] f32, sw [N] f32,
// ws [G, N] f32, wo [G, N] f32 (group-major; 8-bit: b + 128 s, 4-bit: b), rs [M, G] int32,
// bias [N] f32 (unused ones: any 1-element array).
// Output: out [M, N] TO. Tile BM x BN = 32 x 32, 4 SIMD-groups (2 x 2) of 16 x 16 each.
// Grid: (ceil(N / 32) * 128, ceil(M / 32), 1), threadgroup (128, 1, 1).

#define W8A8_SIMD_UNROLL _Pragma("clang loop unroll(full)")

// @@ body simd_gemm
constexpr int BM = 32, BN = 32, BK = 32, LDS = BK + 8;  // +8 halves: fewer bank conflicts
constexpr int NT = 128;
constexpr int EXACT_K = 1024;
constexpr int FLUSH = MODE == 2 ? GS : EXACT_K;  // a multiple of BK (GS in 32/64/128)
const int M = a_shape[0];
const int K = a_shape[1];
const int N = b_shape[0];
const int G = MODE == 2 ? K / GS : 1;
const uint tid = thread_position_in_threadgroup.x;
const uint lane = thread_index_in_simdgroup;
const uint sg = simdgroup_index_in_threadgroup;
const int m0 = int(threadgroup_position_in_grid.y) * BM;
const int n0 = int(threadgroup_position_in_grid.x) * BN;
const int sm = int(sg / 2) * 16;  // this SIMD-group's 16 x 16 sub-tile
const int sn = int(sg % 2) * 16;

threadgroup half As[BM * LDS];
threadgroup half Bs[BN * LDS];
threadgroup float Cs[4 * 16 * 16];

simdgroup_float8x8 acc[2][2];
for (int i = 0; i < 2; ++i) {
  for (int j = 0; j < 2; ++j) {
    acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }
}
// Lane `lane` owns elements lane + 32 e, e < 8 (row-major) of the 16 x 16 sub-tile:
// consecutive lanes read consecutive scratch words, so the flush has no bank conflicts.
int acc_i[8];
float acc_f[8];
for (int e = 0; e < 8; ++e) {
  acc_i[e] = 0;
  acc_f[e] = 0.0f;
}

for (int k0 = 0; k0 < K; k0 += BK) {
  // Stage A and B tiles as half (zero outside M, N, K: the zeros add nothing to any
  // sum). Each thread moves runs of 4 consecutive K values: with VEC (K % 4 == 0 and
  // 4-byte aligned rows, as for a linear layer's codes and quantized activations) one
  // 4-byte load and one 8-byte threadgroup store per run.
  for (int i = int(tid) * 4; i < BM * BK; i += NT * 4) {
    const int r = i / BK, c = i % BK;
    const int gm = m0 + r, gk = k0 + c;
    half4 h = half4(half(0));
    if (VEC && gm < M && gk < K) {
      const char4 v = w8a8_load4(a + size_t(gm) * K + gk);
      h = half4(half(v.x), half(v.y), half(v.z), half(v.w));
    } else if (gm < M) {
      W8A8_SIMD_UNROLL for (int j = 0; j < 4; ++j) {
        h[j] = half(gk + j < K ? int(a[size_t(gm) * K + gk + j]) : 0);
      }
    }
    W8A8_SIMD_UNROLL for (int j = 0; j < 4; ++j) {
      As[r * LDS + c + j] = h[j];
    }
  }
  for (int i = int(tid) * 4; i < BN * BK; i += NT * 4) {
    const int r = i / BK, c = i % BK;
    const int gn = n0 + r, gk = k0 + c;
    half4 h = half4(half(0));
    if (VEC && gn < N && gk < K) {
      const auto v = w8a8_weights4(b, gn, gk, K);  // char4 or uchar4, as TB
      h = half4(half(W8A8_WEIGHT(FLIP, v.x)), half(W8A8_WEIGHT(FLIP, v.y)),
                half(W8A8_WEIGHT(FLIP, v.z)), half(W8A8_WEIGHT(FLIP, v.w)));
    } else if (gn < N) {
      W8A8_SIMD_UNROLL for (int j = 0; j < 4; ++j) {
        h[j] = half(gk + j < K ? W8A8_WEIGHT(FLIP, w8a8_weight(b, gn, gk + j, K)) : 0);
      }
    }
    W8A8_SIMD_UNROLL for (int j = 0; j < 4; ++j) {
      Bs[r * LDS + c + j] = h[j];
    }
  }
  // Hazard: the whole tile must be staged before any SIMD-group reads it.
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int kk = 0; kk < BK; kk += 8) {
    simdgroup_half8x8 fa[2], fb[2];
    for (int i = 0; i < 2; ++i) {
      simdgroup_load(fa[i], &As[(sm + 8 * i) * LDS + kk], LDS);
    }
    for (int j = 0; j < 2; ++j) {
      // Bs holds B as [n][k]; loading it transposed gives the (k, n) operand.
      simdgroup_load(fb[j], &Bs[(sn + 8 * j) * LDS + kk], LDS, ulong2(0, 0), true);
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        simdgroup_multiply_accumulate(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
  }
  // Hazard: every SIMD-group must be done reading this tile before it is overwritten.
  threadgroup_barrier(mem_flags::mem_threadgroup);

  const int k_end = k0 + BK;
  if (k_end % FLUSH == 0 || k_end >= K) {
    // Flush the float accumulators (exact integers) through this SIMD-group's own
    // scratch; only its own lanes touch it, so a SIMD-group barrier orders it.
    threadgroup float* cs = &Cs[sg * 256];
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        simdgroup_store(acc[i][j], &cs[(8 * i) * 16 + 8 * j], 16);
        acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    const int g = (k_end - 1) / FLUSH;  // MODE 2: the group just completed
    for (int e = 0; e < 8; ++e) {
      const int idx = int(lane) + 32 * e;
      const float v = cs[idx];
      if (MODE == 2) {
        const int m = m0 + sm + idx / 16, n = n0 + sn + idx % 16;
        if (m < M && n < N) {
          if (AG) {
            acc_f[e] += sa[size_t(m) * G + g] *
                        (ws[size_t(g) * N + n] * v + wo[size_t(g) * N + n] * float(rs[size_t(m) * G + g]));
          } else {
            acc_f[e] += ws[size_t(g) * N + n] * v + wo[size_t(g) * N + n] * float(rs[size_t(m) * G + g]);
          }
        }
      } else {
        acc_i[e] += int(v);
      }
    }
    // Hazard: all lanes must have read the scratch before the next flush rewrites it.
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
}

for (int e = 0; e < 8; ++e) {
  const int idx = int(lane) + 32 * e;
  const int m = m0 + sm + idx / 16, n = n0 + sn + idx % 16;
  if (m < M && n < N) {
    const size_t o = size_t(m) * N + n;
    if (MODE == 0) {
      out[o] = TO(acc_i[e]);
    } else {
      float y = MODE == 1 ? float(acc_i[e]) * sa[m] * sw[n] : (AG ? acc_f[e] : acc_f[e] * sa[m]);
      if (HAS_BIAS) {
        y += bias[n];
      }
      out[o] = OUT_BF16 ? TO(w8a8_bf16_bits(y)) : TO(y);
    }
  }
}
