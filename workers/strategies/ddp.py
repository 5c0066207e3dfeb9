"""DDP: every rank holds the whole model; gradients are averaged over the dp group."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from workers.strategies import StrategyConfig, register_strategy


@register_strategy("ddp")
def apply_ddp(model: nn.Module, *, mesh: DeviceMesh, cfg: StrategyConfig) -> nn.Module:
    """Wrap ``model`` in DistributedDataParallel over the mesh's ``dp`` dimension.

    The loop uses ``no_sync()`` on all but the last micro-batch of a step, so
    gradient accumulation costs one all-reduce per optimizer step.
    """
    del cfg  # DDP has no options of its own
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(
        model,
        process_group=mesh["dp"].get_group(),
        device_ids=device_ids,
        # Buckets sized for small models too; the default 25 MB is one bucket for gpt-tiny.
        bucket_cap_mb=25,
        gradient_as_bucket_view=True,
    )
