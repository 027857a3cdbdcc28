"""Shape presets, MxNxK parsing and M buckets of the tuner."""

import pytest

from mlx_w8a8.tuning import shapes


def test_presets_are_the_published_projection_shapes():
    # Llama-3-8B / Mistral-7B (hidden 4096, MLP 14336) and Qwen2.5-7B (3584, 18944):
    # a wrong number here would tune shapes no model runs.
    assert shapes.preset("mlp") == [(14336, 4096), (4096, 14336), (18944, 3584), (3584, 18944)]
    assert shapes.preset("attn") == [(4096, 4096), (1024, 4096), (3584, 3584), (512, 3584)]
    allp = shapes.preset("all")
    assert len(allp) == len(set(allp)) == 8  # duplicates (Mistral = Llama) measured once


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown shape preset 'mlps'.*mlp"):
        shapes.preset("mlps")


def test_expand_crosses_presets_with_m_and_keeps_explicit_m():
    out = shapes.expand(["mlp", "3x64x32"], [1, 16])
    assert out[:2] == [(1, 14336, 4096), (16, 14336, 4096)]
    assert out[-1] == (3, 64, 32)
    assert len(out) == 9
    # a comma inside one argument separates too, duplicates collapse
    assert shapes.expand(["2x8x8,2x8x8"]) == [(2, 8, 8)]
    assert shapes.expand(["attn"]) == [(m, n, k) for n, k in shapes.preset("attn") for m in shapes.default_m()]


@pytest.mark.parametrize("text", ["4096x4096", "0x8x8", "ax8x8", "1x8x8x8", ""])
def test_malformed_shapes_are_rejected(text):
    with pytest.raises(ValueError, match="MxNxK"):
        shapes.expand([text]) if text else shapes.parse_shape(text)


def test_m_list_parsing():
    assert shapes.parse_m_list("16, 1,16,128") == [1, 16, 128]
    for bad in ("0", "-1", "a", ","):
        with pytest.raises(ValueError, match="--m"):
            shapes.parse_m_list(bad)


def test_bucket_is_next_power_of_two_capped():
    assert [shapes.bucket(m) for m in (1, 2, 3, 4, 5, 100, 128, 129)] == [1, 2, 4, 4, 8, 128, 128, 256]
    assert shapes.bucket(10**6) == shapes.M_CAP
    assert shapes.bucket(300, cap=256) == 256
    with pytest.raises(ValueError, match="M must be >= 1"):
        shapes.bucket(0)


def test_nearest_bucket_snaps_in_log_space():
    measured = [1, 16, 512]
    assert shapes.nearest_bucket(1, measured) == 1
    assert shapes.nearest_bucket(3, [2, 8]) == 8         # bucket 4: a tie goes to the larger
    # bucket 2 is 1 octave from 1 and 3 from 16, but the M = 1 bucket speaks only for M = 1
    assert shapes.nearest_bucket(2, measured) == 16
    assert shapes.nearest_bucket(1, [2, 16]) is None     # and M = 1 hears only it
    assert shapes.nearest_bucket(5, measured) == 16      # bucket 8: 3 from 1, 1 from 16
    assert shapes.nearest_bucket(100, measured) == 512   # bucket 128: 3 from 16, 2 from 512
    assert shapes.nearest_bucket(4000, measured) == 512
    assert shapes.nearest_bucket(7, []) is None


def test_default_m_covers_decode_and_prefill_on_a_gpu_and_is_short_on_a_cpu():
    gpu = shapes.default_m("cuda")
    assert gpu[0] == 1 and gpu[-1] == 4096 and len(gpu) == 13
    assert all(b == 2 * a for a, b in zip(gpu, gpu[1:]))  # every power of two in between
    assert shapes.default_m("metal") == gpu
    assert shapes.default_m("cpu") == shapes.CPU_M == (1, 4)


def test_gpu_default_measures_the_batched_decode_of_a_server():
    # mlx-lm's server decodes up to --decode-concurrency (default 32) sequences at once:
    # M = 2 ... 64 rows per linear. Each must be a measured bucket on a GPU (tune --model
    # measures default_m()), not borrowed from M = 1 or a prefill bucket.
    assert shapes.DECODE_BATCH_M == (2, 4, 8, 16, 32, 64)
    gpu = shapes.default_m("cuda")
    assert set(shapes.DECODE_BATCH_M) <= set(gpu)
    assert [shapes.nearest_bucket(m, gpu) for m in (2, 3, 17, 32, 33, 64)] == [2, 4, 32, 32, 64, 64]
    # The CPU keeps its short default (see CPU_M): batched decode is a GPU default only.
    assert shapes.default_m("cpu") == (1, 4)


def test_tp_splits_column_parallel_n_and_row_parallel_k():
    # Llama-3-8B at tp=4: q 4096x4096 -> 1024x4096, k 1024 -> 256, gate/up 14336 ->
    # 3584 (column-parallel, N split); o and down keep N and split K (row-parallel)
    assert shapes.split_for_tp("q_proj", 4096, 4096, 4) == (1024, 4096)
    assert shapes.split_for_tp("k_proj", 1024, 4096, 4) == (256, 4096)
    assert shapes.split_for_tp("up_proj", 14336, 4096, 4) == (3584, 4096)
    assert shapes.split_for_tp("o_proj", 4096, 4096, 4) == (4096, 1024)
    assert shapes.split_for_tp("down_proj", 4096, 14336, 4) == (4096, 3584)
    # lm_head is not sharded by mlx-lm's shard(): unchanged
    assert shapes.split_for_tp("lm_head", 128256, 4096, 4) == (128256, 4096)
    assert shapes.split_for_tp("q_proj", 4096, 4096, 1) == (4096, 4096)
    with pytest.raises(ValueError, match="k_proj.*not divisible by 3"):
        shapes.split_for_tp("k_proj", 1024, 4096, 3)
    with pytest.raises(ValueError, match="tp must be a positive int"):
        shapes.split_for_tp("q_proj", 8, 8, 0)
