"""What a plan says, as typed values: the answer of ``plan_job`` and of ``POST /v1/plan``.

Each part is built from the planner's internal values (:class:`Candidate`,
:class:`StepEstimate`, :class:`ClusterHardware`) by its ``of`` constructor; the
JSON of a :class:`Plan` is what the API returns.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, Field

from service.planner.hardware import GIB, ClusterHardware
from service.planner.layout_rules import Candidate, Recommendation
from service.planner.memory_model import FP32, Workload
from service.planner.placement import PlacementView
from service.planner.step_time import StepEstimate
from service.planner.workload import adapter_numel
from workers.models.config import count_params
from workers.spec import JobSpec, WorkerRange


def _unknown(value: object) -> bool:
    """Whether a candidate's step field is left out (its GPU's throughput is unknown)."""
    return value is None


class PerRank(BaseModel):
    """Device bytes of the job's worst rank, by kind."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    buffers_bytes: int
    total_bytes: int = Field(description="Sum of the five above.")

    @classmethod
    def of(cls, job: Candidate) -> PerRank:
        """The per-rank bytes of ``job`` (state on the host under CPU offload is not counted)."""
        m, s = job.memory, job.memory.device_state
        parts = {
            "params_bytes": s.params,
            "grads_bytes": s.grads,
            "optimizer_bytes": s.optimizer,
            "activations_bytes": m.activations,
            "buffers_bytes": m.buffers,
        }
        return cls(**parts, total_bytes=sum(parts.values()))


class StateBytesPerParam(BaseModel):
    """Bytes of state per parameter, by kind."""

    params: int
    grads: int
    optimizer: int


class Breakdown(BaseModel):
    """How the per-rank numbers come about, and the host memory they need."""

    layout: str = Field(description="The job's layout, e.g. 'fsdp zero3 dp=8'.")
    worst_pp_rank: int = Field(description="Pipeline rank the numbers are for.")
    state_bytes_per_param: StateBytesPerParam
    state_bytes: int
    state_offloaded_to_host: bool
    unsharded_state_bytes: int = Field(description="State of the whole model on one rank.")
    activations_checkpointed_bytes: int = Field(
        description="Activations with full activation checkpointing."
    )
    activation_checkpointing: str = Field(description="none, full or selective.")
    lora_trainable_params: int | None = Field(
        None, description="Adapter parameters with LoRA (everything else is frozen)."
    )
    buffers: dict[str, int] = Field(description="Buffer bytes by cause.")
    host: dict[str, int] = Field(description="Host bytes per rank by cause.")
    host_bytes: int
    host_bytes_per_node: int | None
    disk_bytes: int = Field(
        0, description="Bytes per rank swapped to the NVMe offload folder (DeepSpeed nvme)."
    )
    gpu_memory_bytes: int | None = Field(description="Memory of the smallest GPU, if known.")
    micro_batches_per_step: int

    @classmethod
    def of(
        cls, job: Candidate, work: Workload, hw: ClusterHardware, workers_per_node: int | None
    ) -> Breakdown:
        """The breakdown of ``job`` on ``hw``."""
        m, n = job.memory, count_params(work.cfg)
        return cls(
            layout=job.layout.describe(),
            worst_pp_rank=m.pp_rank,
            state_bytes_per_param=StateBytesPerParam(
                params=FP32, grads=FP32, optimizer=work.optimizer_bytes_per_param
            ),
            state_bytes=m.state.total,
            state_offloaded_to_host=m.offloaded,
            unsharded_state_bytes=n * (2 * FP32 + work.optimizer_bytes_per_param),
            activations_checkpointed_bytes=m.activations_checkpointed,
            activation_checkpointing=work.recompute,
            lora_trainable_params=(
                work.cfg.n_layers * adapter_numel(work.cfg, work.lora) if work.lora else None
            ),
            buffers=m.detail["buffers"],
            host=m.detail["host"],
            host_bytes=m.host,
            host_bytes_per_node=m.host * workers_per_node if workers_per_node else None,
            disk_bytes=m.disk,
            gpu_memory_bytes=hw.gpu_memory_bytes if work.on_gpu else None,
            micro_batches_per_step=work.calls_per_step(job.layout),
        )


class DataParallel(BaseModel):
    """The data-parallel degree, workers / (tp x pp): one value for a fixed-size job; an
    elastic job trains at any size of its range that keeps the layout, so at ``min`` with
    the fewest workers, ``max`` with the most, and ``current`` at the size it runs at."""

    min: int = Field(description="At resources.workers' minimum (the fewest workers).")
    max: int = Field(description="At resources.workers' maximum (= min for a fixed size).")
    current: int | None = Field(
        description="At the job's newest reported world size; null in a plan and before "
        "the job reports a step."
    )

    @classmethod
    def of(cls, spec: JobSpec, world_size: int | None = None) -> DataParallel:
        """The degrees of ``spec``, and at ``world_size`` when given: the one place the
        API, the report and the pages take them from."""
        res = spec.resources
        return cls(
            min=spec.data_parallel_size(res.min_workers),
            max=spec.data_parallel_size(res.max_workers),
            current=None if world_size is None else spec.data_parallel_size(world_size),
        )


class PlanLayout(BaseModel):
    """The job's own layout at its minimum worker count."""

    strategy: str
    workers: int | WorkerRange = Field(description="resources.workers as given.")
    dp: int = Field(description="At the minimum worker count (data_parallel.min).")
    data_parallel: DataParallel
    tp: int
    pp: int
    grad_accum_steps: int


class StepEstimateView(BaseModel):
    """Estimated seconds per optimizer step (rounded), and the communication share."""

    step_s: float
    compute_s: float
    comm_s: float
    comm_share: float
    comm_s_by_group: dict[str, float] = Field(description="Seconds by group: tp, dp, pp, offload.")

    @classmethod
    def of(cls, est: StepEstimate) -> StepEstimateView:
        """The rounded view of ``est``."""
        return cls(
            step_s=round(est.step_s, 6),
            compute_s=round(est.compute_s, 6),
            comm_s=round(est.comm_s, 6),
            comm_share=round(est.comm_share, 4),
            comm_s_by_group={k: round(v, 6) for k, v in est.comm_by_group.items()},
        )


class ClusterView(BaseModel):
    """The hardware the plan was made for (unknown parts are null)."""

    nodes: int | None
    gpus_per_node: int | None
    cpus_per_node: float | None
    gpu_names: list[str]
    gpu_memory_sizes: list[int]
    bf16_tflops: float | None
    link: str | None
    network: str | None
    host_memory_bytes: int | None
    gpu_memory_bytes: int | None

    @classmethod
    def of(cls, hw: ClusterHardware) -> ClusterView:
        """The view of resolved hardware (links by name)."""
        fields = {f.name: getattr(hw, f.name) for f in dataclasses.fields(hw)}
        return cls(
            **{
                **fields,
                "link": hw.link.name if hw.link else None,
                "network": hw.network.name if hw.network else None,
                "gpu_memory_bytes": hw.gpu_memory_bytes,
            }
        )


class CandidateView(BaseModel):
    """One layout of the same workers: memory per rank, fit, and (GPU known) its step."""

    layout: str
    strategy: str
    dp: int
    tp: int
    pp: int
    total_gib: float = Field(description="Device memory of its worst rank, GiB.")
    fits: bool | None = Field(description="Null when the GPUs' memory is unknown.")
    step_s: float | None = Field(None, exclude_if=_unknown)
    compute_s: float | None = Field(None, exclude_if=_unknown)
    comm_s: float | None = Field(None, exclude_if=_unknown)
    comm_share: float | None = Field(None, exclude_if=_unknown)
    comm_s_by_group: dict[str, float] | None = Field(None, exclude_if=_unknown)

    @classmethod
    def fields_of(cls, c: Candidate) -> dict:
        """The candidate fields of ``c``."""
        step = StepEstimateView.of(c.step).model_dump() if c.step else {}
        return {
            "layout": c.layout.describe(),
            "strategy": c.layout.strategy,
            "dp": c.layout.dp,
            "tp": c.layout.tp,
            "pp": c.layout.pp,
            "total_gib": round(c.memory.device_total / GIB, 2),
            "fits": c.fits,
            **step,
        }

    @classmethod
    def of(cls, c: Candidate) -> CandidateView:
        """The view of ``c``."""
        return cls(**cls.fields_of(c))


class RecommendedLayout(CandidateView):
    """The layout the rules recommend for these workers, why, and its options."""

    reason: str
    zero_stage: int | None = Field(description="FSDP ZeRO stage (null without FSDP).")
    cpu_offload: bool
    microbatches: int | None = Field(description="Pipeline micro-batches (null without PP).")

    @classmethod
    def of(cls, rec: Recommendation) -> RecommendedLayout:
        """The view of ``rec``."""
        lay = rec.candidate.layout
        return cls(
            **cls.fields_of(rec.candidate),
            reason=rec.reason,
            zero_stage=lay.zero_stage if lay.fsdp else None,
            cpu_offload=lay.cpu_offload,
            microbatches=lay.microbatches if lay.pp > 1 else None,
        )


class Plan(BaseModel):
    """A job's plan: whether it fits, its memory per rank, layout, estimates and findings."""

    fits: bool | None = Field(
        description="False when there is any error; null when the planner cannot tell "
        "(a GPU job without known GPU memory: see unknown_reason)."
    )
    verdict: Literal["fits", "does not fit", "unknown"] = Field(
        description="fits / does not fit / unknown, as `fits` is true / false / null."
    )
    unknown_reason: str | None = Field(
        None, description="Why the planner cannot tell, and what to give it (verdict unknown)."
    )
    num_params: int
    per_rank: PerRank
    breakdown: Breakdown
    layout: PlanLayout
    step_estimate: StepEstimateView | None = Field(description="Null without a known GPU.")
    cluster: ClusterView
    candidates: list[CandidateView] = Field(description="Fitting first, then fastest.")
    warnings: list[str] = Field(description="It runs, but wastefully; stored on the job.")
    errors: list[str] = Field(description="It cannot run; a submit is refused with 422.")
    notes: list[str]
    recommendation: str | None = Field(description="Strategy of recommended_layout.")
    recommended_layout: RecommendedLayout | None
    placement: PlacementView | None = Field(
        None,
        description="Where each rank goes on a cluster described node by node "
        "(cluster.gpu_nodes, or the connected cluster's GPU nodes); null otherwise.",
    )
    method: str = Field(description="How the numbers are estimated.")
