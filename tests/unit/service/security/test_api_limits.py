"""Request limits, metrics exposure and the token lifecycle, as a table of attacks.

Each case is one thing an attacker or a careless client did that the API
answered with a 500, accepted, or leaked; each must now be a 4xx (or hidden),
answered before the body is read where it matters.
"""

from __future__ import annotations

import contextlib
import json
import stat
import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.auth import create_user_token, hash_token
from service.settings import Settings
from service.store import Stores, TokenStore, migrate
from tests.support.api import api_client, submit, tenant_token
from tests.support.fakes import ADMIN, ADMIN_H, FakeBackend, dev_settings
from tests.support.specs import JOB

SPEC = JOB
DEEP_JSON = "[" * 10_000 + "]" * 10_000
DEEP_YAML = "a: " + "[" * 10_000 + "]" * 10_000
# Nine levels of nine-fold aliases: 387 million values once expanded.
LAUGHS = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)


@pytest.fixture
def api(tmp_path):
    with api_client(tmp_path, raise_server_exceptions=False) as client:
        yield client


def _job(api: TestClient) -> str:
    return submit(api, base=SPEC)["id"]


def _post(path: str, body: str | bytes, content_type: str, headers=ADMIN_H) -> Callable:
    def send(api: TestClient):
        return api.post(path, content=body, headers={**headers, "Content-Type": content_type})

    return send


def _get_job(path: str) -> Callable:
    return lambda api: api.get(path.format(job=_job(api)), headers=ADMIN_H)


def _plan_cluster(**cluster) -> Callable:
    body = {"spec": SPEC, "cluster": cluster}
    return lambda api: api.post("/v1/plan", json=body, headers=ADMIN_H)


def _submit(**resources) -> Callable:
    body = {**SPEC, "resources": resources}
    return lambda api: api.post("/v1/jobs", json=body, headers=ADMIN_H)


def _area(api: TestClient):
    """The admin tenant's data area under the app's data dir (created)."""
    area = api.app.state.runtime.submission.policy.data_root / "admin"
    area.mkdir(parents=True, exist_ok=True)
    return area


def _submit_sections(**sections) -> Callable:
    """Submit SPEC with ``sections``; a value may be a callable of the data area."""

    def send(api: TestClient):
        area = _area(api)
        body = {**SPEC, "resources": {"workers": 1}}
        body["train"] = {"steps": 2, "global_batch_size": 4, "micro_batch_size": 4}
        for name, section in sections.items():
            body[name] = {k: v(area) if callable(v) else v for k, v in section.items()}
        return api.post("/v1/jobs", json=body, headers=ADMIN_H)

    return send


def _file(name: str, content: bytes) -> Callable:
    """A data-area file written when the request is built; its path."""

    def write(area) -> str:
        (area / name).write_bytes(content)
        return str(area / name)

    return write


def _parquet_bomb(column: str) -> bytes:
    """4,096 rows of one 64 KiB string in a few hundred bytes (256 MiB decoded)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    values = pa.DictionaryArray.from_arrays(
        pa.array([0] * 4096, pa.int32()), pa.array(["a" * 65536])
    )
    out = io.BytesIO()
    pq.write_table(pa.table({column: values}), out, compression="zstd", store_schema=False)
    return out.getvalue()


def _plan_hf(**config) -> Callable:
    """POST /v1/plan of a pipeline job on a model.hf folder whose config.json has ``config``."""

    def send(api: TestClient):
        from tests.support.hf_fixtures import hf_config

        folder = _area(api) / "model"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(hf_config().to_dict() | config))
        (folder / "model.safetensors").write_bytes(b"")
        spec = {
            "name": "pp",
            "model": {"hf": str(folder)},
            "resources": {"workers": 2},
            "parallelism": {"strategy": "pp", "pp": 2},
            "train": {"steps": 2, "global_batch_size": 8, "micro_batch_size": 2},
        }
        return api.post("/v1/plan", json={"spec": spec}, headers=ADMIN_H)

    return send


def _telemetry(body: str) -> Callable:
    def send(api: TestClient):
        job = _job(api)
        path = f"/v1/jobs/{job}/telemetry"
        return api.post(path, content=body, headers={**ADMIN_H, "Content-Type": "application/json"})

    return send


# id -> (request, expected status, text the answer must contain)
CASES = {
    "item09-deep-json-jobs": (_post("/v1/jobs", DEEP_JSON, "application/json"), 422, "nested"),
    "item09-deep-yaml-jobs": (_post("/v1/jobs", DEEP_YAML, "application/yaml"), 422, "nested"),
    "item09-deep-json-plan": (_post("/v1/plan", DEEP_JSON, "application/json"), 422, "nested"),
    "item09-deep-yaml-plan": (_post("/v1/plan", DEEP_YAML, "application/yaml"), 422, "nested"),
    "item09-deep-json-telemetry": (_telemetry(DEEP_JSON), 422, "nested"),
    "item09-yaml-alias-bomb": (
        _post("/v1/jobs", LAUGHS, "application/yaml"),
        422,
        "values once its aliases are expanded",
    ),
    "item09-plan-gpu-memory-1e308": (_plan_cluster(gpu_memory_gb=1e308), 422, "gpu_memory_gb"),
    "item09-plan-host-memory-1e308": (
        _plan_cluster(host_memory_gb=1e308),
        422,
        "host_memory_gb",
    ),
    "item09-after-step-1e20": (
        _get_job("/v1/jobs/{job}/metrics?after_step=" + "1" + "0" * 20),
        422,
        "after_step",
    ),
    "item09-after-id-1e20": (
        _get_job("/v1/jobs/{job}/events?after_id=" + "1" + "0" * 20),
        422,
        "after_id",
    ),
    "item09-offset-1e20": (_get_job("/v1/jobs?offset=1" + "0" * 20), 422, "offset"),
    "item10-text-plain-body": (
        _post("/v1/jobs", json.dumps(SPEC), "text/plain"),
        415,
        "Content-Type",
    ),
    "item10-form-body": (
        _post("/v1/tokens", '{"tenant": "x"}', "application/x-www-form-urlencoded"),
        415,
        "application/json",
    ),
    "item10-json-utf16": (
        _post("/v1/jobs", json.dumps(SPEC).encode("utf-16"), "application/json; charset=utf-16"),
        415,
        "utf-8",
    ),
    "item11-cpus-per-worker-1e-300": (
        _submit(workers=2, cpus_per_worker=1e-300),
        422,
        "cpus_per_worker",
    ),
    "item13-workers-3e7": (_submit(workers=30_000_000), 422, "workers"),
    "item13-elastic-max-3e7": (_submit(workers={"min": 1, "max": 30_000_000}), 422, "workers"),
    "item13-body-before-auth": (
        _post("/v1/tokens", "not json at all", "application/json", headers={}),
        401,
        "bearer",
    ),
    "item13-oversized-body-413": (
        _post("/v1/tokens", b" " * (1024 * 1024 + 1), "application/json", headers={}),
        413,
        "ETRAIN_MAX_BODY_BYTES",
    ),
    "item13-token-list": (lambda api: api.get("/v1/tokens", headers=ADMIN_H), 200, '"role"'),
    # A user token of the admin's own tenant would list and revoke the admin token.
    "reserved-tenant-admin": (
        _post("/v1/tokens", '{"tenant": "admin"}', "application/json"),
        422,
        "tenant 'admin' is reserved",
    ),
    # A NUL (or any control character) in a path reached os.path.realpath: a 500.
    "nul-in-data-path": (
        _submit_sections(data={"source": "jsonl", "path": lambda a: f"{a}/rows\x00.jsonl"}),
        422,
        "data.path must not contain control characters",
    ),
    "nul-in-model-hf": (
        _submit_sections(model={"hf": lambda a: f"{a}/model\x00"}),
        422,
        "model.hf must not contain control characters",
    ),
    "newline-in-model-tokenizer": (
        _submit_sections(model={"tokenizer": lambda a: f"{a}/tok\n"}),
        422,
        "model.tokenizer must not contain control characters",
    ),
    "nul-in-checkpoint-storage": (
        _submit_sections(checkpoint={"storage": lambda a: f"file://{a}/ckpt\x00"}),
        422,
        "checkpoint.storage must not contain control characters",
    ),
    "tab-in-s3-endpoint": (
        _submit_sections(
            checkpoint={"storage": "s3://bucket/x"},
            stores={"s3": {"endpoint_url": "http://minio\t:9000"}},
        ),
        422,
        "stores.s3.endpoint_url must not contain control characters",
    ),
    # json.loads of the first line raised RecursionError at submit: a 500.
    "deep-jsonl-first-line": (
        _submit_sections(
            data={"source": "jsonl", "path": _file("deep.jsonl", b"[" * 200_000 + b"\n")}
        ),
        422,
        "line 1: JSON nested too deeply",
    ),
    # The check decoded a whole 4,096-row batch of it (+550 MiB a request); the footer
    # now names the missing column (tests/unit/workers/data/test_parquet_head.py measures).
    "parquet-bomb-without-the-column": (
        _submit_sections(
            model={"tokenizer": "/tokenizer"},
            data={"source": "parquet", "path": _file("bomb.parquet", _parquet_bomb("body"))},
        ),
        422,
        "no column 'text' (columns: body); set data.text_field",
    ),
    # The planner balanced a million layers over the stages: 5.9 s a request.
    "config-json-million-layers": (
        _plan_hf(num_hidden_layers=1_000_000),
        422,
        "model.hf: config.json num_hidden_layers must be an integer from 1 to 1,024",
    ),
    "config-json-huge-vocab": (
        _plan_hf(vocab_size=10**15),
        422,
        "config.json vocab_size must be an integer from 1 to 4,194,304",
    ),
}


@pytest.mark.parametrize(("request_of", "status", "text"), CASES.values(), ids=CASES.keys())
def test_bad_request_is_a_4xx_naming_the_cause(api, request_of, status, text):
    r = request_of(api)
    assert r.status_code == status, r.text[:500]
    assert text.lower() in r.text.lower()


def test_item13_chunked_body_is_cut_at_the_limit(tmp_path):
    """A body without Content-Length: the app answers 413 and stops reading at the cap."""
    settings = dev_settings(tmp_path, max_body_bytes=4096)
    received, answer = [], {}
    headers = [(b"authorization", ADMIN_H["Authorization"].encode())]
    headers.append((b"content-type", b"application/json"))
    scope = {"type": "http", "method": "POST", "path": "/v1/jobs", "headers": headers}
    scope |= {"query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": ""}
    scope |= {"server": ("testserver", 80), "client": ("testclient", 5000)}

    async def receive():
        received.append(1)  # 1000 chunks of 1 KiB are on offer
        return {"type": "http.request", "body": b" " * 1024, "more_body": len(received) < 1000}

    async def send(message):
        answer.setdefault("status", message.get("status"))

    with TestClient(create_app(settings, backend=FakeBackend(), reconcile=False)) as api:
        api.portal.call(api.app, {**scope, "app": api.app, "state": {}}, receive, send)
    assert answer["status"] == 413
    assert len(received) <= 5  # refused at the first chunk past 4 KiB


def test_item12_metrics_hide_job_ids_unless_an_admin_scrapes(api):
    job = _job(api)
    point = {"step": 1, "world_size": 2, "loss": 2.5}
    api.app.state.runtime.ingest.ingest(_reporter(api, job), job, {"metrics": [point]})
    anonymous = api.get("/metrics")
    assert anonymous.status_code == 200
    assert "etrain_jobs" in anonymous.text
    assert job not in anonymous.text and "etrain_job_loss" not in anonymous.text
    user = tenant_token(api, "team-a")
    assert job not in api.get("/metrics", headers=user).text
    assert api.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert f'etrain_job_loss{{job_id="{job}"}} 2.5' in api.get("/metrics", headers=ADMIN_H).text
    runtime = api.app.state.runtime
    runtime.api = replace(runtime.api, metrics_job_labels=True)  # the operator's switch
    assert job in api.get("/metrics").text


def _reporter(api: TestClient, job_id: str):
    from service.auth import Principal

    tenant = api.app.state.runtime.stores.tokens.get_tenant_by_name("admin").id
    return Principal(tenant_id=tenant, role="reporter", job_id=job_id)


def test_item13_a_revoked_token_stops_working(api):
    user = tenant_token(api, "team-a")
    token = user["Authorization"].removeprefix("Bearer ")
    listed = api.get("/v1/tokens", headers=ADMIN_H).json()["items"]
    (row,) = [t for t in listed if t["tenant"] == "team-a"]
    assert token not in json.dumps(listed) and "hash" not in json.dumps(listed)
    assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    revoked = api.delete(f"/v1/tokens/{row['id']}", headers=ADMIN_H)
    assert revoked.status_code == 200 and revoked.json()["tenant"] == "team-a"
    assert api.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_reserved_tenant_user_tokens_of_an_older_database_are_revoked_at_start(tmp_path):
    """A database written before ``admin`` was reserved may hold a user token of that
    tenant, which could list and revoke the admin token: the next start revokes it."""
    settings = dev_settings(tmp_path)
    with TestClient(create_app(settings, backend=FakeBackend(), reconcile=False)) as api:
        tokens = api.app.state.runtime.stores.tokens
        admin = tokens.get_tenant_by_name("admin")
        secret = "et_user-token-given-out-for-the-admin-tenant-000000"
        tokens.add_token(tenant_id=admin.id, token_hash=hash_token(secret), name="x", role="user")
        leaked = {"Authorization": f"Bearer {secret}"}
        assert api.get("/v1/tokens", headers=leaked).status_code == 200  # what it could do
    with TestClient(create_app(settings, backend=FakeBackend(), reconcile=False)) as api:
        assert api.get("/v1/tokens", headers=leaked).status_code == 401
        assert api.get("/v1/tokens", headers=ADMIN_H).status_code == 200
        roles = [t["role"] for t in api.get("/v1/tokens", headers=ADMIN_H).json()["items"]]
        assert roles == ["admin"]


def test_item13_a_new_configured_admin_token_replaces_the_old_one(tmp_path):
    def serve(token: str) -> TestClient:
        settings = dev_settings(tmp_path, admin_token=token)
        return TestClient(create_app(settings, backend=FakeBackend(), reconcile=False))

    with serve(ADMIN) as api:
        assert api.get("/v1/jobs", headers=ADMIN_H).status_code == 200
    new = {"Authorization": "Bearer et_the-new-admin-token-0123456789abcdef"}
    with serve(new["Authorization"][7:]) as api:
        assert api.get("/v1/jobs", headers=new).status_code == 200
        assert api.get("/v1/jobs", headers=ADMIN_H).status_code == 401


def test_item13_the_database_file_is_private(tmp_path):
    settings = Settings(env="development", data_dir=tmp_path, admin_token=ADMIN)
    with TestClient(create_app(settings, backend=FakeBackend(), reconcile=False)):
        pass
    for name in ("etrain.db", "etrain.db-wal", "etrain.db-shm"):
        if (tmp_path / name).exists():
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((tmp_path / "etrain.db").stat().st_mode) == 0o600


def test_item09_concurrent_token_requests_for_a_new_tenant(tmp_path, monkeypatch):
    """20 threads create the first tokens of one new tenant at the same moment: every one
    gets a token of the one tenant. A barrier holds every thread between looking the
    tenant up and creating it, which is where a create-if-missing in two steps races."""
    url = f"sqlite:///{tmp_path / 'etrain.db'}"
    migrate(url)
    stores = Stores.open(url)
    threads, barrier = 20, threading.Barrier(20, timeout=2)
    looked_up = TokenStore.get_tenant_by_name

    def racing_lookup(self, name):
        found = looked_up(self, name)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return found

    monkeypatch.setattr(TokenStore, "get_tenant_by_name", racing_lookup)
    errors, tokens = [], []

    def create():
        try:
            tokens.append(create_user_token(stores.tokens, tenant="new-team", name="ci"))
        except Exception as e:  # noqa: BLE001 - the failure under test
            errors.append(e)

    workers = [threading.Thread(target=create) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    try:
        assert errors == [] and len(set(tokens)) == threads
        listed = stores.tokens.list_tokens()
        assert {tenant for _, tenant in listed} == {"new-team"}
    finally:
        stores.close()


def test_item13_no_route_has_its_body_read_before_authentication():
    """FastAPI reads a declared body parameter before it resolves dependencies (the token);
    every route that takes a body reads it itself, after authentication."""
    from service.api import goodput_routes, routes, token_routes

    every = [
        *routes.probes.routes,
        *routes.v1.routes,
        *goodput_routes.v1.routes,
        *token_routes.v1.routes,
    ]
    assert [r.path for r in every if r.body_field is not None] == []
    posting = {r.path for r in every if r.methods & {"POST", "PUT", "PATCH"}}
    assert {"/v1/tokens", "/v1/jobs", "/v1/plan"} <= posting
