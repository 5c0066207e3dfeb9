"""Checkpoint storage without a store: URIs to file systems, credentials from the
environment, and local paths (tests/integration/test_object_storage.py reaches real S3
and GCS endpoints)."""

from __future__ import annotations

import json
import pickle

import pytest

from tests.support.storage_checks import AWS, KEY, NAMED, SECRET, TOKEN, no_secrets, round_trip
from workers.spec import StoresSpec
from workers.storage.location import (
    StorageError,
    credential_env,
    locate,
    resolve_storage,
    resolve_store,
    secret_env_names,
    store_options,
    stores_for,
)
from workers.storage.probe import check_storage

# --- resolving URIs -----------------------------------------------------------------------


def test_file_uri_is_a_local_path():
    loc = resolve_storage("file:///data/ckpt/", env={})
    assert (loc.scheme, loc.root, loc.uri) == ("file", "/data/ckpt", "file:///data/ckpt")
    assert "file" in loc.fs.protocol
    assert loc.join("job-1", "/checkpoints/") == "/data/ckpt/job-1/checkpoints"
    assert loc.uri_of("job-1") == "file:///data/ckpt/job-1"
    assert loc.ray_storage() == ("/data/ckpt", None)
    assert type(loc.pyarrow_fs()).__name__ == "LocalFileSystem"


def test_s3_uri_with_endpoint_region_and_aws_env():
    import pyarrow.fs as pafs
    import s3fs

    loc = resolve_storage(
        "s3://my-bucket/runs/",
        endpoint_url="http://127.0.0.1:9000",
        region="eu-west-1",
        env={**AWS, "AWS_SESSION_TOKEN": TOKEN},
    )
    assert (loc.scheme, loc.root, loc.uri) == ("s3", "my-bucket/runs", "s3://my-bucket/runs")
    assert isinstance(loc.fs, s3fs.S3FileSystem)
    assert loc.options["key"] == KEY and loc.options["secret"] == SECRET
    assert loc.options["token"] == TOKEN
    assert loc.options["client_kwargs"] == {
        "endpoint_url": "http://127.0.0.1:9000",
        "region_name": "eu-west-1",
    }
    assert loc.join("j-1", "checkpoints") == "my-bucket/runs/j-1/checkpoints"
    assert loc.uri_of("j-1") == "s3://my-bucket/runs/j-1"
    path, fs = loc.ray_storage()
    assert path == "my-bucket/runs" and isinstance(fs, pafs.S3FileSystem)
    assert fs.region == "eu-west-1"
    assert loc.credentials_source == "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
    no_secrets(repr(loc) + str(loc))


def test_s3_bucket_without_prefix_and_without_keys_uses_the_default_chain():
    loc = resolve_storage("s3://my-bucket", env={})
    assert loc.root == "my-bucket" and loc.join("a") == "my-bucket/a"
    assert "key" not in loc.options and "client_kwargs" not in loc.options
    assert loc.credentials_source == "the default AWS credential chain"


def test_s3_named_secret_reads_etrain_secret_variables():
    loc = resolve_storage(
        "s3://my-bucket/p",
        credentials_secret="minio-store",
        env={**NAMED, "AWS_ACCESS_KEY_ID": "OTHER", "AWS_SECRET_ACCESS_KEY": "x"},
    )
    assert (loc.options["key"], loc.options["secret"], loc.options["token"]) == (KEY, SECRET, TOKEN)
    assert "minio-store" in loc.credentials_source
    no_secrets(loc.credentials_source + repr(loc))


def test_missing_named_secret_names_the_field_and_the_variables():
    with pytest.raises(StorageError) as info:
        resolve_storage(
            "s3://my-bucket/p",
            credentials_secret="minio-store",
            env={"ETRAIN_SECRET_MINIO_STORE_ACCESS_KEY_ID": KEY},
        )
    msg = str(info.value)
    assert "stores.s3.credentials_secret" in msg
    assert "ETRAIN_SECRET_MINIO_STORE_SECRET_ACCESS_KEY" in msg
    assert "ETRAIN_SECRET_MINIO_STORE_ACCESS_KEY_ID" in msg
    no_secrets(msg)


def test_gs_uri_uses_gcsfs_with_the_credentials_file(tmp_path):
    import gcsfs

    # An authorized-user file: gcsfs builds credentials from it without any request.
    creds = tmp_path / "adc.json"
    creds.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "id",
                "client_secret": "cs",
                "refresh_token": "rt",
            }
        )
    )
    loc = resolve_storage("gs://my-bucket/runs", env={"GOOGLE_APPLICATION_CREDENTIALS": str(creds)})
    assert (loc.scheme, loc.root, loc.uri) == ("gs", "my-bucket/runs", "gs://my-bucket/runs")
    assert isinstance(loc.fs, gcsfs.GCSFileSystem)
    assert loc.uri_of("j") == "gs://my-bucket/runs/j"
    assert loc.credentials_source == "GOOGLE_APPLICATION_CREDENTIALS"


def _gs_pyarrow_options(loc) -> dict:
    return loc.pyarrow_fs().__reduce__()[1][0]


@pytest.mark.parametrize(
    ("kwargs", "env", "endpoint"),
    [
        ({"endpoint_url": "http://127.0.0.1:9023"}, {}, "http://127.0.0.1:9023"),
        ({}, {"STORAGE_EMULATOR_HOST": "127.0.0.1:9023"}, "http://127.0.0.1:9023"),
        (
            {"endpoint_url": "http://gcs:1"},
            {"STORAGE_EMULATOR_HOST": "http://other:2/"},
            "http://gcs:1",
        ),
    ],
    ids=["field", "emulator-host-variable", "field-wins"],
)
def test_gs_plain_http_endpoint_is_anonymous_in_both_file_systems(tmp_path, kwargs, env, endpoint):
    creds = tmp_path / "never-sent.json"
    loc = resolve_storage(
        "gs://my-bucket/runs", **kwargs, env={**env, "GOOGLE_APPLICATION_CREDENTIALS": str(creds)}
    )
    assert loc.endpoint_url == endpoint
    assert loc.options == {"endpoint_url": endpoint, "token": "anon"}
    assert "anonymous" in loc.credentials_source
    pa = _gs_pyarrow_options(loc)
    assert (pa["scheme"], pa["endpoint_override"], pa["anonymous"]) == (
        "http",
        endpoint.split("://")[1],
        True,
    )


def test_gs_https_endpoint_keeps_the_google_credentials(tmp_path, monkeypatch):
    creds = tmp_path / "adc.json"
    creds.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "id",
                "client_secret": "cs",
                "refresh_token": "rt",
            }
        )
    )
    # pyarrow reads the file itself (without it, Google's chain probes a metadata server).
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    loc = resolve_storage("gs://my-bucket", endpoint_url="https://storage.example.com")
    assert loc.options == {"endpoint_url": "https://storage.example.com", "token": str(creds)}
    assert loc.credentials_source == "GOOGLE_APPLICATION_CREDENTIALS"
    pa = _gs_pyarrow_options(loc)
    assert (pa["scheme"], pa["endpoint_override"], pa["anonymous"]) == (
        "https",
        "storage.example.com",
        False,
    )
    plain = resolve_storage("gs://my-bucket", env={"STORAGE_EMULATOR_HOST": "default"})
    assert plain.endpoint_url is None and plain.options == {}


def test_gs_plain_http_endpoint_needs_gcsfs_without_its_grpc_lookup(monkeypatch):
    import fsspec
    from gcsfs.extended_gcsfs import ExtendedGcsFileSystem

    monkeypatch.setattr(fsspec, "get_filesystem_class", lambda _: ExtendedGcsFileSystem)
    with pytest.raises(StorageError, match="GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false"):
        resolve_storage("gs://my-bucket", endpoint_url="http://127.0.0.1:9023", env={})


@pytest.mark.parametrize(
    ("uri", "kwargs", "needle"),
    [
        ("http://host/x", {}, "checkpoint.storage"),
        ("ftp://host/x", {}, "s3://bucket"),
        ("file://relative/x", {}, "absolute"),
        ("s3://", {}, "s3://bucket"),
        (f"s3://{KEY}:{SECRET}@bucket/p", {}, "no credentials"),
        ("gs://bucket/p", {"region": "us-east-1"}, "stores.s3"),
        ("file:///x", {"endpoint_url": "http://127.0.0.1:9023"}, "stores.gcs"),
        ("file:///x", {"credentials_secret": "minio"}, "stores.s3"),
        ("s3://bucket/p", {"env": {"AWS_ACCESS_KEY_ID": KEY}}, "AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_unusable_uris_and_settings_are_refused_clearly(uri, kwargs, needle):
    kwargs.setdefault("env", {})
    with pytest.raises(StorageError) as info:
        resolve_storage(uri, **kwargs)
    assert needle in str(info.value)
    no_secrets(str(info.value))


def test_resolve_store_takes_the_spec_section():
    stores = StoresSpec.model_validate(
        {
            "s3": {
                "endpoint_url": "http://minio:9000",
                "region": "us-east-1",
                "credentials_secret": "minio-store",
            },
        }
    )
    loc = resolve_store("s3://my-bucket/p", stores, env=NAMED)
    assert loc.endpoint_url == "http://minio:9000" and loc.options["key"] == KEY


def test_a_child_location_keeps_the_store_and_its_options(monkeypatch):
    """A job's checkpoints under its storage: resolved once, handed down as a location
    (never a string parsed back), same file system and credentials."""
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    stores = StoresSpec.model_validate({"s3": {"endpoint_url": "http://minio:9000"}})
    storage = locate("s3://bucket/tenant-a", stores)
    ckpts = storage.child("j-1", "checkpoints")
    assert (ckpts.uri, ckpts.root) == (
        "s3://bucket/tenant-a/j-1/checkpoints",
        "bucket/tenant-a/j-1/checkpoints",
    )
    assert ckpts.fs is storage.fs and ckpts.options == storage.options
    assert ckpts.endpoint_url == "http://minio:9000" and ckpts.options["key"] == KEY
    assert ckpts.child("tensorboard").uri == "s3://bucket/tenant-a/j-1/checkpoints/tensorboard"
    no_secrets(repr(ckpts))


def test_locate_takes_a_local_path_or_a_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert locate("runs/a").uri == f"file://{tmp_path}/runs/a"
    assert locate(tmp_path / "b").root == str(tmp_path / "b")
    assert locate("file:///x/../y").root == "/y"


def test_the_uri_scheme_selects_the_store_options():
    stores = StoresSpec.model_validate(
        {
            "s3": {"endpoint_url": "http://minio:9000", "credentials_secret": "minio-store"},
            "gcs": {"endpoint_url": "http://127.0.0.1:9023/"},
        }
    )
    run_dir = resolve_store("gs://my-bucket/p/j-1/checkpoints", stores, env={})
    assert run_dir.endpoint_url == "http://127.0.0.1:9023" and run_dir.root.endswith(
        "/j-1/checkpoints"
    )
    local = stores_for(stores)("file:///tmp/run")
    assert local.scheme == "file" and local.endpoint_url is None
    assert store_options(stores, "s3")["credentials_secret"] == "minio-store"
    assert store_options(stores, "gs") == {
        "endpoint_url": "http://127.0.0.1:9023",
        "region": None,
        "credentials_secret": None,
    }
    assert set(store_options(stores, "file").values()) == {None}
    assert set(store_options(None, "s3").values()) == {None}


def test_credential_env_holds_only_what_the_store_needs():
    env = {**AWS, **NAMED, "HOME": "/root", "ETRAIN_SECRET_OTHER_ACCESS_KEY_ID": "x"}
    assert credential_env("s3://b/p", env=env) == AWS
    assert credential_env("s3://b/p", credentials_secret="minio-store", env=env) == NAMED
    assert credential_env("file:///x", env=env) == {}
    assert credential_env("gs://b/p", env=env) == {}
    assert secret_env_names("a-b") == (
        "ETRAIN_SECRET_A_B_ACCESS_KEY_ID",
        "ETRAIN_SECRET_A_B_SECRET_ACCESS_KEY",
        "ETRAIN_SECRET_A_B_SESSION_TOKEN",
    )


def test_locations_and_errors_pickle_for_ray():
    loc = resolve_storage("s3://my-bucket/p", endpoint_url="http://127.0.0.1:9", env=AWS)
    again = pickle.loads(pickle.dumps(loc))
    assert again == loc and again.options == loc.options
    err = pickle.loads(pickle.dumps(StorageError("checkpoint.storage: x")))
    assert isinstance(err, ValueError) and str(err) == "checkpoint.storage: x"


# --- the write probe against real S3 and GCS endpoints ----------------------------------------


def test_check_storage_on_local_paths(tmp_path):
    check_storage(resolve_storage(f"file://{tmp_path}/ckpt", env={}))
    assert (tmp_path / "ckpt").is_dir() and not list((tmp_path / "ckpt").iterdir())
    (tmp_path / "plain-file").write_text("x")
    with pytest.raises(StorageError, match="not writable"):
        check_storage(resolve_storage(f"file://{tmp_path}/plain-file/sub", env={}))


# --- DCP shards streamed to the store ----------------------------------------------------------


def test_dcp_save_and_load_on_local_files(tmp_path):
    from torch.distributed.checkpoint import FileSystemWriter

    loc = resolve_storage(f"file://{tmp_path}", env={})
    writer = round_trip(loc, loc.join("step_1"))
    assert isinstance(writer, FileSystemWriter)
    assert (tmp_path / "step_1" / ".metadata").is_file()
