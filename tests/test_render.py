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
