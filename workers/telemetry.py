"""Per-step metrics and events from the cluster to the control plane, off the hot path.

``ray.train.report`` is a barrier through Ray Train's controller (about 1.8 s a
call on a 2-core machine), so the train loop calls it only with checkpoints.
Per-step metrics go through this reporter instead: the loop puts points on a
queue and a daemon thread POSTs them in batches to
``{ETRAIN_REPORT_URL}/v1/jobs/{job_id}/telemetry`` with a token scoped to the
job. Points and events carry keys the store de-duplicates on, so a retry or a
replay after a control-plane restart never double-counts. The loop calls
``flush`` before it commits a checkpoint, so the steps a checkpoint covers are
stored before a restore could skip past them.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)

_MAX_QUEUE = 20_000  # points kept while the control plane is unreachable


class TelemetryReporter:
    """Batches metrics and events and sends them from a background thread.

    With no URL configured (a run outside etrain) it prints JSON lines instead.
    ``close`` flushes what is queued, waiting at most ``timeout`` seconds.
    """

    def __init__(self, *, url: str | None, token: str | None, job_id: str,
                 flush_interval: float = 0.5):
        self.url, self.job_id, self.flush_interval = url, job_id, flush_interval
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._queue: queue.Queue = queue.Queue(maxsize=_MAX_QUEUE)
        self._stop = threading.Event()
        self._wake = threading.Event()
        # Items queued, and items sent (or dropped): flush() waits for the second to catch up.
        self._queued = self._done = 0
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="etrain-telemetry", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, job_id: str) -> "TelemetryReporter":
        """Build from ETRAIN_REPORT_URL / ETRAIN_REPORT_TOKEN set by the service."""
        return cls(url=os.environ.get("ETRAIN_REPORT_URL"),
                   token=os.environ.get("ETRAIN_REPORT_TOKEN"), job_id=job_id)

    def metric(self, point: dict[str, Any]) -> None:
        """Queue one per-step metrics point (must hold ``step``)."""
        self._put(("metric", point))

    def event(self, kind: str, message: str, *, data: dict | None = None,
              dedup_key: str | None = None) -> None:
        """Queue a lifecycle event; ``dedup_key`` makes a replayed event count once."""
        self._put(("event", {"kind": kind, "message": message, "data": data,
                             "dedup_key": dedup_key, "ts": time.time()}))

    def checkpoint(self, *, step: int, uri: str, nbytes: int, save_s: float,
                   blocking_s: float | None = None) -> None:
        """Queue a committed checkpoint record."""
        self._put(("checkpoint", {"step": step, "uri": uri, "bytes": nbytes,
                                  "save_s": save_s, "blocking_s": blocking_s}))

    def _put(self, item: tuple[str, dict]) -> None:
        with self._progress:
            self._queued += 1
        try:
            self._queue.put_nowait(item)
        except queue.Full:  # drop the oldest rather than block training
            try:
                self._queue.get_nowait()
                self._count_done(1)
            except queue.Empty:
                pass
            self._queue.put_nowait(item)

    def _count_done(self, n: int) -> None:
        with self._progress:
            self._done += n
            self._progress.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Send everything queued so far now; False if the control plane did not take it in time."""
        with self._progress:
            target = self._queued
        self._wake.set()
        with self._progress:
            return self._progress.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Flush and stop the sender thread."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _drain(self) -> dict[str, list]:
        batch: dict[str, list] = {"metrics": [], "events": [], "checkpoints": []}
        names = {"metric": "metrics", "event": "events", "checkpoint": "checkpoints"}
        while True:
            try:
                kind, item = self._queue.get_nowait()
            except queue.Empty:
                return batch
            batch[names[kind]].append(item)

    def _run(self) -> None:
        pending: dict[str, list] = {"metrics": [], "events": [], "checkpoints": []}
        with httpx.Client(timeout=10.0) as client:
            while True:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
                stopping = self._stop.is_set()
                for key, items in self._drain().items():
                    # Bounded while the control plane is away: keep the newest points.
                    merged = pending[key] + items
                    dropped = max(0, len(merged) - _MAX_QUEUE)
                    if dropped:
                        self._count_done(dropped)
                    pending[key] = merged[dropped:]
                if any(pending.values()) and self._send(client, pending):
                    self._count_done(sum(map(len, pending.values())))
                    pending = {"metrics": [], "events": [], "checkpoints": []}
                if stopping and (not any(pending.values()) or not self.url):
                    return
                if stopping:  # one last try, then give up rather than hang shutdown
                    self._send(client, pending)
                    return

    def _send(self, client: httpx.Client, batch: dict[str, list]) -> bool:
        if not self.url:
            for key, items in batch.items():
                for item in items:
                    print("ETRAIN_TELEMETRY " + json.dumps({key: item}), flush=True)
            return True
        try:
            r = client.post(f"{self.url}/v1/jobs/{self.job_id}/telemetry",
                            json=batch, headers=self._headers)
            r.raise_for_status()
            return True
        except httpx.HTTPError as e:  # keep the batch; the next tick retries
            log.warning("telemetry: control plane unreachable (%s); will retry", type(e).__name__)
            return False
