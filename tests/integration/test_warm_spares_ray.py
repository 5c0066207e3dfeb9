"""Warm spare workers on real Ray (workers.warm.spares).

A job keeps spare worker processes with the training stack imported; after a
worker is killed, Ray Train's restarted group runs in them, and none of them
outlives the job.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import psutil
import pytest

from service.backends.base import RunState
from tests.support.faults import fault_env
from tests.support.polling import wait_for
from tests.support.ray_cluster import submit_job, wait_for_job
from workers.warm.spares import READY, SPARES_ROOT, WARMING, spares_in

pytestmark = pytest.mark.slow


def _train_worker_pids() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])
    ]


def _spare_folders(ray_backend, ray_job_id: str) -> list:
    """The job's spare folders on this session's nodes: Ray job ids restart with every
    cluster, and other clusters on this machine (an e2e test's service) keep spares too."""
    nodes = [n["node_id"] for n in ray_backend.cluster().nodes if n.get("node_id")]
    return [SPARES_ROOT / ray_job_id / node[:16] for node in nodes]


def _spares(folders, **kw) -> list[int]:
    return [pid for folder in folders for pid in spares_in(folder, **kw)]


def _ray_job_id(ray_backend, submission_id: str) -> str:
    """The Ray job id of a submission, once its driver has started (names its spares'
    folder: other jobs on the session's cluster, e.g. a standby driver, keep their own)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_backend.address)
    return wait_for(
        lambda: client.get_job_info(submission_id).job_id,
        timeout=120,
        every=0.3,
        what="the driver's Ray job id",
    )


def test_a_restarted_group_runs_in_warm_spares_that_end_with_the_job(
    ray_backend, telemetry_sink, tmp_path
):
    throttle = tmp_path / "throttle"
    throttle.touch()
    job_id = f"j-spares-{uuid.uuid4().hex[:6]}"
    spec = {
        "name": "spares",
        "model": {"preset": "gpt-tiny"},
        "data": {"source": "synthetic", "seq_len": 16, "num_samples": 4096},
        "resources": {"workers": 2},
        "train": {"steps": 40, "global_batch_size": 8, "micro_batch_size": 2},
        "checkpoint": {"storage": f"file://{tmp_path}", "every_steps": 5},
    }
    submit_job(
        ray_backend,
        job_id=job_id,
        spec=spec,
        report_url=telemetry_sink.url,
        env=fault_env(THROTTLE_FILE=throttle, THROTTLE_S=0.3),
    )
    mine = _spare_folders(ray_backend, _ray_job_id(ray_backend, f"it-{job_id}"))
    try:
        # After its first step, the group's node asks for as many spares as it runs
        # workers (the workers' own processes stopped counting when they started).
        wait_for(
            lambda: len(telemetry_sink.losses(job_id)) >= 2, timeout=180, every=0.3, what="2 steps"
        )
        spares = set(
            wait_for(
                lambda: (s := _spares(mine)) and len(s) >= 2 and s,
                timeout=180,
                every=0.3,
                what="2 ready spares",
            )
        )
        workers = wait_for(_train_worker_pids, timeout=30, every=0.3, what="the training workers")
        assert not spares & set(workers)
        t_kill = time.time()
        os.kill(workers[0], signal.SIGKILL)
        restored = wait_for(
            lambda: [
                e
                for e in telemetry_sink.items("events", job_id)
                if e["kind"] == "restored" and e["ts"] > t_kill
            ],
            timeout=180,
            every=0.3,
            what="a restore",
        )
        assert restored
        # The restarted group runs in the spares: processes that were running before
        # the failure, with the training stack imported.
        assert (
            set(wait_for(_train_worker_pids, timeout=30, every=0.3, what="the new workers"))
            <= spares
        )
        throttle.unlink()
        state = wait_for_job(ray_backend, f"it-{job_id}", timeout=300)
        assert state == RunState.SUCCEEDED
    finally:
        throttle.unlink(missing_ok=True)
        ray_backend.stop(f"it-{job_id}")
    # The raylet ends a finished job's idle workers, spares included.
    wait_for(
        lambda: not _spares(mine, states=(WARMING, READY)) or None,
        timeout=60,
        every=0.3,
        what="every spare gone after the job",
    )
