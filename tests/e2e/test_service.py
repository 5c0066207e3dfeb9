"""The product as a user drives it: `etrain` CLI and REST against a running `etrain serve`."""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

import pytest
import yaml

from service.backends.standby import SUBMISSION_PREFIX, runner_of

pytestmark = pytest.mark.slow

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def tiny_spec(name: str, *, steps: int = 12, every: int = 6) -> dict:
    """A small 2-worker DDP job."""
    return {
        "name": name,
        "data": {"seq_len": 32, "num_samples": 512},
        "resources": {"workers": 2},
        "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2, "lr": 3e-3},
        "checkpoint": {"every_steps": every},
    }


def _standby_ids(job: dict) -> tuple[str, ...]:
    sid = job["submission_id"] or ""
    return (sid,) if sid.startswith(SUBMISSION_PREFIX) else ()


def write(tmp_path, spec: dict, name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_an_idle_connection_outlives_a_clients_pool_expiry(served):
    """A pooled client (httpx keeps idle connections 5 s) may reuse a connection up to its
    own expiry; closed by the server first, the request sent on it would get a reset."""
    url = urlsplit(served.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read()
        sock = conn.sock
        time.sleep(6)  # longer than httpx's keepalive_expiry and uvicorn's default 5 s
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200 and conn.sock is sock  # the same connection
    finally:
        conn.close()


def test_submit_follow_train_checkpoint_and_inspect(served, tmp_path):
    result = served.cli("submit", str(write(tmp_path, tiny_spec("e2e-follow"))), "--follow")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCEEDED" in result.stdout
    assert served.token not in result.stdout + result.stderr

    with served.client() as c:
        job = c.get("/v1/jobs", params={"limit": 1}).json()["items"][0]
        assert job["name"] == "e2e-follow" and job["status"] == "SUCCEEDED"
        assert job["step"] == 12 and job["world_size"] == 2
        # Its Ray job: a standby driver's (etrain-standby-<id>) or its own (etrain-<id>-0).
        assert job["submission_id"] in (f"etrain-{job['id']}-0", *_standby_ids(job))
        ray_id = runner_of(job["submission_id"])[0]  # a standby's job: its Ray job's page
        assert job["dashboard_url"].endswith(f"/#/jobs/{ray_id}")
        metrics = c.get(f"/v1/jobs/{job['id']}/metrics").json()["items"]
        assert [m["step"] for m in metrics] == list(range(1, 13))
        assert all(m["world_size"] == 2 and m["tokens_per_s"] > 0 for m in metrics)
        ckpts = c.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
        assert [ck["step"] for ck in ckpts] == [6, 12]
        assert all(
            ck["uri"].startswith(f"file://{served.data_dir}") and ck["bytes"] > 0 for ck in ckpts
        )
        kinds = [e["kind"] for e in c.get(f"/v1/jobs/{job['id']}/events").json()["items"]]
        for kind in ("submitted", "admitted", "workers_started", "checkpoint_saved", "succeeded"):
            assert kind in kinds
        assert kinds[0] == "submitted" and kinds[-1] == "succeeded"
        logs = c.get(f"/v1/jobs/{job['id']}/logs").text
        assert "etrain: training finished" in logs

    status = served.cli("status", job["id"])
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout
    listing = served.cli("jobs")
    assert job["id"] in listing.stdout
    followed = served.cli("logs", job["id"], "-f", timeout=60)  # ends with the job's stream
    assert followed.returncode == 0 and "etrain: training finished" in followed.stdout


def test_fifo_queue_and_cancel(served, tmp_path, waiter):
    """The 2-CPU cluster holds one 2-worker job: the next waits QUEUED until room frees."""
    long_job = write(tmp_path, tiny_spec("e2e-long", steps=2000, every=1000), "a.yaml")
    assert served.cli("submit", str(long_job)).returncode == 0
    with served.client() as c:
        a = c.get("/v1/jobs", params={"limit": 1}).json()["items"][0]
        assert a["name"] == "e2e-long"
        b = c.post("/v1/jobs", json=tiny_spec("e2e-second")).json()
        waiter(
            lambda: c.get(f"/v1/jobs/{a['id']}").json()["status"] == "RUNNING",
            what="first job running",
        )
        assert c.get(f"/v1/jobs/{b['id']}").json()["status"] == "QUEUED"
        # The scheduler records why on its next tick, which a standby-started job may
        # beat to RUNNING.
        waiter(
            lambda: any(
                e["kind"] == "waiting" for e in c.get(f"/v1/jobs/{b['id']}/events").json()["items"]
            ),
            what="second job's waiting event",
        )
        assert c.get(f"/v1/jobs/{b['id']}").json()["status"] == "QUEUED"

        out = served.cli("cancel", a["id"])
        assert out.returncode == 0 and "CANCELLED" in out.stdout
        again = c.post(f"/v1/jobs/{a['id']}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "CANCELLED"
        # Room freed: the queued job is admitted and runs to the end.
        done = waiter(
            lambda: (j := c.get(f"/v1/jobs/{b['id']}").json())["status"] in TERMINAL and j,
            what="second job finished",
        )
        assert done["status"] == "SUCCEEDED"
        # The cancelled job's Ray driver is really gone (its workers with it).
        waiter(lambda: _ray_job_status(c, a) in ("STOPPED", "FAILED"), what="Ray job stopped")


def _ray_job_status(c, job) -> str:
    """What Ray itself says about the job's driver (not etrain's record of it)."""
    from ray.job_submission import JobSubmissionClient

    job = c.get(f"/v1/jobs/{job['id']}").json()
    url = job["dashboard_url"].split("/#/")[0]
    return JobSubmissionClient(url).get_job_status(runner_of(job["submission_id"])[0]).value


def test_bad_specs_are_refused_with_the_field(served, tmp_path):
    bad = tiny_spec("e2e-bad")
    bad["train"]["global_batch_size"] = 6  # not a multiple of micro 2 x dp 2
    out = served.cli("submit", str(write(tmp_path, bad, "bad.yaml")))
    assert out.returncode == 2
    assert "global_batch_size" in out.stderr and "multiple of 4" in out.stderr
    with served.client() as c:
        before = c.get("/v1/jobs").json()["total"]
        r = c.post(
            "/v1/jobs", content=b"name: [unclosed", headers={"Content-Type": "application/yaml"}
        )
        assert r.status_code == 422
        r = c.post("/v1/jobs", json={**tiny_spec("e2e-bad2"), "bogus": 1})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "bogus"
        assert c.get("/v1/jobs").json()["total"] == before
        assert c.get("/v1/jobs/j-doesnotexist").status_code == 404
    assert served.cli("status", "j-doesnotexist").returncode == 2
