"""No route queries the database on the event loop: a query waits (SQLite's writers queue on
one lock), and every other request, a job's telemetry included, would wait with it."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from service.api.app import create_app
from service.auth import create_reporter_token
from service.settings import Settings
from tests.support.fakes import FakeBackend

ADMIN = "et_admin-token-for-the-loop-tests-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}
SPEC = {"name": "tiny", "resources": {"workers": 2}, "train": {"steps": 5}}


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def client(tmp_path):
    settings = Settings(
        env="development",
        data_dir=tmp_path,
        admin_token=ADMIN,
        database_url=f"sqlite:///{tmp_path / 'etrain.db'}",
    )
    with TestClient(create_app(settings, backend=FakeBackend(), reconcile=False)) as c:
        yield c


def test_routes_query_the_store_off_the_event_loop(client):
    stores = client.app.state.runtime.stores
    queries: list[tuple[bool, str]] = []

    def seen(conn, cursor, statement, *args) -> None:
        queries.append((_on_loop(), statement.split("\n")[0][:80]))

    event.listen(stores.db._engine, "before_cursor_execute", seen)
    job = client.post("/v1/jobs", json=SPEC, headers=H).json()
    record = stores.jobs.get_job(job["id"])
    reporter = create_reporter_token(stores.tokens, tenant_id=record.tenant_id, job_id=job["id"])
    calls = [
        ("POST", "/v1/jobs", SPEC, H),
        ("POST", "/v1/plan", {"spec": SPEC}, H),
        ("POST", "/v1/tokens", {"tenant": "acme", "name": "ci"}, H),
        (
            "POST",
            f"/v1/jobs/{job['id']}/telemetry",
            {"events": [{"kind": "started", "message": "up", "ts": 1.0}]},
            {"Authorization": f"Bearer {reporter}"},
        ),
        ("GET", "/v1/jobs", None, H),
        ("GET", f"/v1/jobs/{job['id']}", None, H),
        ("GET", "/v1/tokens", None, H),
        ("POST", f"/v1/jobs/{job['id']}/cancel", None, H),
    ]
    for method, path, body, headers in calls:
        queries.clear()
        r = client.request(method, path, json=body, headers=headers)
        assert r.status_code < 300, (path, r.text)
        assert queries, f"{method} {path} made no query: the check sees nothing"
        on_loop = [q for loop, q in queries if loop]
        assert not on_loop, f"{method} {path} queried on the event loop: {on_loop}"
