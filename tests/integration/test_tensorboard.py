"""TensorBoard event files written by a local run read back as the run's own metrics."""

from __future__ import annotations

import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator

from workers.spec import JobSpec
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
    return RunEnv(0, 1, cpu, str(root), reporter=reporter, stop_at=stop_at)


def test_event_files_hold_the_runs_metrics(tmp_path):
    """Two runs (stopped at step 3, then resumed to 6) into one log dir: the scalars are
    the reported ones, and the checkpoints and the restore are marked at their steps."""
    root = tmp_path / "ckpts"
    reporter = Collect()
    run(_spec(True), _env(root, reporter, stop_at=3))
    assert run(_spec(True), _env(root, reporter)).resumed_from == 3
    acc = _read(root / "tensorboard")
    for name in ("loss", "lr", "tokens_per_s"):
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
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoint_root=str(root)),
    )
    assert not (root / "tensorboard").exists()
