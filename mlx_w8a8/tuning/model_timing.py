"""Timing a whole model: prefill, decode and paired alternating rounds.

The primitives the model checks of the tuner (:mod:`.decode_check`,
:mod:`.prefill_check`, :mod:`.sibling_check`) and the model benchmark
(``python -m mlx_w8a8.bench --model``, :mod:`mlx_w8a8.modelbench`, which re-exports
them) time with, so both measure the same loops:

- :func:`prefill`: one forward into a fresh KV cache, wall time around ``mx.eval``;
- :func:`decode`: decode steps of mlx-lm's ``generate_step`` (or its replica
  :func:`generate_steps` where ``mlx_lm.generate`` does not import);
- :func:`batch_decode`: decode steps of B sequences at once, as mlx-lm's server runs
  them (its ``BatchGenerator``, or the replica :func:`batch_generate_steps`);
- :func:`alternate`: rounds over several variants, the order reversed every other
  round, so drift (clocks, caches, thermal) falls on every variant alike.

mlx-lm is imported only inside the functions that need it.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn

from .. import models

# Untimed calls per variant before the rounds: an mlx_w8a8 layer settles at an input
# shape on its third call there (plans.PlanCache.keep: the first call's plan launches
# directly and is dropped; the second call's plan is kept and launches directly, as
# plans.Stages does on a plan's first call; the third traces the compiled call the plan
# keeps, output-only for a layer whose offer nobody took).
WARMUP = 3


def vocab_size(model: nn.Module, op: str) -> int:
    """Rows of the model's token embedding (``nn.Embedding`` or ``nn.QuantizedEmbedding``,
    the first in module order): the range of the random token ids a timed prompt draws.

    Args:
        model: the model.
        op: the public name of the caller, for the error.

    Raises:
        ValueError: naming ``op``, when the model has no token embedding.
    """
    for _, m in model.named_modules():
        if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding)):
            return int(m.weight.shape[0])
    raise ValueError(f"[{op}] the model has no token embedding to feed a prompt through")


def prompt_tokens(vocab: int, length: int, rows: int = 1) -> mx.array:
    """The timed prompts of the model checks: ``[rows, length]`` uint32 token ids below
    ``min(vocab, 256)``, a fixed pattern (every check and its probes time the same
    tokens), each row shifted so a batch's prompts are distinct."""
    top = min(vocab, 256)
    return mx.array([[(7 * i + 3 + 11 * r) % top for i in range(length)] for r in range(rows)],
                    dtype=mx.uint32)


def prefill(model: nn.Module, tokens: mx.array) -> tuple[float, mx.array]:
    """One forward of ``tokens`` ``[1, T]`` into a fresh KV cache; ``(seconds, logits)``."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    start = time.perf_counter()
    logits = model(tokens, cache=cache)
    mx.eval(logits)
    return time.perf_counter() - start, logits


def generate_steps(prompt: mx.array, model: nn.Module, max_tokens: int):
    """``mlx_lm.generate.generate_step``'s loop for greedy sampling without logits
    processors or KV quantization, for where ``mlx_lm.generate`` cannot be imported
    (it needs ``transformers``): the prompt but its last token in chunks of 2048 into
    the cache, then one step per token, each next step launched with ``async_eval``
    before the current token is read. Yields ``(token, logprobs)``."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    stream = mx.new_stream(mx.default_device())

    def step(y):
        with mx.stream(stream):
            logits = model(y[None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            return mx.argmax(logprobs, axis=-1), logprobs.squeeze(0)

    with mx.stream(stream):
        while prompt.size > 1:
            n = min(2048, prompt.size - 1)
            model(prompt[:n][None], cache=cache)
            mx.eval([c.state for c in cache])
            prompt = prompt[n:]
            mx.clear_cache()
        y, logprobs = step(prompt)
    mx.async_eval(y, logprobs)
    n = 0
    while True:
        if n != max_tokens:
            next_y, next_logprobs = step(y)
            mx.async_eval(next_y, next_logprobs)
        if n == 0:
            mx.eval(y)
        if n == max_tokens:
            break
        yield y.item(), logprobs
        if n % 256 == 0:
            mx.clear_cache()
        y, logprobs = next_y, next_logprobs
        n += 1


def decode_loop():
    """``(name, generate_step)``: mlx-lm's own loop where it imports, else the replica."""
    if models.mlx_lm_mode() == "full":
        try:
            from mlx_lm.generate import generate_step

            return "mlx_lm.generate.generate_step", generate_step
        except ImportError:
            pass
    # The name the benchmark's records give the replica: mlx_w8a8.modelbench re-exports it.
    return "mlx_w8a8.modelbench.generate_steps", generate_steps


def decode(model: nn.Module, prompt: mx.array, steps: int, loop=None) -> float:
    """Seconds of ``steps`` decode steps after ``prompt`` (timed from the first
    generated token to the ``steps``-th next one), run by ``loop`` (default:
    :func:`decode_loop`)."""
    loop = loop or decode_loop()[1]
    return _time_steps(loop(prompt, model, max_tokens=steps + 1), steps, "decode loop")


def _time_steps(gen, steps: int, what: str) -> float:
    """Seconds from ``gen``'s first item to its ``steps``-th next one; ``gen`` is closed
    and the device synchronized however it ends."""
    start = None
    try:
        for i, _ in enumerate(gen):
            if i == 0:
                start = time.perf_counter()
            elif i == steps:
                return time.perf_counter() - start
    finally:
        gen.close()
        mx.synchronize()
    raise RuntimeError(f"[mlx_w8a8.bench] the {what} stopped before {steps} steps")


def batch_generator_steps(prompts: mx.array, model: nn.Module, max_tokens: int):
    """Greedy decoding of the ``B`` prompts ``prompts`` ``[B, P]`` together by
    ``mlx_lm.generate.BatchGenerator``, the continuous batching of mlx-lm's server: every
    prompt's cache is made by ``make_prompt_cache`` and merged into a ``BatchKVCache``,
    the prompts are prefilled as one batch, then each step decodes one token of every
    sequence in one forward of ``[B, 1]``. The prefill and completion batch sizes are
    ``B``, so all ``B`` sequences decode from the first step on. Yields the ``B``
    tokens of each step (a list, in prompt order); no stop tokens."""
    from mlx_lm.generate import BatchGenerator

    b = int(prompts.shape[0])
    gen = BatchGenerator(model, max_tokens=max_tokens, completion_batch_size=b,
                         prefill_batch_size=b)
    try:
        uids = gen.insert(prompts.tolist(), [max_tokens] * b)
        order = {uid: i for i, uid in enumerate(uids)}
        while True:
            responses = gen.next_generated()
            if not responses:
                return
            tokens = [0] * b
            for r in responses:
                tokens[order[r.uid]] = r.token
            yield tokens
            if any(r.finish_reason is not None for r in responses):
                return
    finally:
        mx.synchronize(gen.stream)  # the step launched ahead ends before the next timing
        gen.close()


def batch_generate_steps(prompts: mx.array, model: nn.Module, max_tokens: int):
    """:func:`batch_generator_steps` where ``mlx_lm.generate`` cannot be imported: the
    ``B`` prompts ``[B, P]`` (equal lengths, so no padding or mask) prefilled as one
    batch into one KV cache per layer, but their last tokens, in chunks of 2048; then
    one ``[B, 1]`` forward per step, greedy, each next step launched with
    ``async_eval`` before the current tokens are read (as ``GenerationBatch._step``
    does). Yields the ``B`` tokens of each step (a list)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    stream = mx.new_stream(mx.default_device())

    def step(y):
        with mx.stream(stream):
            logits = model(y[:, None], cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            return mx.argmax(logprobs, axis=-1)

    with mx.stream(stream):
        rest = prompts
        while rest.shape[1] > 1:
            n = min(2048, rest.shape[1] - 1)
            model(rest[:, :n], cache=cache)
            mx.eval([c.state for c in cache])
            rest = rest[:, n:]
            mx.clear_cache()
        y = step(rest[:, 0])
    mx.async_eval(y)
    try:
        for n in range(max_tokens):
            if n + 1 < max_tokens:
                next_y = step(y)
                mx.async_eval(next_y)
            yield y.tolist()
            if n % 256 == 0:
                mx.clear_cache()
            if n + 1 < max_tokens:
                y = next_y
    finally:
        mx.synchronize(stream)  # the step launched ahead ends before the next timing


def batch_decode_loop():
    """``(name, steps)``: mlx-lm's ``BatchGenerator`` where ``mlx_lm.generate`` imports,
    else the replica :func:`batch_generate_steps`."""
    if models.mlx_lm_mode() == "full":
        try:
            from mlx_lm.generate import BatchGenerator  # noqa: F401

            return "mlx_lm.generate.BatchGenerator", batch_generator_steps
        except ImportError:
            pass
    # The name the benchmark's records give the replica: mlx_w8a8.modelbench re-exports it.
    return "mlx_w8a8.modelbench.batch_generate_steps", batch_generate_steps


def batch_decode(model: nn.Module, prompts: mx.array, steps: int, loop=None) -> float:
    """Seconds of ``steps`` batched decode steps of the ``B`` sequences ``prompts``
    ``[B, P]`` (timed from the first generated tokens to the ``steps``-th next ones,
    every step decoding one token of each sequence), run by ``loop`` (default:
    :func:`batch_decode_loop`). Per step: seconds / ``steps``; tokens/s:
    ``B * steps`` / seconds."""
    loop = loop or batch_decode_loop()[1]
    # one step more than timed: the step that finishes the sequences (mlx-lm extracts
    # their caches there) stays out of the timed ones
    return _time_steps(loop(prompts, model, max_tokens=steps + 2), steps, "batched decode loop")


def alternate(names, rounds: int, measure, on_round=None) -> dict[str, list[float]]:
    """Run ``measure(name) -> seconds`` for every name, ``rounds`` times, the order
    reversed every other round; ``{name: [seconds per round]}``."""
    times = {n: [] for n in names}
    for r in range(rounds):
        order = list(names) if r % 2 == 0 else list(names)[::-1]
        for n in order:
            times[n].append(measure(n))
        if on_round is not None:
            on_round(r, order, {n: times[n][-1] for n in names})
    return times
