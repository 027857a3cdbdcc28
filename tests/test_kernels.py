"""The kernels package: a backend that fails to import is loud, a missing one quiet."""

import logging

import pytest

from mlx_w8a8 import kernels
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Problem


@pytest.fixture
def broken_backend(monkeypatch):
    """``kernels.cuda`` raising at import (e.g. a typo in a launcher), restored after."""
    real = kernels.importlib.import_module

    def fake_import(name):
        if name == "mlx_w8a8.kernels.cuda":
            raise NameError("name 'tile_forr' is not defined")
        if name == "mlx_w8a8.kernels.gone":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name)

    monkeypatch.setattr(kernels.importlib, "import_module", fake_import)
    monkeypatch.setattr(kernels, "UNAVAILABLE", {})
    previous = registry._lookup_hook
    yield
    registry.set_lookup_hook(previous)


def test_failed_backend_warns_once_naming_backend_and_error(broken_backend):
    with pytest.warns(RuntimeWarning, match=r"cuda backend failed to import \(NameError: name 'tile_forr'"):
        kernels._load("cuda")
    assert kernels.unavailable() == {"cuda": "NameError: name 'tile_forr' is not defined"}
    assert "cuda" in kernels.UNAVAILABLE  # the name other modules (check) read


def test_backend_not_shipped_is_quiet(broken_backend, recwarn):
    kernels._load("gone")  # the module itself is absent from this install
    assert kernels.unavailable() == {}
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_failed_backend_is_logged_at_debug_on_each_lookup(broken_backend, caplog):
    with pytest.warns(RuntimeWarning):
        kernels._load("cuda")
    registry.set_lookup_hook(kernels._report_on_lookup)
    problem = Problem("int8_matmul", 2, 8, 32, "int8", "int8")
    with caplog.at_level(logging.DEBUG, logger="mlx_w8a8.kernels"):
        registry.choose(problem)
        registry.choose(problem)
    hits = [r for r in caplog.records if "cuda (NameError" in r.getMessage()]
    assert len(hits) == 2 and all(r.levelno == logging.DEBUG for r in hits)


def test_tests_are_hermetic():
    # The autouse fixture of conftest.py: the user's cache and MLX_W8A8_* settings
    # (e.g. MLX_W8A8_TUNE=1 in the shell running the suite) never reach a test.
    import os

    from conftest import HARNESS_VARIABLES
    from mlx_w8a8 import tuning
    from mlx_w8a8.tuning import table

    assert not [v for v in os.environ if v.startswith("MLX_W8A8_") and v not in
                HARNESS_VARIABLES + (table.ENV_CACHE_DIR,)]
    assert "mlx_w8a8-cache" in os.environ[table.ENV_CACHE_DIR]
    assert not tuning.get_tuner().online and tuning.get_tuner().table_path is None


def test_available_kernels_names_a_failed_backend(broken_backend):
    import mlx_w8a8

    with pytest.warns(RuntimeWarning):
        kernels._load("cuda")
    with pytest.warns(RuntimeWarning, match=r"available_kernels.*cuda \(NameError: name 'tile_forr'"):
        names = mlx_w8a8.available_kernels("linear")
    assert "exact" in names and "mlx_qmm" in names


def test_capabilities_by_backend(broken_backend):
    """Each imported backend module's capabilities, with reasons; only the named
    backend's when one is named, none for a backend without kernels (the CPU), none for
    a module that failed to import."""
    from mlx_w8a8.kernels import cuda, metal

    every = kernels.capabilities()
    assert every == {**cuda.status(), **metal.status()}
    assert set(every) == {"cuda_sm90", "cuda_tma", "metal", "nax"}
    assert all(isinstance(on, bool) and why for on, why in every.values())
    assert kernels.capabilities("cuda") == cuda.status()
    assert kernels.capabilities("metal") == metal.status()
    assert kernels.capabilities("cpu") == {}
    kernels.UNAVAILABLE["cuda"] = "NameError: name 'tile_forr' is not defined"
    assert kernels.capabilities("cuda") == {}
    assert set(kernels.capabilities()) == {"metal", "nax"}
