"""TensorBoard event files for a job, written by rank 0 off the training thread.

:func:`with_tensorboard` puts a :class:`TensorBoardTee` in front of the run's reporter:
each metric, event and checkpoint record still goes to the reporter, and is also put on
a queue that one daemon thread writes as event files under ``<checkpoint root>/tensorboard``:
the step's scalars ``train/*`` (one event per step), each job event as text and a marker
scalar ``events/<kind>`` at the step it happened (a restore whose group size changed is
also marked ``events/resized``), and TensorBoard's restart record (SessionLog START) at
the first step the run computes, so the points a restarted run computes again replace
those of the run that was lost.

A local checkpoint root gets the files in place. On an object store (``s3://``,
``gs://``) they are written to a local spool folder and uploaded whole, through the
job's store options and credentials, by the same thread every ``_UPLOAD_S`` seconds and
at close; a failed upload is logged and tried again at the next one. A file is closed
and a new one begun past ``_ROTATE_BYTES``, so an upload sends at most that much per
file. The step never waits on a file or on the store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid

from workers.contract import CheckpointRecord, EventKind, MetricPoint
from workers.storage.confine import Roots, check_folder
from workers.storage.location import StorageLocation

log = logging.getLogger(__name__)

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "world_size", "step_time_s")
_STOP = object()
_BATCH_S = 1.0  # seconds between writes
_FLUSH_S = 5.0  # local files are flushed this often
_UPLOAD_S = 10.0  # object-store copies are brought up to date this often
_ROTATE_BYTES = 8 << 20  # a new event file past this size
_CLOSE_WAIT_S = 30.0


class EventFiles:
    """Event files in one local folder; a new file past ``rotate_bytes``. Names sort in the
    order the files were begun, which is the order TensorBoard reads a folder's files in."""

    def __init__(self, folder: str, *, rotate_bytes: int = _ROTATE_BYTES):
        self.folder, self.rotate_bytes = folder, rotate_bytes
        # Names hold the second a file is begun; this orders (and tells apart) two runs
        # begun in the same second on one host.
        self.run = f"{time.time_ns()}-{uuid.uuid4().hex[:4]}"
        self.count, self.size = 0, 0
        self._writer = None  # begun by the first write, on the writing thread

    def _begin(self):
        from tensorboardX.event_file_writer import EventsWriter

        self.count += 1
        self.size = 0
        os.makedirs(self.folder, exist_ok=True)
        return EventsWriter(os.path.join(self.folder, "events"), self.suffix)

    @property
    def suffix(self) -> str:
        """How the name of the file being written ends."""
        return f".{self.run}.{self.count:04d}"

    def write(self, event) -> None:
        """Append one Event proto; begin a new file once this one is past the size."""
        if self._writer is None:
            self._writer = self._begin()
        self._writer.write_event(event)
        self.size += event.ByteSize() + 16  # a record's length, CRCs and payload
        if self.size >= self.rotate_bytes:
            self._writer.close()
            self._writer = self._begin()

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class Upload:
    """Brings copies of a spool folder's event files up to date under ``store``'s root
    (a :class:`~workers.storage.location.StorageLocation` of ``<root>/tensorboard``)."""

    def __init__(self, store, spool: str):
        self.store, self.spool = store, spool
        self.sent: dict[str, int] = {}  # file name -> size of its last copy

    def sync(self, current: str | None) -> bool:
        """Upload each file that changed since its last copy; delete the local copy of each
        file that is done (every file whose name does not end with ``current``). True when
        the store holds everything; a failure is logged and left to the next call."""
        try:
            if self.store.scheme == "file":
                self.store.fs.makedirs(self.store.root, exist_ok=True)
            for name in sorted(os.listdir(self.spool) if os.path.isdir(self.spool) else []):
                path = os.path.join(self.spool, name)
                size = os.path.getsize(path)
                if self.sent.get(name) != size:
                    self.store.fs.put_file(path, self.store.join(name))
                    self.sent[name] = size
                if current is None or not name.endswith(current):
                    os.remove(path)
        except Exception as e:  # noqa: BLE001 - the store is down, refuses the keys...: later
            reason = f"{type(e).__name__}: {str(e)[:200]}"
            log.warning(
                "tensorboard: copying event files to %s failed (%s); trying again in %.0f s",
                self.store.uri,
                reason,
                _UPLOAD_S,
            )
            return False
        return True


class TensorBoardLog:
    """Queues scalars and text events; a background thread writes (and uploads) them."""

    def __init__(self, files: EventFiles, *, start: int = 0, upload: Upload | None = None):
        self.files, self.upload = files, upload
        self.logdir = files.folder
        self._every = _UPLOAD_S if upload is not None else _FLUSH_S
        self._last = time.monotonic()
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._wake = threading.Event()
        self._queue.put(("start", start + 1, None))
        self._thread = threading.Thread(target=self._run, name="etrain-tensorboard", daemon=True)
        self._thread.start()

    def put(self, item: tuple) -> None:
        """Queue a record (never blocks the step; dropped when the queue is full)."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            log.warning("tensorboard queue full; a record was dropped")

    def _take(self) -> list:
        """What queued up: waits for the first record up to the flush interval."""
        try:
            items = [self._queue.get(timeout=self._every)]
        except queue.Empty:
            return []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    def _run(self) -> None:
        # Wakes at most once a second (unless a checkpoint waits) and writes what queued
        # up since: few thread switches against the training thread, whatever the step rate.
        while True:
            items = self._take()
            waiting = [item[2] for item in items if item is not _STOP and item[0] == "sync"]
            for item in items:
                if item is _STOP:
                    self._finish()
                    return
                try:
                    if item[0] != "sync":
                        self._write(*item)
                except Exception:  # a bad record must not stop the others
                    log.exception("tensorboard write failed")
            if waiting or time.monotonic() - self._last >= self._every:
                self._last = time.monotonic()
                self.files.flush()
                if self.upload is not None:
                    self.upload.sync(current=self.files.suffix)
            for done in waiting:
                done.set()
            self._wake.wait(_BATCH_S)
            self._wake.clear()

    def request_sync(self) -> threading.Event:
        """Ask the background thread to write what is queued now and copy the files to the
        object store (when it answers); the event is set once it has."""
        done = threading.Event()
        self.put(("sync", 0, done))
        self._wake.set()
        return done

    def _finish(self) -> None:
        self.files.close()
        if self.upload is None:
            return
        for attempt in range(3):
            if self.upload.sync(current=None):
                shutil.rmtree(self.files.folder, ignore_errors=True)
                return
            time.sleep(2**attempt)
        log.warning("tensorboard: event files not copied to the store are in %s", self.logdir)

    def _write(self, what: str, step: int, payload) -> None:
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import text

        if what == "metric":  # one event per step holding every scalar: cheapest to write
            values = [
                Summary.Value(tag=f"train/{name}", simple_value=float(value))
                for name in SCALARS
                if (value := getattr(payload, name, None)) is not None
            ]
            wall = payload.ts or time.time()
            self.files.write(Event(wall_time=wall, step=step, summary=Summary(value=values)))
        elif what == "start":  # TensorBoard drops what an earlier run wrote from here on
            start = SessionLog(status=SessionLog.START)
            self.files.write(Event(wall_time=time.time(), step=step, session_log=start))
        else:
            kind, message = payload
            marker = Summary.Value(tag=f"events/{kind}", simple_value=1.0)
            summary = Summary(value=[*text(f"events/{kind}", message).value, marker])
            self.files.write(Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        """Write what is queued, close the file and (object stores) upload it."""
        self._queue.put(_STOP)
        self._wake.set()
        self._thread.join(timeout=_CLOSE_WAIT_S)
        if self._thread.is_alive():
            log.warning("tensorboard: event files still being written after %.0f s", _CLOSE_WAIT_S)


class TensorBoardTee:
    """The run's reporter (or none) plus the TensorBoard log: what one gets, both get."""

    def __init__(self, inner, log_: TensorBoardLog, *, step: int):
        # Events before the first metric are marked at the step the run starts from.
        self.inner, self.log, self.step = inner, log_, step

    def metric(self, point: MetricPoint) -> None:
        self.step = point.step
        self.log.put(("metric", point.step, point))
        if self.inner is not None:
            self.inner.metric(point)

    def event(self, kind, message: str, **kwargs) -> None:
        data = kwargs.get("data") or {}
        step = data.get("step", self.step)
        kind_name = getattr(kind, "value", kind)
        self.log.put(("event", step, (kind_name, message)))
        saved = data.get("saved_world_size")
        if kind_name == EventKind.RESTORED.value and saved not in (None, data.get("world_size")):
            self.log.put(("event", step, ("resized", message)))
        if self.inner is not None:
            self.inner.event(kind, message, **kwargs)

    def checkpoint(self, record: CheckpointRecord) -> None:
        # Marked by its checkpoint_saved event; the record itself is the reporter's.
        if self.inner is not None:
            self.inner.checkpoint(record)

    def flush(self, timeout: float = 5.0) -> bool:
        """The reporter's flush, and the event files brought up to date in the same time
        (a checkpoint waits for both, so a run restored from it finds the steps it covers
        in TensorBoard as well). The reporter's answer: the event files are best effort."""
        deadline = time.monotonic() + timeout
        done = self.log.request_sync()
        sent = True if self.inner is None else self.inner.flush(timeout=timeout)
        done.wait(max(0.0, deadline - time.monotonic()))
        return sent

    def close(self) -> None:
        """Close the TensorBoard log (the reporter is its owner's to close)."""
        self.log.close()


class _Off:
    def close(self) -> None:
        """Nothing to close."""


def open_log(checkpoints: StorageLocation, *, start: int) -> TensorBoardLog:
    """The log of a run whose checkpoints live at ``checkpoints``: in ``tensorboard/``
    there, in place when that is local, else spooled here and uploaded through the same
    store."""
    where = checkpoints.child("tensorboard")
    if where.scheme == "file":
        # Beneath the job's write roots, no link in the path, checked as it is made.
        folder = check_folder(where.root, Roots.from_env(), write=True, create=True)
        return TensorBoardLog(EventFiles(folder), start=start)
    spool = tempfile.mkdtemp(prefix="etrain-tensorboard-")
    return TensorBoardLog(EventFiles(spool), start=start, upload=Upload(where, spool))


def with_tensorboard(enabled: bool | None, env, *, start: int):
    """``(env, closer)``: on rank 0 of a job that asks for TensorBoard and keeps
    checkpoints (``env.checkpoints``), ``env`` with its reporter behind a
    :class:`TensorBoardTee`."""
    if not enabled or env.rank != 0 or env.checkpoints is None:
        return env, _Off()
    try:
        tb_log = open_log(env.checkpoints, start=start)
    except Exception as e:  # noqa: BLE001 - curves are not worth failing the job over
        log.warning("tensorboard: no event files for this run (%s: %s)", type(e).__name__, e)
        return env, _Off()
    tee = TensorBoardTee(env.reporter, tb_log, step=start)
    return dataclasses.replace(env, reporter=tee), tee
