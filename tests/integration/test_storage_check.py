"""Object storage on the service side, against real S3 and GCS endpoints on loopback (moto,
gcp-storage-emulator): the write probe at submit and plan (422 with a clear message, never
a key), and specs that keep only a secret's name."""

from __future__ import annotations

import logging

import pytest

from service.domain.storage_check import check_checkpoint_storage
from service.errors import InvalidSpec
from tests.support.fakes import ADMIN_H
from workers.spec import CheckpointSpec, StoresSpec, parse_spec
from workers.storage.location import STORAGE_CLIENT_LOGGERS, quiet_storage_loggers

SECRET_NAME = "moto-store"
SECRET_VARS = (
    "ETRAIN_SECRET_MOTO_STORE_ACCESS_KEY_ID",
    "ETRAIN_SECRET_MOTO_STORE_SECRET_ACCESS_KEY",
)


def _sections(s3_server, *, bucket: str | None = None, secret: str | None = None) -> dict:
    """``checkpoint`` and ``stores`` of a spec that checkpoints into the moto bucket."""
    s3 = {"endpoint_url": s3_server["endpoint_url"], "region": s3_server["region"]}
    if secret:
        s3["credentials_secret"] = secret
    storage = f"s3://{bucket or s3_server['bucket']}/jobs"
    return {"checkpoint": {"storage": storage}, "stores": {"s3": s3}}


def _values(s3_server) -> list[str]:
    return [s3_server["env"]["AWS_ACCESS_KEY_ID"], s3_server["env"]["AWS_SECRET_ACCESS_KEY"]]


@pytest.fixture
def aws_env(s3_server, monkeypatch):
    """The service's environment holds the moto user's keys as AWS_* variables."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, s3_server["env"][name])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


@pytest.fixture
def store_env(object_store, monkeypatch):
    """The service's environment holds the credentials ``object_store`` accepts."""
    for name, value in object_store.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return object_store


@pytest.fixture
def named_env(s3_server, monkeypatch):
    """The service's environment holds the moto user's keys as secret ``moto-store``."""
    for var, name in zip(SECRET_VARS, ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), strict=True):
        monkeypatch.setenv(var, s3_server["env"][name])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_a_writable_bucket_passes(object_store):
    ckpt = CheckpointSpec.model_validate(object_store.checkpoint("jobs"))
    check_checkpoint_storage(ckpt, object_store.stores_spec(), env=object_store.env)


def test_a_missing_bucket_is_a_422_naming_checkpoint_storage(object_store):
    ckpt = CheckpointSpec.model_validate(object_store.checkpoint("jobs", bucket="missing-bucket"))
    with pytest.raises(InvalidSpec) as info:
        check_checkpoint_storage(ckpt, object_store.stores_spec(), env=object_store.env)
    (err,) = info.value.errors
    assert err["loc"] == ["body", "checkpoint", "storage"]
    assert "'missing-bucket' does not exist" in err["msg"]
    assert not any(v in err["msg"] for v in object_store.env.values())


def test_a_named_secret_missing_from_the_service_env_points_at_the_field(s3_server):
    sections = _sections(s3_server, secret="absent")
    ckpt = CheckpointSpec.model_validate(sections["checkpoint"])
    with pytest.raises(InvalidSpec) as info:
        check_checkpoint_storage(ckpt, StoresSpec.model_validate(sections["stores"]), env={})
    (err,) = info.value.errors
    assert err["loc"] == ["body", "stores", "s3", "credentials_secret"]
    assert "ETRAIN_SECRET_ABSENT_ACCESS_KEY_ID" in err["msg"]


# --- through the API ----------------------------------------------------------------------------


def test_submit_with_a_missing_bucket_is_refused_before_queueing(client, store_env, caplog):
    caplog.set_level(logging.INFO)  # the service's level (ETRAIN_LOG_LEVEL)
    body = {"name": "store-job", **store_env.sections("jobs", bucket="missing-bucket")}
    r = client.post("/v1/jobs", json=body, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "checkpoint", "storage"]
    assert f"checkpoint.storage {store_env.scheme}://missing-bucket/jobs" in err["msg"]
    assert "does not exist" in err["msg"] and "create it" in err["msg"]
    assert client.get("/v1/jobs", headers=ADMIN_H).json()["total"] == 0
    for text in (r.text, caplog.text):
        assert not any(v in text for v in store_env.env.values())


def test_plan_with_a_missing_bucket_is_refused(client, store_env):
    body = {"spec": {"name": "store-job", **store_env.sections("jobs", bucket="missing-bucket")}}
    r = client.post("/v1/plan", json=body, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    assert "does not exist" in r.json()["detail"][0]["msg"]


def test_submit_with_wrong_credentials_is_refused_without_echoing_them(
    client, s3_server, monkeypatch
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value-000000000000000000000")
    r = client.post("/v1/jobs", json={"name": "s3-job", **_sections(s3_server)}, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    assert "rejected the credentials" in r.text and "InvalidAccessKeyId" in r.text
    assert "AKIAWRONG" not in r.text and "wrong-secret-value" not in r.text


@pytest.mark.usefixtures("named_env")
def test_an_accepted_job_stores_the_secret_name_and_no_key_material(client, s3_server):
    body = {"name": "s3-job", **_sections(s3_server, secret=SECRET_NAME)}
    r = client.post("/v1/jobs", json=body, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["stores"]["s3"] == {
        "endpoint_url": s3_server["endpoint_url"],
        "region": s3_server["region"],
        "credentials_secret": SECRET_NAME,
    }
    stored = client.app.state.runtime.stores.jobs.get_job(job["id"])
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=ADMIN_H).text
    everything = (
        stored.spec.model_dump_json()
        + r.text
        + events
        + client.get(f"/v1/jobs/{job['id']}", headers=ADMIN_H).text
    )
    assert not any(v in everything for v in _values(s3_server))
    # The stored spec re-validates on the worker to the same section.
    stored_json = stored.spec.model_dump(mode="json", by_alias=True)
    assert parse_spec(stored_json).stores.s3.credentials_secret == SECRET_NAME


@pytest.mark.usefixtures("aws_env")
def test_debug_logging_keeps_the_storage_clients_quiet(client, s3_server, caplog):
    """``etrain serve`` at ETRAIN_LOG_LEVEL=DEBUG: botocore would log signed headers."""
    caplog.set_level(logging.DEBUG)
    quiet_storage_loggers()
    try:
        body = {"name": "s3-job", **_sections(s3_server, bucket="missing-bucket")}
        assert client.post("/v1/jobs", json=body, headers=ADMIN_H).status_code == 422
    finally:
        for name in STORAGE_CLIENT_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert not any(v in caplog.text for v in _values(s3_server))
