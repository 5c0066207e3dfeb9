"""LoRA adapters of a family whose checkpoint fuses projections (Phi-3), in peft's terms.

etrain trains one adapter per projection (``wq``, ``wk``, ``wv``; ``w1``, ``w3``) where
Phi-3's checkpoint (and so peft over transformers' model) has one fused module
(``qkv_proj``; ``gate_up_proj``). The adapters of the pieces export as one adapter on the
fused module that computes exactly the same update: its ``lora_A`` stacks the pieces'
``lora_A`` (rank ``k * r`` for ``k`` adapted pieces) and its ``lora_B`` is block-diagonal,
each piece's ``lora_B`` in that piece's rows and its own ``r`` columns (zero rows for a
piece without an adapter). ``rank_pattern`` / ``alpha_pattern`` give the fused module
rank ``k * r`` and alpha ``k * alpha``, so peft's scale ``alpha / r`` is unchanged.
"""

from __future__ import annotations

import torch

from workers.models.config import ModelConfig
from workers.models.families import family_of
from workers.models.hf_naming import hf_rows, hf_shape, to_hf_name


def _fused_module(module: str, cfg: ModelConfig) -> str | None:
    """The Hugging Face fused module ``module`` (``layers.0.attention.wq``) is a piece of."""
    name = to_hf_name(f"{module}.weight", cfg)
    fused = family_of(cfg.architecture).fused
    return name.removesuffix(".weight") if name.split(".", 3)[-1] in fused else None


def fuse_adapters(
    adapters: dict[tuple[str, str], torch.Tensor], cfg: ModelConfig
) -> tuple[dict[tuple[str, str], torch.Tensor], dict[str, int]]:
    """``(module, "lora_A"|"lora_B") -> tensor`` (``lora_B`` rows in Hugging Face layout)
    with the pieces of fused modules replaced by one adapter on the fused module (keyed by
    its Hugging Face name); also ``{fused module's last name: pieces stacked}``."""
    out: dict[tuple[str, str], torch.Tensor] = {}
    groups: dict[str, list[str]] = {}
    for (module, kind), tensor in adapters.items():
        fused = _fused_module(module, cfg)
        if fused is None:
            out[(module, kind)] = tensor
        elif kind == "lora_A":
            groups.setdefault(fused, []).append(module)
    counts: dict[str, int] = {}
    for fused, modules in groups.items():
        modules.sort(key=lambda m: hf_rows(f"{m}.weight", cfg))
        a = torch.cat([adapters[(m, "lora_A")] for m in modules])
        rank = adapters[(modules[0], "lora_A")].shape[0]
        rows = hf_shape(f"{modules[0]}.weight", [0], cfg)[0]
        b = a.new_zeros(rows, rank * len(modules))
        for i, m in enumerate(modules):
            piece = adapters[(m, "lora_B")]
            start = hf_rows(f"{m}.weight", cfg)
            b[start : start + piece.shape[0], i * rank : (i + 1) * rank] = piece
        out[(fused, "lora_A")], out[(fused, "lora_B")] = a, b
        counts[fused.rsplit(".", 1)[-1]] = len(modules)
    return out, counts


def fused_targets(targets: list[str], cfg: ModelConfig) -> list[str]:
    """The spec's projection names as peft names them on ``cfg``'s family's model."""
    pieces = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
    pieces |= {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
    if not family_of(cfg.architecture).fused:
        return list(targets)
    return list(dict.fromkeys(pieces.get(t, t) for t in targets))
