"""mlx_w8a8.token_reads: a response's log-probability reads give the row's own values and
do not wait for work queued on the generation stream; the patch of mlx-lm's batched step
is scoped and changes no response."""

import threading
import time
import types

import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8 import token_reads
from mlx_w8a8.token_reads import AsideRow, reads_aside


def evaluated_row(n: int = 300, seed: int = 0) -> mx.array:
    row = mx.array(np.random.default_rng(seed).standard_normal(n).astype(np.float32))
    mx.eval(row)
    return row


def test_reads_give_the_rows_values():
    row = evaluated_row()
    aside = AsideRow(row)
    expect = np.array(row)
    for i in (0, 7, 299):
        assert aside[i].item() == expect[i]
    assert aside[[3, 1, 4]].tolist() == expect[[3, 1, 4]].tolist()
    assert (-aside).tolist() == (-expect).tolist()
    assert len(aside) == 300 and aside.shape == (300,) and aside.dtype == mx.float32


def busy_stream_work() -> mx.array:
    """Matrix products launched (not waited for) on the default stream: about a second
    of work on a 2-core CPU."""
    a = mx.random.normal((700, 700), key=mx.random.key(1)) / 30
    mx.eval(a)
    b = a
    for _ in range(24):
        b = b @ a
    mx.async_eval(b)
    return b


def test_an_aside_read_does_not_wait_for_the_generation_streams_queue():
    """What the server's read of a token did: the element of an evaluated row, read on the
    stream where the next step was just launched, waits for that step; read aside it does
    not. (The plain read's wait is the reference: timed in the same process.)"""
    row = evaluated_row()
    b = busy_stream_work()
    start = time.perf_counter()
    row[5].item()  # the plain read: queued behind the products
    plain = time.perf_counter() - start
    mx.eval(b)
    b = busy_stream_work()
    start = time.perf_counter()
    value = AsideRow(row)[5].item()
    aside = time.perf_counter() - start
    mx.eval(b)
    assert value == np.array(row)[5]
    assert plain > 0.05, f"the products took {plain:.3f} s: too short to tell the reads apart"
    assert aside < plain / 4, (aside, plain)


class FakeBatch:
    """Stands in for ``mlx_lm.generate.GenerationBatch``: ``next`` returns responses
    carrying evaluated rows (and one without log-probabilities)."""

    def __init__(self):
        self.rows = [evaluated_row(seed=s) for s in range(3)]

    def next(self):
        out = [types.SimpleNamespace(uid=i, token=2 * i, logprobs=r)
               for i, r in enumerate(self.rows)]
        out.append(types.SimpleNamespace(uid=9, token=0, logprobs=None))
        return out


def test_the_patch_wraps_each_response_and_is_undone_on_exit():
    module = types.SimpleNamespace(GenerationBatch=FakeBatch)
    original = FakeBatch.next
    batch = FakeBatch()
    with reads_aside(module) as wrapped:
        assert wrapped is True
        responses = batch.next()
    assert FakeBatch.next is original
    assert [type(r.logprobs) for r in responses] == [AsideRow] * 3 + [type(None)]
    for r, row in zip(responses, batch.rows):
        assert r.logprobs.row is row  # the same evaluated array, not a copy
        assert r.logprobs[r.token].item() == np.array(row)[r.token]
    assert all(type(r.logprobs) is not AsideRow for r in batch.next())


def test_without_mlx_lms_batched_step_nothing_is_patched():
    module = types.SimpleNamespace()
    with reads_aside(module) as wrapped:
        assert wrapped is False


def test_one_stream_per_thread_and_device():
    """mlx-lm's server generates on a thread of its own, and an MLX stream made on another
    thread (the warm-up's model pass runs on the main one) cannot be used there."""
    assert token_reads.aside_stream() is token_reads.aside_stream()
    assert token_reads.aside_stream() != mx.default_stream(mx.default_device())
    row, seen = evaluated_row(), []

    def generation_thread():
        try:
            stream = token_reads.aside_stream()
            seen.append((stream is token_reads.aside_stream(), AsideRow(row)[4].item()))
        except Exception as error:  # noqa: BLE001 (reported by the assertion below)
            seen.append(error)

    token_reads.aside_stream()  # made on this thread first
    worker = threading.Thread(target=generation_thread)
    worker.start()
    worker.join()
    assert seen == [(True, np.array(row)[4])], seen


def test_mlx_lms_batched_responses_are_unchanged_by_the_patch():
    """mlx-lm's own BatchGenerator on a tiny model: the same tokens and log-probabilities
    with the reads aside as without."""
    pytest.importorskip("mlx_lm.generate", reason="mlx-lm is part of the test extra")
    import importlib

    import tiny_lm

    generate = importlib.import_module("mlx_lm.generate")
    model, _ = tiny_lm.model("llama", dtype=mx.float32)

    def run():
        gen = generate.BatchGenerator(model, max_tokens=4)
        gen.insert([[1, 2, 3, 4], [5, 6, 7]], [4, 4])
        seen = []
        while True:
            _, responses = gen.next()
            if not responses and not gen._generation_batch and not gen._prompt_batch \
                    and not gen._unprocessed_sequences:
                break
            seen += [(r.uid, r.token, r.logprobs[r.token].item(), type(r.logprobs))
                     for r in responses]
        gen.close()
        return seen

    plain = run()
    with reads_aside():  # mlx_lm.generate, found by name
        aside = run()
    assert len(plain) == 8
    assert [s[:3] for s in aside] == [s[:3] for s in plain]
    assert {s[3] for s in aside} == {AsideRow} and {s[3] for s in plain} == {mx.array}


def test_mlx_lm_servers_uses_of_a_response_row_work_on_an_aside_row():
    """What mlx_lm.server does with a response's ``logprobs``: the token's value
    (``.item()``) and, with ``top_logprobs``, ``_format_top_logprobs`` (a negation, an
    argpartition and a gather by a list): the same answers from an AsideRow."""
    import importlib

    pytest.importorskip("mlx_lm.server", reason="mlx-lm is part of the test extra")
    server = importlib.import_module("mlx_lm.server")
    row = evaluated_row()
    tokenizer = types.SimpleNamespace(convert_ids_to_tokens=lambda ids: [f"t{i}" for i in ids])
    aside = AsideRow(row)
    assert aside[17].item() == row[17].item()
    assert server._format_top_logprobs(aside, 4, tokenizer) == \
        server._format_top_logprobs(row, 4, tokenizer)
    assert len(server._format_top_logprobs(aside, 4, tokenizer)) == 4


def test_without_a_stream_for_the_reads_responses_are_left_as_they_are(monkeypatch):
    """A device where no second stream can be made: the server goes on, reading as mlx-lm
    does, and says so once."""
    def no_stream(device):
        raise RuntimeError("no stream here")

    monkeypatch.setattr(token_reads, "_local", threading.local())  # nothing made yet
    monkeypatch.setattr(mx, "new_stream", no_stream)
    module = types.SimpleNamespace(GenerationBatch=FakeBatch)
    batch = FakeBatch()
    with reads_aside(module), pytest.warns(RuntimeWarning, match="no stream for the reads") \
            as caught:
        first, second = batch.next(), batch.next()
    assert len(caught) == 1
    assert [type(r.logprobs) for r in first + second] == [mx.array] * 3 + [type(None)] + \
        [mx.array] * 3 + [type(None)]
