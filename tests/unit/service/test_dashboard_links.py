"""Job detail links to the Ray dashboard, and the startup line naming the backend."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from service import server
from service.backends.ray_jobs import TRAIN_RUNS_PATH, RayJobBackend
from service.status import JobStatus
from tests.support.api import api_client
from tests.support.fakes import ADMIN_H, FakeBackend

RAY_DASHBOARD = Path(importlib.util.find_spec("ray").origin).parent / "dashboard"


class LinkingBackend(FakeBackend):
    """The fake backend with the Ray job API backend's links."""

    def dashboard_links(self, submission_id: str) -> dict[str, str]:
        return RayJobBackend("http://ray.test:8265").dashboard_links(submission_id)


def test_train_runs_path_is_the_installed_dashboards_train_route():
    train_head = (RAY_DASHBOARD / "modules/train/train_head.py").read_text()
    assert f'@routes.get("{TRAIN_RUNS_PATH}")' in train_head
    # No Train page in the web client, so there is no per-run URL to link instead.
    bundles = "".join(
        p.read_text(errors="ignore")
        for p in (RAY_DASHBOARD / "client/build/static/js").glob("main*.js")
    )
    routes = set(re.findall(r'path:"([^"]*)"', bundles))
    assert "jobs" in routes and not any("train" in r.lower() for r in routes)


def test_ray_job_api_backend_links_the_job_and_the_train_runs():
    links = RayJobBackend("http://127.0.0.1:8265/").dashboard_links("etrain-j-1-0")
    assert links == {
        "job": "http://127.0.0.1:8265/#/jobs/etrain-j-1-0",
        "train_runs": "http://127.0.0.1:8265/api/train/v2/runs/v1",
    }


def test_the_default_backend_has_no_links():
    assert FakeBackend().dashboard_links("etrain-j-1-0") == {}


def test_job_detail_carries_the_backends_links(tmp_path):
    with api_client(tmp_path, LinkingBackend()) as client:
        job_id = client.post("/v1/jobs", json={"name": "tiny"}, headers=ADMIN_H).json()["id"]
        assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["dashboard_links"] == {}
        client.app.state.runtime.stores.jobs.update_job(
            job_id, status=JobStatus.PENDING, submission_id=f"etrain-{job_id}-0"
        )
        job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["dashboard_links"] == {
        "job": f"http://ray.test:8265/#/jobs/etrain-{job_id}-0",
        "train_runs": "http://ray.test:8265/api/train/v2/runs/v1",
    }


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "an embedded local Ray head (starting)"),
        ({"ETRAIN_RAY_ADDRESS": "http://head:8265"}, "the Ray job API at http://head:8265"),
        (
            {
                "ETRAIN_BACKEND": "kuberay",
                "ETRAIN_K8S_NAMESPACE": "ml",
                "ETRAIN_RAYCLUSTER_NAME": "gpu-pool",
            },
            "KubeRay RayJobs in namespace ml, on RayCluster gpu-pool",
        ),
        (
            {"ETRAIN_BACKEND": "kuberay"},
            "KubeRay RayJobs in namespace etrain, each on a RayCluster of its own",
        ),
    ],
)
def test_serve_names_the_backend_it_will_use(env, expected, monkeypatch, tmp_path, capsys):
    import uvicorn

    import service.api.app

    for key in (
        "ETRAIN_BACKEND",
        "ETRAIN_RAY_ADDRESS",
        "ETRAIN_K8S_NAMESPACE",
        "ETRAIN_RAYCLUSTER_NAME",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    monkeypatch.setattr(service.api.app, "create_app", lambda settings: None)
    server.run_server(data_dir=str(tmp_path))
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"etrain: data dir {tmp_path}; Ray: {expected}"
