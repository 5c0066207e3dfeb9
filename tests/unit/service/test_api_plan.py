"""POST /v1/plan and the planner behind the API: the plan's keys, clusters that do not fit,
422s, submits refused with the numbers, warnings stored on the job."""

from __future__ import annotations

import pytest
import yaml

from tests.support.api import api_client, total
from tests.support.fakes import ADMIN_H, FakeBackend
from tests.support.specs import JOB, PER_RANK_KEYS

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
    with api_client(tmp_path, backend) as client:
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
    with api_client(tmp_path, FakeBackend(cpus=16)) as client:
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


def test_plan_returns_the_documented_keys(client):
    r = client.post("/v1/plan", json={"spec": JOB}, headers=ADMIN_H)
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
    assert set(plan["per_rank"]) >= PER_RANK_KEYS
    assert plan["fits"] is True and plan["errors"] == [] and plan["num_params"] > 0
    assert plan["layout"]["strategy"] == "ddp"
    assert total(client) == 0  # a dry run stores nothing


def test_plan_yaml_with_a_cluster_that_does_not_fit(client):
    body = yaml.safe_dump(
        {
            "spec": {**JOB, "resources": {"workers": 2, "gpus_per_worker": 1}},
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu_memory_gb": 0.001},
        }
    )
    r = client.post(
        "/v1/plan", content=body, headers={**ADMIN_H, "Content-Type": "application/yaml"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["fits"] is False and r.json()["errors"]


def test_plan_defaults_to_the_connected_cluster_and_keeps_tp_inside_a_node(client):
    """The fake cluster is one node of 2 CPUs: a TP group of 2 x 2 CPUs cannot fit in it."""
    spec = {
        **JOB,
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
        ({"spec": {**JOB, "bogus": 1}}, ["body", "bogus"]),
        ({"spec": "name: tiny"}, ["body"]),
    ],
)
def test_plan_rejects_bad_requests(client, body, loc):
    r = client.post("/v1/plan", json=body, headers=ADMIN_H)
    assert r.status_code == 422
    assert any(d["loc"] == loc for d in r.json()["detail"]), r.json()


def test_plan_rejects_a_malformed_cluster(tmp_path):
    with api_client(tmp_path, raise_server_exceptions=False) as c:
        r = c.post(
            "/v1/plan",
            headers=ADMIN_H,
            json={
                "spec": {**JOB, "resources": {"workers": 2, "gpus_per_worker": 1}},
                "cluster": {"gpu_memory_gb": ""},
            },
        )
    assert r.status_code == 422
