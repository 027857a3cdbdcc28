"""Token streams from local text: calibration data for ``convert``, test data for ``eval``.

A model folder with a tokenizer (``tokenizer.json`` or ``tokenizer.model``) tokenizes
with it (through mlx-lm's loader); a folder without one, whose vocabulary has at least
256 entries, reads the text as UTF-8 bytes (token id = byte value), the convention of
byte-level models.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def has_tokenizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tokenizer mlx-lm can load."""
    return any((Path(folder) / name).exists() for name in TOKENIZER_FILES)


def _vocab_size(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return int(size) if size is not None else None


def text_tokens(text_file: str | Path, model_folder: str | Path | None = None) -> mx.array:
    """Token ids of a text file.

    Args:
        text_file: a UTF-8 text file.
        model_folder: the model's folder; its tokenizer is used when it has one.
            Without a tokenizer (or with ``None``), the UTF-8 bytes are the tokens.

    Returns:
        ``[T]`` int32 token ids.

    Raises:
        ValueError: when the file is missing or empty, or the folder has neither a
            tokenizer nor a vocabulary of at least 256 entries.
    """
    op = "mlx_w8a8.text_tokens"
    path = Path(text_file)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"[{op}] text file {path} does not exist") from None
    if not raw:
        raise ValueError(f"[{op}] text file {path} is empty")
    if model_folder is not None and has_tokenizer(model_folder):
        from mlx_lm.utils import load_tokenizer

        tokenizer = load_tokenizer(Path(model_folder))
        ids = tokenizer.encode(raw.decode("utf-8", errors="replace"), add_special_tokens=False)
        return mx.array(ids, dtype=mx.int32)
    if model_folder is not None:
        vocab = _vocab_size(Path(model_folder))
        if vocab is not None and vocab < 256:
            raise ValueError(
                f"[{op}] {model_folder} has no tokenizer ({' or '.join(TOKENIZER_FILES)}) "
                f"and a vocabulary of {vocab} < 256 entries, so bytes cannot be its tokens"
            )
    return mx.array(list(raw), dtype=mx.int32)


def batches(tokens: mx.array, seq_len: int, batch_size: int = 1, limit: int | None = None):
    """Cut a token stream into ``[batch_size, seq_len]`` windows (no overlap; the tail
    that does not fill a window is dropped).

    Args:
        tokens: ``[T]`` int token ids.
        seq_len: tokens per row, >= 2.
        batch_size: rows per batch.
        limit: at most this many rows in all (``None``: every full window).

    Returns:
        A list of ``[B, seq_len]`` int32 arrays (the last batch may have fewer rows).

    Raises:
        ValueError: when the stream is shorter than one window, or arguments are invalid.
    """
    op = "mlx_w8a8.batches"
    if seq_len < 2 or batch_size < 1:
        raise ValueError(
            f"[{op}] seq_len must be >= 2 and batch_size >= 1, got {seq_len} and {batch_size}"
        )
    rows = tokens.size // seq_len
    if limit is not None:
        rows = min(rows, limit)
    if rows < 1:
        raise ValueError(
            f"[{op}] {tokens.size} tokens do not fill one window of seq_len = {seq_len}"
        )
    data = tokens[: rows * seq_len].reshape(rows, seq_len).astype(mx.int32)
    return [data[i : i + batch_size] for i in range(0, rows, batch_size)]


def write_byte_tokenizer(folder: str | Path) -> None:
    """Write a byte-level tokenizer (token id = byte value, 256 tokens) to ``folder``.

    It tokenizes exactly as the byte path of :func:`text_tokens`, and lets
    ``mlx_lm.load`` (which needs a tokenizer) open a byte-level model folder. Needs the
    ``tokenizers`` package (installed with mlx-lm).

    Args:
        folder: an existing folder; ``tokenizer.json`` and ``tokenizer_config.json``
            are written there.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's printable stand-ins for the 256 byte values (what ByteLevel maps bytes to).
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    stand_in, extra = {}, 0
    for b in range(256):
        if b in keep:
            stand_in[b] = chr(b)
        else:
            stand_in[b] = chr(256 + extra)
            extra += 1
    vocab = {stand_in[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}) + "\n"
    )
