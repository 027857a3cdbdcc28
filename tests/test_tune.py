"""The ``python -m mlx_w8a8.tune`` command line."""

import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

import mlx_w8a8
from mlx_w8a8 import backends, tune
from mlx_w8a8.tuning import table
from mlx_w8a8.tuning.tuner import Tuner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--pairs", "3", "--warmup", "1", "--dtype", "float32", "--group-size", "32", "--no-progress"]


def run(argv):
    out = io.StringIO()
    code = tune.main(argv, out=out)
    return code, out.getvalue()


# A tiny Llama: q/o 64x64, k/v 32x64 (2 KV heads of 16), gate/up 128x64, down 64x128,
# lm_head 256x64 (untied): five distinct shapes, two of them shared by two projections.
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def tiny_model(tmp_path, **changes):
    folder = tmp_path / "tiny-llama"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(TINY_LLAMA, **changes)))
    return str(folder)


def entries_of(path):
    return table.matching_entries(table.read(path), table.device_key(), path)


def test_tunes_writes_then_reuses_the_table(tmp_path):
    path = str(tmp_path / "t.json")
    code, text = run(["--shapes", "2x32x64", "1x64x32", "--table", path] + TINY)
    assert code == 0, text
    assert "measured" in text and "mlx_qmm" in text and "choice" in text
    doc = table.read(path)
    entries = table.matching_entries(doc, table.device_key(), path)
    assert sorted((e["m"], e["n"], e["k"]) for e in entries) == [(1, 64, 32), (2, 32, 64)]
    assert all(e["samples"] == 3 and e["gate"]["atol"] == 0.125 for e in entries)
    before = open(path).read()
    code, text = run(["--shapes", "2x32x64", "1x64x32", "--table", path] + TINY)
    assert code == 0 and text.count("cached") == 2 and "measured" not in text
    assert open(path).read() == before  # nothing re-measured or rewritten
    code, text = run(["--shapes", "2x32x64", "--table", path, "--force"] + TINY)
    assert code == 0 and "measured" in text


def test_tunes_the_4bit_format_against_its_own_references(tmp_path):
    # --format grouped4 (MLX's 4-bit weights): the race is between the 4-bit reference
    # (mx.quantized_matmul at 4 bits) and the exact W4A8 kernel, gated against
    # exact_w4a8, and the entry is recorded (and read back) under that format.
    path = str(tmp_path / "t.json")
    code, text = run(["--shapes", "2x32x64", "--format", "grouped4", "--table", path] + TINY)
    assert code == 0, text
    (entry,) = entries_of(path)
    assert entry["weight_format"] == "grouped4" and entry["group_size"] == 32
    assert entry["reference"] == "mlx_qmm4" and entry["gate"]["exact"] == "exact_w4a8"
    # (other tests may leave fake candidates registered: only these two are asserted)
    raced = set(entry["candidates"])
    assert {"mlx_qmm4", "exact_w4a8"} <= raced and not raced & {"mlx_qmm", "exact"}, raced
    code, text = run(["--shapes", "2x32x64", "--format", "grouped4", "--table", path] + TINY)
    assert code == 0 and "cached" in text and "measured" not in text


def test_capabilities_that_are_off_are_named_before_measuring(tmp_path, monkeypatch):
    # A Hopper GPU without cffi: the TMA kernels are left out of every race, and the
    # run says so (with the reason) before it measures; capabilities that are on, and
    # those of other backends, are not printed.
    asked = []

    def caps(backend):
        asked.append(backend)
        return {"cuda_sm90": (True, "compute capability 9.x"),
                "cuda_tma": (False, "ModuleNotFoundError: No module named 'cffi'")}

    monkeypatch.setattr(tune, "capabilities", caps)
    code, text = run(["--shapes", "2x32x64", "--table", str(tmp_path / "t.json")] + TINY)
    assert code == 0, text
    assert asked == [backends.name()]
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tuning 1 problem(s)"))
    assert lines[start + 1] == ("  cuda_tma is off here (ModuleNotFoundError: No module "
                                "named 'cffi'): its kernels are not measured")
    assert "cuda_sm90" not in text


def test_op_measures_the_raw_int8_gemm_and_the_activation_quantize(tmp_path):
    # --op int8_matmul: one int8 GEMM problem per shape; --op quantize_activation: one
    # per (M, K) in --dtype, N not used (two shapes differing only in N are one problem).
    # Both are recorded as their ops and found by the ops' lookups; --model is refused.
    from mlx_w8a8 import tuning
    from mlx_w8a8.kernels.registry import Problem

    path = str(tmp_path / "t.json")
    code, text = run(["--op", "int8_matmul", "--shapes", "2x32x64", "--table", path] + TINY)
    assert code == 0, text
    code, text = run(["--op", "quantize_activation", "--shapes", "3x32x64", "3x96x64",
                      "--table", path] + TINY)
    assert code == 0, text
    assert text.count("measured") == 1
    got = sorted((e["op"], e["m"], e["n"], e["k"], e["dtype"]) for e in entries_of(path))
    assert got == [("int8_matmul", 2, 32, 64, "int8"), ("quantize_activation", 3, 0, 64, "float32")]
    mlx_w8a8.set_tuning_table(path)
    hit = tuning.lookup(Problem("int8_matmul", 2, 32, 64, "int8", "int8"))
    assert hit is not None and hit.layer == "user"
    code, text = run(["--op", "int8_matmul", "--model", "llama-3-8b", "--table", path] + TINY)
    assert code == 2


def test_default_table_is_the_cache_table(tmp_path):
    code, _ = run(["--shapes", "1x32x64"] + TINY)
    assert code == 0 and table.read(table.cache_table_path()) is not None


def test_gate_and_selection_options_reach_the_table(tmp_path):
    path = str(tmp_path / "t.json")
    code, _ = run(["--shapes", "1x32x64", "--table", path, "--atol", "0.5", "--rtol", "0.02",
                   "--min-improvement", "1234"] + TINY)
    e = table.matching_entries(table.read(path), table.device_key(), path)[0]
    assert code == 0 and e["gate"]["atol"] == 0.5 and e["gate"]["rtol"] == 0.02
    assert e["min_improvement_bps"] == 1234 and e["chain_link"] == "dependent"
    code, _ = run(["--shapes", "1x32x64", "--table", path, "--force", "--independent"] + TINY)
    e = table.matching_entries(table.read(path), table.device_key(), path)[0]
    assert code == 0 and e["chain_link"] == "independent"
    first = e["choice"]
    assert e["previous_choice"] == first  # measured again: the choice on record offered
    code, _ = run(["--shapes", "1x32x64", "--table", path, "--force", "--no-keep-choices"] + TINY)
    e = table.matching_entries(table.read(path), table.device_key(), path)[0]
    assert code == 0 and e["previous_choice"] is None


def test_tuning_into_a_new_table_reports_nothing_missing(tmp_path):
    # The tuner looks for the choice on record before it chooses (keep-choices); a table
    # that a first tune is about to create is not news to report.
    import warnings

    path = str(tmp_path / "new.json")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, _ = run(["--shapes", "1x32x64", "--table", path, "--force"] + TINY)
    assert code == 0 and table.read(path) is not None
    assert not [w for w in seen if issubclass(w.category, table.TuningTableWarning)], \
        [str(w.message) for w in seen]


def test_show_and_export(tmp_path):
    path = str(tmp_path / "t.json")
    other = dict(table.device_key(), backend="cuda", device={"device_name": "NVIDIA H200"})
    table.write_entries(path, other, [{"op": "linear", "m_bucket": 1, "n": 8, "k": 8,
                                       "dtype": "bfloat16", "weight_format": "per_channel",
                                       "group_size": 64, "choice": "cuda_gemv"}])
    with pytest.warns(table.TuningTableWarning, match="measured on cuda NVIDIA H200"):
        run(["--shapes", "1x32x64", "--table", path] + TINY)  # the H200 section is kept
    code, text = run(["--show", path])
    assert code == 0
    assert "this machine" in text and "NVIDIA H200" in text and "unused here" in text
    assert "cuda_gemv" in text and "M" in text and "speedup" in text
    dest = str(tmp_path / "ship" / "tuning.json")
    code, text = run(["--table", path, "--export", dest])
    assert code == 0 and "exported 1 entries" in text
    doc = table.read(dest)
    assert len(doc["sections"]) == 1 and doc["sections"][0]["backend"] == backends.name()


def test_errors_are_reported_not_raised(tmp_path):
    assert run(["--shapes", "1x2"])[0] == 2
    assert run(["--shapes", "mlp", "--m", "0"])[0] == 2
    assert run(["--shapes", "1x8x8", "--min-improvement", "-5"])[0] == 2
    assert run([])[0] == 2
    assert run(["--show", str(tmp_path / "missing.json")])[0] == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert run(["--show", str(bad)])[0] == 1
    # tuning into a corrupt table: refused, not written over
    code, _ = run(["--shapes", "1x32x64", "--table", str(bad)] + TINY)
    assert code == 1 and bad.read_text() == "{"
    # a K the group size does not divide is skipped with a note
    code, text = run(["--shapes", "1x32x48", "--table", str(tmp_path / "t.json")] + TINY)
    assert code == 1 and "does not divide K" in text


def test_two_processes_tuning_different_shapes_keep_both(tmp_path):
    path = str(tmp_path / "shared.json")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "mlx_w8a8.tune", "--table", path] + TINY
    procs = [
        subprocess.Popen(cmd + ["--shapes", shape], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for shape in ("2x32x64,4x32x64", "2x64x32,4x64x32")
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
    entries = table.matching_entries(table.read(path), table.device_key(), path)
    assert sorted((e["m"], e["n"], e["k"]) for e in entries) == [
        (2, 32, 64), (2, 64, 32), (4, 32, 64), (4, 64, 32)]


def test_module_entry_point_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "mlx_w8a8.tune", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--shapes" in r.stdout and "Llama-3-8B" in r.stdout


def test_model_writes_one_entry_per_distinct_shape_and_bucket(tmp_path):
    pytest.importorskip("mlx_lm")
    path = str(tmp_path / "t.json")
    code, text = run(["--model", tiny_model(tmp_path), "--m", "1,2", "--table", path] + TINY)
    assert code == 0, text
    shapes = {(64, 64), (32, 64), (128, 64), (64, 128), (256, 64)}
    got = sorted((e["m_bucket"], e["n"], e["k"]) for e in entries_of(path))
    assert got == sorted((m, n, k) for n, k in shapes for m in (1, 2))
    assert all(e["dtype"] == "float32" and e["weight_format"] == "per_channel"
               and e["group_size"] == 32 for e in entries_of(path))
    assert "5 distinct linear shape(s) x 2 M = 10 problem(s)" in text
    assert "q_proj" in text and "lm_head" in text
    # tied embeddings: no lm_head layer, no 256x64 entry
    tied = str(tmp_path / "tied.json")
    code, text = run(["--model", tiny_model(tmp_path, tie_word_embeddings=True), "--m", "1",
                      "--table", tied] + TINY)
    assert code == 0, text
    assert sorted((e["n"], e["k"]) for e in entries_of(tied)) == sorted(shapes - {(256, 64)})


def test_model_config_file_and_tp(tmp_path):
    pytest.importorskip("mlx_lm")
    path = str(tmp_path / "t.json")
    config = os.path.join(tiny_model(tmp_path), "config.json")
    code, text = run(["--model", config, "--tp", "2", "--m", "1", "--table", path] + TINY)
    assert code == 0, text
    # column-parallel q 32x64, k/v 16x64, gate/up 64x64; row-parallel o 64x32, down 64x64
    # (= gate/up); lm_head is not split
    assert sorted((e["n"], e["k"]) for e in entries_of(path)) == sorted(
        [(32, 64), (16, 64), (64, 64), (64, 32), (256, 64)])
    # an indivisible split is refused before anything is measured
    code, _ = run(["--model", config, "--tp", "3", "--m", "1", "--table", path] + TINY)
    assert code == 2
    assert run(["--shapes", "1x32x64", "--tp", "2"] + TINY)[0] == 2  # --tp needs --model


@pytest.mark.parametrize("name", ["llama-3-8b", "mistral-7b", "qwen2.5-7b"])
def test_presets_list_their_shapes_without_measuring(name, tmp_path):
    pytest.importorskip("mlx_lm")
    path = tmp_path / "t.json"
    code, text = run(["--model", name, "--m", "1,2048", "--table", str(path), "--dry-run"])
    assert code == 0, text
    # q/o, k/v, gate/up, down, lm_head (untied in all three); Qwen2's q/k/v have a
    # bias, so its q and o (both 3584x3584) are two problems
    n = 6 if name == "qwen2.5-7b" else 5
    assert f"{n} distinct linear shape(s) x 2 M = {2 * n} problem(s)" in text
    assert f"{2 * n} of {2 * n} problem(s) to measure" in text and not path.exists()
    vocab = {"llama-3-8b": 128256, "mistral-7b": 32768, "qwen2.5-7b": 152064}[name]
    assert f"2048x{vocab}x" in text and "lm_head" in text


def test_sibling_sums_are_measured_where_a_kernel_launches_groups(tmp_path, monkeypatch):
    # The summed shapes of q+k+v and gate+up (mlx_w8a8.siblings) are listed only where a
    # kernel that runs here has a multi-weight form (on an H200: the warp-specialized
    # GEMM); on this CPU none has, so the preset lists its 5 shapes (test above).
    pytest.importorskip("mlx_lm")
    from mlx_w8a8.tuning import linears

    assert not linears.group_launch_available()
    monkeypatch.setattr(linears, "group_launch_available", lambda: True)
    code, text = run(["--model", "llama-3-8b", "--m", "1,2048", "--table",
                      str(tmp_path / "t.json"), "--dry-run"])
    assert code == 0, text
    assert "7 distinct linear shape(s) x 2 M = 14 problem(s)" in text
    assert "6144x4096" in text and "28672x4096" in text and "q_proj+k_proj+v_proj" in text


def test_unknown_model_is_reported(tmp_path, capsys):
    code, _ = run(["--model", "llama-9", "--m", "1"] + TINY)
    err = capsys.readouterr().err
    assert code == 2 and "llama-3-8b" in err and "'llama-9'" in err


def test_interrupt_saves_what_was_measured(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "t.json")
    calls = []
    real = Tuner.tune

    def tune_then_interrupt(self, problem, *args, **kwargs):
        calls.append(problem)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, problem, *args, **kwargs)

    monkeypatch.setattr(Tuner, "tune", tune_then_interrupt)
    code, text = run(["--shapes", "1x32x64,2x32x64,4x32x64,8x32x64", "--table", path] + TINY)
    err = capsys.readouterr().err
    assert code == 130
    assert "interrupted, 2 entries saved" in err and "Traceback" not in err
    assert len(entries_of(path)) == 2


def test_ctrl_c_in_a_real_process_exits_130_without_traceback(tmp_path):
    path = tmp_path / "t.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # 24 distinct problems (about 0.2 s each here): the run must still be going when the
    # first entry lands, even on a loaded machine. With M = 1-8 at one N only 4 buckets
    # were measured (the rest cached), and a run could end before the signal arrived.
    shapes = ",".join(f"1x{32 * n}x64" for n in range(1, 25))
    cmd = [sys.executable, "-m", "mlx_w8a8.tune", "--table", str(path), "--shapes", shapes,
           "--pairs", "40", "--warmup", "1", "--dtype", "float32", "--group-size", "32",
           "--no-progress"]
    # A child inherits an ignored SIGINT (a test run started in the background by a
    # shell without job control, or under nohup): Python then installs no handler and
    # the signal below would be lost. The child starts with the default disposition.
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if table.read(str(path)):  # the first entry is in: interrupt mid-run
                break
        except table.TableError:
            pass
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    saved = len(entries_of(str(path)))
    assert p.returncode == 130, out + err
    assert "Traceback" not in err and f"interrupted, {saved} entries saved" in err
    assert 1 <= saved < 24


def test_a_table_that_cannot_be_written_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    # Minutes of measuring would otherwise end in "could not be recorded".
    measured = []
    monkeypatch.setattr(tune.Batch, "run", lambda self: measured.append(self))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    def no_write(*args, **kwargs):  # a folder this user may not write (root may write any)
        raise PermissionError(13, "Permission denied")

    for path, why, patch in ((bad, "not valid JSON", None),
                             (not_a_folder / "t.json", "cannot read", None),
                             (tmp_path / "ro" / "t.json", "cannot write", no_write)):
        with monkeypatch.context() as m, warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if patch is not None:
                m.setattr(table.tempfile, "mkstemp", patch)
            code, _ = run(["--shapes", "1x32x64", "--table", str(path)] + TINY)
        # reading a table that is there but unreadable also warns, as every reader does
        assert any("left untouched" in str(w.message) for w in seen) == (patch is None), seen
        err = capsys.readouterr().err
        assert code == 1 and f"cannot record into the table: {path}: {why}" in err, err
    assert not measured and bad.read_text() == "{" and not_a_folder.read_text() == ""
    # a dry run writes nothing, so it still lists the work
    code, text = run(["--shapes", "1x32x64", "--table", str(bad), "--dry-run"] + TINY)
    assert code == 0 and "to measure" in text


def test_nothing_recorded_exits_nonzero_with_one_prefix(tmp_path, capsys, monkeypatch):
    # The table goes bad while measuring (the up-front check passed).
    monkeypatch.setattr(table, "check_writable", lambda path: None)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.warns(table.TuningTableWarning):
        code, _ = run(["--shapes", "1x32x64", "--table", str(bad)] + TINY)
    err = capsys.readouterr().err
    assert code == 1 and bad.read_text() == "{"
    assert "1 of 1 measured entries are not in" in err
    code, _ = run(["--shapes", "1x2"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().startswith("[mlx_w8a8.tune] shape must be MxNxK")
    assert err.count("mlx_w8a8.tune") == 1  # not "mlx_w8a8.tune: [mlx_w8a8.tune] ..."


def test_help_states_the_default_buckets():
    text = tune.build_parser().format_help()
    assert "--model" in text and "--tp" in text
    assert "4096 on a GPU" in text and "1, 4 on a CPU" in text


@pytest.mark.parametrize("flag,m,tp,called", [
    ("on", "1", 1, True), ("auto", "1", 1, False),  # auto: GPUs only (this is a CPU)
    ("off", "1", 1, False), ("on", "2", 1, False),  # no M = 1: nothing decodes
    ("on", "1", 2, False),  # a rank's shapes are not the model's
])
def test_decode_check_runs_when_asked_on_the_model_with_the_tuner(
        flag, m, tp, called, tmp_path, monkeypatch):
    pytest.importorskip("mlx_lm")
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning.decode_check import DecodeCheck

    seen = []

    def spy(model, tuner, **kw):
        layers = [p for p, mod in model.named_modules() if isinstance(mod, mlx_w8a8.Linear)]
        seen.append((len(model.model.layers), len(layers), tuner, tuning.get_tuner()))
        return DecodeCheck((), 16, 6, {}, 0)

    monkeypatch.setattr(tuning, "check_decode", spy)
    path = str(tmp_path / "t.json")
    code, text = run(["--model", tiny_model(tmp_path), "--m", m, "--tp", str(tp),
                      "--decode-check", flag, "--check-layers", "1", "--table", path] + TINY)
    assert code == 0, text
    assert bool(seen) == called
    if called:
        blocks, linears, tuner, active = seen[0]
        # one block (7 projections) + lm_head, converted; the check decides with the
        # CLI's tuner (its table), which is put back afterwards
        assert blocks == 1 and linears == 8 and active is tuner
        assert tuner.writable_path() == path and tuning.get_tuner() is not tuner
        assert "decode check on" in text and "nothing to check" in text


def test_interrupt_in_a_check_says_the_measured_entries_are_saved(tmp_path, monkeypatch, capsys):
    # The entries are written before any check begins; an interrupt in a check must not
    # report "0 entries saved" (a user would measure them all again), and the same
    # command then runs the check without measuring anything again.
    pytest.importorskip("mlx_lm")
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning.decode_check import DecodeCheck

    checks = []

    def interrupted(model, tuner, **kw):
        checks.append("interrupted")
        raise KeyboardInterrupt

    monkeypatch.setattr(tuning, "check_decode", interrupted)
    path = str(tmp_path / "t.json")
    argv = ["--model", tiny_model(tmp_path), "--m", "1", "--decode-check", "on",
            "--check-layers", "1", "--table", path] + TINY
    code, text = run(argv)
    err = capsys.readouterr().err
    saved = len(entries_of(path))
    assert code == 130 and checks == ["interrupted"] and saved >= 5, (text, err)
    assert f"interrupted in the decode check: the {saved} measured entries are saved" in err
    assert "0 entries saved" not in err and "Traceback" not in err

    def completes(model, tuner, **kw):
        checks.append("ran")
        return DecodeCheck((), 16, 6, {}, 0)

    monkeypatch.setattr(tuning, "check_decode", completes)
    code, text = run(argv)
    assert code == 0 and checks[-1] == "ran", text
    assert f", 0 to measure, into {path}" in text and len(entries_of(path)) == saved


def test_interrupt_in_the_decode_check_counts_the_verdicts_it_saved(tmp_path, monkeypatch,
                                                                      capsys):
    # The decode check records each batch size's verdicts as it finishes them: an
    # interrupt after some must say they are saved (not "without the verdicts"), and
    # count only this run's (a verdict from an earlier run is not one of them).
    pytest.importorskip("mlx_lm")

    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning.tuner import _now

    path = str(tmp_path / "t.json")

    def records_two_then_interrupted(model, tuner, **kw):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        entries = doc["sections"][0]["entries"]
        for e, at in zip(entries, (_now(), _now(), "2026-01-01T00:00:00+00:00")):
            e["decode_check"] = {"tuned": e["choice"], "reference": e["reference"],
                                 "ratio": 0.97, "p25": 0.95, "kept": False, "steps": 32,
                                 "rounds": 20, "min_improvement_bps": 200.0, "checked_at": at}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        raise KeyboardInterrupt

    monkeypatch.setattr(tuning, "check_decode", records_two_then_interrupted)
    code, text = run(["--model", tiny_model(tmp_path), "--m", "1", "--decode-check", "on",
                      "--check-layers", "1", "--table", path] + TINY)
    err = capsys.readouterr().err
    assert code == 130, (text, err)
    assert "with the 2 verdict(s) the decode check recorded before it" in err, err
    assert "without the verdicts" not in err and "Traceback" not in err


def test_verdicts_since_counts_one_stage_from_a_time_and_survives_a_bad_table(tmp_path,
                                                                              monkeypatch):
    from mlx_w8a8.tune import verdicts_since
    from mlx_w8a8.tuning import table as table_mod

    at = "2026-12-06T04:39:26+00:00"
    doc = {"schema": 1, "sections": [{"entries": [
        {"decode_check": {"checked_at": at}},
        {"decode_check": {"checked_at": "2026-12-06T04:39:25+00:00"}},  # before: not counted
        {"sibling_check": {"checked_at": "2026-12-06T04:40:00+00:00"}},  # another stage
        {}]}]}
    # the counting alone (these entries are not whole table entries)
    monkeypatch.setattr(table_mod, "read", lambda path: doc)
    assert verdicts_since("t.json", "decode check", at) == 1
    assert verdicts_since("t.json", "sibling check", at) == 1
    assert verdicts_since("t.json", "prefill check", at) == 0
    monkeypatch.undo()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert verdicts_since(str(bad), "decode check", at) == 0  # unreadable: no count, no error
    assert verdicts_since(str(tmp_path / "missing.json"), "decode check", at) == 0


@pytest.mark.parametrize("layers,hint", [(1, True), (2, False)])
def test_decode_check_says_how_many_blocks_it_ran(layers, hint, tmp_path, monkeypatch):
    """The report names the blocks checked out of the model's; below the full depth it
    says how to check them all (on Llama-3-8B a 4-block check kept a kernel that the
    32-block check and the full model's decode rejected: docs/tuning.md)."""
    pytest.importorskip("mlx_lm")
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning.decode_check import DecodeCheck

    monkeypatch.setattr(tuning, "check_decode", lambda model, tuner, **kw: DecodeCheck((), 16, 6, {}, 0))
    code, text = run(["--model", tiny_model(tmp_path), "--m", "1", "--decode-check", "on",
                      "--check-layers", str(layers), "--table", str(tmp_path / "t.json")] + TINY)
    assert code == 0, text
    assert f"decode check on tiny-llama's first {layers} of 2 block(s)" in text
    assert ("--check-layers 2 checks them all" in text) == hint


@pytest.mark.parametrize("memory,blocks,why", [
    (None, 4, "the device reports no memory size"),
    ("exact", 6, "the whole model fits in 50% of the device's memory"),
    ("short", 4, "the whole model does not fit in 50% of the device's memory"),
    (10**12, 6, "the whole model fits"),
])
def test_check_layers_auto_takes_the_whole_model_where_it_fits(memory, blocks, why, tmp_path,
                                                               monkeypatch):
    """The default --check-layers auto: a 6-block model is checked whole where building
    it (1.5x its float weights) fits in half the device's memory, on its first 4 blocks
    where it does not or where MLX reports no memory (the CPU). "exact": memory exactly
    twice the need (fits); "short": one byte less."""
    pytest.importorskip("mlx_lm")
    import mlx.core as mx

    from mlx_w8a8 import models, tuning
    from mlx_w8a8.tuning.decode_check import DecodeCheck

    folder = tiny_model(tmp_path, num_hidden_layers=6)
    need = tune.CHECK_PEAK_FACTOR * models.parameter_bytes(models.resolve(folder)[0], mx.float32)
    size = {"exact": int(need / tune.CHECK_MEMORY_SHARE),
            "short": int(need / tune.CHECK_MEMORY_SHARE) - 1}.get(memory, memory)
    monkeypatch.setattr(tune, "device_memory", lambda: size)
    seen = []

    def spy(model, tuner, **kw):
        seen.append(len(model.model.layers))
        return DecodeCheck((), 16, 6, {}, 0)

    monkeypatch.setattr(tuning, "check_decode", spy)
    code, text = run(["--model", folder, "--m", "1", "--decode-check", "on",
                      "--table", str(tmp_path / "t.json")] + TINY)
    assert code == 0, text
    assert seen == [blocks]
    assert f"decode check on tiny-llama's first {blocks} of 6 block(s)" in text
    assert f"(--check-layers auto: {why}" in text
    assert ("--check-layers 6 checks them all" in text) == (blocks < 6)


def test_device_memory_reads_metal_and_cuda_keys(monkeypatch):
    import mlx.core as mx

    for info, want in (({"memory_size": 7}, 7), ({"total_memory": 5}, 5),
                       ({"device_name": "cpu"}, None)):
        monkeypatch.setattr(mx, "device_info", lambda info=info: dict(info))
        assert tune.device_memory() == want


def test_decode_check_end_to_end_on_a_tiny_model(tmp_path):
    pytest.importorskip("mlx_lm")
    path = str(tmp_path / "t.json")
    code, text = run(["--model", tiny_model(tmp_path), "--m", "1", "--decode-check", "on",
                      "--check-layers", "1", "--check-rounds", "2", "--table", path] + TINY)
    assert code == 0, text
    assert "decode check on tiny-llama's first 1 of 2 block(s)" in text
    assert "--check-layers 2 checks them all" in text
    # whatever the CPU chose at M = 1, the check either had nothing to do or judged it
    assert ("nothing to check" in text) or ("decode check (32 steps x 2" in text)
    # bad check settings are refused before anything is measured
    for bad in (["--check-layers", "0"], ["--check-layers", "all"], ["--check-rounds", "1"]):
        fresh = str(tmp_path / "fresh.json")
        assert run(["--model", tiny_model(tmp_path), "--m", "1", "--decode-check", "on",
                    "--table", fresh] + bad + TINY)[0] == 2
        assert not os.path.exists(fresh)


@pytest.mark.parametrize("flag,m,tp,available,want", [
    ("on", "1,16", 1, False, [16]),  # forced on: the measured M >= 16
    ("auto", "16,32", 1, False, []),  # auto: not on a CPU
    ("off", "16", 1, True, []),
    ("on", "1,8", 1, True, []),  # no prefill length measured
    ("on", "16", 2, True, []),  # one rank only
])
def test_sibling_check_runs_where_asked(tmp_path, monkeypatch, flag, m, tp, available, want):
    pytest.importorskip("mlx_lm")
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning import SiblingCheck, linears

    monkeypatch.setattr(linears, "group_launch_available", lambda: available)
    seen = []

    def spy(model, tuner, *, tokens, **_):
        seen.append((tokens, tuner, tuning.get_tuner()))
        return SiblingCheck((), 10, {}, 0)

    monkeypatch.setattr(tuning, "check_siblings", spy)
    path = str(tmp_path / "t.json")
    code, text = run(["--model", tiny_model(tmp_path), "--m", m, "--tp", str(tp),
                      "--sibling-check", flag, "--decode-check", "off", "--check-layers", "1",
                      "--table", path] + TINY)
    assert code == 0, text
    assert [s[0] for s in seen] == ([want] if want else [])
    if want:
        tokens, tuner, active = seen[0]
        assert active is tuner and tuner.writable_path() == path
        assert "sibling check on tiny-llama's first 1 of 2 block(s), T = 16" in text
        assert "nothing to check" in text


@pytest.mark.parametrize("flag,m,tp,want", [
    ("on", "1,16", 1, [16]),  # forced on: the measured M >= 16
    ("auto", "16,32", 1, []),  # auto: not on a CPU
    ("off", "16", 1, []),
    ("on", "1,8", 1, []),  # no prefill length measured
    ("on", "16", 2, []),  # one rank only
])
def test_prefill_check_runs_where_asked(tmp_path, monkeypatch, flag, m, tp, want):
    pytest.importorskip("mlx_lm")
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning import PrefillCheck

    seen = []

    def spy(model, tuner, *, tokens, **_):
        seen.append((tokens, tuner, tuning.get_tuner()))
        return PrefillCheck((), 10, {}, 0)

    monkeypatch.setattr(tuning, "check_prefill", spy)
    path = str(tmp_path / "t.json")
    code, text = run(["--model", tiny_model(tmp_path), "--m", m, "--tp", str(tp),
                      "--prefill-check", flag, "--sibling-check", "off", "--decode-check",
                      "off", "--check-layers", "1", "--table", path] + TINY)
    assert code == 0, text
    assert [s[0] for s in seen] == ([want] if want else [])
    if want:
        tokens, tuner, active = seen[0]
        assert active is tuner and tuner.writable_path() == path
        assert "prefill check on tiny-llama's first 1 of 2 block(s), T = 16" in text
        assert "nothing to check" in text


def checks_given(tmp_path, monkeypatch, flag: str, m: str, argv: list[str]) -> dict:
    """Run ``tune --model`` with every model check on (those ``m`` allows) replaced by a
    spy; ``{check: the value of its argument flag}`` (``flag``: a keyword of the checks)."""
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning import PrefillCheck, SiblingCheck, linears
    from mlx_w8a8.tuning.decode_check import DecodeCheck

    monkeypatch.setattr(linears, "group_launch_available", lambda: True)
    seen = {}

    def spy(kind, result):
        def check(model, tuner, **kw):
            seen[kind] = kw[flag]
            return result
        return check

    monkeypatch.setattr(tuning, "check_decode", spy("decode", DecodeCheck((), 16, 6, {}, 0)))
    monkeypatch.setattr(tuning, "check_siblings", spy("sibling", SiblingCheck((), 10, {}, 0)))
    monkeypatch.setattr(tuning, "check_prefill", spy("prefill", PrefillCheck((), 10, {}, 0)))
    code, text = run(["--model", tiny_model(tmp_path), "--m", m, "--sibling-check", "on",
                      "--prefill-check", "on", "--decode-check", "on", "--check-layers", "1",
                      "--table", str(tmp_path / "t.json")] + argv + TINY)
    assert code == 0, text
    return seen


def refused_before_measuring(tmp_path, argv: list[str]) -> bool:
    fresh = str(tmp_path / "fresh.json")
    code = run(["--model", tiny_model(tmp_path), "--m", "16", "--table", fresh] + argv + TINY)[0]
    return code == 2 and not os.path.exists(fresh)


@pytest.mark.parametrize("given,want", [(None, None), ("0", 0), ("7", 7)])
def test_extra_rounds_reach_every_check(tmp_path, monkeypatch, given, want):
    """--extra-rounds sets the rounds each model check adds to an unsettled verdict
    (default None: the check's own first rounds again); below 0 is refused before
    anything is measured."""
    pytest.importorskip("mlx_lm")
    argv = [] if given is None else ["--extra-rounds", given]
    assert checks_given(tmp_path, monkeypatch, "extra_rounds", "1,16", argv) == {
        "decode": want, "sibling": want, "prefill": want}
    assert refused_before_measuring(tmp_path, ["--extra-rounds", "-1"])


@pytest.mark.parametrize("given,want", [(None, 10), ("24", 24)])
def test_prefill_rounds_reach_the_sibling_and_prefill_checks(tmp_path, monkeypatch, given, want):
    """--prefill-rounds sets both prefill-length checks' paired rounds (default: their
    own ROUNDS; the decode check keeps its --check-rounds); a value below 2 is refused
    before anything is measured."""
    pytest.importorskip("mlx_lm")
    from mlx_w8a8.tuning import decode_check, prefill_check, sibling_check

    assert tune.PREFILL_ROUNDS == sibling_check.ROUNDS == prefill_check.ROUNDS == 10
    argv = [] if given is None else ["--prefill-rounds", given]
    assert checks_given(tmp_path, monkeypatch, "rounds", "1,16", argv) == {
        "decode": decode_check.ROUNDS, "sibling": want, "prefill": want}
    assert refused_before_measuring(tmp_path, ["--prefill-rounds", "1"])


def test_an_unwritable_cache_folder_names_the_ways_around_it(tmp_path, capsys, monkeypatch):
    # A read-only cache folder used to end tune with the path and errno alone.
    measured = []
    monkeypatch.setattr(tune.Batch, "run", lambda self: measured.append(self))

    def no_write(*args, **kwargs):  # a folder this user may not write (root may write any)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path / "ro-cache"))
    monkeypatch.setattr(table.tempfile, "mkstemp", no_write)
    code, _ = run(["--shapes", "1x32x64"] + TINY)
    err = capsys.readouterr().err
    assert code == 1 and "cannot record into the table" in err and "Permission denied" in err
    for name in ("--table PATH", "MLX_W8A8_TUNING_TABLE=PATH", "MLX_W8A8_CACHE_DIR=DIR"):
        assert name in err, err
    # A table named by the environment: the advice names the ways to name another.
    monkeypatch.setenv(table.ENV_TABLE, str(tmp_path / "ro" / "t.json"))
    code, _ = run(["--shapes", "1x32x64"] + TINY)
    err = capsys.readouterr().err
    assert code == 1 and "name a writable table with --table PATH (or MLX_W8A8_TUNING_TABLE" in err
    assert not measured


def test_show_reports_invalid_entries_and_exits_nonzero(tmp_path):
    # Before: ``--show`` printed ``None`` for wrong-typed fields and exited 0.
    key = table.device_key()
    good = {"op": "linear", "m_bucket": 1, "n": 64, "k": 32, "dtype": "float32",
            "weight_format": "per_channel", "group_size": 32, "choice": "exact", "candidates": {}}
    path = str(tmp_path / "hand.json")
    with open(path, "w") as f:
        json.dump({"schema": 1, "sections": [dict(key, entries=[
            {**good, "m_bucket": "one"}, good, {**good, "n": None}])]}, f, indent=1)
    code, text = run(["--show", path])
    assert code == 1
    assert "2 invalid entries" in text
    lines = table.entry_lines(open(path).read())
    assert f"{path}:{lines[(0, 0)]}: section 0 entry 0 (linear M='one' N=64 K=32): m_bucket is 'one'" in text
    assert f"{path}:{lines[(0, 2)]}: section 0 entry 2 (linear M=1 N=None K=32): n is None" in text
    assert "None" not in text.split("invalid entries")[0]  # no row of Nones in the table
    with open(path, "w") as f:  # the control: the valid entry alone shows, exit 0
        json.dump({"schema": 1, "sections": [dict(key, entries=[good])]}, f, indent=1)
    code, text = run(["--show", path])
    assert code == 0 and "invalid entr" not in text


def _after_each_record(monkeypatch, then):
    """Run ``then(tuner, entry)`` after each entry the tuner records (what another
    process writing the same table would do meanwhile)."""
    real = Tuner.record

    def record(self, claim, entry):
        real(self, claim, entry)
        then(self, entry)

    monkeypatch.setattr(Tuner, "record", record)


def test_entries_another_writer_dropped_are_written_again(tmp_path, capsys, monkeypatch):
    # Before: "could not be recorded ... (see the warning above)", exit 1, and no
    # warning was printed (nothing failed here: another writer, with another cache
    # directory and so another lock, replaced the table without the entry).
    path = str(tmp_path / "t.json")

    def other_writer_drops_it(tuner, entry):
        with open(path, "w") as f:
            json.dump({"schema": 1, "sections": []}, f)

    _after_each_record(monkeypatch, other_writer_drops_it)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, text = run(["--shapes", "1x32x64", "--table", path] + TINY)
    assert code == 0, capsys.readouterr().err
    assert not [w for w in seen if issubclass(w.category, table.TuningTableWarning)]
    assert "1 measured entry dropped from" in text and "written again" in text
    (entry,) = table.matching_entries(table.read(path), table.device_key(), path)
    assert (entry["n"], entry["k"]) == (32, 64)


def test_entries_still_missing_are_said_why_not_see_the_warning_above(tmp_path, capsys, monkeypatch):
    # Every write of this table is undone by another writer: the exit message says so.
    path = str(tmp_path / "t.json")
    real = table.write_entries

    def written_then_dropped(p, key, entries):
        real(p, key, entries)
        with open(p, "w") as f:
            json.dump({"schema": 1, "sections": []}, f)

    monkeypatch.setattr(table, "write_entries", written_then_dropped)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, _ = run(["--shapes", "1x32x64", "--table", path] + TINY)
    err = capsys.readouterr().err
    assert code == 1 and not [w for w in seen if issubclass(w.category, table.TuningTableWarning)]
    assert "1 of 1 measured entries are not in" in err and "kept replacing" in err, err
    assert "see the warning above" not in err


def test_entries_another_tuner_measured_after_this_one_are_not_a_failure(tmp_path, capsys, monkeypatch):
    # Four tuners with their own cache directories measure the same keys (no shared
    # claims); the one that writes last keeps its measurement. Before: exit 1 for the
    # others, "see the warning above", and no warning.
    path = str(tmp_path / "t.json")

    def other_tuner_writes_the_same_key(tuner, entry):
        table.write_entries(path, tuner.key, [dict(entry, measured_at="later", choice="exact")])

    _after_each_record(monkeypatch, other_tuner_writes_the_same_key)
    code, text = run(["--shapes", "1x32x64", "--table", path] + TINY)
    assert code == 0, capsys.readouterr().err
    assert "1 measured entry was also measured by another tuner" in text


def test_a_failed_write_names_its_reason_in_the_exit_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(table, "check_writable", lambda path: None)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.warns(table.TuningTableWarning):
        code, _ = run(["--shapes", "1x32x64", "--table", str(bad)] + TINY)
    err = capsys.readouterr().err
    assert code == 1 and f"1 of 1 measured entries are not in {bad}: {bad}: not valid JSON" in err


def raced_pairs(text: str) -> list[set[str]]:
    """The ``{choice, challenger}`` of each prefill-check line at T = 16."""
    import re

    return [set(m.groups()) for m in re.finditer(r"T=16 .*?\): (\S+) -> (\S+) ", text)]


def test_model_checks_of_the_4bit_format_run_4bit_layers(tmp_path):
    """tune --model --format grouped4: the shapes are 4-bit problems, and the model the
    checks time holds MLX's 4-bit layers (converted as stored), so the prefill check
    races the 4-bit kernels (an 8-bit model there would race mlx_qmm and exact)."""
    pytest.importorskip("mlx_lm")
    code, text = run(["--model", tiny_model(tmp_path), "--m", "16", "--format", "grouped4",
                      "--prefill-check", "on", "--check-layers", "1",
                      "--table", str(tmp_path / "t.json")] + TINY)
    assert code == 0, text
    assert "64x64 grouped4 g32: o_proj, q_proj" in text
    assert {e["weight_format"] for e in entries_of(str(tmp_path / "t.json"))} == {"grouped4"}
    raced = raced_pairs(text)
    # 4-bit layers: the 4-bit kernels and the format-blind W16 ones, never an 8-bit one.
    assert raced and set().union(*raced) <= {"mlx_qmm4", "exact_w4a8", "mlx_dequant_matmul"}, text
    assert all(pair & {"mlx_qmm4", "exact_w4a8"} for pair in raced), text


def test_model_with_activation_groups_tunes_and_checks_their_problems(tmp_path, capsys):
    """tune --model --format grouped --act-scales group: the entries are keyed as
    activation-group problems, and the prefill check's model holds layers with them (so
    it races exact_act_groups, never a per-token kernel); per-channel is refused."""
    pytest.importorskip("mlx_lm")
    path = str(tmp_path / "t.json")
    code, text = run(["--model", tiny_model(tmp_path), "--m", "16", "--format", "grouped",
                      "--act-scales", "group", "--prefill-check", "on", "--check-layers", "1",
                      "--table", path] + TINY)
    assert code == 0, text
    entries = entries_of(path)
    assert entries and {(e["weight_format"], e.get("act_scales")) for e in entries} == {
        ("grouped", "group")}
    assert all(set(e["candidates"]) == {"mlx_qmm", "exact_act_groups", "mlx_dequant_matmul"}
               for e in entries)
    raced = raced_pairs(text)
    # Layers with activation groups: exact_act_groups and the W16 kernels (which ignore
    # act_scales), never a per-token W8A8 kernel.
    assert raced and set().union(*raced) <= {"mlx_qmm", "exact_act_groups",
                                             "mlx_dequant_matmul"}, text
    capsys.readouterr()
    code, _ = run(["--model", tiny_model(tmp_path), "--m", "16", "--act-scales", "group",
                   "--table", path] + TINY)
    assert code == 2 and "--act-scales group takes --format grouped or grouped4" in capsys.readouterr().err
