"""Memory per rank of a layout: state, activations, buffers, host memory. Pure Python.

State follows what this build holds (``workers.telemetry.memory`` measures the same):
parameters are fp32 under both precisions (under bf16 they are the fp32
master weights; bf16 compute copies are transient buffers), gradients fp32,
AdamW two fp32 moments, SGD one momentum buffer. That is 4 + 4 + 8 = 16 bytes
per parameter with AdamW, the same 16 as the ZeRO paper's 2 + 2 + 12 split.

Parameters are listed tensor by tensor with how tensor parallelism splits
them (column-wise, row-wise, replicated); FSDP2 then shards dim 0 of each
local tensor over dp in ``torch.chunk`` pieces. Activations are the bytes
autograd saves for backward, listed tensor by tensor for the Llama block of
``workers.models.llama`` with flash (memory-efficient) attention, so there is
no sequence-squared term.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from workers.models.config import ModelConfig

FP32, INT64 = 4, 8


@dataclass(frozen=True)
class Layout:
    """How ranks split the model: degrees, FSDP options and pipeline schedule."""

    strategy: str
    dp: int
    tp: int = 1
    pp: int = 1
    zero_stage: int = 3
    cpu_offload: bool = False
    schedule: str = "1f1b"
    microbatches: int = 1

    @property
    def world(self) -> int:
        """Ranks: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 shards over dp (every strategy but DDP does when dp > 1)."""
        return self.strategy != "ddp" and self.dp > 1

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each pp rank holds (two under interleaved 1F1B)."""
        return 2 if self.pp > 1 and self.schedule == "interleaved_1f1b" else 1

    def describe(self) -> str:
        """A short human name: 'fsdp zero3 dp=8', 'hybrid tp=8 pp=4 dp=1'."""
        parts = [self.strategy]
        if self.fsdp:
            parts.append(f"zero{self.zero_stage}" + (" offload" if self.cpu_offload else ""))
        parts += [f"tp={self.tp}"] if self.tp > 1 else []
        parts += [f"pp={self.pp} {self.schedule} m={self.microbatches}"] if self.pp > 1 else []
        return " ".join([*parts, f"dp={self.dp}"])


@dataclass(frozen=True)
class Workload:
    """The slice of a job spec memory depends on."""

    cfg: ModelConfig
    seq_len: int
    micro_batch_size: int
    global_batch_size: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    momentum: float = 0.0
    on_gpu: bool = False
    activation_checkpointing: bool = False
    async_checkpoint: bool = False

    @property
    def optimizer_bytes_per_param(self) -> int:
        """AdamW: exp_avg + exp_avg_sq; SGD: one momentum buffer, or none without momentum."""
        if self.optimizer == "adamw":
            return 2 * FP32
        return FP32 if self.momentum else 0

    @property
    def compute_bytes(self) -> int:
        """Element size of matmul inputs: bf16 under autocast, else fp32."""
        return 2 if self.precision == "bf16" else FP32

    def calls_per_step(self, layout: Layout) -> int:
        """Forward/backward calls per optimizer step on one dp rank (a pipeline call is one)."""
        per_call = self.micro_batch_size * (layout.microbatches if layout.pp > 1 else 1)
        return max(1, self.global_batch_size // (per_call * layout.dp))


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
    offloaded: bool
    detail: dict = field(default_factory=dict)

    @property
    def device_state(self) -> StateBytes:
        """State on the device (none of it under CPU offload)."""
        return StateBytes(0, 0, 0) if self.offloaded else self.state

    @property
    def device_total(self) -> int:
        """Bytes on the device at the peak: state + activations + buffers."""
        return self.device_state.total + self.activations + self.buffers


# -- parameters ----------------------------------------------------------------


def _block_tensors(cfg: ModelConfig) -> list[tuple[tuple[int, ...], str]]:
    """(shape, TP split) of one decoder block's parameters, as nn.Linear stores them."""
    h, q, f = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.ffn_hidden
    kv = cfg.n_kv_heads * cfg.head_dim
    return [
        ((q, h), "col"),
        ((kv, h), "col"),
        ((kv, h), "col"),
        ((h, q), "row"),
        ((f, h), "col"),
        ((f, h), "col"),
        ((h, f), "row"),
        ((h,), "rep"),
        ((h,), "rep"),
    ]


def _embed_tensors(cfg: ModelConfig) -> list[tuple[tuple[int, ...], str]]:
    return [((cfg.vocab_size, cfg.dim), "rep")]


def _head_tensors(cfg: ModelConfig) -> list[tuple[tuple[int, ...], str]]:
    return [((cfg.dim,), "rep"), ((cfg.vocab_size, cfg.dim), "rep")]


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


@functools.lru_cache(maxsize=256)
def stage_layer_counts(cfg: ModelConfig, n_stages: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, balanced by parameters as ``workers.strategies.pp`` does.

    The first stage also holds the embedding and the last the final norm and
    head; one layer at a time goes to the currently lightest stage.
    """
    block = sum(math.prod(s) for s, _ in _block_tensors(cfg))
    extra = [0] * n_stages
    extra[0] += cfg.vocab_size * cfg.dim
    extra[-1] += cfg.vocab_size * cfg.dim + cfg.dim
    counts = [1] * n_stages
    for _ in range(cfg.n_layers - n_stages):
        lightest = min(range(n_stages), key=lambda s: extra[s] + counts[s] * block)
        counts[lightest] += 1
    return tuple(counts)


@dataclass(frozen=True)
class _Part:
    """What one pp rank holds: decoder layers, and whether the embedding / head."""

    layers: int
    first: bool
    last: bool
    stages: int


def _rank_part(cfg: ModelConfig, layout: Layout, pp_rank: int) -> _Part:
    if layout.pp == 1:
        return _Part(cfg.n_layers, True, True, 1)
    n_stages = layout.pp * layout.stages_per_rank
    counts = stage_layer_counts(cfg, n_stages)
    mine = range(pp_rank, n_stages, layout.pp)
    return _Part(sum(counts[s] for s in mine), 0 in mine, n_stages - 1 in mine, len(mine))


def _part_numel(
    cfg: ModelConfig,
    part: _Part,
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

    n = part.layers * _local_numel(keep(_block_tensors(cfg)), **kw)
    n += _local_numel(_embed_tensors(cfg), **kw) if part.first and not linear_only else 0
    return n + (_local_numel(keep(_head_tensors(cfg)), **kw) if part.last else 0)


def state_bytes(
    work: Workload, layout: Layout, *, pp_rank: int = 0, dp_rank: int = 0
) -> StateBytes:
    """Parameter, gradient and optimizer bytes of the rank at (pp_rank, dp_rank)."""
    part = _rank_part(work.cfg, layout, pp_rank)
    n = _part_numel(work.cfg, part, tp=layout.tp, dp=layout.dp, dp_rank=dp_rank, fsdp=layout.fsdp)
    return StateBytes(FP32 * n, FP32 * n, work.optimizer_bytes_per_param * n)


def state_bytes_by_rank(work: Workload, layout: Layout) -> list[StateBytes]:
    """State of every world rank, in rank order (mesh ("pp", "dp", "tp"), tp innermost)."""
    return [
        state_bytes(
            work, layout, pp_rank=r // (layout.dp * layout.tp), dp_rank=(r // layout.tp) % layout.dp
        )
        for r in range(layout.world)
    ]


# -- activations -------------------------------------------------------------


def layer_activation_bytes_per_token(cfg: ModelConfig, *, tp: int, precision: str) -> int:
    """Bytes one decoder block saves for backward per token (Korthikanti-style, this block).

    Norms run in fp32 and stay whole under TP (no sequence parallelism); under
    bf16 autocast every projection saves its own bf16 copy of its input.
    """
    h, q, f, a = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.ffn_hidden, cfg.n_heads
    kv = cfg.n_kv_heads * cfg.head_dim
    kv_attn = q if cfg.n_heads > cfg.n_kv_heads else kv  # GQA repeats K and V to all heads
    bf16 = precision == "bf16"
    e = 2 if bf16 else FP32
    norm = FP32 * h + FP32 + FP32 * h  # input, 1/rms, normalised (fp32)
    attn_in = 3 * 2 * h if bf16 else FP32 * h  # wq, wk, wv inputs
    ffn_in = 2 * 2 * h if bf16 else FP32 * h  # w1, w3 inputs
    # Rotary embedding saves only its cos/sin table (a buffer, counted once per stage).
    attention = e * (2 * q + 2 * kv_attn) + FP32 * a  # q, k, v, output (= wo input), logsumexp
    ffn = 4 * e * f  # w1 out, silu out, w3 out, product (= w2 input)
    return 2 * norm + attn_in + ffn_in + (attention + ffn) // tp


def _root_activation_bytes_per_token(cfg: ModelConfig, part: _Part, precision: str) -> int:
    out = INT64 if part.first else 0  # embedding indices
    if part.last:
        head_in = 2 * cfg.dim if precision == "bf16" else FP32 * cfg.dim
        out += 2 * FP32 * cfg.dim + FP32 + head_in + FP32 * cfg.vocab_size + INT64
    return out


def in_flight(layout: Layout, pp_rank: int) -> float:
    """Micro-batches whose activations one pp rank holds at its peak (in whole-part units).

    GPipe holds all of them; 1F1B at most pp - rank; interleaved 1F1B holds
    (v - 1) * pp + 2 * (pp - 1 - rank) + 1 chunk-micro-batches of 1/v of the
    part each (torch's warm-up), capped by all of them.
    """
    m, pp = layout.microbatches, layout.pp
    if pp == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    if layout.schedule == "1f1b":
        return float(min(m, pp - pp_rank))
    v = layout.stages_per_rank
    return min(v * m, (v - 1) * pp + 2 * (pp - 1 - pp_rank) + 1) / v


def activation_bytes(
    work: Workload, layout: Layout, *, pp_rank: int = 0, checkpointed: bool = False
) -> int:
    """Activations one rank holds at its peak, with or without full activation checkpointing.

    Checkpointing keeps each block's fp32 input and recomputes one block at a
    time in backward (one block's full activations on top).
    """
    cfg = work.cfg
    part = _rank_part(cfg, layout, pp_rank)
    tokens = work.micro_batch_size * work.seq_len
    layer = layer_activation_bytes_per_token(cfg, tp=layout.tp, precision=work.precision)
    flight = in_flight(layout, pp_rank)
    if checkpointed:
        kept = part.layers * FP32 * cfg.dim * tokens * flight + layer * tokens
    else:
        kept = part.layers * layer * tokens * flight
    # 1F1B runs a micro-batch's backward right after the last stage's forward.
    root_flight = flight if layout.schedule == "gpipe" or layout.pp == 1 else 1
    root = _root_activation_bytes_per_token(cfg, part, work.precision) * tokens * root_flight
    return int(kept + root)


# -- buffers and host ------------------------------------------------------------


def buffer_bytes(work: Workload, layout: Layout, *, pp_rank: int = 0) -> dict[str, int]:
    """Device bytes beyond state and activations, by cause (peak, per rank)."""
    cfg = work.cfg
    part = _rank_part(cfg, layout, pp_rank)
    tokens = work.micro_batch_size * work.seq_len
    cb = work.compute_bytes
    whole = _part_numel(cfg, part, tp=layout.tp)  # this rank's part before FSDP sharding
    block = _local_numel(_block_tensors(cfg), tp=layout.tp, dp=1, dp_rank=0, fsdp=False)
    out = {"rope_table": cfg.max_seq_len * cfg.head_dim * FP32 * part.stages}
    if part.last:
        out["logits_grad"] = FP32 * tokens * cfg.vocab_size
    if layout.pp > 1:
        out["pipeline_p2p"] = 2 * FP32 * cfg.dim * tokens * part.stages
    if layout.fsdp:
        root = whole - part.layers * block
        # ZeRO-3 frees each block after forward (two in flight: current and
        # prefetched); the root stays gathered. Stages 1 and 2 keep all gathered.
        gathered = (root + 2 * block) if layout.zero_stage == 3 else whole
        out["fsdp_all_gather"] = cb * gathered
        out["fsdp_reduce_scatter"] = 2 * FP32 * block
        if work.calls_per_step(layout) > 1:
            out["fsdp_unsharded_grad_accumulation"] = FP32 * whole
    elif work.precision == "bf16":
        # Autocast casts every nn.Linear weight to bf16 and the copy is saved for backward.
        out["autocast_weight_copies"] = 2 * _part_numel(cfg, part, tp=layout.tp, linear_only=True)
    return out


def host_bytes(work: Workload, layout: Layout, state: StateBytes) -> dict[str, int]:
    """Host memory per rank: offloaded state and async-checkpoint staging."""
    out = {}
    if work.on_gpu and layout.fsdp and layout.cpu_offload:
        out["cpu_offload_state"] = state.total
    if work.async_checkpoint:
        out["async_checkpoint_staging"] = state.params + state.optimizer
    return out


def rank_memory(work: Workload, layout: Layout, *, pp_rank: int = 0) -> RankMemory:
    """Memory of the (dp rank 0) rank at ``pp_rank``; dp rank 0 holds the largest chunks."""
    state = state_bytes(work, layout, pp_rank=pp_rank)
    buffers = buffer_bytes(work, layout, pp_rank=pp_rank)
    host = host_bytes(work, layout, state)
    ac = work.activation_checkpointing
    act = activation_bytes(work, layout, pp_rank=pp_rank, checkpointed=ac)
    act_ckpt = activation_bytes(work, layout, pp_rank=pp_rank, checkpointed=True)
    return RankMemory(
        pp_rank=pp_rank,
        state=state,
        activations=act,
        activations_checkpointed=act_ckpt,
        buffers=sum(buffers.values()),
        host=sum(host.values()),
        offloaded=work.on_gpu and layout.fsdp and layout.cpu_offload,
        detail={"buffers": buffers, "host": host},
    )


def worst_rank_memory(work: Workload, layout: Layout) -> RankMemory:
    """The rank with the most device memory (pipeline stages differ; dp and tp ranks do not)."""
    return max(
        (rank_memory(work, layout, pp_rank=r) for r in range(layout.pp)),
        key=lambda m: (m.device_total, m.host),
    )
