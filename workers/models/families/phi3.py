"""Phi-3: Llama's block, but the checkpoint fuses q/k/v (``qkv_proj``) and gate/up
(``gate_up_proj``) into one tensor each.

etrain keeps ``wq``/``wk``/``wv`` and ``w1``/``w3`` apart, so tensor parallelism shards
each by whole heads and LoRA targets them one by one (the spec's ``q_proj`` ... names);
loading reads each one's rows of the fused tensor and export stacks them back (a LoRA
adapter on several of them exports as one block-diagonal adapter on the fused module).
RoPE: plain or ``longrope`` (``su``; short or long factors by sequence length). A
``sliding_window`` applies to every layer, as transformers' Phi-3 masks them all.
"""

from __future__ import annotations

from workers.models.families.common import Family, head_dim, refuse, rope_fields, width
from workers.models.hf_fields import check_activation, read_int


def _fields(config: dict, arch: str, where: str) -> dict:
    del arch
    check_activation(config, "hidden_act", {"silu": "silu"}, where)
    refuse(config, ("attention_bias", "mlp_bias"), "projection biases", where)
    explicit = head_dim(config, where)
    out = rope_fields(config, width(config, explicit), where)
    layers: dict = {"layer_types": (), "sliding_window": None}
    if config.get("sliding_window") is not None:
        n = read_int(config, "num_hidden_layers", where)
        window = read_int(config, "sliding_window", where)
        layers = {"layer_types": ("sliding",) * n, "sliding_window": window}
    return {**out, **layers, "explicit_head_dim": explicit}


PHI3 = Family(
    name="phi3",
    architectures=("Phi3ForCausalLM",),
    fields=_fields,
    fused={
        "self_attn.qkv_proj.weight": (
            "attention.wq.weight",
            "attention.wk.weight",
            "attention.wv.weight",
        ),
        "mlp.gate_up_proj.weight": ("feed_forward.w1.weight", "feed_forward.w3.weight"),
    },
)
