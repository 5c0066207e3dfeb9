"""Hybrid parallelism: TP inside a node, FSDP across data-parallel replicas, PP around both.

The loop splits the model into pipeline stages first (``workers.strategies.pp``)
and calls :func:`apply_hybrid` on each stage's part, so this module only
composes tensor parallelism and data-parallel sharding on whatever blocks a
part holds. A size-1 mesh dimension is skipped.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.strategies import StrategyConfig, register_strategy
from workers.strategies.fsdp import shard_data_parallel
from workers.strategies.tp import apply_tensor_parallel


@register_strategy("hybrid")
def apply_hybrid(model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """TP over ``mesh["tp"]`` if it has more than one rank, then FSDP over ``mesh["dp"]`` likewise.

    The FSDP part follows ``parallelism.fsdp`` (ZeRO stage, CPU offload) and
    the job's precision. Call it on the whole model, or on each pipeline stage's
    part after splitting.
    """
    model = apply_tensor_parallel(model, tp_mesh=mesh["tp"])
    # Ordering constraint: TP before FSDP. FSDP must see the TP DTensors to
    # shard them again over dp into (dp, tp) placements, and pipeline splitting
    # must come before both (it deletes blocks, which FSDP units cannot lose).
    return shard_data_parallel(model, dp_mesh=mesh["dp"], cfg=cfg)
