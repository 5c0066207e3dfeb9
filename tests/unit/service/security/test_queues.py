"""Item 14, queues: one tenant can neither flood the queue nor hold the cluster with a job
that cannot start now. Each case runs against the real app (TestClient, FakeBackend) and
drives the real reconciler one tick at a time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from service.status import JobStatus
from tests.support.api import api_client, tenant_token
from tests.support.fakes import FakeBackend
from tests.support.specs import spec
from workers.spec import parse_spec

ONE = {
    "name": "one",
    "resources": {"workers": 1},
    "train": {"steps": 5, "global_batch_size": 16, "micro_batch_size": 4},
}


def _submit(client: TestClient, headers: dict, *, workers: int = 1, name: str = "one"):
    """POST ONE as ``name`` on ``workers`` workers (a batch of 4 each) and return the answer
    unchecked: the quotas answer 429."""
    train = {"global_batch_size": 4 * workers}
    body = spec(ONE, name=name, resources={"workers": workers}, train=train)
    return client.post("/v1/jobs", json=body, headers=headers)


def _status(client: TestClient, headers: dict, job_id: str) -> str:
    return client.get(f"/v1/jobs/{job_id}", headers=headers).json()["status"]


def _waiting(client: TestClient, headers: dict, job_id: str) -> list[str]:
    events = client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()["items"]
    return [e["message"] for e in events if e["kind"] == "waiting"]


def queued_quota_refuses_the_next_job(tmp_path) -> None:
    """A tenant with a full queue gets 429 naming the quota; another tenant still submits."""
    with api_client(tmp_path, FakeBackend(cpus=4)) as client:
        a, b = tenant_token(client, "team-a"), tenant_token(client, "team-b")
        stores = client.app.state.runtime.stores
        tenant_a = stores.tokens.get_tenant_by_name("team-a").id
        spec = parse_spec(ONE)
        for _ in range(100):  # the default ETRAIN_MAX_QUEUED_JOBS_PER_TENANT
            stores.jobs.create_job(tenant_id=tenant_a, name="one", spec=spec, min_workers=1)
        for _ in range(3):
            r = _submit(client, a)
            assert r.status_code == 429, r.text
            assert "ETRAIN_MAX_QUEUED_JOBS_PER_TENANT" in r.json()["detail"]
        assert client.get("/v1/jobs?status=QUEUED", headers=a).json()["total"] == 100
        # Refused before any planning or storage probe: even a spec with an S3 endpoint.
        s3 = {
            **ONE,
            "checkpoint": {"storage": "s3://b/p"},
            "stores": {"s3": {"endpoint_url": "http://x"}},
        }
        assert client.post("/v1/jobs", json=s3, headers=a).status_code == 429
        assert _submit(client, b).status_code == 201


def never_fitting_head_does_not_block_another_tenant(tmp_path) -> None:
    """The issue's case: A's job needs more than the cluster will ever have; B's 1-worker
    job behind it starts on the idle cluster."""
    with api_client(tmp_path, FakeBackend(cpus=4)) as client:
        a, b = tenant_token(client, "team-a"), tenant_token(client, "team-b")
        huge = _submit(client, a, name="huge", workers=8)
        assert huge.status_code == 201, huge.text
        small = _submit(client, b, name="small").json()
        client.app.state.runtime.reconciler.tick()
        assert _status(client, b, small["id"]) == "PENDING"
        assert _status(client, a, huge.json()["id"]) == "QUEUED"
        (reason,) = _waiting(client, a, huge.json()["id"])
        assert "can never fit this cluster" in reason


def job_that_fits_later_does_not_block_smaller_ones(tmp_path) -> None:
    """A's 4-worker job waits for a busy cluster; B's 1-worker job uses the free CPU."""
    with api_client(tmp_path, FakeBackend(cpus=4)) as client:
        a, b = tenant_token(client, "team-a"), tenant_token(client, "team-b")
        runtime = client.app.state.runtime
        first = _submit(client, a, name="first", workers=3).json()
        runtime.reconciler.tick()
        assert _status(client, a, first["id"]) == "PENDING"
        big = _submit(client, a, name="big", workers=4).json()
        small = _submit(client, b, name="small").json()
        runtime.reconciler.tick()
        assert _status(client, a, big["id"]) == "QUEUED"
        assert _status(client, b, small["id"]) == "PENDING"
        assert any("waiting for resources" in m for m in _waiting(client, a, big["id"]))


def running_worker_quota_caps_one_tenant(tmp_path) -> None:
    """With ETRAIN_MAX_RUNNING_WORKERS_PER_TENANT=2, A's second 2-worker job waits on an
    idle 8-CPU cluster, with a reason naming the quota."""
    with api_client(tmp_path, FakeBackend(cpus=8), max_running_workers_per_tenant=2) as client:
        a = tenant_token(client, "team-a")
        jobs = [_submit(client, a, name=f"j{i}", workers=2).json() for i in (0, 1)]
        client.app.state.runtime.reconciler.tick()
        assert [_status(client, a, j["id"]) for j in jobs] == ["PENDING", "QUEUED"]
        (reason,) = _waiting(client, a, jobs[1]["id"])
        assert "ETRAIN_MAX_RUNNING_WORKERS_PER_TENANT" in reason


CASES: dict[str, Callable] = {
    "item14-queued-jobs-quota-429": queued_quota_refuses_the_next_job,
    "item14-never-fitting-head-does-not-block": never_fitting_head_does_not_block_another_tenant,
    "item14-no-head-of-line-blocking": job_that_fits_later_does_not_block_smaller_ones,
    "item14-running-workers-quota": running_worker_quota_caps_one_tenant,
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_queues(case, tmp_path):
    case(tmp_path)


def test_the_statuses_these_cases_read_are_the_service_statuses():
    assert {"QUEUED", "PENDING"} <= {s.value for s in JobStatus}
