"""The REST API's authentication and authorization: every /v1 route needs a valid token,
reporter tokens only send telemetry, tenants see only their own jobs and tokens, and the admin
token never appears in a body or a log line."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from service.api import generate_routes, goodput_routes, routes, standby_routes, token_routes
from service.api.app import create_app
from service.auth import authenticate
from tests.support.api import (
    api_client,
    auth,
    make_pending,
    metric_point,
    reporter,
    stores,
    submit,
    tenant_token,
    total,
)
from tests.support.fakes import ADMIN, ADMIN_H, FakeBackend, dev_settings
from tests.support.specs import JOB

# -- authentication -----------------------------------------------------------

PROTECTED = [
    ("POST", "/v1/jobs", JOB),
    ("GET", "/v1/jobs", None),
    ("GET", "/v1/jobs/{job_id}", None),
    ("POST", "/v1/jobs/{job_id}/cancel", None),
    ("GET", "/v1/jobs/{job_id}/logs", None),
    ("GET", "/v1/jobs/{job_id}/metrics", None),
    ("GET", "/v1/jobs/{job_id}/events", None),
    ("GET", "/v1/jobs/{job_id}/checkpoints", None),
    ("GET", "/v1/jobs/{job_id}/memory", None),
    ("GET", "/v1/jobs/{job_id}/goodput", None),
    ("POST", "/v1/jobs/{job_id}/generate", {"prompt": "hello"}),
    ("POST", "/v1/jobs/{job_id}/telemetry", {"metrics": []}),
    ("POST", "/v1/plan", {"spec": JOB}),
    ("GET", "/v1/cluster", None),
    ("POST", "/v1/tokens", {"tenant": "acme"}),
    ("GET", "/v1/tokens", None),
    ("DELETE", "/v1/tokens/{token_id}", None),
    ("GET", "/v1/standby/{standby_id}/job", None),  # a standby driver's own token only
    ("POST", "/v1/standby/{standby_id}/done", None),  # the same
]


def test_protected_table_lists_every_v1_route(tmp_path):
    table = {(m, p) for m, p, _ in PROTECTED}
    v1_routes = [
        *routes.v1.routes,
        *goodput_routes.v1.routes,
        *token_routes.v1.routes,
        *standby_routes.v1.routes,
        *generate_routes.v1.routes,
    ]
    assert {(m, r.path) for r in v1_routes for m in r.methods - {"HEAD"}} == table
    app = create_app(dev_settings(tmp_path), backend=FakeBackend(), reconcile=False)
    documented = {
        (m.upper(), p)
        for p, ops in app.openapi()["paths"].items()
        if p.startswith("/v1")
        for m in ops
    }
    assert documented <= table


# Other malformed headers (wrong scheme, no scheme) are covered against authenticate() itself.
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer et_bogus-token"}], ids=["no-header", "bogus-token"]
)
@pytest.mark.parametrize(
    ("method", "path", "body"), PROTECTED, ids=[f"{m} {p}" for m, p, _ in PROTECTED]
)
def test_every_v1_route_needs_a_valid_token(shared, method, path, body, headers):
    client, job_id = shared
    before = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    r = client.request(
        method,
        path.format(job_id=job_id, token_id="k-000000000000", standby_id="abc"),
        json=body,
        headers=headers,
    )
    assert r.status_code == 401, r.text
    assert "token" in r.json()["detail"]
    assert total(client) == 1  # nothing was created or changed
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json() == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [p for p in PROTECTED if "telemetry" not in p[1] and "standby" not in p[1]],
    ids=[f"{m} {p}" for m, p, _ in PROTECTED if "telemetry" not in p and "standby" not in p],
)
def test_reporter_tokens_cannot_call_user_routes(shared, method, path, body):
    client, job_id = shared
    r = client.request(
        method,
        path.format(job_id=job_id, token_id="k-000000000000"),
        json=body,
        headers=reporter(client, job_id),
    )
    assert r.status_code == 403, r.text
    assert total(client) == 1
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["status"] == "QUEUED"
    assert stores(client).tokens.get_tenant_by_name("acme") is None


# -- tenants and tokens ------------------------------------------------------


def test_tenant_isolation(client):
    a, b = tenant_token(client, "tenant-a"), tenant_token(client, "tenant-b")
    job = submit(client, headers=a)
    job_id = job["id"]

    for suffix in ("", "/events", "/metrics", "/checkpoints", "/logs"):
        assert client.get(f"/v1/jobs/{job_id}{suffix}", headers=b).status_code == 404
        assert client.get(f"/v1/jobs/{job_id}{suffix}", headers=a).status_code == 200
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=b).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}", headers=a).json()["status"] == "QUEUED"

    b_list = client.get("/v1/jobs", headers=b).json()
    assert b_list == {"items": [], "total": 0}
    a_list = client.get("/v1/jobs", headers=a).json()
    assert [j["id"] for j in a_list["items"]] == [job_id]

    # The admin operates the service and sees every tenant's jobs.
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).status_code == 200
    assert job_id in {j["id"] for j in client.get("/v1/jobs", headers=ADMIN_H).json()["items"]}


def test_only_admins_create_tokens(client):
    user = tenant_token(client, "acme")
    r = client.post("/v1/tokens", json={"tenant": "evil"}, headers=user)
    assert r.status_code == 403
    assert stores(client).tokens.get_tenant_by_name("evil") is None


def test_created_token_is_shown_once_and_works(client):
    r = client.post("/v1/tokens", json={"tenant": "acme", "name": "laptop"}, headers=ADMIN_H)
    body = r.json()
    assert body["tenant"] == "acme" and body["name"] == "laptop"
    assert authenticate(stores(client).tokens, f"Bearer {body['token']}").role == "user"


@pytest.mark.parametrize(
    "body", [{}, {"tenant": ""}, {"tenant": "Has Spaces"}, {"tenant": "x" * 65}]
)
def test_token_request_is_validated(client, body):
    r = client.post("/v1/tokens", json=body, headers=ADMIN_H)
    assert r.status_code == 422
    assert any("tenant" in d["loc"] for d in r.json()["detail"])


# -- secrets ---------------------------------------------------------------------


def _exercise_every_route(client: TestClient, headers: dict) -> list[str]:
    """Call every route once (with a job that reached the cluster); return the bodies."""
    bodies = []

    def call(method: str, path: str, **kwargs):
        r = client.request(method, path, **kwargs)
        bodies.append(r.text)
        return r

    job = call("POST", "/v1/jobs", json=JOB, headers=headers).json()
    job_id = job["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    call(
        "POST",
        f"/v1/jobs/{job_id}/telemetry",
        headers=reporter(client, job_id),
        json={"metrics": [metric_point(1)], "events": [{"kind": "x", "message": "y"}]},
    )
    call("POST", "/v1/jobs", json={**JOB, "bogus": 1}, headers=headers)
    call("POST", "/v1/jobs", content=b"{", headers={**headers, "Content-Type": "application/json"})
    for path in (
        "/v1/jobs",
        f"/v1/jobs/{job_id}",
        f"/v1/jobs/{job_id}/logs",
        f"/v1/jobs/{job_id}/metrics",
        f"/v1/jobs/{job_id}/events",
        f"/v1/jobs/{job_id}/checkpoints",
        "/v1/cluster",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/jobs/j-nope",
    ):
        call("GET", path, headers=headers)
    call("GET", "/v1/jobs", headers={"Authorization": "Bearer wrong"})
    call("POST", "/v1/plan", json={"spec": JOB}, headers=headers)
    call("POST", "/v1/tokens", json={"tenant": "acme"}, headers=headers)
    call("POST", f"/v1/jobs/{job_id}/cancel", headers=headers)
    return bodies


def test_configured_admin_token_never_leaks(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with api_client(tmp_path) as c:
        bodies = _exercise_every_route(c, ADMIN_H)
    assert len(bodies) > 15
    assert not [b for b in bodies if ADMIN in b]
    assert ADMIN not in caplog.text


def test_generated_admin_token_never_leaks(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with api_client(tmp_path, admin_token=None) as c:
        token = (tmp_path / "admin_token").read_text().strip()
        assert c.app.state.runtime.admin_token_file == str(tmp_path / "admin_token")
        bodies = _exercise_every_route(c, auth(token))
    assert not [b for b in bodies if token in b]
    assert token not in caplog.text


def test_a_user_lists_and_revokes_only_its_own_tenants_tokens(client):
    team_a = tenant_token(client, "team-a")
    team_b = tenant_token(client, "team-b")
    listed = client.get("/v1/tokens", headers=team_a).json()["items"]
    assert {t["tenant"] for t in listed} == {"team-a"}
    everyone = client.get("/v1/tokens", headers=ADMIN_H).json()["items"]
    assert {t["tenant"] for t in everyone} == {"admin", "team-a", "team-b"}
    (b_token,) = [t["id"] for t in everyone if t["tenant"] == "team-b"]
    r = client.delete(f"/v1/tokens/{b_token}", headers=team_a)
    assert r.status_code == 404, r.text
    assert client.get("/v1/jobs", headers=team_b).status_code == 200
    assert client.post("/v1/tokens", json={"tenant": "team-a"}, headers=team_a).status_code == 403
    (a_token,) = [t["id"] for t in listed]
    assert client.delete(f"/v1/tokens/{a_token}", headers=team_a).status_code == 200
    assert client.get("/v1/jobs", headers=team_a).status_code == 401


def test_a_bad_token_request_names_the_field(client):
    r = client.post("/v1/tokens", json={"tenant": "Not A Name"}, headers=ADMIN_H)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "tenant"]
