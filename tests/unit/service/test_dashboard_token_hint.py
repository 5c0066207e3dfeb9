"""Where the Ray dashboard's sign-in token is: said by `etrain serve`, `etrain status` and
GET /v1/jobs/{id}, never the token itself."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from service import server
from service.cli.jobs import ray_dashboard_line
from service.domain.ray_dashboard import token_hint, token_source
from service.settings import Settings
from service.status import JobStatus
from tests.support.api import api_client
from tests.support.fakes import ADMIN_H
from tests.unit.service.test_dashboard_links import LinkingBackend

RAY = Path(importlib.util.find_spec("ray").origin).parent


def test_the_dashboard_signs_in_with_a_cookie_the_token_dialog_sets():
    """What the README tells users rests on the installed dashboard: a dialog that posts
    the token to /api/authenticate, which sets the cookie the auth middleware reads."""
    head = (RAY / "dashboard/http_server_head.py").read_text()
    assert '@routes.post("/api/authenticate")' in head
    constants = (RAY / "_private/authentication/authentication_constants.py").read_text()
    assert 'AUTHENTICATION_TOKEN_COOKIE_NAME = "ray-authentication-token"' in constants
    bundle = "".join(
        p.read_text(errors="ignore")
        for p in (RAY / "dashboard/client/build/static/js").glob("*.js")
    )
    assert "Authentication Token Required" in bundle
    assert "Enter your authentication token" in bundle
    assert "Job Query Error Please Check JobId" in bundle


@pytest.mark.parametrize(
    "settings, env, where",
    [
        (
            {},
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/d/ray_auth_token"},
            "/d/ray_auth_token",
        ),
        (
            {},
            {"RAY_AUTH_TOKEN": "s3cret"},
            "the RAY_AUTH_TOKEN environment variable of etrain serve",
        ),
        ({}, {"RAY_AUTH_MODE": "token"}, "~/.ray/auth_token of the user running etrain serve"),
        ({}, {}, None),
        (
            {"backend": "kuberay", "k8s_namespace": "ml"},
            {},
            "Secret etrain-ray-token (key auth_token) of namespace ml",
        ),
        ({"backend": "kuberay", "k8s_ray_auth_secret": ""}, {"RAY_AUTH_MODE": "token"}, None),
    ],
)
def test_token_source(settings, env, where):
    s = Settings(**settings).ray
    assert token_source(s, env) == where
    hint = token_hint(s, env)
    assert hint == (None if where is None else f"sign in with the Ray token in {where}")
    assert "s3cret" not in (hint or "")


def test_job_detail_carries_the_hint_with_its_links(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/srv/etrain/ray_auth_token")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with api_client(tmp_path, LinkingBackend()) as client:
        job_id = client.post("/v1/jobs", json={"name": "tiny"}, headers=ADMIN_H).json()["id"]
        before = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
        assert before["dashboard_token_hint"] is None  # no links before it reaches Ray
        client.app.state.runtime.stores.jobs.update_job(
            job_id, status=JobStatus.PENDING, submission_id=f"etrain-{job_id}-0"
        )
        job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["dashboard_token_hint"] == (
        "sign in with the Ray token in /srv/etrain/ray_auth_token"
    )
    assert ray_dashboard_line(job) == (
        f"Ray dashboard: http://ray.test:8265/#/jobs/etrain-{job_id}-0 "
        "(sign in with the Ray token in /srv/etrain/ray_auth_token)"
    )


def test_job_detail_without_links_has_no_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/srv/etrain/ray_auth_token")
    with api_client(tmp_path) as client:
        job_id = client.post("/v1/jobs", json={"name": "tiny"}, headers=ADMIN_H).json()["id"]
        client.app.state.runtime.stores.jobs.update_job(
            job_id,
            status=JobStatus.PENDING,
            submission_id=f"etrain-{job_id}-0",
            dashboard_url="http://ray.test:8265/#/jobs/x",
        )
        job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["dashboard_links"] == {} and job["dashboard_token_hint"] is None
    # The CLI falls back to the stored dashboard_url, without a hint.
    assert ray_dashboard_line(job) == "Ray dashboard: http://ray.test:8265/#/jobs/x"
    assert ray_dashboard_line({**job, "dashboard_url": None}) is None


def test_serve_prints_where_the_embedded_heads_token_is(tmp_path, monkeypatch):
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data"
    line = server.ray_token_line(Settings(data_dir=data).ray)
    token_file = data / "ray_auth_token"
    assert line == f"etrain: Ray dashboard sign-in token in {token_file}"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert data.stat().st_mode & 0o777 == 0o700
    assert token_file.read_text().strip() not in line


def test_serve_names_an_existing_clusters_token_variable(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret-token")
    line = server.ray_token_line(Settings(ray_address="http://head:8265").ray)
    assert line == (
        "etrain: Ray dashboard sign-in token in the RAY_AUTH_TOKEN environment variable "
        "of etrain serve"
    )
    assert "s3cret" not in json.dumps(line)
