"""Timestamps of a worker group's start, so submit → first step can be split into parts.

Each part of a start leaves a Unix timestamp here, and rank 0 sends them all with
its ``workers_started`` event (``data.startup``), which the service stores:

- the driver (``workers.launch``): its process start (``driver_process``), the moment
  it connected to Ray (``ray_connected``) and the call of ``fit()`` (``driver_ready``),
  handed to the workers in the train loop's config; a standby driver
  (``workers.warm.standby``), which started and connected before the job existed, has the
  moment it was handed the job (``assigned``) instead of the first two;
- the Ray Train controller (``workers.elastic.callbacks.StartupTimes``): its own start
  (``controller_start``; ``controller_process``, the start of its process, is older
  than ``fit()`` when the process was started ahead), the start
  of the group (``group_start``, before its placement group), its actors alive
  (``actors_ready``) and its backend set up, i.e. the process group formed
  (``backend_ready``); sent to every worker once the group is up;
- the worker: its process start (``worker_process``; a warm spare's is older than
  the group) and the start of the train function (``train_fn``).

The event's own ``ts`` marks the model built (and restored); the first metric's
``ts`` the end of step 1. ``bench/startup.py`` reads them.
"""

from __future__ import annotations

import os
from functools import wraps

from workers.contract import EventKind

_GROUP_TIMES: dict[str, float] = {}  # on a worker: the controller's times of its group


def process_start_time(pid: int | None = None) -> float | None:
    """Unix time the process started (None where /proc cannot say). The boot time /proc
    gives is in whole seconds, so this reads up to 1 s early."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def note_group_times(times: dict[str, float]) -> None:
    """On a worker: keep the controller's timestamps of this group's start."""
    _GROUP_TIMES.clear()
    _GROUP_TIMES.update(times)


def worker_startup(driver: dict[str, float] | None, *, train_fn: float) -> dict[str, float]:
    """Every timestamp of this group's start this worker knows."""
    times = {**(driver or {}), **_GROUP_TIMES, "train_fn": train_fn}
    started = process_start_time()
    if started is not None:
        times["worker_process"] = started
    return times


def stamp_workers_started(reporter, startup: dict[str, float]) -> None:
    """Make ``reporter``'s next ``workers_started`` event carry ``startup`` in its data."""
    event = reporter.event
    pending = [startup]

    @wraps(event)
    def stamped(kind, message, *, data=None, dedup_key=None):
        if kind == EventKind.WORKERS_STARTED and pending:
            data = {**(data or {}), "startup": pending.pop()}
        event(kind, message, data=data, dedup_key=dedup_key)

    reporter.event = stamped
