"""Checkpoints on a real S3 endpoint (moto's server on loopback): save, list, prune,
resume, asynchronous saves, and a store that goes away in the middle of a save."""

from __future__ import annotations

import uuid

import pytest
import torch

from workers.checkpoint import CheckpointManager
from workers.spec import JobSpec
from workers.storage import resolve_storage
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow


def spec(endpoint: str, *, asynchronous: bool = False, steps: int = 9) -> JobSpec:
    return JobSpec.model_validate({
        "name": "unit-s3", "data": {"seq_len": 16, "num_samples": 64},
        "resources": {"workers": 1},
        "train": {"steps": steps, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
        "checkpoint": {"storage": "s3://etrain-test/jobs", "every_steps": 3, "keep_last": 2,
                       "async": asynchronous, "s3": {"endpoint_url": endpoint}},
    })


class Recorder:
    """A reporter that can run a callback when a step is reported."""

    def __init__(self, at_step=None, action=None):
        self.events, self.at_step, self.action = [], at_step, action

    def metric(self, point):
        if point["step"] == self.at_step and self.action:
            self.action()

    def event(self, kind, message, *, data=None, dedup_key=None):
        self.events.append((kind, message))

    def checkpoint(self, **kw):
        pass

    def flush(self, timeout=5.0):
        return True


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    return s3_server


def root() -> str:
    return f"s3://etrain-test/jobs/{uuid.uuid4().hex[:8]}/checkpoints"


def manager(uri: str, endpoint: str) -> CheckpointManager:
    return CheckpointManager(resolve_storage(uri, endpoint_url=endpoint), keep_last=None, rank=0)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_save_list_prune_and_resume_on_s3(s3_env, tmp_path, asynchronous):
    endpoint, where = s3_env["endpoint_url"], root()
    local = run(spec(endpoint, asynchronous=asynchronous),
                RunEnv(rank=0, world_size=1, device=torch.device("cpu"),
                       checkpoint_root=str(tmp_path)))
    first = run(spec(endpoint, asynchronous=asynchronous),
                RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoint_root=where,
                       stop_at=7))
    assert sorted(first.losses) == list(range(1, 8))
    listed = manager(where, endpoint).committed()
    assert [c.step for c in listed] == [3, 6]
    assert all(c.uri.startswith("s3://etrain-test/jobs/") for c in listed)
    resumed = run(spec(endpoint, asynchronous=asynchronous),
                  RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoint_root=where))
    assert resumed.resumed_from == 6
    assert {s: resumed.losses[s] for s in (7, 8, 9)} == {s: local.losses[s] for s in (7, 8, 9)}
    # keep_last 2: step 3 was deleted from the bucket after 9 committed.
    assert [c.step for c in manager(where, endpoint).committed()] == [6, 9]
    names = manager(where, endpoint)._names()
    assert not any(n.startswith("step_00000003") for n in names), names


def test_a_store_that_goes_away_mid_save_leaves_the_previous_checkpoint(s3_env, monkeypatch):
    """A second endpoint on the same in-process S3 backend is stopped while the save of
    step 6 is being written: training goes on, step 6 never becomes visible, and a
    resume (through the endpoint that stayed up) starts from step 3."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    doomed, where = f"http://{host}:{port}", root()
    monkeypatch.setenv("ETRAIN_FAULT_SLOW_SAVE_STEP", "6")
    monkeypatch.setenv("ETRAIN_FAULT_SLOW_SAVE_S", "2")
    rec = Recorder(at_step=7, action=server.stop)  # during step 6's slowed-down write
    result = run(spec(doomed, asynchronous=True, steps=8),
                 RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoint_root=where,
                        reporter=rec))
    assert sorted(result.losses) == list(range(1, 9))  # training survived the outage
    failed = [m for k, m in rec.events if k == "checkpoint_failed"]
    assert failed and "step 6" in failed[0]
    alive = s3_env["endpoint_url"]
    assert [c.step for c in manager(where, alive).committed()] == [3]
    resumed = run(spec(alive, asynchronous=True, steps=8),
                  RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoint_root=where))
    assert resumed.resumed_from == 3


def test_a_ray_job_resumes_from_s3_after_a_worker_kill(run_job, telemetry_sink, s3_env):
    """Two Ray workers save to S3; rank 1 is SIGKILLed at step 6 (checkpoint at 4): the
    restarted group restores step 4 from the bucket and ends with the clean run's losses."""
    job = {"name": "it-s3-kill", "data": {"seq_len": 32, "num_samples": 256},
           "resources": {"workers": 2, "cpus_per_worker": 1},
           "train": {"steps": 8, "global_batch_size": 8, "micro_batch_size": 2, "lr": 1e-2},
           "checkpoint": {"storage": f"s3://etrain-test/ray/{uuid.uuid4().hex[:8]}",
                          "every_steps": 4, "s3": {"endpoint_url": s3_env["endpoint_url"]}},
           "failure": {"max_failures": 3}}
    spec_json = JobSpec.model_validate(job).model_dump(mode="json", by_alias=True)
    tag = uuid.uuid4().hex[:6]
    clean_id, killed_id = f"j-s3-clean-{tag}", f"j-s3-killed-{tag}"
    assert run_job(job_id=clean_id, spec=spec_json, extra_env=s3_env["env"]).value == "SUCCEEDED"
    marker = f"/tmp/etrain-s3-kill-{tag}"
    assert run_job(job_id=killed_id, spec=spec_json, extra_env={
        **s3_env["env"], "ETRAIN_FAULT_KILL_STEP": "6", "ETRAIN_FAULT_KILL_RANK": "1",
        "ETRAIN_FAULT_MARKER": marker}).value == "SUCCEEDED"
    events = telemetry_sink.items("events", killed_id)
    assert [e["data"]["step"] for e in events if e["kind"] == "restored"] == [4]
    assert telemetry_sink.losses(killed_id) == telemetry_sink.losses(clean_id)
    uris = [c["uri"] for c in telemetry_sink.items("checkpoints", killed_id)]
    assert uris and all(u.startswith(job["checkpoint"]["storage"] + "/") for u in uris)
