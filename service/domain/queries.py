"""What a caller may read about jobs: one job, pages of them, their telemetry, logs, goodput.

Every read is scoped to the caller's tenant (admins see every tenant's jobs),
and another tenant's job reads as absent (404), so ids cannot be probed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from service.auth import Principal
from service.backends.base import Backend
from service.domain.goodput import Goodput, compute_goodput
from service.domain.planned_memory import PlannedMemory
from service.status import JobStatus
from service.store import EventRecord, JobRecord, JobStore, Stores
from workers.checkpoint.retention import best_steps
from workers.contract import EventKind


def scope(principal: Principal) -> str | None:
    """The tenant whose jobs ``principal`` sees; None (every tenant) for admins."""
    # Admins operate the service and see every tenant's jobs.
    return None if principal.role == "admin" else principal.tenant_id


def visible_job(jobs: JobStore, principal: Principal, job_id: str) -> JobRecord:
    """A job visible to ``principal``; JobNotFound (404) for other tenants' jobs."""
    return jobs.get_job(job_id, tenant_id=scope(principal))


@dataclass(frozen=True)
class JobDetail:
    """A job and the links to its pages in the Ray dashboard, by name."""

    job: JobRecord
    dashboard_links: dict[str, str]
    dashboard_token_hint: str | None = None


@dataclass(frozen=True)
class MemoryReport:
    """The newest per-rank memory report of a job, and when it was measured."""

    ranks: list[dict]
    measured_at: datetime | None
    planned: dict[str, int] | None = None


class JobQueries:
    """Reads of jobs and what they reported, authorised per tenant."""

    def __init__(self, stores: Stores, backend: Backend, *, token_hint: str | None = None):
        """Read from ``stores``; logs and dashboard links come from ``backend``;
        ``token_hint`` says where the Ray dashboard's sign-in token is (no secret)."""
        self.stores, self.backend, self.token_hint = stores, backend, token_hint
        self.planned = PlannedMemory()

    def get(self, principal: Principal, job_id: str) -> JobRecord:
        """A job visible to ``principal`` (404 for other tenants' jobs)."""
        return visible_job(self.stores.jobs, principal, job_id)

    def detail(self, principal: Principal, job_id: str) -> JobDetail:
        """One job plus its dashboard links (none before it reaches Ray)."""
        job = self.get(principal, job_id)
        links = self.backend.dashboard_links(job.submission_id) if job.submission_id else {}
        return JobDetail(job, links, self.token_hint if links else None)

    def list(
        self, principal: Principal, *, status: JobStatus | None, limit: int, offset: int
    ) -> tuple[list[JobRecord], int]:
        """A page of the caller's jobs, newest first, and the total count."""
        tenant, statuses = scope(principal), ({status} if status else None)
        return self.stores.jobs.page_jobs(
            tenant_id=tenant, statuses=statuses, limit=limit, offset=offset
        )

    def events(self, principal: Principal, job_id: str, *, after_id: int) -> list[EventRecord]:
        """Lifecycle events after ``after_id``."""
        self.get(principal, job_id)
        return self.stores.events.list_events(job_id, after_id=after_id)

    def metrics(self, principal: Principal, job_id: str, *, after_step: int) -> list[dict]:
        """Per-step metrics after ``after_step``."""
        self.get(principal, job_id)
        return self.stores.metrics.list_metrics(job_id, after_step=after_step)

    def checkpoints(self, principal: Principal, job_id: str) -> list[dict]:
        """Committed checkpoints: step, uri, bytes, ``blocking_s`` (the training loop was
        held), ``total_s`` (start to commit; ``save_s``, its older name, kept), ``eval_loss``
        (its step's held-out loss, if it evaluated) and ``best``: the one with the lowest
        eval_loss (the retention rule's ranking; a tie goes to the earlier step)."""
        self.get(principal, job_id)
        stored = self.stores.metrics.list_checkpoints(job_id)
        losses = {c["step"]: c.get("eval_loss") for c in stored}
        best = best_steps(losses, losses, 1)
        return [{**c, "total_s": c["save_s"], "best": c["step"] in best} for c in stored]

    def memory(self, principal: Principal, job_id: str) -> MemoryReport:
        """The newest per-rank memory report (empty ``ranks`` before the first step) and
        what the planner predicts for the worst rank at the job's current world size."""
        job = self.get(principal, job_id)
        world = job.world_size or job.min_workers
        planned = self.planned.of(job.id, job.spec, world, tenant=job.tenant_id)
        latest = self.stores.events.latest_event(job_id, kind=EventKind.MEMORY)
        if latest is None:
            return MemoryReport(ranks=[], measured_at=None, planned=planned)
        ranks = (latest.data or {}).get("ranks", [])
        return MemoryReport(ranks=ranks, measured_at=latest.ts, planned=planned)

    def logs(self, principal: Principal, job_id: str) -> str:
        """Logs so far (empty before the job reaches the cluster)."""
        job = self.get(principal, job_id)
        return self.backend.logs(job.submission_id) if job.submission_id else ""

    def follow_logs(self, principal: Principal, job_id: str) -> AsyncIterator[str]:
        """Stream logs until the job's Ray submission ends; 404 before the stream starts."""
        job = self.get(principal, job_id)
        return self._tail(job.submission_id)

    async def _tail(self, submission_id: str | None) -> AsyncIterator[str]:
        if submission_id:
            async for chunk in self.backend.tail_logs(submission_id):
                yield chunk

    def goodput(self, principal: Principal, job_id: str, *, now: datetime | None = None) -> Goodput:
        """The goodput of a job ``principal`` may see, from everything it stored."""
        job = self.get(principal, job_id)
        events: list[EventRecord] = []
        while batch := self.stores.events.list_events(
            job_id, after_id=events[-1].id if events else 0
        ):
            events += batch
        metrics: list[dict] = []
        while batch := self.stores.metrics.list_metrics(
            job_id, after_step=metrics[-1]["step"] if metrics else -1
        ):
            metrics += batch
        return compute_goodput(
            job=job,
            events=events,
            metrics=metrics,
            checkpoints=self.stores.metrics.list_checkpoints(job_id),
            now=now or datetime.now(UTC),
        )
