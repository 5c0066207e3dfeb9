"""Prometheus metrics of the control plane: the registry, its counters, and the exposition."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from service.domain.job_metrics import JobMetrics
from service.status import JobStatus

REGISTRY = CollectorRegistry()
SUBMITTED = Counter("etrain_jobs_submitted", "Jobs accepted by POST /v1/jobs", registry=REGISTRY)
TELEMETRY_POINTS = Counter(
    "etrain_telemetry_points", "Per-step metric points ingested", registry=REGISTRY
)
JOBS = Gauge("etrain_jobs", "Jobs by status", ["status"], registry=REGISTRY)
# Per-job series (step time, throughput, world size, loss, restarts, resizes, checkpoint
# blocking), set by the domain as it stores telemetry.
JOB_METRICS = JobMetrics(REGISTRY)


def render(jobs_by_status: Mapping[JobStatus, int]) -> bytes:
    """Set the job gauges from a scrape's counts and render the exposition format."""
    for status, count in jobs_by_status.items():
        JOBS.labels(status=status.value).set(count)
    return generate_latest(REGISTRY)
