"""Job lifecycle operations the API calls: submit, read, cancel, telemetry, logs."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, AsyncIterator, get_args

import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

from service.auth import Principal
from service.backends.base import Backend
from service.domain.hardware import cluster_from_nodes
from service.domain.job_metrics import JobMetrics
from service.domain.planning import ClusterSpec, plan_job
from service.domain.states import JobStatus
from service.domain.storage_check import check_checkpoint_storage
from service.errors import BackendUnavailable, Forbidden, InvalidSpec
from service.settings import Settings
from service.store import JobRecord, JobStore
from workers.contract import CheckpointRecord, EventKind, TelemetryBatch
from workers.spec import JobSpec


def _now() -> datetime:
    return datetime.now(timezone.utc)


def parse_body(raw: bytes, content_type: str | None) -> Any:
    """Decode a JSON or YAML request body, or raise InvalidSpec saying where it broke."""
    ct = (content_type or "application/json").split(";")[0].strip().lower()
    try:
        if ct in ("application/yaml", "application/x-yaml", "text/yaml"):
            return yaml.safe_load(raw.decode("utf-8"))
        import json
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidSpec(f"request body is not valid {ct}: {e}",
                          [{"loc": ["body"], "msg": f"malformed {ct}: {e}",
                            "type": "parse_error"}]) from e


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside a field annotation (through Union and Annotated), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)


def _accepted_fields(loc: tuple) -> list[str] | None:
    """Names accepted where the unknown field at ``loc`` was given, or None if unknown."""
    model: Any = JobSpec
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            continue  # a union tag or list index: the same model goes on
        model = _model_in(field.annotation)
        if model is None:
            return None
    return sorted(f.alias or name for name, f in model.model_fields.items())


def _field_errors(e: ValidationError, prefix: list) -> list[dict]:
    """pydantic errors as 422 items; unknown fields also list what is accepted."""
    items = []
    for err in e.errors(include_url=False, include_input=False):
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and (names := _accepted_fields(err["loc"])):
            msg = f"unknown field {err['loc'][-1]!r}; accepted fields: {', '.join(names)}"
        items.append({"loc": [*prefix, *err["loc"]], "msg": msg, "type": err["type"]})
    return items


def validate_spec(data: Any) -> JobSpec:
    """Validate a spec mapping; InvalidSpec carries pydantic's field errors."""
    if not isinstance(data, dict):
        raise InvalidSpec("the job spec must be a mapping",
                          [{"loc": ["body"], "msg": "expected a JSON/YAML object", "type": "type"}])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise InvalidSpec("invalid job spec", _field_errors(e, ["body"])) from e


def job_view(job: JobRecord) -> dict:
    """The public shape of a job (never includes tokens)."""
    d = dataclasses.asdict(job)
    d["status"] = job.status.value
    d["metrics"] = d.pop("latest_metrics")
    d.pop("tenant_id", None)
    return d


class JobService:
    """Domain operations on jobs, authorised per tenant.

    ``job_metrics`` receives the per-job Prometheus series of stored telemetry
    (default: series on a private registry nobody scrapes).
    """

    def __init__(self, store: JobStore, backend: Backend, settings: Settings, *,
                 job_metrics: JobMetrics | None = None):
        self.store, self.backend, self.settings = store, backend, settings
        self.job_metrics = job_metrics or JobMetrics(CollectorRegistry())

    def _scope(self, principal: Principal) -> str | None:
        # Admins operate the service and see every tenant's jobs.
        return None if principal.role == "admin" else principal.tenant_id

    def get(self, principal: Principal, job_id: str) -> JobRecord:
        """A job visible to ``principal`` (404 for other tenants' jobs)."""
        return self.store.get_job(job_id, tenant_id=self._scope(principal))

    def detail(self, principal: Principal, job_id: str) -> dict:
        """The public view of one job plus ``dashboard_links`` (empty before it reaches Ray)."""
        job = self.get(principal, job_id)
        links = self.backend.dashboard_links(job.submission_id) if job.submission_id else {}
        return {**job_view(job), "dashboard_links": links}

    def submit(self, principal: Principal, data: Any) -> JobRecord:
        """Validate, plan and store a job as QUEUED; the scheduler takes it from there."""
        spec = validate_spec(data)
        if spec.checkpoint.storage is None:
            spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(
                update={"storage": self.settings.default_checkpoint_storage})})
        plan = plan_job(spec, cluster=self.cluster_shape())
        if plan["errors"] or not plan["fits"]:
            raise InvalidSpec("the plan for this job has errors",
                              [{"loc": ["body"], "msg": m, "type": "plan"} for m in plan["errors"]])
        check_checkpoint_storage(spec.checkpoint)  # s3:// and gs:// only: a write probe
        return self.store.create_job(
            tenant_id=principal.tenant_id, name=spec.name,
            spec=spec.model_dump(mode="json", by_alias=True),
            min_workers=spec.resources.min_workers, warnings=plan["warnings"])

    def list(self, principal: Principal, *, status: JobStatus | None, limit: int,
             offset: int) -> tuple[list[JobRecord], int]:
        """A page of the caller's jobs, newest first, and the total count."""
        scope, statuses = self._scope(principal), ({status} if status else None)
        return (self.store.list_jobs(tenant_id=scope, statuses=statuses, limit=limit,
                                     offset=offset),
                self.store.count_jobs(tenant_id=scope, statuses=statuses))

    def cancel(self, principal: Principal, job_id: str) -> JobRecord:
        """Cancel a job; cancelling a finished or cancelled job returns it unchanged."""
        for _ in range(5):
            job = self.get(principal, job_id)
            if job.status.terminal:
                return job
            if job.submission_id:
                self.backend.stop(job.submission_id)
            updated = self.store.update_job(
                job_id, expect_status=job.status, status=JobStatus.CANCELLED,
                finished_at=_now(), event=("cancelled", "cancelled by user", None))
            if updated is not None:
                self.store.revoke_job_tokens(job_id)
                return updated
        return self.get(principal, job_id)

    def events(self, principal: Principal, job_id: str, *, after_id: int) -> list:
        """Lifecycle events after ``after_id``."""
        self.get(principal, job_id)
        return self.store.list_events(job_id, after_id=after_id)

    def metrics(self, principal: Principal, job_id: str, *, after_step: int) -> list[dict]:
        """Per-step metrics after ``after_step``."""
        self.get(principal, job_id)
        return self.store.list_metrics(job_id, after_step=after_step)

    def checkpoints(self, principal: Principal, job_id: str) -> list[dict]:
        """Committed checkpoints: step, uri, bytes, ``blocking_s`` (the training loop was
        held) and ``total_s`` (start to commit; ``save_s``, its older name, kept)."""
        self.get(principal, job_id)
        return [{**c, "total_s": c["save_s"]} for c in self.store.list_checkpoints(job_id)]

    def memory(self, principal: Principal, job_id: str) -> dict:
        """The newest per-rank memory report (empty ``ranks`` before the first step)."""
        self.get(principal, job_id)
        latest = self.store.latest_event(job_id, kind=EventKind.MEMORY.value)
        return {"ranks": latest.data["ranks"] if latest else [],
                "measured_at": latest.ts if latest else None}

    def logs(self, principal: Principal, job_id: str) -> str:
        """Logs so far (empty before the job reaches the cluster)."""
        job = self.get(principal, job_id)
        return self.backend.logs(job.submission_id) if job.submission_id else ""

    async def follow_logs(self, principal: Principal, job_id: str) -> AsyncIterator[str]:
        """Stream logs until the job's Ray submission ends."""
        job = self.get(principal, job_id)
        if job.submission_id:
            async for chunk in self.backend.tail_logs(job.submission_id):
                yield chunk

    def ingest_telemetry(self, principal: Principal, job_id: str, batch: dict) -> dict:
        """Store metrics, events and checkpoints posted by a job's workers.

        The job's Prometheus series follow what the store holds afterwards, so a
        replayed batch changes no counter (see ``service.domain.job_metrics``).
        """
        if principal.role != "reporter" or principal.job_id != job_id:
            raise Forbidden("telemetry needs the job's own reporter token")
        try:
            parsed = TelemetryBatch.model_validate(batch)
        except ValidationError as e:
            raise InvalidSpec("invalid telemetry batch", _field_errors(e, ["body"])) from e
        job = self.store.get_job(job_id)
        if job.status.terminal:
            return {"accepted": 0}
        for ev in parsed.events:
            if self._ingest_event(job, ev.model_dump()):
                self.job_metrics.count_event(job_id, ev.kind)
        if parsed.checkpoints:
            self._ingest_checkpoints(job, parsed.checkpoints)
        metrics = [m.model_dump() for m in parsed.metrics]
        if metrics:
            self._ingest_metrics(job, metrics)
        return {"accepted": len(metrics)}

    def _ingest_metrics(self, job: JobRecord, metrics: list[dict]) -> None:
        self.store.upsert_metrics(job.id, metrics)
        fields = {"world_size": int(metrics[-1]["world_size"])}
        if job.status == JobStatus.PENDING:
            fields.update(status=JobStatus.RUNNING, started_at=job.started_at or _now(),
                          event=("started", "workers are training", None))
        updated = self.store.update_job(job.id, expect_status=job.status, **fields)
        # The store keeps the newest point by time, so an old replayed batch leaves it be.
        latest = (updated or self.store.get_job(job.id)).latest_metrics
        if latest:
            self.job_metrics.observe_point(job.id, latest)

    def _ingest_checkpoints(self, job: JobRecord, records: list[CheckpointRecord]) -> None:
        """Store committed checkpoints and forget the ones the cluster's retention deleted
        (each record lists them: the workers decide retention, the service only follows)."""
        for record in records:
            self.store.upsert_checkpoint(job.id, **record.model_dump(exclude={"deleted_steps"}))
            for step in record.deleted_steps:
                self.store.delete_checkpoint(job.id, step)
        kept = self.store.list_checkpoints(job.id)
        if kept:
            self.job_metrics.observe_checkpoint(job.id, kept[-1]["blocking_s"])

    def _ingest_event(self, job: JobRecord, ev: dict) -> bool:
        """Store one event; True when it is new (not a replay of a stored ``dedup_key``)."""
        new = self.store.add_event(job.id, kind=ev["kind"], message=ev["message"],
                                   data=ev.get("data"), dedup_key=ev.get("dedup_key"))
        if new and ev["kind"] == EventKind.WORKER_FAILED:
            current = self.store.get_job(job.id)
            self.store.update_job(job.id, restarts=current.restarts + 1)
        return new

    def plan(self, data: Any) -> dict:
        """Dry run: validate a spec and return its plan."""
        if not isinstance(data, dict) or "spec" not in data:
            raise InvalidSpec("body must be {\"spec\": JobSpec, \"cluster\": {...}}",
                              [{"loc": ["body", "spec"], "msg": "field required",
                                "type": "missing"}])
        spec = validate_spec(data["spec"])
        check_checkpoint_storage(spec.checkpoint)
        try:
            cluster = ClusterSpec.model_validate(data.get("cluster") or {})
        except ValidationError as e:
            raise InvalidSpec("invalid cluster", _field_errors(e, ["body", "cluster"])) from e
        shape = cluster.model_dump(exclude_none=True) if data.get("cluster") else \
            self.cluster_shape()
        return plan_job(spec, cluster=shape)

    def cluster_shape(self) -> dict:
        """Nodes, per-node CPUs, GPUs (and their model) and host memory of the connected
        cluster, as a plan's ``cluster`` (empty if it cannot be reached)."""
        try:
            nodes = self.backend.cluster().nodes
        except BackendUnavailable:
            return {}
        return cluster_from_nodes(nodes)

    def cluster(self) -> dict:
        """Nodes and resources of the connected cluster."""
        return dataclasses.asdict(self.backend.cluster())

