"""``bench/gpu_timeline.py``'s arithmetic on recorded kernels (no GPU, no profiler): the
busy time is the union of the kernel intervals (concurrent kernels counted once), idle
is the rest of the span, and kernel names fall into the categories its report uses."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import gpu_timeline  # noqa: E402


def test_busy_is_the_union_of_overlapping_kernels():
    # [0, 10) and [5, 12) overlap (concurrent graph branches), [3, 4) nests inside the
    # first, [20, 25) stands alone: busy 12 + 5 = 17, span 25, idle 8.
    ks = [("a", 0.0, 10.0), ("b", 3.0, 1.0), ("c", 5.0, 7.0), ("d", 20.0, 5.0)]
    row = gpu_timeline.summarize(ks, 1e-3)
    assert row["busy_us"] == pytest.approx(17.0)
    assert row["span_us"] == pytest.approx(25.0)
    assert row["idle_us"] == pytest.approx(8.0)
    assert row["kernels"] == 4 and row["wall_us"] == pytest.approx(1000.0)
    # the per-name sums are kernel durations, overlaps included
    assert sum(v["us"] for v in row["names"].values()) == pytest.approx(23.0)


def test_touching_and_disjoint_kernels():
    row = gpu_timeline.summarize([("a", 0.0, 2.0), ("b", 2.0, 3.0), ("c", 9.0, 1.0)], 0.0)
    assert (row["busy_us"], row["span_us"], row["idle_us"]) == pytest.approx((6.0, 10.0, 4.0))
    assert gpu_timeline.summarize([], 0.5) == {"wall_us": 500000.0, "kernels": 0}


@pytest.mark.parametrize("name, cat", [
    ("mlx::core::cu::custom_kernel_w8a8_gemm_ws_tma_channel_u8_3e6_bfloat16_t_256_4_1", "w8a8 gemm"),
    ("mlx::core::cu::custom_kernel_w8a8_quantize_rowsum_f78_bfloat16_t", "w8a8 quantize"),
    ("mlx::core::cu::custom_kernel_w8a8_gemv_fused_channel_ab1_bfloat16_t_1_4", "w8a8 gemv"),
    ("void mlx::core::cu::qmm_sm80_kernel<64, cutlass::bfloat16_t>", "mlx qmm"),
    ("void mlx::core::cu::qmv_kernel<8, 8, 64, true>", "mlx qmm"),
    ("void mlx::core::cu::gemv_single<__nv_bfloat16, 8, 4>", "mlx gemv"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "cublas"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
    ("void mlx::core::cu::rms_norm_small<__nv_bfloat16, 128>", "other"),
])
def test_categories(name, cat):
    assert gpu_timeline.category(name) == cat
