"""``python -m mlx_w8a8.bench``: paired qualification and the Cider-style comparison."""

import io
import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8 import bench
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate, Problem
from mlx_w8a8.tuning import gate, table

# float32: every arm is accurate there, so a failure below means the arm is wrong
TINY = ["--cases", "2x32x64", "1x64x32", "--dtype", "float32", "--group-size", "32",
        "--warmup", "1", "--chain", "1"]


def run(argv, tmp_path):
    out = io.StringIO()
    jsonl = tmp_path / "out.jsonl"
    code = bench.main(argv + ["--jsonl", str(jsonl)], out=out)
    lines = [json.loads(l) for l in jsonl.read_text().splitlines()] if jsonl.exists() else []
    return code, out.getvalue(), lines


@pytest.fixture
def drift():
    qmm = registry.get("linear", "mlx_qmm")
    registry.register(Candidate(name="bench_drift", backend="any", op="linear",
                                run=lambda x, w, b: qmm.run(x, w, b) + 0.5, digest="drift"))
    yield
    registry.unregister("linear", "bench_drift")


def test_oracle_is_the_float_product_of_the_stored_weight():
    p = Problem("linear", 3, 16, 64, "float32", "grouped", 32, True)
    x, w, b = gate.operands(p, 2)[1]
    want = (np.array(x, dtype=np.float64) @ np.array(w.dequantize(), dtype=np.float64).T
            + np.array(b, dtype=np.float64))
    assert np.allclose(bench.oracle(x, w, b), want, rtol=1e-6, atol=1e-6)


def test_qualification_writes_json_lines_and_a_summary(tmp_path):
    code, text, lines = run(["--baseline", "mlx_qmm", "--candidate", bench.EXACT] + TINY, tmp_path)
    assert code == 0, text
    heads = [l for l in lines if "baseline" in l and "pair" not in l]
    pairs = [l for l in lines if "pair" in l]
    afters = [l for l in lines if l.get("after")]
    assert len(heads) == 2 and len(afters) == 2
    assert len(pairs) == 2 * bench.MIN_PAIRS  # >= 30 pairs per case
    h = heads[0]
    assert h["baseline"]["name"] == "mlx_qmm" and h["candidate"]["name"] == bench.EXACT
    assert h["baseline"]["digest"] and h["device"]["mlx_version"] == mx.__version__
    assert h["failures"] == [] and all(e is not None for e in h["max_abs_error"])
    assert all(p["baseline_ns"] > 0 and p["candidate_ns"] > 0 for p in pairs)
    assert "median ratio" in text and "linear-2x32x64-float32-per_channel" in text
    assert text.count(" ok") >= 2
    assert all(h["chain_link"] == "dependent" for h in heads)  # as a model's layers run


def test_independent_chains_on_request(tmp_path, timed_links):
    code, text, lines = run(["--baseline", "mlx_qmm", "--candidate", bench.EXACT, "--independent"]
                            + TINY, tmp_path)
    heads = [l for l in lines if "baseline" in l and "pair" not in l]
    assert code == 0 and heads and all(h["chain_link"] == "independent" for h in heads)
    assert timed_links and all(link is None for link in timed_links)


def test_wrong_candidate_fails_the_oracle_check(tmp_path, drift):
    code, text, lines = run(["--candidate", "bench_drift"] + TINY, tmp_path)
    assert code == 1 and "FAIL: candidate" in text
    head = next(l for l in lines if "failures" in l and not l.get("after"))
    assert any(f.startswith("bench_drift:") for f in head["failures"])
    after = next(l for l in lines if l.get("after"))
    assert after["failing"] == ["candidate"] and after["verdict"] == "FAIL"
    assert "candidate bench_drift fails the oracle" in text


@pytest.fixture
def bf16_drift():
    """A kernel accurate on float32 activations but off in bfloat16: the shape of MLX's
    CPU bfloat16 quantized_matmul (accurate when the same weights see float32 input)."""
    qmm = registry.get("linear", "mlx_qmm")

    def run(x, w, b):
        y = qmm.run(x, w, b)
        return y + 0.5 if x.dtype == mx.bfloat16 else y

    registry.register(Candidate(name="bench_bf16_drift", backend="any", op="linear", run=run,
                                digest="bf16drift"))
    yield
    registry.unregister("linear", "bench_bf16_drift")


def test_inaccurate_baseline_is_named_and_does_not_fail_the_run(tmp_path, bf16_drift):
    # bfloat16, where the baseline is the side that misses the oracle
    argv = ["--baseline", "bench_bf16_drift", "--candidate", bench.EXACT, "--cases", "2x32x64",
            "--group-size", "32", "--warmup", "1", "--chain", "1"]
    code, text, lines = run(argv, tmp_path)
    assert code == 0, text
    after = next(l for l in lines if l.get("after"))
    assert after["failing"] == ["baseline"] and after["verdict"] == "baseline_off_oracle"
    (why,) = after["explanation"]
    assert why.startswith("baseline bench_bf16_drift fails the oracle")
    assert "on float32-upcast activations the same kernel is within tolerance" in why
    assert "ok, baseline off" in text and "FAIL" not in text and why in text


def test_tables_as_arms(tmp_path):
    key = table.device_key()
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    entry = {"op": "linear", "m_bucket": 2, "n": 32, "k": 64, "dtype": "float32",
             "weight_format": "per_channel", "group_size": 32,
             # an entry must say what it measured (digests), else it is stale
             "candidates": {n: {"digest": registry.get("linear", n).digest}
                            for n in ("mlx_qmm", bench.EXACT)}}
    table.write_entries(a, key, [dict(entry, choice="mlx_qmm")])
    table.write_entries(b, key, [dict(entry, choice=bench.EXACT)])
    code, text, lines = run(["--baseline-table", a, "--candidate-table", b] + TINY, tmp_path)
    assert code == 0, text
    head = lines[0]
    assert head["baseline"]["choice"] == "mlx_qmm" and head["candidate"]["choice"] == bench.EXACT
    assert head["candidate"]["table_hit"] is True
    # the second case (1x64x32) is in neither table: both arms run the fallback
    second = next(l for l in lines if l.get("case", "").startswith("linear-1x64x32") and "baseline" in l)
    assert second["candidate"]["table_hit"] is False and second["candidate"]["name"] == "mlx_qmm"


def test_fewer_than_30_pairs_or_mixed_arms_are_refused(tmp_path):
    assert run(["--pairs", "29"] + TINY, tmp_path)[0] == 2
    assert run(["--baseline", "mlx_qmm", "--baseline-table", "x.json"] + TINY, tmp_path)[0] == 2
    assert run(["--candidate", "no_such_kernel"] + TINY, tmp_path)[0] == 1


def test_malformed_cases_are_reported_as_the_bench_s(tmp_path, capsys):
    # The shape parser is shared with tune: the message names the command that was run.
    for cases, want in ((["0x1x1"], "shape must be MxNxK"), ([","], "--cases named no shape")):
        assert run(["--cases", *cases], tmp_path)[0] == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"[mlx_w8a8.bench] {want}") and "mlx_w8a8.tune" not in err, err


def test_cider_comparison_has_four_arms(tmp_path):
    code, text, lines = run(["--cider", "--shapes", "4x32x64", "--group-size", "32",
                             "--warmup", "1", "--chain", "1"], tmp_path)
    assert code == 0, text
    (rec,) = lines
    assert set(rec["median_ns"]) == {"w8a8-full", "int8-raw", "qmm-w8a16", "bf16-matmul"}
    # MLX's own arms always time; a package kernel that crashes is reported, not fatal
    for arm, samples in rec["samples_ns"].items():
        assert len(samples) == bench.MIN_PAIRS or arm in rec["unavailable"]
    assert len(rec["samples_ns"]["qmm-w8a16"]) == len(rec["samples_ns"]["bf16-matmul"]) == bench.MIN_PAIRS
    assert rec["w8a8_kernel"] != "mlx_qmm"  # the full pipeline is a W8A8 kernel
    assert "full/raw" in text and "qmm/full" in text


def test_cider_times_the_kernel_the_op_runs_unforced():
    # The W8A8 and raw arms run the kernel a call without kernel= gets (a table's choice,
    # a borrowed one, the built-in prior), not merely the first device kernel listed: on
    # an H200 without table entries for a shape that first one was the older mma.sync
    # GEMM where the prior picks the TMA GEMM. Where the op would run mx.quantized_matmul
    # or the exact kernel, the first device kernel stands in.
    import attrs

    exact = registry.get("linear", "exact")
    fakes = [attrs.evolve(exact, name=n, backend="cuda", available=lambda: True)
             for n in ("bench_dev_a", "bench_dev_b")]
    for f in fakes:
        registry.register(f)
    p = Problem("linear", 512, 64, 32, "bfloat16", "per_channel", 32)
    pick = {"name": "bench_dev_b"}
    previous = registry.set_chooser(
        lambda problem, found: next(c for c in found if c.name == pick["name"]))
    try:
        assert bench._device_kernel(p) == "bench_dev_b"
        for decided in ("mlx_qmm", "exact"):
            pick["name"] = decided
            registry.invalidate()  # decisions are kept until then (registry.decide)
            assert bench._device_kernel(p) == "bench_dev_a"
    finally:
        registry.set_chooser(previous)
        for f in fakes:
            registry.unregister("linear", f.name)


def test_cider_shape_list_is_the_seeds_in_m_n_k_order():
    # The seed lists (M, K, N); 128 x 3584 x 18944 there is the Qwen2.5-7B up projection.
    assert (128, 18944, 3584) in bench.CIDER_SHAPES and (512, 3584, 18944) in bench.CIDER_SHAPES
    assert len(bench.CIDER_SHAPES) == 11


def test_qualification_times_kernels_as_layers_run_them(tmp_path, bound_spy):
    # A candidate with bound launches (bind_stages) must be timed and checked through
    # them, as mlx_w8a8.Linear runs it and the tuner times it, not through run(), which
    # builds every launch anew (about 4x the Python of the bound CUDA path).
    calls, run_, bind_stages = bound_spy
    registry.register(Candidate(name="bench_bound", backend="any", op="linear", run=run_,
                                digest="bound", bind_stages=bind_stages, w8a8=False))
    try:
        code, text, _ = run(["--baseline", "mlx_qmm", "--candidate", "bench_bound",
                             "--cases", "2x32x64", "--dtype", "float32", "--group-size", "32",
                             "--warmup", "1", "--chain", "1"], tmp_path)
    finally:
        registry.unregister("linear", "bench_bound")
    assert code == 0, text
    assert calls["run"] == 0
    # one binding per (weight, bias) of the case's operands, every launch through it
    assert 1 <= calls["bind"] <= 4 and calls["apply"] >= bench.MIN_PAIRS


def test_the_table_by_default_and_json_lines_only_when_asked(tmp_path, capsys):
    # The bench used to print JSON lines on stdout before its table by default.
    one = ["--cases", "1x64x32", "--dtype", "float32", "--group-size", "32", "--warmup", "1",
           "--chain", "1"]
    assert bench.main(one) == 0
    got = capsys.readouterr()
    assert "median ratio" in got.out and "linear-1x64x32" in got.out
    assert not any(line.startswith("{") for line in (got.out + got.err).splitlines())
    # --json alone: JSON lines (and only they) on stdout, the table on stderr
    assert bench.main(one + ["--json"]) == 0
    got = capsys.readouterr()
    records = [json.loads(line) for line in got.out.splitlines()]
    assert records and records[0]["case"] == "linear-1x64x32-float32-per_channel"
    assert "median ratio" in got.err
    # --json FILE: the records there, the table on stdout
    path = tmp_path / "r.jsonl"
    assert bench.main(one + ["--json", str(path)]) == 0
    got = capsys.readouterr()
    assert [json.loads(line)["case"] for line in path.read_text().splitlines()] == \
        [r["case"] for r in records]
    assert "median ratio" in got.out and "{" not in got.out


# MLX's 4-bit format (grouped4): mlx_qmm4 and the W4A8 kernels against the float oracle.
def test_oracle_unpacks_4bit_words_itself(rng):
    """The oracle's own unpacking of 4-bit words gives MLX's codes, and its product is
    the float product of MLX's dequantized weight (odd N, K of several groups)."""
    p = Problem("linear", 3, 24, 192, "float32", "grouped4", 64, True)
    x, w, b = gate.operands(p, 2, seed=int(rng.integers(1 << 30)))[1]
    assert w.bits == 4
    codes = bench.stored_codes(w)
    assert codes.shape == (24, 192) and np.array_equal(codes, np.array(w.codes()))
    assert codes.max() > 7  # high nibbles present: a swapped nibble order would show
    want = (np.array(x, dtype=np.float64)
            @ np.array(mx.dequantize(w.q, w.scales, w.biases, 64, 4), dtype=np.float64).T
            + np.array(b, dtype=np.float64))
    assert np.allclose(bench.oracle(x, w, b), want, rtol=1e-6, atol=1e-6)
    # a known word: codes 0..7 of one word, in bits 4j .. 4j + 3
    word = sum(j << (4 * j) for j in range(8))
    one = type("W", (), {"q": mx.array([[word]], dtype=mx.uint32), "bits": 4, "n": 1, "k": 8})
    assert bench.stored_codes(one).tolist() == [list(range(8))]


def test_grouped4_qualification_runs_the_4bit_reference_against_the_exact_w4a8(tmp_path):
    code, text, lines = run(["--format", "grouped4", "--cases", "2x32x64", "33x70x128",
                             "--dtype", "float32", "--group-size", "32", "--warmup", "1",
                             "--chain", "1"], tmp_path)
    assert code == 0, text
    heads = [l for l in lines if "baseline" in l and "pair" not in l]
    assert [(h["baseline"]["name"], h["candidate"]["name"]) for h in heads] == [
        ("mlx_qmm4", "exact_w4a8")] * 2
    assert all(h["failures"] == [] for h in heads)
    assert "linear-33x70x128-float32-grouped4" in text and "exact_w4a8" in text
    afters = [l for l in lines if l.get("after")]
    assert [a["verdict"] for a in afters] == ["ok", "ok"]


def test_a_wrong_4bit_candidate_fails_the_bench(tmp_path):
    """W4A8 with the codes read as signed nibbles (q - 8): the oracle sees it."""
    from mlx_w8a8.kernels import reference
    from mlx_w8a8.weight import QuantizedWeight

    def signed(x, w, b):
        shifted = QuantizedWeight(w.q, w.scales, w.biases + 8 * w.scales, w.group_size,
                                  per_channel=False, bits=4)
        return reference.w4a8_linear(x, shifted, b)

    registry.register(Candidate(name="bench_signed4", backend="any", op="linear", run=signed,
                                digest="signed4", supports=lambda p: p.weight_format == "grouped4"))
    try:
        code, text, lines = run(["--format", "grouped4", "--candidate", "bench_signed4",
                                 "--cases", "2x32x64", "--dtype", "float32", "--group-size", "32",
                                 "--warmup", "1", "--chain", "1"], tmp_path)
    finally:
        registry.unregister("linear", "bench_signed4")
    assert code == 1, text
    after = next(l for l in lines if l.get("after"))
    assert after["verdict"] == "FAIL" and after["failing"] == ["candidate"]
