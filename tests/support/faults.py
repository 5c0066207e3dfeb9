"""Fault injection for tests and drills, installed as the run's hooks (``workers.hooks``).

In-process, pass ``RunEnv(hooks=FaultHooks(...))``. On a Ray job, put
:func:`fault_env` in the job's environment: the driver and every worker load
:func:`from_env` through ``ETRAIN_RUN_HOOKS`` and read the faults from these
variables:

- ``ETRAIN_FAULT_KILL_STEP=N`` (and ``ETRAIN_FAULT_KILL_RANK``, default 1): SIGKILL
  that worker after step N, a real death that Ray Train sees as a dead actor.
  ``ETRAIN_FAULT_MARKER`` (a file) makes every fault fire on the first attempt
  only, so the restarted workers run through.
- ``ETRAIN_FAULT_SLOW_SAVE_STEP=N`` (with ``ETRAIN_FAULT_SLOW_SAVE_S``, default 30):
  the asynchronous save of step N takes that much longer, so a test can kill a
  worker in the middle of it; ``ETRAIN_FAULT_FAIL_SAVE_STEP=N`` makes that save
  fail (an OSError in the shard writer, as a full disk would).
- ``ETRAIN_FAULT_THROTTLE_FILE=path``: while that file exists every step sleeps
  ``ETRAIN_FAULT_THROTTLE_S`` (default 0.2) more, or the seconds the file holds, so a
  test can add and remove nodes before a small job ends, whatever the machine's speed
  (steps slow while it waits for the cluster, faster while it wants steps), then delete
  the file.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from workers.contract import RUN_HOOKS_ENV
from workers.hooks import RunHooks

REPO_ROOT = Path(__file__).resolve().parents[2]
HOOKS_TARGET = f"{__name__}:from_env"


@dataclass
class FaultHooks(RunHooks):
    """The faults to inject into one run."""

    kill_step: int | None = None
    kill_rank: int = 1
    marker: str | None = None
    slow_save_step: int | None = None
    slow_save_s: float = 30.0
    fail_save_step: int | None = None
    throttle_file: str | None = None
    throttle_s: float = 0.2

    def _first_attempt(self) -> bool:
        return not (self.marker and Path(self.marker).exists())

    def after_step(self, *, step: int, rank: int) -> None:
        """SIGKILL this process at ``kill_step`` on ``kill_rank``; slow steps while throttled."""
        if step == self.kill_step and rank == self.kill_rank and self._first_attempt():
            if self.marker:
                Path(self.marker).write_text(f"killed rank {rank} at step {step}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        if self.throttle_file:
            try:
                text = Path(self.throttle_file).read_text().strip()
            except OSError:  # no file: full speed
                return
            time.sleep(float(text) if text else self.throttle_s)

    def storage_writer(self, writer, *, step: int):
        """``writer`` made slow or failing for its step (first attempt only)."""
        if step not in (self.slow_save_step, self.fail_save_step) or not self._first_attempt():
            return writer
        write_data, fail = writer.write_data, step == self.fail_save_step

        def faulty_write_data(plan, planner):
            if fail:
                raise OSError(
                    28, "No space left on device (injected by ETRAIN_FAULT_FAIL_SAVE_STEP)"
                )
            time.sleep(self.slow_save_s)
            return write_data(plan, planner)

        writer.write_data = faulty_write_data
        return writer


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def from_env() -> FaultHooks:
    """The faults the ``ETRAIN_FAULT_*`` variables ask for (``ETRAIN_RUN_HOOKS`` target)."""
    return FaultHooks(
        kill_step=_int("ETRAIN_FAULT_KILL_STEP"),
        kill_rank=int(os.environ.get("ETRAIN_FAULT_KILL_RANK", "1")),
        marker=os.environ.get("ETRAIN_FAULT_MARKER"),
        slow_save_step=_int("ETRAIN_FAULT_SLOW_SAVE_STEP"),
        slow_save_s=float(os.environ.get("ETRAIN_FAULT_SLOW_SAVE_S", "30")),
        fail_save_step=_int("ETRAIN_FAULT_FAIL_SAVE_STEP"),
        throttle_file=os.environ.get("ETRAIN_FAULT_THROTTLE_FILE"),
        throttle_s=float(os.environ.get("ETRAIN_FAULT_THROTTLE_S", "0.2")),
    )


def fault_env(**faults: str) -> dict[str, str]:
    """A Ray job's environment that installs these faults: ``fault_env(KILL_STEP="6")`` sets
    ``ETRAIN_FAULT_KILL_STEP=6``, the hooks target, and a PYTHONPATH that finds this module."""
    return {
        RUN_HOOKS_ENV: HOOKS_TARGET,
        "PYTHONPATH": str(REPO_ROOT),
        **{f"ETRAIN_FAULT_{k}": str(v) for k, v in faults.items()},
    }


def run_killed_once(run_job, telemetry_sink, *, spec: dict, job: str, tmp_path, env=None):
    """Run ``spec`` as a Ray job whose rank 1 is SIGKILLed after step 3, once (its
    checkpoints every 2 steps beneath ``tmp_path``); assert that it succeeded, that the
    fault fired and that the restart restored step 2. The job's id."""
    import uuid

    from service.backends.base import RunState

    spec = {**spec, "checkpoint": {**spec["checkpoint"], "storage": f"file://{tmp_path}"}}
    job_id = f"j-{job}-{uuid.uuid4().hex[:6]}"
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    marker = Path(tmp_path) / "killed-once"
    faults = fault_env(KILL_STEP=3, KILL_RANK=1, MARKER=marker)
    assert run_job(job_id=job_id, spec=spec, extra_env={**faults, **(env or {})}) == (
        RunState.SUCCEEDED
    )
    assert marker.exists(), "the fault was never injected"
    events = telemetry_sink.items("events", job_id)
    assert [e["data"]["step"] for e in events if e["kind"] == "restored"] == [2]
    return job_id
