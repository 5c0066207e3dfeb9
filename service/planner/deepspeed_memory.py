"""Memory per rank of a DeepSpeed ZeRO layout (``parallelism.strategy: deepspeed``). Pure Python.

DeepSpeed 0.19.8 as etrain runs it: fp32 weights (bf16 is autocast over them, as under
every strategy), etrain's torch optimizer wrapped by ZeRO, data parallelism only. With
``k`` bytes of optimizer state per trained parameter (8 for AdamW, 4 for SGD with
momentum) and ``dp`` ranks:

- stage 0 replicates, as DDP: 4 B parameters, 4 B gradients, k B optimizer state;
- stages 1 and 2 keep the module's parameters whole (4 B) and partition the gradients
  (4 B) and the optimizer state over dp, beside which ZeRO keeps an fp32 master copy of
  the partition (k + 4 B: the ZeRO paper's 12 B of "optimizer states" for Adam);
- stage 3 partitions the parameters too, each tensor in ceil(n / dp) pieces; a tensor of
  fewer than ``stage3_param_persistence_threshold`` elements (1e5) is also kept whole;
- with ``offload_optimizer: cpu`` the gradients are copied into a host buffer of the
  partition's size (at stages 1-2 through a staging buffer of the largest tensor's size on
  each side), and the optimizer state and master copy live in host memory; with
  ``offload_param: cpu`` so do the parameter partitions (the whole-kept ones stay).

Buffers (device bytes beyond the state): the reduce bucket of ``reduce_bucket_size``
elements (5e8 unless set: 1.9 GiB of fp32 whatever the model's size), allocated in
backward at stages 1 and 2 (twice with ``overlap_comm``) and kept at stage 3; stage 0's
gradients are flattened for the all-reduce in buckets of up to 5e8 elements (a constant of
the engine); stage 3 gathers a block's parameters for forward and backward and prefetches up
to ``stage3_prefetch_bucket_size`` elements ahead. ``workers.telemetry.engine_memory``
measures the same categories on a running engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.planner.workload import (
    FP32,
    Workload,
    ZeroOptions,
    block_tensors,
    embed_tensors,
    head_tensors,
    linear_shapes,
)
from workers.storage.nvme import AIO_BLOCK_BYTES

# DeepSpeed's swapper reads and writes in blocks of this many bytes, and swaps a parameter
# piece only from one block up (deepspeed.runtime.swap_tensor's MIN_AIO_BYTES).
AIO_BLOCK = AIO_BLOCK_BYTES
AIO_BLOCK_ELEMENTS = AIO_BLOCK // FP32
# Host buffers a rank reads swapped parameter pieces back into (offload_param.buffer_count).
PARAM_SWAP_BUFFERS = 5
# The engine flattens ZeRO-0's gradients for its all-reduce in buffers of this many
# elements (deepspeed.runtime.engine.MEMORY_OPT_ALLREDUCE_SIZE).
ALLREDUCE_ELEMENTS = 500_000_000


@dataclass(frozen=True)
class _Tensor:
    numel: int
    itemsize: int  # bytes per element as held (bf16 for frozen nn.Linear weights under bf16)
    trained: bool


def _tensors(work: Workload) -> list[_Tensor]:
    """Every parameter tensor of the model; with LoRA the base frozen and the adapters
    (r x in and out x r per adapted projection and layer) trained."""
    cfg, lora = work.cfg, work.lora
    frozen_linear = 2 if work.precision == "bf16" else FP32

    def held(shapes, linears: bool) -> list[_Tensor]:
        out = []
        for shape, _ in shapes:
            size = frozen_linear if lora and linears and len(shape) == 2 else FP32
            out.append(_Tensor(math.prod(shape), size, lora is None))
        return out

    blocks = held(block_tensors(cfg), True) * cfg.n_layers
    tensors = held(embed_tensors(cfg), False) + blocks + held(head_tensors(cfg), True)
    if lora is not None:
        for name, (fan_in, fan_out) in linear_shapes(cfg).items():
            if lora.adapted(name):
                pair = [
                    _Tensor(lora.rank * fan_in, FP32, True),
                    _Tensor(fan_out * lora.rank, FP32, True),
                ]
                tensors += pair * cfg.n_layers
    return tensors


def _piece(numel: int, dp: int) -> int:
    return math.ceil(numel / dp)


@dataclass(frozen=True)
class ZeroState:
    """Parameter, gradient and optimizer bytes of one rank, and the part of each in host
    memory (offload on a GPU job)."""

    params: int
    grads: int
    optimizer: int
    host_params: int = 0
    host_grads: int = 0
    host_optimizer: int = 0
    disk_params: int = 0  # swapped to NVMe (offload nvme): neither device nor host memory
    disk_grads: int = 0
    disk_optimizer: int = 0

    @property
    def disk_total(self) -> int:
        """Bytes of the rank's swap files."""
        return self.disk_params + self.disk_grads + self.disk_optimizer


def zero_state(work: Workload, stage: int, dp: int, zero: ZeroOptions) -> ZeroState:
    """What one of ``dp`` ranks holds at ZeRO ``stage`` (every rank alike: DeepSpeed pads
    its partitions to equal sizes)."""
    tensors = _tensors(work)
    k = work.optimizer_bytes_per_param
    trained = sum(t.numel for t in tensors if t.trained)
    if stage == 0:
        params = sum(t.numel * t.itemsize for t in tensors)
        return ZeroState(params, FP32 * trained, k * trained)
    if stage == 3:
        pieces = sum(_piece(t.numel, dp) * t.itemsize for t in tensors)
        kept = _kept(tensors, zero)
        part = sum(_piece(t.numel, dp) for t in tensors if t.trained)
    else:
        pieces, part = 0, _piece(trained, dp)
        kept = sum(t.numel * t.itemsize for t in tensors)
    offload = zero.offload_optimizer
    # Stages 1-2 offloading also stage each gradient through a buffer of the largest
    # trained tensor's size, one on the device and one on the host.
    staging = FP32 * max(t.numel for t in tensors if t.trained) if offload and stage < 3 else 0
    state = ZeroState(
        params=pieces + kept,
        grads=(FP32 * part + staging) * (2 if offload else 1),
        optimizer=(k + FP32) * part,
    )
    if zero.nvme_param or zero.nvme_optimizer:
        return _swapped(state, tensors, dp, zero, part=part, on_gpu=work.on_gpu)
    if not work.on_gpu:
        return state  # host and device memory are one
    return ZeroState(
        state.params,
        state.grads,
        state.optimizer,
        host_params=pieces if zero.offload_param else 0,
        host_grads=FP32 * part + staging if offload else 0,
        host_optimizer=state.optimizer if offload else 0,
    )


def _aligned(numel: int) -> int:
    """Elements DeepSpeed's swap file of ``numel`` fp32 elements holds (whole aio blocks)."""
    return AIO_BLOCK_ELEMENTS * math.ceil(numel / AIO_BLOCK_ELEMENTS)


def _swapped(
    state: ZeroState, tensors: list[_Tensor], dp: int, zero: ZeroOptions, *, part: int, on_gpu: bool
) -> ZeroState:
    """ZeRO-3 swapping to NVMe. DeepSpeed swaps a parameter piece, and a trained one's fp32
    gradient, only from one aio block up, in whole blocks; the smaller pieces stay where
    ``cpu`` offload keeps them. On a GPU the swapped pieces are read back through
    :data:`PARAM_SWAP_BUFFERS` host buffers of the largest one's size (on the CPU they are
    measured in memory after the step). With the optimizer swapped, its state and the fp32
    master copy go to disk whole."""
    pieces = [(_piece(t.numel, dp), t) for t in tensors if t.numel >= zero.persistence_threshold]
    swapped = [(n, t) for n, t in pieces if n * t.itemsize >= AIO_BLOCK]
    blocks = [AIO_BLOCK * math.ceil(n * t.itemsize / AIO_BLOCK) for n, t in swapped]
    grads = sum(_aligned(n) * FP32 for n, t in swapped if t.trained) if zero.nvme_optimizer else 0
    disk_optimizer = state.optimizer if zero.nvme_optimizer else 0
    optimizer = state.optimizer - disk_optimizer
    params, host_params = state.params, 0
    if on_gpu and zero.nvme_param:
        unswapped = sum(n * t.itemsize for n, t in pieces) - sum(n * t.itemsize for n, t in swapped)
        host_params = unswapped + PARAM_SWAP_BUFFERS * max(blocks, default=0)
        params = _kept(tensors, zero) + host_params
    elif on_gpu and zero.offload_param:
        host_params = state.params - _kept(tensors, zero)
    device_grads = FP32 * part if zero.nvme_optimizer else state.grads  # the host copy is swapped
    return ZeroState(
        params=params,
        grads=device_grads,
        optimizer=optimizer,
        host_params=host_params,
        host_grads=(device_grads - FP32 * part) if on_gpu else 0,
        host_optimizer=optimizer if on_gpu and zero.offload_optimizer else 0,
        disk_params=sum(blocks) if zero.nvme_param else 0,
        disk_grads=grads,
        disk_optimizer=disk_optimizer,
    )


def _kept(tensors: list[_Tensor], zero: ZeroOptions) -> int:
    """Bytes of the small tensors ZeRO-3 keeps whole on every rank."""
    return sum(t.numel * t.itemsize for t in tensors if t.numel < zero.persistence_threshold)


def zero_buffers(work: Workload, stage: int, zero: ZeroOptions) -> dict[str, int]:
    """Device bytes DeepSpeed adds beyond the state, by cause (peak, per rank)."""
    tensors = _tensors(work)
    trained = sum(t.numel for t in tensors if t.trained)
    if stage == 0:
        return {"deepspeed_allreduce_bucket": FP32 * min(trained, ALLREDUCE_ELEMENTS)}
    out = {}
    if stage == 3 or zero.contiguous_gradients:
        copies = 2 if stage < 3 and zero.overlaps(stage) else 1
        out["deepspeed_reduce_bucket"] = FP32 * zero.reduce_bucket_size * copies
    if stage == 3:
        # A block in use and up to the prefetch bucket's elements ahead, as they are held
        # (a LoRA base's nn.Linear weights in bf16 under bf16).
        gathered = [t for t in tensors if t.numel >= zero.persistence_threshold]
        numel, nbytes = sum(t.numel for t in gathered), sum(t.numel * t.itemsize for t in gathered)
        block = sum(math.prod(s) for s, _ in block_tensors(work.cfg))
        live = min(numel, block + zero.prefetch_bucket_size)
        out["deepspeed_gathered_params"] = nbytes * live // max(numel, 1)
    return out


__all__ = ["ZeroOptions", "ZeroState", "zero_buffers", "zero_state"]
