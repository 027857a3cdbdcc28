"""Token streams from local text: the byte path, the tokenizer path, windows."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8.tokens import batches, has_tokenizer, text_tokens, write_byte_tokenizer

# Multi-byte UTF-8, tabs, newlines and runs of spaces: what a byte-level tokenizer must
# keep one id per byte for.
TEXT = "def f(x):\n\treturn x  # héllo wörld ∑ 😀\r\n\n    pass\n"


def test_bytes_without_a_tokenizer(tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    assert text_tokens(tmp_path / "t.txt").tolist() == list(TEXT.encode())
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 256}))
    assert not has_tokenizer(tmp_path)
    assert text_tokens(tmp_path / "t.txt", tmp_path).tolist() == list(TEXT.encode())
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100}))
    with pytest.raises(ValueError, match=r"text_tokens\] .* no tokenizer .* 100 < 256"):
        text_tokens(tmp_path / "t.txt", tmp_path)
    with pytest.raises(ValueError, match=r"text_tokens\] text file .* does not exist"):
        text_tokens(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match=r"text_tokens\] text file .* is empty"):
        text_tokens(tmp_path / "empty.txt")


def test_byte_tokenizer_agrees_with_the_byte_path(tmp_path):
    pytest.importorskip("mlx_lm", reason="mlx-lm (and tokenizers) are part of the test extra")
    from mlx_lm.utils import load_tokenizer

    write_byte_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 256}))
    assert has_tokenizer(tmp_path)
    (tmp_path / "t.txt").write_text(TEXT)
    ids = text_tokens(tmp_path / "t.txt", tmp_path).tolist()
    assert ids == list(TEXT.encode())
    assert load_tokenizer(tmp_path).decode(ids) == TEXT


def test_batches_cut_windows():
    tokens = mx.arange(103)
    out = batches(tokens, 10, batch_size=4)
    assert [b.shape for b in out] == [(4, 10), (4, 10), (2, 10)]  # the 3-token tail dropped
    np.testing.assert_array_equal(np.concatenate([np.array(b) for b in out]).ravel(), np.arange(100))
    assert out[0].dtype == mx.int32
    assert [b.shape for b in batches(tokens, 10, 4, limit=5)] == [(4, 10), (1, 10)]
    with pytest.raises(ValueError, match=r"batches\] 103 tokens do not fill one window"):
        batches(tokens, 200)
    with pytest.raises(ValueError, match=r"batches\] seq_len must be >= 2"):
        batches(tokens, 1)
