// Decode-size W8A8 linear (M <= 16): memory-bound over the stored affine weight codes.
//
// File layout: the text before the first "// @@ body" line is the `header=` of
// mx.fast.cuda_kernel; each "// @@ body NAME" line starts one kernel's `source=`.
// The "// @@ requires" lines below make the loader put quantize.cuh first (the fused
// kernels quantize x with its helpers; quantize_rows_block below), then gemv.cuh (the
// 4-bit codes' expansion, the sibling members).
// @@ requires quantize.cuh
// @@ requires gemv.cuh
//
// Math (the W8A8 contract of docs/numerics.md, on activations already quantized by the
// quantize kernel): per-channel weights accumulate sum_k xq[m, k] * (q[n, k] - 128) in
// int32 with dp4a and scale once; grouped weights fold every 16-byte chunk (16 codes,
// always inside one group because 16 divides GS) as s[n, g] * dot + b'[n, g] * sum(xq).
//
// Work split: a warp owns RW consecutive weight rows; lane l reads 16-byte chunks
// l, l + 32, ... of each row (a warp reads 512 contiguous bytes per row per step, fully
// coalesced), and the chunk of activation codes it needs for each of the MM rows of x
// (L1-resident: x is at most 16 x K bytes). Each activation chunk is reused for the RW
// weight rows. kUnroll chunks per row are loaded before any is used, so every warp keeps
// several 16-byte loads in flight (the kernel is latency/bandwidth bound).
//
// Entry points: `gemv` reads activation codes quantized by the quantize kernel (two
// launches); `gemv_fused` (one launch) has every block quantize all M rows of x into
// shared memory first (M * K bytes, at most a few tens of KiB; redundant across blocks,
// but x is tiny next to the weight and L2-resident) and then walks weight rows
// persistently (a grid of at most one block per SM); `gemv_fused_group` is gemv_fused for
// 2 or 3 weights fed the same x (sibling projections: q/k/v, gate/up) in one launch.
//
// 4-bit weights (WB == 4, MLX's affine 4-bit as stored: eight unsigned codes per uint32,
// code j of a word in bits 4j .. 4j + 3; ws [N, K/GS] scales, wo [N, K/GS] biases, both of
// the scales' type): a lane's 16-byte chunk holds 32 codes, expanded to bytes in registers
// (a mask, a shift and two byte permutes per word) and dotted with the 32 activation codes
// of the same features, folded per chunk as s[n, g] * dot + b[n, g] * sum(xq): the
// group-wise algebra with the codes unsigned and no 128 offset (docs/numerics.md, W4A8).
//
// Invariants the launcher guarantees: 1 <= M <= MM, K % 16 == 0 (K % GS == 0 grouped;
// 4-bit: GS a multiple of 32), rows 16-byte aligned, blockDim.x a multiple of 32; fused:
// dynamic shared memory holds MM * K bytes. Rows of x past M are read as row M - 1 and
// never stored; weight rows past N are read as row N - 1 and never stored.

namespace w8a8 {

// Quantize rows [0, M) of x into `q_out` (row stride K; shared or global memory) and
// their scales into `scale_out`, the whole block on one row at a time (each thread 8
// elements per step, so a decode row of a few thousand elements takes one or two steps).
// Used by the fused decode kernel (gemv.cu), whose blocks quantize x into shared memory.
// All threads of the block must call it (it synchronizes).
template <typename T>
__device__ __forceinline__ void quantize_rows_block(const T* x, int M, int K, int8_t* q_out,
                                                    float* scale_out) {
  __shared__ uint32_t warp_max[32];
  const int tid = threadIdx.x;
  const int chunks = K >> 3;
  for (int m = 0; m < M; ++m) {
    const T* xr = x + (size_t)m * K;
    AbsMax<T> amax;
    for (int c = tid; c < chunks; c += blockDim.x) amax.add(load_raw8(xr + c * 8));
    amax.reduce_block(warp_max);  // also makes warp_max reusable by the next row
    const RowQuantizer qz = RowQuantizer::of(amax.value());
    if (tid == 0) scale_out[m] = qz.s;
    for (int c = tid; c < chunks; c += blockDim.x) {
      float f[8];
      load8(xr + c * 8, f);
      qz.store_codes8(f, q_out + (size_t)m * K + c * 8);
    }
  }
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void store_out(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }

__device__ __forceinline__ int dot16(uint4 x, uint4 w, int acc) {
  // w holds uint8 codes; ^ 0x80 per byte turns code q into int8 q - 128.
  acc = __dp4a(static_cast<int>(x.x), static_cast<int>(w.x ^ 0x80808080u), acc);
  acc = __dp4a(static_cast<int>(x.y), static_cast<int>(w.y ^ 0x80808080u), acc);
  acc = __dp4a(static_cast<int>(x.z), static_cast<int>(w.z ^ 0x80808080u), acc);
  acc = __dp4a(static_cast<int>(x.w), static_cast<int>(w.w ^ 0x80808080u), acc);
  return acc;
}

// As dot16 for codes already in int8 range (4-bit codes expanded to bytes: 0..15).
__device__ __forceinline__ int dot16_codes(uint4 x, uint4 w, int acc) {
  acc = __dp4a(static_cast<int>(x.x), static_cast<int>(w.x), acc);
  acc = __dp4a(static_cast<int>(x.y), static_cast<int>(w.y), acc);
  acc = __dp4a(static_cast<int>(x.z), static_cast<int>(w.z), acc);
  return __dp4a(static_cast<int>(x.w), static_cast<int>(w.w), acc);
}

// A 16-byte chunk of packed 4-bit codes (32 codes) as two 16-byte chunks of byte codes.
__device__ __forceinline__ void expand_chunk4(uint4 w, uint4& first, uint4& second) {
  expand_word4(w.x, first.x, first.y);
  expand_word4(w.y, first.z, first.w);
  expand_word4(w.z, second.x, second.y);
  expand_word4(w.w, second.z, second.w);
}

__device__ __forceinline__ int sum16(uint4 x) {
  const int ones = 0x01010101;
  int s = __dp4a(static_cast<int>(x.x), ones, 0);
  s = __dp4a(static_cast<int>(x.y), ones, s);
  s = __dp4a(static_cast<int>(x.z), ones, s);
  return __dp4a(static_cast<int>(x.w), ones, s);
}

// The offsets' type is named by the caller or defaults (float): a `wo` of nullptr (the
// per-channel bodies) deduces nothing.
template <typename U>
struct NoDeduceT {
  using type = U;
};
template <typename U>
using NoDeduce = typename NoDeduceT<U>::type;

// GS == 0: per-channel (ws = [N] f32 scales, wo unused). GS > 0: grouped (ws = [N, K/GS]
// scales of type ST, wo = [N, K/GS] offsets of type OT: b + 128 s in f32 for 8-bit codes,
// the stored biases b for 4-bit ones, WB == 4). The warp handles weight rows n_first,
// n_first + n_stride, ... (RW at a time). xq / xs may point to shared memory.
template <int MM, int RW, int GS, bool HAS_BIAS, typename T, typename ST, int WB = 8,
          typename OT = float>
__device__ __forceinline__ void gemv_rows(const int8_t* xq, const float* xs, const uint32_t* w,
                                          const ST* ws, const NoDeduce<OT>* wo, const float* bias,
                                          int M, int N, int K, T* y, int n_first, int n_stride) {
  constexpr int kUnroll = 4;
  constexpr bool kGrouped = GS > 0;
  static_assert(WB == 8 || (WB == 4 && kGrouped && GS % 32 == 0),
                "4-bit codes are group-wise, a 16-byte chunk (32 codes) inside one group");
  const int lane = threadIdx.x & 31;
  const int chunks = K >> 4;                          // 16-byte chunks of a row of xq
  const int wchunks = WB == 4 ? K >> 5 : chunks;      // 16-byte chunks of a weight row
  const int groups = kGrouped ? K / GS : 1;
  const uint4* xrow[MM];
  float xscale[MM];
#pragma unroll
  for (int m = 0; m < MM; ++m) {
    xrow[m] = reinterpret_cast<const uint4*>(xq) + (size_t)min(m, M - 1) * chunks;
    xscale[m] = xs[min(m, M - 1)];
  }

  for (int n0 = n_first; n0 < N; n0 += n_stride) {  // uniform per warp
    const uint4* wrow[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r)
      wrow[r] = reinterpret_cast<const uint4*>(w) + (size_t)min(n0 + r, N - 1) * wchunks;

    int iacc[RW][MM];
    float facc[RW][MM];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        iacc[r][m] = 0;
        facc[r][m] = 0.f;
      }

    for (int c0 = lane; c0 < wchunks; c0 += 32 * kUnroll) {
      uint4 wv[kUnroll][RW];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 32;
#pragma unroll
        for (int r = 0; r < RW; ++r)
          wv[u][r] = c < wchunks ? __ldg(wrow[r] + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 32;
        if (c >= wchunks) break;
        if constexpr (!kGrouped) {
#pragma unroll
          for (int m = 0; m < MM; ++m) {
            const uint4 xv = xrow[m][c];
#pragma unroll
            for (int r = 0; r < RW; ++r) iacc[r][m] = dot16(xv, wv[u][r], iacc[r][m]);
          }
        } else if constexpr (WB == 4) {
          // Chunk c: codes 32c .. 32c + 31 of the row, all in group g (32 divides GS);
          // their activation codes are xq's 16-byte chunks 2c and 2c + 1.
          const int g = (c * 32) / GS;
          float s[RW], o[RW];
          uint4 first[RW], second[RW];
#pragma unroll
          for (int r = 0; r < RW; ++r) {
            const int n = min(n0 + r, N - 1);
            s[r] = to_float(ws[(size_t)n * groups + g]);
            o[r] = to_float(wo[(size_t)n * groups + g]);
            expand_chunk4(wv[u][r], first[r], second[r]);
          }
#pragma unroll
          for (int m = 0; m < MM; ++m) {
            const uint4 x0 = xrow[m][2 * c];
            const uint4 x1 = xrow[m][2 * c + 1];
            const float xsum = biased_to_float(sum16(x0) + sum16(x1) + kBiased);
#pragma unroll
            for (int r = 0; r < RW; ++r) {
              const int dot = dot16_codes(x1, second[r], dot16_codes(x0, first[r], kBiased));
              facc[r][m] += s[r] * biased_to_float(dot) + o[r] * xsum;
            }
          }
        } else {
          const int g = (c * 16) / GS;
          float s[RW], o[RW];
#pragma unroll
          for (int r = 0; r < RW; ++r) {
            const int n = min(n0 + r, N - 1);
            s[r] = to_float(ws[(size_t)n * groups + g]);
            o[r] = wo[(size_t)n * groups + g];
          }
#pragma unroll
          for (int m = 0; m < MM; ++m) {
            const uint4 xv = xrow[m][c];
            const float xsum = biased_to_float(sum16(xv) + kBiased);
#pragma unroll
            for (int r = 0; r < RW; ++r)
              facc[r][m] += s[r] * biased_to_float(dot16(xv, wv[u][r], kBiased)) + o[r] * xsum;
          }
        }
      }
    }

    // Butterfly reduction: afterwards every lane holds every (r, m) total.
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int m = 0; m < MM; ++m)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          if constexpr (!kGrouped) iacc[r][m] += __shfl_xor_sync(0xffffffffu, iacc[r][m], o);
          else facc[r][m] += __shfl_xor_sync(0xffffffffu, facc[r][m], o);
        }

#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const int n = n0 + r;
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        // One lane per output; (r * MM + m) % 32 spreads the stores over the warp.
        if (lane != ((r * MM + m) & 31) || n >= N || m >= M) continue;
        float v;
        if constexpr (!kGrouped) v = static_cast<float>(iacc[r][m]) * xscale[m] * to_float(ws[n]);
        else v = xscale[m] * facc[r][m];
        if constexpr (HAS_BIAS) v += bias[n];
        store_out(y + (size_t)m * N + n, v);
      }
    }
  }
}

// Two launches: xq / xs from the quantize kernel; one pass over the rows.
template <int MM, int RW, int GS, bool HAS_BIAS, typename T, typename ST, int WB = 8,
          typename OT = float>
__device__ __forceinline__ void gemv(const int8_t* xq, const float* xs, const uint32_t* w,
                                     const ST* ws, const NoDeduce<OT>* wo, const float* bias,
                                     int M, int N, int K, T* y) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int warps = (gridDim.x * blockDim.x) >> 5;
  gemv_rows<MM, RW, GS, HAS_BIAS, T, ST, WB, OT>(xq, xs, w, ws, wo, bias, M, N, K, y,
                                                 warp * RW, warps * RW);
}

// One launch: the block quantizes x (float, T) into shared memory, then the warps walk
// the weight rows. Hazard: the __syncthreads between the two phases is what makes every
// warp see every row's codes and scale.
template <int MM, int RW, int GS, bool HAS_BIAS, typename T, typename ST, int WB = 8,
          typename OT = float>
__device__ __forceinline__ void gemv_fused(const T* x, const uint32_t* w, const ST* ws,
                                           const NoDeduce<OT>* wo, const float* bias, int M, int N,
                                           int K, T* y) {
  extern __shared__ __align__(16) unsigned char w8a8_smem[];
  __shared__ float x_scale[MM];
  int8_t* xq = reinterpret_cast<int8_t*>(w8a8_smem);
  quantize_rows_block<T>(x, M, K, xq, x_scale);
  __syncthreads();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int warps = (gridDim.x * blockDim.x) >> 5;
  gemv_rows<MM, RW, GS, HAS_BIAS, T, ST, WB, OT>(xq, x_scale, w, ws, wo, bias, M, N, K, y,
                                                 warp * RW, warps * RW);
}

// gemv_fused for G weights in one launch: x is quantized once per block, then the warps
// walk the members' rows as if they were one weight of N = sum n[g] rows (global step
// s = the member's first step + its local step goes to warp s % warps, so the work is
// dealt exactly as the summed weight's would be when each n[g] is a multiple of RW).
// Each output element is computed by the same gemv_rows code as the member's own launch,
// so the outputs equal the members' single launches bit for bit.
template <int MM, int RW, int GS, bool HAS_BIAS, typename T, typename ST, int G, int WB = 8,
          typename OT = float>
__device__ __forceinline__ void gemv_fused_group(const T* x,
                                                 const GemvMembers<T, ST, G, OT>& ms, int M,
                                                 int K) {
  extern __shared__ __align__(16) unsigned char w8a8_smem[];
  __shared__ float x_scale[MM];
  int8_t* xq = reinterpret_cast<int8_t*>(w8a8_smem);
  quantize_rows_block<T>(x, M, K, xq, x_scale);
  __syncthreads();  // every warp reads every row's codes and scale (hazard as gemv_fused)
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int warps = (gridDim.x * blockDim.x) >> 5;
  int first = 0;  // steps of RW rows before member g
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int start = ((warp - first % warps) + warps) % warps;
    gemv_rows<MM, RW, GS, HAS_BIAS, T, ST, WB, OT>(xq, x_scale, ms.w[g], ms.ws[g], ms.wo[g],
                                                   ms.bias[g], M, ms.n[g], K, ms.y[g],
                                                   start * RW, warps * RW);
    first += (ms.n[g] + RW - 1) / RW;
  }
}

}  // namespace w8a8

// @@ body channel
// xq [M, K] int8, xs [M, 1] f32, w [N, K/4] uint32 codes, ws [N] f32 -> y [M, N] T.
w8a8::gemv<MM, RW, 0, false, T, float>(xq, xs, w, ws, nullptr, nullptr, w8a8::rows(xq_shape, xq_ndim),
                                       w_shape[0], xq_shape[xq_ndim - 1], y);

// @@ body channel_bias
w8a8::gemv<MM, RW, 0, true, T, float>(xq, xs, w, ws, nullptr, bias, w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                      xq_shape[xq_ndim - 1], y);

// @@ body grouped
// As `channel` but ws [N, G] scales (ST) and wo [N, G] f32 offsets.
w8a8::gemv<MM, RW, GS, false, T, ST>(xq, xs, w, ws, wo, nullptr, w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                     xq_shape[xq_ndim - 1], y);

// @@ body grouped_bias
w8a8::gemv<MM, RW, GS, true, T, ST>(xq, xs, w, ws, wo, bias, w8a8::rows(xq_shape, xq_ndim), w_shape[0],
                                    xq_shape[xq_ndim - 1], y);

// @@ body fused_channel
// x [M, K] float (T), w [N, K/4] uint32 codes, ws [N] f32 -> y [M, N] T.
w8a8::gemv_fused<MM, RW, 0, false, T, float>(x, w, ws, nullptr, nullptr, w8a8::rows(x_shape, x_ndim),
                                             w_shape[0], x_shape[x_ndim - 1], y);

// @@ body fused_channel_bias
w8a8::gemv_fused<MM, RW, 0, true, T, float>(x, w, ws, nullptr, bias, w8a8::rows(x_shape, x_ndim), w_shape[0],
                                            x_shape[x_ndim - 1], y);

// @@ body fused_grouped
// x [M, K] float (T), w codes, ws [N, G] scales (ST), wo [N, G] f32 offsets.
w8a8::gemv_fused<MM, RW, GS, false, T, ST>(x, w, ws, wo, nullptr, w8a8::rows(x_shape, x_ndim), w_shape[0],
                                           x_shape[x_ndim - 1], y);

// @@ body fused_grouped_bias
w8a8::gemv_fused<MM, RW, GS, true, T, ST>(x, w, ws, wo, bias, w8a8::rows(x_shape, x_ndim), w_shape[0],
                                          x_shape[x_ndim - 1], y);

// @@ body fused_channel_group2
// Sibling launches of the fused kernels: x [M, K] float (T); member g has w<g> codes,
// ws<g> (and wo<g> grouped, bias<g> with _bias) -> y<g> [M, N_g] T.
w8a8::gemv_fused_group<MM, RW, 0, false, T, float, 2>(
    x, w8a8::GemvMembers<T, float, 2>{
        {w0, w1},
        {ws0, ws1},
        {nullptr, nullptr},
        {nullptr, nullptr},
        {y0, y1},
        {w0_shape[0], w1_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_channel_group2_bias
w8a8::gemv_fused_group<MM, RW, 0, true, T, float, 2>(
    x, w8a8::GemvMembers<T, float, 2>{
        {w0, w1},
        {ws0, ws1},
        {nullptr, nullptr},
        {bias0, bias1},
        {y0, y1},
        {w0_shape[0], w1_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_channel_group3
w8a8::gemv_fused_group<MM, RW, 0, false, T, float, 3>(
    x, w8a8::GemvMembers<T, float, 3>{
        {w0, w1, w2},
        {ws0, ws1, ws2},
        {nullptr, nullptr, nullptr},
        {nullptr, nullptr, nullptr},
        {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_channel_group3_bias
w8a8::gemv_fused_group<MM, RW, 0, true, T, float, 3>(
    x, w8a8::GemvMembers<T, float, 3>{
        {w0, w1, w2},
        {ws0, ws1, ws2},
        {nullptr, nullptr, nullptr},
        {bias0, bias1, bias2},
        {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped_group2
w8a8::gemv_fused_group<MM, RW, GS, false, T, ST, 2>(
    x, w8a8::GemvMembers<T, ST, 2>{
        {w0, w1},
        {ws0, ws1},
        {wo0, wo1},
        {nullptr, nullptr},
        {y0, y1},
        {w0_shape[0], w1_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped_group2_bias
w8a8::gemv_fused_group<MM, RW, GS, true, T, ST, 2>(
    x, w8a8::GemvMembers<T, ST, 2>{
        {w0, w1},
        {ws0, ws1},
        {wo0, wo1},
        {bias0, bias1},
        {y0, y1},
        {w0_shape[0], w1_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped_group3
w8a8::gemv_fused_group<MM, RW, GS, false, T, ST, 3>(
    x, w8a8::GemvMembers<T, ST, 3>{
        {w0, w1, w2},
        {ws0, ws1, ws2},
        {wo0, wo1, wo2},
        {nullptr, nullptr, nullptr},
        {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped_group3_bias
w8a8::gemv_fused_group<MM, RW, GS, true, T, ST, 3>(
    x, w8a8::GemvMembers<T, ST, 3>{
        {w0, w1, w2},
        {ws0, ws1, ws2},
        {wo0, wo1, wo2},
        {bias0, bias1, bias2},
        {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body grouped4
// 4-bit weights: xq [M, K] int8, xs [M, 1] f32, w [N, K/8] uint32 codes, ws / wo [N, G]
// scales and biases (ST) -> y [M, N] T.
w8a8::gemv<MM, RW, GS, false, T, ST, 4, ST>(xq, xs, w, ws, wo, nullptr, w8a8::rows(xq_shape, xq_ndim),
                                            w_shape[0], xq_shape[xq_ndim - 1], y);

// @@ body grouped4_bias
w8a8::gemv<MM, RW, GS, true, T, ST, 4, ST>(xq, xs, w, ws, wo, bias, w8a8::rows(xq_shape, xq_ndim),
                                           w_shape[0], xq_shape[xq_ndim - 1], y);

// @@ body fused_grouped4
// 4-bit weights: x [M, K] float (T), w codes, ws / wo [N, G] scales and biases (ST).
w8a8::gemv_fused<MM, RW, GS, false, T, ST, 4, ST>(x, w, ws, wo, nullptr, w8a8::rows(x_shape, x_ndim),
                                                  w_shape[0], x_shape[x_ndim - 1], y);

// @@ body fused_grouped4_bias
w8a8::gemv_fused<MM, RW, GS, true, T, ST, 4, ST>(x, w, ws, wo, bias, w8a8::rows(x_shape, x_ndim),
                                                 w_shape[0], x_shape[x_ndim - 1], y);

// @@ body fused_grouped4_group2
w8a8::gemv_fused_group<MM, RW, GS, false, T, ST, 2, 4, ST>(
    x, w8a8::GemvMembers<T, ST, 2, ST>{
        {w0, w1},
        {ws0, ws1},
        {wo0, wo1},
        {nullptr, nullptr},
        {y0, y1},
        {w0_shape[0], w1_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped4_group2_bias
w8a8::gemv_fused_group<MM, RW, GS, true, T, ST, 2, 4, ST>(
    x, w8a8::GemvMembers<T, ST, 2, ST>{
        {w0, w1},
        {ws0, ws1},
        {wo0, wo1},
        {bias0, bias1},
        {y0, y1},
        {w0_shape[0], w1_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped4_group3
w8a8::gemv_fused_group<MM, RW, GS, false, T, ST, 3, 4, ST>(
    x, w8a8::GemvMembers<T, ST, 3, ST>{
        {w0, w1, w2},
        {ws0, ws1, ws2},
        {wo0, wo1, wo2},
        {nullptr, nullptr, nullptr},
        {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);

// @@ body fused_grouped4_group3_bias
w8a8::gemv_fused_group<MM, RW, GS, true, T, ST, 3, 4, ST>(
    x, w8a8::GemvMembers<T, ST, 3, ST>{
        {w0, w1, w2},
        {ws0, ws1, ws2},
        {wo0, wo1, wo2},
        {bias0, bias1, bias2},
        {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}},
    w8a8::rows(x_shape, x_ndim), x_shape[x_ndim - 1]);
