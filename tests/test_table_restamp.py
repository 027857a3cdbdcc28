"""``bench/table_restamp.py``: a table's digests rewritten to this tree's candidates, for
A/B comparisons on the same decisions."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import table_restamp  # noqa: E402

from mlx_w8a8.kernels import registry  # noqa: E402


def _doc():
    qmm = registry.get("linear", "mlx_qmm")
    return {"schema": 1, "sections": [{"entries": [{
        "op": "linear", "choice": "mlx_qmm",
        "candidates": {"mlx_qmm": {"digest": "stale0000000000"},
                       "exact": {"digest": registry.get("linear", "exact").digest},
                       "gone_kernel": {"digest": "keepme"}}}]}]}, qmm.digest


def test_stale_digests_become_this_trees_and_others_stay(tmp_path):
    doc, want = _doc()
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(json.dumps(doc))
    assert table_restamp.main([str(src), str(out)]) == 0
    cands = json.loads(out.read_text())["sections"][0]["entries"][0]["candidates"]
    assert cands["mlx_qmm"]["digest"] == want  # the one stale digest, rewritten
    assert cands["exact"]["digest"] == registry.get("linear", "exact").digest
    assert cands["gone_kernel"]["digest"] == "keepme"  # not registered here: untouched
    assert json.loads(src.read_text()) == doc  # the measured table is left as it was
    assert table_restamp.restamp(json.loads(out.read_text())) == 0


def test_refuses_to_overwrite_the_measured_table(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(_doc()[0]))
    with pytest.raises(SystemExit):
        table_restamp.main([str(src), str(src)])
