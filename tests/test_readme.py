"""The README's Python API block runs as written, on a tiny mlx-lm model.

Each blank-line separated group of the block runs after the names the README leaves to
the reader are set afresh (a float model and its config, calibration batches, a
distributed group, a weight, activations), in a folder holding ``float-model/``. No
warning or logged error may come out of it: running this block after ``tune_model``
once showed the tuner's chooser failing on ``quantize_activation`` (N = 0).
"""

import logging
from pathlib import Path

import mlx.core as mx
import numpy as np

import tiny_lm

ROOT = Path(__file__).resolve().parent.parent


def api_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## The Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    return [group for group in block.strip().split("\n\n") if group.strip()]


def test_the_block_has_the_calls_the_readme_lists():
    # So the test below cannot pass by finding an empty or renamed block.
    code = "\n".join(api_block())
    for call in ("Linear.from_linear", "w8.quantize(", "w8.summary(", "w8.tune_model(",
                 "w8.save(", "w8.load(", "w8.calibrate(", "w8.smooth(", "w8.shard(",
                 "w8.quantize_weight(", "w8.quantize_activation(", "w8.int8_matmul(",
                 "w8.w8a8_linear(", "w8.warm_up("):
        assert call in code, call


def test_the_python_api_block_runs(only_written_tables, monkeypatch, rng, caplog, recwarn):
    # conftest's hermetic fixture gives a fresh tuner and cache directory, put back after.
    tmp_path = only_written_tables
    monkeypatch.chdir(tmp_path)
    source, config = tiny_lm.model("llama", rng=rng)
    tiny_lm.folder(tmp_path / "float-model", source, config)
    caplog.set_level(logging.WARNING)
    names: dict = {}  # one namespace: the first group's imports serve the rest
    for i, group in enumerate(api_block()):
        model, _ = tiny_lm.model("llama", rng=rng)
        names.update(
            model=model, config=config, group=mx.distributed.init(),
            batches=[mx.array(rng.integers(0, 256, (2, 16)))],
            w=mx.array(rng.standard_normal((64, 128)).astype(np.float32)),
            x=mx.array(rng.standard_normal((4, 128)).astype(np.float32)),
            a_i8=mx.array(rng.integers(-128, 128, (4, 128)).astype(np.int8)),
            b_i8=mx.array(rng.integers(-128, 128, (64, 128)).astype(np.int8)),
            bias=mx.array(rng.standard_normal(64).astype(np.float32)),
        )
        exec(compile(group, f"README API block, group {i}", "exec"), names)
        mx.eval([v for v in names.values() if isinstance(v, mx.array)])
    assert (tmp_path / "out" / "config.json").is_file()  # save() wrote the checkpoint
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [str(w.message) for w in recwarn] == []
    # the last group's outputs, against the oracle's shapes
    assert names["c"].dtype == mx.int32 and names["c"].shape == (4, 64)
    assert names["y"].shape == (4, 64) and names["q"].dtype == mx.int8
