"""What a DeepSpeed engine holds on this rank, by the categories every strategy reports.

DeepSpeed keeps its state in flat buffers of its ZeRO optimizer, not only in the module's
parameters and the torch optimizer's state, so :func:`workers.telemetry.memory.state_bytes`
would miss most of it. Here the engine's tensors are found where DeepSpeed keeps them
(the module's parameters and their ZeRO-3 partitions, the torch optimizer's state and the
ZeRO optimizer's attributes), each storage counted once, and sorted by what they hold:

- ``params_bytes``: the module's parameters (whole at stages 0-2; at stage 3 the
  partitions and the small parameters kept whole);
- ``grads_bytes``: gradients and the buffers they are reduced and partitioned into, as
  they are at the end of backward (DeepSpeed frees them in its step);
- ``optimizer_bytes``: the torch optimizer's state and the fp32 master copy of each
  partition that ZeRO keeps beside the module's parameters (the ZeRO paper counts the
  master weights with the optimizer state);
- ``buckets_bytes``: the reduce buckets ZeRO-3 keeps allocated (``reduce_bucket_size``
  elements);
- ``swapped_bytes`` (NVMe offload only): the sizes of the files the rank swapped to, on
  disk, not in memory.
"""

from __future__ import annotations

import os

import torch

from workers.storage.nvme import rank_swap_folders

# ZeRO optimizer attributes by category (DeepSpeed 0.19.8's names); others are small
# bookkeeping and counted nowhere.
_MASTER = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
_BUCKETS = ("ipg_buckets",)


def _storages(obj, out: dict[int, int], depth: int = 0) -> None:
    """Every tensor storage reachable from ``obj`` (lists, tuples, dicts, a ZeRO bucket
    object's attributes), by address: its bytes."""
    if depth > 4 or obj is None:
        return
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.nbytes():
            out.setdefault(storage.data_ptr(), storage.nbytes())
        return
    if isinstance(obj, list | tuple):
        for value in obj:
            _storages(value, out, depth + 1)
    elif isinstance(obj, dict):
        for value in obj.values():
            _storages(value, out, depth + 1)
    elif type(obj).__module__.startswith("deepspeed") and hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            _storages(value, out, depth + 1)


def _total(found: dict[int, int], seen: set[int]) -> int:
    new = {k: v for k, v in found.items() if k not in seen}
    seen.update(new)
    return sum(new.values())


def _zero_attributes(zero, names) -> list:
    return [getattr(zero, name, None) for name in names]


def grads_bytes(engine) -> int:
    """Gradient bytes held at the end of backward (before the engine's step)."""
    zero = engine.optimizer
    found: dict[int, int] = {}
    for p in engine.module.parameters():
        _storages(p.grad, found)
    if zero is not getattr(zero, "optimizer", zero):  # a ZeRO optimizer
        for name, value in vars(zero).items():
            if "grad" in name and "norm" not in name:
                _storages(value, found)
        for flat in _zero_attributes(zero, _MASTER):
            for t in flat or ():
                _storages(t.grad, found)
    return sum(found.values())


def state_bytes(engine, *, grads: int) -> dict:
    """Bytes of this rank's parameters, optimizer state and ZeRO buckets after a step,
    with ``grads`` (:func:`grads_bytes` before it)."""
    zero = engine.optimizer
    inner = getattr(zero, "optimizer", zero)
    seen: set[int] = set()
    found: dict[int, int] = {}
    for p in engine.module.parameters():
        _storages(p, found)
        _storages(getattr(p, "ds_tensor", None), found)
    params = _total(found, seen)
    found = {}
    _storages([v for s in inner.state.values() for v in s.values()], found)
    if zero is not inner:
        _storages(_zero_attributes(zero, _MASTER), found)
    optimizer = _total(found, seen)
    found = {}
    if zero is not inner:
        _storages(_zero_attributes(zero, _BUCKETS), found)
    out = {
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optimizer,
        "buckets_bytes": _total(found, seen),
    }
    zero_config = engine._config.zero_config
    offloads = (zero_config.offload_param, zero_config.offload_optimizer)
    swaps = {o.nvme_path for o in offloads if o is not None and o.nvme_path is not None}
    if swaps:
        out["swapped_bytes"] = sum(swapped_bytes(str(p)) for p in swaps)
    return out


def swapped_bytes(nvme_path: str) -> int:
    """Bytes of this rank's swap files beneath ``nvme_path``."""
    total = 0
    for folder in rank_swap_folders(nvme_path, torch.distributed.get_rank()):
        for entry in os.scandir(folder) if os.path.isdir(folder) else ():
            total += entry.stat(follow_symlinks=False).st_size
    return total
