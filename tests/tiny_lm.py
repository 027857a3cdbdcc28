"""Tiny randomly initialised mlx-lm models and model folders for the accuracy tests.

Hermetic: nothing is downloaded; a folder's tokenizer is the byte tokenizer written by
``mlx_w8a8.tokens.write_byte_tokenizer``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlx.core as mx
import numpy as np


def args_for(family: str, n_heads: int = 4, n_kv: int = 2, hidden: int = 128,
             inter: int = 256, layers: int = 2):
    """``(module, ModelArgs)`` of a tiny model of ``family`` (llama, mistral, qwen2, qwen3)."""
    from mlx_lm.models import llama, qwen2, qwen3

    common = dict(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
        num_attention_heads=n_heads, num_key_value_heads=n_kv, rms_norm_eps=1e-5,
        vocab_size=256, tie_word_embeddings=False, max_position_embeddings=256,
    )
    if family in ("llama", "mistral"):
        return llama, llama.ModelArgs(model_type=family, **common)
    if family == "qwen2":
        return qwen2, qwen2.ModelArgs(model_type="qwen2", **common)
    if family == "qwen3":
        # head_dim != hidden / heads, as in the real Qwen3 models
        return qwen3, qwen3.ModelArgs(model_type="qwen3", head_dim=48, rope_theta=1e6, **common)
    raise ValueError(family)


def model(family: str = "llama", dtype=mx.float32, rng: np.random.Generator | None = None, **kw):
    """A tiny model with non-trivial norm weights and biases (so folding into them is
    exercised), and its config dict."""
    module, args = args_for(family, **kw)
    m = module.Model(args)
    if rng is not None:
        for block in m.model.layers:
            for norm in (block.input_layernorm, block.post_attention_layernorm):
                norm.weight = mx.array(rng.uniform(0.5, 2.0, norm.weight.shape).astype(np.float32))
            attn = block.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                if "bias" in proj:
                    proj.bias = mx.array(rng.normal(0, 0.5, proj.bias.shape).astype(np.float32))
    m.set_dtype(dtype)
    mx.eval(m.parameters())
    config = {k: v for k, v in dataclasses.asdict(args).items() if v is not None}
    return m, config


def folder(path: Path, m, config: dict, tokenizer: bool = True) -> Path:
    """Save ``m`` as an mlx-lm model folder (with a byte tokenizer)."""
    from mlx_lm.utils import save_config, save_model

    from mlx_w8a8.tokens import write_byte_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    save_model(path, m)
    save_config(dict(config), path / "config.json")
    if tokenizer:
        write_byte_tokenizer(path)
    return path


def config_folder(path: Path) -> Path:
    """A model folder holding only the ``config.json`` of a one-block Llama (hidden 64,
    vocab 256): the commands that take ``--model PATH`` build it with random weights."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}))
    return path


def text_file(path: Path, n_bytes: int = 4096) -> Path:
    """A small local text file: Python source from the standard library (json's
    decoder), repeated to ``n_bytes``."""
    import json.decoder

    src = Path(json.decoder.__file__).read_bytes()
    data = (src * (n_bytes // len(src) + 1))[:n_bytes]
    path.write_bytes(data)
    return path


def converted(family: str = "llama"):
    """A tiny float32 ``family`` model converted with :func:`mlx_w8a8.quantize` (siblings
    linked), for the model checks' tests."""
    import mlx_w8a8

    m, _ = model(family, dtype=mx.float32)
    mlx_w8a8.quantize(m)
    return m


def sleeping_qmm(seconds: float):
    """A linear ``run(x, w, b)``: ``mx.quantized_matmul`` (the reference's math) after
    ``seconds`` of host time, for kernels that are slow on the host in a check's tests."""
    import time

    from mlx_w8a8.kernels import registry

    qmm = registry.get("linear", "mlx_qmm").run

    def run(x, w, b):
        time.sleep(seconds)
        return qmm(x, w, b)
    return run


def record_choice(tuner, problem, choice: str, candidates=None):
    """Record in ``tuner`` an entry for ``problem``'s M bucket that timed ``candidates``
    (names; default: the reference ``mlx_qmm`` and ``choice``) and chooses ``choice``, as
    if it had won the per-shape race: the model checks' tests start from such entries."""
    from mlx_w8a8.kernels import registry

    names = candidates if candidates is not None else ("mlx_qmm", choice)
    entry = tuner.measure(problem, candidates=[registry.get("linear", n) for n in names])
    entry["choice"] = choice
    tuner.record(tuner.claim(problem), entry)



def unsettled_then_faster(base: str | None, calls: list, fast: str | None = None):
    """A stand-in for ``model_timing.alternate`` for the model checks' second look: its
    first call (6 rounds) makes every variant but ``base`` (or, given ``fast``, that
    variant alone, every other at the base's speed: the decode check's ``tuned`` against
    each group taken off) 1.25x faster in 4 rounds and 1.05x slower in 2 (median 1.25x,
    lower quartile 0.95x: unsettled), every later call faster in all its rounds.
    ``calls`` receives ``(names, rounds)`` per call."""
    def alternate(names, rounds, measure, on_round=None):
        calls.append((list(names), rounds))
        variant = [0.8] * 4 + [1.05] * 2 if len(calls) == 1 else [0.8] * rounds
        assert len(variant) == rounds, "the first call must be the check's 6 rounds"
        return {n: list(variant) if (n == fast if fast is not None else n != base)
                else [1.0] * rounds for n in names}
    return alternate
