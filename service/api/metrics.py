"""Prometheus metrics of the control plane."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from service.domain.states import JobStatus
from service.store import JobStore

REGISTRY = CollectorRegistry()
SUBMITTED = Counter("etrain_jobs_submitted", "Jobs accepted by POST /v1/jobs",
                    registry=REGISTRY)
TELEMETRY_POINTS = Counter("etrain_telemetry_points", "Per-step metric points ingested",
                           registry=REGISTRY)
JOBS = Gauge("etrain_jobs", "Jobs by status", ["status"], registry=REGISTRY)


def render(store: JobStore) -> bytes:
    """Refresh the job gauges from the store and render the exposition format."""
    for status in JobStatus:
        JOBS.labels(status=status.value).set(store.count_jobs(statuses={status}))
    return generate_latest(REGISTRY)
