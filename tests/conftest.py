import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def rng(request):
    """Fresh random data every run; the seed is printed so a failure can be replayed
    (set MLX_W8A8_TEST_SEED to replay it)."""
    seed = int(os.environ.get("MLX_W8A8_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[seed {seed}] {request.node.nodeid}")
    return np.random.default_rng(seed)
