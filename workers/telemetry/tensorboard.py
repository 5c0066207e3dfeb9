"""TensorBoard event files for a job, written by rank 0 off the training thread.

:func:`with_tensorboard` puts a :class:`TensorBoardTee` in front of the run's reporter:
each metric, event and checkpoint record still goes to the reporter, and is also put on
a queue that a daemon thread writes with tensorboardX under ``<checkpoint root>/tensorboard``
(scalars ``train/*``; events as text and a marker scalar ``events/<kind>`` at the step
they happened). The step never waits on the file. ``close`` drains the queue and flushes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import uuid

from workers.contract import CheckpointRecord, MetricPoint

log = logging.getLogger(__name__)

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "world_size", "step_time_s")
_STOP = object()
_BATCH_S = 1.0  # seconds between writes


def tensorboard_dir(checkpoint_root: str) -> str | None:
    """Where a job with this checkpoint root keeps its event files; None for object stores."""
    if "://" in checkpoint_root and not checkpoint_root.startswith("file://"):
        return None
    return os.path.join(checkpoint_root.removeprefix("file://"), "tensorboard")


class TensorBoardLog:
    """Queues scalars and text events; a background thread writes them."""

    def __init__(self, logdir: str):
        from tensorboardX import SummaryWriter

        self.logdir = logdir
        # A fresh file per run: two runs started in the same second would share a name.
        suffix = f".{uuid.uuid4().hex[:8]}"
        self._writer = SummaryWriter(logdir=logdir, flush_secs=5, filename_suffix=suffix)
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etrain-tensorboard", daemon=True)
        self._thread.start()

    def put(self, item: tuple) -> None:
        """Queue a record (never blocks the step; dropped when the queue is full)."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            log.warning("tensorboard queue full; a record was dropped")

    def _run(self) -> None:
        # Wakes once a second and writes what queued up since: few thread switches
        # against the training thread, whatever the step rate.
        while True:
            items = [self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            for item in items:
                if item is _STOP:
                    return
                try:
                    self._write(*item)
                except Exception:  # a bad record must not stop the others
                    log.exception("tensorboard write failed")
            self._stopping.wait(_BATCH_S)

    def _write(self, what: str, step: int, payload) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        if what == "metric":  # one event per step holding every scalar: cheapest to write
            values = [
                Summary.Value(tag=f"train/{name}", simple_value=float(value))
                for name in SCALARS
                if (value := getattr(payload, name, None)) is not None
            ]
            self._writer.file_writer.add_summary(Summary(value=values), step)
            return
        kind, message = payload
        self._writer.add_text(f"events/{kind}", message, step)
        self._writer.add_scalar(f"events/{kind}", 1.0, step)

    def close(self) -> None:
        """Write what is queued and close the file."""
        self._queue.put(_STOP)
        self._stopping.set()
        self._thread.join(timeout=30)
        self._writer.close()


class TensorBoardTee:
    """The run's reporter (or none) plus the TensorBoard log: what one gets, both get."""

    def __init__(self, inner, log_: TensorBoardLog, *, step: int):
        # Events before the first metric are marked at the step the run starts from: a
        # smaller step would make TensorBoard drop the points after it as orphaned.
        self.inner, self.log, self.step = inner, log_, step

    def metric(self, point: MetricPoint) -> None:
        self.step = point.step
        self.log.put(("metric", point.step, point))
        if self.inner is not None:
            self.inner.metric(point)

    def event(self, kind, message: str, **kwargs) -> None:
        step = (kwargs.get("data") or {}).get("step", self.step)
        self.log.put(("event", step, (getattr(kind, "value", kind), message)))
        if self.inner is not None:
            self.inner.event(kind, message, **kwargs)

    def checkpoint(self, record: CheckpointRecord) -> None:
        # Marked by its checkpoint_saved event; the record itself is the reporter's.
        if self.inner is not None:
            self.inner.checkpoint(record)

    def flush(self, timeout: float = 5.0) -> bool:
        return True if self.inner is None else self.inner.flush(timeout=timeout)

    def close(self) -> None:
        """Close the TensorBoard log (the reporter is its owner's to close)."""
        self.log.close()


class _Off:
    def close(self) -> None:
        """Nothing to close."""


def with_tensorboard(enabled: bool | None, env, *, start: int):
    """``(env, closer)``: on rank 0 of a job that asks for TensorBoard with a local
    checkpoint root, ``env`` with its reporter behind a :class:`TensorBoardTee`."""
    if not enabled or env.rank != 0 or not env.checkpoint_root:
        return env, _Off()
    logdir = tensorboard_dir(env.checkpoint_root)
    if logdir is None:
        log.warning("tensorboard: only a local checkpoint root is written; skipping")
        return env, _Off()
    tee = TensorBoardTee(env.reporter, TensorBoardLog(logdir), step=start)
    return dataclasses.replace(env, reporter=tee), tee
