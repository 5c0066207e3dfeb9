"""DDP on a real Ray cluster (2 gloo workers) against a single-process reference."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from service.backends.base import RunState
from tests.support.faults import fault_env
from workers.contract import GPU_NODES_ENV
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow


def _spec(tmp_path, optimizer: str, *, asynchronous: bool = False, **train) -> dict:
    return JobSpec.model_validate(
        {
            "name": f"it-{optimizer}",
            # A held-out set of its own (training reads the same samples as without it).
            "data": {"seq_len": 32, "num_samples": 256, "eval": {"num_samples": 6}},
            "resources": {"workers": 2, "cpus_per_worker": 1},
            "train": {
                "steps": 12 if asynchronous else 8,
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "lr": 1e-2,
                "warmup_steps": 2,
                "optimizer": optimizer,
                "momentum": 0.9 if optimizer == "sgd" else 0.0,
                "eval_every_steps": 4,
                **train,
            },
            "checkpoint": {
                "storage": f"file://{tmp_path}",
                "every_steps": 4,
                "async": asynchronous,
            },
        }
    ).model_dump(mode="json", by_alias=True)


def _reference(spec: dict):
    """The same spec in one plain process: no DDP, the whole global batch here."""
    return run(
        JobSpec.model_validate(spec),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False),
    )


@pytest.fixture(scope="module")
def clean_runs(run_job, ray_backend, tmp_path_factory) -> Callable[..., tuple[str, dict, Path]]:
    """``clean_runs(optimizer, asynchronous=...)`` -> (job id, spec, storage folder) of an
    uninterrupted Ray job of that spec, run once per module. Its workers are pinned to the
    head node as the service pins a job's on a cluster of mixed GPUs (GPU_NODES_ENV: Ray
    Train's label selector on ray.io/node-id must let them start)."""
    done: dict[tuple[str, bool], tuple[str, dict, Path]] = {}
    (head,) = [n["node_id"] for n in ray_backend.cluster().nodes if n["is_head"]]

    def clean(optimizer: str, *, asynchronous: bool = False) -> tuple[str, dict, Path]:
        key = (optimizer, asynchronous)
        if key not in done:
            mode = "async" if asynchronous else "sync"
            folder = tmp_path_factory.mktemp(f"clean-{optimizer}-{mode}")
            spec = _spec(folder, optimizer, asynchronous=asynchronous)
            job_id = f"j-clean-{optimizer}-{mode}-{uuid.uuid4().hex[:6]}"
            pinned = {GPU_NODES_ENV: head}
            assert run_job(job_id=job_id, spec=spec, extra_env=pinned) == RunState.SUCCEEDED
            done[key] = (job_id, spec, folder)
        return done[key]

    return clean


# SGD with synchronous saves; AdamW's run is the uninterrupted one of the kill test below
# (asynchronous saves change no step).
@pytest.mark.parametrize(("optimizer", "asynchronous"), [("sgd", False), ("adamw", True)])
def test_ddp_loss_per_step_matches_single_process(
    clean_runs, telemetry_sink, optimizer, asynchronous
):
    job_id, spec, _ = clean_runs(optimizer, asynchronous=asynchronous)
    steps = spec["train"]["steps"]
    reference = _reference(spec)
    got, want = telemetry_sink.losses(job_id), reference.losses
    assert sorted(got) == list(range(1, steps + 1))
    for step, loss in want.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), f"step {step}"
    # The held-out loss reaches the control plane from the steps that evaluate.
    evaluated = telemetry_sink.eval_losses(job_id)
    assert evaluated.keys() == reference.eval_losses.keys() == set(range(4, steps + 1, 4))
    for step, loss in reference.eval_losses.items():
        assert evaluated[step] == pytest.approx(loss, rel=1e-5), f"eval at step {step}"
    # The loss must actually move, or equality would prove nothing about the update.
    assert got[steps] < got[1]
    ws = {m["world_size"] for m in telemetry_sink.items("metrics", job_id)}
    assert ws == {2}


# The save of step 8 is slowed down and rank 1 is killed at step 10, in the middle of it:
# the restore must take the complete checkpoint of step 4, never the partial one of step
# 8. (A kill after a synchronous save, the default, is the DPO, diffusion and S3 tests'.)
KILLS = {
    "async": {"KILL_STEP": 10, "SLOW_SAVE_STEP": 8, "SLOW_SAVE_S": 8},
}


@pytest.mark.parametrize("mode", list(KILLS))
def test_kill_and_resume_equals_uninterrupted(
    clean_runs, run_job, telemetry_sink, checkpoint_tensors, tmp_path, mode
):
    """The resumed run ends bitwise equal to an uninterrupted one."""
    killed_dir = tmp_path / "killed"
    asynchronous = mode == "async"
    clean_id, clean, clean_dir = clean_runs("adamw", asynchronous=asynchronous)
    killed = _spec(killed_dir, "adamw", asynchronous=asynchronous)
    anywhere = lambda spec: {**spec, "checkpoint": {**spec["checkpoint"], "storage": None}}  # noqa: E731
    assert anywhere(killed) == anywhere(clean)  # the same job but for where it saves
    killed_id = f"j-killed-{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "killed-once"
    assert (
        run_job(
            job_id=killed_id,
            spec=killed,
            extra_env=fault_env(**KILLS[mode], KILL_RANK=1, MARKER=marker),
        )
        == RunState.SUCCEEDED
    )
    assert marker.exists(), "the fault was never injected"

    events = telemetry_sink.items("events", killed_id)
    kinds = [e["kind"] for e in events]
    assert "worker_failed" in kinds
    assert [e["data"]["step"] for e in events if e["kind"] == "restored"] == [4]
    assert kinds.count("workers_started") == 2
    last = f"step_{killed['train']['steps']:08d}"
    a = checkpoint_tensors(clean_dir / clean_id / "checkpoints" / last)
    b = checkpoint_tensors(killed_dir / killed_id / "checkpoints" / last)
    model_a, model_b = a["app"]["model"], b["app"]["model"]
    assert model_a.keys() == model_b.keys() and len(model_a) > 0
    for name in model_a:
        assert torch.equal(model_a[name], model_b[name]), name
    # Optimizer state is flattened by parameter name: "state.<fqn>.exp_avg" and so on.
    optim_a, optim_b = a["app"]["optim"], b["app"]["optim"]
    moments = [k for k in optim_a if k.endswith((".exp_avg", ".exp_avg_sq"))]
    assert len(moments) == 2 * len(model_a) and optim_a.keys() == optim_b.keys()
    for key in moments:
        assert torch.equal(optim_a[key], optim_b[key]), key
    # Per-step losses after the restore equal the uninterrupted run's too.
    assert telemetry_sink.losses(killed_id) == telemetry_sink.losses(clean_id)
    # So are the held-out losses of the steps that evaluated after it.
    after = {s: v for s, v in telemetry_sink.eval_losses(clean_id).items() if s > 4}
    assert after and {s: telemetry_sink.eval_losses(killed_id)[s] for s in after} == after
