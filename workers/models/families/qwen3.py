"""Qwen3: Llama's block with an RMSNorm over each head's queries and keys (before RoPE),
an explicit head width (128 unless config.json says otherwise), no q/k/v biases, and
sliding-window attention on the layers from ``max_window_layers`` on when
``use_sliding_window`` is set."""

from __future__ import annotations

from workers.models.families.common import (
    Family,
    attention_layers,
    head_dim,
    refuse,
    rope_fields,
    width,
)
from workers.models.hf_fields import check_activation


def _fields(config: dict, arch: str, where: str) -> dict:
    del arch
    check_activation(config, "hidden_act", {"silu": "silu"}, where)
    refuse(config, ("attention_bias", "mlp_bias"), "projection biases", where)
    explicit = head_dim(config, where, default=128)
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    first = config.get("max_window_layers", 28)

    def default(i: int) -> str:
        return "sliding_attention" if window is not None and i >= first else "full_attention"

    layers = {"layer_types": (), "sliding_window": None}
    if window is not None:
        layers = attention_layers(config, where, default)
    rope = rope_fields(config, width(config, explicit), where)
    return {**rope, **layers, "explicit_head_dim": explicit, "qk_norm": True}


QWEN3 = Family(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    fields=_fields,
)
