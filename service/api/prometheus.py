"""Prometheus metrics of the control plane: the registry, its counters, and the exposition."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric

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


class _ControlLoop:
    """The reconciler's ticks and the CPU they took (this process's), as of the scrape."""

    def __init__(self) -> None:
        self.load: tuple[int, float] = (0, 0.0)

    def collect(self) -> Iterator[Metric]:
        ticks, cpu_s = self.load
        yield CounterMetricFamily(
            "etrain_reconciler_ticks", "Control-loop ticks run by this process", value=ticks
        )
        yield CounterMetricFamily(
            "etrain_reconciler_tick_cpu_seconds",
            "CPU seconds the control loop's ticks took in this process (its own thread)",
            value=cpu_s,
        )


CONTROL_LOOP = _ControlLoop()
REGISTRY.register(CONTROL_LOOP)


class _WithoutJobs:
    """REGISTRY less the per-job families: what an unauthenticated scrape sees."""

    def collect(self) -> Iterator[Metric]:
        hidden = JOB_METRICS.families()
        return (family for family in REGISTRY.collect() if family.name not in hidden)


def render(
    jobs_by_status: Mapping[JobStatus, int],
    *,
    with_jobs: bool,
    loop: tuple[int, float] = (0, 0.0),
) -> bytes:
    """Set the job gauges from a scrape's counts (and the control ``loop``'s ticks and CPU
    seconds) and render the exposition format; the per-job series (job ids, losses) only
    ``with_jobs``."""
    CONTROL_LOOP.load = loop
    for status, count in jobs_by_status.items():
        JOBS.labels(status=status.value).set(count)
    return generate_latest(REGISTRY if with_jobs else _WithoutJobs())  # type: ignore[arg-type]
