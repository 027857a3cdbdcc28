"""The tokenizer stored in a GGUF file's metadata, rebuilt with the ``tokenizers`` package.

- ``tokenizer.ggml.model == "gpt2"`` (SmolLM2 and other byte-level BPE models): the
  vocabulary and merges as stored, byte-level pre-tokenization (digits split one by one,
  as SmolLM2's own tokenizer does).
- ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE, e.g. Gemma): merges derived
  from the pieces' scores (a pair merges with the rank of the piece it makes, as the
  Hugging Face converter of SentencePiece models does), ``" "`` replaced by ``"▁"``, byte
  fallback through the ``<0xNN>`` pieces.

Control tokens (GGUF token type 3) become special added tokens, user-defined ones
(type 4) plain added tokens, so each is matched whole.
"""

from __future__ import annotations

import json
from pathlib import Path


def field(reader, key: str, default=None):
    """The value of a GGUF metadata field (``default`` when absent)."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()

_NORMAL, _CONTROL, _USER, _BYTE = 1, 3, 4, 6


def _strings(reader, key: str) -> list[str]:
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]


def _values(reader, key: str) -> list:
    f = reader.fields.get(key)
    return [] if f is None else [f.parts[i][0].item() for i in f.data]


def _spm_merges(tokens: list[str], types: list[int]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece BPE vocabulary: every split ``(a, b)`` of a normal piece
    into two pieces of the vocabulary, ranked by the merged piece's id (SentencePiece
    BPE ids follow the merge order), then by the parts' ids."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (_NORMAL, _USER, _BYTE)}
    found = []
    for piece, pid in ids.items():
        if types[pid] != _NORMAL:
            continue
        for cut in range(1, len(piece)):
            a, b = piece[:cut], piece[cut:]
            ia, ib = ids.get(a), ids.get(b)
            if ia is not None and ib is not None:
                found.append((pid, ia, ib, a, b))
    found.sort()
    return [(a, b) for _, _, _, a, b in found]


def build(reader):
    """A ``tokenizers.Tokenizer`` from a GGUF reader's metadata, and the special tokens
    ``{"bos_token": ..., "eos_token": ..., "bos_token_id": ..., ...}``.

    Raises:
        ValueError: for a tokenizer model other than ``gpt2`` and ``llama``.
    """
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors)

    kind = field(reader, "tokenizer.ggml.model")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    types = _values(reader, "tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        unk = field(reader, "tokenizer.ggml.unknown_token_id")
        tok = Tokenizer(models.BPE(
            vocab=vocab, merges=_spm_merges(tokens, types), byte_fallback=True, fuse_unk=True,
            unk_token=tokens[unk] if unk is not None else None,
        ))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        if field(reader, "tokenizer.ggml.add_space_prefix", False):
            tok.normalizer = normalizers.Sequence(
                [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
        bos = field(reader, "tokenizer.ggml.bos_token_id")
        if field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
            # Gemma needs its BOS: without it generation degenerates into repetition.
            tok.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                special_tokens=[(tokens[bos], int(bos))])
    else:
        raise ValueError(
            f"[mlx_w8a8.gguf] supported tokenizer models are 'gpt2' and 'llama', got {kind!r}"
        )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL])
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER])
    special = {}
    for name in ("bos", "eos", "unknown", "padding"):
        i = field(reader, f"tokenizer.ggml.{name}_token_id")
        if i is not None:
            key = {"unknown": "unk", "padding": "pad"}.get(name, name)
            special[f"{key}_token"], special[f"{key}_token_id"] = tokens[int(i)], int(i)
    return tok, special


def write_tokenizer(reader, folder: str | Path) -> dict:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (chat template included
    when the file has one) to ``folder``.

    Returns:
        The special tokens (see :func:`build`).
    """

    tok, special = build(reader)
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
           **{k: v for k, v in special.items() if not k.endswith("_id")}}
    template = field(reader, "tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return special
