"""Job statuses: the names the store persists, the domain moves between and the API shows.

Only the names live here. The rule for which status may follow which is the
domain's (``service.domain.states``), so the store can keep a status without
importing the domain.
"""

from __future__ import annotations

import enum


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
