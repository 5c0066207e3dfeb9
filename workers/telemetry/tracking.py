"""Experiment trackers (MLflow: :mod:`.mlflow_sink`, Weights & Biases: :mod:`.wandb_sink`):
rank 0's run, logged from a :class:`~workers.telemetry.sink.Sink`'s background thread.

A tracker that is down, slow or refuses the run never fails or holds up the job. The
training thread only queues (a bounded queue: a full one drops the record and counts it);
the sink's thread talks to the tracker with the client's own timeouts, and a batch it
could not send is dropped and counted, after which the sink waits ``retry_s`` before it
tries again (what comes meanwhile is dropped too). The first failure is reported as a
``tracking_failed`` job event (and logged); at the end, one more says how many records the
tracker did not get. Closing waits at most ``close_wait_s``.

Credentials: ``credentials_secret: NAME`` of the tracker's section names the variables
``ETRAIN_SECRET_<NAME>_<VARIABLE>`` (:data:`workers.storage.credentials.TRACKING_VARIABLES`)
that rank 0 hands to the client as ``<VARIABLE>`` (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY...).
Without a secret the client gets none: rank 0 clears those variables, so a job never sends
keys the node's environment happens to hold. Failure messages are cut short and have the
secret's values masked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from workers.contract import CheckpointRecord, EventKind, MetricPoint
from workers.storage.credentials import TRACKING_VARIABLES, tracking_env_names
from workers.telemetry.sink import Sink

log = logging.getLogger(__name__)

_RETRY_S = 30.0
# MetricPoint fields that say when and where, not what was measured.
_NOT_LOGGED = {"step", "ts"}


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """``{"train.lr": "0.01", ...}``: every leaf of a nested mapping under its dotted path;
    lists as JSON."""
    if not isinstance(data, Mapping):
        value = json.dumps(data) if isinstance(data, list | tuple) else str(data)
        return {prefix: value}
    out: dict[str, str] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def spec_params(spec) -> dict[str, str]:
    """The whole job spec as flat params (a spec never holds a secret)."""
    return flatten(spec.model_dump(mode="json", exclude_none=True))


def measured(point: MetricPoint) -> dict[str, float]:
    """The numbers ``point`` carries (loss, lr, grad_norm, tokens_per_s, ...; eval_loss and
    eval_perplexity on the steps that evaluate), by field name."""
    return {
        name: float(value)
        for name, value in point.model_dump().items()
        if name not in _NOT_LOGGED
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }


def client_credentials(
    tracker: str, secret: str | None, env: Mapping[str, str] | None = None
) -> dict[str, str | None]:
    """The tracker client's credential variables -> their values from ``secret``'s
    ``ETRAIN_SECRET_<NAME>_*`` in ``env`` (default: this process's); None for each one
    that is not set, and for all of them without a secret."""
    env = os.environ if env is None else env
    names = TRACKING_VARIABLES[tracker]
    values = [env.get(n) for n in tracking_env_names(tracker, secret)] if secret else []
    return {name: (values[i] or None) if values else None for i, name in enumerate(names)}


def run_id_for(job_id: str) -> str:
    """A tracker-safe id made from the job's (letters, digits, '-', '_')."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", job_id)[:64] or "etrain"


class TrackingSink(Sink):
    """A tracker's sink: subclasses open the run (:meth:`open`), send batches
    (:meth:`send`) and end it (:meth:`end`); this class counts and reports what is lost."""

    name = "tracking"
    close_wait_s = 15.0
    retry_s = _RETRY_S

    def __init__(
        self,
        *,
        job_id: str,
        params: dict[str, str],
        reporter,
        section=None,
        secrets=(),
        exporter=None,
    ):
        """``section``: the spec's ``metrics.<name>``; its credentials secret gives the
        client's variables (``self.credentials``), whose values messages never show."""
        super().__init__(maxsize=10_000)
        self.job_id, self.params, self.reporter = job_id, params, reporter
        self.section = section
        secret = getattr(section, "credentials_secret", None)
        self.credentials = client_credentials(self.name, secret) if section is not None else {}
        secrets = [*secrets, *self.credentials.values()]
        # (checkpoint URI, empty folder) -> the folder with the exported model (log_model).
        self.exporter = exporter
        self.secrets = [s for s in secrets if s]
        self.failed = 0  # records a failed send lost
        self.opened = False
        self.last_checkpoint: CheckpointRecord | None = None
        self._retry_at = 0.0
        self._reported = False

    # -- what a tracker implements ------------------------------------------------------------

    def open(self) -> None:
        """Start (or continue) the job's run."""
        raise NotImplementedError

    def send(self, items: list[tuple]) -> None:
        """Log a batch of ``(what, step, payload)`` records to the open run."""
        raise NotImplementedError

    def end(self, checkpoint: CheckpointRecord | None) -> None:
        """Log the final checkpoint (when asked to) and end the run."""
        raise NotImplementedError

    @contextlib.contextmanager
    def exported(self, checkpoint: CheckpointRecord | None) -> Iterator[str | None]:
        """The final checkpoint exported into a temporary folder, for the tracker to upload
        while it exists; None without an exporter or a checkpoint, or when the export fails
        (that is reported like a failed send: the run still ends)."""
        if self.exporter is None or checkpoint is None:
            yield None
            return
        with tempfile.TemporaryDirectory(prefix="etrain-model-") as tmp:
            try:
                folder = self.exporter(checkpoint.uri, tmp)
            except Exception as e:  # noqa: BLE001 - the run ends without the model
                self._failure(e)
                folder = None
            yield folder

    # -- the sink ---------------------------------------------------------------------------

    def write(self, items: list[tuple]) -> None:
        for what, _step, payload in items:
            if what == "checkpoint":
                self.last_checkpoint = payload
        if not items:
            return
        if time.monotonic() < self._retry_at:
            self.failed += len(items)
            return
        try:
            if not self.opened:
                self.open()
                self.opened = True
            self.send(items)
        except Exception as e:  # noqa: BLE001 - whatever the client raises, the job goes on
            self._retry_at = time.monotonic() + self.retry_s
            self.failed += len(items)
            self._failure(e)

    def finish(self) -> None:
        try:
            if self.opened:
                self.end(self.last_checkpoint)
        except Exception as e:  # noqa: BLE001
            self._failure(e)
        lost = self.failed + self.dropped
        if lost:
            self._report(
                f"{self.name}: {lost} of the run's records did not reach the tracker "
                f"({self.dropped} dropped from a full queue, {self.failed} not taken)",
                lost=lost,
            )

    def _failure(self, error: BaseException) -> None:
        reason = self._mask(f"{type(error).__name__}: {str(error)[:300]}")
        log.warning("%s: tracking failed (%s); the job goes on", self.name, reason)
        if not self._reported:
            self._reported = True
            self._report(
                f"{self.name}: tracking failed ({reason}); the job goes on, records are "
                f"dropped and tried again after {self.retry_s:.0f} s",
                lost=self.failed,
            )

    def _mask(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def _report(self, message: str, *, lost: int) -> None:
        if self.reporter is None:
            return
        try:
            self.reporter.event(
                EventKind.TRACKING_FAILED,
                message,
                data={"tracker": self.name, "lost": lost},
                dedup_key=f"tracking:{self.name}:{uuid.uuid4().hex[:12]}",
            )
        except Exception:  # the reporter has its own failures to say
            log.exception("%s: could not report the failure", self.name)
