"""Lock and claim files: in the user cache directory, one measuring process per device."""

import multiprocessing as mp
import os

import pytest

from mlx_w8a8 import cachedir
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.tuning import locks
from mlx_w8a8.tuning.tuner import TuneConfig, Tuner

PROBLEM = Problem("linear", 2, 32, 64, "float32", "per_channel", 32)


def _hold_device(cache, ready, done):
    os.environ[cachedir.ENV_CACHE_DIR] = cache
    with locks.device_lock():
        ready.set()
        done.wait(60)


@pytest.fixture
def held_device(tmp_path):
    """Another process measuring on this device (holding its lock) until the test ends."""
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_device, args=(os.environ[cachedir.ENV_CACHE_DIR], ready, done))
    p.start()
    assert ready.wait(60)
    yield p
    done.set()
    p.join(60)


def test_device_lock_names_its_holder_on_timeout(held_device):
    with pytest.raises(locks.DeviceBusy) as info:
        with locks.device_lock(timeout=0.2):
            pytest.fail("two processes measured on one device at once")
    message = str(info.value)
    assert f"pid {held_device.pid}" in message and "on " in message and "waited 0.2 s" in message
    assert "cpu 0" in message or "gpu" in message


def test_tuner_does_not_measure_while_another_process_holds_the_device(held_device, tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "DEVICE_TIMEOUT_S", 0.2)
    t = Tuner(table_path=str(tmp_path / "t.json"), use_cache=False, use_shipped=False,
              config=TuneConfig(pairs=3, warmup=1, chain=1, rotate=2))
    out = t.tune(PROBLEM)
    # "busy", not "abandoned": the key stays open for a later attempt.
    assert out.source == "busy" and f"pid {held_device.pid}" in out.detail
    assert not (tmp_path / "t.json").exists()
    assert t.claim(PROBLEM) is not None  # the key's claim was released


def test_device_lock_is_released_and_its_owner_file_removed():
    with locks.device_lock(timeout=1) as path:
        owner = locks.owner(path)
        assert owner["pid"] == os.getpid() and owner["host"] and owner["command"]
    assert locks.owner(path) is None
    with locks.device_lock(timeout=0):  # free again
        pass


def test_lock_files_live_in_the_cache_directory(tmp_path):
    table_lock = locks.table_lock(str(tmp_path / "shared" / "t.json"))
    claim = locks.claim_lock("abc")
    cache = os.environ[cachedir.ENV_CACHE_DIR]
    for lock in (table_lock, claim):
        assert os.path.dirname(lock.lock_file).startswith(cache)
    # one table has one lock whatever path spelling names it
    same = locks.table_lock(str(tmp_path / "shared" / ".." / "shared" / "t.json"))
    assert same.lock_file == table_lock.lock_file


def test_unwritable_cache_directory_falls_back_to_tmp(tmp_path, monkeypatch):
    # A cache path below a regular file cannot be created (whoever runs the test).
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv(cachedir.ENV_CACHE_DIR, str(blocker / "cache"))
    path = locks.claim_lock("k").lock_file
    assert not path.startswith(str(blocker)) and os.path.isdir(os.path.dirname(path))
