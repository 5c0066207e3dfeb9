"""Activation checkpointing of one decoder block: ``full`` or ``selective`` recompute.

``full`` keeps only the block's input and runs the whole block again in
backward. ``selective`` (torch's selective activation checkpointing) keeps the
outputs of the expensive ops, the matmuls, attention and tensor-parallel
collectives, and recomputes the cheap element-wise ones (norms, rotary, SiLU,
the gate product, casts) in backward. Both are non-reentrant checkpoints, which
work with FSDP2's hooks, DTensor and pipeline stages alike.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

MODES = ("none", "full", "selective")


def _save_ops() -> frozenset:
    aten = torch.ops.aten
    ops = [
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    ]
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None:  # tensor parallelism: never redo a collective in backward
        ops += [c10d.all_reduce.default, c10d.reduce_scatter_tensor.default]
    return frozenset(ops)


SAVE_OPS = _save_ops()


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    del ctx, args, kwargs
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def run_block(layer, h: torch.Tensor, freqs_cis: torch.Tensor, mode: str) -> torch.Tensor:
    """``layer(h, freqs_cis)`` under activation checkpointing ``mode`` (none|full|selective)."""
    if mode == "full":
        return checkpoint(layer, h, freqs_cis, use_reentrant=False)
    if mode == "selective":
        return checkpoint(
            layer,
            h,
            freqs_cis,
            use_reentrant=False,
            context_fn=functools.partial(create_selective_checkpoint_contexts, _policy),
        )
    if mode != "none":
        raise ValueError(f"model.activation_checkpointing must be one of {MODES}, got {mode!r}")
    return layer(h, freqs_cis)
