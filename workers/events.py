"""Ray Train controller callback that turns worker failures into job events."""

from __future__ import annotations

import time

from ray.train.v2.api.callback import UserCallback

from workers.telemetry import TelemetryReporter


class EventCallback(UserCallback):
    """Reports worker-group failures (and the restart that follows) to the control plane.

    Runs in the Ray Train controller, not on the workers, so a worker killed
    mid-step is still reported.
    """

    def __init__(self, job_id: str):
        self.job_id = job_id
        self._reporter: TelemetryReporter | None = None

    def _get_reporter(self) -> TelemetryReporter:
        # Created lazily on the controller: the callback object is pickled there.
        if self._reporter is None:
            self._reporter = TelemetryReporter.from_env(self.job_id)
        return self._reporter

    def after_exception(self, run_context, worker_exceptions: dict) -> None:
        """Record which ranks failed and why; Ray Train then restarts the group."""
        ranks = sorted(worker_exceptions)
        first = worker_exceptions[ranks[0]] if ranks else None
        # Ray's messages run to many lines of actor metadata; the first says what happened.
        detail = str(first).strip().splitlines()[0][:200] if first else ""
        reason = f"{type(first).__name__}: {detail}" if first else "unknown"
        self._get_reporter().event(
            "worker_failed", f"worker(s) {ranks} failed: {reason}",
            data={"ranks": ranks}, dedup_key=f"fail:{time.time_ns()}",
        )

    def __getstate__(self):
        return {"job_id": self.job_id, "_reporter": None}
