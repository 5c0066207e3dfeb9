"""Response bodies of the REST API, as typed models: ``/openapi.json`` documents each.

A model whose fields have the names of what the domain returns is a ``View``:
``model_validate`` reads those attributes. The others build themselves with
``of``. The routes return the model and FastAPI serializes it (timestamps as
ISO 8601 UTC).
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime
from typing import Any, Literal

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator
from pydantic_core import PydanticCustomError

from service.auth import RESERVED_TENANTS
from service.domain.queries import JobDetail as Detail
from service.planner.plan import DataParallel
from service.status import JobStatus
from service.store import JobRecord
from workers.contract import MetricPoint
from workers.spec import JobSpec

JSON = "application/json"


class View(BaseModel):
    """A response read from a domain value's attributes of the same names."""

    model_config = ConfigDict(from_attributes=True)


class JobPublic(BaseModel):
    """A job as its tenant sees it (never a token, never its tenant id)."""

    id: str
    name: str
    status: JobStatus
    spec: JobSpec = Field(description="The validated spec, checkpoint storage filled in.")
    min_workers: int
    world_size: int | None = Field(description="Workers in the newest reported step.")
    data_parallel: DataParallel = Field(
        description="The data-parallel degree at the fewest and most workers, and at "
        "world_size (what the pages and etrain report show)."
    )
    restarts: int = Field(description="Worker-group restarts inside the Ray job.")
    resubmits: int = Field(description="Times the whole Ray job was resubmitted.")
    step: int = Field(description="Newest reported step.")
    submission_id: str | None
    dashboard_url: str | None
    error: str | None
    warnings: list[str] | None = Field(description="The plan's warnings at submission.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    metrics: MetricPoint | None = Field(description="The newest reported step's metrics.")

    @classmethod
    def fields_of(cls, job: JobRecord) -> dict[str, Any]:
        """The public fields of a stored job."""
        return {
            "id": job.id,
            "name": job.name,
            "status": job.status,
            "spec": job.spec,
            "min_workers": job.min_workers,
            "world_size": job.world_size,
            "data_parallel": DataParallel.of(job.spec, job.world_size),
            "restarts": job.restarts,
            "resubmits": job.resubmits,
            "step": job.step,
            "submission_id": job.submission_id,
            "dashboard_url": job.dashboard_url,
            "error": job.error,
            "warnings": job.warnings,
            "created_at": job.created_at,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "updated_at": job.updated_at,
            "metrics": None if job.latest_metrics is None else MetricPoint(**job.latest_metrics),
        }

    @classmethod
    def of(cls, job: JobRecord) -> JobPublic:
        """The public view of ``job``, its fields typed as they are stored: not validated
        again (pydantic would run JobSpec's model validators for every job of a page)."""
        return cls.model_construct(**cls.fields_of(job))


class JobDetail(JobPublic):
    """A job with links to its pages in the Ray dashboard."""

    dashboard_links: dict[str, str] = Field(
        description="By name: job (the Ray job page), train_runs (Ray Train's run list); "
        "empty before the job reaches Ray."
    )
    dashboard_token_hint: str | None = Field(
        description="Where the token the Ray dashboard asks for is (a file path or a "
        "Secret's name, never the token); null without links or without Ray token auth."
    )

    @classmethod
    def of_detail(cls, detail: Detail) -> JobDetail:
        """The public view of a job and its links."""
        return cls(
            **cls.fields_of(detail.job),
            dashboard_links=detail.dashboard_links,
            dashboard_token_hint=detail.dashboard_token_hint,
        )


class JobPage(BaseModel):
    """One page of jobs, newest first, and how many match in all."""

    items: list[JobPublic]
    total: int


class JobPages:
    """``JobPage`` bodies built from each job's JSON, kept as of the job's ``updated_at``
    (a job's row, and so its view, changes only with it). Building and serializing the
    50 views of a page anew was two thirds of a list's CPU in this process, for jobs that
    mostly had not changed since the last list. Used on the event loop (one thread)."""

    _VIEW = TypeAdapter(JobPublic)

    def __init__(self, size: int = 10_000):
        """Keep the JSON of the ``size`` jobs listed last."""
        self._size = size
        self._json: OrderedDict[str, tuple[datetime, bytes]] = OrderedDict()

    def view_json(self, job: JobRecord) -> bytes:
        """``JobPublic.of(job)`` as FastAPI writes it."""
        kept = self._json.get(job.id)
        if kept is not None and kept[0] == job.updated_at:
            self._json.move_to_end(job.id)
            return kept[1]
        body = self._VIEW.dump_json(JobPublic.of(job), by_alias=True)
        self._json[job.id] = (job.updated_at, body)
        if len(self._json) > self._size:
            self._json.popitem(last=False)
        return body

    def response(self, job: JobRecord, status_code: int = 200) -> Response:
        """The JSON response of ``JobPublic.of(job)``."""
        return Response(self.view_json(job), status_code=status_code, media_type=JSON)

    def page(self, jobs: list[JobRecord], total: int) -> Response:
        """The JSON response of ``JobPage(items=[JobPublic.of(j) ...], total=total)``."""
        items = b",".join(self.view_json(job) for job in jobs)
        return Response(b'{"items":[%b],"total":%d}' % (items, total), media_type=JSON)


class EventPublic(View):
    """A lifecycle event of a job."""

    id: int = Field(description="Increasing; page with ?after_id=.")
    job_id: str
    ts: datetime
    kind: str = Field(description="A workers.contract.EventKind value.")
    message: str
    data: dict[str, Any] | None
    dedup_key: str | None


class EventPage(BaseModel):
    """Events in order."""

    items: list[EventPublic]


class StoredMetricPoint(MetricPoint):
    """A stored training step: as the workers reported it, with ``ts`` as a time."""

    ts: datetime = Field(description="When the step ended.")
    world_size: int | None = Field(None, description="Workers in the group that ran the step.")


class MetricPage(BaseModel):
    """Per-step metrics, ascending by step."""

    items: list[StoredMetricPoint]


class CheckpointPublic(BaseModel):
    """A committed checkpoint."""

    job_id: str
    step: int
    uri: str
    bytes: int
    save_s: float = Field(description="Older name of total_s.")
    blocking_s: float | None = Field(description="Seconds the training loop was held.")
    created_at: datetime
    total_s: float = Field(description="Seconds from the start of the save to its commit.")
    eval_loss: float | None = Field(
        None, description="The held-out loss of its weights, when its step evaluated."
    )
    best: bool = Field(
        False,
        description="The job's best checkpoint: the lowest eval_loss of those stored (a tie: "
        "the earlier step); what `etrain export --best` exports.",
    )


class CheckpointPage(BaseModel):
    """Committed checkpoints, ascending by step."""

    items: list[CheckpointPublic]


class PlannedMemoryPublic(BaseModel):
    """Device bytes the planner predicts for the job's worst rank."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    reference_bytes: int = Field(0, description="A DPO job's frozen reference model.")
    vae_bytes: int = Field(0, description="A diffusion job's VAE (frozen).")
    text_encoder_bytes: int = Field(0, description="A diffusion job's text encoder (frozen).")
    total_bytes: int = Field(description="The planner's total (its buffers included).")


class MemoryPublic(View):
    """Per-rank memory the workers measured at their latest start, and the plan's."""

    ranks: list[dict[str, Any]] = Field(
        description="One per rank: bytes of params, grads, optimizer state, activations, "
        "gathered params, DeepSpeed's reduce buckets, the objective's frozen parts "
        "(reference, vae, text_encoder) and the peak, by name (``*_bytes``)."
    )
    measured_at: datetime | None
    planned: PlannedMemoryPublic | None = Field(
        description="What the planner predicts for this job's layout at its current world "
        "size (its worst rank); null when the model cannot be sized now."
    )


class GoodputBreakdown(BaseModel):
    """Seconds of the wall time that were not productive, by cause."""

    startup_s: float
    waiting_s: float
    checkpoint_blocking_s: float
    eval_s: float = Field(description="Held-out evaluations (outside every step's time).")
    restart_restore_s: float
    recomputed_s: float
    other_s: float


class GoodputPublic(View):
    """Productive training time over wall time, and where the rest went."""

    wall_s: float
    productive_s: float
    goodput: float = Field(description="productive_s / wall_s.")
    breakdown: GoodputBreakdown
    steps: int
    recomputed_steps: int
    notes: list[str] = Field(description="Which parts are estimates.")


class TokenRequest(BaseModel):
    """A new user token for a tenant."""

    tenant: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][-a-z0-9]*$",
        description="Tenant name (created if new); 'admin' is reserved.",
    )
    name: str = Field("token", max_length=64, description="A label for the token.")

    @field_validator("tenant")
    @classmethod
    def _not_reserved(cls, tenant: str) -> str:
        if tenant in RESERVED_TENANTS:
            raise PydanticCustomError(
                "reserved_tenant",
                "tenant '{tenant}' is reserved: the service's admin token belongs to it; "
                "choose another tenant name (an admin token already acts for every tenant)",
                {"tenant": tenant},
            )
        return tenant


class TokenPublic(BaseModel):
    """A new API token; shown only in this answer."""

    id: str = Field(description="The token's id (for DELETE /v1/tokens/{token_id}).")
    tenant: str
    name: str
    token: str


class TokenInfo(BaseModel):
    """A live API token, without its secret (only a hash of it is stored)."""

    id: str
    tenant: str
    name: str
    role: str = Field(description="admin or user.")
    created_at: datetime


class TokenPage(BaseModel):
    """Live user and admin tokens, oldest first."""

    items: list[TokenInfo]


class TelemetryAccepted(BaseModel):
    """What a telemetry post stored."""

    accepted: int = Field(description="Metric points stored (0 once the job ended).")


class Health(BaseModel):
    """The process answers."""

    status: str = "ok"


class Ready(BaseModel):
    """The store and the backend answer."""

    status: str = "ready"
    ready_for_fast_start: bool = Field(
        False,
        description="A warm standby driver is idle: a job submitted now skips the start of "
        "its driver, Ray Train's controller and its workers (a script that wants warm-speed "
        "starts waits for true). False while the standbys warm up or run jobs, and always "
        "without standby drivers (ETRAIN_STANDBY_DRIVERS=0).",
    )
    role: Literal["single", "leader", "follower"] = Field(
        "single",
        description="single: the one process of a SQLite store; leader: runs the scheduler "
        "and the reconciler; follower: serves the API, takes over if the leader stops.",
    )
    leader: str | None = Field(None, description="The leading replica (null: single, or none).")


class NotReady(BaseModel):
    """The store or the backend does not answer."""

    status: str = "unavailable"
    reason: str = Field(
        description="The failure's type name, or why the backend cannot accept a job now."
    )
