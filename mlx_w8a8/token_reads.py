"""The server's per-token log-probability reads, moved off the generation stream.

``mlx_lm.server`` reads each generated token's log-probability as soon as
``BatchGenerator.next()`` returns it (``r.logprobs[r.token].item()``). By then ``next()``
has already launched the following step (``mx.async_eval``), so that read, a new array on
the generation stream, waits for the whole following step on the GPU; the host builds
the step after only once it is done. Host and GPU then take turns instead of
overlapping, and a model whose forward takes longer to build (a W8A8 model launches a
quantize beside each of its GEMVs) loses most: ``bench/serve_replay.py`` measures it.

:func:`reads_aside` wraps ``mlx_lm.generate.GenerationBatch.next`` so that each
response's ``logprobs`` (already evaluated by ``next()``) is an :class:`AsideRow`, whose
indexing and negation run on a stream of their own on the same device: the read waits
for nothing but itself. The values read are the same arrays' elements, so responses are
unchanged.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from contextlib import contextmanager

import mlx.core as mx

# MLX's streams belong to the thread that made them (another thread's use raises "There
# is no Stream(...) in current thread"), and mlx-lm's server generates on a thread of its
# own: one aside stream per thread and device.
_local = threading.local()


def aside_stream(device: mx.Device | None = None) -> mx.Stream:
    """The stream the reads run on: one per thread and device, made on first use."""
    device = device or mx.default_device()
    streams = _local.__dict__.setdefault("streams", {})
    key = str(device)
    stream = streams.get(key)
    if stream is None:
        stream = streams[key] = mx.new_stream(device)
    return stream


class AsideRow:
    """An evaluated row of log-probabilities ``[vocab]`` whose reads run on
    :func:`aside_stream`: ``row[i]`` (an int, or a list of ints) and ``-row``, the
    operations ``mlx_lm.server`` applies to a response's ``logprobs``.

    Args:
        row: the response's ``logprobs``, evaluated.
        stream: where the reads run (default: :func:`aside_stream` of the default
            device); a stream of the thread that reads.
    """

    __slots__ = ("row", "stream")

    def __init__(self, row: mx.array, stream: mx.Stream | None = None):
        self.row = row
        self.stream = stream or aside_stream()

    def __getitem__(self, index):
        with mx.stream(self.stream):
            return self.row[index]

    def __neg__(self):
        with mx.stream(self.stream):
            return -self.row

    def __len__(self) -> int:
        return len(self.row)

    def __getattr__(self, name):  # shape, dtype, tolist(), ... as the row has them
        return getattr(self.row, name)


@contextmanager
def reads_aside(generate_module=None):
    """Within the block, every response of ``GenerationBatch.next`` (mlx-lm's batched
    decode step) carries its ``logprobs`` as an :class:`AsideRow`; restored on exit.

    Args:
        generate_module: ``mlx_lm.generate`` (default: imported here).

    Yields:
        ``True`` when the method was wrapped, ``False`` when the module has no
        ``GenerationBatch.next`` (another mlx-lm: nothing is changed). Where no stream
        can be made for the reads, responses are left as they are, with one
        ``RuntimeWarning``.
    """
    if generate_module is None:
        # by name: the package's attribute ``generate`` is its function, not the module
        generate_module = importlib.import_module("mlx_lm.generate")
    batch = getattr(generate_module, "GenerationBatch", None)
    original = getattr(batch, "next", None)
    if original is None:
        yield False
        return

    def next_aside(self, *args, **kwargs):
        responses = original(self, *args, **kwargs)
        try:
            stream = aside_stream()
        except Exception as error:  # noqa: BLE001 (no second stream: read as mlx-lm does)
            if not failed:
                failed.append(error)
                warnings.warn(f"[mlx_w8a8.token_reads] no stream for the reads aside "
                              f"({error}); each token is read on the generation stream, "
                              f"as mlx-lm reads it", RuntimeWarning, stacklevel=2)
            return responses
        for response in responses:
            logprobs = getattr(response, "logprobs", None)
            if isinstance(logprobs, mx.array):
                response.logprobs = AsideRow(logprobs, stream)
        return responses

    failed: list[Exception] = []  # warned once
    batch.next = next_aside
    try:
        yield True
    finally:
        batch.next = original


__all__ = ["AsideRow", "aside_stream", "reads_aside"]
