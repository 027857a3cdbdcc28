"""A GGUF file (llama.cpp's format) to an mlx-lm model folder.

Supported architectures: ``llama`` (mlx-lm ``llama``) and ``gemma3`` (mlx-lm
``gemma3_text``). Every tensor is dequantized with the ``gguf`` package's numpy
dequantizer (all of llama.cpp's block formats: Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K/...), so
the folder holds the GGUF weights "in float": the reference a W8A8 model is measured
against.

Two storage conventions of llama.cpp's converter are undone here:

- llama ``attn_q`` / ``attn_k`` rows are permuted for llama.cpp's RoPE (pairs
  interleaved within each head); mlx-lm's Llama expects the Hugging Face order.
- Gemma norms are stored as ``1 + w``; mlx-lm's Gemma RMSNorm adds the 1 itself.

Needs the ``gguf`` package (``pip install 'mlx-w8a8[models]'``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .gguf_tokenizer import field, write_tokenizer

ARCHITECTURES = ("llama", "gemma3")
# dtype the folder is written in: float16 keeps more mantissa than bfloat16 where the
# activations fit float16's range; Gemma-3's residual stream (~1e5) does not.
DTYPES = {"llama": "float16", "gemma3": "bfloat16"}

# GGUF tensor names (per block) -> mlx-lm module paths: the projections both
# architectures share, then each one's norms.
_PROJECTIONS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = {
    "llama": {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        **_PROJECTIONS,
    },
    "gemma3": {
        "attn_norm": "input_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        **_PROJECTIONS,
    },
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped, nothing read yet)."""
    try:
        import gguf
    except ImportError:
        raise ValueError(
            "[mlx_w8a8.gguf] reading GGUF files needs the gguf package: "
            "pip install 'mlx-w8a8[models]' (or pip install gguf)"
        ) from None
    return gguf.GGUFReader(str(path))


def architecture(reader) -> str:
    """``general.architecture``, one of :data:`ARCHITECTURES`.

    Raises:
        ValueError: for any other architecture.
    """
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"[mlx_w8a8.gguf] supported architectures are {ARCHITECTURES}, got {arch!r}"
        )
    return arch


def dequantize(tensor) -> np.ndarray:
    """A GGUF tensor as float32 numpy, shaped ``[rows, cols]`` (PyTorch order: GGUF's
    ``ne`` reversed)."""
    from gguf import quants

    data = quants.dequantize(tensor.data, tensor.tensor_type)
    return np.asarray(data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE permutation of llama ``attn_q`` / ``attn_k`` rows.

    llama.cpp writes ``w.reshape(n_head, 2, d / 2, K).swapaxes(1, 2)`` (``d`` = rows per
    head); this is its inverse.

    Args:
        w: ``[n_head * d, K]`` rows as stored in the GGUF file.
        n_head: query heads for ``attn_q``, KV heads for ``attn_k``.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config(reader, layers: int | None = None) -> dict:
    """The mlx-lm ``config.json`` of a GGUF file.

    Args:
        reader: a :func:`open_gguf` reader.
        layers: keep only the first ``layers`` blocks (a truncated model, for tests);
            ``None``: all.
    """
    arch = architecture(reader)

    def get(key, default=None):
        return field(reader, f"{arch}.{key}", default)

    blocks = int(get("block_count"))
    n = blocks if layers is None else min(int(layers), blocks)
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    heads = int(get("attention.head_count"))
    cfg = {
        "hidden_size": int(get("embedding_length")),
        "num_hidden_layers": n,
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "vocab_size": int(vocab),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length")),
    }
    names = {t.name for t in reader.tensors}
    if arch == "llama":
        cfg.update(model_type="llama", architectures=["LlamaForCausalLM"],
                   head_dim=int(get("rope.dimension_count", cfg["hidden_size"] // heads)),
                   tie_word_embeddings="output.weight" not in names, rope_traditional=False)
    else:
        # Gemma-3 text models: local (sliding) layers use RoPE base 10000 and every
        # sixth layer is global; the GGUF metadata does not carry these two.
        cfg.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
                   head_dim=int(get("attention.key_length")),
                   query_pre_attn_scalar=int(get("attention.key_length")),
                   sliding_window=int(get("attention.sliding_window")),
                   sliding_window_pattern=6, rope_local_base_freq=10000.0)
    cfg["torch_dtype"] = DTYPES[arch]
    return cfg


def mlx_name(arch: str, gguf_name: str) -> str | None:
    """The mlx-lm parameter name of a GGUF tensor name (``None``: not a model weight)."""
    stem, _, leaf = gguf_name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK[arch]:
        return f"model.layers.{parts[1]}.{_BLOCK[arch][parts[2]]}.{leaf}"
    return None


def weights(reader, layers: int | None = None) -> dict[str, np.ndarray]:
    """``{mlx-lm name: float32 array}`` of a GGUF file, conventions undone.

    Args:
        reader: a :func:`open_gguf` reader.
        layers: keep only the first ``layers`` blocks.

    Raises:
        ValueError: for a tensor this module cannot name (an unknown layout).
    """
    arch = architecture(reader)
    cfg = config(reader, layers)
    out = {}
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= cfg["num_hidden_layers"]:
            continue
        name = mlx_name(arch, t.name)
        if name is None:
            if t.name.startswith("rope_freqs"):
                continue  # precomputed RoPE frequencies: mlx-lm computes its own
            raise ValueError(f"[mlx_w8a8.gguf] unknown {arch} tensor {t.name!r}")
        w = dequantize(t)
        if arch == "llama" and t.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, cfg["num_attention_heads"])
        elif arch == "llama" and t.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, cfg["num_key_value_heads"])
        elif arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1.0
        out[name] = w
    return out


def write_folder(gguf_path: str | Path, out: str | Path, layers: int | None = None) -> Path:
    """Write an mlx-lm folder (``config.json``, ``model.safetensors`` in the dtype of
    :data:`DTYPES`, tokenizer files) from a GGUF file.

    Args:
        gguf_path: the GGUF file.
        out: the output folder (created).
        layers: keep only the first ``layers`` blocks.

    Returns:
        The folder.
    """
    import mlx.core as mx


    reader = open_gguf(gguf_path)
    cfg = config(reader, layers)
    dtype = getattr(mx, DTYPES[architecture(reader)])
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {k: mx.array(v).astype(dtype) for k, v in weights(reader, layers).items()}
    mx.save_safetensors(str(folder / "model.safetensors"), arrays, metadata={"format": "mlx"})
    special = write_tokenizer(reader, folder)
    cfg.update({k: v for k, v in special.items() if k.endswith("_token_id")})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return folder
