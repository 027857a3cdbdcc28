"""Tuning table files: schema, merge, atomic locked writes, reports of bad tables."""

import json
import multiprocessing as mp
import os

import pytest

from mlx_w8a8.tuning import table


def _entry(n=64, k=32, m_bucket=1, choice="mlx_qmm", op="linear"):
    return {"op": op, "m_bucket": m_bucket, "n": n, "k": k, "dtype": "float32",
            "weight_format": "per_channel", "group_size": 32, "choice": choice,
            "candidates": {}}


@pytest.fixture(autouse=True)
def _fresh_reports():
    table.reset_reports()
    yield
    table.reset_reports()


def test_device_key_names_backend_device_and_versions():
    key = table.device_key()
    assert key["backend"] == "cpu" or key["backend"] in ("metal", "cuda")
    assert isinstance(key["device"], dict) and key["device"]
    import mlx.core as mx
    import mlx_w8a8
    assert key["mlx_version"] == mx.__version__ and key["package_version"] == mlx_w8a8.__version__
    json.dumps(key)  # JSON-safe


def test_device_identity_is_the_model_not_the_unit_or_its_state(monkeypatch):
    # Free memory changes between processes and a UUID names one physical GPU: keyed
    # on them, every table would be stale on the next run or on a second H200.
    import mlx.core as mx
    info = {"device_name": "NVIDIA H200", "architecture": "sm_90", "total_memory": 150754820096,
            "free_memory": 149557477376, "uuid": "GPU-3f7d", "pci_bus_id": "0000:00:06.0",
            "compute_capability_major": 9}
    monkeypatch.setattr(mx, "device_info", lambda *a: dict(info))
    assert table.device_identity() == {
        "architecture": "sm_90", "compute_capability_major": 9,
        "device_name": "NVIDIA H200", "total_memory": 150754820096}
    info["free_memory"] = 1
    assert table.device_identity()["device_name"] == "NVIDIA H200" and "free_memory" not in table.device_identity()


def test_write_then_read_round_trip(tmp_path):
    path = str(tmp_path / "sub" / "t.json")
    key = table.device_key()
    table.write_entries(path, key, [_entry()])
    doc = table.read(path)
    assert doc["schema"] == table.SCHEMA and len(doc["sections"]) == 1
    assert table.matching_entries(doc, key, path) == [_entry()]
    assert not [p for p in os.listdir(tmp_path / "sub") if p.endswith(".tmp")]  # no temp left


def test_merge_replaces_same_key_and_keeps_the_rest(tmp_path):
    path = str(tmp_path / "t.json")
    key = table.device_key()
    other = dict(key, mlx_version="0.0.1")
    table.write_entries(path, other, [_entry(choice="old_mlx")])
    table.write_entries(path, key, [_entry(n=64), _entry(n=128)])
    table.write_entries(path, key, [_entry(n=64, choice="exact"), _entry(n=256)])
    doc = table.read(path)
    mine = {e["n"]: e["choice"] for e in table.matching_entries(doc, key, path)}
    assert mine == {64: "exact", 128: "mlx_qmm", 256: "mlx_qmm"}
    # the other version's section is kept, not deleted
    assert any(s["mlx_version"] == "0.0.1" and s["entries"] for s in doc["sections"])


@pytest.mark.parametrize("content, reason", [
    ("{not json", "not valid JSON"),
    ('{"schema": 99, "sections": []}', "schema 99"),
    ('{"sections": []}', "no 'schema'"),
    ('{"schema": 1, "sections": [{"backend": "cpu"}]}', "section 0 lacks"),
    ('{"schema": 1, "sections": [{"backend": 1, "device": {}, "mlx_version": "x", '
     '"package_version": "y", "entries": []}]}', "backend 1, not a string"),
])
def test_corrupt_table_is_reported_once_and_skipped(tmp_path, content, reason):
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        f.write(content)
    with pytest.warns(table.TuningTableWarning, match=reason):
        assert table.load(path) is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second load must not warn again
        assert table.load(path) is None


def test_corrupt_table_is_never_overwritten(tmp_path):
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        f.write("{truncated")
    with pytest.raises(table.TableError, match="not valid JSON"):
        table.write_entries(path, table.device_key(), [_entry()])
    assert open(path).read() == "{truncated"


def test_check_writable_raises_before_a_write_would(tmp_path):
    # What write_entries would raise after minutes of tuning, raised up front; a
    # writable place is left exactly as it was (the probe file is removed).
    table.check_writable(str(tmp_path / "new" / "t.json"))
    assert os.listdir(tmp_path / "new") == []
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(table.TableError, match="bad.json"):
        table.check_writable(str(bad))
    (tmp_path / "file").write_text("")
    with pytest.raises(table.TableError, match="cannot"):
        table.check_writable(str(tmp_path / "file" / "t.json"))


def test_missing_table_is_not_an_error(tmp_path):
    assert table.read(str(tmp_path / "none.json")) is None
    assert table.load(str(tmp_path / "none.json")) is None


def test_other_version_and_other_device_are_reported_and_unused(tmp_path):
    key = table.device_key()
    old = str(tmp_path / "old.json")
    table.write_entries(old, dict(key, mlx_version="0.1.0", package_version="0.0.9"), [_entry()])
    with pytest.warns(table.TuningTableWarning, match=r"measured with MLX 0\.1\.0 / mlx_w8a8 0\.0\.9"):
        assert table.matching_entries(table.read(old), key, old) == []
    far = str(tmp_path / "far.json")
    table.write_entries(far, dict(key, backend="cuda", device={"device_name": "NVIDIA H200"}), [_entry()])
    with pytest.warns(table.TuningTableWarning, match="measured on cuda NVIDIA H200"):
        assert table.matching_entries(table.read(far), key, far) == []


def test_a_multi_device_table_with_a_section_for_us_does_not_warn(tmp_path):
    # Shipping one table for several devices is normal: no noise when ours is there.
    path = str(tmp_path / "multi.json")
    key = table.device_key()
    table.write_entries(path, dict(key, backend="cuda", device={"device_name": "X"}), [_entry()])
    table.write_entries(path, key, [_entry(choice="mine")])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [e["choice"] for e in table.matching_entries(table.read(path), key, path)] == ["mine"]


def test_cache_path_follows_the_override(tmp_path, monkeypatch):
    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path))
    assert table.cache_table_path() == os.path.join(str(tmp_path), "tuning.json")
    monkeypatch.delenv(table.ENV_CACHE_DIR)
    assert table.cache_table_path().endswith(os.path.join("mlx_w8a8", "tuning.json"))


def test_shipped_tables_are_only_json_files():
    # Nothing fake is shipped; whatever is there must be a readable table.
    for path in table.shipped_table_paths():
        assert path.endswith(".json") and table.read(path) is not None


def _writer(path, start, count, key):
    for n in range(start, start + count):
        table.write_entries(path, key, [_entry(n=n)])


def test_concurrent_writers_in_two_processes_lose_nothing(tmp_path):
    # Read-modify-write without the lock would drop entries here: each process
    # re-reads and writes the whole file 25 times while the other does the same.
    path = str(tmp_path / "shared.json")
    key = table.device_key()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, s, 25, key)) for s in (0, 1000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ns = sorted(e["n"] for e in table.matching_entries(table.read(path), key, path))
    assert ns == list(range(25)) + list(range(1000, 1025))


def test_import_and_inference_survive_missing_table_dependencies(tmp_path):
    # A minimal image (no platformdirs, no filelock) must still import the package and
    # run inference; only table writes are refused.
    import subprocess
    import sys
    code = (
        "import sys; sys.modules['platformdirs'] = None; sys.modules['filelock'] = None\n"
        "import mlx.core as mx, mlx_w8a8\n"
        "from mlx_w8a8.tuning import table\n"
        "w = mlx_w8a8.quantize_weight(mx.ones((8, 64)), group_size=32)\n"
        "mx.eval(mlx_w8a8.w8a8_linear(mx.ones((2, 64)), w))\n"
        "assert table.cache_table_path().endswith('tuning.json')\n"
        "try:\n"
        f"    table.write_entries({str(tmp_path / 't.json')!r}, table.device_key(), [])\n"
        "except table.TableError as e:\n"
        "    print('refused:', e)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "filelock" in r.stdout


def test_written_table_respects_the_umask_and_nothing_lands_beside_it(tmp_path):
    # A table is a file users share: 0644 under a 022 umask (mkstemp alone gives 0600),
    # and no lock or claim files next to it (they live in the user cache directory).
    folder = tmp_path / "app"
    path = str(folder / "tuning.json")
    old = os.umask(0o022)
    try:
        table.write_entries(path, table.device_key(), [_entry()])
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert os.listdir(folder) == ["tuning.json"]
    os.umask(0o077)
    try:
        table.write_entries(str(folder / "private.json"), table.device_key(), [_entry()])
    finally:
        os.umask(old)
    assert os.stat(folder / "private.json").st_mode & 0o777 == 0o600
    os.chmod(path, 0o664)  # an existing table keeps the mode its owner gave it
    table.write_entries(path, table.device_key(), [_entry(n=128)])
    assert os.stat(path).st_mode & 0o777 == 0o664


def test_missing_named_table_is_reported_once(tmp_path):
    # A typo in MLX_W8A8_TUNING_TABLE must not go unnoticed; the cache table, which
    # may not exist yet, stays quiet (missing_ok, the default).
    path = str(tmp_path / "typo.json")
    with pytest.warns(table.TuningTableWarning, match=r"typo\.json does not exist"):
        assert table.load(path, missing_ok=False) is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert table.load(path, missing_ok=False) is None
        assert table.load(str(tmp_path / "cache.json")) is None


def test_a_table_problem_is_one_warning_not_a_warning_and_a_log_line(tmp_path, caplog):
    # With logging configured the user would otherwise read every message twice.
    import logging
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        f.write("{not json")
    with caplog.at_level(logging.INFO, logger="mlx_w8a8.tuning"):
        with pytest.warns(table.TuningTableWarning) as caught:
            table.load(path)
    assert len(caught) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_device_key_follows_the_device_a_call_runs_on(monkeypatch):
    # Keys are per device, never one key cached for the process: a call under
    # ``with mx.stream(gpu)`` (an op's stream=) reads the GPU's section, the next CPU
    # call the CPU's.
    import mlx.core as mx
    cpu = table.device_key(mx.cpu)
    assert cpu["backend"] == "cpu" and table.device_key(mx.cpu) is cpu
    gpu = mx.Device(mx.gpu, 0)
    assert table.device_key(gpu)["backend"] != "cpu"
    monkeypatch.setattr(mx, "default_device", lambda: gpu)
    assert table.device_key()["backend"] != "cpu"
    monkeypatch.undo()
    assert table.device_key() == table.device_key(mx.default_device())


def test_pruned_within_reach_names_one_round_candidates_under_twice_the_fastest():
    def entry(**cands):
        return {**_entry(), "candidates": cands}

    ok = lambda ns, **kw: {"status": "ok", "median_ns": ns, **kw}  # noqa: E731
    # the bar is half the prune ratio times the fastest fully timed median
    assert table.PRUNE_RATIO / 2 == 2.0
    e = entry(a=ok(100.0), b=ok(199.0, rounds=1), c=ok(201.0, rounds=1), d=ok(50.0, rounds=1))
    assert table.pruned_within_reach(e) == ["b", "d"]  # d: a one-round sample faster still
    # only ok, one-round candidates with a median count; no fully timed one: nothing
    assert table.pruned_within_reach(entry(a=ok(100.0), b={"status": "rejected", "rounds": 1})) == []
    assert table.pruned_within_reach(entry(b=ok(10.0, rounds=1))) == []
    assert table.pruned_within_reach(_entry()) == []


# --- entry schema: a bad entry is skipped with a warning, never silently used or fatal ---

_BAD_FIELDS = [
    ("m_bucket", "one", "m_bucket is 'one', not an integer >= 1"),
    ("m_bucket", 0, "m_bucket is 0"),
    ("m_bucket", True, "m_bucket is True"),  # a bool is an int to Python, not a bucket
    ("n", None, "n is None, not an integer >= 0"),
    ("k", 32.0, "k is 32.0, not an integer >= 1"),
    ("op", "matmul", "op is 'matmul'"),
    ("dtype", "fp16", "dtype is 'fp16'"),
    ("weight_format", "int4", "weight_format is 'int4'"),
    ("group_size", 0, "group_size is 0"),
    ("choice", "", "choice is ''"),
    ("choice", 3, "choice is 3"),
    ("has_bias", "no", "has_bias is 'no'"),
    ("candidates", [], "candidates is []"),
    ("candidates", {"exact": {"status": "ok", "median_ns": "fast"}},
     "candidates['exact'].median_ns is 'fast'"),
    ("candidates", {"exact": {"status": "ok", "median_ns": float("nan")}},
     "candidates['exact'].median_ns is nan"),
    # the decode check's verdict: a batched one names its batch size B >= 2
    ("decode_check", {"tuned": "gemv", "kept": True, "batch": 1}, "decode_check is {"),
    ("decode_check", {"tuned": "gemv", "kept": True, "batch": "8"}, "decode_check is {"),
    ("decode_check", "kept", "decode_check is 'kept'"),
]


@pytest.mark.parametrize("field, value, why", _BAD_FIELDS,
                         ids=[f"{f}={v!r}" for f, v, _ in _BAD_FIELDS])
def test_entry_problems_names_the_field_its_value_and_what_is_valid(field, value, why):
    assert table.entry_problems(_entry()) == []  # the control
    assert table.entry_problems({**_entry(), "group_size": None, "has_bias": False}) == []
    found = table.entry_problems({**_entry(), field: value})
    assert len(found) == 1 and found[0].startswith(why), found
    missing = table.entry_problems({k: v for k, v in _entry().items() if k != "n"})
    assert missing == ["lacks ['n']"]
    assert table.entry_problems(["not", "an", "entry"]) == ["not an object (list)"]


def test_decode_check_verdicts_old_and_batched_are_valid():
    """Tables written before batched decode checks (no ``batch``) stay valid."""
    b1 = {"tuned": "gemv", "reference": "mlx_qmm", "ratio": 0.9, "kept": False, "rounds": 20}
    assert table.entry_problems({**_entry(), "decode_check": b1}) == []
    assert table.entry_problems({**_entry(), "decode_check": dict(b1, batch=32)}) == []


def _bad_table(tmp_path):
    """A table of this machine with a valid entry between two invalid ones (written as
    a user's editor would: by hand, not through write_entries)."""
    key = table.device_key()
    entries = [{**_entry(n=64), "m_bucket": "one"}, _entry(n=128), {**_entry(n=256), "n": None}]
    path = str(tmp_path / "hand.json")
    with open(path, "w") as f:
        json.dump({"schema": 1, "sections": [dict(key, entries=entries)]}, f, indent=1)
    return path, key


def test_invalid_entries_are_skipped_with_one_warning_at_the_entry_line(tmp_path):
    # Before: the table passed, and the tuner's chooser failed on the first lookup
    # (``log2('one')``) and fell back silently for every shape of the table.
    path, key = _bad_table(tmp_path)
    with pytest.warns(table.TuningTableWarning) as caught:
        doc = table.load(path)
    assert len(caught) == 1
    w = caught[0]
    text = str(w.message)
    assert path in text and "section 0 entry 0 (linear M='one' N=64 K=32)" in text
    assert "m_bucket is 'one'" in text and "1 more invalid entry" in text
    # it points at the user's table, at the line where the bad entry opens
    lines = open(path).read().splitlines()
    assert w.filename == path and lines[w.lineno - 1].strip() == "{"
    assert '"op": "linear"' in lines[w.lineno] and '"m_bucket": "one"' in "".join(lines[w.lineno:w.lineno + 3])
    assert [e["n"] for e in table.matching_entries(doc, key, path)] == [128]
    # read() (the writers' view) keeps them; matching_entries never hands them out
    raw = table.read(path)
    assert len(raw["sections"][0]["entries"]) == 3
    assert [e["n"] for e in table.matching_entries(raw, key, path)] == [128]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per file
        table.load(path)


def test_writing_into_a_table_with_invalid_entries_keeps_them_untouched(tmp_path):
    path, key = _bad_table(tmp_path)
    before = table.read(path)["sections"][0]["entries"]
    table.write_entries(path, key, [_entry(n=512), _entry(n=128, choice="exact")])
    after = table.read(path)["sections"][0]["entries"]
    assert [e["n"] for e in after if not table.entry_problems(e)] == [128, 512]
    assert [e for e in after if table.entry_problems(e)] == [before[0], before[2]]
    assert {e["n"]: e["choice"] for e in after if e["n"] == 128} == {128: "exact"}


def test_table_warnings_point_at_the_table_not_at_this_package(tmp_path):
    # Python prints the source line a warning points at: this package's own
    # ``warnings.warn(...)`` line means nothing to a user; the table's path does.
    path = str(tmp_path / "broken.json")
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.warns(table.TuningTableWarning) as caught:
        table.load(path)
    (w,) = caught
    assert w.filename == path and w.lineno == 0
    import warnings
    shown = warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
    assert shown.startswith(f"{path}:0: TuningTableWarning:") and "warnings.warn" not in shown


# --- writers that do not share a lock (different cache directories) ---------------------


def test_a_write_does_not_drop_what_another_writer_replaced_the_file_with(tmp_path, monkeypatch):
    # Writer A reads the table, writer B (another cache directory, so another lock)
    # replaces it with its entry, then A replaces it: before, A's version lacked B's
    # entry. Now A sees the file changed since its read and merges again.
    path = str(tmp_path / "shared.json")
    key = table.device_key()
    table.write_entries(path, key, [_entry(n=1)])
    real_read = table.read
    interleaved = []

    def read_then_b_writes(p):
        doc = real_read(p)
        if not interleaved:
            interleaved.append(1)
            with monkeypatch.context() as m:
                m.setenv(table.ENV_CACHE_DIR, str(tmp_path / "b-cache"))
                table.write_entries(path, key, [_entry(n=2)])
        return doc

    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path / "a-cache"))
    monkeypatch.setattr(table, "read", read_then_b_writes)
    table.write_entries(path, key, [_entry(n=3)])
    assert interleaved
    monkeypatch.setattr(table, "read", real_read)
    ns = sorted(e["n"] for e in table.matching_entries(table.read(path), key, path))
    assert ns == [1, 2, 3]
    mine, theirs = _entry(n=3), dict(_entry(n=2), choice="exact")
    assert table.account(path, key, [mine, theirs, _entry(n=4)]) == {
        "saved": [mine], "superseded": [theirs], "lost": [_entry(n=4)]}
