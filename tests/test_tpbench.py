"""``python -m mlx_w8a8.bench --model ... --tp N`` (mlx_w8a8.tpbench) over two real
processes: MLX's ring backend on 127.0.0.1, started by ``launch`` of
tests/test_distributed.py (every wait has a deadline; a rank that fails stops the run).
Structure and consistency of the report, not speed."""

from __future__ import annotations

import json
import math
import sys

import pytest

from mlx_w8a8 import bench, tpbench

pytest.importorskip("mlx_lm")
from test_distributed import CONFIG, launch  # noqa: E402

# The two-rank run takes ~15 s on two busy cores; a hang fails at this deadline.
TIMEOUT_S = 90.0


def _folder(tmp_path):
    # test_distributed's tiny Llama: GQA with one KV head per rank, biases on q/k/v
    # (split) and o/down (added once after the sum), an untied lm_head left unsharded;
    # 2 blocks in the config so that --layers 1 must cut it.
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return str(folder)


def _bench(folder, *flags):
    return [sys.executable, "-m", "mlx_w8a8.bench", "--model", folder, *flags]


def test_two_ranks_report_per_rank_times_comm_share_speedup_and_the_check(tmp_path):
    out = tmp_path / "tp.jsonl"
    cmd = _bench(_folder(tmp_path), "--layers", "1", "--tp", "2", "--tokens", "8", "--decode", "2",
                 "--prompt", "4", "--rounds", "3", "--check", "--json", str(out),
                 "--tp-timeout", "80")
    assert launch([cmd, cmd], tmp_path, timeout=TIMEOUT_S) == [0, 0]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [line["kind"] for line in lines]
    # rank 0 alone reports: one setup, one check, prefill and decode, both decisions
    assert kinds == ["setup", "check", "summary", "summary", "decisions", "decisions"], kinds
    setup, check = lines[0], lines[1]
    assert setup["tp"] == 2 and setup["layers"] == 1 and setup["rounds"] == 3
    assert setup["all_sums_per_token_step"] == 2  # o_proj and down_proj of one block
    assert check["ranks_identical"] and check["criterion_met"] and check["passed"], check
    assert 0 < check["tp_shift_rms"] <= 2 * check["w8a8_shift_rms"]
    summaries = lines[2:4]
    assert [(s["measure"], s["tokens"]) for s in summaries] == [("prefill", 8), ("decode", 2)]
    for s in summaries:
        assert s["ranks"] == 2 and s["one_device_ms"] > 0
        tp, comm = s["tp_ms_per_rank"], s["all_sum_ms_per_rank"]
        assert len(tp) == len(comm) == 2
        assert all(math.isfinite(t) and t > 0 for t in tp + comm)
        # the share is each rank's all_sum time over that rank's tensor-parallel time
        want = [c / t for c, t in zip(comm, tp)]
        assert s["comm_share_per_rank"] == pytest.approx(want, rel=1e-12)
        # (no upper bound asserted: the all_sum arm and the forward are timed separately,
        # and on a loaded machine the collectives alone took longer than the decode
        # step that contains them, a share > 1; a timing relation is not a unit test)
        assert all(share >= 0 for share in s["comm_share_per_rank"]), s
        sp = s["speedup_vs_one_device"]
        assert len(sp["rounds"]) == 3 and all(r > 0 for r in sp["rounds"])
        assert 0 < sp["p25"] <= sp["median"] <= sp["p75"]
    # the sharded model really is split: rank 0's o_proj holds half of K
    layers = lines[4]["layers"]
    assert lines[4]["variant"] == "tp rank 0"
    assert layers["model.layers.0.self_attn.o_proj"].startswith("ShardedToAllLinear(input_dims=64,")
    assert "model.layers.1.mlp.down_proj" not in layers  # --layers 1


def test_tp_that_does_not_match_the_launch_is_exit_2_on_every_rank(tmp_path):
    cmd = _bench(_folder(tmp_path), "--tp", "3", "--tp-timeout", "40")
    assert launch([cmd, cmd], tmp_path, timeout=60, fail_fast=False) == [2, 2]
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.log").read_text()
        assert "[mlx_w8a8.bench] --tp 3 does not match the launch: 2 ranks were started" in text


def test_a_rank_whose_peer_never_starts_exits_at_the_deadline(tmp_path):
    # A host file of two ranks, one started: rank 0 waits to join the ring inside
    # mx.distributed.init (holding the interpreter lock). The watchdog ends it with
    # status 1 and its stack instead of hanging.
    cmd = _bench(_folder(tmp_path), "--tp", "2", "--tp-timeout", "3")
    assert launch([cmd], tmp_path, timeout=60, fail_fast=False, hosts=2) == [1]
    text = (tmp_path / "rank0.log").read_text()
    assert "Timeout (0:00:03)!" in text and "in join" in text, text[-2000:]


@pytest.mark.parametrize("flags,message", [
    # no distributed launch: this process alone is a group of one
    (["--tp", "2"], "--tp 2 needs 2 ranks of a distributed launch"),
    # one rank splits nothing
    (["--tp", "1"], "--tp must be >= 2 ranks, got 1"),
    (["--tp", "2", "--tp-timeout", "0"], "--tp-timeout must be > 0 seconds, got 0"),
    # --check is a property of the split model
    (["--check"], "--check checks a --tp run"),
    # a new length per call is a one-device measurement
    (["--tp", "2", "--new-lengths"], "--new-lengths is measured on one device"),
])
def test_tp_errors_are_exit_2_with_the_reason(tmp_path, capsys, flags, message):
    assert bench.main(["--model", _folder(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_tp_without_a_model_is_exit_2(capsys):
    assert bench.main(["--tp", "2"]) == 2
    assert "--tp 2 splits a model: give --model" in capsys.readouterr().err


def test_render_table_shows_every_rank():
    s = {"one_device_ms": 10.0, "tp_ms_per_rank": [6.0, 6.5], "all_sum_ms_per_rank": [1.5, 1.3],
         "comm_share_per_rank": [0.25, 0.2],
         "speedup_vs_one_device": {"median": 1.54, "p25": 1.5, "p75": 1.6}}
    text = tpbench.render_table([("prefill T=8", s)])
    assert "6 / 6.5" in text and "25% / 20%" in text and "1.54x (1.50..1.60)" in text
