"""TensorBoard event files read back with TensorBoard's own reader as the run's own metrics:
a local run (stopped and resumed), and a Ray job on S3 whose worker is killed."""

from __future__ import annotations

import uuid

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub.io import gfile

from tests.support.faults import fault_env
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.telemetry.tensorboard import SCALARS
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow


class Collect:
    """A reporter that keeps what the loop reports (the run's metrics and events)."""

    def __init__(self):
        self.metrics, self.events = [], []

    def metric(self, point) -> None:
        self.metrics.append(point)

    def event(self, kind, message, **_) -> None:
        self.events.append((kind, message))

    def checkpoint(self, record) -> None:
        self.events.append(("checkpoint", record.step))

    def flush(self, timeout: float = 5.0) -> bool:
        return True


def _spec(tensorboard: bool | None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "tb",
            "data": {"seq_len": 16, "num_samples": 64},
            "resources": {"workers": 1},
            "train": {"steps": 6, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
            "checkpoint": {"every_steps": 3, "keep_last": 2},
            "metrics": {"tensorboard": tensorboard},
        }
    )


def _read(logdir) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _env(root, reporter, stop_at=None) -> RunEnv:
    cpu = torch.device("cpu")
    return RunEnv(0, 1, cpu, locate(root), reporter=reporter, stop_at=stop_at)


def test_event_files_hold_the_runs_metrics(tmp_path):
    """Two runs (stopped at step 3, then resumed to 6) into one log dir: the scalars are
    the reported ones, and the checkpoints and the restore are marked at their steps."""
    root = tmp_path / "ckpts"
    reporter = Collect()
    run(_spec(True), _env(root, reporter, stop_at=3))
    assert run(_spec(True), _env(root, reporter)).resumed_from == 3
    acc = _read(root / "tensorboard")
    for name in ("loss", "lr", "grad_norm", "tokens_per_s"):
        got = {e.step: e.value for e in acc.Scalars(f"train/{name}")}
        want = {p.step: getattr(p, name) for p in reporter.metrics}
        assert sorted(got) == list(range(1, 7)) == sorted(want)
        assert got == pytest.approx(want, rel=1e-6)
    assert [e.value for e in acc.Scalars("train/world_size")] == [1.0] * 6
    assert [e.step for e in acc.Scalars("events/checkpoint_saved")] == [3, 6]
    assert [e.step for e in acc.Scalars("events/restored")] == [3]
    assert len(acc.Scalars("events/workers_started")) == 2
    # The reporter still got everything (the tee passes it on).
    assert ("checkpoint", 6) in reporter.events


def test_no_event_files_unless_asked(tmp_path):
    root = tmp_path / "ckpts"
    run(
        _spec(None),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=locate(root)),
    )
    assert not (root / "tensorboard").exists()


def test_a_ray_job_on_s3_writes_what_its_workers_posted(
    run_job, telemetry_sink, s3_server, monkeypatch, tmp_path
):
    """One Ray worker, checkpoints every 4 steps on S3, SIGKILLed after step 6: Ray restarts
    it from step 4. Read from the bucket by TensorBoard itself (what `etrain status`'s
    `S3_ENDPOINT=... tensorboard --logdir s3://...` line does), the event files hold every
    scalar of every step as the workers posted it (the restarted run's for steps 5 and 6),
    the restore marked at step 4 as the posted event says and the last checkpoint at 8."""
    tag = uuid.uuid4().hex[:8]
    storage = f"s3://{s3_server['bucket']}/tb-{tag}"
    job = {
        "name": "it-tb-s3",
        "data": {"seq_len": 16, "num_samples": 64},
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "train": {"steps": 8, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
        "checkpoint": {"storage": storage, "every_steps": 4},
        "stores": {"s3": {"endpoint_url": s3_server["endpoint_url"]}},
        "failure": {"max_failures": 2},
        "metrics": {"tensorboard": True},
    }
    spec_json = JobSpec.model_validate(job).model_dump(mode="json", by_alias=True)
    job_id = f"j-tb-{tag}"
    faults = fault_env(KILL_STEP=6, KILL_RANK=0, MARKER=str(tmp_path / "killed"))
    state = run_job(job_id=job_id, spec=spec_json, extra_env={**s3_server["env"], **faults})
    assert state.value == "SUCCEEDED"
    assert (tmp_path / "killed").exists()  # the worker was killed once

    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("S3_ENDPOINT", s3_server["endpoint_url"])
    # TensorBoard reads S3_ENDPOINT when it starts; this process started before it was set.
    monkeypatch.setitem(gfile._REGISTERED_FILESYSTEMS, "s3", gfile.S3FileSystem())
    acc = _read(f"{storage}/{job_id}/checkpoints/tensorboard")
    posted = {m["step"]: m for m in telemetry_sink.items("metrics", job_id)}  # latest per step
    assert sorted(posted) == list(range(1, 9))
    # Steps 1-4 come from the killed run's file: it was copied before checkpoint 4 committed.
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 9))
    for name in SCALARS:
        got = {e.step: e.value for e in acc.Scalars(f"train/{name}")}
        assert got == pytest.approx({s: m[name] for s, m in posted.items()}, rel=1e-6), name
    events = telemetry_sink.items("events", job_id)
    restored = [e["data"]["step"] for e in events if e["kind"] == "restored"]
    assert restored == [4]
    assert [e.step for e in acc.Scalars("events/restored")] == restored
    assert [e.step for e in acc.Scalars("events/checkpoint_saved")][-1] == 8
