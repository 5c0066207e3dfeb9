"""POST /v1/jobs (JSON and YAML, the 422s with field errors), GET /v1/jobs (filters, pages,
404s) and cancel, through TestClient on a fake backend."""

from __future__ import annotations

import pytest
import yaml

from service.auth import authenticate
from service.errors import Unauthorized
from service.status import JobStatus
from tests.support.api import (
    make_pending,
    reporter,
    stores,
    submit,
    total,
)
from tests.support.fakes import ADMIN_H
from tests.support.specs import JOB

# -- submit ---------------------------------------------------------------------


def test_submit_json_is_queued_with_default_checkpoint_storage(client, tmp_path):
    job = submit(client)
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
    body = yaml.safe_dump({**JOB, "checkpoint": {"async": False, "every_steps": 2}})
    r = client.post(
        "/v1/jobs", content=body.encode(), headers={**ADMIN_H, "Content-Type": content_type}
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "QUEUED"
    assert job["spec"]["checkpoint"]["every_steps"] == 2
    assert job["spec"]["checkpoint"]["storage"] == f"file://{tmp_path / 'checkpoints' / 'admin'}"


def test_submit_keeps_an_explicit_checkpoint_storage(client):
    job = submit(client, checkpoint={"storage": "file:///mnt/ckpt"})
    assert job["spec"]["checkpoint"]["storage"] == "file:///mnt/ckpt"


def test_stored_spec_is_json_with_the_async_alias(client):
    job = submit(client)
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
    "unknown-top-field": ({**JOB, "priority": 5}, JSON, ["body", "priority"], UNKNOWN),
    "unknown-nested-field": (
        {**JOB, "train": {"micro_batch": 4}},
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
    "bad-name": ({**JOB, "name": "My_Job"}, JSON, ["body", "name"], "lowercase"),
    "long-name": ({**JOB, "name": "a" * 48}, JSON, ["body", "name"], "47"),
    "seq-len-too-small": (
        {**JOB, "data": {"seq_len": 4}},
        JSON,
        ["body", "data", "seq_len"],
        "greater than or equal to 8",
    ),
    "wrong-type": (
        {**JOB, "train": {"steps": "many"}},
        JSON,
        ["body", "train", "steps"],
        "integer",
    ),
    "unknown-preset": (
        {**JOB, "model": {"preset": "gpt-huge"}},
        JSON,
        ["body", "model", "preset"],
        "gpt-tiny",
    ),
    "storage-scheme": (
        {**JOB, "checkpoint": {"storage": "ftp://b/p"}},
        JSON,
        ["body", "checkpoint", "storage"],
        "file://",
    ),
    "text-without-path": (
        {**JOB, "data": {"source": "text"}},
        JSON,
        ["body", "data"],
        "data.path",
    ),
    "min-above-max": (
        {**JOB, "resources": {"workers": {"min": 3, "max": 2}}},
        JSON,
        ["body", "resources", "workers"],
        "resources.workers.min",
    ),
    "batch-vs-dp": (
        {**JOB, "resources": {"workers": 3}},
        JSON,
        ["body"],
        "train.global_batch_size",
    ),
    "warmup": (
        {**JOB, "train": {"steps": 5, "warmup_steps": 5}},
        JSON,
        ["body", "train"],
        "train.warmup_steps",
    ),
    "ddp-with-tp": (
        {**JOB, "parallelism": {"tp": 2}},
        JSON,
        ["body", "parallelism"],
        "parallelism.tp",
    ),
    # Valid specs whose plan has errors: refused before anything is stored.
    "tp-spans-nodes": (
        {
            **JOB,
            "parallelism": {"strategy": "tp", "tp": 2},
            "resources": {"workers": 2, "cpus_per_worker": 2},
        },
        JSON,
        ["body"],
        "parallelism.tp",
    ),
    "keep-every-off-interval": (
        {**JOB, "checkpoint": {"every_steps": 10, "keep_every": 15}},
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
    assert total(client) == 1
    assert stores(client).jobs.count_jobs() == 1


def test_seq_len_beyond_the_model_is_refused(client):
    r = client.post("/v1/jobs", json={**JOB, "data": {"seq_len": 2048}}, headers=ADMIN_H)
    assert r.status_code == 422
    assert "seq_len" in r.text


def test_unknown_field_error_lists_the_accepted_fields(client):
    r = client.post("/v1/jobs", json={**JOB, "train": {"micro_batch": 4}}, headers=ADMIN_H)
    assert r.status_code == 422
    assert "micro_batch_size" in r.json()["detail"][0]["msg"]


def test_worker_range_error_is_one_clean_item(client):
    r = client.post(
        "/v1/jobs", json={**JOB, "resources": {"workers": {"min": 3, "max": 2}}}, headers=ADMIN_H
    )
    detail = r.json()["detail"]
    assert len(detail) == 1
    assert not any("[" in str(part) for part in detail[0]["loc"])


# -- reading and listing ----------------------------------------------------


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
    ids = [submit(client, name=f"job-{i}")["id"] for i in range(3)]
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


def test_a_page_shows_each_job_as_its_own_page_does(client):
    """A page's jobs are built without validating their stored fields again: each must
    read as the job's own route reads it (validated), metrics and spec included."""
    from service.api.schemas import JobPublic

    job_id = submit(client)["id"]
    point = {"step": 3, "world_size": 2, "loss": 1.25, "tokens_per_s": 10.0, "extra": 1}
    stores(client).jobs.update_job(job_id, step=3, latest_metrics=point)
    (item,) = client.get("/v1/jobs", headers=ADMIN_H).json()["items"]
    own = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert item == {k: v for k, v in own.items() if k in item}
    assert item["metrics"] == point and item["spec"]["train"]["steps"] == 5
    record = stores(client).jobs.get_job(job_id)
    built, validated = JobPublic.of(record), JobPublic(**JobPublic.fields_of(record))
    assert built.model_dump_json(warnings="error") == validated.model_dump_json()


def test_a_page_is_written_as_fastapi_would_and_follows_each_change(client):
    """Pages (and a submit's answer) are joined from each job's JSON as of its updated_at:
    byte for byte what FastAPI writes for the validated model, and a job changed since is
    written anew."""
    from pydantic import TypeAdapter

    from service.api.schemas import JobPage, JobPublic

    posted = client.post("/v1/jobs", json={**JOB, "name": "job-0"}, headers=ADMIN_H)
    assert posted.status_code == 201, posted.text
    ids = [posted.json()["id"], submit(client, name="job-1")["id"]]
    view = JobPublic(**JobPublic.fields_of(stores(client).jobs.get_job(ids[0])))
    assert posted.content == TypeAdapter(JobPublic).dump_json(view, by_alias=True)
    client.get("/v1/jobs", headers=ADMIN_H)  # both kept as they are now
    stores(client).jobs.update_job(ids[0], step=4, world_size=1)
    r = client.get("/v1/jobs", headers=ADMIN_H)
    assert r.headers["content-type"] == "application/json"
    records = [stores(client).jobs.get_job(i) for i in reversed(ids)]  # newest first
    views = [JobPublic(**JobPublic.fields_of(record)) for record in records]
    page = JobPage(items=views, total=2)
    assert r.content == TypeAdapter(JobPage).dump_json(page, by_alias=True)  # as FastAPI
    assert [j["step"] for j in r.json()["items"]] == [0, 4]
    route = client.get("/openapi.json").json()["paths"]["/v1/jobs"]
    for method, status, model in [("get", "200", "/JobPage"), ("post", "201", "/JobPublic")]:
        schema = route[method]["responses"][status]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith(model)


# -- cancel --------------------------------------------------------------------


def test_cancel_queued_job_is_idempotent(client, backend):
    job_id = submit(client)["id"]
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
    job_id = submit(client)["id"]
    sender = reporter(client, job_id)
    make_pending(client, job_id, submission_id=f"etrain-{job_id}-0")
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert backend.stopped == [f"etrain-{job_id}-0"]
    with pytest.raises(Unauthorized):
        authenticate(stores(client).tokens, sender["Authorization"])
    r = client.post(f"/v1/jobs/{job_id}/telemetry", json={"metrics": []}, headers=sender)
    assert r.status_code == 401


def test_cancel_finished_job_changes_nothing(client, backend):
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    stores(client).jobs.update_job(job_id, status=JobStatus.SUCCEEDED)
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["status"] == "SUCCEEDED"
    assert backend.stopped == []
