"""Model-parallel strategies through the real product path: Ray job -> TorchTrainer -> loop."""

from __future__ import annotations

import uuid

import pytest
import torch

from service.backends.base import RunState
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow


def _spec(tmp_path, parallelism: dict, workers: int) -> dict:
    return JobSpec.model_validate(
        {
            "name": "it-hybrid",
            "model": {"preset": "gpt-small"},
            "data": {"seq_len": 32, "num_samples": 256},
            "parallelism": parallelism,
            "resources": {"workers": workers, "cpus_per_worker": 2 / workers},
            "train": {
                "steps": 5,
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "lr": 3e-3,
                "optimizer": "sgd",
                "momentum": 0.9,
            },
            "checkpoint": {"storage": f"file://{tmp_path}", "every_steps": 5},
        }
    ).model_dump(mode="json", by_alias=True)


def test_hybrid_pp2_tp2_on_ray_matches_single_process(run_job, telemetry_sink, tmp_path):
    """4 Ray workers on the 2-CPU head: placement check, pipeline + TP, memory report."""
    spec = _spec(
        tmp_path,
        {
            "strategy": "hybrid",
            "pp": 2,
            "tp": 2,
            "pipeline": {"schedule": "1f1b", "microbatches": 2},
        },
        4,
    )
    job_id = f"j-hybrid-{uuid.uuid4().hex[:6]}"
    assert run_job(job_id=job_id, spec=spec) == RunState.SUCCEEDED

    ref_spec = {
        **spec,
        "parallelism": {"strategy": "ddp"},
        "resources": {"workers": 1, "cpus_per_worker": 1},
    }
    want = run(
        JobSpec.model_validate(ref_spec),
        RunEnv(rank=0, world_size=1, device=torch.device("cpu"), measure_memory=False),
    ).losses
    got = telemetry_sink.losses(job_id)
    assert sorted(got) == [1, 2, 3, 4, 5]
    for step in got:
        assert got[step] == pytest.approx(want[step], rel=1e-4), step

    memory = [e for e in telemetry_sink.items("events", job_id) if e["kind"] == "memory"]
    ranks = memory[0]["data"]["ranks"]
    assert len(ranks) == 4 and all(r["params_bytes"] > 0 for r in ranks)
    # Each rank holds a quarter-ish of the model: one of 2 stages, half of each matrix.
    total = sum(r["params_bytes"] for r in ranks)
    assert max(r["params_bytes"] for r in ranks) < 0.5 * total
    assert (tmp_path / job_id / "checkpoints" / "step_00000005" / "manifest.json").is_file()
