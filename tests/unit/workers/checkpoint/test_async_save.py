"""Asynchronous checkpoints in one plain process: same bytes as a synchronous save,
exact resumes, a failed save that training survives, and keep_every retention."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.support.faults import FaultHooks
from tests.support.recording import RecordingReporter
from workers.checkpoint.manager import CheckpointManager
from workers.checkpoint.retention import retained_steps
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run


def spec(*, asynchronous: bool, steps: int = 8, **ckpt) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "unit-async",
            "data": {"seq_len": 16, "num_samples": 64},
            "resources": {"workers": 1},
            "train": {"steps": steps, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
            "checkpoint": {"every_steps": 3, "keep_last": 5, "async": asynchronous, **ckpt},
        }
    )


def env(root, reporter=None, stop_at=None, hooks=None) -> RunEnv:
    return RunEnv(
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        checkpoints=locate(root),
        reporter=reporter,
        stop_at=stop_at,
        hooks=hooks,
    )


def tensors(path, tmp_path) -> dict:
    out = tmp_path / f"{abs(hash(str(path)))}.pt"
    dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)


def test_async_checkpoints_hold_exactly_what_a_synchronous_save_writes(tmp_path):
    sync = run(spec(asynchronous=False), env(tmp_path / "sync"))
    rec = RecordingReporter()
    asyn = run(spec(asynchronous=True), env(tmp_path / "async", rec))
    assert asyn.losses == sync.losses
    steps = [
        c.step for c in CheckpointManager(tmp_path / "async", keep_last=None, rank=0).committed()
    ]
    assert steps == [3, 6, 8]
    for step in steps:
        a = tensors(tmp_path / "async" / f"step_{step:08d}", tmp_path)
        s = tensors(tmp_path / "sync" / f"step_{step:08d}", tmp_path)
        # Training went on while the shards were written: a snapshot that shared
        # memory with the live parameters would differ here.
        assert a.keys() == s.keys()
        for key in a["app"]["model"]:
            assert torch.equal(a["app"]["model"][key], s["app"]["model"][key]), (step, key)
    assert [c.step for c in rec.checkpoints] == [3, 6, 8]
    assert all(0 <= c.blocking_s <= c.save_s for c in rec.checkpoints)


def test_a_run_resumed_from_an_async_checkpoint_continues_exactly(tmp_path):
    full = run(spec(asynchronous=True), env(tmp_path / "a"))
    first = run(spec(asynchronous=True), env(tmp_path / "b", stop_at=5))
    assert sorted(first.losses) == [1, 2, 3, 4, 5]
    resumed = run(spec(asynchronous=True), env(tmp_path / "b"))
    assert resumed.resumed_from == 3  # stop_at is not a save point; step 3's save is
    assert {s: resumed.losses[s] for s in range(4, 9)} == {s: full.losses[s] for s in range(4, 9)}


def test_a_failed_save_is_reported_and_training_goes_on(tmp_path):
    rec = RecordingReporter()
    result = run(spec(asynchronous=True), env(tmp_path, rec, hooks=FaultHooks(fail_save_step=3)))
    assert sorted(result.losses) == list(range(1, 9))
    failed = [m for k, m, _ in rec.kinds() if k == "checkpoint_failed"]
    assert len(failed) == 1 and "step 3" in failed[0] and "No space left" in failed[0]
    manager = CheckpointManager(tmp_path, keep_last=None, rank=0)
    assert [c.step for c in manager.committed()] == [6, 8]  # the next interval saved
    assert not any(p.name.startswith("step_00000003") for p in tmp_path.iterdir())


def test_keep_every_keeps_milestones_beyond_keep_last():
    assert retained_steps([3, 6, 9, 12, 15], keep_last=2, keep_every=None) == {12, 15}
    assert retained_steps([3, 6, 9, 12, 15], keep_last=2, keep_every=6) == {6, 12, 15}
    assert retained_steps([3, 6], keep_last=None, keep_every=6) == {3, 6}


def test_interval_auto_retunes_after_the_first_measured_save(tmp_path):
    """Young/Daly from this run's own step and blocking times: with a one-hour prior MTBF
    the optimum is far beyond 12 steps even on a loaded machine (0.1 s steps, 0.2 s saves
    give ~380), so after the first save (at the starting interval, 2) the next is the run's
    last step."""
    rec = RecordingReporter()
    s = spec(asynchronous=False, steps=12, interval="auto", every_steps=2, mtbf_prior_s=3600.0)
    run(s, env(tmp_path, rec))
    steps = [c.step for c in CheckpointManager(tmp_path, keep_last=None, rank=0).committed()]
    assert steps == [2, 12]
    chosen = [d for k, _, d in rec.kinds() if k == "checkpoint_interval"]
    assert chosen and chosen[0]["steps"] > 10 and chosen[0]["formula"] in ("young", "daly")
    manifest = CheckpointManager(tmp_path, keep_last=None, rank=0).committed()[-1].extra
    assert manifest["interval"]["failures"] == 0 and manifest["interval"]["run_s"] > 0


@pytest.mark.parametrize("asynchronous", [False, True])
def test_each_commit_reports_the_checkpoints_its_retention_deleted(tmp_path, asynchronous):
    """Retention is decided once, by the manager after each commit; the commit's record
    tells the control plane which committed steps went (keep_last 2, keep_every 6)."""
    rec = RecordingReporter()
    run(spec(asynchronous=asynchronous, steps=12, keep_last=2, keep_every=6), env(tmp_path, rec))
    assert [(c.step, c.deleted_steps) for c in rec.checkpoints] == [
        (3, []),
        (6, []),
        (9, [3]),
        (12, []),
    ]
    listed = CheckpointManager(tmp_path, keep_last=None, rank=0).committed()
    assert [c.step for c in listed] == [6, 9, 12]
