"""What a standby job driver asks the service for: the job handed to it
(``service.backends.standby`` keeps the drivers; this is their side of the API)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.auth import bearer
from service.backends.base import Backend
from service.backends.standby import NotItsJob, UnknownStandby
from service.errors import InvalidTransition, Unauthorized


class StandbyJobs:
    """Hands jobs to the backend's standby drivers, each only with its own token."""

    def __init__(self, backend: Backend, *, on_done: Callable[[], None] = lambda: None):
        """The standby drivers of ``backend`` (none when it keeps none); ``on_done`` is
        called once a standby said its job succeeded."""
        self.backend, self.on_done = backend, on_done

    def fetch(
        self,
        standby_id: str,
        authorization: str | None,
        *,
        wait_s: float,
        memory_bytes: int | None = None,
    ) -> dict[str, Any] | None:
        """The job handed to standby driver ``standby_id``, waiting up to ``wait_s`` for
        one (None when none came); 401 for a wrong id or token. Blocks: call it off the
        event loop."""
        pool = self._pool(standby_id)
        try:
            return pool.fetch(
                standby_id, bearer(authorization), wait_s=wait_s, memory_bytes=memory_bytes
            )
        except UnknownStandby:
            raise Unauthorized("unknown standby driver or token") from None

    def done(self, standby_id: str, authorization: str | None, submission_id: str) -> None:
        """Standby driver ``standby_id`` says the job it runs succeeded; 401 for a wrong id
        or token, 409 for a job it does not run."""
        pool = self._pool(standby_id)
        try:
            pool.done(standby_id, bearer(authorization), submission_id)
        except UnknownStandby:
            raise Unauthorized("unknown standby driver or token") from None
        except NotItsJob:
            raise InvalidTransition(
                f"submission_id: this standby driver does not run {submission_id!r}"
            ) from None
        self.on_done()

    def _pool(self, standby_id: str):
        if self.backend.standby is None:
            raise Unauthorized("unknown standby driver or token")
        return self.backend.standby
