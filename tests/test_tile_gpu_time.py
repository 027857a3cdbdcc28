"""``bench/tile_gpu_time.py``'s changed-kernel arm, recorded without a GPU: a launch built
from another folder's kernel files carries that text and the extra template arguments,
and nothing built afterwards does (``cuda_bench.kernel_text_from`` restores the reader
and empties the loaders' caches)."""

import os
import sys

import numpy as np
import pytest

import mlx.core as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import tile_gpu_time  # noqa: E402
from kernel_recorder import fake_tensor_maps, record_launches  # noqa: E402

from mlx_w8a8.kernels.cuda import gemm as cuda_gemm, launch, tiles as cuda_tiles  # noqa: E402
from mlx_w8a8.kernels import sources  # noqa: E402
from mlx_w8a8.weight import QuantizedWeight  # noqa: E402

BODY_MARK = "int w8a8_changed_body = 0;"
HEADER_MARK = "constexpr int kW8a8ChangedHeader = 1;"


@pytest.fixture
def builds(monkeypatch, tmp_path):
    rec = record_launches(monkeypatch)
    for c in (launch.load, launch.requires, launch._kernel):
        c.cache_clear()
    yield rec
    for c in (launch.load, launch.requires, launch._kernel):
        c.cache_clear()


def marked_folder(tmp_path, file: str, body: str) -> str:
    """A folder holding kernel ``file`` with a line of code added to its header and to
    its body ``body``."""
    text = sources.read("cuda", file)
    text = text.replace("namespace w8a8 {", "namespace w8a8 {\n" + HEADER_MARK, 1)
    text = text.replace(f"// @@ body {body}\n", f"// @@ body {body}\n" + BODY_MARK + "\n", 1)
    assert BODY_MARK in text and HEADER_MARK in text
    (tmp_path / file).write_text(text, encoding="utf-8")
    return str(tmp_path)


def changed_folder(tmp_path) -> str:
    """A gemm_ws.cu with a line of code added to its header and to its channel_u8 body."""
    return marked_folder(tmp_path, "gemm_ws.cu", "channel_u8")


def header_text(include: str) -> str:
    path = include.split('"')[1]
    with open(path, encoding="utf-8") as f:
        return f.read()


def last_build_marked(builds) -> bool:
    """Whether the last kernel built carries the folder's marks (both or neither)."""
    built = builds.builds[-1]
    body, header = BODY_MARK in built["source"], HEADER_MARK in header_text(built["header"])
    assert body == header
    return body


def changed_then_shipped(builds, changed, shipped, extra):
    """``changed()`` (a launch built from a marked folder with the template arguments
    ``extra`` appended) carries the marks and ``extra``; ``shipped()`` afterwards (the
    package's launch) carries neither. Returns both specs."""
    spec = changed()
    assert spec.template[-len(extra):] == extra and last_build_marked(builds)
    base = shipped()
    assert not last_build_marked(builds)
    assert base.template == spec.template[:-len(extra)]
    return spec, base


def test_changed_arm_builds_from_the_folder_and_nothing_else_does(builds, tmp_path, rng):
    weight = QuantizedWeight.from_float(
        mx.array(rng.standard_normal((64, 256)).astype(np.float32)), 64, per_channel=True)
    cfg = cuda_tiles.WS_CONFIGS["ws32p4"]
    real_read = sources.read
    folder = changed_folder(tmp_path)
    names = []

    def changed():
        spec = tile_gpu_time.changed_gemm_spec(folder, [("MI", 2)], 16, 256, weight, cfg)
        names.append(builds.builds[-1]["mlx_name"])
        # Afterwards the package's text again: the reader restored, the caches emptied.
        assert sources.read is real_read
        return spec

    def shipped():
        spec = cuda_gemm.gemm_per_channel_spec(16, 256, weight, None, mx.bfloat16, cfg, unsigned=True)
        names.append(builds.builds[-1]["mlx_name"])
        return spec

    spec, _ = changed_then_shipped(builds, changed, shipped, [("MI", 2)])
    assert spec.template[:-1] == [("T", mx.bfloat16)] + cfg.template()
    assert names[0] != names[1]  # both versions coexist in one process under their own names


def test_variant_tiles_keep_the_shipped_ones_and_add_only_what_fits():
    """--acc and --stages add variants beside the shipped tiles: a count a ping-pong tile
    or a wide tile cannot hold is not added, nor a ring deeper than the shipped one (its
    shared memory is already full) or shallower than 2."""
    tiles = {"tma32": cuda_tiles.TMA_CONFIGS["tma32"], "tma128pp": cuda_tiles.TMA_CONFIGS["tma128pp"]}
    acc = tile_gpu_time.with_accumulators(tiles, [1, 2, 4])
    assert acc["tma32a2"] == tiles["tma32"]._replace(accumulators=2)
    assert acc["tma32a4"].accumulators == 4 and "tma32a1" not in acc  # its own count
    assert not any(k.startswith("tma128ppa") for k in acc)  # ping-pong: one set per half
    deep = tiles["tma32"].stages
    st = tile_gpu_time.with_stages(tiles, [1, 4, deep, deep + 2])
    assert st["tma32s4"] == tiles["tma32"]._replace(stages=4)
    assert st["tma128pps4"].stages == 4 and st["tma128pps4"].pingpong
    assert set(st) == {"tma32", "tma128pp", "tma32s4", "tma128pps4"}
    assert st["tma32s4"].shared_memory < tiles["tma32"].shared_memory
    co = tile_gpu_time.with_cooperative(tiles)
    assert co["tma128ppc"] == tiles["tma128pp"]._replace(pingpong=False)
    assert set(co) == {"tma32", "tma128pp", "tma128ppc"}  # a cooperative tile has no variant


def test_grouped_variants_time_only_runs_the_tile_takes():
    """--grouped's arms beside each tile: the MMA order or the skip alone, or each
    pipelined-promotion run the tile takes at K and the group size (a run that does not
    divide K / group_size, or 4 at bn = 128, would be refused by the launcher), with
    --live also each run with the skip."""
    wide, narrow = cuda_tiles.GROUPED_TMA_CONFIGS["gtma128"], cuda_tiles.GROUPED_TMA_CONFIGS["gtma32"]
    assert tile_gpu_time.grouped_variants(wide, "order", 4096, 64) == [("o", wide._replace(order=True))]
    assert tile_gpu_time.grouped_variants(narrow, "live", 4096, 64) == [("l", narrow._replace(live=True))]
    assert tile_gpu_time.grouped_variants(wide, "pipe", 4096, 64) == [("p2", wide._replace(pipe=2))]
    assert [t for t, _ in tile_gpu_time.grouped_variants(narrow, "pipe", 4096, 64)] == ["p2", "p4"]
    assert [t for t, _ in tile_gpu_time.grouped_variants(narrow, "pipe", 768, 128)] == ["p2"]  # 6 groups
    both = tile_gpu_time.grouped_variants(narrow, "live+pipe", 4096, 128)
    assert [t for t, _ in both] == ["l", "p2", "p4", "lp2", "lp4"]
    assert both[-1][1] == narrow._replace(pipe=4, live=True)


def test_grouped_changed_arm_builds_from_the_folder(builds, tmp_path, rng, monkeypatch):
    """--grouped --kernel-dir: the group-wise TMA GEMM's launch on a tile built from a
    changed gemm_grouped_ws.cu (header and body), with the extra template arguments
    appended; the package's own launch afterwards carries neither."""
    from mlx_w8a8.kernels.cuda import gemm_grouped as cuda_gemm_grouped

    fake_tensor_maps(monkeypatch)
    folder = marked_folder(tmp_path, "gemm_grouped_ws.cu", "tma_grouped")
    w = mx.array(rng.standard_normal((264, 512)).astype(np.float32))
    weight = QuantizedWeight.from_float(w, 64, per_channel=False)
    cfg = cuda_tiles.GROUPED_TMA_CONFIGS["gtma128"]
    spec, _ = changed_then_shipped(
        builds, lambda: tile_gpu_time.changed_grouped_spec(folder, [("X", 1)], 130, 512, weight, cfg),
        lambda: cuda_gemm_grouped.gemm_grouped_tma_spec(130, 512, weight, None, mx.bfloat16, cfg),
        [("X", 1)])
    assert spec.template[:-1] == [("T", mx.bfloat16), ("GS", 64)] + cfg.template()


def test_once_evaluates_each_arm_twice_and_times_nothing(monkeypatch):
    """--once (for a kernel profiler): each arm is evaluated twice, no profiler is
    imported, and the row reads zeros."""
    calls = []

    def arm():
        calls.append(1)
        return mx.zeros((2,))

    monkeypatch.setattr(tile_gpu_time, "ONCE", True)
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would fail
    assert tile_gpu_time.timed(arm, 5) == (0.0, 0.0)
    assert len(calls) == 2


def test_a_folder_changes_the_kernels_whose_files_it_holds(tmp_path):
    """--kernel-dir arms go to the kernels a folder's files change (the file itself or a
    header it requires), so a folder holding a changed dequantizing GEMM builds no
    group-wise TMA arm, and a changed shared header reaches both."""
    assert not tile_gpu_time.changes("", "gemm_dequant.cu")
    (tmp_path / "gemm_dequant.cu").write_text("// changed\n", encoding="utf-8")
    folder = str(tmp_path)
    assert tile_gpu_time.changes(folder, "gemm_dequant.cu")
    assert not tile_gpu_time.changes(folder, "gemm_grouped_ws.cu")
    assert not tile_gpu_time.changes(folder, "gemm_subnormal.cu")
    os.remove(tmp_path / "gemm_dequant.cu")
    (tmp_path / "ws.cuh").write_text("// changed\n", encoding="utf-8")
    assert "ws.cuh" in launch.requires("gemm_dequant.cu")
    assert tile_gpu_time.changes(folder, "gemm_dequant.cu")
    assert tile_gpu_time.changes(folder, "gemm_grouped_ws.cu")


def test_dequant_changed_arm_builds_from_the_folder(builds, tmp_path, rng, monkeypatch):
    """--grouped --kernel-dir with a changed gemm_dequant.cu: the dequantizing GEMM's
    launch on a tile built from it, the extra template arguments appended; the package's
    launch afterwards carries neither."""
    from mlx_w8a8.kernels.cuda import gemm_dequant as cuda_gemm_dequant

    fake_tensor_maps(monkeypatch)
    folder = marked_folder(tmp_path, "gemm_dequant.cu", "dequant")
    w = mx.array(rng.standard_normal((256, 512)).astype(np.float32))
    wq, sq, bq = mx.quantize(w.astype(mx.bfloat16), group_size=64, bits=4)
    weight = QuantizedWeight(wq, sq, bq, 64, per_channel=False, bits=4)
    cfg = cuda_tiles.DEQUANT_CONFIGS["dq256"]
    changed_then_shipped(
        builds, lambda: tile_gpu_time.changed_dequant_spec(folder, [("DEPTH", 3)], 300, 512, weight, cfg),
        lambda: cuda_gemm_dequant.gemm_dequant_spec(300, 512, weight, None, mx.bfloat16, cfg),
        [("DEPTH", 3)])
