"""The kernel registry: forcing, fallback, the tuner hook, availability."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_w8a8 as w8
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate, Problem

# Two groups per weight row: mlx_qmm handles it on every backend (at K <= group size it
# does not on CUDA, reference.qmm_supports).
PROBLEM = Problem("linear", 4, 32, 128, "float32", "per_channel", 64)


@pytest.fixture
def fake():
    """A registered fake linear candidate, removed afterwards."""
    calls = []

    def run(x, weight, bias):
        calls.append(x.shape)
        return mx.full((x.shape[0], weight.n), 7.0, dtype=x.dtype)

    state = {"available": True}
    previous = registry.set_chooser(None)  # these tests install their own choosers
    cand = registry.register(Candidate(
        name="fake_linear", backend="any", op="linear", run=run,
        supports=lambda p: p.m <= 8, available=lambda: state["available"],
    ))
    yield cand, calls, state
    registry.unregister("linear", "fake_linear")
    registry.set_chooser(previous)


def test_fallback_first_and_supports_respected(fake):
    names = registry.names(registry.candidates(PROBLEM))
    assert names[0] == "mlx_qmm" and "fake_linear" in names and "exact" in names
    big = Problem("linear", 9, 32, 128, "float32", "per_channel", 64)
    assert "fake_linear" not in registry.names(registry.candidates(big))


def test_unavailable_candidate_is_not_offered(fake):
    # A backend that is not present here (no GPU) must simply offer nothing.
    _, _, state = fake
    state["available"] = False
    assert "fake_linear" not in registry.names(registry.candidates(PROBLEM))
    assert "fake_linear" not in w8.available_kernels("linear")


def test_forcing_a_kernel_and_errors(fake):
    qw = w8.quantize_weight(mx.zeros((32, 64)))
    y = w8.w8a8_linear(mx.ones((4, 64)), qw, kernel="fake_linear")
    assert np.all(np.array(y) == 7.0)
    with pytest.raises(ValueError, match=r"kernel 'fake_linear' cannot run linear for M=9"):
        w8.w8a8_linear(mx.ones((9, 64)), qw, kernel="fake_linear")


def test_a_forced_kernel_that_cannot_run_says_why(fake, monkeypatch):
    """registry.refusal names what refuses a problem (the candidate's own requirement
    from can_implement, the backend, the op), and a forced kernel's ValueError carries
    it: a CUDA GEMM past its unsigned-code bound names K and the bound."""
    import attrs

    from mlx_w8a8.kernels.cuda import launch

    cand = registry.get("linear", "fake_linear")
    assert registry.refusal(cand, PROBLEM) is None
    big = Problem("linear", 9, 32, 128, "float32", "per_channel", 64)
    assert registry.refusal(cand, big) == "its supports() refuses the problem"
    assert "implements linear, not int8_matmul" in registry.refusal(
        cand, Problem("int8_matmul", 4, 32, 128, "int8", "int8"))
    ws = registry.get("linear", "cuda_w8a8_gemm_ws")
    p = Problem("linear", 64, 256, 69632, "bfloat16", "per_channel", 128)
    assert "not available here" in registry.refusal(ws, p)  # no CUDA GPU here
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    registry.register(attrs.evolve(ws, available=lambda: True))
    try:
        why = registry.refusal(registry.get("linear", "cuda_w8a8_gemm_ws"), p)
        assert why.startswith("[mlx_w8a8.cuda_w8a8_gemm_ws]") and "K = 69632" in why
        assert "66311" in why
        with pytest.raises(ValueError, match=r"cuda_w8a8_gemm_ws\] .*K <= 66311, got K = 69632"):
            registry.decide(p, "cuda_w8a8_gemm_ws")
        ok, reason = registry.get("linear", "cuda_w8a8_gemm_ws").can_implement(
            attrs.evolve(p, k=4096))
        assert ok and reason == ""
        monkeypatch.setattr(launch, "is_sm90", lambda: False)  # the capability, then its own check
        assert "cuda_sm90 is off" in registry.refusal(
            registry.get("linear", "cuda_w8a8_gemm_ws"), attrs.evolve(p, k=4096))
        ok, reason = ws.can_implement(attrs.evolve(p, k=4096))
        assert not ok and "compute capability 9.x" in reason
    finally:
        registry.register(ws)


def test_a_decision_made_across_an_invalidation_is_not_kept(fake):
    # A measurement recorded while decide() asks the chooser (registry.invalidate from
    # another thread): the answer serves that call only; the next decide() asks again.
    cand, _, _ = fake
    asked = []

    def chooser(problem, found):
        asked.append(problem)
        if len(asked) == 1:
            registry.invalidate()
        return cand, "table"

    registry.set_chooser(chooser)
    assert registry.decide(PROBLEM) == (cand, "table")
    assert registry.decide(PROBLEM) == (cand, "table")
    assert registry.decide(PROBLEM) == (cand, "table")
    assert asked == [PROBLEM, PROBLEM]


def test_chooser_hook_and_its_failure(fake):
    cand, calls, _ = fake
    qw = w8.quantize_weight(mx.zeros((32, 64)))
    seen = []

    def chooser(problem, found):
        seen.append((problem, registry.names(found)))
        return cand

    registry.set_chooser(chooser)
    w8.w8a8_linear(mx.ones((2, 3, 64)), qw)
    assert calls == [(6, 64)]  # leading dims flattened into M
    assert seen[0][0] == Problem("linear", 6, 32, 64, "float32", "per_channel", 64, False)

    def broken(problem, found):
        raise RuntimeError("table exploded")

    registry.set_chooser(broken)  # a failing tuner never breaks inference
    y = w8.w8a8_linear(mx.ones((2, 64)), qw)
    assert registry.choose(PROBLEM).name == "mlx_qmm"
    assert np.all(np.array(y) == 0.0)


def test_decisions_are_kept_until_invalidated(fake):
    # A model meets each new prompt length with one problem per layer shape in every
    # layer: the decision is made once and kept (registry.decide) until invalidate(),
    # which every change of what a decision rests on calls (a table reloaded, a
    # measurement recorded, a candidate registered, a chooser installed).
    cand, _, _ = fake
    asked = []

    def chooser(problem, found):
        asked.append(problem)
        return cand, "table"

    registry.set_chooser(chooser)
    assert registry.decide(PROBLEM) == (cand, "table")
    assert registry.decide(PROBLEM) == (cand, "table")
    assert asked == [PROBLEM]
    other = Problem("linear", 5, 32, 128, "float32", "per_channel", 64)
    registry.decide(other)
    assert asked == [PROBLEM, other]
    registry.invalidate()
    registry.decide(PROBLEM)
    assert asked == [PROBLEM, other, PROBLEM]
    # forced: kept too, and a kernel that cannot run the problem raises every time
    assert registry.decide(PROBLEM, "fake_linear") == (cand, "forced")
    big = Problem("linear", 9, 32, 128, "float32", "per_channel", 64)
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot run linear for M=9"):
            registry.decide(big, "fake_linear")


def test_a_failing_chooser_is_asked_again(fake):
    # The fallback runs where the chooser fails, that call only: a transient failure
    # must not pin the fallback until the next invalidate().
    cand, _, _ = fake
    state = {"fail": True}

    def chooser(problem, found):
        if state["fail"]:
            raise RuntimeError("table being rewritten")
        return cand, "table"

    registry.set_chooser(chooser)
    assert registry.decide(PROBLEM) == (registry.get("linear", "mlx_qmm"), "fallback")
    state["fail"] = False
    assert registry.decide(PROBLEM) == (cand, "table")


def test_unknown_op_rejected():
    with pytest.raises(ValueError, match="available_kernels.*op must be one of"):
        w8.available_kernels("conv")


def test_layer_run_binds_once_per_weight_and_bias(bound_spy):
    # layer_run is how the tuner and the bench run a candidate: through bind_stages,
    # bound once per (weight, bias) pair and reused, never through run; a candidate
    # without bind_stages (or another op) runs as it is.
    calls, run, bind_stages = bound_spy
    cand = Candidate(name="spy", backend="any", op="linear", run=run,
                     bind_stages=bind_stages, w8a8=False)
    plain = Candidate(name="plain", backend="any", op="linear", run=run)
    assert registry.layer_run(plain, PROBLEM) is run
    assert registry.layer_run(cand, Problem("int8_matmul", 4, 32, 64, "int8", "int8")) is run
    p = Problem("linear", 4, 32, 64, "float32", "per_channel", 32)
    w1, w2 = (w8.QuantizedWeight.from_float(mx.array(np.random.default_rng(s).standard_normal(
        (32, 64)).astype(np.float32)), 32) for s in (0, 1))
    x = mx.ones((4, 64))
    f = registry.layer_run(cand, p)
    want = np.array(registry.get("linear", "mlx_qmm").run(x, w1, None))
    for _ in range(3):
        assert np.array_equal(np.array(f(x, w1, None)), want)
    f(x, w2, None)
    f(x, w2, None)
    assert calls == {"run": 0, "bind": 2, "apply": 5}


def test_fuse_stages_is_one_compiled_call_that_follows_its_inputs():
    """fuse_stages: apply(quantize(x)) (and, asked for, the activations) from one
    mx.compile call; the
    stages run in Python at the trace only, each later call replays them on its own x
    (a stale trace would repeat the first x's output); a None among the activations
    comes back as None. (MLX 0.32.4 traces the first compiled function of a process
    twice: up to two traces for five calls.)"""
    calls = []

    def quantize(x):
        calls.append("quantize")
        return x * 2, x + 1, None

    def apply(acts):
        calls.append("apply")
        return acts[0] + acts[1]

    both = registry.fuse_stages(quantize, apply, activations=True)
    for v in (1.0, 3.0, -0.5, 2.0, 7.0):
        y, acts = both(mx.array([v, 2 * v]))
        assert y.tolist() == [3 * v + 1, 6 * v + 1]
        assert acts[0].tolist() == [2 * v, 4 * v] and acts[2] is None
    assert calls in (["quantize", "apply"], ["quantize", "apply"] * 2), calls
    calls.clear()
    lean = registry.fuse_stages(quantize, apply)  # the output alone
    for v in (1.0, 3.0, -0.5, 2.0, 7.0):
        assert lean(mx.array([v, 2 * v])).tolist() == [3 * v + 1, 6 * v + 1]
    assert calls in (["quantize", "apply"], ["quantize", "apply"] * 2), calls


@pytest.fixture
def tma_like(monkeypatch):
    """A fake candidate that needs a capability (as the CUDA TMA kernels need
    ``cuda_tma``), with the capability report under the test's control."""
    caps = {"fake_tma": (True, "tensor maps encodable")}
    monkeypatch.setattr(registry, "_capabilities", lambda: dict(caps))
    previous = registry.set_chooser(None)
    registry.register(Candidate(name="fake_tma_linear", backend="any", op="linear",
                                run=lambda x, w, b: x, available=lambda: True))
    registry.needs("fake_tma_linear", "fake_tma")
    yield caps
    registry.needs("fake_tma_linear")
    registry.unregister("linear", "fake_tma_linear")
    registry.set_chooser(previous)


def test_a_capability_that_is_off_makes_its_candidates_unavailable(tma_like):
    # Before: the TMA candidates' available() is the backend's alone, so
    # available_kernels() listed them where tensor maps cannot be made (no cffi).
    cand = registry.get("linear", "fake_tma_linear")
    assert registry.available(cand) and "fake_tma_linear" in w8.available_kernels("linear")
    assert "fake_tma_linear" in registry.names(registry.candidates(PROBLEM))
    tma_like["fake_tma"] = (False, "ModuleNotFoundError: No module named 'cffi'")
    assert not registry.available(cand) and not cand.handles(PROBLEM)
    assert registry.unavailable_reason(cand) == (
        "fake_tma is off (ModuleNotFoundError: No module named 'cffi')")
    assert "fake_tma_linear" not in w8.available_kernels("linear")
    assert "fake_tma_linear" not in registry.names(registry.candidates(PROBLEM))
    del tma_like["fake_tma"]  # a capability no backend reports is off, not on
    assert "not reported" in registry.unavailable_reason(cand)


def test_the_cuda_tma_candidates_need_the_cuda_tma_capability(monkeypatch):
    # The real CUDA TMA and warp-specialized candidates are declared (a rename in the
    # CUDA module would silently drop the declaration: keep the names in step) ...
    for name in ("cuda_int8_gemm_tma", "cuda_w8a8_gemm_tma"):
        assert set(registry._NEEDS[name]) == {"cuda_sm90", "cuda_tma"}
    from mlx_w8a8 import kernels
    if "cuda" not in kernels.unavailable():
        cuda = [c.name for c in registry.all_candidates() if c.backend == "cuda"]
        assert set(registry._NEEDS) <= set(cuda)
    # ... and cuda_tma follows the tensor-map probe, as on an H200 without cffi
    from mlx_w8a8.kernels import tensormap
    from mlx_w8a8.kernels.cuda import launch
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    previous = registry.set_chooser(None)
    registry.register(Candidate(name="fake_tma_linear", backend="cuda", op="linear",
                                run=lambda x, w, b: x, available=lambda: True))
    registry.needs("fake_tma_linear", "cuda_sm90", "cuda_tma")
    try:
        monkeypatch.setattr(tensormap, "available", lambda: True)
        assert "fake_tma_linear" in w8.available_kernels("linear")
        monkeypatch.setattr(tensormap, "available", lambda: False)
        assert "fake_tma_linear" not in w8.available_kernels("linear")
        assert registry.unavailable_reason(registry.get("linear", "fake_tma_linear")).startswith(
            "cuda_tma is off")
    finally:
        registry.needs("fake_tma_linear")
        registry.unregister("linear", "fake_tma_linear")
        registry.set_chooser(previous)


@pytest.mark.parametrize("fmt,bits", [("per_channel", 8), ("grouped", 8), ("grouped4", 4),
                                      ("int8", 8)])
def test_a_problem_knows_its_code_width(fmt, bits):
    # The width the kernels' tile and row-tile rules take (4-bit codes pack 8 a word).
    assert Problem("linear", 4, 32, 128, "float32", fmt, 64).bits == bits
