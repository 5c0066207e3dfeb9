"""Prestarting a job's processes in waves its raylet takes.

A raylet starts at most ``max(1, min(cores, node CPUs))`` worker processes at a time
(Ray passes it as a command-line flag, ``ray._private.services``), and its
``PrestartWorkers`` silently drops what would start beyond that: of 7 processes asked
for at once on a 2-CPU node, 2 start. :func:`prestart` asks for at most that many at a
time, each next wave once the previous one's processes reached the job's setup hook
(``workers.warm.spares.setup_hook`` marks each in a folder), which a process does
after it registered with the raylet.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from workers.ray_compat import prestart_workers, this_node

log = logging.getLogger(__name__)

WAVE_WAIT_S = 30.0  # at most this long for one wave of prestarted processes to start


def startup_concurrency() -> int:
    """How many worker processes this node's raylet starts at a time: Ray starts it with
    ``max(1, min(cpu_count, the node's CPUs))`` (``ray._private.services``), and its
    ``PrestartWorkers`` silently drops what would start beyond that."""
    cpus = int(this_node().get("Resources", {}).get("CPU", 0))
    return max(1, min(os.cpu_count() or 1, cpus))


def prestart(
    requests: list[tuple[int, str | None]],
    *,
    started: Path,
    keep_alive_s: int,
    then=None,
    stop: threading.Event | None = None,
) -> threading.Thread | None:
    """Ask this node's raylet for processes of this job: ``requests`` is a list of
    (count, serialized runtime environment, None for this process's own).

    At most :func:`startup_concurrency` at a time, as the raylet drops the rest: the first
    wave now, each next one from a daemon thread once the previous wave's processes reached
    the job's setup hook (which marks each in the folder ``started``) or
    :data:`WAVE_WAIT_S` passed; ``then`` (no
    arguments) runs on that thread once the last wave started. Once ``stop`` is set, no
    further wave goes and ``then`` does not run (a standby handed its job: what is still
    to start would take the cores that job's start needs). Returns the thread (None when
    one wave is all and nothing follows); never raises.
    """
    stop = stop or threading.Event()
    try:
        waves = list(split(requests, startup_concurrency()))
        started.mkdir(parents=True, exist_ok=True)
        target = _send_wave(waves[0], started, keep_alive_s) if waves else 0
    except Exception as e:  # noqa: BLE001 - prestarted processes only make starts faster
        log.warning("etrain: could not prestart processes: %s: %s", type(e).__name__, e)
        waves, target = [], 0
    if len(waves) <= 1 and then is None:
        return None

    def rest() -> None:
        nonlocal target
        try:
            for wave in [*waves[1:], None]:
                deadline = time.monotonic() + WAVE_WAIT_S
                while count_files(started) < target and time.monotonic() < deadline:
                    if stop.wait(0.1):
                        return
                if wave is not None:
                    target = _send_wave(wave, started, keep_alive_s)
            if then is not None and not stop.is_set():
                then()
        except Exception as e:  # noqa: BLE001
            log.warning("etrain: could not prestart processes: %s: %s", type(e).__name__, e)

    thread = threading.Thread(target=rest, name="etrain-prestart", daemon=True)
    thread.start()
    return thread


def split(requests: list[tuple[int, str | None]], size: int) -> Iterator[list]:
    """``requests`` cut into waves of at most ``size`` processes, in order."""
    wave, room = [], size
    for count, env in requests:
        while count > 0:
            n = min(count, room)
            wave.append((n, env))
            count, room = count - n, room - n
            if room == 0:
                yield wave
                wave, room = [], size
    if wave:
        yield wave


def _send_wave(wave: list[tuple[int, str | None]], started: Path, keep_alive_s: int) -> int:
    """Ask for one wave; return how many started processes there will be once it has."""
    before = count_files(started)
    for count, env in wave:
        prestart_workers(count, keep_alive_s=keep_alive_s, runtime_env=env)
    return before + sum(count for count, _ in wave)


def count_files(folder: Path) -> int:
    """How many entries ``folder`` holds."""
    return sum(1 for _ in folder.iterdir())
