// Decode GEMV (M = 1..16 rows) on the stored affine 8-bit weights: memory-bound, one
// SIMD-group per output feature n, NT / 32 features per threadgroup. Each lane reads 4
// consecutive codes per step (a step covers 128 values of K) and applies them to every
// row; rows are few, so a lane keeps one accumulator per row.
//
// Inputs: xq [M, K] int8 codes, sa [M, 1] f32 row scales, w [N, K] uint8 stored codes,
// MODE 1 (per-channel): sw [N] f32;   out = float(C) * sa[m] * sw[n] (+ bias[n])
//   C = sum_k xq * (w ^ 0x80) accumulated in int32 per lane, summed exactly by simd_sum.
// MODE 2 (grouped): ws [N, G], wo [N, G] f32 (b' = b + 128 s), rs [M, G] int32;
//   out = sa[m] * (sum_g ws[n,g] * C_g + sum_g wo[n,g] * rs[m,g]) (+ bias[n]). A lane's
//   4 codes never straddle a group (GS is a multiple of 4), so each step's int32 partial
//   is scaled by its own group's ws; the wo * rs terms are spread over the lanes by g.
// Unused inputs: any 1-element array. Template parameters: MODE, GS, MAXM (16), NT,
// TO, OUT_BF16, HAS_BIAS. Grid: (ceil(N / (NT / 32)) * NT, 1, 1), threadgroup (NT, 1, 1).

// @@ body gemv
// Rows beyond MAXM are never touched (the launch code refuses M > MAXM): the
// per-row accumulators below are MAXM long.
const int M = min(xq_shape[0], MAXM);
const int K = xq_shape[1];
const int N = w_shape[0];
const int G = MODE == 2 ? K / GS : 1;
const uint lane = thread_index_in_simdgroup;
const int n = int(threadgroup_position_in_grid.x) * int(NT / 32) + int(simdgroup_index_in_threadgroup);

// The whole SIMD-group shares n, so this branch is uniform and the simd_sum calls
// below are reached by all 32 lanes or by none.
if (n < N) {
  int acc_i[MAXM];
  float acc_f[MAXM];
  for (int m = 0; m < MAXM; ++m) {
    acc_i[m] = 0;
    acc_f[m] = 0.0f;
  }
  const size_t wrow = size_t(n) * K;
  for (int k0 = int(lane) * 4; k0 < K; k0 += 128) {
    int wv[4];
    for (int j = 0; j < 4; ++j) {
      wv[j] = (k0 + j < K) ? W8A8_WEIGHT(true, w[wrow + k0 + j]) : 0;
    }
    const float s_g = MODE == 2 ? ws[size_t(n) * G + k0 / GS] : 0.0f;
    for (int m = 0; m < M; ++m) {
      int p = 0;
      for (int j = 0; j < 4; ++j) {
        p += (k0 + j < K) ? int(xq[size_t(m) * K + k0 + j]) * wv[j] : 0;
      }
      if (MODE == 2) {
        acc_f[m] += s_g * float(p);
      } else {
        acc_i[m] += p;
      }
    }
  }
  if (MODE == 2) {
    for (int g = int(lane); g < G; g += 32) {
      const float b = wo[size_t(n) * G + g];
      for (int m = 0; m < M; ++m) {
        acc_f[m] += b * float(rs[size_t(m) * G + g]);
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    float y;
    if (MODE == 2) {
      y = simd_sum(acc_f[m]) * sa[m];
    } else {
      y = float(simd_sum(acc_i[m])) * sa[m] * sw[n];
    }
    if (HAS_BIAS) {
      y += bias[n];
    }
    if (lane == 0) {
      out[size_t(m) * N + n] = OUT_BF16 ? TO(w8a8_bf16_bits(y)) : TO(y);
    }
  }
}
