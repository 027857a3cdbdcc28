"""The built-in prior: used when no table entry or borrowed decision exists."""

import os

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_w8a8
from mlx_w8a8 import backends
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.cuda import launch
from mlx_w8a8.kernels.registry import Candidate, Problem
from mlx_w8a8.tuning import prior, table

QMM = registry.get("linear", "mlx_qmm")


@pytest.fixture
def empty_tables(only_written_tables):
    yield only_written_tables
    for name in ("p_small", "p_large"):
        registry.unregister("linear", name)


def _fakes(monkeypatch):
    for name in ("p_small", "p_large"):
        registry.register(Candidate(name=name, backend="any", op="linear", run=QMM.run,
                                    supports=(lambda p: p.m <= 4) if name == "p_small" else (lambda p: True)))
    monkeypatch.setattr(prior, "RULES", {
        ("cpu", "linear", "per_channel"): [(1, 4, 0, ("p_small",)), (64, None, 0, ("missing", "p_large")),
                                           (5, 63, 64 * 64, ("p_large",))],
    })


def test_rules_pick_by_m_range_and_first_available(empty_tables, monkeypatch):
    _fakes(monkeypatch)
    found = lambda m: registry.candidates(Problem("linear", m, 32, 64, "float32", "per_channel", 32))  # noqa: E731
    pick = lambda m: prior.choose("cpu", Problem("linear", m, 32, 64, "float32", "per_channel", 32), found(m))  # noqa: E731
    assert pick(1).name == "p_small" and pick(4).name == "p_small"
    assert pick(16) is None  # 5..63 needs N*K >= 4096 (this weight is 32x64): fallback
    assert pick(64).name == "p_large" and pick(5000).name == "p_large"  # "missing" skipped
    assert prior.choose("cuda", Problem("linear", 1, 32, 64, "float32", "per_channel", 32), found(1)) is None
    assert prior.choose("cpu", Problem("linear", 1, 32, 64, "float32", "grouped", 32), found(1)) is None
    big = Problem("linear", 16, 64, 64, "float32", "per_channel", 32)
    assert prior.choose("cpu", big, registry.candidates(big)).name == "p_large"


def test_layer_reports_where_its_kernel_came_from(empty_tables, monkeypatch):
    _fakes(monkeypatch)
    layer = mlx_w8a8.Linear.from_linear(nn.Linear(64, 32), group_size=32)
    assert layer.decision(1, mx.float32) == ("p_small", "prior")
    assert layer.decision(16, mx.float32) == ("mlx_qmm", "fallback")
    mx.eval(layer(mx.ones((2, 64))), layer(mx.ones((100, 64))))
    text = repr(layer)
    assert "M=2: p_small (prior)" in text and "M=100: p_large (prior)" in text
    layer.kernel = "mlx_qmm"
    assert layer.decision(1, mx.float32) == ("mlx_qmm", "forced")


def test_shipped_rules_name_registered_kernels():
    # A renamed kernel must not silently drop out of the prior.
    for (_, op, _), rules in prior.RULES.items():
        known = {c.name for c in registry.all_candidates() if c.op == op}
        for _, _, _, names in rules:
            assert any(n in known for n in names), (op, names)


def test_cpu_default_is_the_exact_w8a8_kernel(empty_tables):
    # Measured on MLX's CPU backend (prior.py cites the figures): W8A8 exact is faster
    # and more accurate than mx.quantized_matmul for per-channel weights.
    if backends.name() != "cpu":
        pytest.skip("the CPU rule applies to MLX's CPU backend")
    layer = mlx_w8a8.Linear.from_linear(nn.Linear(64, 32), group_size=32)
    assert layer.decision(1) == (registry.EXACT, "prior")
    grouped = mlx_w8a8.Linear.from_linear(nn.Linear(64, 32), group_size=32, per_channel=False)
    assert grouped.decision(1) == ("mlx_qmm", "prior")
    assert grouped.decision(4) == (registry.EXACT, "prior")  # batched decode
    assert grouped.decision(16) == (registry.EXACT, "prior")  # an mlx-lm 8-bit model's prefill


def _cpu_rule_agrees_with(log: str, fmt: str, tie: float = 1.0) -> list[dict]:
    """Every entry of the recorded CPU tune table ``bench/results/<log>`` (format
    ``fmt``): the CPU prior picks its measured choice, or a kernel whose measured median
    is within ``tie`` times the choice's. Returns the entries."""
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "bench", "results", log)
    with open(path) as f:
        (section,) = json.load(f)["sections"]
    assert section["backend"] == "cpu"
    found = [c for c in registry.all_candidates() if c.op == "linear" and c.backend == "any"]
    entries = [e for e in section["entries"] if e["weight_format"] == fmt]
    for e in entries:
        problem = Problem("linear", e["m_bucket"], e["n"], e["k"], e["dtype"], fmt,
                          e["group_size"], False, e.get("act_scales", "token"))
        picked = prior.choose("cpu", problem, [c for c in found if c.handles(problem)])
        assert picked is not None, (e["m"], e["n"])
        times = {n: c["median_ns"] for n, c in e["candidates"].items()}
        assert picked.name == e["choice"] or times[picked.name] <= tie * times[e["choice"]], (
            e["m"], e["n"], picked.name)
    return entries


def test_cpu_rules_for_grouped_weights_pick_the_measured_kernels():
    """The CPU rule for group-wise weights summarizes a recorded tune run (prior.py cites
    it): at every measured point (M = 1, 2, 4, 8, 16, 128; lm_head-sized weights at
    M = 2 and 8) it picks the measured choice, or exact where that took within 1.02x of
    mlx_dequant_matmul's time (49152 x 576 at M = 2, 128256 x 2048 at M = 8)."""
    entries = _cpu_rule_agrees_with("tune_cpu_grouped_2026-12-04.json", "grouped", tie=1.02)
    assert len(entries) == 16 and {e["m_bucket"] for e in entries} == {1, 2, 4, 8, 16, 128}
    # the large-weight rule is what the lm_head-sized entries need: without it, exact
    # (2.0x mx.quantized_matmul's time at M = 2 on 128256 x 2048) would be picked
    assert any(e["n"] * e["k"] >= 1 << 27 and e["choice"] == "mlx_qmm" for e in entries)


def test_cpu_rules_for_activation_groups_pick_the_measured_kernels(empty_tables):
    """With act_scales="group" the CPU rules summarize their own recorded tune run: the
    measured choice at every point but one tie (M = 1, 2048 x 2048: exact_act_groups by
    1.05x; the rule keeps mx.quantized_matmul), and a layer decides by them."""
    log = "tune_cpu_act_groups_2026-12-05.json"
    assert len(_cpu_rule_agrees_with(log, "grouped", tie=1.06)) == 5
    assert len(_cpu_rule_agrees_with(log, "grouped4")) == 5
    if backends.name() == "cpu":
        for bits, w16 in ((8, "mlx_qmm"), (4, "mlx_qmm4")):
            layer = mlx_w8a8.Linear(64, 32, group_size=32, per_channel=False, bits=bits,
                                    act_scales="group")
            assert layer.decision(1) == (w16, "prior")
            assert layer.decision(16) == ("exact_act_groups", "prior")


def test_cpu_rules_for_4bit_weights_pick_the_measured_kernels(empty_tables):
    """The CPU rule for MLX's 4-bit weights summarizes a recorded tune run (prior.py
    cites it): at every measured point (M = 1, 2, 4, 8, 16, 128; lm_head-sized weights
    at M = 2 and 8) it picks the measured choice, or exact_w4a8 where that took within
    1.02x of mlx_dequant_matmul's time (128256 x 2048 at M = 8), and a 4-bit layer
    decides by it; with activation groups M = 2-15 (not measured for them) keeps the
    fallback."""
    entries = _cpu_rule_agrees_with("tune_cpu_grouped4_2026-12-04.json", "grouped4", tie=1.02)
    assert all(e["reference"] == "mlx_qmm4" for e in entries)
    assert sorted({e["choice"] for e in entries}) == [
        "exact_w4a8", "mlx_dequant_matmul", "mlx_qmm4"]
    assert len(entries) == 14 and {e["m_bucket"] for e in entries} == {1, 2, 4, 8, 16, 128}
    if backends.name() == "cpu":  # the rule applies to MLX's CPU backend
        layer = mlx_w8a8.Linear(64, 32, group_size=32, bits=4)
        assert layer.decision(1) == ("mlx_qmm4", "prior")
        assert layer.decision(4) == ("exact_w4a8", "prior")  # batched decode
        assert layer.decision(16) == ("exact_w4a8", "prior")  # an mlx-lm 4-bit model's prefill
        grouped = mlx_w8a8.Linear(64, 32, group_size=32, per_channel=False, bits=4,
                                  act_scales="group")
        assert grouped.decision(4) == ("mlx_qmm4", "fallback")


def test_cuda_rules_agree_with_the_shipped_h200_table():
    """The CUDA rules summarize the shipped H200 table (prior.py cites it): on every entry
    they pick the table's kernel family: W8A8 on int8 activations (the GEMMs
    cuda_w8a8_gemm, _ws and _tma, or the fused GEMV cuda_int8_gemv) or
    mx.quantized_matmul; at M = 2-7 (the rules come from an H100 tune, checked below)
    another family only where the rule's kernel took at most 1.10x the winner's time in
    that entry's race (M = 2 on 4096 x 4096: a tie, 45.5 against 44.7 us). Entries a
    sibling check turned to mx.quantized_matmul decide how a group runs, not a single
    layer, and are left out. Re-measuring the table without revisiting the rules fails
    here."""
    family = lambda name: (  # noqa: E731
        "w8a8" if name.startswith("cuda_w8a8_gemm") or name == "cuda_int8_gemv" else name)
    paths = [p for p in table.shipped_table_paths() if p.endswith("nvidia-h200.json")]
    entries = table.read(paths[0])["sections"][0]["entries"]
    cuda = [c for c in registry.all_candidates() if c.op == "linear" and c.backend in ("cuda", "any")]
    checked = 0
    for e in entries:
        if e["weight_format"] != "per_channel":
            continue
        if e.get("sibling_check") and not e["sibling_check"]["kept"]:
            continue  # a sibling group's verdict (its members run alone), not a layer's race
        problem = Problem("linear", e["m_bucket"], e["n"], e["k"], e["dtype"], "per_channel",
                          e["group_size"])
        picked = prior.choose("cuda", problem, cuda)
        name = picked.name if picked else "mlx_qmm"
        where = (e["m_bucket"], e["n"], e["k"], e["choice"], name)
        if family(name) != family(e["choice"]):
            times = e["candidates"]
            assert 2 <= e["m_bucket"] <= 7, where
            assert times[name]["median_ns"] <= 1.10 * times[e["choice"]]["median_ns"], where
        checked += 1
    assert checked >= 60  # 7 shapes at each of M = 1, 2, 4, 8 among them


def test_cuda_rules_for_grouped_weights_hold_against_the_h200_race_they_replaced():
    """The H200 tune of group-wise 8-bit weights at M = 16 (2026-12-05, its entries left
    out of the shipped table since: tables/README.md) against the CUDA rule: the rule
    picks the tensor-core GEMV, which that race predates, and no W8A8 kernel of the race
    won by more than 1.9x there (so the rule replaces no large measured win)."""
    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "bench", "results")
    checked = 0
    for line in open(os.path.join(results, "h200_2026-12-05_c_tune_g64.log")):
        fields = line.split()
        if len(fields) < 6 or fields[0] != "16" or fields[4] != "grouped":
            continue
        n, k = int(fields[1]), int(fields[2])
        picked = prior.choose("cuda", Problem("linear", 16, n, k, "bfloat16", "grouped", 64),
                              _cuda_linears())
        speedup = float(next(f for f in fields if f.endswith("x") and f[:-1].replace(".", "").isdigit())[:-1])
        assert picked.name == "cuda_int8_gemv_mma" and speedup < 1.9, (n, k, speedup)
        checked += 1
    assert checked == 7


# A Llama-3-8B block's launches (N, K), siblings fused: q+k+v, o, gate+up, down.
LLAMA_BLOCK = {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)}


def _cuda_linears() -> list[Candidate]:
    """The linear candidates a CUDA machine has."""
    return [c for c in registry.all_candidates() if c.op == "linear" and c.backend in ("cuda", "any")]


def _h100_decisions(weight_format: str) -> list[tuple[dict, Candidate | None, dict[str, float]]]:
    """The ``weight_format`` entries of the recorded H100 tunes
    (bench/results/h100_2026-12-05_f_table.json, which prior.py cites), each with the
    prior's pick among the linear candidates a CUDA machine has (``None``: no rule) and
    the entry's median times by candidate."""
    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "bench", "results")
    doc = table.read(os.path.join(results, "h100_2026-12-05_f_table.json"))
    (section,) = [s for s in doc["sections"] if s["device"]["device_name"] == "NVIDIA H100 80GB HBM3"]
    cuda = _cuda_linears()
    out = []
    for e in section["entries"]:
        if e["weight_format"] != weight_format:
            continue
        problem = Problem("linear", e["m_bucket"], e["n"], e["k"], e["dtype"], weight_format,
                          e["group_size"])
        times = {name: c["median_ns"] for name, c in e["candidates"].items() if c["status"] == "ok"}
        out.append((e, prior.choose("cuda", problem, cuda), times))
    return out


def test_cuda_rules_for_grouped_prefill_agree_with_the_h100_race():
    """From M = 33 the group-wise 8-bit rule picks the subnormal-promotion GEMM (bfloat16
    activations), with the dequantizing GEMM (weights from 4096 x 4096), the
    dequantize-then-matmul kernel (smaller ones) or, below M = 512, the group-wise TMA
    GEMM after it for activations it refuses. Part SPR's race (every candidate, the
    pipelined subnormal mainloop): the subnormal GEMM is the fastest on all 7 shapes at
    M = 128, and within 1.04x of the fastest at M = 512 and 2048 (the fastest on
    6 and 4 of 7)."""
    decisions = [d for d in _h100_decisions("grouped") if d[0]["m_bucket"] >= 128]
    assert len(decisions) == 21 and {e["m_bucket"] for e, _, _ in decisions} == {128, 512, 2048}
    bound = {128: 1.0, 512: 1.04, 2048: 1.04}
    fastest = {128: 0, 512: 0, 2048: 0}
    for e, picked, times in decisions:
        assert {"cuda_dequant_gemm", "cuda_dequant_matmul", "cuda_w8a8_gemm_subnormal"} <= set(times), e
        best = min(times.values())
        assert picked.name == "cuda_w8a8_gemm_subnormal", e
        assert times[picked.name] <= bound[e["m_bucket"]] * best, e
        fastest[e["m_bucket"]] += e["choice"] == picked.name
    assert fastest == {128: 7, 512: 6, 2048: 4}
    cuda = _cuda_linears()
    for m, n, k, name in ((511, 4096, 4096, "cuda_w8a8_gemm_subnormal"),
                          (128, 1024, 4096, "cuda_w8a8_gemm_subnormal"),
                          (127, 14336, 4096, "cuda_w8a8_gemm_subnormal"),
                          (33, 4096, 4096, "cuda_w8a8_gemm_subnormal"),
                          (32, 4096, 4096, "cuda_int8_gemv_mma"),
                          (512, 1024, 4096, "cuda_w8a8_gemm_subnormal"),
                          (4096, 14336, 4096, "cuda_w8a8_gemm_subnormal")):
        problem = Problem("linear", m, n, k, "bfloat16", "grouped", 64)
        assert prior.choose("cuda", problem, cuda).name == name
    # float16 activations: the subnormal GEMM refuses them, the rules' next kernels run
    # (the first this machine supports: the TMA kernels need a Hopper GPU's driver)
    tma = ("cuda_w8a8_gemm_grouped_tma", "cuda_w8a8_gemm_grouped")
    for m, n, want in ((256, 14336, tma),
                       (2048, 14336, ("cuda_dequant_gemm", "cuda_dequant_matmul") + tma),
                       (2048, 1024, ("cuda_dequant_matmul",) + tma)):
        fp16 = Problem("linear", m, n, 4096, "float16", "grouped", 64)
        assert not registry.get("linear", "cuda_w8a8_gemm_subnormal").supports(fp16)
        assert prior.choose("cuda", fp16, [c for c in cuda if c.supports(fp16)]).name in want


def test_cuda_rules_for_4bit_weights_agree_with_the_h100_tunes():
    """The CUDA rules for MLX's 4-bit weights summarize four recorded tune runs on an
    H100 (prior.py cites them), 7 Llama-3-8B shapes each: from M = 128 the dequantizing
    GEMM for weights from 4096 x 4096 (part DQR's race: the fastest, or within 1.12x of
    it at M = 128, 1.05x at 512 and 1.02x at 2048), for smaller ones the 4-bit TMA GEMM
    to M = 511 and then the dequantize-then-matmul kernel (within 1.06x); at M = 64 the
    measured kernel, the 4-bit TMA GEMM, on all 7 entries (it won at M = 32 too, where
    the tensor-core GEMV, raced later, runs: the test below); at M = 4 the GEMV
    exactly where it was measured fastest (the weights from 4096 x 4096); at M = 8 and
    16 the tensor-core GEMV, raced later (the test below), where these tunes had the dp4a
    GEMV fastest on all 7 at M = 8 and, at M = 16, losing the three wide shapes but
    making a Llama-3-8B block's launches fastest in sum; at M = 1 nothing (no gain in
    the model's decode)."""
    decisions = _h100_decisions("grouped4")
    cuda = _cuda_linears()
    assert len(decisions) == 63
    assert {e["m_bucket"] for e, _, _ in decisions} == {1, 4, 8, 16, 32, 64, 128, 512, 2048}
    gemvs = dq_fastest = 0
    block_sum: dict[str, float] = {}
    for e, picked, times in decisions:
        assert e["reference"] == "mlx_qmm4", e
        if e["m_bucket"] >= 128:  # part DQR's race, both dequantizing kernels in it
            assert "cuda_dequant_gemm" in times, e
            if e["n"] * e["k"] >= 4096 * 4096:
                want = "cuda_dequant_gemm"
            else:
                want = "cuda_w4a8_gemm_tma" if e["m_bucket"] < 512 else "cuda_dequant_matmul"
            assert picked.name == want, e
            bound = {128: 1.12, 512: 1.05, 2048: 1.02}[e["m_bucket"]] if want == "cuda_dequant_gemm" else 1.06
            assert times[picked.name] <= bound * min(times.values()), e
            dq_fastest += want == "cuda_dequant_gemm" and times[want] == min(times.values())
        elif e["m_bucket"] == 64:
            assert picked is not None and picked.name == e["choice"] == "cuda_w4a8_gemm_tma", e
            assert e["speedup"] > 1.05
        elif e["m_bucket"] == 32:  # the TMA GEMM won here; the GEMV came later (its own race)
            assert e["choice"] == "cuda_w4a8_gemm_tma" and e["speedup"] > 1.05, e
            assert picked.name == "cuda_w4a8_gemv_mma" and picked.name not in times, e
        elif e["m_bucket"] in (8, 16):  # the tensor-core GEMV came later (its own race)
            assert picked.name == "cuda_w4a8_gemv_mma" and picked.name not in times, e
            if e["m_bucket"] == 8:
                assert e["choice"] == "cuda_w4a8_gemv", e
                gemvs += 1
            elif e["choice"] != "cuda_w4a8_gemv":  # lost only on the wide shapes, to mx.quantized_matmul
                assert e["n"] >= 14336 and e["choice"] == "mlx_qmm4", e
            if e["m_bucket"] == 16 and (e["n"], e["k"]) in LLAMA_BLOCK:
                for name in ("mlx_qmm4", "cuda_w4a8_gemv", "cuda_w4a8_gemm_tma"):
                    block_sum[name] = block_sum.get(name, 0.0) + times[name]
        elif e["m_bucket"] == 4:
            assert (picked.name if picked else "mlx_qmm4") == e["choice"], e
            gemvs += picked is not None
        else:
            assert picked is None, e
    assert gemvs == 6 + 7
    assert dq_fastest == 4 + 5 + 3  # of the 6 weights from 4096 x 4096 at M = 128, 512, 2048
    assert block_sum["cuda_w4a8_gemv"] < min(block_sum["mlx_qmm4"], block_sum["cuda_w4a8_gemm_tma"])
    for m in (2, 3, 5, 7):  # between the measured M = 1, 4 and 8
        wide = Problem("linear", m, 14336, 4096, "bfloat16", "grouped4", 64)
        assert prior.choose("cuda", wide, cuda).name == "cuda_w4a8_gemv"
    for m, n, name in ((9, 4096, "cuda_w4a8_gemv_mma"), (32, 4096, "cuda_w4a8_gemv_mma"),
                       (33, 4096, "cuda_w4a8_gemm_tma"), (127, 4096, "cuda_w4a8_gemm_tma"), (128, 4096, "cuda_dequant_gemm"),
                       (128, 1024, "cuda_w4a8_gemm_tma"), (511, 1024, "cuda_w4a8_gemm_tma"),
                       (512, 1024, "cuda_dequant_matmul"), (4096, 14336, "cuda_dequant_gemm")):
        problem = Problem("linear", m, n, 4096, "bfloat16", "grouped4", 64)
        assert prior.choose("cuda", problem, cuda).name == name
    small = Problem("linear", 5, 1024, 4096, "bfloat16", "grouped4", 64)
    assert prior.choose("cuda", small, cuda) is None  # lost at M = 4, won at 8
    assert prior.choose("cuda", Problem("linear", 1, 4096, 4096, "bfloat16", "grouped4", 64),
                        cuda) is None


def test_cuda_rules_for_batched_decode_agree_with_the_h100_tune():
    """The per-channel rules at M = 2-7 summarize a tune on an H100 at M = 2, 4, 8 (prior.py
    cites it), 7 Llama-3-8B shapes: at M = 2 and 4 the rule's kernel is the measured one
    or within 1.15x of it, and faster than mx.quantized_matmul (by at least 1.05x), on
    every weight from 4096 x 4096; the smaller weight keeps mx.quantized_matmul, which won it.
    At M = 8 the rule's TMA GEMM is within 1.15x of the fastest on all 7."""
    decisions = _h100_decisions("per_channel")
    cuda = _cuda_linears()
    assert len(decisions) == 21 and {e["m_bucket"] for e, _, _ in decisions} == {2, 4, 8}
    for e, picked, times in decisions:
        if e["n"] * e["k"] < 4096 * 4096 and e["m_bucket"] < 8:
            assert picked is None and e["choice"] == "mlx_qmm", e
            continue
        assert picked is not None and picked.name != "mlx_qmm", e
        assert times[picked.name] <= 1.15 * min(times.values()), (e["m_bucket"], e["n"], e["k"])
        if e["m_bucket"] < 8:
            assert times["mlx_qmm"] >= 1.05 * times[picked.name], (e["m_bucket"], e["n"], e["k"])
    for m, name in ((3, "cuda_int8_gemv"), (5, "cuda_w8a8_gemm_tma"), (7, "cuda_w8a8_gemm_tma")):
        wide = Problem("linear", m, 14336, 4096, "bfloat16", "per_channel", 64)
        assert prior.choose("cuda", wide, cuda).name == name
    assert prior.choose("cuda", Problem("linear", 1, 14336, 4096, "bfloat16", "per_channel", 64),
                        cuda) is None  # decode at batch 1: host-bound, mx.quantized_matmul


def test_cuda_rules_for_grouped_batched_decode_agree_with_the_h100_tune():
    """The group-wise 8-bit rules at decode sizes summarize a tune on an H100 at M = 2, 4,
    8, 16, 32, 64 (prior.py cites it), 7 Llama-3-8B shapes: wherever a rule picks a W8A8
    kernel it is the measured fastest or within 1.10x of it (at M = 2 and 4 also faster
    than mx.quantized_matmul); where none picks one (1024 x 4096 at M = 2 and 4)
    mx.quantized_matmul stays; at M = 8 and 16 the rule picks the tensor-core GEMV,
    raced later: at M = 8 the dp4a GEMV (its fallback) was within 1.10x of the fastest
    there, at M = 16 no kernel of that race was within 1.10x on every shape. At M = 32
    and 64 the rules run kernels raced later (the GEMV at 32, the subnormal GEMM from
    33: the test below); the group-wise TMA GEMM, the rule's fallback from 33, was within
    1.10x of the fastest there."""
    decisions = [d for d in _h100_decisions("grouped") if d[0]["m_bucket"] <= 64]
    assert len(decisions) == 42 and {e["m_bucket"] for e, _, _ in decisions} == {2, 4, 8, 16, 32, 64}
    slow_at_16: dict[str, int] = {}
    later = {32: "cuda_int8_gemv_mma", 64: "cuda_w8a8_gemm_subnormal"}
    for e, picked, times in decisions:
        best = min(times.values())
        if e["m_bucket"] in later:
            assert picked.name == later[e["m_bucket"]] and picked.name not in times, e
            assert times["cuda_w8a8_gemm_grouped_tma"] <= 1.10 * best, e
            continue
        if e["m_bucket"] in (8, 16):
            # The tensor-core GEMV came later (its own races: the test below).
            assert picked.name == "cuda_int8_gemv_mma" and picked.name not in times, e
            if e["m_bucket"] == 16:
                for name, t in times.items():
                    slow_at_16[name] = slow_at_16.get(name, 0) + (t > 1.10 * best)
            else:  # the dp4a GEMV, the rule's fallback for group size 32, within 1.10x
                assert times["cuda_int8_gemv"] <= 1.10 * best, e
            continue
        if picked is None:
            assert e["m_bucket"] < 8 and e["n"] * e["k"] < 4096 * 4096 and e["choice"] == "mlx_qmm", e
            continue
        assert times[picked.name] <= 1.10 * best, (e["m_bucket"], e["n"], e["k"], picked.name)
        if e["m_bucket"] <= 4:
            assert times["mlx_qmm"] > times[picked.name], e
    assert all(count > 0 for name, count in slow_at_16.items() if name != "exact"), slow_at_16


def test_cuda_rules_for_small_m_agree_with_the_h100_races_with_the_tensor_core_gemvs(monkeypatch):
    """The rules for group-wise 8-bit and MLX's 4-bit weights at M = 8-32 summarize
    races of every candidate on an H100 (prior.py cites them;
    h100_2026-12-07_h_small_m.json), 7 Llama-3-8B shapes each, group size 64, at M = 8,
    16, 24 and 32 for both formats. At M = 8-24 the rule's tensor-core GEMV is faster than
    mx.quantized_matmul on all 42 entries, the measured fastest on 39, and within 1.07x
    of the fastest on the other 3; at M = 8 (both formats) and 16 (4-bit) it beats the
    dp4a GEMV on every shape. At M = 32 (four token tiles, as M = 25-31) it is faster
    than mx.quantized_matmul on all 14 and the fastest on 8; at 4 bits it beats the 4-bit
    TMA GEMM (the rule there before) on all 7; at 8 bits it loses up to 1.33x on single
    shapes but makes a Llama-3-8B block's launches (q+k+v, o, gate+up, down) fastest in
    sum against the subnormal and the group-wise TMA GEMMs, and the subnormal GEMM (the
    rule from M = 33) beats the TMA GEMM on all 7. Group size 32, which both GEMVs
    refuse, falls back: 8-bit to the dp4a GEMV at M = 8 and mx.quantized_matmul above,
    4-bit to the dp4a GEMV at M <= 16 and the 4-bit TMA GEMM above."""
    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "bench", "results")
    doc = table.read(os.path.join(results, "h100_2026-12-07_h_small_m.json"))
    (section,) = doc["sections"]
    assert section["device"]["device_name"] == "NVIDIA H100 80GB HBM3"
    cuda = _cuda_linears()
    rule = {"grouped": "cuda_int8_gemv_mma", "grouped4": "cuda_w4a8_gemv_mma"}
    tma = {"grouped": "cuda_w8a8_gemm_grouped_tma", "grouped4": "cuda_w4a8_gemm_tma"}
    block_sum: dict[str, float] = {}
    seen: dict[tuple[str, int], int] = {}
    fastest = {False: 0, True: 0}  # M = 8-24, M = 32
    for e in section["entries"]:
        fmt = e["weight_format"]
        times = {name: c["median_ns"] for name, c in e["candidates"].items() if c["status"] == "ok"}
        problem = Problem("linear", e["m"], e["n"], e["k"], e["dtype"], fmt, e["group_size"])
        picked = prior.choose("cuda", problem, cuda)
        assert picked.name == rule[fmt], (fmt, e["m"], e["n"], e["k"])
        assert times[picked.name] < times[e["reference"]], e
        at32 = e["m"] == 32
        fastest[at32] += times[picked.name] == min(times.values())
        if not at32:
            assert times[picked.name] <= 1.07 * min(times.values()), e
        elif fmt == "grouped4":
            assert times[picked.name] < times[tma[fmt]], e
            assert times[picked.name] <= 1.20 * min(times.values()), e
        else:
            assert times[picked.name] <= 1.33 * min(times.values()), e
            assert times["cuda_w8a8_gemm_subnormal"] < times[tma[fmt]], e
            if (e["n"], e["k"]) in LLAMA_BLOCK:
                for name in (picked.name, "cuda_w8a8_gemm_subnormal", tma[fmt]):
                    block_sum[name] = block_sum.get(name, 0.0) + times[name]
        if e["m"] == 8 or (fmt == "grouped4" and e["m"] <= 16):
            dp4a = "cuda_w4a8_gemv" if fmt == "grouped4" else "cuda_int8_gemv"
            assert times[picked.name] < times[dp4a], e
        seen[(fmt, e["m"])] = seen.get((fmt, e["m"]), 0) + 1
    assert seen == {(fmt, m): 7 for fmt in rule for m in (8, 16, 24, 32)}
    assert fastest == {False: 39, True: 8}
    assert min(block_sum, key=block_sum.get) == rule["grouped"], block_sum
    monkeypatch.setattr(launch, "cuda_available", lambda: True)  # the refusals, not the device
    for fmt, m, want in (("grouped", 8, "cuda_int8_gemv"), ("grouped", 16, None),
                         ("grouped4", 16, "cuda_w4a8_gemv"),
                         ("grouped4", 24, "cuda_w4a8_gemm_tma")):
        gs32 = Problem("linear", m, 4096, 4096, "bfloat16", fmt, 32)
        # The GEMVs refuse group size 32 on this machine too; the TMA GEMMs need tensor
        # maps (a CUDA driver), so they stay offered.
        offered = [c for c in cuda if "gemv" not in c.name or c.supports(gs32)]
        picked = prior.choose("cuda", gs32, offered)
        assert (picked.name if picked else None) == want, (fmt, m)
    for fmt, want in (("grouped", "cuda_w8a8_gemm_subnormal"), ("grouped4", "cuda_w4a8_gemm_tma")):
        wide = Problem("linear", 33, 4096, 4096, "bfloat16", fmt, 64)
        assert prior.choose("cuda", wide, cuda).name == want


RAW_TABLES = ("h200_2026-12-01_s18_b_raw.json", "h200_2026-12-01_s18_c_raw.json")


def test_cuda_rules_for_the_raw_ops_pick_the_measured_kernels():
    """The CUDA rules for int8_matmul and quantize_activation summarize the eighteenth
    set's measurements (prior.py cites them): on every measured point the rule picks the
    fastest kernel or one within 3% of it, and never the exact MLX-ops kernel (5-28x
    slower there). A rule edited against the measurements fails here."""
    import json
    import os

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "bench", "results")
    checked = {"int8_matmul": 0, "quantize_activation": 0}
    for name in RAW_TABLES:
        with open(os.path.join(folder, name)) as f:
            (section,) = json.load(f)["sections"]
        assert section["backend"] == "cuda" and section["device"]["device_name"] == "NVIDIA H200"
        for e in section["entries"]:
            problem = Problem(e["op"], e["m_bucket"], e["n"], e["k"], e["dtype"],
                              e["weight_format"], e["group_size"])
            found = [c for c in registry.all_candidates()
                     if c.op == e["op"] and c.backend in ("cuda", "any")]
            picked = prior.choose("cuda", problem, found)
            times = {n: c["median_ns"] for n, c in e["candidates"].items() if c["status"] == "ok"}
            assert picked is not None and picked.name != registry.EXACT, e
            assert times[picked.name] <= 1.03 * min(times.values()), (
                e["op"], e["m"], e["n"], e["k"], picked.name, times)
            checked[e["op"]] += 1
    assert checked == {"int8_matmul": 48, "quantize_activation": 16}
