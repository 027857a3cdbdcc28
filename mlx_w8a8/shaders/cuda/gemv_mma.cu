// Small-M W8A8 / W4A8 linear on tensor cores (1 <= M <= 32): memory-bound over the stored
// 8-bit or MLX 4-bit weight codes, with mma.sync doing the multiplies the dp4a GEMVs
// (gemv.cu) do on the CUDA cores. At M = 16 the dp4a GEMV reads every activation chunk once per weight row
// and runs 4 dp4a per 16 bytes and token; here a warp's m16n8k32 MMAs take 16 weight rows
// x 8 tokens x 32 codes from registers.
// @@ requires shape.cuh
// @@ requires mma.cuh
// @@ requires gemv.cuh
//
// Math (the W8A8 contract of docs/numerics.md, on activations quantized by the quantize
// kernel's plain body): per-channel weights accumulate sum_k xq[m, k] (q[n, k] - 128) in
// int32 over the whole row and scale once; grouped weights (group size 64 or 128) get
// each group's exact int32 sum P and the group's activation-code sum R from the MMAs,
// then f = fma(s[n, g], P, fma(o[n, g], R, f)) (o = b + 128 s, float32): two roundings a
// group, as the grouped contract counts them. 4-bit weights (WB == 4, MLX's affine 4-bit as
// stored: eight unsigned codes per uint32, code j of a word in bits 4j .. 4j + 3) take the
// same path with their codes expanded to bytes in registers (gemv.cuh) and unflipped,
// and o the stored bias b (of the scales' type): the W4A8 math of docs/numerics.md.
//
// Operands: the weight rows are the MMA's A (16 rows, row-major), the tokens its B (8
// columns per n-tile, NT n-tiles). Lane (g, t) = (lane / 4, lane % 4) loads, per step of
// 64 codes, 16 bytes of weight rows n0 + g and n0 + g + 8 at codes 16 t .. 16 t + 15, and
// 16 bytes of activation row 8 j + g at the same codes for each n-tile j (4-bit rows: 8
// bytes, expanded to 16): the step's
// k-permutation (an MMA's logical code c of half h of the step is code 16 t + 8 h + c % 4
// + 4 (c / 16) of lane t's 16, for A and B alike) leaves each dot product's terms as they
// are, so no shuffle or shared memory is needed to build fragments. The codes q are
// unsigned; q ^ 0x80 is q - 128 as int8 (s8 x s8 MMAs; 4-bit codes 0-15 need no flip). R comes from an MMA of the same
// activations with an A of ones, so it lands in the accumulators' layout.
//
// Work split: a block of W warps owns RT tiles of 16 weight rows (each lane's activation
// fragments serve all RT of them: the activations are read once per 16 RT rows); warp w
// takes the K-steps (grouped: the groups) w, w + W, ... (D steps of loads in flight per
// lane), so each weight row is read by the block's warps together. The W partial sums of
// an output are added in warp order through shared memory (int32 per-channel, float32
// grouped), so the result does not depend on timing. D is 2 or 4 (gemv.MMA_GEMV_DEPTH:
// 2); RT is 1, 2 or 4 with RT NT <= 8 (gemv.mma_row_tiles: 2 for 8-bit codes at NT = 4
// where the blocks fill the GPU, else 1).
//
// Invariants the launcher guarantees: 1 <= M <= 8 NT, K % 64 == 0, K < 2^17, GS in
// {0 (per-channel), 64, 128}, rows 16-byte aligned, blockDim.x == 32 W, gridDim.x ==
// ceil(N / (16 RT)). Rows of x past M are read as row M - 1 and never stored; weight rows
// past N are read as row N - 1 and never stored.

namespace w8a8 {

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// A lane's 16 codes of a weight row at `p` (its first code's byte): 16 bytes of 8-bit
// codes, or 8 bytes of 4-bit codes expanded to bytes in element order.
template <int WB>
__device__ __forceinline__ uint4 load_codes16(const uint8_t* p) {
  if constexpr (WB == 8) {
    return __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    const uint2 packed = __ldg(reinterpret_cast<const uint2*>(p));
    uint4 out;
    expand_word4(packed.x, out.x, out.y);
    expand_word4(packed.y, out.z, out.w);
    return out;
  }
}

// One step (64 codes) of MMAs: the weight rows' int32 sums into c[j], and with R the
// activation-code sums into r[j] (an A of ones); the weight bytes XORed with kFlip.
template <int NT, bool R, uint32_t kFlip>
__device__ __forceinline__ void mma_step(const uint4& wa, const uint4& wb, const uint4 (&x)[NT],
                                         int (&c)[NT][4], int (&r)[NT][4]) {
  constexpr uint32_t kOnes = 0x01010101u;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a[4] = {word(wa, 2 * h) ^ kFlip, word(wb, 2 * h) ^ kFlip,
                           word(wa, 2 * h + 1) ^ kFlip, word(wb, 2 * h + 1) ^ kFlip};
    const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mma_i8<false>(c[j], a, word(x[j], 2 * h), word(x[j], 2 * h + 1));
      if constexpr (R) mma_i8<false>(r[j], ones, word(x[j], 2 * h), word(x[j], 2 * h + 1));
    }
  }
}

// The block owning weight rows [n0, n0 + 16 RT). GS == 0: per-channel (ws [N] f32 scales,
// wo unused); GS 64 or 128: grouped (ws [N, K/GS] scales of type ST, wo [N, K/GS] offsets
// of type OT: b + 128 s in f32 for 8-bit codes, the stored biases b for 4-bit ones,
// WB == 4).
template <int NT, int W, int D, int RT, int GS, bool HAS_BIAS, typename T, typename ST,
          int WB = 8, typename OT = float>
__device__ __forceinline__ void gemv_mma_rows(const int8_t* xq, const float* xs, const uint32_t* w,
                                              const ST* ws, const OT* wo, const float* bias,
                                              int M, int N, int K, T* y, int n0) {
  static_assert(GS == 0 || GS == 64 || GS == 128, "per-channel, or groups of 64 or 128 codes");
  static_assert(NT >= 1 && NT <= 4 && W >= 1 && W <= 8, "up to 32 tokens, up to 8 warps");
  static_assert(D == 2 || D == 4, "two or four steps of loads in flight");
  static_assert((RT == 1 || RT == 2 || RT == 4) && RT * NT <= 8,
                "1, 2 or 4 row tiles, the partials within 32 KB of shared memory");
  static_assert(WB == 8 || (WB == 4 && GS > 0), "4-bit codes are group-wise");
  constexpr bool kGrouped = GS > 0;
  constexpr uint32_t kFlip = WB == 8 ? 0x80808080u : 0u;  // 8-bit q - 128; 4-bit q as is
  constexpr int kSteps = GS == 128 ? 2 : 1;    // steps (64 codes) of one work unit
  constexpr int kUnits = D / kSteps;           // units loaded ahead: D steps in flight
  __shared__ int part[W][RT * NT * 4][32];     // each warp's partial sums (float bits grouped)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int na0 = min(n0 + g, N - 1), nb0 = min(n0 + g + 8, N - 1);
  // Bytes of codes before code c of a row: c (8-bit), c / 2 (4-bit; c even here).
  auto bytes_of = [](size_t c) { return WB == 8 ? c : c / 2; };
  auto codes_at = [&](int row) {  // this lane's first code of a row
    return reinterpret_cast<const uint8_t*>(w) + bytes_of((size_t)row * K + 16 * t);
  };
  const uint8_t* wa0 = codes_at(na0);
  const uint8_t* wb0 = codes_at(nb0);
  // Row tile i: this lane's rows n0 + 16 i + g and + 8 (tile 0's set up first, as a
  // kernel of one tile does: the same machine code then).
  int na[RT], nb[RT];
  const uint8_t* wa[RT];
  const uint8_t* wb[RT];
#pragma unroll
  for (int i = 0; i < RT; ++i) {
    na[i] = i == 0 ? na0 : min(n0 + 16 * i + g, N - 1);
    nb[i] = i == 0 ? nb0 : min(n0 + 16 * i + g + 8, N - 1);
    wa[i] = i == 0 ? wa0 : codes_at(na[i]);
    wb[i] = i == 0 ? wb0 : codes_at(nb[i]);
  }
  const int8_t* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xr[j] = xq + (size_t)min(8 * j + g, M - 1) * K + 16 * t;
  const int units = K / (64 * kSteps);
  const int G = kGrouped ? K / GS : 1;

  int acc[RT][NT][4];    // per-channel: the int32 sums
  float f[RT][NT][4];    // grouped: the promoted sums
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[i][j][e] = 0;
        f[i][j][e] = 0.f;
      }

  for (int u0 = warp; u0 < units; u0 += W * kUnits) {  // uniform per warp
    uint4 va[kUnits][kSteps][RT], vb[kUnits][kSteps][RT], vx[kUnits][kSteps][NT];
    float sa[kUnits][RT], sb[kUnits][RT], oa[kUnits][RT], ob[kUnits][RT];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int unit = u0 + u * W;
      const bool valid = unit < units;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const size_t at = (size_t)(unit * kSteps + s) * 64;  // the step's first code
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < RT; ++i) {
          va[u][s][i] = valid ? load_codes16<WB>(wa[i] + bytes_of(at)) : zero;
          vb[u][s][i] = valid ? load_codes16<WB>(wb[i] + bytes_of(at)) : zero;
        }
#pragma unroll
        for (int j = 0; j < NT; ++j)
          vx[u][s][j] = valid ? __ldg(reinterpret_cast<const uint4*>(xr[j] + at)) : zero;
      }
      if constexpr (kGrouped) {
        const int gi = valid ? unit : 0;  // a unit is one group
        auto terms = [&](int i, int ra, int rb) {  // row tile i's scales and offsets
          sa[u][i] = to_f32(ws[(size_t)ra * G + gi]);
          sb[u][i] = to_f32(ws[(size_t)rb * G + gi]);
          oa[u][i] = to_f32(wo[(size_t)ra * G + gi]);
          ob[u][i] = to_f32(wo[(size_t)rb * G + gi]);
        };
        terms(0, na0, nb0);  // tile 0 outside the loop: one tile's machine code as before
#pragma unroll
        for (int i = 1; i < RT; ++i) terms(i, na[i], nb[i]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (u0 + u * W >= units) break;
      // Row tiles first .. RT - 1: their products alone, into d[i].
      auto products = [&](int first, int (&d)[RT][NT][4]) {
        int unused[NT][4];
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
#pragma unroll
          for (int i = first; i < RT; ++i)
            mma_step<NT, false, kFlip>(va[u][s][i], vb[u][s][i], vx[u][s], d[i], unused);
      };
      if constexpr (kGrouped) {
        // The activation-code sums r do not depend on the rows: row tile 0's MMAs
        // compute them, the other tiles' only their own products.
        // Sums from kBiased (gemv.cuh): converted by one exact subtract each.
        int c[RT][NT][4], r[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            r[j][e] = kBiased;
#pragma unroll
            for (int i = 0; i < RT; ++i) c[i][j][e] = kBiased;
          }
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
          mma_step<NT, true, kFlip>(va[u][s][0], vb[u][s][0], vx[u][s], c[0], r);
        if constexpr (RT > 1) products(1, c);
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float sc = e < 2 ? sa[u][i] : sb[u][i], of = e < 2 ? oa[u][i] : ob[u][i];
              f[i][j][e] = fmaf(sc, biased_to_float(c[i][j][e]),
                                fmaf(of, biased_to_float(r[j][e]), f[i][j][e]));
            }
      } else {
        products(0, acc);
      }
    }
  }

  // The warps' partials, added in warp order by warp 0.
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        part[warp][(i * NT + j) * 4 + e][lane] =
            kGrouped ? __float_as_int(f[i][j][e]) : acc[i][j][e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + 16 * i + g + 8 * (e >> 1), m = 8 * j + 2 * t + (e & 1);
        const int at = (i * NT + j) * 4 + e;
        float v;
        if constexpr (kGrouped) {
          float sum = 0.f;
#pragma unroll
          for (int q = 0; q < W; ++q) sum += __int_as_float(part[q][at][lane]);
          v = xs[min(m, M - 1)] * sum;
        } else {
          int sum = 0;
#pragma unroll
          for (int q = 0; q < W; ++q) sum += part[q][at][lane];
          v = static_cast<float>(sum) * xs[min(m, M - 1)] * ws[(e >> 1) ? nb[i] : na[i]];
        }
        if (n >= N || m >= M) continue;
        if constexpr (HAS_BIAS) v += bias[n];
        y[(size_t)m * N + n] = static_cast<T>(v);
      }
}

template <int NT, int W, int D, int RT, int GS, bool HAS_BIAS, typename T, typename ST,
          int WB = 8, typename OT = float>
__device__ __forceinline__ void gemv_mma(const int8_t* xq, const float* xs, const uint32_t* w,
                                         const ST* ws, const OT* wo, const float* bias, int M,
                                         int N, int K, T* y) {
  gemv_mma_rows<NT, W, D, RT, GS, HAS_BIAS, T, ST, WB, OT>(xq, xs, w, ws, wo, bias, M, N, K, y,
                                                           blockIdx.x * 16 * RT);
}

// Sibling weights fed the same x (q/k/v, gate/up) in one launch (gemv.cuh's GemvMembers):
// member g's blocks follow the previous members' (member g takes ceil(n[g] / (16 RT))
// blocks). Each output is computed as in the member's own launch, so the outputs equal
// the members' single launches bit for bit.
template <int NT, int W, int D, int RT, int GS, bool HAS_BIAS, typename T, typename ST, int G,
          int WB = 8, typename OT = float>
__device__ __forceinline__ void gemv_mma_group(const int8_t* xq, const float* xs,
                                               const GemvMembers<T, ST, G, OT>& ms, int M, int K) {
  int b = blockIdx.x;  // uniform per block: every thread takes the same member
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int blocks = (ms.n[g] + 16 * RT - 1) / (16 * RT);
    if (b < blocks) {
      gemv_mma_rows<NT, W, D, RT, GS, HAS_BIAS, T, ST, WB, OT>(
          xq, xs, ms.w[g], ms.ws[g], ms.wo[g], ms.bias[g], M, ms.n[g], K, ms.y[g], b * 16 * RT);
      return;
    }
    b -= blocks;
  }
}

}  // namespace w8a8

// @@ body channel
// xq [M, K] int8, xs [M, 1] f32, w [N, K/4] uint32 codes, ws [N] f32 -> y [M, N] T.
// (wo: no offsets, typed so that OT is float.)
w8a8::gemv_mma<NT, W, D, RT, 0, false, T, float>(xq, xs, w, ws, static_cast<const float*>(nullptr),
                                             nullptr, w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                             xq_shape[xq_ndim - 1], y);

// @@ body channel_bias
w8a8::gemv_mma<NT, W, D, RT, 0, true, T, float>(xq, xs, w, ws, static_cast<const float*>(nullptr),
                                            bias, w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                            xq_shape[xq_ndim - 1], y);

// @@ body grouped
// As `channel` but ws [N, G] scales (ST) and wo [N, G] f32 offsets.
w8a8::gemv_mma<NT, W, D, RT, GS, false, T, ST>(xq, xs, w, ws, wo, nullptr,
                                        w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                        xq_shape[xq_ndim - 1], y);

// @@ body grouped_bias
w8a8::gemv_mma<NT, W, D, RT, GS, true, T, ST>(xq, xs, w, ws, wo, bias, w8a8::rows(xq_shape, xq_ndim),
                                       w_shape[0], xq_shape[xq_ndim - 1], y);

// @@ body channel_group2
// Sibling launches: xq, xs as above; member g has w<g> codes, ws<g> (and wo<g>
// grouped, bias<g> with _bias) -> y<g> [M, N_g] T.
w8a8::gemv_mma_group<NT, W, D, RT, 0, false, T, float, 2>(
    xq, xs,
    w8a8::GemvMembers<T, float, 2>{{w0, w1}, {ws0, ws1}, {nullptr, nullptr}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body channel_group2_bias
w8a8::gemv_mma_group<NT, W, D, RT, 0, true, T, float, 2>(
    xq, xs,
    w8a8::GemvMembers<T, float, 2>{{w0, w1}, {ws0, ws1}, {nullptr, nullptr}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body channel_group3
w8a8::gemv_mma_group<NT, W, D, RT, 0, false, T, float, 3>(
    xq, xs,
    w8a8::GemvMembers<T, float, 3>{{w0, w1, w2}, {ws0, ws1, ws2}, {nullptr, nullptr, nullptr}, {nullptr, nullptr, nullptr}, {y0, y1, y2}, {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body channel_group3_bias
w8a8::gemv_mma_group<NT, W, D, RT, 0, true, T, float, 3>(
    xq, xs,
    w8a8::GemvMembers<T, float, 3>{{w0, w1, w2}, {ws0, ws1, ws2}, {nullptr, nullptr, nullptr}, {bias0, bias1, bias2}, {y0, y1, y2}, {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped_group2
w8a8::gemv_mma_group<NT, W, D, RT, GS, false, T, ST, 2>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 2>{{w0, w1}, {ws0, ws1}, {wo0, wo1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped_group2_bias
w8a8::gemv_mma_group<NT, W, D, RT, GS, true, T, ST, 2>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 2>{{w0, w1}, {ws0, ws1}, {wo0, wo1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped_group3
w8a8::gemv_mma_group<NT, W, D, RT, GS, false, T, ST, 3>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 3>{{w0, w1, w2}, {ws0, ws1, ws2}, {wo0, wo1, wo2}, {nullptr, nullptr, nullptr}, {y0, y1, y2}, {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped_group3_bias
w8a8::gemv_mma_group<NT, W, D, RT, GS, true, T, ST, 3>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 3>{{w0, w1, w2}, {ws0, ws1, ws2}, {wo0, wo1, wo2}, {bias0, bias1, bias2}, {y0, y1, y2}, {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped4
// 4-bit weights: xq [M, K] int8, xs [M, 1] f32, w [N, K/8] uint32 codes, ws / wo [N, G]
// scales and biases (ST) -> y [M, N] T.
w8a8::gemv_mma<NT, W, D, RT, GS, false, T, ST, 4, ST>(xq, xs, w, ws, wo, nullptr,
                                                  w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                                  xq_shape[xq_ndim - 1], y);

// @@ body grouped4_bias
w8a8::gemv_mma<NT, W, D, RT, GS, true, T, ST, 4, ST>(xq, xs, w, ws, wo, bias,
                                                 w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                                 xq_shape[xq_ndim - 1], y);

// @@ body grouped4_group2
w8a8::gemv_mma_group<NT, W, D, RT, GS, false, T, ST, 2, 4, ST>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 2, ST>{{w0, w1}, {ws0, ws1}, {wo0, wo1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped4_group2_bias
w8a8::gemv_mma_group<NT, W, D, RT, GS, true, T, ST, 2, 4, ST>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 2, ST>{{w0, w1}, {ws0, ws1}, {wo0, wo1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped4_group3
w8a8::gemv_mma_group<NT, W, D, RT, GS, false, T, ST, 3, 4, ST>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 3, ST>{{w0, w1, w2}, {ws0, ws1, ws2}, {wo0, wo1, wo2}, {nullptr, nullptr, nullptr}, {y0, y1, y2}, {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);

// @@ body grouped4_group3_bias
w8a8::gemv_mma_group<NT, W, D, RT, GS, true, T, ST, 3, 4, ST>(
    xq, xs,
    w8a8::GemvMembers<T, ST, 3, ST>{{w0, w1, w2}, {ws0, ws1, ws2}, {wo0, wo1, wo2}, {bias0, bias1, bias2}, {y0, y1, y2}, {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1]);
