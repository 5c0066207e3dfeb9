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
  ``max_seq_len`` is clamped to the window instead of refusing the model; the newer
  families attend within their windows on the layers ``layer_types`` marks.

What each architecture changes is read by its family (:mod:`workers.models.families`,
docs/model-families.md); this module reads the shapes every family shares.
"""

from __future__ import annotations

import json
import math
from typing import Any

from workers.models.config import ModelConfig
from workers.models.families import SUPPORTED_ARCHITECTURES, family_of
from workers.models.hf_fields import RANGES, read_int, show

__all__ = ["RANGES", "SUPPORTED_ARCHITECTURES", "check_layout", "config_from_hf"]
MAX_CONFIG_BYTES = 1 << 20


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


def config_from_hf(config: dict, *, where: str = "model.hf") -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face causal LM ``config.json`` (a dict).

    ``ValueError`` (naming ``where`` and the supported architectures) for anything
    etrain cannot reproduce exactly.
    """
    arch = _architecture(config, where)
    dims = {
        "vocab_size": read_int(config, "vocab_size", where),
        "dim": read_int(config, "hidden_size", where),
        "n_layers": read_int(config, "num_hidden_layers", where),
        "n_heads": read_int(config, "num_attention_heads", where),
        "ffn_hidden": read_int(config, "intermediate_size", where),
    }
    dims["n_kv_heads"] = read_int(config, "num_key_value_heads", where, dims["n_heads"])
    eps = config.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ValueError(f"{where}: config.json rms_norm_eps must be in (0, 1), got {show(eps)}")
    if dims["dim"] % dims["n_heads"] and config.get("head_dim") is None:
        raise ValueError(
            f"{where}: config.json does not fit etrain's decoder: hidden_size "
            f"({dims['dim']}) must be divisible by num_attention_heads ({dims['n_heads']}) "
            "when there is no head_dim"
        )
    fields = family_of(arch).fields(config, arch, where)
    try:
        return ModelConfig(**dims, **fields, norm_eps=float(eps), architecture=arch)
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
