"""metrics.tensorboard: the service-wide default filled in at submit, and the
`tensorboard --logdir` line `etrain status` prints for a job that writes event files."""

from __future__ import annotations

import pytest

from service.cli.jobs import tensorboard_line
from tests.support.api import api_client, submit
from tests.unit.service.test_cli import make_job, run, server  # noqa: F401 (fixture)
from workers.spec import JobSpec


def _submitted(tmp_path, metrics: dict | None, **settings) -> dict:
    with api_client(tmp_path, **settings) as client:
        job = submit(client, **({"metrics": metrics} if metrics is not None else {}))
    return job["spec"]["metrics"]


def test_spec_leaves_tensorboard_unset():
    assert JobSpec.model_validate({"name": "x"}).metrics.tensorboard is None


@pytest.mark.parametrize(
    ("default", "metrics", "want"),
    [
        (None, None, False),  # off unless the service says otherwise
        (True, None, True),
        (True, {"tensorboard": False}, False),  # the spec wins
        (False, {"tensorboard": True}, True),
    ],
)
def test_submit_fills_the_service_default(tmp_path, default, metrics, want):
    settings = {} if default is None else {"tensorboard_default": default}
    trackers = {"mlflow": None, "wandb": None}  # the other metrics outputs, unset
    assert _submitted(tmp_path, metrics, **settings) == {"tensorboard": want, **trackers}


def test_tensorboard_line_for_any_storage_with_tensorboard_on():
    spec = {"checkpoint": {"storage": "file:///data/ckpts/"}, "metrics": {"tensorboard": True}}
    assert tensorboard_line({"id": "j-1", "spec": spec}) == (
        "tensorboard --logdir /data/ckpts/j-1/checkpoints/tensorboard"
    )
    off = {**spec, "metrics": {"tensorboard": False}}
    assert tensorboard_line({"id": "j-1", "spec": off}) is None
    gcs = {**spec, "checkpoint": {"storage": "gs://bucket/x/"}}
    assert tensorboard_line({"id": "j-1", "spec": gcs}) == (
        "tensorboard --logdir gs://bucket/x/j-1/checkpoints/tensorboard"
    )
    minio = {"checkpoint": {"storage": "s3://b"}, "stores": {"s3": {"endpoint_url": "http://m:9"}}}
    line = "S3_ENDPOINT=http://m:9 tensorboard --logdir s3://b/j-1/checkpoints/tensorboard"
    assert tensorboard_line({"id": "j-1", "spec": {**spec, **minio}}) == line
    old = {"storage": "s3://b", "s3": {"endpoint_url": "http://m:9"}}  # an older service's
    assert tensorboard_line({"id": "j-1", "spec": {**spec, "checkpoint": old}}) == line


def test_status_prints_the_logdir_line(server):  # noqa: F811
    spec = {"checkpoint": {"storage": "file:///srv/ck"}, "metrics": {"tensorboard": True}}
    server.snapshots = [make_job("RUNNING", 2, 3.0, 1, spec={**spec, "train": {"steps": 5}})]
    result = run("status", "j-1")
    assert result.exit_code == 0, result.output
    assert "curves     tensorboard --logdir /srv/ck/j-1/checkpoints/tensorboard" in result.stdout
