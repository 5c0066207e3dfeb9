"""FSDP (ZeRO-style sharding) with FSDP2 ``fully_shard`` over the mesh's ``dp`` dimension.

Each decoder block becomes one FSDP unit (one all-gather and one
reduce-scatter per block), then the root takes what is left (embeddings, final
norm, output head). Parameters, gradients and optimizer state are DTensors
sharded on dim 0 over ``dp``; a parameter that tensor parallelism already made
a DTensor gets 2-D ``(dp, tp)`` placements.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from workers.spec import FsdpSpec
from workers.strategies import StrategyConfig, register_strategy


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model`` (``model.layers``), in order; [] if it has none.

    Under pipeline parallelism a stage part keeps only its own entries of
    ``layers`` (a ModuleDict keyed by the original index), so this is the
    list of blocks that part holds.
    """
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleDict):
        return list(layers.values())
    if isinstance(layers, nn.ModuleList):
        return list(layers)
    return []


def reshard_after_forward(fsdp: FsdpSpec) -> bool:
    """FSDP2's ``reshard_after_forward`` for a ZeRO stage.

    Stage 3 frees the gathered parameters after each block's forward and
    gathers them again in backward. Stages 2 and 1 keep them from forward to
    backward (no second all-gather). FSDP2 has no optimizer-state-only mode,
    so stage 1 is run as stage 2: gradients are sharded too, which only saves
    memory compared with ZeRO-1.
    """
    return fsdp.zero_stage == 3


def fully_shard_options(*, dp_mesh: DeviceMesh, cfg: StrategyConfig) -> dict:
    """Keyword arguments for ``fully_shard`` from the job's precision and FSDP options."""
    options: dict = {"mesh": dp_mesh}
    if cfg.precision == "bf16":
        # bf16 compute, fp32 master weights (the sharded parameters the
        # optimizer steps) and fp32 gradient reductions.
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if cfg.parallelism.fsdp.cpu_offload:
        # Pinned host memory needs an accelerator; on CPU "offload" is a no-op move.
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=dp_mesh.device_type != "cpu")
    else:
        options["offload_policy"] = OffloadPolicy()
    return options


def shard_data_parallel(model: nn.Module, *, dp_mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """Shard ``model`` (a whole model or one pipeline stage's part) over ``dp_mesh``.

    Returns ``model`` unchanged when ``dp_mesh`` has one rank and no CPU offload:
    there is nothing to shard or reduce, and a plain module (possibly holding
    tensor-parallel DTensors) trains as it is. With ``cpu_offload`` one rank is
    wrapped too: its parameters, gradients and optimizer state then live in host
    memory and each block is copied to the device for its forward and backward
    (how a model larger than the GPU trains on one GPU). Apply tensor parallelism
    before this.
    """
    if dp_mesh.size() == 1 and not cfg.parallelism.fsdp.cpu_offload:
        return model
    options = fully_shard_options(dp_mesh=dp_mesh, cfg=cfg)
    for block in decoder_blocks(model):
        fully_shard(
            block, reshard_after_forward=reshard_after_forward(cfg.parallelism.fsdp), **options
        )
    # The root (embeddings, final norm, head) is left to FSDP's default: it is
    # not resharded after forward because backward starts with it.
    fully_shard(model, **options)
    return model


@register_strategy("fsdp")
def apply_fsdp(model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """Fully shard ``model`` over the mesh's ``dp`` dimension (ZeRO stage from ``cfg``).

    ``parallelism.fsdp.zero_stage`` 3 reshards parameters after forward; 2
    keeps them gathered until backward; 1 runs as 2 (see
    :func:`reshard_after_forward`). ``cpu_offload`` keeps sharded parameters,
    gradients and optimizer state in host memory; ``bf16`` precision
    computes in bf16 over fp32 master weights. Gradients are reduce-scattered
    with ReduceOp.AVG over dp (gloo has it for reduce-scatter) and the loop
    divides each micro-batch loss by the micro-batches per rank, so the result
    is the global-batch mean. For gradient accumulation the loop calls
    ``set_requires_gradient_sync(False)`` on the root (it recurses into the
    blocks) for all but the last micro-batch, so FSDP sums unsharded gradients
    locally and reduce-scatters once per optimizer step.
    """
    return shard_data_parallel(model, dp_mesh=mesh["dp"], cfg=cfg)
