"""Map etrain's Llama parameter names and layout to Hugging Face ``LlamaForCausalLM``'s.

etrain (like Meta's reference Llama and torchtitan) rotates adjacent pairs of
each head's query/key features; Hugging Face rotates the first half of a head
against the second half. The two agree once the rows of ``wq`` and ``wk`` are
permuted within each head (what ``transformers``' ``convert_llama_weights_to_hf``
does), so export permutes them and import undoes it.
"""

from __future__ import annotations

import re

import torch

from workers.models.config import ModelConfig

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_IN_LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_TOP_BACK = {v: k for k, v in _TOP.items()}
_IN_LAYER_BACK = {v: k for k, v in _IN_LAYER.items()}
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def to_hf_name(fqn: str) -> str:
    """The Hugging Face Llama name of etrain parameter ``fqn`` (``KeyError`` if unknown).

    A peft-wrapped projection's frozen ``.base_layer`` maps to the plain projection.
    """
    fqn = fqn.replace(".base_layer.", ".")
    if fqn in _TOP:
        return _TOP[fqn]
    m = _LAYER.match(fqn)
    if m is None or m.group(2) not in _IN_LAYER:
        raise KeyError(f"no Hugging Face Llama name for etrain parameter {fqn!r}")
    return f"model.layers.{m.group(1)}.{_IN_LAYER[m.group(2)]}"


def from_hf_name(name: str) -> str:
    """The etrain parameter name of Hugging Face Llama parameter ``name``."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    m = _HF_LAYER.match(name)
    if m is None or m.group(2) not in _IN_LAYER_BACK:
        raise KeyError(f"no etrain parameter for Hugging Face Llama name {name!r}")
    return f"layers.{m.group(1)}.{_IN_LAYER_BACK[m.group(2)]}"


_ROPE_ROWS = (
    "attention.wq.weight",
    "attention.wq.bias",
    "attention.wk.weight",
    "attention.wk.bias",
)


def is_rope_permuted(fqn: str) -> bool:
    """Whether ``fqn``'s rows are permuted within each head between etrain and HF layout.

    The permutation stays inside a head, so a block of whole heads (rows a multiple
    of the head width) converts on its own.
    """
    return fqn.replace(".base_layer.", ".").endswith(_ROPE_ROWS)


def to_hf_tensor(fqn: str, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """``tensor`` of etrain parameter ``fqn`` in Hugging Face layout (interleaved -> halves)."""
    if not is_rope_permuted(fqn):
        return tensor
    half, rest = cfg.head_dim // 2, tensor.shape[1:]
    return tensor.view(-1, half, 2, *rest).transpose(1, 2).reshape(tensor.shape)


def from_hf_tensor(fqn: str, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Undo :func:`to_hf_tensor`: a Hugging Face tensor back in etrain layout."""
    if not is_rope_permuted(fqn):
        return tensor
    half, rest = cfg.head_dim // 2, tensor.shape[1:]
    return tensor.view(-1, 2, half, *rest).transpose(1, 2).reshape(tensor.shape)


def from_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face Llama state dict (as exported with ``naming="hf"``) in etrain names."""
    out = {}
    for name, tensor in state.items():
        fqn = from_hf_name(name)
        out[fqn] = from_hf_tensor(fqn, tensor, cfg)
    return out
