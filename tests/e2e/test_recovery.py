"""Recovery beyond Ray Train's own restarts, as a user would see it through etrain."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time

import psutil
import pytest
import yaml

from tests.support.processes import job_processes

pytestmark = pytest.mark.slow


# Long enough that each job still trains when it is interrupted (past step 30 / 20) and
# for a while after (a restart, a new service), at about 0.3 s a step on two cores. (85
# restart steps saved nothing: 43 s against 35 s with 110, one run each.)
KILL_STEPS = 70
RESTART_STEPS = 110


def _spec(name: str, steps: int, workers: int | dict = 2) -> dict:
    return {
        "name": name,
        "data": {"seq_len": 32, "num_samples": 512},
        "resources": {"workers": workers},
        "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2, "lr": 3e-3},
        "checkpoint": {"every_steps": 20},
    }


def _driver_of(job: dict) -> psutil.Process | None:
    """The job driver (`python -m workers.launch`, not Ray's shell around it) of one job."""
    drivers = [
        p
        for p in job_processes(job, cmdline_has="workers.launch")
        if "python" in os.path.basename(p.cmdline()[0])
    ]
    return drivers[0] if drivers else None


def test_killed_driver_is_resubmitted_and_resumes(served, waiter):
    """An elastic job: its killed controller leaves a 180 s resource reservation behind,
    which the resubmitted run must cancel to start at once (workers.elastic.scaling)."""
    with served.client() as c:
        job = c.post(
            "/v1/jobs", json=_spec("e2e-driver-kill", KILL_STEPS, {"min": 1, "max": 2})
        ).json()
        waiter(
            lambda: (c.get(f"/v1/jobs/{job['id']}").json()["step"] or 0) >= 30,
            what="job past its first checkpoint",
        )
        job = c.get(f"/v1/jobs/{job['id']}").json()  # its submission id, now it has one
        driver = waiter(lambda: _driver_of(job), what="driver process")
        killed_at = time.time()
        driver.send_signal(signal.SIGKILL)
        done = waiter(
            lambda: (
                (j := c.get(f"/v1/jobs/{job['id']}").json())["status"]
                in ("SUCCEEDED", "FAILED", "CANCELLED")
                and j
            ),
            timeout=400,
            what="job finished",
        )
        assert done["status"] == "SUCCEEDED", done["error"]
        assert done["resubmits"] == 1
        events = c.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        kinds = [e["kind"] for e in events]
        assert "resubmitted" in kinds
        restored = [e for e in events if e["kind"] == "restored"]
        assert restored and restored[-1]["data"]["step"] >= 20
        # A stale reservation would hold the head's CPUs for 180 s from the killed
        # controller's last renewal, so the restore would come after that; with it cancelled,
        # the restore is only the resubmission and a start (92 s once on a host where torchrun
        # took three times its usual start: the bound leaves that room and still catches it).
        when = dt.datetime.fromisoformat(restored[-1]["ts"])
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        assert when.timestamp() - killed_at < 150, when.timestamp() - killed_at
        steps = [m["step"] for m in c.get(f"/v1/jobs/{job['id']}/metrics").json()["items"]]
        assert steps == list(range(1, KILL_STEPS + 1))  # every step once, none counted twice


def test_control_plane_restart_mid_job_keeps_tracking(ray_backend, serve_factory, tmp_path, waiter):
    """SIGKILL `etrain serve` (not Ray) mid-job; a new one picks the job up where it is.
    Stopped cleanly after the job ends, a third one serves the finished job and the very
    same metrics."""
    s = serve_factory(tmp_path / "cp", ray_address=ray_backend.address)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_spec("e2e-cp-restart", RESTART_STEPS)))
    with s.client() as c:
        job = c.post("/v1/jobs", json=_spec("e2e-cp-restart", RESTART_STEPS)).json()
        waiter(
            lambda: (c.get(f"/v1/jobs/{job['id']}").json()["step"] or 0) >= 20, what="job training"
        )
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(30)
    s2 = serve_factory(
        tmp_path / "cp",
        ray_address=ray_backend.address,
        extra_env={"ETRAIN_PORT": s.url.rsplit(":", 1)[1]},
    )
    try:
        with s2.client() as c:
            done = waiter(
                lambda: (
                    (j := c.get(f"/v1/jobs/{job['id']}").json())["status"]
                    in ("SUCCEEDED", "FAILED")
                    and j
                ),
                timeout=400,
                what="job finished",
            )
            assert done["status"] == "SUCCEEDED" and done["resubmits"] == 0
            metrics = c.get(f"/v1/jobs/{job['id']}/metrics").json()["items"]
            assert [m["step"] for m in metrics] == list(range(1, RESTART_STEPS + 1))
            starts = [
                e
                for e in c.get(f"/v1/jobs/{job['id']}/events").json()["items"]
                if e["kind"] == "workers_started"
            ]
            assert len(starts) == 1  # the Ray job ran on; nothing restarted or duplicated
    finally:
        stopped = s2.stop()
    assert stopped == 0  # a clean stop this time: the finished job and its metrics stay
    s3 = serve_factory(tmp_path / "cp", ray_address=ray_backend.address)
    try:
        with s3.client() as c:
            again = c.get(f"/v1/jobs/{job['id']}").json()
            assert again["status"] == "SUCCEEDED" and again["step"] == RESTART_STEPS
            assert c.get(f"/v1/jobs/{job['id']}/metrics").json()["items"] == metrics
    finally:
        s3.stop()
