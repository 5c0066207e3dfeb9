"""Telemetry from a job's workers: metrics, events and checkpoints, stored idempotently.

A reporter retries a batch it is not sure was stored, so every part is safe to
store twice: metric points replace the same step, events de-duplicate on
``dedup_key``, checkpoints replace the same step. The job's Prometheus series
follow what the store holds afterwards, so a replayed batch changes no counter.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from service.auth import Principal
from service.domain.job_metrics import JobMetrics
from service.domain.states import change_status
from service.domain.validation import field_errors
from service.errors import Forbidden, InvalidSpec
from service.status import JobStatus
from service.store import JobRecord, Stores
from workers.contract import (
    CheckpointRecord,
    EventKind,
    MetricPoint,
    TelemetryBatch,
    TelemetryEvent,
)


class TelemetryIngest:
    """Stores the batches a job's reporter posts (with the job's own reporter token)."""

    def __init__(self, stores: Stores, job_metrics: JobMetrics):
        """Store into ``stores``; keep the per-job series of ``job_metrics`` in step."""
        self.stores, self.job_metrics = stores, job_metrics

    def ingest(self, principal: Principal, job_id: str, data: Any) -> int:
        """Validate and store one batch; returns the metric points accepted (0 once the job
        ended: late telemetry is dropped)."""
        if principal.role != "reporter" or principal.job_id != job_id:
            raise Forbidden("telemetry needs the job's own reporter token")
        try:
            batch = TelemetryBatch.model_validate(data)
        except ValidationError as e:
            raise InvalidSpec(
                "invalid telemetry batch", field_errors(e, ["body"], root=TelemetryBatch)
            ) from e
        job = self.stores.jobs.get_job(job_id)
        if job.status.terminal:
            return 0
        for event in batch.events:
            if self._event(job, event):
                self.job_metrics.count_event(job_id, event.kind)
        if batch.checkpoints:
            self._checkpoints(job, batch.checkpoints)
        if batch.metrics:
            self._metrics(job, batch.metrics)
        return len(batch.metrics)

    def _metrics(self, job: JobRecord, points: list[MetricPoint]) -> None:
        """Store the points; the first ones of a PENDING job mean its workers are training."""
        self.stores.metrics.upsert_metrics(job.id, [p.model_dump() for p in points])
        fields: dict[str, Any] = {"world_size": points[-1].world_size}
        if job.status == JobStatus.PENDING:
            updated = change_status(
                self.stores.jobs,
                job,
                JobStatus.RUNNING,
                started_at=job.started_at or datetime.now(UTC),
                event=(EventKind.STARTED, "workers are training", None),
                **fields,
            )
        else:
            updated = self.stores.jobs.update_job(job.id, expect_status=job.status, **fields)
        # The store keeps the newest point by time, so an old replayed batch leaves it be.
        latest = (updated or self.stores.jobs.get_job(job.id)).latest_metrics
        if latest:
            self.job_metrics.observe_point(job.id, latest)

    def _checkpoints(self, job: JobRecord, records: list[CheckpointRecord]) -> None:
        """Store committed checkpoints and forget the ones the cluster's retention deleted
        (each record lists them: the workers decide retention, the service only follows)."""
        store = self.stores.metrics
        for record in records:
            store.upsert_checkpoint(job.id, **record.model_dump(exclude={"deleted_steps"}))
            for step in record.deleted_steps:
                store.delete_checkpoint(job.id, step)
        kept = store.list_checkpoints(job.id)
        if kept:
            self.job_metrics.observe_checkpoint(job.id, kept[-1]["blocking_s"])

    def _event(self, job: JobRecord, event: TelemetryEvent) -> bool:
        """Store one event; True when it is new (not a replay of a stored ``dedup_key``)."""
        new = self.stores.events.add_event(
            job.id,
            kind=event.kind,
            message=event.message,
            data=event.data,
            dedup_key=event.dedup_key,
        )
        if new and event.kind == EventKind.WORKER_FAILED:
            current = self.stores.jobs.get_job(job.id)
            self.stores.jobs.update_job(job.id, restarts=current.restarts + 1)
        return new
