"""Memory per rank of a layout: state, activations, buffers, host memory. Pure Python.

State follows what this build holds (``workers.telemetry.memory`` measures the same):
parameters are fp32 under both precisions (under bf16 they are the fp32
master weights; bf16 compute copies are transient buffers), gradients fp32,
AdamW two fp32 moments, SGD one momentum buffer. That is 4 + 4 + 8 = 16 bytes
per parameter with AdamW, the same 16 as the ZeRO paper's 2 + 2 + 12 split.
With LoRA the base parameters are frozen: they hold their 4 bytes and no
gradient or optimizer state; only the adapters (r * (in + out) per adapted
projection) have gradients and optimizer state.

Parameters are listed tensor by tensor with how tensor parallelism splits
them (column-wise, row-wise, replicated); FSDP2 then shards dim 0 of each
local tensor over dp in ``torch.chunk`` pieces. Activations are in
``service.planner.activations``; the shapes, layouts and workloads in
``service.planner.workload``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from service.planner.activations import (
    activation_bytes,
    in_flight,
    layer_activation_bytes_per_token,
    logits_in_flight,
    selective_layer_bytes_per_token,
)
from service.planner.deepspeed_memory import zero_buffers, zero_state
from service.planner.workload import (
    FP32,
    INT64,
    Layout,
    LoraShape,
    Part,
    Workload,
    adapter_numel,
    block_tensors,
    embed_tensors,
    head_tensors,
    rank_part,
    stage_layer_counts,
)
from workers.models.config import ModelConfig

__all__ = [
    "FP32",
    "INT64",
    "Layout",
    "LoraShape",
    "RankMemory",
    "StateBytes",
    "Workload",
    "activation_bytes",
    "buffer_bytes",
    "host_bytes",
    "in_flight",
    "layer_activation_bytes_per_token",
    "logits_in_flight",
    "rank_memory",
    "reference_bytes",
    "selective_layer_bytes_per_token",
    "stage_layer_counts",
    "state_bytes",
    "state_bytes_by_rank",
    "worst_rank_memory",
]


@dataclass(frozen=True)
class StateBytes:
    """Parameters, gradients and optimizer state one rank holds."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        """Sum of the three."""
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory: device breakdown, host bytes and the parts behind the buffers."""

    pp_rank: int
    state: StateBytes
    activations: int
    activations_checkpointed: int
    buffers: int
    host: int
    host_state: StateBytes  # the part of ``state`` in host memory (CPU offload on GPUs)
    disk: int = 0  # swapped to NVMe (DeepSpeed offload nvme), in neither memory
    detail: dict = field(default_factory=dict)

    @property
    def offloaded(self) -> bool:
        """Whether any of the state lives in host memory."""
        return self.host_state.total > 0

    @property
    def device_state(self) -> StateBytes:
        """State on the device: all of it but what CPU offload keeps in host memory."""
        s, h = self.state, self.host_state
        return StateBytes(s.params - h.params, s.grads - h.grads, s.optimizer - h.optimizer)

    @property
    def device_total(self) -> int:
        """Bytes on the device at the peak: state + activations + buffers."""
        return self.device_state.total + self.activations + self.buffers


# -- parameters ----------------------------------------------------------------


def _chunk(rows: int, parts: int, index: int) -> int:
    """Rows ``torch.chunk`` gives piece ``index`` of ``parts`` (FSDP2's dim-0 sharding)."""
    size = math.ceil(rows / parts)
    return max(0, min(size, rows - index * size))


def _local_numel(tensors, *, tp: int, dp: int, dp_rank: int, fsdp: bool) -> int:
    total = 0
    for shape, split in tensors:
        local = list(shape)
        if tp > 1 and split == "col":
            local[0] //= tp
        elif tp > 1 and split == "row":
            local[1] //= tp
        if fsdp:
            local[0] = _chunk(local[0], dp, dp_rank)
        total += math.prod(local)
    return total


def _part_numel(
    cfg: ModelConfig,
    part: Part,
    *,
    tp: int,
    dp: int = 1,
    dp_rank: int = 0,
    fsdp: bool = False,
    linear_only: bool = False,
) -> int:
    """Parameters of a pp rank's part on one rank (``linear_only``: nn.Linear weights only)."""
    kw = {"tp": tp, "dp": dp, "dp_rank": dp_rank, "fsdp": fsdp}

    def keep(tensors):
        return [t for t in tensors if len(t[0]) == 2] if linear_only else tensors

    n = part.layers * _local_numel(keep(block_tensors(cfg)), **kw)
    n += _local_numel(embed_tensors(cfg), **kw) if part.first and not linear_only else 0
    return n + (_local_numel(keep(head_tensors(cfg)), **kw) if part.last else 0)


def state_bytes(
    work: Workload, layout: Layout, *, pp_rank: int = 0, dp_rank: int = 0
) -> StateBytes:
    """Parameter, gradient and optimizer bytes of the rank at (pp_rank, dp_rank)."""
    if layout.zero is not None:
        z = zero_state(work, layout.zero_stage, layout.dp, layout.zero)
        return StateBytes(z.params, z.grads, z.optimizer)
    part = rank_part(work.cfg, layout, pp_rank)
    n = _part_numel(work.cfg, part, tp=layout.tp, dp=layout.dp, dp_rank=dp_rank, fsdp=layout.fsdp)
    if work.lora is not None:
        # Frozen base: parameters only, its nn.Linear weights in bf16 under bf16 precision
        # (workers.models.lora.hold_frozen_linears_in). Adapters shard like the rest.
        block = adapter_numel(work.cfg, work.lora)
        trained = math.ceil(part.layers * block / layout.tp / (layout.dp if layout.fsdp else 1))
        base = frozen_bytes(work, layout, part, dp_rank=dp_rank)
        return StateBytes(
            base + FP32 * trained, FP32 * trained, work.optimizer_bytes_per_param * trained
        )
    return StateBytes(FP32 * n, FP32 * n, work.optimizer_bytes_per_param * n)


def state_bytes_by_rank(work: Workload, layout: Layout) -> list[StateBytes]:
    """State of every world rank, in rank order (mesh ("pp", "dp", "tp"), tp innermost)."""
    return [
        state_bytes(
            work, layout, pp_rank=r // (layout.dp * layout.tp), dp_rank=(r // layout.tp) % layout.dp
        )
        for r in range(layout.world)
    ]


# -- buffers and host ------------------------------------------------------------


def buffer_bytes(work: Workload, layout: Layout, *, pp_rank: int = 0) -> dict[str, int]:
    """Device bytes beyond state and activations, by cause (peak, per rank)."""
    cfg = work.cfg
    part = rank_part(cfg, layout, pp_rank)
    tokens = work.micro_batch_size * work.seq_len
    cb = work.compute_bytes
    whole = _part_numel(cfg, part, tp=layout.tp)  # this rank's part before FSDP sharding
    block = _local_numel(block_tensors(cfg), tp=layout.tp, dp=1, dp_rank=0, fsdp=False)
    out = {"rope_table": cfg.max_seq_len * cfg.head_dim * FP32 * part.stages}
    if part.last:
        out["logits_grad"] = FP32 * tokens * cfg.vocab_size * logits_in_flight(layout)
    if layout.pp > 1:
        # torch's schedules keep a receive buffer per micro-batch: activations into
        # every stage but the first, gradients into every stage but the last.
        receiving = 2 * part.stages - int(part.first) - int(part.last)
        out["pipeline_p2p"] = FP32 * cfg.dim * tokens * layout.microbatches * receiving
    if work.reference_model and not (work.on_gpu and layout.fsdp and layout.cpu_offload):
        out["dpo_reference_model"] = reference_bytes(work, layout, pp_rank=pp_rank)
    if layout.zero is not None:
        out.update(zero_buffers(work, layout.zero_stage, layout.zero))
    if layout.fsdp:
        root = whole - part.layers * block
        # ZeRO-3 frees each block after forward (two in flight: current and
        # prefetched); the root stays gathered. Stages 1 and 2 keep all gathered.
        gathered = (root + 2 * block) if layout.zero_stage == 3 else whole
        out["fsdp_all_gather"] = cb * gathered
        # Gradients exist for what trains: with LoRA, the adapters only.
        grad_block = block if work.lora is None else adapter_numel(cfg, work.lora) // layout.tp
        grad_whole = whole if work.lora is None else part.layers * grad_block
        out["fsdp_reduce_scatter"] = 2 * FP32 * grad_block
        if work.calls_per_step(layout) > 1:
            out["fsdp_unsharded_grad_accumulation"] = FP32 * grad_whole
    if not layout.shards_params and work.precision == "bf16" and work.lora is None:
        # Autocast casts every nn.Linear weight to bf16 and the copy is saved for backward
        # (LoRA's frozen weights are held in bf16 already).
        out["autocast_weight_copies"] = 2 * _part_numel(cfg, part, tp=layout.tp, linear_only=True)
    return out


def reference_bytes(work: Workload, layout: Layout, *, pp_rank: int = 0) -> int:
    """A frozen reference model's parameters on one rank (objective dpo): sharded like the
    trained model under FSDP, whole under DDP; its nn.Linear weights in bf16 under bf16."""
    if not work.reference_model:
        return 0
    return frozen_bytes(work, layout, rank_part(work.cfg, layout, pp_rank), dp_rank=0)


def frozen_bytes(work: Workload, layout: Layout, part: Part, *, dp_rank: int) -> int:
    """Bytes of ``part``'s parameters held frozen on the rank at ``dp_rank``: fp32, but the
    nn.Linear weights in bf16 under bf16 precision (workers.models.lora.hold_frozen_linears_in:
    LoRA's base, and a DPO reference copy)."""
    kw = {"tp": layout.tp, "dp": layout.dp, "dp_rank": dp_rank, "fsdp": layout.fsdp}
    held = FP32 * _part_numel(work.cfg, part, **kw)
    if work.precision == "bf16":
        held -= 2 * _part_numel(work.cfg, part, linear_only=True, **kw)
    return held


def _state_and_host_part(
    work: Workload, layout: Layout, *, pp_rank: int
) -> tuple[StateBytes, StateBytes, int]:
    """The state of the (dp rank 0) rank at ``pp_rank``, the part of it that CPU offload
    keeps in host memory (on GPUs: all of it under FSDP, DeepSpeed's by option), and the
    bytes DeepSpeed swaps to NVMe (beside both)."""
    if layout.zero is not None:
        z = zero_state(work, layout.zero_stage, layout.dp, layout.zero)
        held = StateBytes(z.host_params, z.host_grads, z.host_optimizer)
        return StateBytes(z.params, z.grads, z.optimizer), held, z.disk_total
    state = state_bytes(work, layout, pp_rank=pp_rank)
    offloaded = work.on_gpu and layout.fsdp and layout.cpu_offload
    return state, state if offloaded else StateBytes(0, 0, 0), 0


def host_bytes(
    work: Workload, layout: Layout, state: StateBytes, held: StateBytes
) -> dict[str, int]:
    """Host memory per rank: offloaded state (``held``, and the reference model) and
    async-checkpoint staging."""
    out = {}
    if held.total:
        out["cpu_offload_state"] = held.total
    if work.on_gpu and layout.fsdp and layout.cpu_offload and work.reference_model:
        out["dpo_reference_model"] = reference_bytes(work, layout)
    if work.async_checkpoint:
        out["async_checkpoint_staging"] = state.params + state.optimizer
    return out


def rank_memory(work: Workload, layout: Layout, *, pp_rank: int = 0) -> RankMemory:
    """Memory of the (dp rank 0) rank at ``pp_rank``; dp rank 0 holds the largest chunks."""
    state, held, disk = _state_and_host_part(work, layout, pp_rank=pp_rank)
    buffers = buffer_bytes(work, layout, pp_rank=pp_rank)
    host = host_bytes(work, layout, state, held)
    act = activation_bytes(work, layout, pp_rank=pp_rank)
    act_ckpt = activation_bytes(work, layout, pp_rank=pp_rank, checkpointed="full")
    return RankMemory(
        pp_rank=pp_rank,
        state=state,
        activations=act,
        activations_checkpointed=act_ckpt,
        buffers=sum(buffers.values()),
        host=sum(host.values()),
        host_state=held,
        disk=disk,
        detail={"buffers": buffers, "host": host},
    )


def worst_rank_memory(work: Workload, layout: Layout) -> RankMemory:
    """The rank with the most device memory (pipeline stages differ; dp and tp ranks do not).

    Pipeline ranks that hold the same part (layers, embedding, head) differ only in the
    micro-batches in flight, which never rise with the rank, and a rank's activations
    never fall with them (:func:`activation_bytes`): the first rank of each distinct part
    is the worst of its ranks. So a few ranks are measured, not every one of up to
    MAX_WORKERS, and the answer (the first worst rank) is the one a scan of all gives.
    """
    firsts: dict = {}
    for r in range(layout.pp):
        firsts.setdefault(rank_part(work.cfg, layout, r), r)
    return max(
        (rank_memory(work, layout, pp_rank=r) for r in sorted(firsts.values())),
        key=lambda m: (m.device_total, m.host),
    )
