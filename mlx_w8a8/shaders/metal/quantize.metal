// Per-token activation quantization, one threadgroup (NT threads) per row.
//
// Contract (docs/numerics.md): amax = max|x|, scale = amax / 127 (IEEE division),
// q = clip(rint(x / scale), -127, 127) (IEEE division, round half to even); an all-zero
// row gives scale 0 and q 0; a row holding NaN or +-Inf gives scale NaN and q 0.
// With GS > 0 also the per-group row sums R[m, g] = sum_{k in group g} q[m, k].
// With AG (activation groups, GS > 0) each group of GS values is quantized by itself:
// its own amax and scale (scale [M, K / GS]), the same rules per group.
//
// Template parameters: T (x's element type; uint16_t carries bfloat16 bits), BF16,
// NT (threads per group, a multiple of 32), GS (group size, 0 for no sums), AG.
// Inputs: x [M, K]. Outputs: q [M, K] int8, scale [M, 1] float ([M, K / GS] with AG),
// rs [M, max(1, K/GS)].
// Grid: (NT, M, 1), threadgroup (NT, 1, 1).

// @@ body quantize
const int K = x_shape[1];
const uint row = threadgroup_position_in_grid.y;
const uint tid = thread_position_in_threadgroup.x;
const uint lane = thread_index_in_simdgroup;
const uint sg = simdgroup_index_in_threadgroup;
constexpr uint NSG = NT / 32;
const size_t base = size_t(row) * size_t(K);

// Pass 1: amax over finite values and a flag for any non-finite one. The flag is
// separate because max() ignores NaN (fmax semantics), so NaN could not travel in it.
float amax = 0.0f;
uint bad = 0;
for (int k = int(tid); k < (AG ? 0 : K); k += int(NT)) {  // AG: the scales are per group
  float v = W8A8_LOAD_F(BF16, x, base + k);
  if (isfinite(v)) {
    amax = max(amax, fabs(v));
  } else {
    bad = 1;
  }
}
amax = simd_max(amax);
bad = simd_max(bad);
threadgroup float part_max[NSG];
threadgroup uint part_bad[NSG];
if (lane == 0) {
  part_max[sg] = amax;
  part_bad[sg] = bad;
}
// Hazard: every SIMD-group's partial must be written before any thread reads them.
// The arrays are written once per dispatch, so no second barrier is needed.
threadgroup_barrier(mem_flags::mem_threadgroup);
amax = part_max[0];
bad = part_bad[0];
for (uint s = 1; s < NSG; ++s) {
  amax = max(amax, part_max[s]);
  bad = max(bad, part_bad[s]);
}
const float s_row = bad ? w8a8_nan() : precise::divide(amax, 127.0f);
const bool usable = (bad == 0) && (amax > 0.0f);
if (!AG && tid == 0) {
  scale[row] = s_row;
}

// Pass 2: codes, in chunks of CH elements; SIMD-group sg takes chunks sg, sg + NSG, ...
// so a chunk (one weight group when GS > 0) is summed by one SIMD-group.
// simd_sum sits in control flow that is uniform across the SIMD-group (the chunk loop
// depends on sg only), as Metal requires.
constexpr int CH = GS > 0 ? GS : 256;
const int nchunks = (K + CH - 1) / CH;
for (int c = int(sg); c < nchunks; c += int(NSG)) {
  float s_use = s_row;
  bool use = usable;
  if (AG) {  // this group's amax over its SIMD-group's lanes (uniform control flow)
    float gmax = 0.0f;
    uint gbad = 0;
    for (int j = int(lane); j < GS; j += 32) {  // AG: CH == GS and K % GS == 0
      const float v = W8A8_LOAD_F(BF16, x, base + c * GS + j);
      if (isfinite(v)) {
        gmax = max(gmax, fabs(v));
      } else {
        gbad = 1;
      }
    }
    gmax = simd_max(gmax);
    gbad = simd_max(gbad);
    s_use = gbad ? w8a8_nan() : precise::divide(gmax, 127.0f);
    use = (gbad == 0) && (gmax > 0.0f);
    if (lane == 0) {
      scale[size_t(row) * size_t(nchunks) + c] = s_use;
    }
  }
  int sum = 0;
  for (int j = int(lane); j < CH; j += 32) {
    const int k = c * CH + j;
    if (k < K) {
      int qv = 0;
      if (use) {
        float v = W8A8_LOAD_F(BF16, x, base + k);
        qv = int(clamp(rint(precise::divide(v, s_use)), -127.0f, 127.0f));
      }
      q[base + k] = int8_t(qv);
      sum += qv;
    }
  }
  if (GS > 0) {
    sum = simd_sum(sum);
    if (lane == 0) {
      rs[size_t(row) * size_t(nchunks) + c] = sum;
    }
  }
}
if (GS == 0 && tid == 0) {
  rs[row] = 0;  // the unused sums output is defined, never left uninitialised
}
