"""When a job whose submission the cluster turned away for now is tried again."""

from __future__ import annotations

import time
from collections.abc import Callable


class SubmitBackoff:
    """When a job whose submission the cluster turned away for now is tried again.

    Delays double from ``base_s`` up to ``max_s``; once ``give_up_after_s`` passed since
    the first failure, ``failed`` answers None: the job fails instead. In memory: a
    restarted service starts counting again.
    """

    def __init__(
        self,
        *,
        give_up_after_s: float,
        base_s: float = 1.0,
        max_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.give_up_after_s, self.base_s, self.max_s, self.clock = (
            give_up_after_s,
            base_s,
            max_s,
            clock,
        )
        self._tries: dict[str, tuple[int, float, float]] = {}  # job -> (tries, first, next)

    def failed(self, job_id: str) -> tuple[int, float] | None:
        """Record a failed try; (tries so far, seconds until the next) or None to give up."""
        now = self.clock()
        tries, first, _ = self._tries.get(job_id, (0, now, now))
        tries += 1
        if now - first >= self.give_up_after_s:
            self._tries.pop(job_id, None)
            return None
        delay = min(self.max_s, self.base_s * 2 ** (tries - 1))
        self._tries[job_id] = (tries, first, now + delay)
        return tries, delay

    def due(self, job_id: str) -> bool:
        """Whether the job may be tried (again) now."""
        entry = self._tries.get(job_id)
        return entry is None or self.clock() >= entry[2]

    def clear(self, job_id: str) -> None:
        """The job was accepted or refused: forget its tries."""
        self._tries.pop(job_id, None)

    def keep_only(self, job_ids: set[str]) -> None:
        """Forget the tries of every job not in ``job_ids`` (no longer waiting to be tried)."""
        for job_id in self._tries.keys() - job_ids:
            del self._tries[job_id]
