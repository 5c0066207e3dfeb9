"""Experiment tracking read back as the tracker keeps it: MLflow runs from a real
``mlflow server`` (SQLite, on loopback) through MlflowClient, W&B offline runs from the
``.wandb`` file W&B writes; both from the sinks fed points directly, and from one real
one-process training run. A tracking server that is down costs the job nothing but its
curves, and says so."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.support.mlflow_server import free_port
from tests.support.recording import RecordingReporter
from tests.support.wandb_records import artifacts, history, run_file, runs
from workers.checkpoint.export import export_checkpoint
from workers.contract import CheckpointRecord, EventKind, MetricPoint
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.telemetry.outputs import open_trackers
from workers.telemetry.sink import ReporterTee
from workers.telemetry.tracking import spec_params
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

STEPS, EVAL_EVERY = 40, 10


def _spec(metrics: dict, **train) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "tracked",
            "data": {"seq_len": 16, "num_samples": 64, "eval_fraction": 0.25},
            "resources": {"workers": 1},
            "train": {
                "steps": 6,
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "lr": 1e-2,
                "eval_every_steps": 3,
                **train,
            },
            "checkpoint": {"every_steps": 3, "keep_last": 2},
            "metrics": metrics,
        }
    )


@dataclasses.dataclass
class Env:
    """What open_trackers reads of a RunEnv."""

    reporter: RecordingReporter
    checkpoints: object = None
    rank: int = 0


def _feed(tee, *, first=1, last=STEPS, ckpt_root="/tmp/ck"):
    """Points like the loop's (eval_* on every EVAL_EVERY-th step), a checkpoint event and
    record at the last step."""
    for step in range(first, last + 1):
        evaluated = (
            {"eval_loss": 3.0 / step, "eval_perplexity": 1.5} if step % EVAL_EVERY == 0 else {}
        )
        tee.metric(
            MetricPoint(
                step=step,
                world_size=1,
                ts=time.time(),
                loss=1.0 / step + 0.125,
                lr=1e-3 * step,
                grad_norm=0.5,
                tokens_per_s=1000.0 + step,
                **evaluated,
            )
        )
    tee.event(EventKind.CHECKPOINT_SAVED, f"checkpoint at step {last}", data={"step": last})
    tee.checkpoint(
        CheckpointRecord(step=last, uri=f"file://{ckpt_root}/step_{last}", bytes=123, save_s=0.5)
    )


def _mlflow_run(url, experiment, job_id):
    from mlflow import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    (found,) = client.search_runs([exp.experiment_id], f"tags.`etrain.job_id` = '{job_id}'")
    return client, found


def _history(client, run_id, key) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_mlflow_run_holds_every_step_the_spec_and_the_checkpoint(mlflow_server, tmp_path):
    spec = _spec({"mlflow": {"tracking_uri": mlflow_server, "experiment": "e1", "log_model": True}})
    reporter = RecordingReporter("j-mlflow-1")
    tee = ReporterTee(reporter, open_trackers(spec, Env(reporter)), step=0)
    _feed(tee, last=25)
    tee.close()
    client, found = _mlflow_run(mlflow_server, "e1", "j-mlflow-1")
    run_id = found.info.run_id
    assert found.info.status == "FINISHED" and found.info.run_name == "j-mlflow-1"
    want = {p.step: p.loss for p in reporter.metrics}
    assert _history(client, run_id, "loss") == want and sorted(want) == list(range(1, 26))
    assert _history(client, run_id, "eval_loss") == {10: 0.3, 20: 0.15}
    assert _history(client, run_id, "tokens_per_s")[7] == 1007.0
    assert found.data.params == spec_params(spec)
    assert found.data.params["train.lr"] == "0.01"
    assert found.data.tags["event.25.checkpoint_saved"] == "checkpoint at step 25"
    assert found.data.tags["etrain.checkpoint"] == "file:///tmp/ck/step_25"
    names = {a.path for a in client.list_artifacts(run_id)}
    assert names == {"events.txt", "checkpoint.json"}
    # The job restarted: its rank 0 continues the same run from the checkpoint.
    tee = ReporterTee(reporter, open_trackers(spec, Env(reporter)), step=25)
    tee.event(EventKind.RESTORED, "restored step 25", data={"step": 25})
    _feed(tee, first=26, last=30)
    tee.close()
    client, found = _mlflow_run(mlflow_server, "e1", "j-mlflow-1")
    assert found.info.run_id == run_id
    assert _history(client, run_id, "loss") == {p.step: p.loss for p in reporter.metrics}
    events = client.download_artifacts(run_id, "events.txt", str(tmp_path))
    with open(events) as f:
        lines = f.read().splitlines()
    assert lines == [
        "step 25: checkpoint_saved: checkpoint at step 25",
        "step 25: restored: restored step 25",
        "step 30: checkpoint_saved: checkpoint at step 30",
    ]
    assert not [e for e in reporter.events if e.kind == EventKind.TRACKING_FAILED.value]


def test_wandb_offline_run_holds_every_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    spec = _spec({"wandb": {"project": "p", "mode": "offline", "log_model": True}})
    reporter = RecordingReporter("j-wandb-1")
    sinks = open_trackers(spec, Env(reporter, locate(tmp_path)))
    tee = ReporterTee(reporter, sinks, step=0)
    _feed(tee)
    tee.close()
    # The job waits at most close_wait_s for the tracker; on a loaded machine W&B may still
    # be writing then. The reader waits for it to end before reading its file.
    assert all(sink.wait(timeout=120) for sink in sinks)
    path = run_file(tmp_path / "wandb")
    rows = history(path)
    losses = {r["train/step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert losses == {p.step: p.loss for p in reporter.metrics}
    assert sorted(losses) == list(range(1, STEPS + 1))
    evals = {r["train/step"]: r["eval/loss"] for r in rows if "eval/loss" in r}
    assert evals == {10: 0.3, 20: 0.15, 30: 0.1, 40: 0.075}
    assert any(r.get("events/checkpoint_saved") == 1 and r["train/step"] == STEPS for r in rows)
    first, *updates = runs(path)
    assert first.run_id == "j-wandb-1" and first.project == "p"
    config = {u.key: u.value_json for u in first.config.update}
    assert config["train.lr"] == '"0.01"'
    assert updates[-1].notes == f"step {STEPS}: checkpoint_saved: checkpoint at step {STEPS}"
    (artifact,) = artifacts(path)
    assert artifact.name == "j-wandb-1-checkpoint" and artifact.type == "model"
    assert not [e for e in reporter.events if e.kind == EventKind.TRACKING_FAILED.value]


def test_a_tracking_server_that_is_down_never_holds_the_run(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = _spec({"mlflow": {"tracking_uri": down, "experiment": "e"}})
    reporter = RecordingReporter("j-down")
    tee = ReporterTee(reporter, open_trackers(spec, Env(reporter)), step=0)
    started = time.perf_counter()
    _feed(tee, last=2000)
    assert time.perf_counter() - started < 5.0  # the training thread only queues
    time.sleep(3)  # the sink's thread finds the server down
    tee.close()
    assert time.perf_counter() - started < 40.0
    failed = [e for e in reporter.events if e.kind == EventKind.TRACKING_FAILED.value]
    assert failed and "mlflow: tracking failed" in failed[0].message
    assert failed[-1].data["lost"] == 2000 + 2  # every point, the event and the checkpoint
    assert len(reporter.metrics) == 2000


def test_a_training_run_is_tracked_in_mlflow_and_wandb(mlflow_server, tmp_path, monkeypatch):
    """One real one-process run of the loop, TensorBoard on too: both trackers hold its
    every step's loss, and its evaluations at the steps that evaluated; MLflow holds the
    final model, equal to what `etrain export` writes of the last checkpoint."""
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    spec = _spec(
        {
            "tensorboard": True,
            "mlflow": {"tracking_uri": mlflow_server, "experiment": "loop", "log_model": True},
            "wandb": {"project": "loop", "mode": "offline", "log_model": True},
        }
    )
    reporter = RecordingReporter("j-loop-1")
    env = RunEnv(
        0,
        1,
        torch.device("cpu"),
        locate(tmp_path / "ckpt"),
        reporter=reporter,
        measure_memory=False,
    )
    result = run(spec, env)
    want = {p.step: p.loss for p in reporter.metrics}
    assert want == pytest.approx(result.losses) and sorted(want) == list(range(1, 7))
    client, found = _mlflow_run(mlflow_server, "loop", "j-loop-1")
    assert _history(client, found.info.run_id, "loss") == want
    assert _history(client, found.info.run_id, "eval_loss") == pytest.approx(result.eval_losses)
    assert sorted(result.eval_losses) == [3, 6]
    rows = history(run_file(tmp_path / "ckpt" / "wandb"))
    assert {r["train/step"]: r["train/loss"] for r in rows if "train/loss" in r} == want
    assert (tmp_path / "ckpt" / "tensorboard").is_dir()
    assert not [e for e in reporter.events if e.kind == EventKind.TRACKING_FAILED.value]
    logged = client.download_artifacts(found.info.run_id, "model", str(tmp_path / "logged"))
    export_checkpoint(tmp_path / "ckpt" / "step_00000006", tmp_path / "local", preset="gpt-tiny")
    got = load_file(f"{logged}/model.safetensors")
    want_tensors = load_file(tmp_path / "local" / "model.safetensors")
    assert got.keys() == want_tensors.keys() and len(got) > 0
    assert all(torch.equal(got[k], want_tensors[k]) for k in got)


def test_a_wandb_that_is_down_never_holds_the_run(monkeypatch):
    """Online, with the job's (made-up) key, to a closed port: the run's records are lost,
    and said to be, within the sink's close wait."""
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ETRAIN_SECRET_TEAM_A_WANDB_API_KEY", "k" * 40)
    spec = _spec({"wandb": {"project": "p", "credentials_secret": "team-a"}})
    reporter = RecordingReporter("j-wandb-down")
    tee = ReporterTee(reporter, open_trackers(spec, Env(reporter)), step=0)
    started = time.perf_counter()
    _feed(tee, last=100)
    assert time.perf_counter() - started < 1.0
    tee.close()
    assert time.perf_counter() - started < 20.0
    failed = [e for e in reporter.events if e.kind == EventKind.TRACKING_FAILED.value]
    assert failed and failed[0].message.startswith("wandb: tracking failed")
    assert "k" * 40 not in " ".join(e.message for e in failed)
    assert failed[-1].data == {"tracker": "wandb", "lost": 102}
