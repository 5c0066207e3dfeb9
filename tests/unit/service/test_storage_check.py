"""Object storage on the service side without a store: which storage is probed, and the
credentials the reconciler forwards to the workers (tests/integration/test_storage_check.py
probes real S3 and GCS endpoints)."""

from __future__ import annotations

import pytest

from service.domain import storage_check
from service.domain.reconciler import Reconciler
from service.domain.storage_check import check_checkpoint_storage, storage_launch_env
from service.settings import Settings
from tests.support.fakes import FakeBackend
from workers.spec import CheckpointSpec, StoresSpec, parse_spec

SECRET_NAME = "moto-store"
SECRET_VARS = (
    "ETRAIN_SECRET_MOTO_STORE_ACCESS_KEY_ID",
    "ETRAIN_SECRET_MOTO_STORE_SECRET_ACCESS_KEY",
)


# --- check_checkpoint_storage ------------------------------------------------------------------


@pytest.mark.parametrize("storage", [None, "file:///nowhere/at/all"])
def test_local_storage_is_not_probed(storage, monkeypatch):
    """The service may not share the workers' file system: only object stores are probed."""
    probed = []
    monkeypatch.setattr(storage_check, "check_storage", lambda loc, **_: probed.append(loc))
    check_checkpoint_storage(CheckpointSpec(storage=storage), StoresSpec(), env={})
    assert probed == []
    check_checkpoint_storage(CheckpointSpec(storage="s3://bkt/p"), None, env={})  # the same path
    assert [loc.uri for loc in probed] == ["s3://bkt/p"]


def test_the_probe_reaches_the_store_with_the_stores_section(monkeypatch):
    probed = []
    monkeypatch.setattr(storage_check, "check_storage", lambda loc, **_: probed.append(loc))
    stores = StoresSpec.model_validate({"gcs": {"endpoint_url": "http://127.0.0.1:9023"}})
    check_checkpoint_storage(CheckpointSpec(storage="gs://bkt/p"), stores, env={})
    assert [loc.endpoint_url for loc in probed] == ["http://127.0.0.1:9023"]


# --- credentials forwarded to the workers --------------------------------------------------------


def _launch_env(tmp_path, sections: dict, **settings) -> dict[str, str]:
    """The env of the LaunchRequest a reconciler tick hands the backend for this job."""
    from service.store import Stores, migrate

    store_url = f"sqlite:///{tmp_path / 'etrain.db'}"
    migrate(store_url)
    stores = Stores.open(store_url)
    try:
        spec = parse_spec({"name": "s3-job", **sections})
        tenant = stores.tokens.create_tenant("acme").id
        stores.jobs.create_job(
            tenant_id=tenant, name="s3-job", spec=spec, min_workers=spec.resources.min_workers
        )
        backend = FakeBackend(cpus=4)
        Reconciler(
            stores, backend, Settings(env="development", data_dir=tmp_path, **settings).reconciler
        ).tick()
        (req,) = backend.submitted
        return req.env
    finally:
        stores.close()


AWS = {
    "AWS_ACCESS_KEY_ID": "AKIAFORWARDED0000001",
    "AWS_SECRET_ACCESS_KEY": "fwd-secret",
    "AWS_SESSION_TOKEN": "fwd-token",
}
NAMED = {
    "ETRAIN_SECRET_MINIO_ACCESS_KEY_ID": "AKIANAMED00000000001",
    "ETRAIN_SECRET_MINIO_SECRET_ACCESS_KEY": "named-secret",
}
OTHER = {"ETRAIN_SECRET_OTHER_ACCESS_KEY_ID": "x", "ETRAIN_SECRET_OTHER_SECRET_ACCESS_KEY": "y"}
S3 = {
    "checkpoint": {"storage": "s3://bucket-a/jobs"},
    "stores": {"s3": {"endpoint_url": "http://minio:9000"}},
}


@pytest.mark.parametrize(
    ("sections", "settings", "expected"),
    [
        (S3, {}, AWS),
        ({**S3, "stores": {"s3": {"credentials_secret": "minio"}}}, {}, NAMED),
        ({"checkpoint": {"storage": "file:///shared/ckpt"}}, {}, {}),
        ({"checkpoint": {"storage": "gs://bucket-a/jobs"}}, {}, {}),
        (S3, {"backend": "kuberay"}, {}),  # pods read the etrain-storage Secret themselves
        # Only the evaluation source is on S3: its store's keys go, as data.path's would.
        (
            {
                "data": {"eval": {"source": "jsonl", "path": "s3://bucket-a/eval.jsonl"}},
                "stores": {"s3": {"credentials_secret": "minio"}},
            },
            {},
            NAMED,
        ),
        ({"data": {"eval": {"source": "jsonl", "path": "s3://bucket-a/eval.jsonl"}}}, {}, AWS),
    ],
    ids=["aws-env", "named-secret", "file", "gs", "kuberay", "eval-named-secret", "eval-aws"],
)
def test_launch_env_carries_only_the_credentials_the_storage_needs(
    tmp_path, monkeypatch, sections, settings, expected
):
    for name, value in {**AWS, **NAMED, **OTHER}.items():
        monkeypatch.setenv(name, value)
    env = _launch_env(tmp_path, sections, **settings)
    forwarded = {k: v for k, v in env.items() if k.startswith(("AWS_", "ETRAIN_SECRET_"))}
    assert forwarded == expected
    assert env["ETRAIN_REPORT_TOKEN"]  # the rest of the launch env is unchanged


def test_storage_launch_env_reads_the_stored_section():
    env = {**AWS, **NAMED}

    def launch_env(**sections) -> dict[str, str]:
        return storage_launch_env(parse_spec({"name": "j", **sections}), env=env)

    assert launch_env(checkpoint={"storage": "s3://bkt/p"}) == AWS
    assert launch_env() == {}
    assert launch_env(checkpoint={"storage": "gs://bkt/p"}) == {}
