"""What a user may do to a running job: cancel it."""

from __future__ import annotations

from datetime import UTC, datetime

from service.auth import Principal
from service.backends.base import Backend
from service.domain.queries import visible_job
from service.domain.states import change_status
from service.status import JobStatus
from service.store import JobRecord, Stores
from workers.contract import EventKind

# Cancel re-reads and retries this often when the reconciler moves the job meanwhile.
CANCEL_ATTEMPTS = 5


class Lifecycle:
    """User-initiated status changes, authorised per tenant."""

    def __init__(self, stores: Stores, backend: Backend):
        """Change jobs in ``stores``; stop their submissions on ``backend``."""
        self.stores, self.backend = stores, backend

    def cancel(self, principal: Principal, job_id: str) -> JobRecord:
        """Cancel a job; cancelling a finished or cancelled job returns it unchanged."""
        jobs = self.stores.jobs
        for _ in range(CANCEL_ATTEMPTS):
            job = visible_job(jobs, principal, job_id)
            if job.status.terminal:
                return job
            if job.submission_id:
                self.backend.stop(job.submission_id)
            updated = change_status(
                jobs,
                job,
                JobStatus.CANCELLED,
                finished_at=datetime.now(UTC),
                event=(EventKind.CANCELLED, "cancelled by user", None),
            )
            if updated is not None:
                self.stores.tokens.revoke_job_tokens(job_id)
                return updated
        return visible_job(jobs, principal, job_id)
