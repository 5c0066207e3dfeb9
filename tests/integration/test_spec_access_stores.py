"""A tenant's object-store probe against real S3 endpoints (item 4): it carries the keys of
the tenant's own secret, the credentials its job will use, never the service's AWS_* keys,
and it goes only to an endpoint the operator listed."""

from __future__ import annotations

import http.server
import threading

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support.fakes import ADMIN_H, FakeBackend, dev_settings

SERVICE_KEY = "AKIASERVICEKEY000001"
TENANT_KEY = "AKIATEAMBKEY00000001"


@pytest.fixture
def capture():
    """An HTTP endpoint that records each request's Authorization header, answers 403."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            seen.append(self.headers.get("Authorization", ""))
            if not self.headers.get("Expect"):  # a client that waits for 100 sends no body
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_PUT = do_DELETE = do_GET = do_HEAD = do_POST = _answer  # noqa: N815 - http.server names

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _app(tmp_path, endpoint: str, bucket: str):
    settings = dev_settings(tmp_path).model_copy(
        update={
            "policy_object_stores": {"*": [f"s3://{bucket}/{{tenant}}"]},
            "policy_endpoints": {"team-b": [endpoint]},
        }
    )
    return create_app(settings, backend=FakeBackend(cpus=4), reconcile=False)


def _tenant(c, name):
    r = c.post("/v1/tokens", json={"tenant": name}, headers=ADMIN_H)
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _spec(bucket, endpoint, tenant="team-b", *, old_form=False):
    """A tenant's job on ``bucket``; ``old_form``: its s3 options as checkpoint.s3, where
    specs written before the stores section carried them."""
    s3 = {"endpoint_url": endpoint, "region": "us-east-1", "credentials_secret": tenant}
    checkpoint = {"storage": f"s3://{bucket}/{tenant}/run"}
    sections = (
        {"checkpoint": {**checkpoint, "s3": s3}}
        if old_form
        else {"checkpoint": checkpoint, "stores": {"s3": s3}}
    )
    return {"name": "s3-job", "resources": {"workers": 1}, **sections}


@pytest.mark.parametrize("old_form", [False, True], ids=["stores", "old-checkpoint-s3"])
def test_the_probe_signs_with_the_tenants_secret(tmp_path, monkeypatch, capture, old_form):
    endpoint, seen = capture
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", SERVICE_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "service-secret")
    monkeypatch.setenv("ETRAIN_SECRET_TEAM_B_ACCESS_KEY_ID", TENANT_KEY)
    monkeypatch.setenv("ETRAIN_SECRET_TEAM_B_SECRET_ACCESS_KEY", "team-b-secret")
    with TestClient(_app(tmp_path, endpoint, "ckpt")) as c:
        b = _tenant(c, "team-b")
        r = c.post("/v1/plan", json={"spec": _spec("ckpt", endpoint, old_form=old_form)}, headers=b)
        assert r.status_code == 422, r.text  # the endpoint refuses (403)
        assert seen and all(f"Credential={TENANT_KEY}/" in h for h in seen), seen
        assert not any(SERVICE_KEY in h for h in seen)
        # team-a may not name that endpoint: nothing is sent for it.
        a, count = _tenant(c, "team-a"), len(seen)
        spec = _spec("ckpt", endpoint, tenant="team-a", old_form=old_form)
        r = c.post("/v1/plan", json={"spec": spec}, headers=a)
        assert r.status_code == 422
        assert ["body", "stores", "s3", "endpoint_url"] in [e["loc"] for e in r.json()["detail"]]
        assert len(seen) == count


@pytest.mark.parametrize("old_form", [False, True], ids=["stores", "old-checkpoint-s3"])
def test_a_tenant_job_on_a_real_store_is_accepted_with_its_own_keys(
    tmp_path, monkeypatch, s3_server, old_form
):
    """The service's AWS_* keys are wrong here: only the tenant's secret opens the bucket."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", SERVICE_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-service-secret")
    monkeypatch.setenv("ETRAIN_SECRET_TEAM_B_ACCESS_KEY_ID", s3_server["env"]["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv(
        "ETRAIN_SECRET_TEAM_B_SECRET_ACCESS_KEY", s3_server["env"]["AWS_SECRET_ACCESS_KEY"]
    )
    endpoint, bucket = s3_server["endpoint_url"], s3_server["bucket"]
    with TestClient(_app(tmp_path, endpoint, bucket)) as c:
        b = _tenant(c, "team-b")
        r = c.post("/v1/jobs", json=_spec(bucket, endpoint, old_form=old_form), headers=b)
        assert r.status_code == 201, r.text
        stored = c.get(f"/v1/jobs/{r.json()['id']}", headers=b).json()["spec"]
        for spec in (r.json()["spec"], stored):  # stored in the new form only
            assert spec["stores"]["s3"]["credentials_secret"] == "team-b"
            assert "s3" not in spec["checkpoint"]
