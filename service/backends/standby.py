"""Standby job drivers: a Ray job started and warmed up before the etrain job it will run.

Starting a job the usual way (a Ray job per etrain job) spends most of its time before
training: Ray starts the driver process, which imports torch and Ray Train and connects;
Ray Train's controller starts in a new process; the workers import the training stack.
A standby driver (``workers.warm.standby``) does all of that ahead, then asks the service for
its job on ``STANDBY_ROUTE`` with a token that may only fetch that job. This pool keeps
``count`` of them; the reconciler hands a job to an idle one (:meth:`StandbyDrivers.take`)
and records ``<standby's Ray submission id>/<job's submission id>`` as the job's
(:func:`runner_of` splits it). The job's environment (reporter token, object-store keys)
goes to the driver in the answer, never into the Ray job.

A standby runs job after job: once a job succeeded it says so (:meth:`~StandbyDrivers.done`),
the job's status is SUCCEEDED from then on, and once the reconciler recorded that
(:meth:`~StandbyDrivers.settle`) the standby is idle again, its processes warm. So jobs
submitted one after another reuse one driver, its Ray job, and the processes its runs
started ahead, instead of starting them all again. A job that failed, a stop, or a
standby that ran its last job (``workers.warm.standby.MAX_RUNS``) ends its Ray job, whose
status is then the job's, as for a driver started for the job; the pool forgets it
(:meth:`~StandbyDrivers.forget`) and starts another.

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

from service.backends.warm_policy import WarmBudget, fit, processes_per_standby
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
RUN_SEP = "/"  # <standby's Ray submission id>/<job's submission id>: a job a standby runs


def run_id(ray_id: str, submission_id: str) -> str:
    """The submission id recorded for a job that standby ``ray_id`` runs."""
    return f"{ray_id}{RUN_SEP}{submission_id}"


def runner_of(recorded: str) -> tuple[str, str | None]:
    """A recorded submission id as (Ray submission id, the job's own submission id when a
    standby runs it, else None)."""
    ray_id, sep, own = recorded.partition(RUN_SEP)
    return ray_id, (own if sep else None)


class Launch(Protocol):
    """What a standby is handed (``service.backends.base.LaunchRequest``)."""

    job_id: str
    submission_id: str
    spec_json: str
    env: dict[str, str]


class UnknownStandby(LookupError):
    """No standby driver of this pool has that id and token."""


class NotItsJob(LookupError):
    """The standby driver does not run that job."""


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
    fetched: bool = False  # it asked for and got that job: it runs it
    done: bool = False  # that job succeeded; idle again once the reconciler recorded it
    runs: int = 0  # jobs it ran to the end
    job: dict | None = None
    handed: threading.Event = field(default_factory=threading.Event)
    memory_bytes: int | None = None  # what its processes held (PSS) at its last ask


@dataclass(frozen=True)
class PoolStatus:
    """What the standby pool holds now (``GET /v1/cluster``)."""

    configured: int  # standby drivers kept (``standby_drivers``)
    idle: int  # started and not running a job
    warm: int  # of them, those that have warmed up and asked for a job
    memory_bytes: int  # host memory of the warm ones' processes, as they last reported it
    busy: int = 0  # running a job (back in the pool once it ends)
    processes: int = 0  # the standbys' processes (each: itself, run actors, its workers)
    budget: WarmBudget | None = None  # what they may hold (sized to the node once known)
    shrunk: bool = False  # stopped after ``budget.idle_s`` without a job; a job brings it back


class StandbyDrivers:
    """Keeps ``count`` standby drivers, idle or running a job, within ``budget``
    (``warm_policy``); hands each idle one a job.

    ``start(submission_id, env)`` starts a standby's Ray job with ``env`` (it raises
    the backend's errors); ``stop(submission_id)`` stops one; ``node()`` answers the CPUs
    and memory (bytes) of the node the standbys run on, or raises the backend's errors.
    """

    def __init__(
        self,
        start: Callable[[str, dict[str, str]], None],
        stop: Callable[[str], None],
        *,
        count: int,
        workers: int,
        report_url: str,
        budget: WarmBudget | None = None,
        node: Callable[[], tuple[float | None, float | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._start, self._stop, self.count, self.workers = start, stop, count, workers
        self.report_url, self.clock = report_url, clock
        self._budget, self._node = budget or UNBOUNDED, node
        self._sized = node is None  # the budget needs no node's figures
        self._lock = threading.Lock()
        self._pool: dict[str, Standby] = {}
        self._next_try = 0.0
        self._active = clock()  # the last hand-over or job end: idle since then
        self._shrunk = False
        self._memory_each: int | None = None  # the most one standby reported holding
        self.workers_each = workers  # what each new standby warms (within the budget)

    def budget(self) -> WarmBudget | None:
        """The budget, sized to the node; None until the node's figures could be read."""
        if not self._sized and self._node is not None:
            try:
                cpus, memory = self._node()
            except (BackendError, BackendUnavailable):
                return None  # the cluster is not up yet: asked again next tick
            self._budget, self._sized = self._budget.for_node(cpus, memory), True
        return self._budget.for_node(None, None)

    def keep(self) -> None:
        """Drop lost standbys; stop idle ones beyond the budget or after its idle time;
        start new ones up to the budget's count (each reconciler tick)."""
        now, budget = self.clock(), self.budget()
        with self._lock:
            lost = [s for s in self._pool.values() if self._lost(s, now)]
            for s in lost:
                del self._pool[s.standby_id]
            retire, missing = self._resize(budget, now) if budget else ([], 0)
        for s in lost:
            log.warning("standby driver %s is gone; stopping its Ray job", s.submission_id)
            self._stop_quietly(s.submission_id)
        for s in retire:
            if self._shrunk:
                log.info("stopping standby driver %s: no job for long", s.submission_id)
            else:
                log.warning(
                    "stopping standby driver %s: the warm pool is over its budget (%s)",
                    s.submission_id,
                    budget,
                )
            self._stop_quietly(s.submission_id)
        if missing > 0 and now >= self._next_try:
            for _ in range(missing):
                if not self._start_one(now):
                    self._next_try = now + RETRY_S
                    break

    def _resize(self, budget: WarmBudget, now: float) -> tuple[list[Standby], int]:
        """(idle standbys to stop, how many to start) for ``budget`` (under the lock)."""
        target, self.workers_each = fit(
            budget, wanted=self.count, workers=self.workers, memory_each=self._memory_each
        )
        self._shrunk = self._shrunk or now - self._active > budget.idle_s
        target = 0 if self._shrunk else target
        idle = sorted((s for s in self._pool.values() if s.taken_for is None), key=_retire_order)
        retire = idle[: max(len(self._pool) - target, 0)]
        for s in retire:
            del self._pool[s.standby_id]
        return retire, target - len(self._pool)  # busy ones count: they come back

    def take(self, req: Launch) -> str | None:
        """Hand ``req`` to an idle standby; its Ray submission id, or None when none is idle.
        Asked again for the same submission, it answers the same standby."""
        with self._lock:
            for s in self._pool.values():
                if s.taken_for == req.submission_id:
                    return s.submission_id
            self._active = self.clock()
            idle = [s for s in self._pool.values() if s.taken_for is None]
            if not idle:
                self._shrunk = False  # a job came: the pool comes back after it
                return None
            # One that has asked (warm) before one still starting; then the oldest.
            s = min(idle, key=lambda s: (s.seen is None, s.started))
            s.taken_for, s.taken_at = req.submission_id, self.clock()
            s.job = {
                "job_id": req.job_id,
                "submission_id": req.submission_id,
                "spec_json": req.spec_json,
                "env": dict(req.env),
            }
            s.handed.set()
        log.info("job %s handed to standby driver %s", req.job_id, s.submission_id)
        return s.submission_id

    def fetch(
        self, standby_id: str, token: str, *, wait_s: float, memory_bytes: int | None = None
    ) -> dict | None:
        """A standby asks for its job: the job (once), or None after ``wait_s`` without
        one. UnknownStandby for a wrong id or token. ``memory_bytes``: what its processes
        hold now, as it measured it."""
        with self._lock:
            s = self._known(standby_id, token)
            s.seen = self.clock()
            if memory_bytes is not None:
                s.memory_bytes = memory_bytes
                self._memory_each = max(self._memory_each or 0, memory_bytes)
        s.handed.wait(wait_s)
        with self._lock:
            if s.job is None or self._pool.get(standby_id) is not s:
                return None
            job, s.job, s.fetched = s.job, None, True
            s.handed.clear()
            return job

    def done(self, standby_id: str, token: str, submission_id: str) -> None:
        """A standby says the job it runs (``submission_id``) succeeded. UnknownStandby for
        a wrong id or token; NotItsJob for a job it does not run."""
        with self._lock:
            s = self._known(standby_id, token)
            if s.taken_for != submission_id or not s.fetched:
                raise NotItsJob(submission_id)
            s.done, s.seen = True, self.clock()
        log.info("standby driver %s finished %s", s.submission_id, submission_id)

    def state_of(self, submission_id: str) -> str | None:
        """``"done"`` once the standby running job ``submission_id`` said it succeeded,
        ``"running"`` while one runs it, None when no standby of this pool has it."""
        with self._lock:
            s = self._handed(submission_id)
            return None if s is None else "done" if s.done else "running"

    def runs(self, ray_id: str, submission_id: str) -> bool | None:
        """Whether standby ``ray_id`` runs job ``submission_id`` now (handed or fetched, not
        done); None when the pool does not know that standby (the service restarted)."""
        with self._lock:
            s = self._with_ray_id(ray_id)
            return None if s is None else s.taken_for == submission_id and not s.done

    def settle(self, submission_id: str) -> None:
        """The job's success is recorded: its standby is idle again (it asks already)."""
        with self._lock:
            s = self._handed(submission_id)
            if s is not None and s.done:
                s.taken_for = s.taken_at = None
                s.fetched = s.done = False
                s.runs += 1
                s.seen = self._active = self.clock()

    def forget(self, ray_id: str) -> None:
        """The standby's Ray job ended (its job failed or was stopped, or it retired)."""
        with self._lock:
            s = self._with_ray_id(ray_id)
            if s is not None:
                del self._pool[s.standby_id]

    def lost_all(self) -> None:
        """The cluster lost every standby (its head restarted): none is left to stop."""
        with self._lock:
            self._pool.clear()

    def _handed(self, submission_id: str) -> Standby | None:
        """The standby that job ``submission_id`` was handed to (lock held)."""
        return next((s for s in self._pool.values() if s.taken_for == submission_id), None)

    def _with_ray_id(self, ray_id: str) -> Standby | None:
        """The standby whose Ray job is ``ray_id`` (lock held)."""
        return next((s for s in self._pool.values() if s.submission_id == ray_id), None)

    def _known(self, standby_id: str, token: str) -> Standby:
        s = self._pool.get(standby_id)
        if s is None or not hmac.compare_digest(s.token_hash, _sha256(token)):
            raise UnknownStandby(standby_id)
        return s

    def status(self) -> PoolStatus:
        """How many standbys wait for a job, how many of them are warm, and their memory.
        Reads nothing from the cluster (``/readyz`` asks it): the budget as last sized."""
        with self._lock:
            idle = [s for s in self._pool.values() if s.taken_for is None]
            busy = len(self._pool) - len(idle)
            standbys = len(self._pool)
        warm = [s for s in idle if s.seen is not None]
        return PoolStatus(
            configured=self.count,
            idle=len(idle),
            warm=len(warm),
            memory_bytes=sum(s.memory_bytes or 0 for s in warm),
            busy=busy,
            processes=standbys * processes_per_standby(self.workers_each),
            budget=self._budget.for_node(None, None) if self._sized else None,
            shrunk=self._shrunk,
        )

    def close(self) -> None:
        """Stop every standby that has no job (the service is stopping)."""
        with self._lock:
            idle = [s for s in self._pool.values() if s.taken_for is None]
            self._pool.clear()
        for s in idle:
            self._stop_quietly(s.submission_id)

    def _lost(self, s: Standby, now: float) -> bool:
        if s.fetched:  # it runs a job: the reconciler follows its Ray job (forget)
            return False
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
            STANDBY_WORKERS_ENV: str(self.workers_each),
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


UNBOUNDED = WarmBudget(processes=2**31, memory_bytes=2**62, idle_s=1e9)  # no budget given


def _retire_order(s: Standby) -> tuple[bool, float]:
    """Stopped first: those still warming, then the newest."""
    return (s.seen is not None, -s.started)


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
