"""A job that genuinely fails on real Ray, through the real service (app, domain, reconciler,
store) on the session's Ray head: it ends FAILED with the cause in its events, is not
resubmitted, and gives its CPUs back, so the job queued behind it runs."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
import uvicorn

from service.api.app import create_app
from service.settings import Settings
from tests.support.polling import wait_for

ADMIN = "et_admin-token-of-the-failing-job-test-0123456789"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def service(ray_backend, tmp_path):
    """The control plane in this process (uvicorn in a thread) on the session's Ray head;
    the workers post their telemetry to it."""
    sock = socket.socket()  # bound here and served by uvicorn: no other process can take it
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings(
        data_dir=tmp_path / "etrain",
        admin_token=ADMIN,
        port=port,
        reconcile_interval_s=0.5,
        database_url=f"sqlite:///{tmp_path / 'etrain.db'}",
    )
    app = create_app(settings, backend=ray_backend)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=60, what="the service to start")
    yield settings
    server.should_exit = True
    thread.join(30)


def _spec(name: str, **data) -> dict:
    return {
        "name": name,
        "data": {"seq_len": 32, "num_samples": 256, **data},
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "train": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 2},
        "checkpoint": {"every_steps": 100},
        "failure": {"max_failures": 0, "max_resubmits": 2},
    }


def test_a_failing_job_ends_failed_with_its_cause_and_frees_the_cluster(service, ray_backend):
    base = f"http://127.0.0.1:{service.port}"
    admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    token = admin.post("/v1/tokens", json={"tenant": "team-fail"}).json()["token"]
    c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    area = service.data_path / "tenants" / "team-fail"
    area.mkdir(parents=True, exist_ok=True)
    missing = area / "corpus-that-is-not-there.txt"

    r = c.post("/v1/jobs", json=_spec("fails", source="text", path=str(missing)))
    assert r.status_code == 201, r.text
    failing = r.json()["id"]
    # Needs the 2 CPUs the failing job holds: it waits in the queue behind it.
    r = c.post("/v1/jobs", json=_spec("behind"))
    assert r.status_code == 201, r.text
    behind = r.json()["id"]

    job = lambda job_id: c.get(f"/v1/jobs/{job_id}").json()  # noqa: E731
    events = lambda job_id: c.get(f"/v1/jobs/{job_id}/events").json()["items"]  # noqa: E731
    wait_for(lambda: job(failing)["status"] in TERMINAL, timeout=300, what="the job to fail")

    got = job(failing)
    kinds = [e["kind"] for e in events(failing)]
    assert got["status"] == "FAILED", got
    assert "does not exist" in got["error"] and str(missing) in got["error"]
    assert kinds[-1] == "failed" and "does not exist" in events(failing)[-1]["message"]
    # A bug in the job, not a lost node: never resubmitted, its one Ray submission kept.
    assert "resubmitted" not in kinds and got["dashboard_url"].endswith(f"etrain-{failing}-0")

    # Its CPUs are back: the job queued behind it is admitted, runs on Ray and finishes.
    wait_for(lambda: job(behind)["status"] in TERMINAL, timeout=300, what="the next job to end")
    assert job(behind)["status"] == "SUCCEEDED", events(behind)
    admitted = [e["id"] for e in events(behind) if e["kind"] == "admitted"]
    assert admitted and min(admitted) > events(failing)[-1]["id"]  # only once the other ended
    assert "workers_started" in [e["kind"] for e in events(behind)]
    wait_for(
        lambda: ray_backend.cluster().available.get("CPU") == ray_backend.cluster().total["CPU"],
        timeout=60,
        what="every CPU of the cluster free again",
    )
    # Neither job's log carries a line per telemetry post.
    for job_id in (failing, behind):
        assert "HTTP Request:" not in c.get(f"/v1/jobs/{job_id}/logs").text
