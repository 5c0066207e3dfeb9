"""The REST API in-process for unit tests: the app on a FakeBackend behind a TestClient,
and the calls most tests make through it (submit, a tenant's token, a job's reporter token).

The ``backend`` and ``client`` fixtures in tests/conftest.py are built from these.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient

from service.api.app import create_app
from service.auth import create_reporter_token
from service.status import JobStatus
from service.store import Stores
from tests.support.fakes import ADMIN_H, FakeBackend, dev_settings
from tests.support.specs import JOB, spec


def auth(token: str) -> dict[str, str]:
    """The Authorization header for ``token``."""
    return {"Authorization": f"Bearer {token}"}


def api_client(
    tmp_path,
    backend: FakeBackend | None = None,
    *,
    raise_server_exceptions: bool = True,
    **settings,
) -> TestClient:
    """A TestClient (enter it with ``with``) of the app on ``backend`` (a fresh FakeBackend by
    default), with ``dev_settings(tmp_path, **settings)`` and no reconciler."""
    app = create_app(
        dev_settings(tmp_path, **settings), backend=backend or FakeBackend(), reconcile=False
    )
    return TestClient(app, raise_server_exceptions=raise_server_exceptions)


def stores(client: TestClient) -> Stores:
    """The stores of the app behind ``client``."""
    return client.app.state.runtime.stores


def submit(
    client: TestClient, headers: dict = ADMIN_H, *, base: dict = JOB, **overrides: Any
) -> dict:
    """POST ``spec(base, **overrides)`` to /v1/jobs; assert 201 and return the job."""
    r = client.post("/v1/jobs", json=spec(base, **overrides), headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def tenant_token(client: TestClient, tenant: str, **body: Any) -> dict[str, str]:
    """A new user token of ``tenant`` (created by the admin), as headers."""
    r = client.post("/v1/tokens", json={"tenant": tenant, **body}, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    return auth(r.json()["token"])


def reporter(client: TestClient, job_id: str) -> dict[str, str]:
    """Headers with a reporter token of job ``job_id`` (what its workers send telemetry with)."""
    s = stores(client)
    job = s.jobs.get_job(job_id)
    return auth(create_reporter_token(s.tokens, tenant_id=job.tenant_id, job_id=job_id))


def make_pending(client: TestClient, job_id: str, submission_id: str | None = None) -> None:
    """Move a job to PENDING as if the reconciler had submitted it (as ``submission_id``)."""
    fields = {"submission_id": submission_id} if submission_id else {}
    assert stores(client).jobs.update_job(job_id, status=JobStatus.PENDING, **fields) is not None


def total(client: TestClient) -> int:
    """How many jobs the admin's GET /v1/jobs counts."""
    r = client.get("/v1/jobs", headers=ADMIN_H)
    assert r.status_code == 200
    return r.json()["total"]


def metric_point(step: int, **extra: Any) -> dict:
    """One telemetry metrics point, as a worker sends it, at ``step``."""
    return {
        "step": step,
        "ts": time.time(),
        "loss": 5.0 - step / 10,
        "lr": 3e-4,
        "samples_per_s": 100.0,
        "tokens_per_s": 12800.0,
        "world_size": 2,
        **extra,
    }
