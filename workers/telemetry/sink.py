"""Where rank 0's metrics, events and checkpoint records go besides the job's reporter:
TensorBoard files (:mod:`.tensorboard`) and experiment trackers (:mod:`.tracking`).

:class:`ReporterTee` stands in for the run's reporter: each record still goes to the
reporter, and is also put on the queue of each :class:`Sink`, whose one daemon thread
writes what queued up at most once a second (``batch_s``). The training thread only
queues: a full queue drops the record and counts it (``dropped``), and closing waits a
bounded time. A sink's records are ``(what, step, payload)`` tuples: ``("metric", step,
MetricPoint)``, ``("event", step, (kind, message))``, ``("checkpoint", step,
CheckpointRecord)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time

from workers.contract import CheckpointRecord, EventKind, MetricPoint

log = logging.getLogger(__name__)

_STOP = object()


class Sink:
    """A bounded queue of records and the daemon thread that writes them.

    Subclasses implement :meth:`write` (a batch of records, on the thread); they may
    override :meth:`tick` (after each batch; ``forced`` when a flush waits on it) and
    :meth:`finish` (once, after the last batch). ``waits_on_flush``: whether the
    reporter's flush before a checkpoint waits for this sink to be written out.
    """

    name = "sink"
    batch_s = 1.0  # the thread wakes at most this often...
    idle_s = 5.0  # ...and waits this long for a first record
    close_wait_s = 30.0
    waits_on_flush = False

    def __init__(self, *, maxsize: int = 100_000):
        self.dropped = 0
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"etrain-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, item: tuple) -> None:
        """Queue a record (never blocks the step; dropped, and counted, when full)."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("%s: queue full; records are dropped (counted)", self.name)

    def request_sync(self) -> threading.Event:
        """Ask the thread to write what is queued now; the event is set once it has."""
        done = threading.Event()
        self.put(("sync", 0, done))
        self._wake.set()
        return done

    def _take(self) -> list:
        """What queued up: waits for the first record up to ``idle_s``."""
        try:
            items = [self._queue.get(timeout=self.idle_s)]
        except queue.Empty:
            return []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    def _run(self) -> None:
        # Wakes at most once per batch_s (unless a flush waits) and writes what queued up
        # since: few thread switches against the training thread, whatever the step rate.
        while True:
            items = self._take()
            stop = _STOP in items
            live = [item for item in items if item is not _STOP]
            waiting = [item[2] for item in live if item[0] == "sync"]
            self._guarded(self.write, [item for item in live if item[0] != "sync"])
            self._guarded(self.tick, forced=bool(waiting))
            for done in waiting:
                done.set()
            if stop:
                self.finish()
                return
            self._wake.wait(self.batch_s)
            self._wake.clear()

    def _guarded(self, call, *args, **kwargs) -> None:
        try:
            call(*args, **kwargs)
        except Exception:  # a bad batch must not stop the thread
            log.exception("%s: write failed", self.name)

    def write(self, items: list[tuple]) -> None:
        """Write a batch of records (on the sink's thread)."""
        raise NotImplementedError

    def tick(self, *, forced: bool) -> None:
        """After each batch: flush files, upload... (nothing by default)."""

    def finish(self) -> None:
        """After the last batch (nothing by default)."""

    def close(self) -> None:
        """Write what is queued and finish, waiting at most ``close_wait_s``."""
        while True:  # a full queue makes room: the oldest record is dropped
            try:
                self._queue.put_nowait(_STOP)
                break
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
                    self.dropped += 1
        self._wake.set()
        self._thread.join(timeout=self.close_wait_s)
        if self._thread.is_alive():
            log.warning("%s: still writing after %.0f s", self.name, self.close_wait_s)

    def wait(self, timeout: float) -> bool:
        """After :meth:`close`: wait up to ``timeout`` more for the writer to end (the job
        never does; a reader of what it wrote may); whether it has."""
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()


class ReporterTee:
    """The run's reporter (or none) plus its sinks: what one gets, all get."""

    def __init__(self, inner, sinks: list[Sink], *, step: int):
        # Events before the first metric are marked at the step the run starts from.
        self.inner, self.sinks, self.step = inner, sinks, step

    def _put(self, item: tuple) -> None:
        for sink in self.sinks:
            sink.put(item)

    def metric(self, point: MetricPoint) -> None:
        self.step = point.step
        self._put(("metric", point.step, point))
        if self.inner is not None:
            self.inner.metric(point)

    def event(self, kind, message: str, **kwargs) -> None:
        data = kwargs.get("data") or {}
        step = data.get("step", self.step)
        kind_name = getattr(kind, "value", kind)
        self._put(("event", step, (kind_name, message)))
        saved = data.get("saved_world_size")
        if kind_name == EventKind.RESTORED.value and saved not in (None, data.get("world_size")):
            self._put(("event", step, ("resized", message)))
        if self.inner is not None:
            self.inner.event(kind, message, **kwargs)

    def checkpoint(self, record: CheckpointRecord) -> None:
        self._put(("checkpoint", record.step, record))
        if self.inner is not None:
            self.inner.checkpoint(record)

    def flush(self, timeout: float = 5.0) -> bool:
        """The reporter's flush, and the sinks that ``waits_on_flush`` written out in the
        same time (a checkpoint waits for both, so a run restored from it finds the steps
        it covers in TensorBoard as well). The reporter's answer: sinks are best effort."""
        deadline = time.monotonic() + timeout
        done = [sink.request_sync() for sink in self.sinks if sink.waits_on_flush]
        sent = True if self.inner is None else self.inner.flush(timeout=timeout)
        for event in done:
            event.wait(max(0.0, deadline - time.monotonic()))
        return sent

    def close(self) -> None:
        """Close every sink (the reporter is its owner's to close)."""
        for sink in self.sinks:
            sink.close()


class Off:
    def close(self) -> None:
        """Nothing to close."""


def attach(env, sinks: list[Sink | None], *, step: int):
    """``(env, closer)``: ``env`` with its reporter behind a :class:`ReporterTee` of the
    ``sinks`` that opened (None: one that did not), and what closes them."""
    opened = [sink for sink in sinks if sink is not None]
    if not opened:
        return env, Off()
    tee = ReporterTee(env.reporter, opened, step=step)
    return dataclasses.replace(env, reporter=tee), tee
