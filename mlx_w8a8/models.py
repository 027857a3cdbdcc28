"""mlx-lm models by name, folder or config: the architecture, with random weights when
there are none, for tuning and benchmarking (``tune --model``, ``bench --model``).

A model is named by

- a preset: ``llama-3-8b``, ``mistral-7b`` (v0.3), ``qwen2.5-7b`` or ``llama-3.2-1b``, whose configs are the
  published ``config.json`` of those models (:data:`PRESETS`);
- an mlx-lm model folder (``config.json`` plus, optionally, ``model*.safetensors``,
  whose weights are then used);
- a ``config.json`` file (the architecture alone: random weights).

Building needs mlx-lm (``pip install 'mlx-w8a8[lm]'``); the architecture comes from
``mlx_lm.models.<model_type>``, exactly as ``mlx_lm.load`` builds it. Random weights are
mlx-lm's own initialisation, seeded, and stay lazy until evaluated: building an
8B-shaped model to read its layer shapes allocates nothing.

mlx-lm's model files need only MLX, but its package imports ``transformers`` and
``huggingface_hub`` (for tokenizers and downloads). Where those are missing, the model
files are imported on their own (:func:`mlx_lm_mode` says ``"models-only"``): random
weights and config files work, loading a checkpoint's weights does not.
"""

from __future__ import annotations

import copy
import glob
import importlib
import importlib.util
import json
import os
import sys
import types
import warnings
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

# The published config.json of each preset (Hugging Face: meta-llama/Meta-Llama-3-8B,
# mistralai/Mistral-7B-v0.3, Qwen/Qwen2.5-7B, meta-llama/Llama-3.2-1B,
# microsoft/Phi-3-mini-4k-instruct), fields mlx-lm reads.
PRESETS: dict[str, dict] = {
    "llama-3.2-1b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "llama-3-8b": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 32768,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    # fused projections: qkv_proj [3 x 3072, 3072] and gate_up_proj [2 x 8192, 3072]
    "phi-3-mini": {
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32064,
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "sliding_window": 2047,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}

OP = "mlx_w8a8.models"


# model_type -> module, for the models-only mode (mlx_lm.utils.MODEL_REMAPPING's entries
# for the presets' families)
_REMAP = {"mistral": "llama"}
_mode: str | None = None


def mlx_lm_mode() -> str:
    """``"full"`` when the ``mlx_lm`` package imports, ``"models-only"`` when only its
    model files can be used (its package needs ``transformers``/``huggingface_hub``).

    Raises:
        ValueError: when mlx-lm is not installed.
    """
    global _mode
    if _mode is not None:
        return _mode
    try:
        import mlx_lm  # noqa: F401

        _mode = "full"
    except ImportError as error:
        spec = importlib.util.find_spec("mlx_lm")
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                f"[{OP}] building a model needs mlx-lm (pip install 'mlx-w8a8[lm]')"
            ) from None
        # the package's __init__ failed (a tokenizer/download dependency); its model
        # files import nothing beyond MLX: make them importable without it
        stub = types.ModuleType("mlx_lm")
        stub.__path__ = list(spec.submodule_search_locations)
        stub.__spec__ = spec
        sys.modules["mlx_lm"] = stub
        warnings.warn(
            f"[{OP}] the mlx_lm package does not import here ({error}); using its model "
            f"files alone (random weights only)", stacklevel=2,
        )
        _mode = "models-only"
    return _mode


def _classes(config: dict):
    if mlx_lm_mode() == "full":
        from mlx_lm.utils import _get_classes

        return _get_classes(config)
    model_type = _REMAP.get(config["model_type"], config["model_type"])
    try:
        arch = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError:
        raise ValueError(f"Model type {model_type} not supported.") from None
    return arch.Model, arch.ModelArgs


def resolve(spec: str | os.PathLike | dict) -> tuple[dict, Path | None, str]:
    """The config of a model named by ``spec``.

    Args:
        spec: a preset name, an mlx-lm model folder, a ``config.json`` path, or a
            config dict.

    Returns:
        ``(config, folder, label)``: a copy of the config; the model folder whose
        weights to load (``None`` for presets, dicts and ``config.json`` files); a short
        name for reports.

    Raises:
        ValueError: for an unknown name, a missing or unreadable config, or a config
            without ``model_type``.
    """
    if isinstance(spec, dict):
        config, folder, label = copy.deepcopy(spec), None, str(spec.get("model_type", "model"))
    elif str(spec) in PRESETS:
        config, folder, label = copy.deepcopy(PRESETS[str(spec)]), None, str(spec)
    else:
        path = Path(spec)
        if path.is_dir():
            folder, file = path, path / "config.json"
        elif path.is_file():
            folder, file = None, path
        else:
            raise ValueError(
                f"[{OP}] model must be a preset {sorted(PRESETS)}, an mlx-lm model folder "
                f"or a config.json, got {str(spec)!r} (no such file or folder)"
            )
        try:
            config = json.loads(file.read_text())
        except FileNotFoundError:
            raise ValueError(f"[{OP}] no config.json in {path}") from None
        except (OSError, ValueError) as error:
            raise ValueError(f"[{OP}] cannot read {file}: {error}") from None
        label = path.name if folder is not None else (path.parent.name or path.name)
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"[{OP}] the config of {label!r} has no 'model_type'")
    return config, folder, label


def truncate(config: dict, layers: int | None) -> dict:
    """``config`` with ``num_hidden_layers`` (and per-layer lists) cut to ``layers``.

    Raises:
        ValueError: if ``layers`` is not a positive int.
    """
    if layers is None:
        return config
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ValueError(f"[{OP}] layers must be a positive int, got {layers!r}")
    out = dict(config)
    out["num_hidden_layers"] = min(layers, int(config.get("num_hidden_layers", layers)))
    for key in ("layer_types",):
        if isinstance(out.get(key), list):
            out[key] = out[key][: out["num_hidden_layers"]]
    return out


def has_weights(folder: Path | None) -> bool:
    """Whether ``folder`` holds ``model*.safetensors`` files."""
    return folder is not None and bool(glob.glob(str(folder / "model*.safetensors")))


def instantiate(config: dict) -> nn.Module:
    """A fresh mlx-lm model of ``config`` with mlx-lm's random initial weights (lazy)."""
    try:
        model_class, args_class = _classes(config)
    except ValueError as error:
        raise ValueError(f"[{OP}] {error} (model_type {config.get('model_type')!r})") from None
    return model_class(args_class.from_dict(config))


def parameter_bytes(config: dict, dtype: mx.Dtype) -> int:
    """Bytes of the parameters of a model of ``config`` held in ``dtype`` (the model is
    instantiated lazily: its shapes are counted, nothing is allocated)."""
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(instantiate(config).parameters())) * dtype.size


def build(
    spec: str | os.PathLike | dict,
    layers: int | None = None,
    dtype: mx.Dtype | None = mx.bfloat16,
    seed: int = 0,
) -> tuple[nn.Module, dict, str]:
    """Build the model named by ``spec`` with mlx-lm's architecture.

    Weights come from the folder's ``model*.safetensors`` when there are any (loaded
    lazily by ``mlx_lm.utils.load_model``), else they are mlx-lm's random
    initialisation seeded with ``seed``.

    Args:
        spec: a preset, a folder, a ``config.json`` or a config dict (:func:`resolve`).
        layers: keep the first ``layers`` transformer blocks (``num_hidden_layers``).
        dtype: floating parameters are cast to it (``None`` keeps them).
        seed: seed of the random weights.

    Returns:
        ``(model, config, label)``; parameters are not evaluated.
    """
    config, folder, label = resolve(spec)
    config = truncate(config, layers)
    if has_weights(folder):
        if mlx_lm_mode() != "full":
            raise ValueError(
                f"[{OP}] loading the weights in {folder} needs the full mlx-lm package "
                f"(its import failed here); pass its config.json for random weights"
            )
        from mlx_lm.utils import load_model

        model, loaded = load_model(
            folder, lazy=True, strict=layers is None,
            model_config={"num_hidden_layers": config["num_hidden_layers"]} if layers else None,
        )
        config = dict(loaded, num_hidden_layers=config["num_hidden_layers"])
    else:
        mx.random.seed(seed)
        model = instantiate(config)
    if dtype is not None:
        model.set_dtype(dtype)
    return model, config, label


def clone(model: nn.Module, config: dict) -> nn.Module:
    """A second instance of ``model``'s architecture holding the same parameter arrays
    (shared, not copied: MLX arrays are immutable, so converting one instance's layers
    leaves the other untouched)."""
    other = instantiate(config)
    other.update(model.parameters())
    return other


def is_quantized(config: dict) -> bool:
    """Whether ``config`` describes an already quantized checkpoint."""
    return bool(config.get("quantization") or config.get("quantization_config"))
