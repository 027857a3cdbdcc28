// The subnormal promotion's bodies (SUB: gemm_grouped_ws.cu's mainloop with the
// promotion of its "subnormal promotion" paragraph): the group-wise TMA GEMM's header,
// then wgmma_rs.cuh for the offset blocks' register-A wgmma. A file of its own so that
// gemm_grouped_ws.cu's bodies compile without that header (see the declarations there).
// @@ requires gemm_grouped_ws.cu
// @@ requires wgmma_rs.cuh

// @@ body tma_subnormal
// The subnormal promotion (SUB) with code width WB: xq [..., K] uint8 codes a + 128 (the
// quantize's sums_u8 body), xs, xr as tma_grouped; wt: gemm_grouped.subnormal_terms.
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 1, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {nullptr}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_subnormal_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 1, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 1>{{reinterpret_cast<const int8_t*>(w)}, {wt}, {bias}, {y},
                               {w_shape[0]}, {wmap}});

// @@ body tma_subnormal_group2
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 2, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {nullptr, nullptr}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_subnormal_group2_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 2, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 2>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1)},
        {wt0, wt1}, {bias0, bias1}, {y0, y1}, {w0_shape[0], w1_shape[0]}, {wmap0, wmap1}});

// @@ body tma_subnormal_group3
w8a8::gemm_grouped_ws<false, T, BN, STAGES, PW, GS, 3, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {nullptr, nullptr, nullptr}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});

// @@ body tma_subnormal_group3_bias
w8a8::gemm_grouped_ws<true, T, BN, STAGES, PW, GS, 3, WB, false, false, false, 0, true, GB>(
    reinterpret_cast<const int8_t*>(xq), w8a8::rows(xq_shape, xq_ndim), xq_shape[xq_ndim - 1], xs, xr,
    w8a8::GroupedMembers<T, 3>{
        {reinterpret_cast<const int8_t*>(w0), reinterpret_cast<const int8_t*>(w1),
         reinterpret_cast<const int8_t*>(w2)},
        {wt0, wt1, wt2}, {bias0, bias1, bias2}, {y0, y1, y2},
        {w0_shape[0], w1_shape[0], w2_shape[0]}, {wmap0, wmap1, wmap2}});
