"""A job handed to a standby driver (a Ray job warmed up before it) trains as one started for
it: its credentials reach the controller and every worker, and never the Ray job. Once it
succeeded, the same driver runs the next job, and each job's log is its own."""

from __future__ import annotations

import re
import uuid

import pytest

from service.backends.standby import SUBMISSION_PREFIX, runner_of
from workers.contract import REPORT_TOKEN_ENV, STANDBY_RUN_BEGIN, STANDBY_TOKEN_ENV

pytestmark = pytest.mark.slow

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _spec(name: str, s3: dict) -> dict:
    return {
        "name": name,
        "data": {"seq_len": 16, "num_samples": 128},
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "train": {"steps": 6, "global_batch_size": 4, "micro_batch_size": 2},
        "checkpoint": {
            "storage": f"s3://{s3['bucket']}/standby/{uuid.uuid4().hex[:8]}",
            "every_steps": 3,
        },
        "stores": {"s3": {"endpoint_url": s3["endpoint_url"]}},
    }


def test_a_standby_driver_runs_a_job_with_its_own_object_store_keys(
    ray_backend, serve_factory, s3_server, tmp_path, waiter, open_tab
):
    from ray.job_submission import JobSubmissionClient

    # The service holds the S3 keys; the session's Ray head does not (the bucket refuses
    # unsigned requests), so every checkpoint written proves the keys reached the workers.
    # The submit's write probe gets a minute: on two loaded cores the default 10 s can pass
    # before the loopback S3 answers (a 422 that says nothing about standby drivers).
    env = {**s3_server["env"], "ETRAIN_PROBE_TIMEOUT_S": "60", "ETRAIN_STANDBY_DRIVERS": "1"}
    s = serve_factory(tmp_path / "cp", ray_address=ray_backend.address, extra_env=env)
    try:
        with s.client() as c:
            # A new service starts its standby before it admits the first job; once warm,
            # it reports what its processes hold (the driver alone is well under 1 GB; with
            # the worker processes it warmed, over).
            pool = waiter(
                lambda: (
                    (st := c.get("/v1/cluster").json()["standby"])["warm"] == 1
                    and st["memory_bytes"] > 1e9
                    and st
                ),
                timeout=120,
                what="the standby warm, its memory reported",
            )
            assert pool["configured"] == 1 and pool["idle"] == 1
            # A warm idle standby: a script waiting for warm-speed starts may go now.
            assert c.get("/readyz").json()["ready_for_fast_start"] is True
            tab = open_tab(width=800, height=900)
            tab.sign_in(s.url, s.token)
            tab.page.goto(f"{s.url}/ui/cluster")
            standby = tab.page.locator("#standby").inner_text()  # its line, memory included
            assert re.fullmatch(
                r"Standby job drivers: 1 warm, 0 warming, 0 running a job \(1 kept\): "
                r"\d+ processes, [\d.]+ GB of host memory; budget \d+ processes, .*",
                standby,
            ), standby
            tab.check()
            posted = c.post("/v1/jobs", json=_spec("standby-s3", s3_server))
            assert posted.status_code == 201, posted.text
            job = posted.json()
            done = waiter(
                lambda: (j := c.get(f"/v1/jobs/{job['id']}").json())["status"] in TERMINAL and j,
                timeout=300,
                what="the job to end",
            )
            assert done["status"] == "SUCCEEDED", done["error"]
            assert done["submission_id"].startswith(SUBMISSION_PREFIX)
            steps = [m["step"] for m in c.get(f"/v1/jobs/{job['id']}/metrics").json()["items"]]
            assert steps == list(range(1, 7))  # the reporter token came with the job
            uris = [k["uri"] for k in c.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]]
            assert len(uris) == 2 and all(u.startswith("s3://") for u in uris)
            events = c.get(f"/v1/jobs/{job['id']}/events").json()["items"]
            started = [e for e in events if e["kind"] == "workers_started"]
            assert "assigned" in started[0]["data"]["startup"]  # handed over, not started
            logs = c.get(f"/v1/jobs/{job['id']}/logs").text
            # The next job, submitted at once, runs in the same standby driver.
            second = c.post("/v1/jobs", json=_spec("standby-next", s3_server)).json()
            done2 = waiter(
                lambda: (j := c.get(f"/v1/jobs/{second['id']}").json())["status"] in TERMINAL and j,
                timeout=300,
                what="the second job to end",
            )
            assert done2["status"] == "SUCCEEDED", done2["error"]
            ray_id, own = runner_of(done["submission_id"])
            assert own == f"etrain-{job['id']}-0"
            assert runner_of(done2["submission_id"]) == (ray_id, f"etrain-{second['id']}-0")
            logs2 = c.get(f"/v1/jobs/{second['id']}/logs").text
            followed = c.get(f"/v1/jobs/{second['id']}/logs", params={"follow": "true"}).text
            waiter(
                lambda: c.get("/v1/cluster").json()["standby"]["warm"] == 1,
                timeout=60,
                what="the standby back in the pool",
            )
        info = JobSubmissionClient(ray_backend.address).get_job_info(ray_id)
        ray_env = info.runtime_env["env_vars"]
        assert REPORT_TOKEN_ENV not in ray_env
        assert not set(ray_env) & set(s3_server["env"])
        assert logs.startswith(f"{STANDBY_RUN_BEGIN}{own} (job {job['id']})")
        assert logs2.startswith(f"{STANDBY_RUN_BEGIN}etrain-{second['id']}-0")
        assert own not in logs2 and "training finished" in logs2  # its own part, whole
        assert followed == logs2  # the stream ends with the job's part, not the Ray job
        assert s3_server["env"]["AWS_SECRET_ACCESS_KEY"] not in logs + logs2
        assert ray_env[STANDBY_TOKEN_ENV] not in s.log.read_text()
    finally:
        s.stop()
