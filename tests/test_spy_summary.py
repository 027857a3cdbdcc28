"""``bench/spy_summary.py``: shares of a py-spy raw profile's samples, counted per stack
holding a frame, within the samples under a chosen frame."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import spy_summary  # noqa: E402

# Three stacks: two under the W8A8 builds (one recursing through plan), one under bf16's.
PROFILE = (
    "<module> (s.py:1);_build_mlx_w8a8 (s.py:9);plan (nn.py:5);plan (nn.py:5);"
    "0x7f00aa (libmlx.so) 3\n"
    "<module> (s.py:1);_build_mlx_w8a8 (s.py:9);launch (cuda_launch.py:7) 1\n"
    "<module> (s.py:1);_build_bf16 (s.py:5);0x7f00bb (libmlx.so) 4\n"
)


def _write(tmp_path, text=PROFILE):
    path = tmp_path / "p.txt"
    path.write_text(text)
    return str(path)


def test_shares_within_a_frame_count_each_stack_once(tmp_path):
    total, inclusive, own = spy_summary.summarize(spy_summary.read(_write(tmp_path)),
                                                  ("_build_mlx_w8a8",))
    assert total == 4  # bf16's 4 samples are not under the W8A8 frame
    assert inclusive["plan (nn.py:5)"] == 3  # on its stack twice, counted once
    assert inclusive["(libmlx.so)"] == 3 and own["(libmlx.so)"] == 3  # address dropped
    assert own["launch (cuda_launch.py:7)"] == 1
    assert "<module> (s.py:1)" not in inclusive  # callers of the chosen frame are cut


def test_nested_frames_narrow_the_samples(tmp_path):
    # plan below the W8A8 frame: its 3 samples; the frame looked for must be below the
    # one before (bf16's frame holds no plan, and plan is not above _build_mlx_w8a8).
    stacks = spy_summary.read(_write(tmp_path))
    total, inclusive, _ = spy_summary.summarize(stacks, ("_build_mlx_w8a8", "plan ("))
    assert total == 3 and "_build_mlx_w8a8 (s.py:9)" not in inclusive
    assert spy_summary.summarize(stacks, ("plan (", "_build_mlx_w8a8"))[0] == 0


def test_by_function_joins_the_lines_of_one_function(tmp_path):
    text = "run (a.py:3);f (m.py:12) 2\nrun (a.py:3);f (m.py:14) 1\nrun (a.py:3);(libc.so.6) 1\n"
    by_line = spy_summary.summarize(spy_summary.read(_write(tmp_path, text)))[1]
    assert by_line["f (m.py:12)"] == 2 and by_line["f (m.py:14)"] == 1
    total, inclusive, _ = spy_summary.summarize(spy_summary.read(_write(tmp_path, text), True))
    assert total == 4 and inclusive["f (m.py)"] == 3 and inclusive["run (a.py)"] == 4
    assert inclusive["(libc.so.6)"] == 1


def test_no_filter_counts_every_sample(tmp_path):
    total, inclusive, own = spy_summary.summarize(spy_summary.read(_write(tmp_path)))
    assert total == 8 and inclusive["<module> (s.py:1)"] == 8 and own["(libmlx.so)"] == 7


def test_a_line_without_a_count_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"p.txt:2 is not 'frame;...;frame COUNT'"):
        spy_summary.read(_write(tmp_path, "a;b 3\na;b\n"))


def test_the_command_prints_shares(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "spy_summary.py"),
                           _write(tmp_path), "--within", "_build_bf16", "--top", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "4 samples within '_build_bf16'"
    assert " 100.0%  (libmlx.so)" in proc.stdout
