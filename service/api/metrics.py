"""Prometheus metrics of the control plane."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from service.domain.job_metrics import JobMetrics
from service.domain.states import JobStatus
from service.store import JobStore

REGISTRY = CollectorRegistry()
SUBMITTED = Counter("etrain_jobs_submitted", "Jobs accepted by POST /v1/jobs",
                    registry=REGISTRY)
TELEMETRY_POINTS = Counter("etrain_telemetry_points", "Per-step metric points ingested",
                           registry=REGISTRY)
JOBS = Gauge("etrain_jobs", "Jobs by status", ["status"], registry=REGISTRY)
# Per-job series (step time, throughput, world size, loss, restarts, resizes, checkpoint
# blocking), set by the domain as it stores telemetry.
JOB_METRICS = JobMetrics(REGISTRY)


def render(store: JobStore) -> bytes:
    """Refresh the job gauges, drop ended jobs' series, and render the exposition format."""
    for status in JobStatus:
        JOBS.labels(status=status.value).set(store.count_jobs(statuses={status}))
    JOB_METRICS.prune(store)
    return generate_latest(REGISTRY)
