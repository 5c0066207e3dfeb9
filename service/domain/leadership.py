"""Which replica of the service runs the control loop (scheduler, reconciler, retention).

Every replica serves the API; one at a time leads. The leader holds a lease in the
database (``service.store.leases``). Every replica tries every quarter of ``ttl_s``
(``ETRAIN_LEADER_LEASE_S``): the leader renews the lease for three quarters of it, the
others take it once it ran out. So when the leader stops, its lease runs out between half
and three quarters of ``ttl_s`` later, and another replica leads within ``ttl_s``. A
replica that cannot renew (the database is unreachable, or the lease lapsed while the
process was paused) stops leading at once. Two guards keep a replica that lost the lease
from acting on it:

- here, :meth:`Leadership.leads` turns false when the lease would have run out by this
  process's monotonic clock (measured from before the last renewal was sent), without
  waiting for the next renewal to fail;
- in the database, every job update of the control loop carries the lease's fencing
  token (:meth:`Leadership.fence`): once another replica took the lease, the write
  matches no row and changes nothing.

On SQLite the service is one process (``service.store.replicas.hold_sqlite``): it leads
always.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from service.store import JobRecord, JobStore
from service.store.leases import LeaseStore

log = logging.getLogger(__name__)

LEASE = "control-loop"


def replica_name() -> str:
    """This process's name among the replicas: host, pid and a random suffix (a pid
    reused by a restarted container is still a new holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Leadership:
    """Campaign for the control loop's lease; say whether this replica leads now."""

    def __init__(
        self,
        leases: LeaseStore | None,
        *,
        ttl_s: float,
        holder: str | None = None,
        on_elected: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``leases`` None: a single process that always leads. ``on_elected`` runs (in
        the campaign's thread) each time this replica takes the lease."""
        self.leases, self.ttl_s, self.clock = leases, ttl_s, clock
        self.lease_s, self.period_s = ttl_s * 3 / 4, ttl_s / 4  # held for; tried every
        self.holder = holder or replica_name()
        self.on_elected = on_elected
        self._token: int | None = None
        self._until = 0.0  # monotonic time by which the lease surely ran out
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def single(self) -> bool:
        """One process, no lease (SQLite)."""
        return self.leases is None

    def leads(self) -> bool:
        """Whether this replica leads now."""
        return self.leases is None or self.token() is not None

    def token(self) -> int | None:
        """The fencing token of the lease this replica holds now (None: it does not lead)."""
        with self._lock:
            return self._token if self._token is not None and self.clock() < self._until else None

    def fence(self) -> Any:
        """The condition every job update of the control loop carries (None on SQLite).
        Raises NotLeader when this replica no longer leads."""
        if self.leases is None:
            return None
        token = self.token()
        if token is None:
            raise NotLeader(f"{self.holder} no longer holds the {LEASE} lease")
        return self.leases.fence(LEASE, token)

    def campaign(self) -> bool:
        """One round: renew the lease held, or try to take it; whether this replica leads
        after it. A database error ends the leadership (another replica may have it by
        the time the database answers again)."""
        if self.leases is None:
            return True
        sent = self.clock()
        held = self.token()
        try:
            if held is not None and self.leases.renew(LEASE, self.holder, held, self.lease_s):
                token = held
            else:
                token = self.leases.acquire(LEASE, self.holder, self.lease_s)
        except Exception as e:  # noqa: BLE001 - the database is away: stop leading, try later
            log.warning("leadership: the lease cannot be renewed or taken: %s", e)
            token = None
        elected = token is not None and token != held
        with self._lock:
            if held is not None and token != held:
                log.warning("leadership: %s lost the %s lease", self.holder, LEASE)
            self._token, self._until = token, sent + self.lease_s if token is not None else 0.0
        if elected:
            log.info("leadership: %s leads the control loop (token %d)", self.holder, token)
            if self.on_elected is not None:
                self.on_elected()
        return token is not None

    def start(self) -> None:
        """Campaign every quarter of ``ttl_s`` in a daemon thread (a single process leads at
        once)."""
        if self.leases is None:
            if self.on_elected is not None:
                self.on_elected()
            return
        self.campaign()
        self._thread = threading.Thread(target=self._loop, name="etrain-leadership", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.campaign()

    def stop(self) -> None:
        """Stop campaigning and hand the lease back, so another replica takes over at its
        next round instead of after the lease runs out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.ttl_s)
        with self._lock:
            token, self._token, self._until = self._token, None, 0.0
        if self.leases is not None and token is not None:
            with contextlib.suppress(Exception):
                self.leases.release(LEASE, self.holder, token)


class NotLeader(RuntimeError):
    """This replica acted as the leader after its lease ran out; the action is dropped."""


class FencedJobs:
    """The job store as the control loop writes it: every update carries the leader's
    fence (reads go straight to the store)."""

    def __init__(self, jobs: JobStore, leadership: Leadership):
        self._jobs, self._leadership = jobs, leadership

    def update_job(self, job_id: str, **fields: Any) -> JobRecord | None:
        """``JobStore.update_job``, fenced; None too when this replica no longer leads."""
        return self._jobs.update_job(job_id, fence=self._leadership.fence(), **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jobs, name)
