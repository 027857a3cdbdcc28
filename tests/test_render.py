"""Text output shared by the command lines (durations, ratios, tables, error lines)."""

import math

from mlx_w8a8.tuning import render


def test_fmt_ns_picks_the_unit():
    assert render.fmt_ns(512) == "512 ns"
    assert render.fmt_ns(1500) == "1.5 us"
    assert render.fmt_ns(2.25e6) == "2.25 ms"
    assert render.fmt_ns(3e9) == "3 s"
    assert render.fmt_ns(None) == render.fmt_ns(math.inf) == "-"


def test_spread_and_ratio_ignore_non_finite_values():
    assert render.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert render.spread([math.nan, None]) is None
    assert render.fmt_ratio([1.0, 2.0, 3.0, math.inf]) == "2.00x (1.50..2.50)"
    assert render.fmt_ratio([]) == "-"


def test_columns_align_left_and_right():
    text = render.columns(["name", "n"], [["a", "1"], ["bbb", "100"]], right=[1])
    assert text.splitlines() == ["name    n", "----  ---", "a       1", "bbb   100"]


def test_error_line_prefixes_once():
    assert render.error_line("mlx_w8a8.tune", "no table at x") == "[mlx_w8a8.tune] no table at x"
    # a message with its own op prefix keeps it and gets no second one
    assert render.error_line("mlx_w8a8.tune", "[mlx_w8a8.tuning] bad") == "[mlx_w8a8.tuning] bad"


def test_entries_show_the_decode_check_and_a_borrowed_decision():
    base = {"op": "linear", "m_bucket": 1, "m": 1, "n": 64, "k": 32, "dtype": "bfloat16",
            "weight_format": "per_channel", "choice": "mlx_qmm", "speedup": 1.0,
            "candidates": {"mlx_qmm": {"status": "ok", "median_ns": 2000.0, "gate_error": 0.0}}}
    checked = dict(base, decode_check={"tuned": "gemv", "kept": False, "ratio": 0.82})
    borrowed = dict(base, n=128, borrowed_from={"n": 64, "k": 32},
                    decode_check={"tuned": "gemv", "kept": True, "ratio": 1.07})
    text = render.entries([("t0", checked), ("", borrowed), ("plain", base)])
    lines = text.splitlines()
    assert "t0; decode check: gemv replaced (0.82x)" in lines[2]
    assert "decode check: gemv kept (1.07x); decision of 64x32" in lines[3]
    assert lines[4].rstrip().endswith("plain")


def test_entries_show_the_batched_decode_check_with_its_batch_size():
    e = {"op": "linear", "m_bucket": 8, "m": 8, "n": 64, "k": 32, "dtype": "bfloat16",
         "weight_format": "per_channel", "choice": "mlx_qmm", "speedup": 1.0,
         "candidates": {"mlx_qmm": {"status": "ok", "median_ns": 2000.0, "gate_error": 0.0}},
         "decode_check": {"tuned": "gemv", "kept": False, "ratio": 0.91, "batch": 8}}
    kept = dict(e, choice="gemv", decode_check={"tuned": "gemv", "kept": True, "ratio": 1.12,
                                                "batch": 8})
    lines = render.entries([("", e), ("", kept)]).splitlines()
    assert lines[2].endswith("decode check (batched, B = 8): gemv replaced (0.91x)")
    assert lines[3].endswith("decode check (batched, B = 8): gemv kept (1.12x)")


def test_entries_show_the_sibling_check():
    e = {"op": "linear", "m_bucket": 128, "m": 128, "n": 6144, "k": 4096, "dtype": "bfloat16",
         "weight_format": "per_channel", "choice": "mlx_qmm", "speedup": 1.0,
         "candidates": {"mlx_qmm": {"status": "ok", "median_ns": 5e4, "gate_error": 0.0}},
         "sibling_check": {"tuned": "cuda_w8a8_gemm_ws", "kept": False, "ratio": 0.92}}
    kept = dict(e, choice="cuda_w8a8_gemm_ws",
                sibling_check={"tuned": "cuda_w8a8_gemm_ws", "kept": True, "ratio": 1.08})
    lines = render.entries([("", e), ("", kept)]).splitlines()
    assert "sibling check: cuda_w8a8_gemm_ws members alone (0.92x)" in lines[2]
    assert "sibling check: cuda_w8a8_gemm_ws kept (1.08x)" in lines[3]


def test_entries_say_a_choice_kept_on_record_within_the_margin():
    cands = {"mlx_qmm": {"status": "ok", "median_ns": 1e5, "gate_error": 0.0},
             "ws": {"status": "ok", "median_ns": 80300.0, "gate_error": 0.0},
             "tma": {"status": "ok", "median_ns": 80700.0, "gate_error": 0.0}}
    e = {"op": "linear", "m_bucket": 512, "m": 512, "n": 4096, "k": 4096, "dtype": "bfloat16",
         "weight_format": "per_channel", "choice": "tma", "speedup": 1.24,
         "candidates": cands, "previous_choice": "tma"}
    moved = dict(e, choice="ws", speedup=1.25)  # the fastest replaced it: nothing to say
    lines = render.entries([("", e), ("", moved)]).splitlines()
    assert "kept on record: ws faster within the margin" in lines[2]
    assert "kept on record" not in lines[3]


def test_entries_mark_a_candidate_timed_in_one_round():
    e = {"op": "linear", "m_bucket": 2048, "m": 2048, "n": 64, "k": 32, "dtype": "bfloat16",
         "weight_format": "per_channel", "choice": "fast", "speedup": 5.0,
         "candidates": {"mlx_qmm": {"status": "ok", "median_ns": 5e6, "gate_error": 0.0},
                        "fast": {"status": "ok", "median_ns": 1e6, "gate_error": 0.0},
                        "exact": {"status": "ok", "median_ns": 4e7, "rounds": 1}}}
    row = render.entries([("", e)]).splitlines()[2]
    assert "40 ms (1 round)" in row and "5 ms " in row and "(1 round)" not in row.split("40 ms")[0]


def test_entries_note_a_candidate_pruned_within_reach():
    # 1.04x the fastest on its one sample: the old one-launch pruning, re-measured by tune.
    e = {"op": "linear", "m_bucket": 2048, "m": 2048, "n": 64, "k": 32, "dtype": "bfloat16",
         "weight_format": "per_channel", "choice": "ws", "speedup": 4.0,
         "candidates": {"mlx_qmm": {"status": "ok", "median_ns": 1.5e6},
                        "ws": {"status": "ok", "median_ns": 3.61e5},
                        "tma": {"status": "ok", "median_ns": 3.77e5, "rounds": 1},
                        "exact": {"status": "ok", "median_ns": 3.6e6, "rounds": 1}}}
    row = render.entries([("", e)]).splitlines()[2]
    assert row.endswith("tma pruned within reach: tune measures it again")
    e["candidates"]["tma"]["median_ns"] = 8e5  # 2.2x: beyond reach, no note
    assert "within reach" not in render.entries([("", e)])


def test_fmt_bytes_uses_binary_units_from_their_boundary():
    # 1023 bytes stay bytes; each unit starts at its power of 1024 (not 1000)
    assert render.fmt_bytes(0) == "0 B" and render.fmt_bytes(1023) == "1023 B"
    assert render.fmt_bytes(1024) == "1 KiB" and render.fmt_bytes(1000 * 1024) == "1000 KiB"
    assert render.fmt_bytes(3 << 19) == "1.5 MiB" and render.fmt_bytes(1 << 20) == "1 MiB"
    assert render.fmt_bytes(int(1.9 * (1 << 30))) == "1.9 GiB"
    assert render.fmt_bytes(int(123.4 * (1 << 20))) == "123 MiB"
