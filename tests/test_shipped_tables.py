"""What the shipped tables decide, as a device of that kind would see them: every table
fresh for this tree's kernels, every choice other than its race's winner explained by a
model check's verdict. For the Llama-3-8B projections on each table, decode runs
mx.quantized_matmul unless the model's decode check kept the per-shape winner (the H200
table's check on all 32 layers kept none: the GEMVs of lm_head, gate+up, down and gate/up
were replaced at 0.95-0.99x with p25 under 1.00x;
bench/results/h200_2026-12-01_s20_f_tune18.log), and prefill a W8A8 GEMM. On the H200
table the sibling groups' summed shapes (q+k+v, gate+up) prefill as one launch of a
kernel with a multi-weight form where the sibling check kept it (on all 32 layers: every
prefill size; bench/results/h200_2026-12-01_s20_d_tune.log)."""

import os

import attrs
import pytest

from mlx_w8a8 import tuning
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.tuning import table, timing
from mlx_w8a8.tuning.tuner import Tuner

LLAMA_3_8B = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]


# Every table the package ships (one device each), by file name.
SHIPPED = sorted(os.path.basename(p) for p in table.shipped_table_paths())


def shipped_path(name: str) -> str:
    paths = [p for p in table.shipped_table_paths() if p.endswith(name)]
    assert paths, f"{name} ships with the package"
    return paths[0]


@pytest.fixture
def as_h200(monkeypatch):
    yield from _as_device(monkeypatch, table.read(shipped_path("nvidia-h200.json")))


@pytest.fixture
def as_h100(monkeypatch):
    yield from _as_device(monkeypatch, table.read(shipped_path("nvidia-h100.json")))


@pytest.fixture(params=SHIPPED)
def as_shipped(request, monkeypatch):
    """(the shipped table, as read; a tuner that sees the device the table describes)"""
    doc = table.read(shipped_path(request.param))
    for tuner in _as_device(monkeypatch, doc):
        yield doc, tuner


def _as_device(monkeypatch, doc: dict):
    key = {f: doc["sections"][0][f] for f in ("backend", "device", "mlx_version", "package_version")}
    monkeypatch.setattr(table, "device_key", lambda device=None: key)
    # The CUDA candidates are registered everywhere but only available with a GPU
    # (and the wgmma ones with a Hopper GPU).
    from mlx_w8a8.kernels import tensormap
    from mlx_w8a8.kernels.cuda import launch

    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    monkeypatch.setattr(tensormap, "available", lambda: True)  # the TMA candidates
    saved = [c for c in registry.all_candidates() if c.backend == "cuda"]
    for c in saved:
        registry.register(attrs.evolve(c, available=lambda: True))
    yield Tuner(use_cache=False, use_shipped=True)
    for c in saved:
        registry.register(c)
    tuning.use_tuner(None)
    tuning.install()


def test_each_shipped_table_is_fresh_for_the_kernels_in_this_tree(as_shipped):
    # A kernel edit without re-tuning stales the shipped entries: this catches it.
    doc, tuner = as_shipped
    (section,) = doc["sections"]  # one device per shipped file
    assert section["entries"] and all(tuner._fresh(e, None) for e in section["entries"])


def test_the_h200_table_holds_the_buckets_its_readme_says(as_h200):
    # Per-channel Llama-3-8B at every bucket the tune measured (M = 1-2048); no
    # group-wise entries (tables/README.md: their races predate the subnormal GEMM and
    # the tensor-core small-M GEMV, and an entry speaks for M up to 4x its bucket, so it
    # would hide the prior's rules there); nothing else.
    doc = table.read(shipped_path("nvidia-h200.json"))
    entries = doc["sections"][0]["entries"]
    buckets = {}
    for e in entries:
        buckets.setdefault((e["weight_format"], e["group_size"] if e["weight_format"] != "per_channel"
                            else None), set()).add(e["m_bucket"])
    assert buckets == {("per_channel", None): {1, 2, 4, 8, 16, 32, 64, 128, 512, 2048}}, buckets


def test_no_shipped_choice_rests_on_a_batched_decode_replacement(as_shipped):
    # The decode check's batched pass (B >= 2) disagreed with the model's batched decode
    # timed directly (tune.batched_checks, docs/tuning.md): entries whose choice one of
    # its replacements set are left out of the shipped tables (tables/README.md).
    doc, _ = as_shipped
    replaced = [(e["m_bucket"], e["n"], e["k"]) for e in doc["sections"][0]["entries"]
                if (e.get("decode_check") or {}).get("batch", 1) >= 2
                and not e["decode_check"]["kept"]]
    assert not replaced


@pytest.mark.parametrize("n, k", [(4096, 14336), (14336, 4096), (128256, 4096)])
def test_the_h100_table_decodes_batches_on_w8a8_kernels(as_h100, n, k):
    # Batched decode of B = 2-16 rows: the race's W8A8 kernels (or the prior's, at M = 2-4
    # where the table has no entry), not mx.quantized_matmul, whose time grows with each
    # row on sm_90 (1.25-2.13x slower per step on 32 layers at B = 4 in six runs of seven:
    # docs/tuning.md).
    tuning.use_tuner(as_h100)
    for m in (2, 3, 4, 8, 16):
        candidate, source = registry.decide(Problem("linear", m, n, k, "bfloat16", "per_channel", 64))
        assert candidate.name.startswith("cuda_"), (m, candidate.name, source)


def test_every_entry_that_overrode_its_race_says_why(as_shipped):
    # Only the model checks (decode at M = 1 and batched decode of B = M sequences at
    # M = 2 ... 64, prefill at M >= 16) may set a choice other than the per-shape race's,
    # and they leave their verdict in the entry; the race itself picks the fastest, or a
    # multi-weight form within the margin of it.
    doc, _ = as_shipped
    entries = doc["sections"][0]["entries"]
    checked = 0
    for e in entries:
        times = {n: c["median_ns"] for n, c in e["candidates"].items() if "median_ns" in c}
        fastest = min(times, key=times.get)
        check = e.get("decode_check")
        prefill = e.get("prefill_check")
        if check is not None:
            checked += 1
            assert e["m_bucket"] == check.get("batch", 1) <= 64, (e["m_bucket"], check)
            assert check["tuned"] != e["reference"]
            assert e["choice"] == (check["tuned"] if check["kept"] else e["reference"])
        elif prefill is not None and prefill["switched"]:
            # the prefill check switched it to its challenger in the model's own prefill
            assert e["m_bucket"] >= 16 and e["choice"] == prefill["challenger"]
        elif e["choice"] != e["reference"]:
            # a challenger wins by being fastest, or within the margin of the fastest
            # with a multi-weight form (timing.select_fastest's prefer) or as the
            # choice on record before a re-measurement (its incumbent)
            group = {n for n in times if registry.get("linear", n).bind_group is not None}
            assert e["choice"] == timing.select_fastest(
                times, e["reference"], e["min_improvement_bps"], prefer=group,
                incumbent=e.get("previous_choice")), (e, fastest)
    assert checked >= 1


@pytest.mark.parametrize("n, k", LLAMA_3_8B)
def test_decode_runs_quantized_matmul_and_prefill_a_w8a8_gemm(as_shipped, n, k):
    _, tuner = as_shipped
    problem = lambda m: Problem("linear", m, n, k, "bfloat16", "per_channel", 64)  # noqa: E731
    tuning.use_tuner(tuner)
    decode = registry.decide(problem(1))
    if decode[0].name != "mlx_qmm":  # only where the model's decode check kept it
        entry = tuner.lookup(problem(1)).entry
        assert entry["decode_check"]["kept"] and decode == (
            registry.get("linear", entry["choice"]), "table"), (decode, entry.get("decode_check"))
    name, source = tuner.decide(problem(2048))
    assert source == "table" and name.startswith("cuda_w8a8_gemm"), (name, source)


@pytest.mark.parametrize("n, k", LLAMA_3_8B)
def test_batched_decode_of_two_rows_does_not_take_the_decode_verdict(as_h200, n, k):
    # The M = 1 entries hold the decode check's verdicts on decode at batch 1 (most of
    # them mx.quantized_matmul); M = 2 takes its own bucket's race and M = 3, 4 the M = 4
    # bucket's, never the M = 1 verdict (tuning/tuner.py MAX_BUCKET_OCTAVES: MLX's GEMV
    # slows with each row).
    tuning.use_tuner(as_h200)
    for m, bucket in ((2, 2), (3, 4), (4, 4)):
        hit = as_h200.lookup(Problem("linear", m, n, k, "bfloat16", "per_channel", 64))
        assert hit is not None and hit.entry["m_bucket"] == bucket, (m, hit and hit.entry["m_bucket"])
        assert "decode_check" not in hit.entry, (m, hit.entry["decode_check"])


@pytest.mark.parametrize("n, want", [(6144, [True, True, False, True, True]),
                                     (28672, [True, True, False, True, True])])
def test_sibling_groups_prefill_as_the_sibling_check_decided(as_h200, n, want):
    # q+k+v (6144) and gate+up (28672) of Llama-3-8B at the table's prefill sizes. Where
    # the sibling check kept the group launch the table's choice has a multi-weight form
    # (Candidate.bind_group); where it found the group no faster the entry says
    # mx.quantized_matmul and the members run alone; where the per-shape race was won by
    # a kernel without a multi-weight form (cuda_w8a8_gemm) the prefill check may have
    # judged the group instead (verdict "prefill"). The shipped table (the check on all
    # 32 layers, measured 2026-12-06) kept both groups at M = 16, 64, 512 and 2048 and
    # left M = 128 to the members; the table before it had left M = 16 to the members
    # and kept 128, so verdicts this close move between measurements.
    verdicts = []
    for m in (16, 64, 128, 512, 2048):
        problem = Problem("linear", m, n, 4096, "bfloat16", "per_channel", 64)
        candidate, source = registry.decide(problem)
        assert source == "table", (m, source)
        entry = as_h200.lookup(problem).entry
        check = entry.get("sibling_check")
        if check is None:
            prefill = entry.get("prefill_check")
            if prefill is not None and prefill["switched"]:  # judged as a group there
                assert candidate.name == prefill["challenger"] and candidate.bind_group, (m, entry)
                verdicts.append("prefill")
            else:
                assert candidate.bind_group is None, (m, candidate.name)
                verdicts.append(None)
            continue
        if check["kept"]:
            assert candidate.bind_group is not None, (m, candidate.name)
        else:
            assert candidate.name == "mlx_qmm", (m, candidate.name, check)
        verdicts.append(check["kept"])
    assert verdicts == want


@pytest.mark.parametrize("n, k", [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)])
def test_the_h200_table_leaves_group_wise_weights_to_the_prior(as_h200, n, k):
    # The H200 table holds no group-wise entries (tables/README.md): the prior decides at
    # every M: the tensor-core GEMV at M = 8-32, from M = 33 the subnormal-promotion GEMM.
    tuning.use_tuner(as_h200)
    for m, want in ((8, "cuda_int8_gemv_mma"), (16, "cuda_int8_gemv_mma"), (32, "cuda_int8_gemv_mma"),
                    (33, "cuda_w8a8_gemm_subnormal"), (127, "cuda_w8a8_gemm_subnormal"),
                    (128, "cuda_w8a8_gemm_subnormal"), (2048, "cuda_w8a8_gemm_subnormal")):
        candidate, got = registry.decide(Problem("linear", m, n, k, "bfloat16", "grouped", 64))
        assert (candidate.name, got) == (want, "prior"), (m, candidate.name, got)
