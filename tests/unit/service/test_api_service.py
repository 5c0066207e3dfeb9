"""The service-wide routes (cluster, probes, Prometheus) and a rule every route keeps: no
store query on the event loop."""

from __future__ import annotations

import asyncio

from sqlalchemy import event

from service.errors import BackendUnavailable
from tests.support.api import (
    reporter,
    stores,
    submit,
)
from tests.support.fakes import ADMIN_H
from tests.support.specs import JOB

# -- cluster, probes, prometheus --------------------------------------------


def test_cluster(client):
    r = client.get("/v1/cluster", headers=ADMIN_H)
    assert r.status_code == 200
    body = r.json()
    assert body["total"] == {"CPU": 2.0}
    assert body["dashboard_url"] == "http://ray.test:8265"
    assert [n["node_id"] for n in body["nodes"]] == ["n-1"]
    assert body["standby"] is None  # this backend keeps no standby drivers


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_follows_the_backend(client, backend):
    assert client.get("/readyz").status_code == 200
    backend.ping_error = BackendUnavailable("ray head unreachable")
    r = client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["reason"] == "BackendUnavailable"
    backend.ping_error = None
    assert client.get("/readyz").status_code == 200


def test_prometheus_metrics_count_jobs_by_status(client):
    submit(client, name="a")
    cancelled = submit(client, name="b")["id"]
    client.post(f"/v1/jobs/{cancelled}/cancel", headers=ADMIN_H)
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert 'etrain_jobs{status="QUEUED"} 1.0' in lines
    assert 'etrain_jobs{status="CANCELLED"} 1.0' in lines
    assert 'etrain_jobs{status="RUNNING"} 0.0' in lines
    assert any(line.startswith("etrain_jobs_submitted_total") for line in lines)


# -- the event loop ----------------------------------------------------------------


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_routes_query_the_store_off_the_event_loop(client):
    """A query on the event loop waits (SQLite's writers queue on one lock), and every other
    request, a job's telemetry included, would wait with it."""
    queries: list[tuple[bool, str]] = []

    def seen(conn, cursor, statement, *args) -> None:
        queries.append((_on_loop(), statement.split("\n")[0][:80]))

    event.listen(stores(client).db._engine, "before_cursor_execute", seen)
    job_id = submit(client)["id"]
    calls = [
        ("POST", "/v1/jobs", JOB, ADMIN_H),
        ("POST", "/v1/plan", {"spec": JOB}, ADMIN_H),
        ("POST", "/v1/tokens", {"tenant": "acme", "name": "ci"}, ADMIN_H),
        (
            "POST",
            f"/v1/jobs/{job_id}/telemetry",
            {"events": [{"kind": "started", "message": "up", "ts": 1.0}]},
            reporter(client, job_id),
        ),
        ("GET", "/v1/jobs", None, ADMIN_H),
        ("GET", f"/v1/jobs/{job_id}", None, ADMIN_H),
        ("GET", "/v1/tokens", None, ADMIN_H),
        ("POST", f"/v1/jobs/{job_id}/cancel", None, ADMIN_H),
    ]
    for method, path, body, headers in calls:
        queries.clear()
        r = client.request(method, path, json=body, headers=headers)
        assert r.status_code < 300, (path, r.text)
        # A dry run reads nothing once its caller's token and tenant name are known.
        assert queries or path == "/v1/plan", (
            f"{method} {path} made no query: the check sees nothing"
        )
        on_loop = [q for loop, q in queries if loop]
        assert not on_loop, f"{method} {path} queried on the event loop: {on_loop}"
