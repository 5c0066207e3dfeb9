"""Object storage on the service side: the write probe at submit and plan (422 with a clear
message, never a key), specs that keep only a secret's name, and the credentials the
reconciler forwards to the workers. Against real S3 and GCS endpoints on loopback (moto,
gcp-storage-emulator)."""

from __future__ import annotations

import json
import logging

import pytest

from tests.unit.service.fakes import ADMIN_H, FakeBackend
from service.domain.reconciler import Reconciler
from service.domain.storage_check import check_checkpoint_storage, storage_launch_env
from service.errors import InvalidSpec
from service.settings import Settings
from workers.spec import CheckpointSpec, parse_spec
from workers.checkpoint.storage import STORAGE_CLIENT_LOGGERS, quiet_storage_loggers

SECRET_NAME = "moto-store"
SECRET_VARS = ("ETRAIN_SECRET_MOTO_STORE_ACCESS_KEY_ID", "ETRAIN_SECRET_MOTO_STORE_SECRET_ACCESS_KEY")


def _checkpoint(s3_server, *, bucket: str | None = None, secret: str | None = None) -> dict:
    s3 = {"endpoint_url": s3_server["endpoint_url"], "region": s3_server["region"]}
    if secret:
        s3["credentials_secret"] = secret
    return {"storage": f"s3://{bucket or s3_server['bucket']}/jobs", "s3": s3}


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
    for var, name in zip(SECRET_VARS, ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")):
        monkeypatch.setenv(var, s3_server["env"][name])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


# --- check_checkpoint_storage ------------------------------------------------------------------

@pytest.mark.parametrize("storage", [None, "file:///nowhere/at/all"])
def test_local_storage_is_not_probed(storage):
    check_checkpoint_storage(CheckpointSpec(storage=storage), env={})


def test_a_writable_bucket_passes(object_store):
    ckpt = CheckpointSpec.model_validate(object_store.checkpoint("jobs"))
    check_checkpoint_storage(ckpt, env=object_store.env)


def test_a_missing_bucket_is_a_422_naming_checkpoint_storage(object_store):
    ckpt = CheckpointSpec.model_validate(object_store.checkpoint("jobs", bucket="missing-bucket"))
    with pytest.raises(InvalidSpec) as info:
        check_checkpoint_storage(ckpt, env=object_store.env)
    (err,) = info.value.errors
    assert err["loc"] == ["body", "checkpoint", "storage"]
    assert "'missing-bucket' does not exist" in err["msg"]
    assert not any(v in err["msg"] for v in object_store.env.values())


def test_a_named_secret_missing_from_the_service_env_points_at_the_field(s3_server):
    ckpt = CheckpointSpec.model_validate(_checkpoint(s3_server, secret="absent"))
    with pytest.raises(InvalidSpec) as info:
        check_checkpoint_storage(ckpt, env={})
    (err,) = info.value.errors
    assert err["loc"] == ["body", "checkpoint", "s3", "credentials_secret"]
    assert "ETRAIN_SECRET_ABSENT_ACCESS_KEY_ID" in err["msg"]


# --- through the API ----------------------------------------------------------------------------

def test_submit_with_a_missing_bucket_is_refused_before_queueing(client, store_env, caplog):
    caplog.set_level(logging.INFO)  # the service's level (ETRAIN_LOG_LEVEL)
    body = {"name": "store-job",
            "checkpoint": store_env.checkpoint("jobs", bucket="missing-bucket")}
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
    body = {"spec": {"name": "store-job",
                     "checkpoint": store_env.checkpoint("jobs", bucket="missing-bucket")}}
    r = client.post("/v1/plan", json=body, headers=ADMIN_H)
    assert r.status_code == 422, r.text
    assert "does not exist" in r.json()["detail"][0]["msg"]


def test_submit_with_wrong_credentials_is_refused_without_echoing_them(client, s3_server,
                                                                       monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value-000000000000000000000")
    r = client.post("/v1/jobs", json={"name": "s3-job", "checkpoint": _checkpoint(s3_server)},
                    headers=ADMIN_H)
    assert r.status_code == 422, r.text
    assert "rejected the credentials" in r.text and "InvalidAccessKeyId" in r.text
    assert "AKIAWRONG" not in r.text and "wrong-secret-value" not in r.text


@pytest.mark.usefixtures("named_env")
def test_an_accepted_job_stores_the_secret_name_and_no_key_material(client, s3_server):
    body = {"name": "s3-job", "checkpoint": _checkpoint(s3_server, secret=SECRET_NAME)}
    r = client.post("/v1/jobs", json=body, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["checkpoint"]["s3"] == {
        "endpoint_url": s3_server["endpoint_url"], "region": s3_server["region"],
        "credentials_secret": SECRET_NAME}
    stored = client.app.state.runtime.store.get_job(job["id"])
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=ADMIN_H).text
    everything = json.dumps(stored.spec) + r.text + events + client.get(
        f"/v1/jobs/{job['id']}", headers=ADMIN_H).text
    assert not any(v in everything for v in _values(s3_server))
    # The stored spec re-validates on the worker to the same section.
    assert parse_spec(stored.spec).checkpoint.s3.credentials_secret == SECRET_NAME


@pytest.mark.usefixtures("aws_env")
def test_debug_logging_keeps_the_storage_clients_quiet(client, s3_server, caplog):
    """``etrain serve`` at ETRAIN_LOG_LEVEL=DEBUG: botocore would log signed headers."""
    caplog.set_level(logging.DEBUG)
    quiet_storage_loggers()
    try:
        body = {"name": "s3-job", "checkpoint": _checkpoint(s3_server, bucket="missing-bucket")}
        assert client.post("/v1/jobs", json=body, headers=ADMIN_H).status_code == 422
    finally:
        for name in STORAGE_CLIENT_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert not any(v in caplog.text for v in _values(s3_server))


# --- credentials forwarded to the workers --------------------------------------------------------

def _launch_env(tmp_path, checkpoint: dict, **settings) -> dict[str, str]:
    """The env of the LaunchRequest a reconciler tick hands the backend for this job."""
    from service.store import JobStore, migrate

    store_url = f"sqlite:///{tmp_path / 'etrain.db'}"
    migrate(store_url)
    store = JobStore(store_url)
    try:
        spec = parse_spec({"name": "s3-job", "checkpoint": checkpoint})
        tenant = store.create_tenant("acme").id
        store.create_job(tenant_id=tenant, name="s3-job",
                         spec=spec.model_dump(mode="json", by_alias=True),
                         min_workers=spec.resources.min_workers)
        backend = FakeBackend(cpus=4)
        Reconciler(store, backend, Settings(env="development", data_dir=tmp_path,
                                            **settings)).tick()
        (req,) = backend.submitted
        return req.env
    finally:
        store.close()


AWS = {"AWS_ACCESS_KEY_ID": "AKIAFORWARDED0000001", "AWS_SECRET_ACCESS_KEY": "fwd-secret",
       "AWS_SESSION_TOKEN": "fwd-token"}
NAMED = {"ETRAIN_SECRET_MINIO_ACCESS_KEY_ID": "AKIANAMED00000000001",
         "ETRAIN_SECRET_MINIO_SECRET_ACCESS_KEY": "named-secret"}
OTHER = {"ETRAIN_SECRET_OTHER_ACCESS_KEY_ID": "x", "ETRAIN_SECRET_OTHER_SECRET_ACCESS_KEY": "y"}
S3 = {"storage": "s3://bucket-a/jobs", "s3": {"endpoint_url": "http://minio:9000"}}


@pytest.mark.parametrize(("checkpoint", "settings", "expected"), [
    (S3, {}, AWS),
    ({**S3, "s3": {"credentials_secret": "minio"}}, {}, NAMED),
    ({"storage": "file:///shared/ckpt"}, {}, {}),
    ({"storage": "gs://bucket-a/jobs"}, {}, {}),
    (S3, {"backend": "kuberay"}, {}),  # pods read the etrain-storage Secret themselves
], ids=["aws-env", "named-secret", "file", "gs", "kuberay"])
def test_launch_env_carries_only_the_credentials_the_storage_needs(
        tmp_path, monkeypatch, checkpoint, settings, expected):
    for name, value in {**AWS, **NAMED, **OTHER}.items():
        monkeypatch.setenv(name, value)
    env = _launch_env(tmp_path, checkpoint, **settings)
    forwarded = {k: v for k, v in env.items()
                 if k.startswith(("AWS_", "ETRAIN_SECRET_"))}
    assert forwarded == expected
    assert env["ETRAIN_REPORT_TOKEN"]  # the rest of the launch env is unchanged


def test_storage_launch_env_reads_the_stored_section():
    env = {**AWS, **NAMED}
    assert storage_launch_env(CheckpointSpec(storage="s3://bkt/p"), env=env) == AWS
    assert storage_launch_env(CheckpointSpec(), env=env) == {}
    assert storage_launch_env(CheckpointSpec(storage="gs://bkt/p"), env=env) == {}
