"""The pre-flight planner: memory per rank, layout rules, step estimates, a verdict.

``plan_job`` runs on every submit and on ``POST /v1/plan``. It sizes the
job's own layout (``memory_model``), compares it with every other layout of
the same workers (``layout_rules``, timed by ``step_time`` on the GPUs of
``hardware``), and answers with errors (the job cannot run: refused with 422)
and warnings (it runs, but wastefully: stored on the job). Imports no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

import service.planner.layout_rules as rules
from service.planner.hardware import GIB, ClusterHardware, resolve_cluster
from service.planner.memory_model import Layout, LoraShape, Workload
from service.planner.placement import Placement, PlacementView, place_job, summary
from service.planner.plan import (
    Breakdown,
    CandidateView,
    ClusterView,
    DataParallel,
    PerRank,
    Plan,
    PlanLayout,
    RecommendedLayout,
    StepEstimateView,
)
from service.planner.workload import ZeroOptions
from workers.contract import DEEPSPEED
from workers.models.config import ModelConfig, count_params, get_model_config
from workers.spec import JobSpec

__all__ = ["GIB", "ClusterSpec", "Plan", "layout_of", "plan_job", "workload_of"]
METHOD = (
    "tensor-by-tensor state of this build (fp32 params and grads, AdamW 2 x fp32), "
    "saved-for-backward activations of the Llama block (flash attention), FSDP and "
    "pipeline buffers; step time from dense peak x 0.4 MFU plus ring collectives"
)
ACTIVATIONS_NOTE = (
    "activation estimates (none, full and selective recompute, LoRA) match measured live "
    "activations on CPU within 10% for ddp, fsdp and tp; pipeline measurements are "
    "bounds only, and GPU numbers are unverified (docs/planner.md)"
)


# GiB of one GPU: bounded so memory arithmetic stays finite (a 422, not an overflow).
_GpuMemory = Annotated[float, Field(gt=0, le=4096)]


class GpuNodeSpec(BaseModel):
    """Nodes of one kind in a cluster described node by node (``cluster.gpu_nodes``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, max_length=128, description="What the plan calls it.")
    count: int = Field(1, ge=1, le=100_000, description="Nodes of this kind.")
    gpus: int = Field(1, ge=1, le=64, description="GPUs per node.")
    gpu: str | None = Field(None, max_length=128, description="GPU model (as cluster.gpu).")
    gpu_memory_gb: _GpuMemory | None = Field(
        None, description="Memory of one of its GPUs in GiB (default: the model's)."
    )


class ClusterSpec(BaseModel):
    """The hypothetical cluster of a dry run (POST /v1/plan ``cluster``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    nodes: int | None = Field(None, ge=1, le=100_000, description="Nodes.")
    gpus_per_node: int | None = Field(None, ge=0, le=64, description="GPUs per node.")
    gpu: str | list[str] | None = Field(
        None,
        description="GPU model (h100, h200, a100, l40s, rtx4090, rtx3060, ...); a list "
        "for a cluster with several kinds.",
    )
    gpu_memory_gb: _GpuMemory | list[_GpuMemory] | None = Field(
        None,
        description="Memory of one GPU in GiB (overrides the table); a list for GPUs of "
        "different sizes: the plan uses the smallest.",
    )
    interconnect: str | None = Field(
        None,
        description="GPU link inside a node: nvlink3, nvlink4, nvlink5, pcie3, pcie4, "
        "pcie5 (nvlink = nvlink4, pcie = pcie4); default: the GPU model's usual link.",
    )
    network: str | None = Field(
        None,
        description="Link between nodes: ib-hdr, ib-ndr, ib-xdr, ethernet-10g/25g/100g/"
        "400g; default: the GPU model's usual network.",
    )
    cpus_per_node: float | None = Field(None, gt=0, le=65_536, description="CPUs per node.")
    host_memory_gb: float | None = Field(
        None, gt=0, le=1_048_576, description="Host memory per node in GiB."
    )
    gpu_nodes: list[GpuNodeSpec] | None = Field(
        None,
        max_length=1024,
        description="The cluster node by node, for nodes whose GPUs differ (two 24 GiB "
        "cards and one 12 GiB card, say): each rank is placed on a GPU that holds it, "
        "and the plan's placement says where, which ranks bound the layout and which "
        "nodes hold none. Sets gpu_memory_gb, nodes and gpus_per_node when they are left "
        "out.",
    )


def workload_of(spec: JobSpec, model_config: ModelConfig | None = None) -> Workload:
    """The slice of ``spec`` memory and step time depend on.

    ``model_config``: the real shape of a pretrained model (``model.hf``'s
    config.json, read by the service); without it, the preset's.
    """
    t, lora = spec.train, spec.model.lora
    # A DPO item is a pair: two sequences (chosen, rejected) per sample of the batch.
    rows = 2 if spec.objective == "dpo" else 1
    own_reference = spec.dpo is not None and spec.dpo.reference_folder is not None
    return Workload(
        cfg=model_config or get_model_config(spec.model.preset),
        seq_len=spec.data.seq_len,
        micro_batch_size=t.micro_batch_size * rows,
        global_batch_size=t.global_batch_size * rows,
        reference_model=spec.objective == "dpo" and (lora is None or own_reference),
        precision=t.precision,
        optimizer=t.optimizer,
        momentum=t.momentum,
        on_gpu=spec.resources.gpus_per_worker > 0,
        activation_checkpointing=spec.model.activation_checkpointing,
        async_checkpoint=spec.checkpoint.async_,
        lora=LoraShape(lora.rank, tuple(lora.target_modules)) if lora is not None else None,
    )


def layout_of(spec: JobSpec, world: int) -> Layout:
    """The job's own layout at ``world`` workers."""
    par = spec.parallelism
    zero_stage, offload, zero = par.fsdp.zero_stage, par.fsdp.cpu_offload, None
    if par.strategy == DEEPSPEED:
        zero = ZeroOptions.of(par.deepspeed)
        zero_stage, offload = par.deepspeed.zero_stage, zero.offload_optimizer
    return Layout(
        par.strategy,
        dp=spec.data_parallel_size(world),
        tp=par.tp,
        pp=par.pp,
        zero_stage=zero_stage,
        cpu_offload=offload,
        schedule=par.pipeline.schedule,
        microbatches=par.pipeline.microbatches,
        zero=zero,
    )


def _per_node(spec: JobSpec, hw: ClusterHardware) -> tuple[float | None, float, str]:
    """(devices per node, devices per worker, their name) the TP rule counts in.

    A GPU job on a cluster without GPUs counts in unknown nodes (None), not in
    nodes of 0 GPUs: the rules cannot size layouts for GPUs that are not there.
    """
    res = spec.resources
    if res.gpus_per_worker:
        return hw.gpus_per_node or None, res.gpus_per_worker, "GPUs"
    return hw.cpus_per_node, res.cpus_per_worker, "CPUs"


def cannot_tell(spec: JobSpec, hw: ClusterHardware) -> str | None:
    """Why the planner cannot tell whether ``spec`` fits ``hw`` (None when it can).

    A GPU job is sized against the memory of its GPUs; without it (no cluster
    described, or a cluster with no GPUs) "fits" would be a guess.
    """
    if not spec.resources.gpus_per_worker or hw.gpu_memory_bytes is not None:
        return None
    where = (
        "the cluster has no GPUs"
        if hw.gpus_per_node == 0
        else "the GPUs' model and memory are unknown"
    )
    return (
        f"cannot tell whether the job fits: it needs GPUs but {where}; plan it for the "
        "cluster it will run on: `etrain plan SPEC --gpu h100 --gpus-per-node 8 --nodes N` "
        "or `--cluster FILE` (POST /v1/plan with cluster.gpu or cluster.gpu_memory_gb)"
    )


def _static_findings(
    spec: JobSpec, hw: ClusterHardware, layout: Layout, cluster_errors: list[str]
) -> list[rules.Finding]:
    out = [rules.Finding("error", "cluster", e) for e in cluster_errors]
    per_node, unit, what = _per_node(spec, hw)
    out += rules.layout_findings(layout, tp_unit=unit, per_node=per_node, what=what)
    return out + rules.zero_stage_findings(layout)


def _capacity_findings(
    spec: JobSpec, hw: ClusterHardware, job: rules.Candidate, workers_per_node: int | None
) -> list[rules.Finding]:
    """Host memory per node (offload, async staging) and GPUs the cluster does not have."""
    out = []
    if job.memory.host and hw.host_memory_bytes and workers_per_node:
        need = job.memory.host * workers_per_node
        if need > hw.host_memory_bytes:
            causes = " and ".join(job.memory.detail["host"])
            out.append(
                rules.Finding(
                    "error",
                    "parallelism.fsdp.cpu_offload",
                    f"{causes} need {rules.gib(need)} of host memory per node "
                    f"({rules.gib(job.memory.host)} per rank x {workers_per_node} ranks) but "
                    "nodes have "
                    f"{rules.gib(hw.host_memory_bytes)}; set parallelism.fsdp.cpu_offload false or "
                    "checkpoint.async false, or spread the workers over more nodes",
                )
            )
    gpus = spec.resources.min_workers * spec.resources.gpus_per_worker
    have = (hw.nodes or 0) * (hw.gpus_per_node or 0)
    if gpus and hw.nodes and hw.gpus_per_node == 0:
        out.append(
            rules.Finding(
                "warning",
                "resources.gpus_per_worker",
                f"the job needs {gpus} GPUs but the cluster has none now; it waits until GPU "
                "nodes join (an autoscaling cluster adds them)",
            )
        )
    elif gpus and hw.nodes and hw.gpus_per_node is not None and gpus > have:
        out.append(
            rules.Finding(
                "warning",
                "resources.workers",
                f"the job needs {gpus} GPUs but the cluster has {have} "
                f"({hw.nodes} nodes x {hw.gpus_per_node}); it waits until the "
                f"cluster grows, or set resources.workers to <= "
                f"{have // spec.resources.gpus_per_worker}",
            )
        )
    return out


def _rank_key(c: rules.Candidate) -> tuple:
    """Fitting first, then fastest (or smallest when step time is unknown)."""
    return (not c.fits, c.step.step_s if c.step else 0.0, c.memory.device_total)


def plan_job(
    spec: JobSpec, *, cluster: dict | None = None, model_config: ModelConfig | None = None
) -> Plan:
    """Plan ``spec`` on ``cluster`` (a :class:`ClusterSpec` mapping; empty: unknown hardware).

    ``model_config`` is the shape of ``model.hf`` (see ``service.domain.model_source``).
    The job is planned at its minimum worker count. ``fits`` is False when
    there is any error; ``recommendation`` names the strategy of the layout the
    rules recommend for these workers (``recommended_layout`` has the rest).
    """
    hw, cluster_errors = resolve_cluster(cluster or {})
    work, world = workload_of(spec, model_config), spec.resources.min_workers
    layout = layout_of(spec, world)
    per_node, unit, _ = _per_node(spec, hw)
    workers_per_node = int(per_node // unit) if per_node else None
    gpw = spec.resources.gpus_per_worker
    job = rules.evaluate(work, layout, hw, gpus_per_worker=gpw)
    cands = [
        c
        for c in (
            rules.evaluate(work, lay, hw, gpus_per_worker=gpw)
            for lay in rules.candidate_layouts(work, world, max_tp=workers_per_node or world)
        )
        if c.layout != layout
    ] + [job]
    unknown = cannot_tell(spec, hw)
    rec = None if unknown else rules.recommend(cands, hw, workers_per_node=workers_per_node)
    placed = place_job(work, layout, hw, gpus_per_worker=gpw)
    findings = _findings(
        spec, hw, work, (job, placed), cands, rec, cluster_errors, workers_per_node
    )
    errors = [f.message for f in findings if f.level == "error"]
    return Plan(
        fits=False if errors else (None if unknown else True),
        verdict="does not fit" if errors else ("unknown" if unknown else "fits"),
        unknown_reason=unknown,
        num_params=count_params(work.cfg),
        per_rank=PerRank.of(job),
        breakdown=Breakdown.of(job, work, hw, workers_per_node),
        layout=PlanLayout(
            strategy=spec.parallelism.strategy,
            workers=spec.resources.workers,
            dp=layout.dp,
            data_parallel=DataParallel.of(spec),
            tp=layout.tp,
            pp=layout.pp,
            grad_accum_steps=spec.grad_accum_steps(world),
        ),
        step_estimate=StepEstimateView.of(job.step) if job.step else None,
        cluster=ClusterView.of(hw),
        candidates=_candidate_views(cands, known=unknown is None),
        warnings=[f.message for f in findings if f.level == "warning"],
        errors=errors,
        notes=[ACTIVATIONS_NOTE],
        recommendation=rec.candidate.layout.strategy if rec else None,
        recommended_layout=RecommendedLayout.of(rec) if rec else None,
        placement=PlacementView.of(placed) if placed else None,
        method=METHOD,
    )


def _candidate_views(cands: list[rules.Candidate], *, known: bool) -> list[CandidateView]:
    """The candidates as rows, best first, each row once; ``fits`` null when unknown."""
    rows: list[CandidateView] = []
    for c in sorted(cands, key=_rank_key):
        view = CandidateView.of(c)
        if not known:
            view = view.model_copy(update={"fits": None})
        if view not in rows:
            rows.append(view)
    return rows


def _findings(
    spec: JobSpec,
    hw: ClusterHardware,
    work: Workload,
    placed_job: tuple[rules.Candidate, Placement | None],
    cands: list[rules.Candidate],
    rec: rules.Recommendation | None,
    cluster_errors: list[str],
    workers_per_node: int | None,
) -> list[rules.Finding]:
    """Everything the rules say about the job's layout on this hardware (placed on its
    nodes' GPUs when the cluster is described node by node)."""
    job, placed = placed_job
    gpw = spec.resources.gpus_per_worker
    smaller = (
        rules.evaluate(
            dataclasses.replace(work, micro_batch_size=1), job.layout, hw, gpus_per_worker=gpw
        )
        if work.micro_batch_size > 1
        else None
    )
    findings = _static_findings(spec, hw, job.layout, cluster_errors)
    if placed is not None:
        findings += _placement_findings(job, placed, rec, smaller)
        # The sizes the ranks run on, as the rules below read them: all of them when every
        # rank needs the same (the smallest bounds data parallelism), else one size.
        even = placed.fits and len(set(placed.needs)) == 1
        used = placed.used_sizes() if even else (hw.gpu_memory_bytes,)
        hw = dataclasses.replace(hw, gpu_memory_sizes=used)
    else:
        findings += rules.fit_findings(
            job, rec, hw if work.on_gpu else ClusterHardware(), smaller_batch=smaller
        )
    if work.on_gpu:
        findings += rules.waste_findings(job, cands, hw, workers_per_node=workers_per_node)
        findings += rules.hardware_findings(job, hw)
        findings += rules.accumulation_finding(job, work)
    findings += rules.bucket_findings(job, work)
    return findings + _capacity_findings(spec, hw, job, workers_per_node)


def _placement_findings(
    job: rules.Candidate,
    placed: Placement,
    rec: rules.Recommendation | None,
    smaller: rules.Candidate | None,
) -> list[rules.Finding]:
    """The job's ranks on the GPUs of a cluster described node by node: an error when a
    rank has no GPU that holds it; warnings for a rank with too little room left, and
    for nodes whose GPUs hold no rank of the job."""
    if not placed.fits:
        return [
            rules.Finding(
                "error",
                "parallelism",
                f"{job.layout.describe()} cannot put every rank on a GPU that holds it: "
                f"{summary(placed)}; {rules.fit_fix(job, rec, smaller)}",
            )
        ]
    worst = max(range(len(placed.needs)), key=lambda r: placed.needs[r] / placed.gpu_bytes(r))
    need, have = placed.needs[worst], placed.gpu_bytes(worst)
    out = [rules.headroom_warning(job, need, have)] if need > rules.HEADROOM * have else []
    small = min(placed.needs)
    idle = [n for n in placed.nodes if n.memory_bytes < small]
    if idle:
        names = ", ".join(f"{n.name} ({rules.gib(n.memory_bytes)})" for n in idle)
        out.append(
            rules.Finding(
                "warning",
                "resources.gpus_per_worker",
                f"the GPUs of {names} cannot hold a rank of {job.layout.describe()} (the "
                f"smallest needs {rules.gib(small)}): its ranks run on the other nodes",
            )
        )
    return out
