"""A TelemetryReporter that keeps what a run reports instead of sending it (unit tests)."""

from __future__ import annotations

from workers.contract import CheckpointRecord, MetricPoint, TelemetryEvent
from workers.telemetry.reporter import TelemetryReporter


class RecordingReporter(TelemetryReporter):
    """The real reporter's interface (``metric``, ``event``, ``checkpoint``, ``flush``,
    ``close``), with everything kept in lists: no thread, no network."""

    def __init__(self, job_id: str = "j-test"):
        self.job_id = job_id
        self._first_sent = True  # no sender to wake
        self.metrics: list[MetricPoint] = []
        self.events: list[TelemetryEvent] = []
        self.checkpoints: list[CheckpointRecord] = []

    def _put(self, item: tuple[str, object]) -> None:
        key, value = item
        getattr(self, key).append(value)

    def flush(self, timeout: float = 5.0) -> bool:
        """Nothing is pending."""
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Nothing to stop."""

    def kinds(self) -> list[tuple[str, str, dict | None]]:
        """Every event as (kind, message, data), in order."""
        return [(e.kind, e.message, e.data) for e in self.events]
