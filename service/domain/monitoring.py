"""What the control plane's probes and Prometheus scrapes read about it."""

from __future__ import annotations

from service.backends.base import Backend
from service.domain.job_metrics import JobMetrics
from service.status import JobStatus
from service.store import Stores


class Monitoring:
    """Readiness of the service and the job counts of a scrape."""

    def __init__(self, stores: Stores, backend: Backend, job_metrics: JobMetrics):
        """Probe ``stores`` and ``backend``; prune the per-job series of ``job_metrics``."""
        self.stores, self.backend, self.job_metrics = stores, backend, job_metrics

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

    def scrape(self) -> dict[JobStatus, int]:
        """Jobs by status now; first drops the series of jobs that ended past their grace."""
        self.job_metrics.prune(self.stores.jobs)
        return {status: self.stores.jobs.count_jobs(statuses={status}) for status in JobStatus}
