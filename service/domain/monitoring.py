"""What the control plane's probes and Prometheus scrapes read about it."""

from __future__ import annotations

from service.backends.base import Backend
from service.domain.job_metrics import JobMetrics
from service.domain.leadership import LEASE, Leadership
from service.domain.reconciler import Reconciler
from service.status import JobStatus
from service.store import Stores


class Monitoring:
    """Readiness of the service and the job counts of a scrape."""

    def __init__(
        self,
        stores: Stores,
        backend: Backend,
        job_metrics: JobMetrics,
        leadership: Leadership | None = None,
        loop: Reconciler | None = None,
    ):
        """Probe ``stores`` and ``backend``; prune the per-job series of ``job_metrics``;
        say which replica leads (``leadership``; None: a single process) and what its
        control ``loop`` spent."""
        self.stores, self.backend, self.job_metrics = stores, backend, job_metrics
        self.leadership, self.loop = leadership, loop

    def role(self) -> tuple[str, str | None]:
        """This replica's part in the control loop (``single``: the one process on SQLite;
        ``leader``; ``follower``), and the leader's name (None: single, or no replica leads
        now)."""
        lead = self.leadership
        if lead is None or lead.single:
            return "single", None
        if lead.leads():
            return "leader", lead.holder
        held = lead.leases.holder(LEASE) if lead.leases else None
        return "follower", held.holder if held else None

    def not_ready(self) -> str | None:
        """Why the service cannot serve now (the store's failure's type name, or why the
        backend cannot accept a job); None when the store answers and a job could start."""
        try:
            self.stores.ping()
        except Exception as e:  # noqa: BLE001 - any failure means not ready
            return type(e).__name__
        return self.backend.not_ready()

    def ready_for_fast_start(self) -> bool:
        """Whether a job submitted now would start at warm speed: an idle standby driver has
        warmed up (``service.backends.standby``)."""
        pool = self.backend.standby
        return pool is not None and pool.status().warm > 0

    def loop_load(self) -> tuple[int, float]:
        """The control loop's ticks in this process, and the CPU seconds they took."""
        return (0, 0.0) if self.loop is None else (self.loop.ticks, self.loop.tick_cpu_s)

    def scrape(self) -> dict[JobStatus, int]:
        """Jobs by status now; first drops the series of jobs that ended past their grace."""
        self.job_metrics.prune(self.stores.jobs)
        return {status: self.stores.jobs.count_jobs(statuses={status}) for status in JobStatus}
