"""Checkpoint storage against real S3 and GCS endpoints on loopback: the write probe,
DCP shards streamed to the store, and pyarrow's view of it (what Ray Train uses)."""

from __future__ import annotations

import re
import tempfile

import pytest

from tests.support.storage_checks import AWS, KEY, SECRET, no_secrets, round_trip
from workers.checkpoint.dcp_io import dcp_writer
from workers.storage.location import StorageError, resolve_storage
from workers.storage.probe import check_storage


def _moto(s3_server, uri: str | None = None, **env) -> object:
    return resolve_storage(
        uri or f"s3://{s3_server['bucket']}/probe-tests",
        endpoint_url=s3_server["endpoint_url"],
        region=s3_server["region"],
        env={**s3_server["env"], **env},
    )


def test_check_storage_passes_on_a_writable_bucket_and_cleans_up(object_store):
    loc = object_store.location("probe-tests")
    check_storage(loc)
    loc.fs.invalidate_cache()
    assert not loc.fs.exists(loc.root) or not [
        p for p in loc.fs.ls(loc.root, detail=False) if ".etrain-probe-" in p
    ]


def test_check_storage_refuses_a_missing_bucket(object_store):
    loc = object_store.location("p", bucket="no-such-bucket-here")
    with pytest.raises(StorageError) as info:
        check_storage(loc)
    msg = str(info.value)
    assert f"checkpoint.storage {object_store.scheme}://no-such-bucket-here/p" in msg
    assert "'no-such-bucket-here' does not exist" in msg and object_store.endpoint_url in msg
    field = "stores.s3.endpoint_url" if object_store.scheme == "s3" else "stores.gcs"
    assert field in msg
    no_secrets(msg, *object_store.env.values())


@pytest.mark.parametrize(
    ("env", "code"),
    [
        ({"AWS_ACCESS_KEY_ID": KEY}, "InvalidAccessKeyId"),
        ({"AWS_SECRET_ACCESS_KEY": SECRET}, "SignatureDoesNotMatch"),
    ],
)
def test_check_storage_refuses_wrong_credentials_without_printing_them(s3_server, env, code):
    loc = _moto(s3_server, **env)
    with pytest.raises(StorageError) as info:
        check_storage(loc)
    msg = str(info.value)
    assert "rejected the credentials" in msg and code in msg
    assert "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in msg
    no_secrets(msg, loc.options["key"], loc.options["secret"])
    no_secrets(repr(info.value.__cause__), loc.options["secret"])


def test_check_storage_refuses_an_unreachable_endpoint():
    loc = resolve_storage("s3://some-bucket/p", endpoint_url="http://127.0.0.1:1", env=AWS)
    with pytest.raises(
        StorageError, match=re.escape("cannot reach the store at http://127.0.0.1:1")
    ) as info:
        check_storage(loc, timeout_s=2)
    no_secrets(str(info.value))


def test_dcp_save_and_load_streams_to_the_store_without_a_local_copy(
    object_store, tmp_path, monkeypatch
):
    import pyarrow.fs as pafs

    # Any temporary file DCP or fsspec made would land here.
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    loc = object_store.location("dcp")
    path = loc.join("job-1", "checkpoints", "step_00000007")
    writer = round_trip(loc, path)
    assert type(writer.fs.fs) is type(loc.fs)  # shards went straight to the store
    assert not list(spool.iterdir())

    # Ray Train's view (pyarrow) of the same prefix lists what fsspec wrote.
    fs, root = loc.ray_storage()[1], loc.ray_storage()[0]
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/job-1/checkpoints", recursive=True))
    names = {i.base_name for i in infos if i.type == pafs.FileType.File}
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names)


def test_dcp_writer_accepts_a_uri_of_the_same_scheme_only(object_store):
    loc = object_store.location("dcp-uri")
    round_trip(loc, loc.uri_of("step_1"))
    other = "gs" if object_store.scheme == "s3" else "s3"
    with pytest.raises(StorageError, match=f"{other}://"):
        dcp_writer(loc, f"{other}://other/step_1")


def test_ray_storage_writes_and_reads_through_pyarrow(object_store):
    """Ray Train's RunConfig(storage_path, storage_filesystem) reaches the same objects."""
    import pyarrow.fs as pafs

    loc = object_store.location("pyarrow")
    root, fs = loc.ray_storage()
    assert root == loc.root
    # As Ray does: pyarrow's directories on GCS are marker objects, which its delete_dir
    # deletes last (and fails on, as GCS itself does, when no create_dir made one).
    fs.create_dir(f"{root}/run")
    with fs.open_output_stream(f"{root}/run/report.json") as f:
        f.write(b'{"step": 3}')
    with fs.open_input_stream(f"{root}/run/report.json") as f:
        assert f.read() == b'{"step": 3}'
    loc.fs.invalidate_cache()
    assert loc.fs.cat_file(loc.join("run", "report.json")) == b'{"step": 3}'
    loc.fs.pipe_file(loc.join("run", "from-fsspec"), b"x")
    listed = fs.get_file_info(pafs.FileSelector(f"{root}/run", recursive=True))
    assert {i.base_name for i in listed if i.type == pafs.FileType.File} == {
        "report.json",
        "from-fsspec",
    }
    fs.delete_dir(f"{root}/run")
    loc.fs.invalidate_cache()
    assert not loc.fs.exists(loc.join("run", "report.json"))
