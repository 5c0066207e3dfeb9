"""Fault injection for tests and demos: SIGKILL this worker once at a chosen step.

Set ``ETRAIN_FAULT_KILL_STEP=N`` (and optionally ``ETRAIN_FAULT_KILL_RANK``,
default 1) in a job's environment; the marker file ``ETRAIN_FAULT_MARKER``
makes it fire only on the first attempt, so the restarted workers run through.
The kill is a real SIGKILL of the worker process: Ray Train sees a dead actor.
"""

from __future__ import annotations

import os
import signal
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
