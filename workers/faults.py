"""Fault injection for tests and demos: kill a worker at a chosen step, or slow steps down.

Set ``ETRAIN_FAULT_KILL_STEP=N`` (and optionally ``ETRAIN_FAULT_KILL_RANK``,
default 1) in a job's environment; the marker file ``ETRAIN_FAULT_MARKER``
makes it fire only on the first attempt, so the restarted workers run through.
The kill is a real SIGKILL of the worker process: Ray Train sees a dead actor.

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
