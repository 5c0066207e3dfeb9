"""Layout rules of distributed training, as values. Pure Python.

Candidate layouts for a world size are enumerated (DDP, FSDP per ZeRO stage
and with offload, TP inside a node, PP, and their hybrids), sized with
``memory_model`` and timed with ``step_time``. The recommendation: DDP when
the model state fits one GPU; FSDP when it fits one node; otherwise TP inside
the node (NVLink only) with PP or FSDP across nodes. The checks return
:class:`Finding` values; they never act.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.planner.hardware import GIB, ClusterHardware
from service.planner.memory_model import Layout, RankMemory, Workload, worst_rank_memory
from service.planner.placement import place_job
from service.planner.step_time import COMM_DOMINATES, StepEstimate, estimate_step
from workers.contract import DDP, DEEPSPEED, FSDP, HYBRID, PP, TP

HEADROOM = 0.9  # warn above this share of GPU memory (allocator fragmentation, CUDA context)
ZERO1_AS_ZERO2 = (
    "parallelism.fsdp.zero_stage 1 runs as stage 2: FSDP2 has no "
    "optimizer-state-only mode, so gradients are sharded too (less memory than "
    "ZeRO-1); set zero_stage 2 to make this explicit"
)


@dataclass(frozen=True)
class Finding:
    """One error, warning or note about a plan: the field it concerns and what to change."""

    level: Literal["error", "warning", "note"]
    field: str
    message: str


@dataclass(frozen=True)
class Candidate:
    """A layout with its worst rank's memory, whether it fits, and its estimated step."""

    layout: Layout
    memory: RankMemory
    fits: bool
    step: StepEstimate | None


@dataclass(frozen=True)
class Recommendation:
    """The recommended layout, and why."""

    candidate: Candidate
    reason: str


def gib(n: float) -> str:
    """Bytes as 'x.y GiB'."""
    return f"{n / GIB:.1f} GiB"


def tp_degrees(work: Workload, world: int, max_tp: int) -> list[int]:
    """TP degrees > 1 that divide the world, the heads, KV heads, hidden and FFN sizes."""
    cfg = work.cfg
    sizes = (cfg.n_heads, cfg.n_kv_heads, cfg.dim, cfg.ffn_hidden, world)
    return [t for t in range(2, min(world, max_tp) + 1) if all(s % t == 0 for s in sizes)]


def batch_fits(work: Workload, layout: Layout) -> bool:
    """Whether the global batch splits into whole micro-batches (and schedule rules hold)."""
    if layout.pp > 1:
        if layout.pp * layout.stages_per_rank > work.cfg.n_layers:
            return False
        if layout.schedule == "1f1b" and layout.microbatches < layout.pp:
            return False
        unit = work.micro_batch_size * layout.dp * layout.microbatches
    else:
        unit = work.micro_batch_size * layout.dp
    return work.global_batch_size % unit == 0


def _pp_layout(work: Workload, *, strategy: str, dp: int, tp: int, pp: int) -> Layout | None:
    for m in (4 * pp, 2 * pp, pp):  # more micro-batches, smaller bubble
        layout = Layout(strategy, dp=dp, tp=tp, pp=pp, schedule="1f1b", microbatches=m)
        if batch_fits(work, layout):
            return layout
    return None


def candidate_layouts(work: Workload, world: int, *, max_tp: int) -> list[Layout]:
    """Every layout of ``world`` ranks worth comparing (batch-compatible ones only)."""
    out = [Layout(DDP, dp=world)]
    if world > 1:
        out += [Layout(FSDP, dp=world, zero_stage=3), Layout(FSDP, dp=world, zero_stage=2)]
        if work.on_gpu:
            out.append(Layout(FSDP, dp=world, zero_stage=3, cpu_offload=True))
    for tp in [1, *tp_degrees(work, world, max_tp)]:
        rest = world // tp
        for pp in [p for p in range(1, rest + 1) if rest % p == 0]:
            if tp == pp == 1:
                continue
            strategy = TP if pp == 1 else (PP if tp == 1 else HYBRID)
            layout = (
                Layout(strategy, dp=rest, tp=tp)
                if pp == 1
                else _pp_layout(work, strategy=strategy, dp=rest // pp, tp=tp, pp=pp)
            )
            if layout is not None:
                out.append(layout)
    return [layout for layout in out if batch_fits(work, layout)]


def evaluate(
    work: Workload, layout: Layout, hw: ClusterHardware, *, gpus_per_worker: int
) -> Candidate:
    """Size and time one layout on ``hw`` (fits is True when GPU memory is unknown)."""
    memory = worst_rank_memory(work, layout)
    budget = hw.gpu_memory_bytes if work.on_gpu else None
    placed = place_job(work, layout, hw, gpus_per_worker=gpus_per_worker)  # node by node
    fits = placed.fits if placed else budget is None or memory.device_total <= budget
    return Candidate(
        layout, memory, fits, estimate_step(work, layout, hw, gpus_per_worker=gpus_per_worker)
    )


def _fastest(cands: list[Candidate]) -> Candidate:
    return min(cands, key=lambda c: (c.step.step_s if c.step else 0.0, c.memory.device_total))


def fits_one_node(
    cands: list[Candidate], hw: ClusterHardware, *, workers_per_node: int | None
) -> bool:
    """Whether the model state sharded over one node's GPUs, plus activations, fits a GPU."""
    ddp = next((c for c in cands if c.layout.strategy == DDP), None)
    budget = hw.gpu_memory_bytes
    if ddp is None or budget is None or workers_per_node is None:
        return True
    m = ddp.memory
    return m.state.total / workers_per_node + m.activations <= budget


def recommend(
    cands: list[Candidate], hw: ClusterHardware, *, workers_per_node: int | None
) -> Recommendation | None:
    """The recommended layout among fitting candidates, or None when none fits."""
    fitting = [c for c in cands if c.fits]
    if not fitting:
        return None
    ddp = [c for c in fitting if c.layout.strategy == DDP]
    if ddp:
        return Recommendation(
            ddp[0], "parameters, gradients and optimizer state fit one GPU: plain DDP, no sharding"
        )
    fsdp = [c for c in fitting if c.layout.strategy == FSDP and not c.layout.cpu_offload]
    if fsdp and fits_one_node(cands, hw, workers_per_node=workers_per_node):
        return Recommendation(
            _fastest(fsdp),
            "the model state fits one node's GPUs when sharded: FSDP (ZeRO) over data parallelism",
        )
    nvlink = hw.link is not None and hw.link.is_nvlink
    if nvlink:
        tp_max = max((c.layout.tp for c in fitting), default=1)
        widest = [c for c in fitting if c.layout.tp == tp_max and c.layout.tp > 1]
        if widest:
            return Recommendation(
                _fastest(widest),
                f"TP {tp_max} inside each node over NVLink, "
                "PP or FSDP across nodes, data parallel on top",
            )
    flat = [c for c in fitting if c.layout.tp == 1]
    if flat and not nvlink:
        return Recommendation(
            _fastest(flat),
            "no NVLink: data parallel with ZeRO sharding or pipeline stages, no tensor parallelism",
        )
    return Recommendation(_fastest(fitting), "the fastest layout that fits")


# -- findings about the job's own layout -------------------------------------


def layout_findings(
    layout: Layout, *, tp_unit: float, per_node: float | None, what: str
) -> list[Finding]:
    """TP groups must stay inside one node (consecutive ranks share a node's link)."""
    if layout.tp == 1 or per_node is None or layout.tp * tp_unit <= per_node + 1e-9:
        return []
    return [
        Finding(
            "error",
            "parallelism.tp",
            f"parallelism.tp ({layout.tp}) x {what.lower()} per worker ({tp_unit:g}) = "
            f"{layout.tp * tp_unit:g} {what} would span nodes of {per_node:g} {what}; TP "
            f"must stay inside one node: reduce parallelism.tp to <= "
            f"{int(per_node // tp_unit)}",
        )
    ]


def zero_stage_findings(layout: Layout) -> list[Finding]:
    """A warning when ZeRO stage 1 is asked of FSDP, which runs it as stage 2 (DeepSpeed
    runs its own stage 1)."""
    if layout.strategy in (DDP, DEEPSPEED) or layout.zero_stage != 1:
        return []
    return [Finding("warning", "parallelism.fsdp.zero_stage", ZERO1_AS_ZERO2)]


def bucket_findings(job: Candidate, work: Workload) -> list[Finding]:
    """A warning when DeepSpeed's reduce bucket, whose size does not follow the model's,
    outweighs the state it reduces (5e8 elements unless set: 1.9 GiB per rank)."""
    zero, bucket = job.layout.zero, job.memory.detail["buffers"].get("deepspeed_reduce_bucket")
    if zero is None or not bucket or bucket <= max(job.memory.state.total, 256 * 2**20):
        return []
    suggested = work.cfg.dim * work.cfg.dim  # what Hugging Face's "auto" sets
    return [
        Finding(
            "warning",
            "parallelism.deepspeed.reduce_bucket_size",
            f"DeepSpeed's reduce bucket of {zero.reduce_bucket_size:.3g} elements takes "
            f"{gib(bucket)} per rank, more than the model state it reduces "
            f"({job.memory.state.total / 2**20:.0f} MiB); set "
            f"parallelism.deepspeed.reduce_bucket_size to about {suggested} (hidden size "
            'squared, as Hugging Face\'s "auto" does)',
        )
    ]


def fit_findings(
    job: Candidate,
    rec: Recommendation | None,
    hw: ClusterHardware,
    *,
    smaller_batch: Candidate | None,
) -> list[Finding]:
    """Errors when the job does not fit its GPU; warnings when it barely does."""
    budget = hw.gpu_memory_bytes
    if budget is None:
        return []
    m = job.memory
    total = m.device_total
    if total > budget:
        s = m.device_state
        parts = (
            f"model state {gib(s.total)} (params {gib(s.params)}, grads {gib(s.grads)}, "
            f"optimizer {gib(s.optimizer)}) + activations {gib(m.activations)} + buffers "
            f"{gib(m.buffers)}"
        )
        head = (
            f"{job.layout.describe()} needs {gib(total)} per rank: {parts}, but the "
            f"smallest GPU has {gib(budget)}"
        )
        return [Finding("error", "parallelism", f"{head}; {fit_fix(job, rec, smaller_batch)}")]
    if total > HEADROOM * budget:
        return [headroom_warning(job, total, budget)]
    return []


def headroom_warning(job: Candidate, total: int, budget: int) -> Finding:
    """A rank that fits its GPU with too little room left."""
    return Finding(
        "warning",
        "train.micro_batch_size",
        f"{job.layout.describe()} uses {gib(total)} of {gib(budget)} per GPU "
        f"(> {HEADROOM:.0%}); the allocator and CUDA context need headroom: "
        "reduce train.micro_batch_size or shard more",
    )


def fit_fix(job: Candidate, rec: Recommendation | None, smaller_batch: Candidate | None) -> str:
    """What to change when ``job`` does not fit: the recommended layout, a smaller
    micro-batch, or the ways to need less memory."""
    m = job.memory
    if rec is not None:
        lay = rec.candidate.layout
        return (
            f"set parallelism.strategy {lay.strategy!r}, tp {lay.tp}, pp {lay.pp} "
            f"(dp {lay.dp}"
            + (f", fsdp.zero_stage {lay.zero_stage}" if lay.fsdp else "")
            + (", fsdp.cpu_offload true" if lay.cpu_offload else "")
            + (f", pipeline 1f1b x {lay.microbatches}" if lay.pp > 1 else "")
            + f"): {gib(rec.candidate.memory.device_total)} per rank"
        )
    if smaller_batch is not None and smaller_batch.fits:
        return (
            f"reduce train.micro_batch_size to 1 ({gib(smaller_batch.memory.device_total)}"
            " per rank)"
        )
    return (
        f"no layout of {job.layout.world} workers fits: reduce train.micro_batch_size "
        f"or data.seq_len, add workers, set model.activation_checkpointing full "
        f"(activations {gib(m.activations_checkpointed)}), train LoRA adapters "
        f"(model.lora), or use a smaller model"
    )


def waste_findings(
    job: Candidate, cands: list[Candidate], hw: ClusterHardware, *, workers_per_node: int | None
) -> list[Finding]:
    """Warnings for parallelism a fitting job does not need."""
    lay = job.layout
    ddp = next((c for c in cands if c.layout.strategy == DDP), None)
    out = []
    if lay.strategy != DDP and ddp is not None and ddp.fits and hw.gpu_memory_bytes:
        faster = (
            f" (estimated step {ddp.step.step_s:.3g} s instead of {job.step.step_s:.3g} s)"
            if ddp.step and job.step
            else ""
        )
        out.append(
            Finding(
                "warning",
                "parallelism.strategy",
                f"parallelism.strategy {lay.strategy!r} is not needed: parameters, "
                f"gradients and optimizer state ({gib(ddp.memory.state.total)}) plus "
                f"activations fit one GPU ({gib(ddp.memory.device_total)} of "
                f"{gib(hw.gpu_memory_bytes)}); set parallelism.strategy 'ddp'{faster}",
            )
        )
    elif lay.tp * lay.pp > 1 and hw.gpu_memory_bytes:
        fsdp = next(
            (c for c in cands if c.layout.strategy == FSDP and c.fits and not c.layout.cpu_offload),
            None,
        )
        if fsdp is not None and fits_one_node(cands, hw, workers_per_node=workers_per_node):
            out.append(
                Finding(
                    "warning",
                    "parallelism.strategy",
                    f"parallelism tp {lay.tp} x pp {lay.pp} is not needed: the model "
                    f"fits one node sharded with FSDP ({gib(fsdp.memory.device_total)}"
                    " per rank); set parallelism.strategy 'fsdp', tp 1, pp 1",
                )
            )
    return out


def hardware_findings(job: Candidate, hw: ClusterHardware) -> list[Finding]:
    """No NVLink under TP, mixed GPU sizes, communication-bound layouts."""
    out, lay = [], job.layout
    if lay.tp > 1 and hw.link is not None and not hw.link.is_nvlink:
        share = job.step.comm_by_group.get("tp", 0) / job.step.step_s if job.step else None
        out.append(
            Finding(
                "warning",
                "parallelism.tp",
                f"parallelism.tp ({lay.tp}) without NVLink: TP all-reduces every "
                f"layer over {hw.link.name} ({hw.link.gbps:g} GB/s)"
                + (f", about {share:.0%} of the step" if share is not None else "")
                + "; prefer data parallelism or ZeRO: set parallelism.strategy "
                "'fsdp' and tp 1",
            )
        )
    if hw.heterogeneous:
        sizes = sorted({s / GIB for s in hw.gpu_memory_sizes})
        out.append(
            Finding(
                "warning",
                "resources.gpus_per_worker",
                f"GPUs of different memory ({', '.join(f'{s:g}' for s in sizes)} GiB): "
                f"every rank is planned at the smallest ({sizes[0]:g} GiB), so "
                f"{sizes[-1] - sizes[0]:g} GiB of the larger GPUs stay unused; run on "
                "one GPU model to use them",
            )
        )
    if job.step and job.step.comm_share > COMM_DOMINATES:
        worst = max(job.step.comm_by_group, key=job.step.comm_by_group.get)
        out.append(
            Finding(
                "warning",
                f"parallelism.{worst}",
                f"communication dominates: an estimated {job.step.comm_share:.0%} of "
                f"the {job.step.step_s:.3g} s step, most of it in the {worst} group; "
                "reduce parallelism." + worst + " or raise train.micro_batch_size",
            )
        )
    return out


def accumulation_finding(job: Candidate, work: Workload) -> list[Finding]:
    """FSDP with gradient accumulation keeps unsharded gradients between micro-batches."""
    held = job.memory.detail["buffers"].get("fsdp_unsharded_grad_accumulation", 0)
    if not held or held < 0.1 * job.memory.device_total:
        return []
    lay, calls = job.layout, work.calls_per_step(job.layout)
    per_call = work.micro_batch_size * (lay.microbatches if lay.pp > 1 else 1)
    workers = work.global_batch_size // per_call * lay.tp * lay.pp
    return [
        Finding(
            "warning",
            "resources.workers",
            f"FSDP with {calls} micro-batches per step keeps unsharded gradients "
            f"({gib(held)} per rank) until the last one; set resources.workers to "
            f"{workers} (one micro-batch per step per rank), or use a layout with "
            "dp 1 (tp x pp = workers), which holds no unsharded gradients",
        )
    ]
