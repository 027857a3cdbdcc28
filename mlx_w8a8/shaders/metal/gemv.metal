// Decode GEMV (M = 1..16 rows) on the stored affine 8-bit or 4-bit weights: memory-bound.
// A SIMD-group computes R = 4 output features n; NT / 32 SIMD-groups per threadgroup.
// Every step a lane loads 4 consecutive activation codes per row (one char4) and 4
// consecutive weight codes per feature (one uchar4) and applies each activation load to
// all R features. K % 4 == 0 and 4-byte aligned rows hold for a linear layer (K is a
// multiple of the group size; codes are uint32-backed, activations freshly written).
//
// Accumulation: products |x * w| <= 127 * 128 < 2^14 are exact in float, and float
// holds every integer below 2^24, so a lane sums up to 1024 products (256 steps of 4)
// with float FMA, then flushes the exact float into an int32 accumulator (per-channel);
// grouped weights scale each step's exact 4-product sum by its group's scale instead.
// Accumulators are registers: arrays of the compile-time length MAXM (the next power of
// two >= M), every loop over them unrolled, rows m >= M skipped by an `m < M` guard.
//
// Inputs: xq [M, K] int8 codes, sa [M, 1] f32 row scales, w [N, K] uint8 stored codes
// (FLIP: w ^ 0x80 is the int8 weight), or, with MODE 2, MLX's packed
// 4-bit codes [N, K / 8] uint32 words used as they are (0..15, FLIP false: W4A8; a lane's 4
// codes are one half-word of one word),
// MODE 1 (per-channel): sw [N] f32;   out = float(C) * sa[m] * sw[n] (+ bias[n])
//   C = sum_k xq * (w ^ 0x80), exact in int32 per lane and summed exactly by simd_sum.
// MODE 2 (grouped): ws [N, G], wo [N, G] f32 (8-bit: b' = b + 128 s; 4-bit: b), rs [M, G] int32;
//   out = sa[m] * (sum_g ws[n,g] * C_g + sum_g wo[n,g] * rs[m,g]) (+ bias[n]). A lane's
//   4 codes never straddle a group (GS is a multiple of 4); the wo * rs terms are spread
//   over the lanes by g.
// Unused inputs: any 1-element array. Template parameters: FLIP, MODE, GS, MAXM, R, NT, TO,
// OUT_BF16, HAS_BIAS. Grid: (ceil(N / (R * NT / 32)) * NT, 1, 1), threadgroup (NT, 1, 1).

#define W8A8_GEMV_UNROLL _Pragma("clang loop unroll(full)")

// @@ body gemv
constexpr int FLUSH_STEPS = 256;  // 256 steps x 4 products = 1024 products per flush
const int M = xq_shape[0];
const int K = xq_shape[1];
const int N = w_shape[0];
const int K4 = K / 4;
const int G = MODE == 2 ? K / GS : 1;
const uint lane = thread_index_in_simdgroup;
const int n0 = (int(threadgroup_position_in_grid.x) * int(NT / 32) + int(simdgroup_index_in_threadgroup)) * R;

float acc_f[R][MAXM];
int acc_i[R][MAXM];
W8A8_GEMV_UNROLL for (int r = 0; r < R; ++r) {
  W8A8_GEMV_UNROLL for (int m = 0; m < MAXM; ++m) {
    acc_f[r][m] = 0.0f;
    acc_i[r][m] = 0;
  }
}

// The whole SIMD-group shares n0, so every branch on it below is uniform and the
// simd_sum calls are reached by all 32 lanes.
if (n0 < N) {
  int steps = 0;
  for (int s = int(lane); s < K4; s += 32) {
    float wf[R][4];
    float s_g[R];
    W8A8_GEMV_UNROLL for (int r = 0; r < R; ++r) {
      const bool live = n0 + r < N;
      const uchar4 v = live ? w8a8_weights4(w, n0 + r, 4 * s, K) : uchar4(uchar(FLIP ? 0x80 : 0));
      wf[r][0] = float(W8A8_WEIGHT(FLIP, v.x));
      wf[r][1] = float(W8A8_WEIGHT(FLIP, v.y));
      wf[r][2] = float(W8A8_WEIGHT(FLIP, v.z));
      wf[r][3] = float(W8A8_WEIGHT(FLIP, v.w));
      s_g[r] = (MODE == 2 && live) ? ws[size_t(n0 + r) * G + (4 * s) / GS] : 0.0f;
    }
    W8A8_GEMV_UNROLL for (int m = 0; m < MAXM; ++m) {
      if (m < M) {
        const char4 xv = w8a8_load4(xq + size_t(m) * K + 4 * s);
        const float x0 = float(xv.x), x1 = float(xv.y), x2 = float(xv.z), x3 = float(xv.w);
        W8A8_GEMV_UNROLL for (int r = 0; r < R; ++r) {
          if (MODE == 2) {
            const float p = fma(x3, wf[r][3], fma(x2, wf[r][2], fma(x1, wf[r][1], x0 * wf[r][0])));
            acc_f[r][m] = fma(s_g[r], p, acc_f[r][m]);
          } else {
            acc_f[r][m] = fma(x3, wf[r][3], fma(x2, wf[r][2], fma(x1, wf[r][1], fma(x0, wf[r][0], acc_f[r][m]))));
          }
        }
      }
    }
    if (MODE != 2 && ++steps == FLUSH_STEPS) {
      // Flush: every partial sum so far is an exact integer below 2^24.
      W8A8_GEMV_UNROLL for (int r = 0; r < R; ++r) {
        W8A8_GEMV_UNROLL for (int m = 0; m < MAXM; ++m) {
          acc_i[r][m] += int(acc_f[r][m]);
          acc_f[r][m] = 0.0f;
        }
      }
      steps = 0;
    }
  }
  if (MODE == 2) {
    for (int g = int(lane); g < G; g += 32) {
      W8A8_GEMV_UNROLL for (int r = 0; r < R; ++r) {
        const float b = n0 + r < N ? wo[size_t(n0 + r) * G + g] : 0.0f;
        W8A8_GEMV_UNROLL for (int m = 0; m < MAXM; ++m) {
          if (m < M) {
            acc_f[r][m] = fma(b, float(rs[size_t(m) * G + g]), acc_f[r][m]);
          }
        }
      }
    }
  }
  W8A8_GEMV_UNROLL for (int r = 0; r < R; ++r) {
    const int n = n0 + r;
    W8A8_GEMV_UNROLL for (int m = 0; m < MAXM; ++m) {
      if (m < M) {
        float y;
        if (MODE == 2) {
          y = simd_sum(acc_f[r][m]) * sa[m];
        } else {
          y = float(simd_sum(acc_i[r][m] + int(acc_f[r][m]))) * sa[m] * (n < N ? sw[n] : 0.0f);
        }
        if (HAS_BIAS && n < N) {
          y += bias[n];
        }
        if (n < N && lane == uint((r * MAXM + m) % 32)) {
          out[size_t(m) * N + n] = OUT_BF16 ? TO(w8a8_bf16_bits(y)) : TO(y);
        }
      }
    }
  }
}
