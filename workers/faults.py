"""Fault injection for tests and demos: kill a worker at a chosen step, or slow steps down.

Set ``ETRAIN_FAULT_KILL_STEP=N`` (and optionally ``ETRAIN_FAULT_KILL_RANK``,
default 1) in a job's environment; the marker file ``ETRAIN_FAULT_MARKER``
makes it fire only on the first attempt, so the restarted workers run through.
The kill is a real SIGKILL of the worker process: Ray Train sees a dead actor.

``ETRAIN_FAULT_SLOW_SAVE_STEP=N`` (with ``ETRAIN_FAULT_SLOW_SAVE_S``, default
30) makes the asynchronous save of step N take that much longer, so a test can
kill a worker in the middle of it; ``ETRAIN_FAULT_FAIL_SAVE_STEP=N`` makes that
save fail (an OSError in the shard writer, as a full disk would).

``ETRAIN_FAULT_THROTTLE_FILE=path``: while that file exists, every step sleeps
``ETRAIN_FAULT_THROTTLE_S`` (default 0.2) more, so a test can add and remove
nodes before a small job ends, whatever the machine's speed, then delete the
file to let it finish.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def maybe_kill_worker(*, step: int, rank: int) -> None:
    """SIGKILL this process if the environment asks for it at ``step`` on ``rank``."""
    at = os.environ.get("ETRAIN_FAULT_KILL_STEP")
    if not at or int(at) != step or int(os.environ.get("ETRAIN_FAULT_KILL_RANK", "1")) != rank:
        return
    marker = os.environ.get("ETRAIN_FAULT_MARKER")
    if marker:
        path = Path(marker)
        if path.exists():
            return
        path.write_text(f"killed rank {rank} at step {step}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_throttle() -> None:
    """Sleep a little while the environment's throttle file exists."""
    path = os.environ.get("ETRAIN_FAULT_THROTTLE_FILE")
    if path and os.path.exists(path):
        time.sleep(float(os.environ.get("ETRAIN_FAULT_THROTTLE_S", "0.2")))


def faulty_writer(writer, *, step: int):
    """``writer`` (a DCP StorageWriter), made slow or failing for ``step`` when the
    environment asks for it (first attempt only, see ETRAIN_FAULT_MARKER)."""
    slow = os.environ.get("ETRAIN_FAULT_SLOW_SAVE_STEP")
    fail = os.environ.get("ETRAIN_FAULT_FAIL_SAVE_STEP")
    marker = os.environ.get("ETRAIN_FAULT_MARKER")
    if str(step) not in (slow, fail) or (marker and Path(marker).exists()):
        return writer  # (after the kill marker is written, the restarted run saves normally)
    delay = float(os.environ.get("ETRAIN_FAULT_SLOW_SAVE_S", "30"))
    write_data = writer.write_data

    def faulty_write_data(plan, planner):
        if str(step) == fail:
            raise OSError(28, "No space left on device (injected by ETRAIN_FAULT_FAIL_SAVE_STEP)")
        time.sleep(delay)
        return write_data(plan, planner)

    writer.write_data = faulty_write_data
    return writer
