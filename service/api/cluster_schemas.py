"""The connected cluster as ``GET /v1/cluster`` answers it: nodes, queue, warm standbys."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from service.api.schemas import View
from service.planner.hardware import gpu_memory_of


class GpuPublic(BaseModel):
    """One GPU device of a node."""

    name: str | None = Field(None, description="The device's model, e.g. NVIDIA H100 80GB HBM3.")
    memory_mb: int | None = Field(None, description="Its memory in MB.")


class NodePublic(BaseModel):
    """A node of the cluster and its resources."""

    node_id: str | None
    ip: str | None
    is_head: bool
    resources: dict[str, float] = Field(description="The node's total Ray resources.")
    available: dict[str, float] = Field(
        default_factory=dict, description="What is free on the node now (Ray resources)."
    )
    gpus: list[GpuPublic] = Field(
        default_factory=list, description="Its GPU devices, as Ray's reporter agent sees them."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="The node's Ray labels; etrain.io/gpu-memory-gb gives its GPUs' memory "
        "in GiB where Ray cannot read it.",
    )

    @cached_property
    def _gpu_memory(self) -> tuple[float, str] | None:
        """What :func:`gpu_memory_of` finds for this node; both fields below read it."""
        return gpu_memory_of(
            {
                "resources": self.resources,
                "gpus": [g.model_dump() for g in self.gpus],
                "labels": self.labels,
            }
        )

    @computed_field(
        description="Memory of each of its GPUs in GiB as plans count it (the "
        "smallest device's); null without GPUs or when unknown."
    )
    @property
    def gpu_memory_gb(self) -> float | None:
        memory = self._gpu_memory
        return None if memory is None else memory[0]

    @computed_field(
        description="Where gpu_memory_gb comes from: device (Ray's reporter "
        "read it), label (etrain.io/gpu-memory-gb) or type (the planner's table "
        "for its accelerator type)."
    )
    @property
    def gpu_memory_source(self) -> Literal["device", "label", "type"] | None:
        memory = self._gpu_memory
        return None if memory is None else memory[1]  # type: ignore[return-value]


class QueuedJobPublic(View):
    """A queued job's place in the scheduling order, and why it waits."""

    job_id: str | None = Field(description="Null for another tenant's job.")
    name: str | None = Field(description="Null for another tenant's job.")
    tenant: str | None = Field(description="Null for another tenant's job.")
    position: int = Field(description="1 = the job the scheduler takes up first.")
    reason: str | None = Field(
        description="Why it waits (the scheduler's own words); null for another tenant's job."
    )


class WarmBudgetPublic(View):
    """The warm pool's budget (ETRAIN_WARM_POOL_*; unset parts sized to the head node)."""

    processes: int | None = Field(description="Processes the standby drivers may hold.")
    memory_bytes: int | None = Field(description="Host memory (PSS) they may hold.")
    idle_s: float = Field(description="Seconds without a job after which they stop.")


class StandbyPublic(View):
    """The job drivers the service keeps started and warm ahead of the next jobs."""

    configured: int = Field(description="How many it keeps (ETRAIN_STANDBY_DRIVERS).")
    idle: int = Field(description="Started and waiting for a job, warm or still warming.")
    warm: int = Field(description="Of them, those warmed up: a job handed to one skips its start.")
    busy: int = Field(0, description="Running a job: each takes the next job after it.")
    processes: int = Field(
        0, description="Processes the standbys hold: each its own, Ray Train's 3 and its workers'."
    )
    budget: WarmBudgetPublic | None = Field(
        None, description="What they may hold together (null until the head node is known)."
    )
    shrunk: bool = Field(
        False,
        description="Stopped after budget.idle_s without a job: the next job starts cold and "
        "brings them back.",
    )
    memory_bytes: int = Field(
        description="Host memory the warm ones hold: each driver's process and the worker "
        "and Ray Train processes it started ahead (PSS on Linux: pages shared between them, "
        "such as torch's libraries, counted once), as each measured it at its latest ask "
        "for a job (every 20 s at most)."
    )


class ClusterPublic(View):
    """Nodes and resources of the connected cluster, its queue, and its warm standbys."""

    nodes: list[NodePublic]
    total: dict[str, float]
    available: dict[str, float]
    dashboard_url: str | None
    queue: list[QueuedJobPublic] = Field(
        description="Queued jobs in the order the scheduler takes them up, with why each "
        "waits; another tenant's jobs appear as anonymous entries (admins see all)."
    )
    standby: StandbyPublic | None = Field(
        None, description="Standby job drivers; null when the service keeps none."
    )
    gpu_nodes: list[dict] | None = Field(
        None,
        description="The GPU nodes as plans see them (cluster.gpu_nodes: name, gpus, "
        "gpu_memory_gb), when their GPUs differ in memory: a plan places each rank on a "
        "GPU that holds it; null when every GPU node is the same or none is known.",
    )
