"""The planner behind the API: submits refused with the numbers, warnings stored on the job."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support.fakes import FakeBackend
from tests.unit.service.test_api import ADMIN_H, _settings

GPU_SPEC = {
    "name": "gpu",
    "model": {"preset": "llama-1b"},
    "data": {"seq_len": 128},
    "resources": {"workers": 2, "gpus_per_worker": 1},
    "train": {"steps": 5, "micro_batch_size": 1, "global_batch_size": 2, "precision": "bf16"},
}


@pytest.fixture
def rtx_client(tmp_path):
    """A connected cluster of one node with two RTX 3060 (12 GiB each)."""
    backend = FakeBackend(cpus=16, gpus=2)
    backend.info.nodes[0]["resources"]["accelerator_type:RTX3060"] = 1.0
    app = create_app(_settings(tmp_path), backend=backend, reconcile=False)
    with TestClient(app) as client:
        yield client


def test_submit_that_cannot_fit_is_422_with_the_numbers_and_a_fix(rtx_client):
    r = rtx_client.post("/v1/jobs", json=GPU_SPEC, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["type"] == "plan"
    # llama-1b: 16 bytes x 1.5e9 parameters = 22.3 GiB of state on a 12 GiB GPU; even
    # sharded over both GPUs it needs the host: FSDP with CPU offload.
    assert "model state 22.3 GiB" in detail["msg"] and "12.0 GiB" in detail["msg"]
    assert "set parallelism.strategy 'fsdp'" in detail["msg"]
    assert "fsdp.cpu_offload true" in detail["msg"]


def test_plan_defaults_to_the_connected_gpus(rtx_client):
    plan = rtx_client.post("/v1/plan", json={"spec": GPU_SPEC}, headers=ADMIN_H).json()
    assert plan["cluster"]["gpu_names"] == ["rtx3060"] and plan["fits"] is False
    assert plan["recommendation"] == "fsdp"


def test_wasteful_submit_is_accepted_with_warnings_on_the_job(rtx_client):
    spec = {**GPU_SPEC, "model": {"preset": "gpt-small"}, "parallelism": {"strategy": "fsdp"}}
    r = rtx_client.post("/v1/jobs", json=spec, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    job = rtx_client.get(f"/v1/jobs/{r.json()['id']}", headers=ADMIN_H).json()
    assert any("parallelism.strategy 'fsdp' is not needed" in w for w in job["warnings"])


def test_a_bad_cluster_is_refused_before_the_model_or_data_is_read(rtx_client, monkeypatch):
    from service.domain import submission

    read = []
    monkeypatch.setattr(submission, "check_model", lambda *a, **k: read.append("model"))
    monkeypatch.setattr(submission, "check_data", lambda *a, **k: read.append("data"))
    body = {"spec": GPU_SPEC, "cluster": {"gpu_memory_gb": -1}}
    r = rtx_client.post("/v1/plan", json=body, headers=ADMIN_H)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == [
        "body",
        "cluster",
        "gpu_memory_gb",
    ]
    assert read == []
    assert rtx_client.post("/v1/plan", json={"spec": GPU_SPEC}, headers=ADMIN_H).status_code == 200
    assert read == ["model", "data"]  # the same checks a submission makes


def test_the_data_parallel_degree_comes_from_one_place(tmp_path):
    """Plan and job give the degree at the fewest and most workers and (a job that
    reported a step) at its world size: the numbers the pages and the report show."""
    spec = {
        "name": "elastic",
        "resources": {"workers": {"min": 2, "max": 4}},
        "parallelism": {"strategy": "fsdp"},
        "train": {"steps": 5, "global_batch_size": 12, "micro_batch_size": 1},
    }
    app = create_app(_settings(tmp_path), backend=FakeBackend(cpus=16), reconcile=False)
    with TestClient(app) as client:
        plan = client.post("/v1/plan", json={"spec": spec}, headers=ADMIN_H).json()
        degrees = plan["layout"]["data_parallel"]
        assert degrees == {"min": 2, "max": 4, "current": None}
        assert plan["layout"]["dp"] == degrees["min"]
        job = client.post("/v1/jobs", json=spec, headers=ADMIN_H).json()
        assert job["data_parallel"] == {"min": 2, "max": 4, "current": None}
        jobs = client.app.state.runtime.stores.jobs
        jobs.update_job(job["id"], expect_status=jobs.get_job(job["id"]).status, world_size=3)
        got = client.get(f"/v1/jobs/{job['id']}", headers=ADMIN_H).json()["data_parallel"]
        assert got == {"min": 2, "max": 4, "current": 3}
        listed = client.get("/v1/jobs", headers=ADMIN_H).json()["items"][0]["data_parallel"]
        assert listed == got
