"""Experiment tracking without a tracker: the spec's metrics.mlflow / metrics.wandb rules,
the secret -> variable mapping, and the sink's failure accounting (a tracker stand-in that
fails, on the sink's real thread and queue). Real MLflow and W&B runs are read back in
tests/integration/test_tracking.py."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError

from tests.support.recording import RecordingReporter
from workers.contract import EventKind, MetricPoint
from workers.spec import JobSpec
from workers.storage.credentials import tracking_env_names
from workers.storage.location import job_credential_env, job_credential_env_names
from workers.telemetry.sink import ReporterTee
from workers.telemetry.tracking import (
    TrackingSink,
    client_credentials,
    flatten,
    measured,
    run_id_for,
    spec_params,
)

MLFLOW = {"tracking_uri": "https://mlflow.example.com", "experiment": "llama"}
WANDB = {"project": "llama", "entity": "team-a", "mode": "offline"}


def _spec(**metrics) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "metrics": metrics})


def _refused(**metrics) -> str:
    with pytest.raises(ValidationError) as e:
        _spec(**metrics)
    return str(e.value)


def test_a_spec_names_its_trackers():
    spec = _spec(mlflow={**MLFLOW, "log_model": True}, wandb=WANDB)
    assert spec.metrics.mlflow.tracking_uri == "https://mlflow.example.com"
    assert spec.metrics.mlflow.log_model and not spec.metrics.wandb.log_model
    assert spec.metrics.wandb.mode == "offline"
    assert _spec(wandb={"project": "p"}).metrics.wandb.mode == "online"
    assert _spec().metrics.mlflow is None and _spec().metrics.wandb is None
    local = _spec(mlflow={**MLFLOW, "tracking_uri": "file:///data/ckpt/team-a/mlflow/"})
    assert local.metrics.mlflow.tracking_uri == "file:///data/ckpt/team-a/mlflow"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("https://alice:s3cr3t-pw@mlflow.example.com", "must not carry credentials"),
        ("https://mlflow.example.com/?token=s3cr3t-pw", "must not carry credentials"),
        ("databricks://s3cr3t-pw", "must be http(s)://host[:port]"),
        ("sqlite:///s3cr3t-pw.db", "must be http(s)://host[:port]"),
        ("file:relative/s3cr3t-pw", "file:///absolute/folder"),
        ("file://host/s3cr3t-pw", "file:///absolute/folder"),
        ("https://mlflow.example.com/\ns3cr3t-pw", "control characters"),
    ],
)
def test_a_tracking_uri_is_a_server_or_a_local_folder_and_never_holds_a_key(uri, words):
    message = _refused(mlflow={**MLFLOW, "tracking_uri": uri})
    assert "metrics.mlflow.tracking_uri" in message and words in message
    assert "s3cr3t-pw" not in message


@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
def test_a_credentials_secret_is_a_name_never_a_key(tracker):
    section = {
        **(MLFLOW if tracker == "mlflow" else WANDB),
        "credentials_secret": "0123ABCDkey/xyz",
    }
    message = _refused(**{tracker: section})
    assert f"metrics.{tracker}.credentials_secret must be the NAME" in message
    assert "0123ABCDkey/xyz" not in message


@pytest.mark.parametrize(
    "section",
    [
        {**WANDB, "project": "a/b"},
        {**WANDB, "entity": "x:y"},
        {**WANDB, "mode": "disabled"},
        {**WANDB, "extra": 1},
        {"project": ""},
    ],
)
def test_wandb_names_and_modes(section):
    assert "metrics.wandb" in _refused(wandb=section) or "wandb" in _refused(wandb=section)


def test_the_secret_names_the_variables_the_workers_get():
    assert tracking_env_names("mlflow", "team-a") == (
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_TOKEN",
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_USERNAME",
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_PASSWORD",
    )
    assert tracking_env_names("wandb", "team-a") == ("ETRAIN_SECRET_TEAM_A_WANDB_API_KEY",)
    spec = _spec(
        mlflow={**MLFLOW, "credentials_secret": "team-a"},
        wandb={**WANDB, "credentials_secret": "team-a-wb"},
    )
    env = {
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_TOKEN": "tok",
        "ETRAIN_SECRET_TEAM_A_WB_WANDB_API_KEY": "key",
        "ETRAIN_SECRET_OTHER_WANDB_API_KEY": "not-this-jobs",
        "MLFLOW_TRACKING_TOKEN": "the-service-own",
    }
    assert job_credential_env_names(spec) == (
        *tracking_env_names("mlflow", "team-a"),
        *tracking_env_names("wandb", "team-a-wb"),
    )
    assert job_credential_env(spec, env=env) == {
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_TOKEN": "tok",
        "ETRAIN_SECRET_TEAM_A_WB_WANDB_API_KEY": "key",
    }
    assert job_credential_env(_spec(mlflow=MLFLOW), env=env) == {}
    # Rank 0 hands the client its own variable names, and none without a secret.
    assert client_credentials("mlflow", "team-a", env) == {
        "MLFLOW_TRACKING_TOKEN": "tok",
        "MLFLOW_TRACKING_USERNAME": None,
        "MLFLOW_TRACKING_PASSWORD": None,
    }
    assert client_credentials("wandb", None, env) == {"WANDB_API_KEY": None}


def test_params_are_the_whole_spec_flattened():
    spec = _spec(mlflow=MLFLOW)
    params = spec_params(spec)
    assert params["train.lr"] == str(spec.train.lr)
    assert params["metrics.mlflow.experiment"] == "llama"
    assert params["name"] == "t"
    assert flatten({"a": {"b": [1, 2], "c": None}}) == {"a.b": "[1, 2]", "a.c": "None"}
    point = MetricPoint(step=3, world_size=2, loss=1.5, eval_loss=2.0, ts=1.0)
    assert measured(point) == {"world_size": 2.0, "loss": 1.5, "eval_loss": 2.0}
    assert run_id_for("j-1/x y") == "j-1-x-y"


class Tracker(TrackingSink):
    """A tracker stand-in: keeps what it is sent, or fails like a server that is down."""

    name = "fake"

    def __init__(self, *, fail=False, block: threading.Event | None = None, **kwargs):
        self.fail, self.block, self.sent, self.ended = fail, block, [], None
        super().__init__(
            job_id="j-1", params={}, reporter=kwargs.get("reporter"), **kwargs.get("extra", {})
        )
        self.batch_s = self.idle_s = 0.05
        self.start()

    def open(self) -> None:
        if self.fail:
            raise ConnectionError("connection refused by 127.0.0.1:9 (token tok-123)")

    def send(self, items) -> None:
        if self.block is not None:
            self.block.wait()
        self.sent += items

    def end(self, checkpoint) -> None:
        self.ended = checkpoint


def _points(n):
    return [MetricPoint(step=s, world_size=1, loss=1.0 / s) for s in range(1, n + 1)]


def test_a_tracker_gets_every_record_in_order():
    reporter = RecordingReporter()
    tracker = Tracker(reporter=reporter)
    tee = ReporterTee(reporter, [tracker], step=0)
    for point in _points(20):
        tee.metric(point)
    tee.event(EventKind.CHECKPOINT_SAVED, "saved", data={"step": 20})
    tee.close()
    metrics = [p for what, _, p in tracker.sent if what == "metric"]
    assert [p.loss for p in metrics] == [p.loss for p in reporter.metrics]
    assert ("event", 20, ("checkpoint_saved", "saved")) in tracker.sent
    assert reporter.kinds() == [("checkpoint_saved", "saved", {"step": 20})]


def test_a_tracker_that_fails_costs_records_and_says_so_once_never_the_job():
    reporter = RecordingReporter()
    tracker = Tracker(fail=True, reporter=reporter, extra={"secrets": ["tok-123"]})
    tee = ReporterTee(reporter, [tracker], step=0)
    for point in _points(50):
        tee.metric(point)
        time.sleep(0.002)
    tee.close()
    failed = [e for e in reporter.events if e.kind == EventKind.TRACKING_FAILED.value]
    assert len(failed) == 2  # the first failure, and the count at the end
    assert "fake: tracking failed (ConnectionError: connection refused" in failed[0].message
    assert "tok-123" not in failed[0].message and "***" in failed[0].message
    assert failed[1].data == {"tracker": "fake", "lost": 50}
    assert len(reporter.metrics) == 50  # the job's own telemetry is whole


def test_a_stuck_tracker_drops_what_does_not_fit_and_the_step_never_waits():
    reporter, stuck = RecordingReporter(), threading.Event()
    tracker = Tracker(block=stuck, reporter=reporter)
    tracker._queue.maxsize = 10
    tracker.close_wait_s = 0.5
    tee = ReporterTee(reporter, [tracker], step=0)
    # A put that waited on the stuck thread would never return: the loop ends at all.
    feeding = threading.Thread(target=lambda: [tee.metric(p) for p in _points(1000)])
    feeding.start()
    feeding.join(timeout=30)
    assert not feeding.is_alive()
    assert tracker.dropped > 900
    started = time.monotonic()
    tee.close()  # the tracker is still stuck: closing waits its bound, no more
    assert time.monotonic() - started < 2.0
    stuck.set()
