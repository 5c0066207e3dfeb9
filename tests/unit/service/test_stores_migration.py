"""Migration 0003: specs stored with checkpoint.s3 / checkpoint.gcs get them in ``stores``."""

from __future__ import annotations

import datetime as dt

from alembic import command

from service.store import Stores, migrate
from service.store.migrate import build_alembic_config
from tests.support.old_database import database_at, job_row, stored_specs

NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
S3 = {"endpoint_url": "http://minio:9000", "region": "us-east-1", "credentials_secret": "acme"}


def _job(job_id: str, checkpoint: dict, **sections) -> dict:
    spec = {"name": job_id, "resources": {"workers": 2}, "checkpoint": checkpoint, **sections}
    return job_row(job_id, spec, status="SUCCEEDED", min_workers=2, at=NOW)


def test_old_store_options_move_into_the_stores_section(tmp_path):
    url = database_at(
        tmp_path,
        "0002",
        [
            # As 0002's release stored it: both keys, the unused one null.
            _job("j-s3", {"storage": "s3://bkt/ckpt", "s3": S3, "gcs": None}),
            _job(
                "j-gcs",
                {"storage": "gs://bkt/ckpt", "gcs": {"endpoint_url": "http://gcs:9023"}},
                model={"hf": "gs://bkt/models/m", "preset": "gpt-tiny"},
            ),
            _job("j-local", {"storage": "file:///data/ckpt", "s3": None, "gcs": None}),
            _job("j-bare", {"storage": "file:///data/ckpt"}),
        ],
        at=NOW,
    )
    migrate(url)
    raw = stored_specs(url)
    assert raw["j-s3"]["stores"] == {"s3": S3, "gcs": None}
    assert "s3" not in raw["j-s3"]["checkpoint"] and "gcs" not in raw["j-s3"]["checkpoint"]
    assert raw["j-gcs"]["stores"]["gcs"] == {"endpoint_url": "http://gcs:9023"}
    assert raw["j-local"]["stores"] == {"s3": None, "gcs": None}
    assert "stores" not in raw["j-bare"]  # nothing to move: the default applies
    stores = Stores.open(url)
    try:
        s3 = stores.jobs.get_job("j-s3").spec
        assert s3.stores.s3.endpoint_url == "http://minio:9000"
        assert s3.stores.s3.credentials_secret == "acme" and s3.stores.s3.region == "us-east-1"
        assert s3.checkpoint.storage == "s3://bkt/ckpt"
        gcs = stores.jobs.get_job("j-gcs").spec
        assert gcs.stores.gcs.endpoint_url == "http://gcs:9023" and gcs.stores.s3 is None
        assert stores.jobs.get_job("j-local").spec.stores.s3 is None
        assert stores.jobs.get_job("j-bare").spec.stores.gcs is None
    finally:
        stores.close()


def test_downgrade_moves_them_back(tmp_path):
    job = _job("j-s3", {"storage": "s3://bkt/ckpt"}, stores={"s3": S3, "gcs": None})
    url = database_at(tmp_path, "head", [job], at=NOW)
    command.downgrade(build_alembic_config(url), "0002")
    spec = stored_specs(url)["j-s3"]
    assert "stores" not in spec
    assert spec["checkpoint"] == {"storage": "s3://bkt/ckpt", "s3": S3, "gcs": None}
