"""The job state machine: one enum and one transition function."""

from __future__ import annotations

import enum

from service.errors import InvalidTransition


class JobStatus(str, enum.Enum):
    """Lifecycle of a job. QUEUED -> PENDING -> RUNNING -> a terminal status."""

    QUEUED = "QUEUED"  # accepted and stored; waiting for the scheduler to admit it
    PENDING = "PENDING"  # submitted to Ray; workers not yet training
    RUNNING = "RUNNING"  # workers are training
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        """True once the job can never change status again."""
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

_ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.PENDING, JobStatus.CANCELLED, JobStatus.FAILED}),
    # PENDING -> QUEUED: the backend refused the submission for lack of room; try later.
    JobStatus.PENDING: frozenset(
        {JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED,
         JobStatus.CANCELLED}
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
