"""Speculative work yields to real work: processes a Ray job started ahead of a job it
does not have yet pause while another job runs on the machine.

A standby driver's Ray job starts processes before any job is handed to it (its warm-up)
and between two jobs (the next run's processes): imports for a job that may never come.
A Ray job that runs a job here says so with one file per process under ``BUSY_ROOT``,
``<Ray session>+<Ray job id>.<pid>``: its driver for the whole run (:func:`busy`), each
training worker while it lives (:func:`mark_busy`). The files are per machine, not per
Ray node: nodes on one machine share its cores.

A worker process importing the training stack in its setup hook (``spares.setup_hook``,
under :func:`yielding`) stops between two module imports while its own Ray job runs no
job and another Ray job runs one (:func:`should_pause`), and goes on as soon as that no
longer holds: when the other job ends, or at once when its own Ray job is handed a job
(its imports are then that job's start, at the worker's own priority). Only worker
processes pause (about two thirds of a warm-up's CPU): a run-actor process may come to
host Ray Train's cluster-wide actors, which every job's controller waits for. A job's
own processes never pause: not for its start, not for the spares and next-run processes
its run starts ahead, which serve that job (a restart) or its standby's next job.
Measured on 2 cores (``bench/``), pausing those too while another job started made that
start faster and the next job on the same standby slower by about as much.

Why a pause and not a lower priority (``nice``): a process's nice value can be raised,
but without ``CAP_SYS_NICE`` never lowered again, and the processes started ahead are
the very ones the next job's actors run in; a niced import could not be handed to a
starting job at full speed. Why a pause and not a kill: what a paused process imported
so far (torch first, the bulk) is kept for the job that comes; it holds memory, no CPU.
A pause ends after :data:`PAUSE_MAX_S` in all (a marker left by a process that no
longer runs a job cannot hold a warm-up for ever); a marker of a process that exited
is ignored and removed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

BUSY_ROOT = Path(tempfile.gettempdir()) / "etrain-busy"
CHECK_EVERY_S = 0.05  # between two looks at BUSY_ROOT while importing
POLL_S = 0.2  # while paused
PAUSE_MAX_S = 600.0  # a process pauses at most this long in all


def ray_job_id() -> str | None:
    """This process's Ray job, with its cluster's session (two clusters on one machine
    number their jobs alike); None outside Ray."""
    import ray

    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    return f"{ctx.get_session_name()}+{ctx.get_job_id()}"


def mark_busy(job_id: str | None = None, *, root: Path | None = None) -> Path | None:
    """Record this process as running a job of Ray job ``job_id`` (default: its own); the
    marker, or None when it could not be written. Never raises."""
    try:
        job_id = job_id or ray_job_id()
        if not job_id:
            return None
        folder = root or BUSY_ROOT
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f"{job_id}.{os.getpid()}"
        marker.touch()
        return marker
    except Exception as e:  # noqa: BLE001 - only speculation's pauses read it
        log.warning("etrain: could not mark this job busy: %s: %s", type(e).__name__, e)
        return None


@contextlib.contextmanager
def busy(job_id: str | None = None, *, root: Path | None = None) -> Iterator[None]:
    """This process runs a job for the duration (a driver's run)."""
    marker = mark_busy(job_id, root=root)
    try:
        yield
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)


def should_pause(job_id: str, *, root: Path | None = None) -> bool:
    """Whether a process of Ray job ``job_id`` importing ahead pauses now: its Ray job runs
    no job and another one does. Never raises."""
    jobs = busy_jobs(root)
    return job_id not in jobs and bool(jobs)


def busy_jobs(root: Path | None = None) -> set[str]:
    """The Ray jobs running a job on this machine. Removes markers of processes that
    exited."""
    jobs: set[str] = set()
    try:
        entries = list((root or BUSY_ROOT).iterdir())
    except OSError:
        return jobs
    for marker in entries:
        job, _, pid = marker.name.rpartition(".")
        if not job or not pid.isdigit() or not running(int(pid)):
            marker.unlink(missing_ok=True)
            continue
        jobs.add(job)
    return jobs


class YieldingImports(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path``: before a module is imported in ``thread``, wait while
    ``pause()`` says so (looked at most every :data:`CHECK_EVERY_S`), at most
    ``pause_max_s`` in all. Finds nothing itself."""

    def __init__(
        self,
        pause: Callable[[], bool],
        *,
        thread: int | None = None,
        pause_max_s: float = PAUSE_MAX_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._pause, self._clock, self._sleep = pause, clock, sleep
        self._thread = thread if thread is not None else threading.get_ident()
        self._left = pause_max_s
        self._looked = float("-inf")
        self.paused_s = 0.0  # how long this process waited

    def find_spec(self, fullname, path, target=None):
        if threading.get_ident() != self._thread or self._left <= 0:
            return None
        now = self._clock()
        if now - self._looked < CHECK_EVERY_S:
            return None
        while self._left > 0 and self._pause():
            self._sleep(POLL_S)
            self._left -= POLL_S
            self.paused_s += POLL_S
        self._looked = self._clock()
        return None


@contextlib.contextmanager
def yielding(job_id: str | None = None, *, root: Path | None = None) -> Iterator[YieldingImports]:
    """Imports in this thread pause while :func:`should_pause` for Ray job ``job_id``
    (default: this process's). Never raises by itself."""
    job_id = job_id or ray_job_id() or ""
    finder = YieldingImports(lambda: bool(job_id) and should_pause(job_id, root=root))
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
        if finder.paused_s:
            log.info("etrain: imports ahead paused %.1f s for other jobs", finder.paused_s)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
