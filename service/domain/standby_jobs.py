"""What a standby job driver asks the service for: the job handed to it
(``service.backends.standby`` keeps the drivers; this is their side of the API)."""

from __future__ import annotations

from typing import Any

from service.auth import bearer
from service.backends.base import Backend
from service.backends.standby import UnknownStandby
from service.errors import Unauthorized


class StandbyJobs:
    """Hands jobs to the backend's standby drivers, each only with its own token."""

    def __init__(self, backend: Backend):
        """The standby drivers of ``backend`` (none when it keeps none)."""
        self.backend = backend

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
        token = bearer(authorization)
        pool = self.backend.standby
        try:
            if pool is None:
                raise UnknownStandby(standby_id)
            return pool.fetch(standby_id, token, wait_s=wait_s, memory_bytes=memory_bytes)
        except UnknownStandby:
            raise Unauthorized("unknown standby driver or token") from None
