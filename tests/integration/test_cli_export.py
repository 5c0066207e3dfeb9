"""`etrain export` through CliRunner against the real FastAPI app (TestClient bridged into httpx).

The checkpoints live in a local folder or on S3 (moto's server on loopback); the
CLI reads them where they are, with the credentials of its own environment.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file
from typer.testing import CliRunner

from service import cli
from service.api.app import create_app
from service.auth import create_reporter_token
from service.cli.export import job_checkpoint_section, job_stores_section
from service.settings import Settings
from tests.support.cli_bridge import bridge_cli
from tests.support.fakes import FakeBackend
from workers.checkpoint.export import ExportError, open_checkpoint_dir
from workers.checkpoint.manager import CheckpointManager
from workers.spec import JobSpec
from workers.storage.location import locate, resolve_storage, resolve_store
from workers.train_loop import RunEnv, run

ADMIN = "et_admin-token-for-the-export-tests-0123456789"
SPEC = {"name": "tiny", "resources": {"workers": 1}, "train": {"steps": 4}}


@dataclass(frozen=True)
class Checkpoints:
    """A gpt-tiny run's committed checkpoints (steps 2 and 4) on one store, and its final model."""

    sections: dict  # the job spec's checkpoint (its storage) and stores sections
    uris: dict[int, str]  # step -> URI, as the workers report them
    final: torch.nn.Module


@pytest.fixture(scope="module", params=["file", "s3"])
def checkpoints(request, tmp_path_factory):
    """Each store; S3's credentials are in os.environ while the module's tests use it (the
    service probes the bucket at submit, the CLI reads it)."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "file":
            sections = {"checkpoint": {"storage": f"file://{tmp_path_factory.mktemp('ckpts')}"}}
            endpoint = None
        else:
            s3 = request.getfixturevalue("s3_server")
            for key, value in s3["env"].items():
                mp.setenv(key, value)
            endpoint = s3["endpoint_url"]
            sections = {
                "checkpoint": {"storage": f"s3://{s3['bucket']}/cli-{uuid.uuid4().hex[:8]}"},
                "stores": {"s3": {"endpoint_url": endpoint}},
            }
        spec = JobSpec.model_validate(
            {
                "name": "export",
                "data": {"seq_len": 16, "num_samples": 64},
                "resources": {"workers": 1},
                "train": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 2},
                **sections,
                "checkpoint": {"every_steps": 2, **sections["checkpoint"]},
            }
        )
        root = f"{sections['checkpoint']['storage']}/j-trained/checkpoints"
        result = run(
            spec,
            RunEnv(
                rank=0,
                world_size=1,
                device=torch.device("cpu"),
                checkpoints=locate(root, spec.stores),
            ),
        )
        listed = CheckpointManager(
            resolve_storage(root, endpoint_url=endpoint), keep_last=None, rank=0
        ).committed()
        yield Checkpoints(sections, {c.step: c.uri for c in listed}, result.model)


@pytest.fixture
def api(tmp_path, monkeypatch):
    """The real app on SQLite; the CLI's requests go to it in-process."""
    settings = Settings(
        env="development",
        data_dir=tmp_path,
        admin_token=ADMIN,
        database_url=f"sqlite:///{tmp_path / 'etrain.db'}",
    )
    app = create_app(settings, backend=FakeBackend(), reconcile=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        bridge_cli(monkeypatch, client)
        yield client


def submit(api: TestClient, uris: dict[int, str], sections: dict | None = None) -> str:
    """A job (with spec ``sections``) whose workers reported checkpoints at ``uris``."""
    spec = {**SPEC, **(sections or {})}
    reply = api.post("/v1/jobs", json=spec)
    assert reply.status_code == 201, reply.text
    job = reply.json()
    stores = api.app.state.runtime.stores
    token = create_reporter_token(
        stores.tokens, tenant_id=stores.jobs.get_job(job["id"]).tenant_id, job_id=job["id"]
    )
    items = [{"step": s, "uri": u, "bytes": 1, "save_s": 0.1} for s, u in uris.items()]
    r = api.post(
        f"/v1/jobs/{job['id']}/telemetry",
        json={"checkpoints": items},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 200, r.text
    return job["id"]


def etrain(*args: str):
    result = CliRunner().invoke(
        cli.app, list(args), env={"ETRAIN_TOKEN": ADMIN, "ETRAIN_URL": "http://etrain.test"}
    )
    assert ADMIN not in result.output
    return result


def test_export_newest_checkpoint(api, checkpoints, tmp_path):
    job_id = submit(api, checkpoints.uris, checkpoints.sections)
    result = etrain("export", job_id, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert f"exported job {job_id} step 4 (gpt-tiny" in result.stdout
    state = load_file(tmp_path / "out" / "model.safetensors")
    assert state.keys() == checkpoints.final.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in checkpoints.final.state_dict().items())
    info = json.loads((tmp_path / "out" / "etrain_export.json").read_text())
    assert (info["job_id"], info["step"], info["source_uri"]) == (job_id, 4, checkpoints.uris[4])


def test_export_a_given_step_with_options_into_the_default_folder(
    api, checkpoints, tmp_path, monkeypatch
):
    job_id = submit(api, checkpoints.uris, checkpoints.sections)
    monkeypatch.chdir(tmp_path)
    result = etrain(
        "export",
        job_id,
        "--step",
        "2",
        "--format",
        "safetensors",
        "--dtype",
        "bf16",
        "--naming",
        "hf",
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / f"{job_id}-step2"
    assert json.loads((out / "etrain_export.json").read_text())["step"] == 2
    state = load_file(out / "model.safetensors")
    assert state["lm_head.weight"].dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_a_missing_step_lists_the_available_ones(api, checkpoints):
    job_id = submit(api, checkpoints.uris, checkpoints.sections)
    result = etrain("export", job_id, "--step", "3")
    assert result.exit_code == 2
    assert (
        f"job {job_id} has no checkpoint at step 3; available steps: 2, 4 (pass one with --step)"
    ) in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("uris", "message"),
    [
        ({}, "has no committed checkpoints yet"),
        (
            {6: "s3://bucket/jobs/j/checkpoints/step_00000006.0123abcd"},
            "is not under the job's checkpoint.storage",
        ),
        ({6: "file:///nowhere/step_00000006"}, "does not exist on this machine"),
    ],
)
def test_unexportable_checkpoints_say_why(api, uris, message):
    job_id = submit(api, uris)
    result = etrain("export", job_id)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


@pytest.fixture
def s3_job(api, s3_server, monkeypatch):
    """A job on S3 (the service's probe at submit passes) that reported a step that is not
    there (never committed, or deleted since); (job id, the step's uri, the S3 variables)."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    storage = f"s3://{s3_server['bucket']}/cli-{uuid.uuid4().hex[:8]}"
    uri = f"{storage}/j-gone/checkpoints/step_00000006.0123abcd"
    sections = {
        "checkpoint": {"storage": storage},
        "stores": {"s3": {"endpoint_url": s3_server["endpoint_url"]}},
    }
    job_id = submit(api, {6: uri}, sections)
    return job_id, uri, s3_server["env"]


def test_an_s3_step_that_is_not_there_says_so(s3_job):
    job_id, uri, _ = s3_job
    result = etrain("export", job_id)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{uri} is not a committed checkpoint" in result.stderr


def test_refused_s3_credentials_name_the_fix_never_the_secret(s3_job):
    job_id, _, env = s3_job
    wrong = "wrong-" + env["AWS_SECRET_ACCESS_KEY"][6:]
    result = CliRunner().invoke(
        cli.app,
        ["export", job_id],
        env={
            "ETRAIN_TOKEN": ADMIN,
            "ETRAIN_URL": "http://etrain.test",
            "AWS_SECRET_ACCESS_KEY": wrong,
        },
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    stderr = " ".join(result.stderr.split())  # the console wraps long lines
    assert "refused the credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in stderr
    assert "set credentials that may read (get, list) the job's checkpoint.storage" in stderr
    assert not any(v in result.output for v in (wrong, env["AWS_SECRET_ACCESS_KEY"], ADMIN))


S3_OPTIONS = {
    "endpoint_url": "http://minio:9000",
    "region": "eu-west-1",
    "credentials_secret": "team-a",
}
S3_JOB = {
    "id": "j-1",
    "spec": {"checkpoint": {"storage": "s3://bkt/jobs"}, "stores": {"s3": S3_OPTIONS}},
}
GS_JOB = {
    "id": "j-2",
    "spec": {
        "checkpoint": {"storage": "gs://bkt/jobs"},
        "stores": {"gcs": {"endpoint_url": "http://fake-gcs:4443"}},
    },
}
# As a service older than the stores section answers: the options under checkpoint.
OLD_S3_JOB = {"id": "j-1", "spec": {"checkpoint": {"storage": "s3://bkt/jobs", "s3": S3_OPTIONS}}}


TEAM_A = {
    "ETRAIN_SECRET_TEAM_A_ACCESS_KEY_ID": "AKIAEXAMPLE0000000001",
    "ETRAIN_SECRET_TEAM_A_SECRET_ACCESS_KEY": "example-secret-0001",
}


@pytest.mark.parametrize(
    ("job", "uri", "endpoint", "region"),
    [
        (S3_JOB, "s3://bkt/jobs/j-1/checkpoints", "http://minio:9000", "eu-west-1"),
        (OLD_S3_JOB, "s3://bkt/jobs/j-1/checkpoints", "http://minio:9000", "eu-west-1"),
        (GS_JOB, "gs://bkt/jobs/j-2/checkpoints", "http://fake-gcs:4443", None),
        (
            {"id": "j-3", "spec": {"checkpoint": {"storage": "gs://bkt/jobs"}}},
            "gs://bkt/jobs/j-3/checkpoints",
            None,
            None,
        ),
    ],
)
def test_the_store_is_reached_as_the_job_spec_says(job, uri, endpoint, region):
    assert job_checkpoint_section(job).storage == job["spec"]["checkpoint"]["storage"]
    loc = resolve_store(
        uri,
        job_stores_section(job),
        env={**TEAM_A, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"},
    )
    assert (loc.uri, loc.endpoint_url) == (uri, endpoint)
    assert loc.options.get("client_kwargs", {}).get("region_name") == region
    if uri.startswith("s3://"):
        assert "'team-a'" in loc.credentials_source
        assert loc.options["key"] == TEAM_A["ETRAIN_SECRET_TEAM_A_ACCESS_KEY_ID"]


@pytest.mark.parametrize(
    "uri",
    [
        "s3://other/jobs/j-1/checkpoints/step_00000004.0123abcd",
        "s3://bkt/jobs-x/step_00000004.0123abcd",
        "gs://bkt/jobs/j-1/checkpoints/step_00000004.0123abcd",
    ],
)
def test_object_store_checkpoints_outside_the_job_storage_are_refused(uri):
    with pytest.raises(ExportError, match=re.escape("is not under the job's checkpoint.storage")):
        open_checkpoint_dir(
            uri,
            checkpoint=job_checkpoint_section(S3_JOB),
            stores=job_stores_section(S3_JOB),
            env=TEAM_A,
        )


def test_unknown_job_and_format(api):
    result = etrain("export", "j-nope")
    assert result.exit_code == 2 and "job j-nope not found" in result.stderr
    result = etrain("export", "j-nope", "--format", "gguf")
    assert result.exit_code == 2 and "gguf" in result.output
