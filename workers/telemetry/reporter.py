"""Per-step metrics and events from the cluster to the control plane, off the hot path.

``ray.train.report`` is a barrier through Ray Train's controller (about 1.8 s a
call on a 2-core machine), so the train loop never calls it. Metrics, events and
checkpoints go through this reporter instead: the loop puts points on a
queue and a daemon thread POSTs them in batches (``workers.contract.TelemetryBatch``)
to ``{ETRAIN_REPORT_URL}/v1/jobs/{job_id}/telemetry`` with a token scoped to the
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

import httpx

from workers.contract import (
    REPORT_TOKEN_ENV,
    REPORT_URL_ENV,
    CheckpointRecord,
    EventKind,
    MetricPoint,
    TelemetryBatch,
    TelemetryEvent,
    telemetry_path,
)

log = logging.getLogger(__name__)

_MAX_QUEUE = 20_000  # points kept while the control plane is unreachable
# Items in one telemetry post: a backlog goes in parts well under the API's 1 MiB body limit.
_MAX_POST_ITEMS = 100
# httpx logs every request at INFO: one line per telemetry post (twice a second) in the
# job's own logs, one per cluster poll in the service's. Warnings and errors still show.
HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")


def quiet_http_loggers() -> None:
    """Keep the HTTP client loggers at WARNING or above, whatever the root level is."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))


class TelemetryReporter:
    """Batches metrics and events and sends them from a background thread.

    With no URL configured (a run outside etrain) it prints JSON lines instead.
    ``close`` flushes what is queued, waiting at most ``timeout`` seconds.
    """

    def __init__(
        self, *, url: str | None, token: str | None, job_id: str, flush_interval: float = 0.5
    ):
        self.url, self.job_id, self.flush_interval = url, job_id, flush_interval
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._queue: queue.Queue = queue.Queue(maxsize=_MAX_QUEUE)
        self._stop = threading.Event()
        self._wake = threading.Event()
        # Items queued, and items sent (or dropped): flush() waits for the second to catch up.
        self._queued = self._done = 0
        self._first_sent = False  # the first metric point wakes the sender
        self._progress = threading.Condition()
        quiet_http_loggers()
        self._thread = threading.Thread(target=self._run, name="etrain-telemetry", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, job_id: str) -> TelemetryReporter:
        """Build from ETRAIN_REPORT_URL / ETRAIN_REPORT_TOKEN set by the service."""
        return cls(
            url=os.environ.get(REPORT_URL_ENV),
            token=os.environ.get(REPORT_TOKEN_ENV),
            job_id=job_id,
        )

    def metric(self, point: MetricPoint) -> None:
        """Queue one per-step metrics point; the first goes out at once (it ends a start)."""
        self._put(("metrics", point))
        if not self._first_sent:
            self._first_sent = True
            self._wake.set()

    def event(
        self,
        kind: EventKind,
        message: str,
        *,
        data: dict | None = None,
        dedup_key: str | None = None,
    ) -> None:
        """Queue a lifecycle event; ``dedup_key`` makes a replayed event count once."""
        self._put(
            (
                "events",
                TelemetryEvent(
                    kind=kind.value, message=message, data=data, dedup_key=dedup_key, ts=time.time()
                ),
            )
        )

    def checkpoint(self, record: CheckpointRecord) -> None:
        """Queue a committed checkpoint record."""
        self._put(("checkpoints", record))

    def _put(self, item: tuple[str, object]) -> None:
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

    def _drain(self) -> TelemetryBatch:
        batch = TelemetryBatch()
        while True:
            try:
                key, item = self._queue.get_nowait()
            except queue.Empty:
                return batch
            getattr(batch, key).append(item)

    def _run(self) -> None:
        pending = TelemetryBatch()
        with httpx.Client(timeout=10.0) as client:
            while True:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
                stopping = self._stop.is_set()
                new = self._drain()
                for key in TelemetryBatch.model_fields:
                    # Bounded while the control plane is away: keep the newest points.
                    merged = getattr(pending, key) + getattr(new, key)
                    dropped = max(0, len(merged) - _MAX_QUEUE)
                    if dropped:
                        self._count_done(dropped)
                    setattr(pending, key, merged[dropped:])
                pending = self._send_in_parts(client, pending)
                if stopping and (not pending or not self.url):
                    return
                if stopping:  # one last try, then give up rather than hang shutdown
                    self._send_in_parts(client, pending)
                    return

    def _send_in_parts(self, client: httpx.Client, pending: TelemetryBatch) -> TelemetryBatch:
        """Send ``pending`` in posts of at most _MAX_POST_ITEMS items, so that a backlog
        stays under the API's body limit; return what was not taken."""
        while pending:
            part, rest = TelemetryBatch(), TelemetryBatch()
            room = _MAX_POST_ITEMS
            for key in TelemetryBatch.model_fields:
                items = getattr(pending, key)
                setattr(part, key, items[:room])
                setattr(rest, key, items[room:])
                room -= len(getattr(part, key))
            if not self._send(client, part):
                return pending
            self._count_done(part.size())
            pending = rest
        return pending

    def _send(self, client: httpx.Client, batch: TelemetryBatch) -> bool:
        body = batch.model_dump(mode="json")
        if not self.url:
            for key, items in body.items():
                for item in items:
                    print("ETRAIN_TELEMETRY " + json.dumps({key: item}), flush=True)
            return True
        try:
            r = client.post(
                f"{self.url}{telemetry_path(self.job_id)}", json=body, headers=self._headers
            )
            r.raise_for_status()
            return True
        except httpx.HTTPError as e:  # keep the batch; the next tick retries
            log.warning("telemetry: control plane unreachable (%s); will retry", type(e).__name__)
            return False
