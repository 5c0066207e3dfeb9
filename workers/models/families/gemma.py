"""Gemma 2 and Gemma 3 (text): etrain's block with Gemma's changes, as transformers 5.

Embeddings are multiplied by sqrt(hidden_size) (in the activations' dtype); every
RMSNorm scales by ``1 + weight``; the MLP gate is gelu with the tanh approximation
(``gelu_pytorch_tanh``); attention and MLP outputs are normed again before the
residual (``post_attention_layernorm``, ``post_feedforward_layernorm``; the MLP's
input norm is ``pre_feedforward_layernorm``); scores are scaled by
``query_pre_attn_scalar ** -0.5``. Layers alternate sliding-window (local) and
global attention by ``layer_types``. Gemma 2 soft-caps attention scores and the
final logits with tanh; Gemma 3 norms each head's queries and keys and rotates its
sliding layers with their own RoPE base (``rope_parameters.sliding_attention``, or
4.x's ``rope_local_base_freq``), its global ones with ``full_attention``'s settings.
"""

from __future__ import annotations

from workers.models.families.common import (
    Family,
    attention_layers,
    head_dim,
    refuse,
    rope_fields,
    width,
)
from workers.models.hf_fields import check_activation, read_number

_GELU = {"gelu_pytorch_tanh": "gelu_tanh"}
# The config classes' defaults, for a config.json that leaves a field out.
_DEFAULTS = {
    "Gemma2ForCausalLM": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "Gemma3ForCausalLM": {"attn_logit_softcapping": None, "final_logit_softcapping": None},
}


def _cap(config: dict, key: str, arch: str, where: str) -> float | None:
    value = config.get(key, _DEFAULTS[arch][key])
    return None if value is None else read_number(value, key, where)


def _gemma3_rope(config: dict, head: int, where: str) -> dict:
    """Global layers: ``full_attention``'s settings; sliding ones: ``sliding_attention``'s."""
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    else:  # transformers 4.x: rope_scaling (global only), rope_local_base_freq
        full = config.get("rope_scaling") or {}
        local = {"rope_theta": config.get("rope_local_base_freq", 10000.0)}
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise ValueError(f"{where}: config.json rope_parameters must hold objects")
    out = rope_fields(config | {"rope_theta": config.get("rope_theta", 1e6)}, head, where, full)
    local_fields = rope_fields(config | {"rope_theta": 10000.0}, head, where, local)
    out["local_rope_theta"] = local_fields["rope_theta"]
    out["local_rope_scaling"] = local_fields["rope_scaling"]
    out["max_seq_len"] = max(out["max_seq_len"], local_fields["max_seq_len"])
    return out


def _fields(config: dict, arch: str, where: str) -> dict:
    activation = check_activation(config, "hidden_activation", _GELU, where)
    refuse(config, ("attention_bias", "use_bidirectional_attention"), "Gemma option", where)
    explicit = head_dim(config, where, default=256)
    head = width(config, explicit)
    gemma3 = arch == "Gemma3ForCausalLM"
    pattern = config.get("sliding_window_pattern", 6) if gemma3 else 2

    def default(i: int) -> str:
        return "sliding_attention" if (i + 1) % pattern else "full_attention"

    rope = _gemma3_rope(config, head, where) if gemma3 else rope_fields(config, head, where)
    scalar = read_number(config.get("query_pre_attn_scalar", 256), "query_pre_attn_scalar", where)
    return {
        **rope,
        **attention_layers(config, where, default),
        "explicit_head_dim": explicit,
        "activation": activation,
        "norm_offset": 1.0,
        "embed_scale": True,
        "sandwich_norm": True,
        "qk_norm": gemma3,
        "attn_scale": scalar**-0.5,
        "attn_softcap": _cap(config, "attn_logit_softcapping", arch, where),
        "final_softcap": _cap(config, "final_logit_softcapping", arch, where),
    }


_NORMS = {
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffn_norm.weight": "post_feedforward_layernorm.weight",
}

GEMMA = Family(
    name="gemma",
    architectures=("Gemma2ForCausalLM", "Gemma3ForCausalLM"),
    fields=_fields,
    renames=_NORMS,
)
