"""What the planner sizes: a job's model shape, batch, options (``Workload``) and layout.

Also the parameter tensors of the Llama block of ``workers.models.llama``, as
nn.Linear stores them and as tensor parallelism splits them, and which layers a
pipeline rank holds. Pure Python.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from workers.contract import DDP, DEEPSPEED
from workers.models.config import ModelConfig
from workers.spec.deepspeed import DEEPSPEED_DEFAULTS, DeepSpeedSpec

FP32, INT64 = 4, 8
# etrain's projections by the Hugging Face names LoRA targets use: (etrain name, in, out).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraShape:
    """Low-rank adapters: rank and the projections (Hugging Face names) that get them."""

    rank: int
    targets: tuple[str, ...]

    def adapted(self, name: str) -> bool:
        """Whether projection ``name`` (q_proj ... down_proj) has an adapter."""
        return name in self.targets


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one block, by Hugging Face name."""
    h, q, f = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.ffn_hidden
    kv = cfg.n_kv_heads * cfg.head_dim
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, f),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }


def adapter_numel(cfg: ModelConfig, lora: LoraShape) -> int:
    """Adapter parameters of one block: r * (in + out) per adapted projection."""
    return sum(
        lora.rank * (i + o) for name, (i, o) in linear_shapes(cfg).items() if lora.adapted(name)
    )


@dataclass(frozen=True)
class ZeroOptions:
    """The DeepSpeed options memory depends on, DeepSpeed's defaults filled in."""

    offload_optimizer: bool = False  # to host memory, or to NVMe with nvme_optimizer
    offload_param: bool = False
    nvme_optimizer: bool = False
    nvme_param: bool = False
    reduce_bucket_size: int = DEEPSPEED_DEFAULTS["reduce_bucket_size"]
    overlap_comm: bool | None = None  # DeepSpeed's default: on at stage 3 only
    contiguous_gradients: bool = DEEPSPEED_DEFAULTS["contiguous_gradients"]
    persistence_threshold: int = DEEPSPEED_DEFAULTS["stage3_param_persistence_threshold"]
    prefetch_bucket_size: int = DEEPSPEED_DEFAULTS["stage3_prefetch_bucket_size"]

    @classmethod
    def of(cls, ds: DeepSpeedSpec) -> ZeroOptions:
        """The options of a spec's ``parallelism.deepspeed`` section."""

        def pick(name: str):
            value = getattr(ds, name)
            return DEEPSPEED_DEFAULTS[name] if value is None else value

        return cls(
            offload_optimizer=ds.offload_optimizer != "none",
            offload_param=ds.offload_param != "none",
            nvme_optimizer=ds.offload_optimizer == "nvme",
            nvme_param=ds.offload_param == "nvme",
            reduce_bucket_size=int(pick("reduce_bucket_size")),
            overlap_comm=ds.overlap_comm,
            contiguous_gradients=bool(pick("contiguous_gradients")),
            persistence_threshold=int(pick("stage3_param_persistence_threshold")),
            prefetch_bucket_size=int(pick("stage3_prefetch_bucket_size")),
        )

    def overlaps(self, stage: int) -> bool:
        """Whether the engine overlaps reduction with backward (double reduce buckets)."""
        return stage == 3 if self.overlap_comm is None else self.overlap_comm


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
    zero: ZeroOptions | None = None  # DeepSpeed's options (strategy deepspeed only)

    @property
    def world(self) -> int:
        """Ranks: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 wraps the model (every strategy but DDP does when dp > 1, and with
        CPU offload also on one dp rank: the state then lives in host memory)."""
        if self.strategy == DEEPSPEED:
            return False  # its ZeRO is DeepSpeed's own (service.planner.deepspeed_memory)
        return self.strategy != DDP and (self.dp > 1 or self.cpu_offload)

    @property
    def shards_params(self) -> bool:
        """Whether parameters are sharded over dp and gathered for compute (FSDP, or
        DeepSpeed's ZeRO-3)."""
        return self.fsdp or (self.strategy == DEEPSPEED and self.zero_stage == 3)

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each pp rank holds (two under interleaved 1F1B)."""
        return 2 if self.pp > 1 and self.schedule == "interleaved_1f1b" else 1

    def describe(self) -> str:
        """A short human name: 'fsdp zero3 dp=8', 'hybrid tp=8 pp=4 dp=1'."""
        parts = [self.strategy]
        if self.fsdp:
            parts.append(f"zero{self.zero_stage}" + (" offload" if self.cpu_offload else ""))
        elif self.zero is not None:
            z = self.zero
            offload = [n + ("-nvme" if nvme else "") for n, on, nvme in (
                ("optimizer", self.cpu_offload, z.nvme_optimizer),
                ("param", z.offload_param, z.nvme_param)) if on]  # fmt: skip
            parts.append(f"zero{self.zero_stage}" + "".join(f" offload-{n}" for n in offload))
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
    activation_checkpointing: bool | str = False
    async_checkpoint: bool = False
    lora: LoraShape | None = None
    # objective dpo without LoRA (or with its own reference folder): a frozen copy of the
    # model beside the trained one, laid out like it.
    reference_model: bool = False

    @property
    def recompute(self) -> str:
        """Activation checkpointing mode: none, full or selective (True means full)."""
        ac = self.activation_checkpointing
        return {True: "full", False: "none"}.get(ac, ac)  # type: ignore[arg-type]

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


def block_tensors(cfg: ModelConfig) -> list[tuple[tuple[int, ...], str]]:
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
        *([((q,), "col"), ((kv,), "col"), ((kv,), "col")] if cfg.qkv_bias else []),
    ]


def embed_tensors(cfg: ModelConfig) -> list[tuple[tuple[int, ...], str]]:
    return [((cfg.vocab_size, cfg.dim), "rep")]


def head_tensors(cfg: ModelConfig) -> list[tuple[tuple[int, ...], str]]:
    return [((cfg.dim,), "rep"), ((cfg.vocab_size, cfg.dim), "rep")]


@functools.lru_cache(maxsize=256)
def stage_layer_counts(cfg: ModelConfig, n_stages: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, balanced by parameters as ``workers.strategies.pp`` does.

    The first stage also holds the embedding and the last the final norm and
    head; one layer at a time goes to the currently lightest stage.
    """
    block = sum(math.prod(s) for s, _ in block_tensors(cfg))
    extra = [0] * n_stages
    extra[0] += cfg.vocab_size * cfg.dim
    extra[-1] += cfg.vocab_size * cfg.dim + cfg.dim
    counts = [1] * n_stages
    for _ in range(cfg.n_layers - n_stages):
        lightest = min(range(n_stages), key=lambda s: extra[s] + counts[s] * block)
        counts[lightest] += 1
    return tuple(counts)


@dataclass(frozen=True)
class Part:
    """What one pp rank holds: decoder layers, and whether the embedding / head."""

    layers: int
    first: bool
    last: bool
    stages: int


def rank_part(cfg: ModelConfig, layout: Layout, pp_rank: int) -> Part:
    if layout.pp == 1:
        return Part(cfg.n_layers, True, True, 1)
    n_stages = layout.pp * layout.stages_per_rank
    counts = stage_layer_counts(cfg, n_stages)
    mine = range(pp_rank, n_stages, layout.pp)
    return Part(sum(counts[s] for s in mine), 0 in mine, n_stages - 1 in mine, len(mine))
