// Int8 GEMM on the M5 GPU's neural accelerators: mpp::tensor_ops::matmul2d with an
// int8 x int8 -> int32 16x32x16 descriptor on cooperative tensors (Metal 4,
// macOS 26.2+). The int32 accumulator is exact for any K up to 2^17.
//
// Cooperative-tensor layout (the one MLX's steel/gemm/nax.h uses): a 16 x 16 fragment
// gives lane l the 8 elements (fm + 8 i, fn + j), i < 2, j < 4, at index 4 i + j, with
// qid = l / 4, fm = (qid & 4) | ((l / 2) & 3), fn = ((qid & 2) | (l & 1)) * 4. The left
// operand (16 x 16, rows m, columns k) is one fragment; the right operand (16 x 32, rows
// k, columns n) and the destination (16 x 32) are two fragments side by side, columns
// 0..15 at indices 0..7 and 16..31 at indices 8..15.
//
// Operands are read straight from device memory into fragments (no threadgroup memory,
// hence no barriers); elements outside M, N or K read as 0.
// MODE / template parameters / inputs / outputs: as simd_gemm.metal, except that
// grouped weights (MODE 2) fold each group's exact int32 sums every GS / 16 steps.
// Tile: 64 x 64 per threadgroup, 4 SIMD-groups (2 x 2) of 32 x 32 each.
// Grid: (ceil(N / 64) * 128, ceil(M / 64), 1), threadgroup (128, 1, 1).
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

// (row, column) of element `idx` (0..15) of a 16 x 32 pair of fragments for this lane.
METAL_FUNC short2 w8a8_nax_coord(uint lane, int idx) {
  const int qid = int(lane) >> 2;
  const int fm = (qid & 4) | ((int(lane) >> 1) & 3);
  const int fn = ((qid & 2) | (int(lane) & 1)) * 4;
  const int e = idx & 7;
  return short2(short((idx >> 3) * 16 + fn + (e & 3)), short(fm + (e >> 2) * 8));
}

// @@ body nax_gemm
constexpr int BM = 64, BN = 64;
const int M = a_shape[0];
const int K = a_shape[1];
const int N = b_shape[0];
const int G = MODE == 2 ? K / GS : 1;
const uint lane = thread_index_in_simdgroup;
const uint sg = simdgroup_index_in_threadgroup;
const int m_sg = int(threadgroup_position_in_grid.y) * BM + int(sg / 2) * 32;
const int n_sg = int(threadgroup_position_in_grid.x) * BN + int(sg % 2) * 32;

constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
    16, 32, 16, false, false, true,
    mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> op;
auto ct_a = op.get_left_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_b = op.get_right_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_c = op.get_destination_cooperative_tensor<
    metal::remove_addrspace_t<decltype(ct_a)>, metal::remove_addrspace_t<decltype(ct_b)>, int32_t>();

// This lane's accumulators: 2 row blocks (16 rows each) x 16 elements (32 columns).
int c[2][16];
float yf[2][16];
for (int mm = 0; mm < 2; ++mm) {
  for (int i = 0; i < 16; ++i) {
    c[mm][i] = 0;
    yf[mm][i] = 0.0f;
  }
}

for (int k0 = 0; k0 < K; k0 += 16) {
  // Right operand: element (k, n) is B[n_sg + n, k0 + k]; both 16-column fragments.
  for (int i = 0; i < 16; ++i) {
    const short2 rc = w8a8_nax_coord(lane, i);
    const int n = n_sg + rc.x, k = k0 + rc.y;
    ct_b[i] = int8_t((n < N && k < K) ? W8A8_WEIGHT(FLIP, b[size_t(n) * K + k]) : 0);
  }
  for (int mm = 0; mm < 2; ++mm) {
    // Left operand: element (m, k) is A[m_sg + 16 mm + m, k0 + k] (first fragment only).
    for (int i = 0; i < 8; ++i) {
      const short2 rc = w8a8_nax_coord(lane, i);
      const int m = m_sg + 16 * mm + rc.y, k = k0 + rc.x;
      ct_a[i] = (m < M && k < K) ? a[size_t(m) * K + k] : int8_t(0);
    }
    for (int i = 0; i < 16; ++i) {
      ct_c[i] = c[mm][i];
    }
    op.run(ct_a, ct_b, ct_c);  // SIMD-group collective: uniform control flow
    for (int i = 0; i < 16; ++i) {
      c[mm][i] = ct_c[i];
    }
  }
  if (MODE == 2 && (k0 + 16) % GS == 0) {
    // Group g complete: fold its exact sums into float32 and restart them at zero.
    const int g = k0 / GS;
    for (int mm = 0; mm < 2; ++mm) {
      for (int i = 0; i < 16; ++i) {
        const short2 rc = w8a8_nax_coord(lane, i);
        const int m = m_sg + 16 * mm + rc.y, n = n_sg + rc.x;
        if (m < M && n < N) {
          yf[mm][i] += ws[size_t(n) * G + g] * float(c[mm][i]) + wo[size_t(n) * G + g] * float(rs[size_t(m) * G + g]);
        }
        c[mm][i] = 0;
      }
    }
  }
}

for (int mm = 0; mm < 2; ++mm) {
  for (int i = 0; i < 16; ++i) {
    const short2 rc = w8a8_nax_coord(lane, i);
    const int m = m_sg + 16 * mm + rc.y, n = n_sg + rc.x;
    if (m < M && n < N) {
      const size_t o = size_t(m) * N + n;
      if (MODE == 0) {
        out[o] = TO(c[mm][i]);
      } else {
        float y = MODE == 1 ? float(c[mm][i]) * sa[m] * sw[n] : yf[mm][i] * sa[m];
        if (HAS_BIAS) {
          y += bias[n];
        }
        out[o] = OUT_BF16 ? TO(w8a8_bf16_bits(y)) : TO(y);
      }
    }
  }
}
