"""Checkpoints on real object stores on loopback: save, list, prune and resume on S3 (moto)
and GCS (gcp-storage-emulator), synchronous and asynchronous; on S3 also a store that goes
away in the middle of a save, and a DeepSpeed Ray job that resumes from the bucket."""

from __future__ import annotations

import contextlib
import uuid

import pytest
import torch

from tests.support.faults import FaultHooks, fault_env
from tests.support.local_launch import LocalJob, run_local
from tests.support.object_store_fixture import ObjectStore
from tests.support.recording import RecordingReporter
from workers.checkpoint.manager import CheckpointManager
from workers.spec import JobSpec
from workers.storage.location import locate
from workers.train_loop import RunEnv, run

pytestmark = pytest.mark.slow


def spec(store: ObjectStore, *, asynchronous: bool = False, steps: int = 9) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "unit-store",
            "data": {"seq_len": 16, "num_samples": 64},
            "resources": {"workers": 1},
            "train": {"steps": steps, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
            "checkpoint": {
                **store.checkpoint("jobs"),
                "every_steps": 3,
                "keep_last": 2,
                "async": asynchronous,
            },
            "stores": store.stores(),
        }
    )


class Recorder(RecordingReporter):
    """A reporter that runs a callback when a step is reported."""

    def __init__(self, at_step=None, action=None):
        super().__init__()
        self.at_step, self.action = at_step, action

    def metric(self, point):
        super().metric(point)
        if point.step == self.at_step and self.action:
            self.action()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.fixture
def store_env(object_store, monkeypatch):
    """``object_store`` with the credentials it accepts in this process's environment."""
    for key, value in object_store.env.items():
        monkeypatch.setenv(key, value)
    return object_store


def run_dir() -> tuple[str, ...]:
    """A fresh job's checkpoint folder under the bucket, as path parts."""
    return ("jobs", uuid.uuid4().hex[:8], "checkpoints")


def manager(store: ObjectStore, where: tuple[str, ...]) -> CheckpointManager:
    return CheckpointManager(store.location(*where), keep_last=None, rank=0)


def one_process(checkpoints, **kw) -> RunEnv:
    """The loop in this process, alone, with its checkpoints at ``checkpoints``."""
    return RunEnv(rank=0, world_size=1, device=torch.device("cpu"), checkpoints=checkpoints, **kw)


@contextlib.contextmanager
def counted_gets(store):
    """The GET requests the store's endpoint answered while the block ran (``gs`` only:
    the GCS emulator runs in this process; for ``s3`` it yields a count of 0)."""
    count = [0]
    if store.scheme != "gs":
        yield lambda: 0
        return
    from gcp_storage_emulator.server import RequestHandler

    do_get = RequestHandler.do_GET

    def counting(handler):
        count[0] += 1
        return do_get(handler)

    RequestHandler.do_GET = counting
    try:
        yield lambda: count[0]
    finally:
        RequestHandler.do_GET = do_get


@pytest.mark.parametrize("asynchronous", [False, True])
def test_save_list_prune_and_resume_on_an_object_store(store_env, tmp_path, asynchronous):
    store, where = store_env, run_dir()
    local = run(spec(store, asynchronous=asynchronous), one_process(locate(tmp_path)))
    first = run(
        spec(store, asynchronous=asynchronous), one_process(store.location(*where), stop_at=7)
    )
    assert sorted(first.losses) == list(range(1, 8))
    listed = manager(store, where).committed()
    assert [c.step for c in listed] == [3, 6]
    assert all(c.uri.startswith(store.uri(*where) + "/") for c in listed)
    with counted_gets(store) as gets:
        resumed = run(spec(store, asynchronous=asynchronous), one_process(store.location(*where)))
    assert resumed.resumed_from == 6
    # The restore reads each shard ahead, a block per GET, not a GET per torch.load
    # read: this run (restore, listings, three more steps, a save) takes 57 GETs with
    # read-ahead, 1,288 with gcsfs's default cache.
    assert gets() < 150, gets()
    assert {s: resumed.losses[s] for s in (7, 8, 9)} == {s: local.losses[s] for s in (7, 8, 9)}
    # keep_last 2: step 3 was deleted from the bucket after 9 committed.
    assert [c.step for c in manager(store, where).committed()] == [6, 9]
    names = manager(store, where)._names()
    assert not any(n.startswith("step_00000003") for n in names), names


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_store_that_goes_away_mid_save_leaves_the_previous_checkpoint(store_env, monkeypatch):
    """A second endpoint on the same in-process S3 backend is stopped while the save of
    step 6 is being written: training goes on, step 6 never becomes visible, and a
    resume (through the endpoint that stayed up) starts from step 3."""
    from moto.server import ThreadedMotoServer

    # Once the endpoint is gone every request is refused; botocore's own retries of
    # each (five attempts, backing off) would only stretch the same failure to 40 s.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    alive, where = store_env, run_dir()
    doomed = alive.with_endpoint(f"http://{host}:{port}")
    rec = Recorder(at_step=7, action=server.stop)  # during step 6's slowed-down write
    result = run(
        spec(doomed, asynchronous=True, steps=8),
        one_process(
            doomed.location(*where),
            reporter=rec,
            hooks=FaultHooks(slow_save_step=6, slow_save_s=2),
        ),
    )
    assert sorted(result.losses) == list(range(1, 9))  # training survived the outage
    failed = [m for k, m, _ in rec.kinds() if k == "checkpoint_failed"]
    assert failed and "step 6" in failed[0]
    assert [c.step for c in manager(alive, where).committed()] == [3]
    resumed = run(spec(alive, asynchronous=True, steps=8), one_process(alive.location(*where)))
    assert resumed.resumed_from == 3


def test_a_deepspeed_ray_job_resumes_from_s3_after_a_worker_kill_bitwise(
    run_job, telemetry_sink, s3_env, tmp_path
):
    """Two Ray workers of a DeepSpeed ZeRO-3 job save to S3; rank 1 is SIGKILLed at step 7,
    after the save of step 4 committed (synchronous: an asynchronous one may still be
    uploading, and tests/integration/test_strategies.py resumes a DeepSpeed job from an
    asynchronous save). The restarted group restores
    step 4 from the bucket and every step's loss is, bit for bit, the same job's run
    uninterrupted by two local gloo processes (and within 1e-5 of one plain process).
    tests/integration/test_ddp_ray.py kills a DDP job in the middle of a save."""
    job = {
        "name": "it-s3-kill",
        "data": {"seq_len": 32, "num_samples": 256},
        "parallelism": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "train": {
            "steps": 8,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 1e-2,
            "warmup_steps": 2,
            "grad_clip": 1.0,
        },
        "checkpoint": {
            "storage": f"s3://etrain-test/ray/{uuid.uuid4().hex[:8]}",
            "every_steps": 4,
        },
        "stores": {"s3": {"endpoint_url": s3_env["endpoint_url"]}},
        "failure": {"max_failures": 3},
    }
    spec_json = JobSpec.model_validate(job).model_dump(mode="json", by_alias=True)
    tag = uuid.uuid4().hex[:6]
    killed_id = f"j-s3-killed-{tag}"
    marker = tmp_path / "killed-once"
    faults = fault_env(KILL_STEP=7, KILL_RANK=1, MARKER=marker)
    state = run_job(job_id=killed_id, spec=spec_json, extra_env={**s3_env["env"], **faults})
    assert state.value == "SUCCEEDED"
    assert marker.exists(), "the fault was never injected"
    events = telemetry_sink.items("events", killed_id)
    assert [e["data"]["step"] for e in events if e["kind"] == "restored"] == [4]
    got = telemetry_sink.losses(killed_id)
    assert sorted(got) == list(range(1, 9)) and got[8] < got[1]
    uris = [c["uri"] for c in telemetry_sink.items("checkpoints", killed_id)]
    assert uris and all(u.startswith(job["checkpoint"]["storage"] + "/") for u in uris)

    local = {**job, "checkpoint": {"every_steps": 4}, "stores": {}}
    local = JobSpec.model_validate(local).model_dump(mode="json", by_alias=True)
    clean = run_local([LocalJob("clean", local, str(tmp_path / "clean"))], world_size=2)
    assert clean["clean"].error is None, clean["clean"].error
    assert got == clean["clean"].losses  # every step, bit for bit
    one = run(
        JobSpec.model_validate(local), RunEnv(0, 1, torch.device("cpu"), measure_memory=False)
    ).losses
    for step, loss in one.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step
