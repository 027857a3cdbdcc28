"""mlx_w8a8.warm_up: each group of identical layers (a sibling group as one) is called
exactly at the first M of each new (candidate, variant) its calls would take, every
member of a sibling group on one input; arguments are checked."""

import bisect
import time

import attrs
import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_w8a8 as w8
from mlx_w8a8 import backends, siblings, warmup
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate

QMM = registry.get("linear", "mlx_qmm")
# "steps": its variant changes at these M (another set at N >= 200); "flat" (no variant)
# is chosen for M in FLAT.
STEPS, WIDE_STEPS, WIDE_N = [4, 9, 33, 50], [2, 30], 200
FLAT = range(21, 41)


def _steps_variant(p):
    return bisect.bisect_right(WIDE_STEPS if p.n >= WIDE_N else STEPS, p.m)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(64, n, bias=False) for n in (32, 16, 16))
        self.o_proj = nn.Linear(64, 64, bias=False)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(64, 128), nn.Linear(64, 128)
        self.down_proj = nn.Linear(128, 64)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.mlp = Attention(), Mlp()


class Model(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.layers = [Block() for _ in range(blocks)]


@pytest.fixture
def staircase(only_written_tables):
    """Two linear candidates chosen by M ("flat" in FLAT, else "steps", which has a
    sibling form); every call recorded as (candidate, layer weight ids, M)."""
    calls = []

    def run_of(name):
        def run(x, w, b):
            calls.append((name, (id(w),), x.shape[0]))
            return QMM.run(x, w, b)
        return run

    def bind_group(problem, members, lead):
        def apply(x):
            calls.append(("steps+siblings", tuple(id(w) for w, _ in members), problem.m))
            x2 = x.reshape(-1, problem.k)
            return [QMM.run(x2, w, b).reshape(*lead, w.n) for w, b in members]
        return None, None, apply

    steps = Candidate(name="steps", backend="any", op="linear", run=run_of("steps"),
                      bind_group=bind_group, variant=_steps_variant, w8a8=False)
    flat = Candidate(name="flat", backend="any", op="linear", run=run_of("flat"), w8a8=False)
    for c in (steps, flat):
        registry.register(c)

    def choose(problem, found):
        return (flat if problem.m in FLAT else steps), "test"

    previous = registry.set_chooser(choose)
    siblings.clear()
    yield calls
    registry.set_chooser(previous)
    registry.unregister("linear", "steps")
    registry.unregister("linear", "flat")


def _model():
    model = Model()
    w8.quantize(model)
    return model


def _ids(*layers):
    return tuple(id(layer.quantized_weight) for layer in layers)


def test_each_layer_group_is_called_at_each_new_candidate_and_variant(staircase, capsys):
    model = _model()
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    mlp.down_proj.kernel = "flat"  # forced: one candidate, no variant
    model.layers[1].mlp.down_proj.kernel = "flat"
    report = w8.warm_up(model, max_tokens=60)

    # Alone, N < 200: steps at 1, 4, 9 (its variants 0-2), flat at 21, steps again at 41
    # (variant 2 became 3 at 33, inside flat's range) and 50.
    alone = [1, 4, 9, 21, 41, 50]
    # q/k/v as one launch of steps on the summed N = 64 (the same steps); in flat's range
    # (no sibling form) each member alone, on the same input.
    qkv = _ids(attn.q_proj, attn.k_proj, attn.v_proj)
    want = [("steps+siblings", qkv, m) for m in (1, 4, 9)]
    want += [("flat", (i,), 21) for i in qkv]
    want += [("steps+siblings", qkv, m) for m in (41, 50)]
    want += [("steps", _ids(attn.o_proj), m) if m not in FLAT else ("flat", _ids(attn.o_proj), m)
             for m in alone]
    # gate/up: the summed N = 256 takes the other steps (2, 30): 1, 2, flat at 21, 41.
    gu = _ids(mlp.gate_proj, mlp.up_proj)
    want += [("steps+siblings", gu, m) for m in (1, 2)]
    want += [("flat", (i,), 21) for i in gu]
    want += [("steps+siblings", gu, 41)]
    want += [("flat", _ids(mlp.down_proj), 1)]
    assert sorted(staircase) == sorted(want)
    # the second block's layers are identical to the first's: never called
    assert {i for _, ids, _ in staircase for i in ids} == set(qkv + gu + _ids(attn.o_proj, mlp.down_proj))

    assert report.layers == 14 and report.groups == 4
    by_layers = {}
    for c in report.compiled:
        by_layers.setdefault(c.layers, []).append(c.m)
    assert by_layers == {
        ("layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj"): alone,
        ("layers.0.self_attn.o_proj",): alone,
        ("layers.0.mlp.gate_proj", "layers.0.mlp.up_proj"): [1, 2, 21, 41],
        ("layers.0.mlp.down_proj",): [1],
    }
    assert [c.kernels for c in report.compiled if c.layers[0].endswith("q_proj")] == [
        ("steps+siblings",)] * 3 + [("flat", "flat", "flat")] + [("steps+siblings",)] * 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(report.compiled) + 1
    assert err[0].startswith("[mlx_w8a8.warm_up] layers.0.self_attn.q_proj+k_proj+v_proj M=1: "
                             "steps+siblings ")
    # the layers still compute what they compute alone
    x = mx.random.normal((3, 64))
    assert mx.array_equal(attn.k_proj(x), QMM.run(x, attn.k_proj.quantized_weight, None)).item()


def test_members_run_alone_when_siblings_do_not_launch_together(staircase):
    model = _model()
    mlp = model.layers[0].mlp
    siblings.launch_together(False)
    try:
        report = w8.warm_up(model, max_tokens=60, progress=False)
    finally:
        siblings.launch_together(True)
    gu = [c.m for c in report.compiled if c.layers[0].endswith("gate_proj")]
    assert gu == [1, 4, 9, 21, 41, 50]  # each member's own N = 128: the first steps
    assert ("flat", _ids(mlp.up_proj), 21) in staircase
    assert not [c for c in staircase if c[0] == "steps+siblings"]


def test_a_single_layer_and_the_report(staircase):
    layer = w8.Linear(64, 32, bias=False)
    report = w8.warm_up(layer, max_tokens=8, dtype=mx.float16, progress=False)
    assert [(c.layers, c.m, c.kernels) for c in report.compiled] == [
        (("",), 1, ("steps",)), (("",), 4, ("steps",))]
    assert report.layers == report.groups == 1
    assert report.seconds >= report.scan_seconds >= 0


def test_candidates_without_a_variant_are_called_once(only_written_tables):
    model = _model()
    report = w8.warm_up(model, max_tokens=300, progress=False)
    # on this machine: the pure-MLX candidates (no variant), one call per candidate taken
    for c in report.compiled:
        assert all(k in ("exact", "mlx_qmm") or k.endswith("+siblings") for k in c.kernels), c
    assert len({(c.layers, c.kernels) for c in report.compiled}) == len(report.compiled)


@pytest.fixture
def as_h200(monkeypatch):
    """The H200 table shipped with the package decides, the CUDA candidates offered as
    on that GPU (nothing is launched: the tests below only scan)."""
    from mlx_w8a8 import tuning
    from mlx_w8a8.kernels import tensormap
    from mlx_w8a8.kernels.cuda import launch
    from mlx_w8a8.tuning import table
    from mlx_w8a8.tuning.tuner import Tuner

    paths = [p for p in table.shipped_table_paths() if p.endswith("nvidia-h200.json")]
    doc = table.read(paths[0])
    key = {f: doc["sections"][0][f] for f in ("backend", "device", "mlx_version", "package_version")}
    monkeypatch.setattr(table, "device_key", lambda device=None: key)
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    monkeypatch.setattr(tensormap, "available", lambda: True)
    saved = [c for c in registry.all_candidates() if c.backend == "cuda"]
    for c in saved:
        registry.register(attrs.evolve(c, available=lambda: True))
    tuning.use_tuner(Tuner(use_cache=False, use_shipped=True))
    yield
    for c in saved:
        registry.register(c)


def _llama_3_8b_block():
    """One Llama-3-8B block and its lm_head as mlx_w8a8.Linear layers on weights never
    evaluated (per-channel, group size 64), q/k/v and gate/up linked."""
    from mlx_w8a8.weight import QuantizedWeight

    def linear(n, k):
        scales = mx.zeros((n, k // 64), dtype=mx.bfloat16)
        qw = QuantizedWeight(mx.zeros((n, k // 4), dtype=mx.uint32), scales, scales, 64,
                             per_channel=True)
        return w8.Linear.from_weight(qw)

    model = nn.Module()
    model.self_attn, model.mlp = nn.Module(), nn.Module()
    attn, mlp = model.self_attn, model.mlp
    attn.q_proj, attn.k_proj, attn.v_proj = linear(4096, 4096), linear(1024, 4096), linear(1024, 4096)
    attn.o_proj = linear(4096, 4096)
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = linear(14336, 4096), linear(14336, 4096), linear(4096, 14336)
    model.lm_head = linear(128256, 4096)
    assert siblings.link(model) == 2
    return model


def test_the_scan_is_cheap_and_calls_few_sizes(as_h200):
    """Llama-3-8B's layers under the H200 table, M = 1..2048: the scan of each group
    takes well under a second on this CPU, every call is at a new (candidate, variant)
    of the group, and the calls are few: a handful of sizes per group."""
    model = _llama_3_8b_block()
    t0 = time.perf_counter()
    plans, layers, scan_seconds = warmup._plan(model, 2048, mx.bfloat16)
    elapsed = time.perf_counter() - t0
    assert layers == 8 and len(plans) == 5
    assert elapsed < 0.5 * len(plans), elapsed
    for unit, calls in plans:
        names = [path for path, _ in unit]
        print(names, [(m, [p[-2] for p in parts]) for m, parts in calls])
        assert calls[0][0] == 1 and len(calls) <= 16, (names, calls)
        seen = set()
        for _, parts in calls:
            assert not seen.issuperset(parts)
            seen.update(parts)
    # q/k/v prefill as one launch of a multi-weight kernel (the table's sibling choice)
    qkv = next(calls for unit, calls in plans if len(unit) == 3)
    assert any(p[0] == "siblings" for _, parts in qkv for p in parts)


@pytest.mark.parametrize("kw,match", [
    (dict(max_tokens=0), r"max_tokens must be an int >= 1, got 0"),
    (dict(max_tokens=-3), r"got -3"),
    (dict(max_tokens=16.0), r"got 16\.0"),
    (dict(max_tokens=True), r"got True"),
    (dict(dtype=mx.int8), r"dtype must be mx.float16, mx.bfloat16 or mx.float32, got .*int8"),
    (dict(dtype="bfloat16"), r"got 'bfloat16'"),
])
def test_arguments_are_checked(kw, match):
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.warm_up\] .*" + match):
        w8.warm_up(w8.Linear(64, 32), **kw)


def test_a_model_without_w8a8_layers_is_refused():
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.warm_up\] model holds no mlx_w8a8.Linear "
                                         r"layer .* got Model; convert it first"):
        w8.warm_up(Model())
    with pytest.raises(ValueError, match=r"model must be an mlx.nn.Module, got list"):
        w8.warm_up([w8.Linear(64, 32)])


@pytest.mark.parametrize("bits", [8, 4])
def test_mlx_qmm_is_warmed_at_each_tile_mlx_compiles_on_cuda(monkeypatch, bits):
    """A group-wise layer served by ``mx.quantized_matmul`` (mlx-lm's 8-bit and 4-bit
    checkpoints at decode sizes): on CUDA MLX compiles a GEMM module per M tile at run
    time, a minute each, so the warm-up calls at M = 1 (its GEMV) and at the first M of
    each tile (8, 17, 33); M > 64 reuses the 64-row tile. Elsewhere nothing is compiled
    per shape: one call. (A variant-less candidate, as before, called at M = 1 only and
    left the GEMM modules to the first requests.)"""
    name = "mlx_qmm" if bits == 8 else "mlx_qmm4"
    layer = w8.Linear(256, 128, bias=False, per_channel=False, bits=bits)
    layer.kernel = name
    on_cpu = warmup._plan(layer, 300, mx.bfloat16)[0]
    assert [m for m, _ in on_cpu[0][1]] == [1]
    monkeypatch.setattr(backends, "on_cuda", lambda: True)
    plans = warmup._plan(layer, 300, mx.bfloat16)[0]
    assert [m for m, _ in plans[0][1]] == [1, 8, 17, 33]
    assert [parts[0][2] for _, parts in plans[0][1]] == ["gemv", 16, 32, 64]
    short = warmup._plan(layer, 20, mx.bfloat16)[0]
    assert [m for m, _ in short[0][1]] == [1, 8, 17]
