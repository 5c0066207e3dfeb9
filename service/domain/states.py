"""The job state machine: which status may follow which, and the one way statuses change.

The statuses themselves are named in ``service.status`` (the store keeps them
too); the rule is here. Every status change in the service goes through
:func:`change_status`, which checks the rule and then writes with the status it
checked as the store's compare-and-set guard.
"""

from __future__ import annotations

from typing import Any

from service.errors import InvalidTransition
from service.status import JobStatus
from service.store import JobRecord, JobStore
from service.store.jobs import NewEvent

_ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.PENDING, JobStatus.CANCELLED, JobStatus.FAILED}),
    # PENDING -> QUEUED: the backend refused the submission for lack of room; try later.
    JobStatus.PENDING: frozenset(
        {
            JobStatus.RUNNING,
            JobStatus.QUEUED,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
        }
    ),
    # RUNNING -> PENDING: the Ray job is being resubmitted after a cluster-level loss.
    JobStatus.RUNNING: frozenset(
        {JobStatus.PENDING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


def transition(current: JobStatus, target: JobStatus) -> JobStatus:
    """Return ``target`` if a job in ``current`` may move there, else raise InvalidTransition.

    Staying in the same status is always allowed (reconciler polls are idempotent).
    """
    if current == target or target in _ALLOWED[current]:
        return target
    raise InvalidTransition(f"a {current.value} job cannot become {target.value}")


def change_status(
    jobs: JobStore,
    job: JobRecord,
    target: JobStatus,
    *,
    event: NewEvent | None = None,
    **fields: Any,
) -> JobRecord | None:
    """Move ``job`` (as it was read) to ``target`` with ``fields`` and ``event``, in one write.

    Raises InvalidTransition, writing nothing, when the rule forbids the move.
    Returns the updated job, or None when the stored job is no longer in the
    status it was read in (someone else changed it first: re-read and decide again).
    """
    transition(job.status, target)
    return jobs.update_job(job.id, expect_status=job.status, status=target, event=event, **fields)
