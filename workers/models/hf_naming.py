"""Map etrain's parameter names and layout to a Hugging Face family's (Llama's by default).

etrain (like Meta's reference Llama and torchtitan) rotates adjacent pairs of
each head's query/key features; Hugging Face rotates the first half of a head
against the second half. The two agree once the rows of ``wq`` and ``wk`` are
permuted within each head (what ``transformers``' ``convert_llama_weights_to_hf``
does), so export permutes them and import undoes it; Qwen3's and Gemma 3's per-head
q/k norm weights are permuted the same way, as one head.

Names follow ``cfg.architecture``'s family (:mod:`workers.models.families`): Gemma's
norms are named differently, and Phi-3 stacks ``wq``/``wk``/``wv`` into ``qkv_proj`` and
``w1``/``w3`` into ``gate_up_proj``: :func:`hf_rows` says where in the fused tensor a
piece's rows start, and :func:`to_hf_state_dict` fuses them.
"""

from __future__ import annotations

import re

import torch

from workers.models.config import ModelConfig
from workers.models.families import family_of

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
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _in_layer(cfg: ModelConfig | None) -> dict[str, str]:
    """etrain in-layer name -> the family's (one fused name for each piece of it)."""
    if cfg is None:
        return _IN_LAYER
    family = family_of(cfg.architecture)
    table = _IN_LAYER | dict(family.renames)
    for fused, pieces in family.fused.items():
        table |= dict.fromkeys(pieces, fused)
    return table


def to_hf_name(fqn: str, cfg: ModelConfig | None = None) -> str:
    """The Hugging Face name of etrain parameter ``fqn`` in ``cfg``'s family (Llama's when
    ``cfg`` is None); ``KeyError`` if unknown. A fused piece names the fused tensor.

    A peft-wrapped projection's frozen ``.base_layer`` maps to the plain projection.
    """
    fqn = fqn.replace(".base_layer.", ".")
    if fqn in _TOP:
        return _TOP[fqn]
    m = _LAYER.match(fqn)
    table = _in_layer(cfg)
    if m is None or m.group(2) not in table:
        raise KeyError(f"no Hugging Face name for etrain parameter {fqn!r}")
    return f"model.layers.{m.group(1)}.{table[m.group(2)]}"


def from_hf_name(name: str, cfg: ModelConfig | None = None) -> str:
    """The etrain parameter name of Hugging Face parameter ``name`` (not a fused one)."""
    back = {v: k for k, v in _TOP.items()}
    if name in back:
        return back[name]
    m = _HF_LAYER.match(name)
    table = {v: k for k, v in _in_layer(cfg).items()}
    if m is None or m.group(2) not in table:
        raise KeyError(f"no etrain parameter for Hugging Face name {name!r}")
    return f"layers.{m.group(1)}.{table[m.group(2)]}"


def _piece_rows(piece: str, cfg: ModelConfig) -> int:
    """Rows of fused piece ``piece`` (an in-layer name)."""
    kv = cfg.n_kv_heads * cfg.head_dim
    rows = {"attention.wq.weight": cfg.n_heads * cfg.head_dim}
    rows |= {"attention.wk.weight": kv, "attention.wv.weight": kv}
    return rows.get(piece, cfg.ffn_hidden)


def hf_shape(fqn: str, shape: list[int], cfg: ModelConfig) -> list[int]:
    """The shape of ``fqn``'s Hugging Face tensor, ``shape`` unless it is fused."""
    m = _LAYER.match(fqn.replace(".base_layer.", "."))
    for pieces in family_of(cfg.architecture).fused.values():
        if m is not None and m.group(2) in pieces:
            return [sum(_piece_rows(p, cfg) for p in pieces), *shape[1:]]
    return list(shape)


def hf_rows(fqn: str, cfg: ModelConfig) -> int:
    """The first row of ``fqn`` in its Hugging Face tensor: 0 unless a piece of a fused one."""
    m = _LAYER.match(fqn.replace(".base_layer.", "."))
    for pieces in family_of(cfg.architecture).fused.values():
        if m is not None and m.group(2) in pieces:
            before = pieces[: pieces.index(m.group(2))]
            return sum(_piece_rows(p, cfg) for p in before)
    return 0


_ROPE_ROWS = (
    "attention.wq.weight",
    "attention.wq.bias",
    "attention.wk.weight",
    "attention.wk.bias",
    "attention.q_norm.weight",
    "attention.k_norm.weight",
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
    """A Hugging Face state dict of ``cfg``'s family in etrain names and layout (fused
    tensors split)."""
    out = {}
    fused = family_of(cfg.architecture).fused
    for name, tensor in state.items():
        m = _HF_LAYER.match(name)
        pieces = fused.get(m.group(2), ()) if m else ()
        for piece in pieces:
            fqn = f"layers.{m.group(1)}.{piece}"
            start, rows = hf_rows(fqn, cfg), _piece_rows(piece, cfg)
            out[fqn] = from_hf_tensor(fqn, tensor[start : start + rows], cfg)
        if not pieces:
            fqn = from_hf_name(name, cfg)
            out[fqn] = from_hf_tensor(fqn, tensor, cfg)
    return out


def to_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """An etrain state dict in ``cfg``'s family's names and layout (fused pieces stacked)."""
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for fqn, tensor in state.items():
        name = to_hf_name(fqn, cfg)
        parts.setdefault(name, []).append((hf_rows(fqn, cfg), to_hf_tensor(fqn, tensor, cfg)))
    return {
        name: torch.cat([t for _, t in sorted(p, key=lambda x: x[0])]) for name, p in parts.items()
    }
