"""``bench/launch_diff.py``: two recordings of CUDA launches compare equal only where every
recorded argument, verdict and key does."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import launch_diff  # noqa: E402


def _doc(grid=(1024, 1, 1), source="body A", verdict=True):
    launch = dict(name="w8a8_gemm_ws_group2_0123456789ab", source="s1", header="h1",
                  inputs=["xa", "w0", "ws0"], outputs=["y0", "y1"], shared_memory=4096,
                  row_contiguous=True, arrays=[[[8, 64], "mlx.core.int8"]],
                  template=[["T", "mlx.core.bfloat16"]], grid=list(grid),
                  threadgroup=[384, 1, 1], output_shapes=[[8, 32], [8, 16]],
                  output_dtypes=["mlx.core.bfloat16"] * 2, init_value=None)
    return {"records": {"sm90|cuda_w8a8_gemm_ws|bind|P|None": [launch],
                        "cuda_w8a8_gemm_ws|supports|P": verdict},
            "texts": {"s1": source, "h1": "header"}}


def test_equal_recordings_are_the_same():
    assert launch_diff.compare(_doc(), _doc()) == []


def test_a_grid_a_source_text_or_a_verdict_that_differs_is_reported():
    lines = launch_diff.compare(_doc(), _doc(grid=(2048, 1, 1)))
    assert any("launch 0 grid: [1024, 1, 1] -> [2048, 1, 1]" in line for line in lines)
    assert lines[-1] == "1 of 2 keys differ"
    old, new = _doc(), _doc(source="body B")
    new["records"]["sm90|cuda_w8a8_gemm_ws|bind|P|None"][0]["source"] = "s2"
    new["texts"]["s2"] = "body B"
    lines = launch_diff.compare(old, new)
    assert any("launch 0 source:" in line and "+body B" in line for line in lines), lines
    lines = launch_diff.compare(_doc(), _doc(verdict=False))
    assert any("supports" in line for line in lines) and lines[-1] == "1 of 2 keys differ"


def test_a_launch_missing_from_one_tree_is_reported():
    new = _doc()
    new["records"]["sm90|cuda_w8a8_gemm_ws|bind|P|None"] = []
    lines = launch_diff.compare(_doc(), new)
    assert any("1 launches -> 0" in line for line in lines), lines
    new = _doc()
    del new["records"]["cuda_w8a8_gemm_ws|supports|P"]
    assert any("only in the first tree" in line for line in launch_diff.compare(_doc(), new))


def test_the_tally_counts_only_differing_keys_by_candidate_and_m():
    """A launch differing at one M and a verdict at another are counted apart; equal keys
    and keys without an M are not lost (``?``)."""
    old, new = _doc(), _doc()
    for doc, grid in ((old, [1024, 1, 1]), (new, [2048, 1, 1])):
        launch = dict(doc["records"]["sm90|cuda_w8a8_gemm_ws|bind|P|None"][0], grid=grid)
        doc["records"]["sm90|cuda_w8a8_gemm_tma|run|Problem(m=17, n=8)"] = [launch]
        doc["records"]["sm90|cuda_w8a8_gemm_tma|run|Problem(m=128, n=8)"] = [old["records"][
            "sm90|cuda_w8a8_gemm_ws|bind|P|None"][0]]
    new["records"]["cuda_w8a8_gemm_ws|supports|P"] = False
    assert launch_diff.tally(old, new) == "cuda_w8a8_gemm_tma M=17: 1; cuda_w8a8_gemm_ws M=?: 1"
    assert launch_diff.tally(old, old) == ""


def test_the_field_tally_names_what_differs_per_candidate():
    """A launch whose grid changed is told apart from one whose header alone changed, a
    changed launch count and a changed verdict are named as such, and equal keys are not
    counted."""
    old, new = _doc(), _doc()
    base = old["records"]["sm90|cuda_w8a8_gemm_ws|bind|P|None"][0]
    old["records"]["sm90|cuda_w8a8_gemm_tma|run|Q"] = [dict(base)]
    new["records"]["sm90|cuda_w8a8_gemm_tma|run|Q"] = [dict(base, grid=[7, 1, 1])]
    new["records"]["sm90|cuda_w8a8_gemm_ws|bind|P|None"] = [dict(base, header="h2", name="n2")]
    old["records"]["sm90|cuda_int8_gemv|run|R"] = [dict(base)]
    new["records"]["sm90|cuda_int8_gemv|run|R"] = [dict(base), dict(base)]
    new["records"]["cuda_w8a8_gemm_ws|supports|P"] = False
    assert launch_diff.field_tally(old, new) == (
        "cuda_int8_gemv: launches 1; cuda_w8a8_gemm_tma: grid 1; "
        "cuda_w8a8_gemm_ws: header+name 1; cuda_w8a8_gemm_ws: supports 1")
    assert launch_diff.field_tally(old, old) == ""
