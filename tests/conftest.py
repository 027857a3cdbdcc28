import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Settings of the test harness itself, kept: the ``rng`` fixture's replay seed, the
# Metal emulator's compiler and cache, the tensor-parallel tests' backend, the CUDA
# compile test's cache. Every other
# MLX_W8A8_* variable (the package's own settings) is removed for each test.
HARNESS_VARIABLES = (
    "MLX_W8A8_TEST_SEED", "MLX_W8A8_EMU_CXX", "MLX_W8A8_EMU_CACHE", "MLX_W8A8_TP_BACKEND",
    "MLX_W8A8_NVCC_CACHE",
)


@pytest.fixture(autouse=True)
def hermetic(tmp_path_factory, monkeypatch):
    """Every test runs as on a fresh machine: no ``MLX_W8A8_*`` variables from the
    caller's shell (``MLX_W8A8_TUNE=1`` would make ops measure and write tables), a
    temporary cache directory (nothing read from or written to the user's cache), and
    a fresh process-wide tuner with its chooser installed and no reports remembered."""
    from mlx_w8a8 import tuning
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.tuning import active, table

    for name in list(os.environ):
        if name.startswith("MLX_W8A8_") and name not in HARNESS_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path_factory.mktemp("mlx_w8a8-cache")))
    chooser = registry.set_chooser(None)
    active._tuner = None
    tuning.install()
    table.reset_reports()
    yield
    active._tuner = None
    registry.set_chooser(chooser)
    table.reset_reports()


@pytest.fixture
def check_tuner(tmp_path, monkeypatch):
    """For the model-level checks' tests: a fast Tuner reading and writing only
    ``tmp_path/t.json`` (no cache, shipped tables or prior), installed as the process-wide
    one and put back after."""
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning import prior, table
    from mlx_w8a8.tuning.tuner import TuneConfig, Tuner

    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(table.ENV_TABLE, raising=False)
    monkeypatch.setattr(table, "shipped_table_paths", lambda: [])
    monkeypatch.setattr(prior, "RULES", {})
    fast = TuneConfig(pairs=3, warmup=1, chain=1, rotate=2, cold_bytes=0)
    t = Tuner(table_path=str(tmp_path / "t.json"), use_cache=False, use_shipped=False,
              online=False, config=fast)
    previous = tuning.use_tuner(t)
    yield t
    tuning.use_tuner(previous)


@pytest.fixture
def check_env(check_tuner):
    """:func:`check_tuner`, with the sibling memo cleared first and the ``linear``
    candidates put back as they were after the test (fakes it registered removed, the
    ones it replaced registered again)."""
    from mlx_w8a8 import siblings
    from mlx_w8a8.kernels import registry

    siblings.clear()
    before = {c.name: c for c in registry.all_candidates() if c.op == "linear"}
    yield check_tuner
    for c in registry.all_candidates():
        if c.op == "linear" and c.name not in before:
            registry.unregister("linear", c.name)
    for c in before.values():
        registry.register(c)


@pytest.fixture
def only_written_tables(tmp_path, monkeypatch):
    """Lookups see only the tables a test writes: no shipped tables, the hermetic cache
    directory; yields ``tmp_path``."""
    from mlx_w8a8.tuning import table

    monkeypatch.setattr(table, "shipped_table_paths", lambda: [])
    yield tmp_path


@pytest.fixture
def rng(request):
    """Fresh random data every run; the seed is printed so a failure can be replayed
    (set MLX_W8A8_TEST_SEED to replay it)."""
    seed = int(os.environ.get("MLX_W8A8_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[seed {seed}] {request.node.nodeid}")
    import mlx.core as mx

    mx.random.seed(seed)  # MLX's own initializers too (model weights), so the seed replays
    return np.random.default_rng(seed)


@pytest.fixture
def bound_spy():
    """``(calls, run, bind_stages)``: a linear candidate's ``run`` and ``bind_stages``
    (one bound stage) around ``mlx_qmm`` that count their calls, for tests that a
    timing path runs a candidate as a layer does (through ``bind_stages``, never
    ``run``)."""
    from mlx_w8a8.kernels import registry

    qmm = registry.get("linear", "mlx_qmm")
    calls = {"run": 0, "bind": 0, "apply": 0}

    def run(x, w, b):
        calls["run"] += 1
        return qmm.run(x, w, b)

    def bind_stages(problem, w, b):
        calls["bind"] += 1

        def apply(x):
            calls["apply"] += 1
            return qmm.run(x, w, b)
        return None, None, apply

    return calls, run, bind_stages


@pytest.fixture
def timed_links(monkeypatch):
    """The ``link`` argument of every ``timing.paired_measure`` call made while the test
    runs, in order (the calls still run)."""
    from mlx_w8a8.tuning import timing

    links = []
    real = timing.paired_measure

    def spy(*args, **kw):
        links.append(kw.get("link"))
        return real(*args, **kw)

    monkeypatch.setattr(timing, "paired_measure", spy)
    return links
