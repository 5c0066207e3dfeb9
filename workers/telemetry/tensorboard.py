"""TensorBoard event files for a job, written by rank 0 off the training thread.

:func:`with_tensorboard` puts a tee (:class:`workers.telemetry.sink.ReporterTee`) in front
of the run's reporter: each metric, event and checkpoint record still goes to the reporter,
and is also put on a queue that one daemon thread writes as event files under
``<checkpoint root>/tensorboard``:
the step's scalars ``train/*`` (one event per step; ``eval/loss`` and ``eval/perplexity``
in it on the steps that evaluate), each job event as text and a marker
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

import logging
import os
import shutil
import tempfile
import time
import uuid

from workers.storage.confine import Roots, check_folder
from workers.storage.location import StorageLocation
from workers.telemetry.sink import ReporterTee, Sink, attach

log = logging.getLogger(__name__)

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "world_size", "step_time_s")
EVAL_SCALARS = {"eval_loss": "eval/loss", "eval_perplexity": "eval/perplexity"}
# An objective's own metrics (objective dpo's rewards), under their own heading.
OBJECTIVE_SCALARS = {
    f"rewards_{name}": f"rewards/{name}" for name in ("chosen", "rejected", "margin", "accuracy")
}
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


class TensorBoardLog(Sink):
    """Scalars and text events, written (and uploaded) by the sink's background thread."""

    name = "tensorboard"
    close_wait_s = _CLOSE_WAIT_S
    waits_on_flush = True  # a checkpoint's flush brings the files up to date

    def __init__(self, files: EventFiles, *, start: int = 0, upload: Upload | None = None):
        super().__init__(maxsize=100_000)
        self.files, self.upload = files, upload
        self.logdir = files.folder
        self.idle_s = _UPLOAD_S if upload is not None else _FLUSH_S
        self._last = time.monotonic()
        self.put(("start", start + 1, None))
        self.start()

    def write(self, items: list[tuple]) -> None:
        for item in items:
            try:
                self._write(*item)
            except Exception:  # a bad record must not stop the others
                log.exception("tensorboard write failed")

    def tick(self, *, forced: bool) -> None:
        if forced or time.monotonic() - self._last >= self.idle_s:
            self._last = time.monotonic()
            self.files.flush()
            if self.upload is not None:
                self.upload.sync(current=self.files.suffix)

    def finish(self) -> None:
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
            tags = {name: f"train/{name}" for name in SCALARS} | EVAL_SCALARS | OBJECTIVE_SCALARS
            values = [
                Summary.Value(tag=tag, simple_value=float(value))
                for name, tag in tags.items()
                if (value := getattr(payload, name, None)) is not None
            ]
            wall = payload.ts or time.time()
            self.files.write(Event(wall_time=wall, step=step, summary=Summary(value=values)))
        elif what == "start":  # TensorBoard drops what an earlier run wrote from here on
            start = SessionLog(status=SessionLog.START)
            self.files.write(Event(wall_time=time.time(), step=step, session_log=start))
        elif what == "event":  # a checkpoint is marked by its checkpoint_saved event
            kind, message = payload
            marker = Summary.Value(tag=f"events/{kind}", simple_value=1.0)
            summary = Summary(value=[*text(f"events/{kind}", message).value, marker])
            self.files.write(Event(wall_time=time.time(), step=step, summary=summary))


class TensorBoardTee(ReporterTee):
    """The run's reporter (or none) plus the TensorBoard log: what one gets, both get."""

    def __init__(self, inner, log_: TensorBoardLog, *, step: int):
        super().__init__(inner, [log_], step=step)
        self.log = log_


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


def open_tensorboard(enabled: bool | None, env, *, start: int) -> TensorBoardLog | None:
    """The log of rank 0 of a job that asks for TensorBoard and keeps checkpoints
    (``env.checkpoints``); None for any other rank or job, or when it cannot be opened."""
    if not enabled or env.rank != 0 or env.checkpoints is None:
        return None
    try:
        return open_log(env.checkpoints, start=start)
    except Exception as e:  # noqa: BLE001 - curves are not worth failing the job over
        log.warning("tensorboard: no event files for this run (%s: %s)", type(e).__name__, e)
        return None


def with_tensorboard(enabled: bool | None, env, *, start: int):
    """``(env, closer)``: on rank 0 of a job that asks for TensorBoard and keeps
    checkpoints, ``env`` with its reporter behind a tee to the TensorBoard log."""
    return attach(env, [open_tensorboard(enabled, env, start=start)], step=start)
