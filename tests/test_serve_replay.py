"""bench/serve_replay.py on a tiny model on this CPU: every request of every level is
served to its last token, each arm is reported against bf16 with the same reads, and bad
options are refused."""

import io
import json
import os
import sys
from contextlib import redirect_stdout

import pytest

pytest.importorskip("mlx_lm.generate", reason="mlx-lm is part of the test extra")
import tiny_lm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import serve_replay  # noqa: E402


def test_every_request_is_served_and_each_arm_is_reported(tmp_path):
    folder = tiny_lm.config_folder(tmp_path / "tiny-llama")
    out, jsonl = io.StringIO(), tmp_path / "replay.jsonl"
    # budget 0: one next() between insertions, so a slot's second request joins while
    # the others decode (the batch fills and drains, as in the server)
    with redirect_stdout(out):
        code = serve_replay.main(["--model", str(folder), "--weights", "8bit-gs64",
                                   "--levels", "3", "--per-slot", "2", "--max-tokens", "5",
                                   "--rounds", "2", "--budget", "1e-9", "--json", str(jsonl)])
    text = out.getvalue()
    assert code == 0, text
    lines = [ln for ln in text.splitlines() if ln.startswith("level ")]
    assert [ln.split()[2] for ln in lines] == [f"{m}+{r}" for m in ("bf16", "mlx_w8a8")
                                               for r in ("item", "aside", "none")], text
    # each arm against bf16 with the same reads, and against mlx_lm.server's (bf16+item)
    assert "(1.00x bf16+item)" in lines[0], text
    assert "(1.00x bf16+aside) (" in lines[1] and "x bf16+item)" in lines[1], text
    assert "x bf16+none) (" in lines[5], text
    records = [json.loads(ln) for ln in jsonl.read_text().splitlines()]
    assert len(records) == 6
    for rec in records:
        assert len(rec["rounds"]) == 2
        for r in rec["rounds"]:
            # 3 slots x 2 requests x 5 tokens: every request to its last token
            assert r["tokens"] == 30, r
            assert r["prefill_tokens"] == 6 * (len("0: Write a short story about a lighthouse "
                                                   "keeper.") - 1), r
            assert max(r["decode_rows_seen"]) == 3 and min(r["decode_rows_seen"]) < 3, r


def test_prompts_are_the_servers_bytes():
    assert serve_replay.prompt_tokens(12, "ab") == [ord(c) for c in "12: ab"]


@pytest.mark.parametrize("bad", [["--levels", "0"], ["--arms", "bf16,q4"],
                                 ["--reads", "some"], ["--budget", "0"],
                                 ["--max-tokens", "1"]])
def test_bad_options_are_refused(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_replay.main(["--model", "llama-3-8b", *bad])
    assert exit_info.value.code == 2
    assert bad[0] in capsys.readouterr().err
