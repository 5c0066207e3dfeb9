"""A job handed to a standby driver (a Ray job warmed up before it) trains as one started for
it: its credentials reach the controller and every worker, and never the Ray job."""

from __future__ import annotations

import re
import uuid

import pytest

from service.backends.standby import SUBMISSION_PREFIX
from workers.contract import REPORT_TOKEN_ENV, STANDBY_TOKEN_ENV

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
            tab = open_tab(width=800, height=900)
            tab.sign_in(s.url, s.token)
            tab.page.goto(f"{s.url}/ui/cluster")
            standby = tab.page.locator("#standby").inner_text()  # its line, memory included
            assert re.fullmatch(
                r"Standby job drivers: 1 warm, 0 warming \(1 kept\), [\d.]+ GB .*", standby
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
        info = JobSubmissionClient(ray_backend.address).get_job_info(done["submission_id"])
        ray_env = info.runtime_env["env_vars"]
        assert REPORT_TOKEN_ENV not in ray_env
        assert not set(ray_env) & set(s3_server["env"])
        assert f"running job {job['id']}" in logs
        assert s3_server["env"]["AWS_SECRET_ACCESS_KEY"] not in logs
        assert ray_env[STANDBY_TOKEN_ENV] not in s.log.read_text()
    finally:
        s.stop()
