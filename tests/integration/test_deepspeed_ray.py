"""DeepSpeed ZeRO-3 on a real Ray cluster (2 gloo workers): a worker killed after an
asynchronous save commits, the group restarted from it, and the job ends bit for bit where
the same job ends uninterrupted."""

from __future__ import annotations

import copy
import uuid

import pytest
import torch

from service.backends.base import RunState
from tests.support.faults import fault_env
from tests.support.local_launch import LocalJob, run_local
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow

STEPS = 8


def _spec(storage) -> dict:
    return JobSpec.model_validate(
        {
            "name": "it-deepspeed",
            "data": {"seq_len": 32, "num_samples": 256},
            "parallelism": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
            "resources": {"workers": 2, "cpus_per_worker": 1},
            "train": {
                "steps": STEPS,
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "lr": 1e-2,
                "warmup_steps": 2,
                "grad_clip": 1.0,
            },
            "checkpoint": {"storage": f"file://{storage}", "every_steps": 4, "async": True},
            "failure": {"max_failures": 3},
        }
    ).model_dump(mode="json", by_alias=True)


def test_a_killed_deepspeed_job_resumes_bitwise(
    run_job, telemetry_sink, checkpoint_tensors, tmp_path
):
    spec = _spec(tmp_path / "ray")
    job_id = f"j-deepspeed-{uuid.uuid4().hex[:6]}"
    marker, slow = tmp_path / "killed-once", tmp_path / "slow"
    # 0.3 s a step: the asynchronous save of step 4 commits before the kill at step 7.
    slow.write_text("0.3")
    faults = fault_env(KILL_STEP=7, KILL_RANK=1, MARKER=marker, THROTTLE_FILE=slow)
    state = run_job(job_id=job_id, spec=spec, extra_env=faults)
    assert state == RunState.SUCCEEDED
    assert marker.exists(), "the fault was never injected"
    events = telemetry_sink.items("events", job_id)
    assert [e["data"]["step"] for e in events if e["kind"] == "restored"] == [4], [
        (e["kind"], e["message"][:200]) for e in events
    ]
    got = telemetry_sink.losses(job_id)
    assert sorted(got) == list(range(1, STEPS + 1))

    # Uninterrupted, the same job on 2 local gloo processes: the same ranks and math.
    clean = copy.deepcopy(spec)
    clean["checkpoint"]["storage"] = None
    done = run_local([LocalJob("clean", clean, str(tmp_path / "clean"))], world_size=2)["clean"]
    assert done.error is None, done.error
    assert got == done.losses  # every step, bit for bit
    last = f"step_{STEPS:08d}"
    a = checkpoint_tensors(tmp_path / "clean" / last)["app"]
    b = checkpoint_tensors(tmp_path / "ray" / job_id / "checkpoints" / last)["app"]
    for part in ("model", "optim"):
        assert a[part].keys() == b[part].keys() and len(a[part]) > 0
        for name, value in a[part].items():
            other = b[part][name]
            same = torch.equal(value, other) if torch.is_tensor(value) else value == other
            assert same, (part, name)

    # And one plain process takes the same path (fp32 reduction order aside).
    one = run(JobSpec.model_validate(clean), RunEnv(0, 1, torch.device("cpu"))).losses
    for step, loss in one.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step
    assert got[STEPS] < got[1]
