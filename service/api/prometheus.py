"""Prometheus metrics of the control plane: the registry, its counters, and the exposition."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric

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


class _WithoutJobs:
    """REGISTRY less the per-job families: what an unauthenticated scrape sees."""

    def collect(self) -> Iterator[Metric]:
        hidden = JOB_METRICS.families()
        return (family for family in REGISTRY.collect() if family.name not in hidden)


def render(jobs_by_status: Mapping[JobStatus, int], *, with_jobs: bool) -> bytes:
    """Set the job gauges from a scrape's counts and render the exposition format; the
    per-job series (job ids, losses) only ``with_jobs``."""
    for status, count in jobs_by_status.items():
        JOBS.labels(status=status.value).set(count)
    return generate_latest(REGISTRY if with_jobs else _WithoutJobs())  # type: ignore[arg-type]
