"""The REST API through TestClient: auth, submit (JSON and YAML), 422s, tenants, cancel,
plan, cluster, probes, Prometheus, and telemetry from a job's reporter token."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import event

from service.api import goodput_routes, routes, standby_routes, token_routes
from service.api.app import create_app
from service.auth import authenticate, create_reporter_token
from service.errors import BackendUnavailable, Unauthorized
from service.settings import Settings
from service.status import JobStatus
from tests.support.fakes import FakeBackend

ADMIN = "et_admin-token-for-the-api-tests-0123456789"
SPEC = {"name": "tiny", "resources": {"workers": 2}, "train": {"steps": 5}}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ADMIN_H = _auth(ADMIN)


def _settings(tmp_path, **overrides) -> Settings:
    values = {
        "env": "development",
        "data_dir": tmp_path,
        "admin_token": ADMIN,
        "database_url": f"sqlite:///{tmp_path / 'etrain.db'}",
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def client(tmp_path, backend):
    app = create_app(_settings(tmp_path), backend=backend, reconcile=False)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[TestClient, str]:
    """One app and one QUEUED job for the read-only matrices (401s, 403s, 404s, 422s)."""
    data_dir = tmp_path_factory.mktemp("shared")
    app = create_app(_settings(data_dir), backend=FakeBackend(), reconcile=False)
    with TestClient(app) as test_client:
        yield test_client, _submit(test_client, name="shared")["id"]


def _stores(client: TestClient):
    return client.app.state.runtime.stores


def _submit(client: TestClient, headers=ADMIN_H, **overrides) -> dict:
    r = client.post("/v1/jobs", json={**SPEC, **overrides}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def _tenant_token(client: TestClient, tenant: str) -> dict[str, str]:
    r = client.post("/v1/tokens", json={"tenant": tenant, "name": "ci"}, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    return _auth(r.json()["token"])


def _reporter(client: TestClient, job_id: str) -> dict[str, str]:
    stores = _stores(client)
    job = stores.jobs.get_job(job_id)
    return _auth(create_reporter_token(stores.tokens, tenant_id=job.tenant_id, job_id=job_id))


def _make_pending(client: TestClient, job_id: str, submission_id: str | None = None) -> None:
    fields = {"submission_id": submission_id} if submission_id else {}
    assert _stores(client).jobs.update_job(job_id, status=JobStatus.PENDING, **fields) is not None


def _total(client: TestClient) -> int:
    r = client.get("/v1/jobs", headers=ADMIN_H)
    assert r.status_code == 200
    return r.json()["total"]


# -- authentication -----------------------------------------------------------

PROTECTED = [
    ("POST", "/v1/jobs", SPEC),
    ("GET", "/v1/jobs", None),
    ("GET", "/v1/jobs/{job_id}", None),
    ("POST", "/v1/jobs/{job_id}/cancel", None),
    ("GET", "/v1/jobs/{job_id}/logs", None),
    ("GET", "/v1/jobs/{job_id}/metrics", None),
    ("GET", "/v1/jobs/{job_id}/events", None),
    ("GET", "/v1/jobs/{job_id}/checkpoints", None),
    ("GET", "/v1/jobs/{job_id}/memory", None),
    ("GET", "/v1/jobs/{job_id}/goodput", None),
    ("POST", "/v1/jobs/{job_id}/telemetry", {"metrics": []}),
    ("POST", "/v1/plan", {"spec": SPEC}),
    ("GET", "/v1/cluster", None),
    ("POST", "/v1/tokens", {"tenant": "acme"}),
    ("GET", "/v1/tokens", None),
    ("DELETE", "/v1/tokens/{token_id}", None),
    ("GET", "/v1/standby/{standby_id}/job", None),  # a standby driver's own token only
]


def test_protected_table_lists_every_v1_route(tmp_path):
    table = {(m, p) for m, p, _ in PROTECTED}
    v1_routes = [
        *routes.v1.routes,
        *goodput_routes.v1.routes,
        *token_routes.v1.routes,
        *standby_routes.v1.routes,
    ]
    assert {(m, r.path) for r in v1_routes for m in r.methods - {"HEAD"}} == table
    app = create_app(_settings(tmp_path), backend=FakeBackend(), reconcile=False)
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
    assert _total(client) == 1  # nothing was created or changed
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
        headers=_reporter(client, job_id),
    )
    assert r.status_code == 403, r.text
    assert _total(client) == 1
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["status"] == "QUEUED"
    assert _stores(client).tokens.get_tenant_by_name("acme") is None


# -- submit ---------------------------------------------------------------------


def test_submit_json_is_queued_with_default_checkpoint_storage(client, tmp_path):
    job = _submit(client)
    assert job["status"] == "QUEUED"
    assert job["id"].startswith("j-") and job["name"] == "tiny"
    assert job["spec"]["checkpoint"]["storage"] == f"file://{tmp_path / 'checkpoints' / 'admin'}"
    assert job["spec"]["train"]["steps"] == 5
    assert job["restarts"] == 0 and job["step"] == 0 and job["metrics"] is None
    assert "tenant_id" not in job
    r = client.get(f"/v1/jobs/{job['id']}", headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["id"] == job["id"]
    assert r.json()["spec"] == job["spec"]


@pytest.mark.parametrize(
    "content_type",
    ["application/yaml", "application/x-yaml", "text/yaml", "application/yaml; charset=utf-8"],
)
def test_submit_yaml(client, tmp_path, content_type):
    body = yaml.safe_dump({**SPEC, "checkpoint": {"async": False, "every_steps": 2}})
    r = client.post(
        "/v1/jobs", content=body.encode(), headers={**ADMIN_H, "Content-Type": content_type}
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "QUEUED"
    assert job["spec"]["checkpoint"]["every_steps"] == 2
    assert job["spec"]["checkpoint"]["storage"] == f"file://{tmp_path / 'checkpoints' / 'admin'}"


def test_submit_keeps_an_explicit_checkpoint_storage(client):
    job = _submit(client, checkpoint={"storage": "file:///mnt/ckpt"})
    assert job["spec"]["checkpoint"]["storage"] == "file:///mnt/ckpt"


def test_stored_spec_is_json_with_the_async_alias(client):
    job = _submit(client)
    assert "async" in job["spec"]["checkpoint"] and "async_" not in job["spec"]["checkpoint"]


JSON = "application/json"
YAML = "application/yaml"
# Pydantic's wording today; a message that also lists the accepted fields is welcome too.
UNKNOWN = ("not permitted", "unknown field")
# (body, content type, loc prefix the error must carry, text(s) its msg must carry)
BAD_SUBMITS = {
    "malformed-json": (b'{"name": "tiny",', JSON, ["body"], "application/json"),
    "empty-json": (b"", JSON, ["body"], "malformed"),
    "json-array": (b"[]", JSON, ["body"], "object"),
    "malformed-yaml": (b"name: [tiny\n", YAML, ["body"], "yaml"),
    "yaml-scalar": (b"just a string\n", YAML, ["body"], "object"),
    "missing-name": ({"resources": {"workers": 2}}, JSON, ["body", "name"], "required"),
    "unknown-top-field": ({**SPEC, "priority": 5}, JSON, ["body", "priority"], UNKNOWN),
    "unknown-nested-field": (
        {**SPEC, "train": {"micro_batch": 4}},
        JSON,
        ["body", "train", "micro_batch"],
        UNKNOWN,
    ),
    "unknown-yaml-field": (
        b"name: tiny\ncheckpoint:\n  intervals: auto\n",
        YAML,
        ["body", "checkpoint", "intervals"],
        UNKNOWN,
    ),
    "bad-name": ({**SPEC, "name": "My_Job"}, JSON, ["body", "name"], "lowercase"),
    "long-name": ({**SPEC, "name": "a" * 48}, JSON, ["body", "name"], "47"),
    "seq-len-too-small": (
        {**SPEC, "data": {"seq_len": 4}},
        JSON,
        ["body", "data", "seq_len"],
        "greater than or equal to 8",
    ),
    "wrong-type": (
        {**SPEC, "train": {"steps": "many"}},
        JSON,
        ["body", "train", "steps"],
        "integer",
    ),
    "unknown-preset": (
        {**SPEC, "model": {"preset": "gpt-huge"}},
        JSON,
        ["body", "model", "preset"],
        "gpt-tiny",
    ),
    "storage-scheme": (
        {**SPEC, "checkpoint": {"storage": "ftp://b/p"}},
        JSON,
        ["body", "checkpoint", "storage"],
        "file://",
    ),
    "text-without-path": (
        {**SPEC, "data": {"source": "text"}},
        JSON,
        ["body", "data"],
        "data.path",
    ),
    "min-above-max": (
        {**SPEC, "resources": {"workers": {"min": 3, "max": 2}}},
        JSON,
        ["body", "resources", "workers"],
        "resources.workers.min",
    ),
    "batch-vs-dp": (
        {**SPEC, "resources": {"workers": 3}},
        JSON,
        ["body"],
        "train.global_batch_size",
    ),
    "warmup": (
        {**SPEC, "train": {"steps": 5, "warmup_steps": 5}},
        JSON,
        ["body", "train"],
        "train.warmup_steps",
    ),
    "ddp-with-tp": (
        {**SPEC, "parallelism": {"tp": 2}},
        JSON,
        ["body", "parallelism"],
        "parallelism.tp",
    ),
    # Valid specs whose plan has errors: refused before anything is stored.
    "tp-spans-nodes": (
        {
            **SPEC,
            "parallelism": {"strategy": "tp", "tp": 2},
            "resources": {"workers": 2, "cpus_per_worker": 2},
        },
        JSON,
        ["body"],
        "parallelism.tp",
    ),
    "keep-every-off-interval": (
        {**SPEC, "checkpoint": {"every_steps": 10, "keep_every": 15}},
        JSON,
        ["body", "checkpoint"],
        "checkpoint.keep_every",
    ),
}


@pytest.mark.parametrize(
    ("body", "content_type", "loc", "msg"), list(BAD_SUBMITS.values()), ids=list(BAD_SUBMITS)
)
def test_bad_submit_is_422_with_field_errors_and_stores_nothing(
    shared, body, content_type, loc, msg
):
    client, _ = shared
    if isinstance(body, dict):
        r = client.post("/v1/jobs", json=body, headers=ADMIN_H)
    else:
        r = client.post("/v1/jobs", content=body, headers={**ADMIN_H, "Content-Type": content_type})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail
    texts = (msg,) if isinstance(msg, str) else msg
    assert any(
        d["loc"][: len(loc)] == loc and any(t.lower() in d["msg"].lower() for t in texts)
        for d in detail
    ), detail
    assert _total(client) == 1
    assert _stores(client).jobs.count_jobs() == 1


def test_seq_len_beyond_the_model_is_refused(client):
    r = client.post("/v1/jobs", json={**SPEC, "data": {"seq_len": 2048}}, headers=ADMIN_H)
    assert r.status_code == 422
    assert "seq_len" in r.text


def test_unknown_field_error_lists_the_accepted_fields(client):
    r = client.post("/v1/jobs", json={**SPEC, "train": {"micro_batch": 4}}, headers=ADMIN_H)
    assert r.status_code == 422
    assert "micro_batch_size" in r.json()["detail"][0]["msg"]


def test_worker_range_error_is_one_clean_item(client):
    r = client.post(
        "/v1/jobs", json={**SPEC, "resources": {"workers": {"min": 3, "max": 2}}}, headers=ADMIN_H
    )
    detail = r.json()["detail"]
    assert len(detail) == 1
    assert not any("[" in str(part) for part in detail[0]["loc"])


# -- reading, listing, tenants ------------------------------------------------


@pytest.mark.parametrize(
    "suffix", ["", "/cancel", "/logs", "/metrics", "/events", "/checkpoints", "/memory"]
)
def test_unknown_job_is_404(shared, suffix):
    client, _ = shared
    method = "POST" if suffix == "/cancel" else "GET"
    r = client.request(method, f"/v1/jobs/j-000000000000{suffix}", headers=ADMIN_H)
    assert r.status_code == 404
    assert "j-000000000000" in r.json()["detail"]


def test_list_filters_by_status_and_paginates(client):
    ids = [_submit(client, name=f"job-{i}")["id"] for i in range(3)]
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=ADMIN_H)
    page = client.get("/v1/jobs", params={"limit": 2}, headers=ADMIN_H).json()
    assert page["total"] == 3 and len(page["items"]) == 2
    rest = client.get("/v1/jobs", params={"limit": 2, "offset": 2}, headers=ADMIN_H).json()
    assert len(rest["items"]) == 1
    assert {j["id"] for j in page["items"] + rest["items"]} == set(ids)
    queued = client.get("/v1/jobs", params={"status": "QUEUED"}, headers=ADMIN_H).json()
    assert queued["total"] == 2 and ids[0] not in {j["id"] for j in queued["items"]}
    assert client.get("/v1/jobs", params={"status": "BOGUS"}, headers=ADMIN_H).status_code == 422
    assert client.get("/v1/jobs", params={"limit": 0}, headers=ADMIN_H).status_code == 422


def test_tenant_isolation(client):
    a, b = _tenant_token(client, "tenant-a"), _tenant_token(client, "tenant-b")
    job = _submit(client, headers=a)
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
    user = _tenant_token(client, "acme")
    r = client.post("/v1/tokens", json={"tenant": "evil"}, headers=user)
    assert r.status_code == 403
    assert _stores(client).tokens.get_tenant_by_name("evil") is None


def test_created_token_is_shown_once_and_works(client):
    r = client.post("/v1/tokens", json={"tenant": "acme", "name": "laptop"}, headers=ADMIN_H)
    body = r.json()
    assert body["tenant"] == "acme" and body["name"] == "laptop"
    assert authenticate(_stores(client).tokens, f"Bearer {body['token']}").role == "user"


@pytest.mark.parametrize(
    "body", [{}, {"tenant": ""}, {"tenant": "Has Spaces"}, {"tenant": "x" * 65}]
)
def test_token_request_is_validated(client, body):
    r = client.post("/v1/tokens", json=body, headers=ADMIN_H)
    assert r.status_code == 422
    assert any("tenant" in d["loc"] for d in r.json()["detail"])


# -- cancel --------------------------------------------------------------------


def test_cancel_queued_job_is_idempotent(client, backend):
    job_id = _submit(client)["id"]
    first = client.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN_H)
    assert first.status_code == 200
    assert first.json()["status"] == "CANCELLED" and first.json()["finished_at"]
    second = client.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN_H)
    assert second.status_code == 200
    assert second.json()["status"] == "CANCELLED"
    assert second.json()["finished_at"] == first.json()["finished_at"]
    assert backend.stopped == []  # never reached the cluster
    kinds = [
        e["kind"] for e in client.get(f"/v1/jobs/{job_id}/events", headers=ADMIN_H).json()["items"]
    ]
    assert kinds.count("cancelled") == 1


def test_cancel_pending_job_stops_its_submission_and_revokes_reporters(client, backend):
    job_id = _submit(client)["id"]
    reporter = _reporter(client, job_id)
    _make_pending(client, job_id, submission_id=f"etrain-{job_id}-0")
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert backend.stopped == [f"etrain-{job_id}-0"]
    with pytest.raises(Unauthorized):
        authenticate(_stores(client).tokens, reporter["Authorization"])
    r = client.post(f"/v1/jobs/{job_id}/telemetry", json={"metrics": []}, headers=reporter)
    assert r.status_code == 401


def test_cancel_finished_job_changes_nothing(client, backend):
    job_id = _submit(client)["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    _stores(client).jobs.update_job(job_id, status=JobStatus.SUCCEEDED)
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["status"] == "SUCCEEDED"
    assert backend.stopped == []


# -- logs, plan, cluster, probes, prometheus ----------------------------------


def test_logs_before_and_after_submission(client, backend):
    job_id = _submit(client)["id"]
    assert client.get(f"/v1/jobs/{job_id}/logs", headers=ADMIN_H).text == ""
    _make_pending(client, job_id, submission_id="etrain-x-0")
    backend.log_text["etrain-x-0"] = "step 1 loss 5.5\nstep 2 loss 5.1\n"
    r = client.get(f"/v1/jobs/{job_id}/logs", headers=ADMIN_H)
    assert r.status_code == 200 and r.text == "step 1 loss 5.5\nstep 2 loss 5.1\n"
    followed = client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=ADMIN_H)
    assert followed.status_code == 200 and followed.text == r.text


def test_plan_returns_the_documented_keys(client):
    r = client.post("/v1/plan", json={"spec": SPEC}, headers=ADMIN_H)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert {
        "fits",
        "num_params",
        "per_rank",
        "layout",
        "warnings",
        "errors",
        "recommendation",
    } <= set(plan)
    assert set(plan["per_rank"]) >= {
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "buffers_bytes",
        "total_bytes",
    }
    assert plan["fits"] is True and plan["errors"] == [] and plan["num_params"] > 0
    assert plan["layout"]["strategy"] == "ddp"
    assert _total(client) == 0  # a dry run stores nothing


def test_plan_yaml_with_a_cluster_that_does_not_fit(client):
    body = yaml.safe_dump(
        {
            "spec": {**SPEC, "resources": {"workers": 2, "gpus_per_worker": 1}},
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu_memory_gb": 0.001},
        }
    )
    r = client.post("/v1/plan", content=body, headers={**ADMIN_H, "Content-Type": YAML})
    assert r.status_code == 200, r.text
    assert r.json()["fits"] is False and r.json()["errors"]


def test_plan_defaults_to_the_connected_cluster_and_keeps_tp_inside_a_node(client):
    """The fake cluster is one node of 2 CPUs: a TP group of 2 x 2 CPUs cannot fit in it."""
    spec = {
        **SPEC,
        "parallelism": {"strategy": "tp", "tp": 2},
        "resources": {"workers": 2, "cpus_per_worker": 2},
    }
    r = client.post("/v1/plan", json={"spec": spec}, headers=ADMIN_H)
    assert r.status_code == 200
    assert r.json()["fits"] is False
    assert any("parallelism.tp (2)" in e and "<= 1" in e for e in r.json()["errors"])
    spec["resources"]["cpus_per_worker"] = 1
    assert client.post("/v1/plan", json={"spec": spec}, headers=ADMIN_H).json()["fits"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, ["body", "spec"]),
        ({"spec": {**SPEC, "bogus": 1}}, ["body", "bogus"]),
        ({"spec": "name: tiny"}, ["body"]),
    ],
)
def test_plan_rejects_bad_requests(client, body, loc):
    r = client.post("/v1/plan", json=body, headers=ADMIN_H)
    assert r.status_code == 422
    assert any(d["loc"] == loc for d in r.json()["detail"]), r.json()


def test_plan_rejects_a_malformed_cluster(tmp_path):
    app = create_app(_settings(tmp_path), backend=FakeBackend(), reconcile=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post(
            "/v1/plan",
            headers=ADMIN_H,
            json={
                "spec": {**SPEC, "resources": {"workers": 2, "gpus_per_worker": 1}},
                "cluster": {"gpu_memory_gb": ""},
            },
        )
    assert r.status_code == 422


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
    _submit(client, name="a")
    cancelled = _submit(client, name="b")["id"]
    client.post(f"/v1/jobs/{cancelled}/cancel", headers=ADMIN_H)
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert 'etrain_jobs{status="QUEUED"} 1.0' in lines
    assert 'etrain_jobs{status="CANCELLED"} 1.0' in lines
    assert 'etrain_jobs{status="RUNNING"} 0.0' in lines
    assert any(line.startswith("etrain_jobs_submitted_total") for line in lines)


# -- telemetry -------------------------------------------------------------------


def _point(step: int, **extra) -> dict:
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


def test_telemetry_needs_the_jobs_own_reporter_token(client):
    job_id = _submit(client)["id"]
    other_id = _submit(client, name="other")["id"]
    batch = {"metrics": [_point(1)]}
    assert (
        client.post(f"/v1/jobs/{job_id}/telemetry", json=batch, headers=ADMIN_H).status_code == 403
    )
    user = _tenant_token(client, "acme")
    assert client.post(f"/v1/jobs/{job_id}/telemetry", json=batch, headers=user).status_code == 403
    assert (
        client.post(
            f"/v1/jobs/{job_id}/telemetry", json=batch, headers=_reporter(client, other_id)
        ).status_code
        == 403
    )
    assert client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"] == []


def test_telemetry_metrics_move_a_pending_job_to_running(client):
    job_id = _submit(client)["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    reporter = _reporter(client, job_id)
    r = client.post(
        f"/v1/jobs/{job_id}/telemetry",
        headers=reporter,
        json={"metrics": [_point(1), _point(2, step_time_s=0.5)]},
    )
    assert r.status_code == 200 and r.json() == {"accepted": 2}

    items = client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"]
    assert [p["step"] for p in items] == [1, 2]
    assert items[1]["loss"] == pytest.approx(4.8) and items[1]["step_time_s"] == 0.5
    after = client.get(
        f"/v1/jobs/{job_id}/metrics", params={"after_step": 1}, headers=ADMIN_H
    ).json()["items"]
    assert [p["step"] for p in after] == [2]

    job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["status"] == "RUNNING" and job["started_at"]
    assert job["step"] == 2 and job["world_size"] == 2
    assert job["metrics"]["loss"] == pytest.approx(4.8)


def test_telemetry_events_dedupe_and_worker_failures_count_restarts(client):
    job_id = _submit(client)["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    reporter = _reporter(client, job_id)
    saved = {
        "kind": "checkpoint_saved",
        "message": "checkpoint saved at step 2",
        "data": {"step": 2},
        "dedup_key": "ckpt:2",
    }
    failed = {
        "kind": "worker_failed",
        "message": "worker(s) [1] failed: killed",
        "dedup_key": "fail:1",
    }
    for _ in range(2):  # a retried batch must not double-count
        r = client.post(
            f"/v1/jobs/{job_id}/telemetry", headers=reporter, json={"events": [saved, failed]}
        )
        assert r.status_code == 200
    events = client.get(f"/v1/jobs/{job_id}/events", headers=ADMIN_H).json()["items"]
    assert [e["kind"] for e in events].count("checkpoint_saved") == 1
    assert [e["kind"] for e in events].count("worker_failed") == 1
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["restarts"] == 1

    second = {**failed, "dedup_key": "fail:2"}
    client.post(f"/v1/jobs/{job_id}/telemetry", headers=reporter, json={"events": [second]})
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["restarts"] == 2


def test_telemetry_checkpoints_are_listed(client):
    job_id = _submit(client)["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    reporter = _reporter(client, job_id)
    ckpts = [
        {
            "step": s,
            "uri": f"file:///ckpt/{job_id}/step-{s}",
            "bytes": 1000 * s,
            "save_s": 0.25,
            "blocking_s": 0.05,
        }
        for s in (2, 4)
    ]
    r = client.post(f"/v1/jobs/{job_id}/telemetry", headers=reporter, json={"checkpoints": ckpts})
    assert r.status_code == 200 and r.json() == {"accepted": 0}
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [(c["step"], c["uri"], c["bytes"]) for c in items] == [
        (2, f"file:///ckpt/{job_id}/step-2", 2000),
        (4, f"file:///ckpt/{job_id}/step-4", 4000),
    ]
    # Telemetry with only checkpoints does not claim the job is training.
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["status"] == "PENDING"


def test_checkpoint_list_follows_what_the_cluster_deleted(client):
    """The workers' retention deletes old folders and says so with the next commit; the
    list follows what they report, not a rule the service applies on its own."""
    job_id = _submit(client, checkpoint={"keep_last": 2})["id"]
    reporter = _reporter(client, job_id)
    deleted = {10: [], 20: [], 30: [10], 40: [20]}
    for step in (10, 20, 30, 40):
        ck = {
            "step": step,
            "uri": f"file:///c/{step}",
            "bytes": 1,
            "save_s": 0.1,
            "deleted_steps": deleted[step],
        }
        assert (
            client.post(
                f"/v1/jobs/{job_id}/telemetry", headers=reporter, json={"checkpoints": [ck]}
            ).status_code
            == 200
        )
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [c["step"] for c in items] == [30, 40]
    # A milestone the cluster kept (checkpoint.keep_every) stays listed: nothing guesses.
    ck = {"step": 50, "uri": "file:///c/50", "bytes": 1, "save_s": 0.1, "deleted_steps": [40]}
    client.post(f"/v1/jobs/{job_id}/telemetry", headers=reporter, json={"checkpoints": [ck]})
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [c["step"] for c in items] == [30, 50]


def test_telemetry_for_a_finished_job_is_ignored(client):
    job_id = _submit(client)["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    reporter = _reporter(client, job_id)
    _stores(client).jobs.update_job(job_id, status=JobStatus.FAILED)
    r = client.post(f"/v1/jobs/{job_id}/telemetry", headers=reporter, json={"metrics": [_point(1)]})
    assert r.status_code == 200 and r.json() == {"accepted": 0}
    job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["status"] == "FAILED" and job["step"] == 0


def test_malformed_telemetry_is_422(tmp_path):
    app = create_app(_settings(tmp_path), backend=FakeBackend(), reconcile=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        job_id = _submit(c)["id"]
        r = c.post(f"/v1/jobs/{job_id}/telemetry", json=[_point(1)], headers=_reporter(c, job_id))
    assert r.status_code == 422


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

    event.listen(_stores(client).db._engine, "before_cursor_execute", seen)
    job_id = _submit(client)["id"]
    calls = [
        ("POST", "/v1/jobs", SPEC, ADMIN_H),
        ("POST", "/v1/plan", {"spec": SPEC}, ADMIN_H),
        ("POST", "/v1/tokens", {"tenant": "acme", "name": "ci"}, ADMIN_H),
        (
            "POST",
            f"/v1/jobs/{job_id}/telemetry",
            {"events": [{"kind": "started", "message": "up", "ts": 1.0}]},
            _reporter(client, job_id),
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
        assert queries, f"{method} {path} made no query: the check sees nothing"
        on_loop = [q for loop, q in queries if loop]
        assert not on_loop, f"{method} {path} queried on the event loop: {on_loop}"


# -- secrets ---------------------------------------------------------------------


def _exercise_every_route(client: TestClient, headers: dict) -> list[str]:
    """Call every route once (with a job that reached the cluster); return the bodies."""
    bodies = []

    def call(method: str, path: str, **kwargs):
        r = client.request(method, path, **kwargs)
        bodies.append(r.text)
        return r

    job = call("POST", "/v1/jobs", json=SPEC, headers=headers).json()
    job_id = job["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    call(
        "POST",
        f"/v1/jobs/{job_id}/telemetry",
        headers=_reporter(client, job_id),
        json={"metrics": [_point(1)], "events": [{"kind": "x", "message": "y"}]},
    )
    call("POST", "/v1/jobs", json={**SPEC, "bogus": 1}, headers=headers)
    call("POST", "/v1/jobs", content=b"{", headers={**headers, "Content-Type": JSON})
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
    call("POST", "/v1/plan", json={"spec": SPEC}, headers=headers)
    call("POST", "/v1/tokens", json={"tenant": "acme"}, headers=headers)
    call("POST", f"/v1/jobs/{job_id}/cancel", headers=headers)
    return bodies


def test_configured_admin_token_never_leaks(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    app = create_app(_settings(tmp_path), backend=FakeBackend(), reconcile=False)
    with TestClient(app) as c:
        bodies = _exercise_every_route(c, ADMIN_H)
    assert len(bodies) > 15
    assert not [b for b in bodies if ADMIN in b]
    assert ADMIN not in caplog.text


def test_generated_admin_token_never_leaks(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    app = create_app(_settings(tmp_path, admin_token=None), backend=FakeBackend(), reconcile=False)
    with TestClient(app) as c:
        token = (tmp_path / "admin_token").read_text().strip()
        assert c.app.state.runtime.admin_token_file == str(tmp_path / "admin_token")
        bodies = _exercise_every_route(c, _auth(token))
    assert not [b for b in bodies if token in b]
    assert token not in caplog.text


def test_memory_endpoint_returns_the_newest_per_rank_report(client):
    job_id = _submit(client)["id"]
    assert client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H).json()["ranks"] == []
    for gen in (1, 2):
        ranks = [
            {
                "params_bytes": 100 * gen + r,
                "grads_bytes": 1,
                "optimizer_bytes": 2,
                "activations_bytes": 3,
                "peak_bytes": 106,
            }
            for r in range(2)
        ]
        r = client.post(
            f"/v1/jobs/{job_id}/telemetry",
            headers=_reporter(client, job_id),
            json={
                "events": [
                    {
                        "kind": "memory",
                        "message": "m",
                        "data": {"ranks": ranks},
                        "dedup_key": f"m{gen}",
                    }
                ]
            },
        )
        assert r.status_code == 200
    got = client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H).json()
    assert [rk["params_bytes"] for rk in got["ranks"]] == [200, 201]
    assert got["measured_at"] is not None


def test_stored_points_keep_the_fields_the_workers_sent(client):
    """Typed on the wire, but a point is stored as sent: no null stand-ins for fields a
    worker did not report, and a newer worker's extra metric is kept."""
    job_id = _submit(client)["id"]
    _make_pending(client, job_id, submission_id="etrain-x-0")
    point = _point(1, mfu=0.41)
    r = client.post(
        f"/v1/jobs/{job_id}/telemetry", headers=_reporter(client, job_id), json={"metrics": [point]}
    )
    assert r.status_code == 200
    (stored,) = client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"]
    assert set(stored) == set(point) and stored["mfu"] == 0.41


def test_a_user_lists_and_revokes_only_its_own_tenants_tokens(client):
    team_a = _tenant_token(client, "team-a")
    team_b = _tenant_token(client, "team-b")
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
