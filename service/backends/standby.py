"""Standby job drivers: a Ray job started and warmed up before the etrain job it will run.

Starting a job the usual way (a Ray job per etrain job) spends most of its time before
training: Ray starts the driver process, which imports torch and Ray Train and connects;
Ray Train's controller starts in a new process; the workers import the training stack.
A standby driver (``workers.warm.standby``) does all of that ahead, then asks the service for
its job on ``STANDBY_ROUTE`` with a token that may only fetch that job. This pool keeps
``count`` of them idle; the reconciler hands a job to one (:meth:`StandbyDrivers.take`),
records the standby's Ray submission id as the job's, and follows, stops and reads it as
any other. The job's environment (reporter token, object-store keys) goes to the driver
in the answer, never into the Ray job.

A standby that never asks (its start failed) or stops asking is stopped and replaced; a
driver the pool does not know (the service restarted) is told so (401) and exits.
State is in memory: the service runs one reconciler.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from service.errors import BackendError, BackendUnavailable
from workers.contract import (
    REPORT_URL_ENV,
    STANDBY_ID_ENV,
    STANDBY_TOKEN_ENV,
    STANDBY_WORKERS_ENV,
    TRAIN_STATE_TRACKING_ENV,
)

log = logging.getLogger(__name__)

START_GRACE_S = 300.0  # a standby that has not asked for its job after this was lost
SEEN_TIMEOUT_S = 60.0  # one that stopped asking (it asks again every 20 s)
HANDOVER_S = 300.0  # a job handed over but not fetched this long: the driver is gone
RETRY_S = 10.0  # after a failed start, wait this long before the next
SUBMISSION_PREFIX = "etrain-standby-"  # + its id: a standby's Ray submission id


class Launch(Protocol):
    """What a standby is handed (``service.backends.base.LaunchRequest``)."""

    job_id: str
    submission_id: str
    spec_json: str
    env: dict[str, str]


class UnknownStandby(LookupError):
    """No standby driver of this pool has that id and token."""


@dataclass
class Standby:
    """One standby driver: its Ray job, and the job it was handed (until it fetched it)."""

    standby_id: str
    submission_id: str
    token_hash: str
    started: float
    seen: float | None = None
    taken_for: str | None = None  # the etrain submission id it was handed
    taken_at: float | None = None
    job: dict | None = None
    handed: threading.Event = field(default_factory=threading.Event)
    memory_bytes: int | None = None  # what its processes held (PSS) at its last ask


@dataclass(frozen=True)
class PoolStatus:
    """What the standby pool holds now (``GET /v1/cluster``)."""

    configured: int  # standby drivers kept idle (``standby_drivers``)
    idle: int  # started and not yet handed a job
    warm: int  # of them, those that have warmed up and asked for their job
    memory_bytes: int  # host memory of the warm ones' processes, as they last reported it


class StandbyDrivers:
    """Keeps ``count`` standby drivers idle; hands each one job.

    ``start(submission_id, env)`` starts a standby's Ray job with ``env`` (it raises
    the backend's errors); ``stop(submission_id)`` stops one.
    """

    def __init__(
        self,
        start: Callable[[str, dict[str, str]], None],
        stop: Callable[[str], None],
        *,
        count: int,
        workers: int,
        report_url: str,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._start, self._stop, self.count, self.workers = start, stop, count, workers
        self.report_url, self.clock = report_url, clock
        self._lock = threading.Lock()
        self._pool: dict[str, Standby] = {}
        self._next_try = 0.0

    def keep(self) -> None:
        """Drop lost standbys, start new ones until ``count`` are idle (each reconciler tick)."""
        now = self.clock()
        with self._lock:
            lost = [s for s in self._pool.values() if self._lost(s, now)]
            for s in lost:
                del self._pool[s.standby_id]
            missing = self.count - sum(1 for s in self._pool.values() if s.taken_for is None)
        for s in lost:
            log.warning("standby driver %s is gone; stopping its Ray job", s.submission_id)
            self._stop_quietly(s.submission_id)
        if missing > 0 and now >= self._next_try:
            for _ in range(missing):
                if not self._start_one(now):
                    self._next_try = now + RETRY_S
                    break

    def take(self, req: Launch) -> str | None:
        """Hand ``req`` to an idle standby; its Ray submission id, or None when none is idle.
        Asked again for the same submission, it answers the same standby."""
        with self._lock:
            for s in self._pool.values():
                if s.taken_for == req.submission_id:
                    return s.submission_id
            idle = [s for s in self._pool.values() if s.taken_for is None]
            if not idle:
                return None
            # One that has asked (warm) before one still starting; then the oldest.
            s = min(idle, key=lambda s: (s.seen is None, s.started))
            s.taken_for, s.taken_at = req.submission_id, self.clock()
            s.job = {"job_id": req.job_id, "spec_json": req.spec_json, "env": dict(req.env)}
            s.handed.set()
        log.info("job %s handed to standby driver %s", req.job_id, s.submission_id)
        return s.submission_id

    def fetch(
        self, standby_id: str, token: str, *, wait_s: float, memory_bytes: int | None = None
    ) -> dict | None:
        """A standby asks for its job: the job (once; the standby then leaves the pool), or
        None after ``wait_s`` without one. UnknownStandby for a wrong id or token.
        ``memory_bytes``: what its processes hold now, as it measured it."""
        given = _sha256(token)
        with self._lock:
            s = self._pool.get(standby_id)
            if s is None or not hmac.compare_digest(s.token_hash, given):
                raise UnknownStandby(standby_id)
            s.seen = self.clock()
            if memory_bytes is not None:
                s.memory_bytes = memory_bytes
        s.handed.wait(wait_s)
        with self._lock:
            if s.job is None or self._pool.get(standby_id) is not s:
                return None
            job, s.job = s.job, None
            del self._pool[standby_id]
            return job

    def status(self) -> PoolStatus:
        """How many standbys wait for a job, how many of them are warm, and their memory."""
        with self._lock:
            idle = [s for s in self._pool.values() if s.taken_for is None]
        warm = [s for s in idle if s.seen is not None]
        return PoolStatus(
            configured=self.count,
            idle=len(idle),
            warm=len(warm),
            memory_bytes=sum(s.memory_bytes or 0 for s in warm),
        )

    def close(self) -> None:
        """Stop every standby that has no job (the service is stopping)."""
        with self._lock:
            idle = [s for s in self._pool.values() if s.taken_for is None]
            self._pool.clear()
        for s in idle:
            self._stop_quietly(s.submission_id)

    def _lost(self, s: Standby, now: float) -> bool:
        if s.taken_for is not None:
            return now - (s.taken_at or now) > HANDOVER_S
        if s.seen is None:
            return now - s.started > START_GRACE_S
        return now - s.seen > SEEN_TIMEOUT_S

    def _start_one(self, now: float) -> bool:
        standby_id, token = secrets.token_hex(6), secrets.token_urlsafe(32)
        s = Standby(
            standby_id=standby_id,
            submission_id=SUBMISSION_PREFIX + standby_id,
            token_hash=_sha256(token),
            started=now,
        )
        env = {
            STANDBY_ID_ENV: standby_id,
            STANDBY_TOKEN_ENV: token,
            STANDBY_WORKERS_ENV: str(self.workers),
            REPORT_URL_ENV: self.report_url,
            # As every job has it: the standby's processes get the environment its job's
            # will have.
            **TRAIN_STATE_TRACKING_ENV,
        }
        with self._lock:
            self._pool[standby_id] = s
        try:
            self._start(s.submission_id, env)
        except (BackendError, BackendUnavailable) as e:
            with self._lock:
                self._pool.pop(standby_id, None)
            log.warning("could not start a standby driver: %s", e)
            return False
        log.info("started standby driver %s", s.submission_id)
        return True

    def _stop_quietly(self, submission_id: str) -> None:
        try:
            self._stop(submission_id)
        except (BackendError, BackendUnavailable) as e:
            log.warning("could not stop standby driver %s: %s", submission_id, e)


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
