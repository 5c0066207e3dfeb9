"""The train loop and checkpoints in one plain process (no Ray, no process group)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from tests.support.recording import RecordingReporter
from workers.checkpoint.manager import MANIFEST, CheckpointManager
from workers.optim import lr_factor
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run


def spec(**train) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "unit",
            "data": {"seq_len": 16, "num_samples": 64},
            "resources": {"workers": 1},
            "train": {
                "steps": 6,
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "lr": 1e-2,
                **train,
            },
            "checkpoint": {"every_steps": 3, "keep_last": 2},
        }
    )


def env(root=None) -> RunEnv:
    return RunEnv(
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        checkpoints=locate(root) if root else None,
    )


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_same_seed_same_losses_and_loss_falls(optimizer):
    a = run(spec(optimizer=optimizer, momentum=0.9 if optimizer == "sgd" else 0.0), env())
    b = run(spec(optimizer=optimizer, momentum=0.9 if optimizer == "sgd" else 0.0), env())
    assert a.losses == b.losses and sorted(a.losses) == list(range(1, 7))
    assert a.losses[6] < a.losses[1]


def test_resume_from_committed_checkpoint_continues_exactly(tmp_path):
    full = run(spec(), env(tmp_path / "a"))
    run(spec(), env(tmp_path / "b"))
    shutil.rmtree(tmp_path / "b" / "step_00000006")  # as if killed after step 5
    resumed = run(spec(), env(tmp_path / "b"))
    assert resumed.resumed_from == 3
    # A new run measures its memory at its first step; a restart at the size that saved the
    # checkpoint does not trace that step again (the size's figures were reported before).
    assert full.memory and full.memory[0]["activations_bytes"] > 0
    assert resumed.memory is None
    assert {s: resumed.losses[s] for s in (4, 5, 6)} == {s: full.losses[s] for s in (4, 5, 6)}
    for (na, pa), (nb, pb) in zip(
        full.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert na == nb and torch.equal(pa, pb), na


def test_partial_checkpoints_are_never_loaded(tmp_path):
    run(spec(), env(tmp_path))
    # A crash mid-save leaves a folder without a manifest, or a staging folder.
    (tmp_path / "step_00000009").mkdir()
    (tmp_path / "step_00000012.partial-dead").mkdir()
    manager = CheckpointManager(tmp_path, keep_last=2, rank=0)
    assert [c.step for c in manager.committed()] == [3, 6]
    assert manager.latest().step == 6
    # A manifest alone is what commits: remove it and the folder stops counting.
    (tmp_path / "step_00000006" / MANIFEST).unlink()
    assert manager.latest().step == 3


def test_retention_keeps_last_k_and_manifest_records_state(tmp_path):
    run(spec(steps=12), env(tmp_path))
    manager = CheckpointManager(tmp_path, keep_last=2, rank=0)
    assert [c.step for c in manager.committed()] == [9, 12]
    manifest = json.loads((tmp_path / "step_00000012" / MANIFEST).read_text())
    assert manifest["extra"]["sampler"] == {"epoch": 0, "position": 48}
    assert manifest["bytes"] > 0 and manifest["step"] == 12


def test_bf16_autocast_trains_close_to_fp32():
    fp32 = run(spec(), env()).losses
    bf16 = run(spec(precision="bf16"), env()).losses
    assert all(torch.isfinite(torch.tensor(v)) for v in bf16.values())
    assert bf16 != fp32  # autocast really ran in bf16
    assert bf16[1] == pytest.approx(fp32[1], rel=2e-2)


@pytest.mark.parametrize(
    "step,expected", [(0, 0.5), (1, 1.0), (2, 1.0), (7, 0.55), (12, 0.1), (20, 0.1)]
)
def test_lr_warmup_then_cosine_to_floor(step, expected):
    """Factor per scheduler step: linear warmup over 2, cosine from 1 down to min_lr_ratio."""
    t = spec(steps=12, warmup_steps=2).train
    assert lr_factor(step, train=t) == pytest.approx(expected, abs=1e-9)


def test_a_restore_at_another_world_size_says_so(tmp_path):
    run(spec(), env(tmp_path))  # world size 1, checkpoints at 3 and 6
    shutil.rmtree(tmp_path / "step_00000006")
    manifest = tmp_path / "step_00000003" / MANIFEST
    data = json.loads(manifest.read_text())
    assert data["extra"]["world_size"] == 1
    data["extra"]["world_size"] = 2  # as if saved by two workers
    manifest.write_text(json.dumps(data))
    reporter = RecordingReporter()
    run(
        spec(),
        RunEnv(
            rank=0,
            world_size=1,
            device=torch.device("cpu"),
            checkpoints=locate(tmp_path),
            reporter=reporter,
        ),
    )
    kinds = {k: (m, d) for k, m, d in reporter.kinds()}
    assert kinds["restored"][1]["step"] == 3
    assert kinds["restored"][0] == "restored from step 3 (saved by 2 workers, now 1)"
    assert kinds["restored"][1]["saved_world_size"] == 2
    assert "memory" in kinds  # another size: measured again
    assert [m.step for m in reporter.metrics] == [4, 5, 6]
    assert all(m.world_size == 1 and not m.model_extra for m in reporter.metrics)


def test_installed_hooks_see_every_step_after_it_is_timed(tmp_path):
    from workers.hooks import RunHooks

    class Slow(RunHooks):
        def __init__(self):
            self.steps = []

        def after_step(self, *, step, rank):
            self.steps.append((step, rank))
            time.sleep(0.1)  # outside the step's measured time

    hooks = Slow()
    result = run(
        spec(),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), hooks=hooks),
    )
    assert hooks.steps == [(s, 0) for s in range(1, 7)]
    # Had the hook run inside the timed step, every step would take at least 0.1 s.
    assert min(result.step_times) < 0.1


def test_activation_checkpointing_from_the_spec_recomputes_blocks_with_the_same_losses(
    monkeypatch,
):
    import workers.models.recompute as recompute

    calls = []
    real = recompute.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(recompute, "checkpoint", counting)
    plain = run(spec(), env())
    assert calls == []
    with_ac = spec().model_copy(
        update={"model": spec().model.model_copy(update={"activation_checkpointing": "full"})}
    )
    checkpointed = run(with_ac, env())
    assert calls, "model.activation_checkpointing: full did not reach the model"
    assert checkpointed.losses == plain.losses


def test_memory_is_measured_for_a_new_run_or_a_resize_unless_turned_off():
    import torch

    from workers.train_loop import RunEnv, _measures_memory

    env = RunEnv(rank=0, world_size=2, device=torch.device("cpu"))
    assert _measures_memory(env, start=0, restored=None)
    assert _measures_memory(env, start=3, restored={"world_size": 4})
    assert not _measures_memory(env, start=3, restored={"world_size": 2})
    env.measure_memory = False
    assert not _measures_memory(env, start=0, restored=None)


def test_a_checkpoint_place_is_handed_down_resolved(tmp_path):
    """A string would be parsed back by each reader; the loop takes only a location."""
    with pytest.raises(TypeError, match="locate"):
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=str(tmp_path))
