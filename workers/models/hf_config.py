"""Map a Hugging Face ``config.json`` onto etrain's :class:`ModelConfig`, without torch.

The service calls this at submit (to refuse what etrain cannot train and to plan
with the real shape) and the workers call it when they build the model, so it
must stay torch-free. Only architectures whose forward etrain's own decoder
reproduces exactly are accepted; anything else is a ``ValueError`` that names
``model.hf`` and lists what is supported.

Choices worth knowing:

* Tied embeddings (``tie_word_embeddings: true``) load untied: ``output`` starts
  as a copy of the embedding. The first forward is identical, every strategy
  (PP puts the embedding and the head on different stages, TP shards them
  differently) works unchanged, and export writes ``lm_head`` with
  ``tie_word_embeddings: false``.
* Sliding-window attention (Mistral, Qwen2 with ``use_sliding_window``) equals
  full causal attention on sequences no longer than the window, so
  ``max_seq_len`` is clamped to the window instead of refusing the model.
"""

from __future__ import annotations

import json
import math
from typing import Any

from workers.models.config import ModelConfig, RopeScaling

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# Architectures whose q/k/v projections always carry a bias.
_QKV_BIAS = {"Qwen2ForCausalLM"}
MAX_CONFIG_BYTES = 1 << 20
# The range each number read from config.json must lie in: generous (the largest
# published models, ~1T parameters, use at most a few hundred layers, a hidden size of
# 16k-32k, a 256k vocabulary and a 10M context), and bounded, so that neither the planner
# nor the workers can be made to loop or allocate without end by a config.json.
RANGES: dict[str, tuple[int | float, int | float]] = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 65_536),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "intermediate_size": (1, 262_144),
    "vocab_size": (1, 4_194_304),
    "max_position_embeddings": (1, 16_777_216),
    "sliding_window": (1, 16_777_216),
    "original_max_position_embeddings": (1, 16_777_216),
    "rope_theta": (0, 1e12),  # exclusive of 0
    "factor": (1, 1024),
    "low_freq_factor": (0, 1024),  # exclusive of 0
    "high_freq_factor": (0, 1024),  # exclusive of 0
}


def _supported() -> str:
    return "supported: " + ", ".join(SUPPORTED_ARCHITECTURES)


def read_hf_config_text(text: str | bytes, *, where: str = "model.hf") -> dict[str, Any]:
    """Parse a ``config.json`` (at most 1 MiB) into a dict; ``ValueError`` names ``where``."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{where}: config.json is {len(text)} bytes, more than the {MAX_CONFIG_BYTES} "
            "a model config can need; point it at a Hugging Face model folder"
        )
    try:
        config = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config.json must hold a JSON object")
    return config


def _architecture(config: dict, where: str) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{where}: config.json architectures {archs!r} cannot be trained by etrain; "
            f"{_supported()}"
        )
    return archs[0]


def _int(config: dict, key: str, where: str, default: int | None = None) -> int:
    value = config.get(key, default)
    low, high = RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{where}: config.json {key} must be an integer from {low} to {high:,}, "
            f"got {_show(value)}"
        )
    return value


def _number(value: object, key: str, where: str) -> float:
    """``value`` as a float in ``RANGES[key]`` (above its low end when that is 0)."""
    low, high = RANGES[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (low < value <= high if low == 0 else low <= value <= high):
        above = f"above {low} up to" if low == 0 else f"from {low} to"
        raise ValueError(
            f"{where}: config.json {key} must be a number {above} {high:g}, got {_show(value)}"
        )
    return float(value)


def _show(value: object) -> str:
    """``value`` for a message, cut short (a config.json value may be a 1 MiB string)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _rope_params(config: dict, where: str) -> dict:
    """transformers 5 keeps RoPE settings in ``rope_parameters``, 4.x in ``rope_scaling``
    (and ``rope_theta`` at the top level)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: config.json rope_parameters must be an object")
    return params


def _rope_scaling(config: dict, where: str) -> RopeScaling | None:
    """Llama 3.1's ``llama3`` scaling, or None for plain RoPE; other kinds are refused."""
    params = _rope_params(config, where)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(
            f"{where}: RoPE scaling {kind!r} is not implemented by etrain (plain RoPE and "
            f"llama3 only); {_supported()}"
        )
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [key for key in keys if key not in params]
    if missing:
        raise ValueError(
            f"{where}: config.json llama3 RoPE scaling is incomplete (no {', '.join(missing)})"
        )
    scaling = f"{where} (RoPE scaling)"
    values = [_number(params[key], key, scaling) for key in keys[:3]]
    original = _int(params, keys[3], scaling)
    try:
        return RopeScaling(*values, original_max_position_embeddings=original)
    except ValueError as exc:
        raise ValueError(f"{where}: config.json llama3 RoPE scaling: {exc}") from None


def _rope_theta(config: dict, where: str) -> float:
    """RoPE base."""
    params = _rope_params(config, where)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where}: partial rotary embeddings are not implemented by etrain")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    return _number(theta, "rope_theta", where)


def _check_layout(config: dict, arch: str, where: str) -> None:
    """Refuse fields that change the forward in ways etrain's decoder does not."""
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {config['hidden_act']!r} (etrain: silu only)")
    if config.get("mlp_bias") or (arch != "Qwen2ForCausalLM" and config.get("attention_bias")):
        raise ValueError(f"{where}: MLP / output projection biases are not implemented by etrain")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim")
    if head_dim is not None and (hidden % heads or head_dim != hidden // heads):
        raise ValueError(
            f"{where}: head_dim {head_dim} differs from hidden_size / num_attention_heads "
            f"({hidden} / {heads}); etrain's decoder needs them equal"
        )


def _max_seq_len(config: dict, arch: str, where: str) -> int:
    """Positions etrain trains on; clamped to a sliding window (exact below it)."""
    limit = _int(config, "max_position_embeddings", where, 2048)
    window = config.get("sliding_window")
    uses_window = arch == "MistralForCausalLM" or config.get("use_sliding_window", False)
    if uses_window and window is not None:
        limit = min(limit, _int(config, "sliding_window", where))
    return limit


def config_from_hf(config: dict, *, where: str = "model.hf") -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face causal LM ``config.json`` (a dict).

    ``ValueError`` (naming ``where`` and the supported architectures) for anything
    etrain cannot reproduce exactly.
    """
    arch = _architecture(config, where)
    dims = {
        "vocab_size": _int(config, "vocab_size", where),
        "dim": _int(config, "hidden_size", where),
        "n_layers": _int(config, "num_hidden_layers", where),
        "n_heads": _int(config, "num_attention_heads", where),
        "ffn_hidden": _int(config, "intermediate_size", where),
    }
    dims["n_kv_heads"] = _int(config, "num_key_value_heads", where, dims["n_heads"])
    _check_layout(config, arch, where)
    eps = config.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ValueError(f"{where}: config.json rms_norm_eps must be in (0, 1), got {_show(eps)}")
    numbers = {
        "max_seq_len": _max_seq_len(config, arch, where),
        "rope_theta": _rope_theta(config, where),
        "rope_scaling": _rope_scaling(config, where),
    }
    try:
        return ModelConfig(
            **dims,
            **numbers,
            norm_eps=float(eps),
            qkv_bias=arch in _QKV_BIAS,
            architecture=arch,
        )
    except ValueError as exc:
        raise ValueError(f"{where}: config.json does not fit etrain's decoder: {exc}") from None


def check_layout(cfg: ModelConfig, *, tp: int, stages: int, seq_len: int, where: str) -> None:
    """``ValueError`` naming ``where`` unless tp, pipeline stages and seq_len fit ``cfg``.

    The same rules the spec applies to presets, for a model whose shape comes from a
    config.json (the service calls it at submit, the workers when they build).
    """
    sizes = {
        "attention heads": cfg.n_heads,
        "KV heads": cfg.n_kv_heads,
        "hidden size": cfg.dim,
        "FFN hidden size": cfg.ffn_hidden,
    }
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        raise ValueError(
            f"parallelism.tp ({tp}) must divide the {', '.join(bad)} of {where} "
            f"({', '.join(map(str, bad.values()))}); use a tp that divides "
            f"{math.gcd(*sizes.values())}"
        )
    if stages > cfg.n_layers:
        raise ValueError(
            f"parallelism.pp needs {stages} pipeline stages but {where} has {cfg.n_layers} "
            "layers; reduce parallelism.pp"
        )
    if seq_len > cfg.max_seq_len:
        raise ValueError(
            f"data.seq_len ({seq_len}) exceeds the {cfg.max_seq_len} positions {where} "
            f"trains on (max_position_embeddings, or the sliding window); set data.seq_len "
            f"<= {cfg.max_seq_len}"
        )
