import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Read by the ``rng`` fixture to replay a failure; every other MLX_W8A8_* variable is
# removed for the duration of each test.
SEED_VARIABLE = "MLX_W8A8_TEST_SEED"


@pytest.fixture(autouse=True)
def hermetic(tmp_path_factory, monkeypatch):
    """Every test runs as on a fresh machine: no ``MLX_W8A8_*`` variables from the
    caller's shell (``MLX_W8A8_TUNE=1`` would make ops measure and write tables), a
    temporary cache directory (nothing read from or written to the user's cache), and
    a fresh process-wide tuner with its chooser installed and no reports remembered."""
    from mlx_w8a8 import tuning
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.tuning import table

    for name in list(os.environ):
        if name.startswith("MLX_W8A8_") and name != SEED_VARIABLE:
            monkeypatch.delenv(name)
    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path_factory.mktemp("mlx_w8a8-cache")))
    chooser = registry.set_chooser(None)
    tuning._tuner = None
    tuning.install()
    table.reset_reports()
    yield
    tuning._tuner = None
    registry.set_chooser(chooser)
    table.reset_reports()


@pytest.fixture
def rng(request):
    """Fresh random data every run; the seed is printed so a failure can be replayed
    (set MLX_W8A8_TEST_SEED to replay it)."""
    seed = int(os.environ.get("MLX_W8A8_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[seed {seed}] {request.node.nodeid}")
    return np.random.default_rng(seed)
