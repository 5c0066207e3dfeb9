"""The job as an MLflow run (``metrics.mlflow``), logged by rank 0 off the training thread.

The run goes in ``experiment`` (made when missing), is named after the job and tagged
``etrain.job_id``: a restarted job finds and continues its run (steps it computes again are
logged again; the history keeps both, the later one last). Params: the whole spec,
flattened (``train.lr``), once when the run is made. Metrics: every number of each step's
:class:`~workers.contract.MetricPoint` under its field name (``loss``, ``lr``,
``grad_norm``, ``tokens_per_s``, ...; ``eval_loss`` and ``eval_perplexity`` on the steps
that evaluate) at that step. Events: a tag ``event.<step>.<kind>`` each, and a line each of
the ``events.txt`` artifact. A ``file:`` tracking URI names a folder that gets a SQLite
store, ``mlflow.db``, and the runs' ``artifacts/`` (``mlflow ui --backend-store-uri
sqlite:///<folder>/mlflow.db``). ``log_model``: at the end, ``checkpoint.json`` (the final
checkpoint's URI, step, size and eval_loss), the tag ``etrain.checkpoint``, and the
checkpoint exported into ``model/`` (``workers.checkpoint.export_final``).

The client's HTTP timeout and retries are bounded here (``MLFLOW_HTTP_REQUEST_*``, set in
rank 0's environment), its credentials come from the job's secret
(:mod:`workers.telemetry.tracking`), and its usage telemetry is off.
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit

from workers.storage.confine import Roots, check_folder
from workers.telemetry.tracking import TrackingSink, measured

# The client's own knobs, for rank 0's process: a server that does not answer costs a
# batch at most about (1 + retries) x timeout on the sink's thread.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
_MAX_METRICS, _MAX_TAGS, _MAX_PARAMS = 1000, 100, 100  # per log_batch call
_TAG_CHARS = 5000


class MlflowSink(TrackingSink):
    """One job's MLflow run (see the module docstring)."""

    name = "mlflow"

    def __init__(self, section, *, job_id: str, params: dict[str, str], reporter, exporter=None):
        super().__init__(
            job_id=job_id, params=params, reporter=reporter, section=section, exporter=exporter
        )
        self.client, self.run_id = None, None
        self.events: list[str] = []  # events.txt, re-uploaded whole when it grows
        self.start()

    def _store(self) -> tuple[str, str | None]:
        """``(tracking URI, artifact location of a new experiment or None)``: a ``file:``
        folder (beneath the job's write roots, made at use) holds a SQLite store
        ``mlflow.db`` and its ``artifacts/``; MLflow's file store is in maintenance."""
        uri = self.section.tracking_uri
        if urlsplit(uri).scheme != "file":
            return uri, None
        folder = check_folder(urlsplit(uri).path, Roots.from_env(), write=True, create=True)
        return f"sqlite:///{folder}/mlflow.db", f"file://{folder}/artifacts"

    def open(self) -> None:
        for name, value in {**CLIENT_ENV, **self.credentials}.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri, artifacts = self._store()
        client = MlflowClient(tracking_uri=uri)
        name = self.section.experiment
        found = client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else client.create_experiment(name, artifacts)
        runs = client.search_runs(
            [experiment], filter_string=f"tags.`etrain.job_id` = '{self.job_id}'", max_results=1
        )
        if runs:
            self.run_id = runs[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            self.events = _earlier_events(client, self.run_id)
        else:
            tags = {"etrain.job_id": self.job_id}
            self.run_id = client.create_run(experiment, run_name=self.job_id, tags=tags).info.run_id
            params = [Param(k, v) for k, v in self.params.items()]
            for i in range(0, len(params), _MAX_PARAMS):
                client.log_batch(self.run_id, params=params[i : i + _MAX_PARAMS])
        self.client = client

    def send(self, items: list[tuple]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics, tags, events = [], [], 0
        for what, step, payload in items:
            if what == "metric":
                ms = int((payload.ts or time.time()) * 1000)
                metrics += [Metric(k, v, ms, step) for k, v in measured(payload).items()]
            elif what == "event":
                kind, message = payload
                tags.append(RunTag(f"event.{step}.{kind}", message[:_TAG_CHARS]))
                self.events.append(f"step {step}: {kind}: {message}")
                events += 1
        for i in range(0, len(metrics), _MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _MAX_METRICS])
        for i in range(0, len(tags), _MAX_TAGS):
            self.client.log_batch(self.run_id, tags=tags[i : i + _MAX_TAGS])
        if events:
            self.client.log_text(self.run_id, "\n".join(self.events) + "\n", "events.txt")

    def end(self, checkpoint) -> None:
        if self.section.log_model and checkpoint is not None:
            record = checkpoint.model_dump(mode="json", exclude={"deleted_steps"})
            self.client.log_dict(self.run_id, record, "checkpoint.json")
            self.client.set_tag(self.run_id, "etrain.checkpoint", checkpoint.uri)
            with self.exported(checkpoint) as folder:
                if folder is not None:
                    self.client.log_artifacts(self.run_id, folder, "model")
        self.client.set_terminated(self.run_id, "FINISHED")


def _earlier_events(client, run_id: str) -> list[str]:
    """The lines of a continued run's events.txt (none when it has none)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="etrain-mlflow-") as tmp:
        try:
            path = client.download_artifacts(run_id, "events.txt", tmp)
        except Exception:  # noqa: BLE001 - a run that logged no event has no events.txt
            return []
        with open(path) as f:
            return f.read().splitlines()
