"""Llama, Mistral and Qwen2: etrain's decoder as it is (Qwen2 adds q/k/v biases).

Sliding-window attention (Mistral, Qwen2 with ``use_sliding_window``) equals full
causal attention on sequences no longer than the window, so ``max_seq_len`` is
clamped to the window instead.
"""

from __future__ import annotations

from workers.models.families.common import Family, head_dim, refuse, rope_fields, width
from workers.models.hf_fields import check_activation, read_int


def _fields(config: dict, arch: str, where: str) -> dict:
    check_activation(config, "hidden_act", {"silu": "silu"}, where)
    biases = ("mlp_bias",) if arch == "Qwen2ForCausalLM" else ("mlp_bias", "attention_bias")
    refuse(config, biases, "MLP / output projection biases", where)
    explicit = head_dim(config, where)
    out = rope_fields(config, width(config, explicit), where)
    window = config.get("sliding_window")
    uses_window = arch == "MistralForCausalLM" or config.get("use_sliding_window", False)
    if uses_window and window is not None:
        out["max_seq_len"] = min(out["max_seq_len"], read_int(config, "sliding_window", where))
    return {**out, "explicit_head_dim": explicit, "qkv_bias": arch == "Qwen2ForCausalLM"}


LLAMA = Family(
    name="llama",
    architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"),
    fields=_fields,
)
