"""`etrain export` through CliRunner against the real FastAPI app (TestClient bridged into httpx)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from rich.console import Console
from safetensors.torch import load_file
from typer.testing import CliRunner

from fakes import FakeBackend
from service import cli
from service.api.app import create_app
from service.auth import create_reporter_token
from service.settings import Settings
from workers.spec import JobSpec
from workers.train_loop import RunEnv, run

ADMIN = "et_admin-token-for-the-export-tests-0123456789"
SPEC = {"name": "tiny", "resources": {"workers": 1}, "train": {"steps": 4}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A gpt-tiny run with committed checkpoints at steps 2 and 4; (root, final model)."""
    root = tmp_path_factory.mktemp("ckpts")
    spec = JobSpec.model_validate({
        "name": "export", "data": {"seq_len": 16, "num_samples": 64},
        "resources": {"workers": 1},
        "train": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 2},
        "checkpoint": {"every_steps": 2},
    })
    result = run(spec, RunEnv(rank=0, world_size=1, device=torch.device("cpu"),
                              checkpoint_root=str(root)))
    return root, result.model


@pytest.fixture
def api(tmp_path, monkeypatch):
    """The real app on SQLite; the CLI's requests go to it in-process."""
    settings = Settings(env="development", data_dir=tmp_path, admin_token=ADMIN,
                        database_url=f"sqlite:///{tmp_path / 'etrain.db'}")
    app = create_app(settings, backend=FakeBackend(), reconcile=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        def forward(request: httpx.Request) -> httpx.Response:
            reply = client.request(request.method, request.url.path, params=request.url.params,
                                   content=request.content, headers=dict(request.headers))
            return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)

        monkeypatch.setattr(cli, "_transport", lambda: httpx.MockTransport(forward))
        monkeypatch.setattr(cli, "console", Console(width=300, highlight=False))
        monkeypatch.setattr(cli, "err_console", Console(width=300, stderr=True, highlight=False))
        yield client


def submit(api: TestClient, uris: dict[int, str]) -> str:
    """A job whose workers reported checkpoints at ``uris`` (step -> uri)."""
    job = api.post("/v1/jobs", json=SPEC).json()
    store = api.app.state.runtime.store
    token = create_reporter_token(store, tenant_id=store.get_job(job["id"]).tenant_id,
                                  job_id=job["id"])
    items = [{"step": s, "uri": u, "bytes": 1, "save_s": 0.1} for s, u in uris.items()]
    r = api.post(f"/v1/jobs/{job['id']}/telemetry", json={"checkpoints": items},
                 headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return job["id"]


def etrain(*args: str):
    result = CliRunner().invoke(cli.app, list(args),
                                env={"ETRAIN_TOKEN": ADMIN, "ETRAIN_URL": "http://etrain.test"})
    assert ADMIN not in result.output
    return result


def real_uris(root) -> dict[int, str]:
    return {s: f"file://{root / f'step_{s:08d}'}" for s in (2, 4)}


def test_export_newest_checkpoint(api, checkpoints, tmp_path):
    root, final = checkpoints
    job_id = submit(api, real_uris(root))
    result = etrain("export", job_id, "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert f"exported job {job_id} step 4 (gpt-tiny" in result.stdout
    state = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(state[k], v) for k, v in final.state_dict().items())
    info = json.loads((tmp_path / "out" / "etrain_export.json").read_text())
    assert (info["job_id"], info["step"], info["source_uri"]) == (job_id, 4, real_uris(root)[4])


def test_export_a_given_step_with_options_into_the_default_folder(api, checkpoints, tmp_path,
                                                                  monkeypatch):
    root, _ = checkpoints
    job_id = submit(api, real_uris(root))
    monkeypatch.chdir(tmp_path)
    result = etrain("export", job_id, "--step", "2", "--format", "safetensors",
                    "--dtype", "bf16", "--naming", "hf")
    assert result.exit_code == 0, result.output
    out = tmp_path / f"{job_id}-step2"
    assert json.loads((out / "etrain_export.json").read_text())["step"] == 2
    state = load_file(out / "model.safetensors")
    assert state["lm_head.weight"].dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_a_missing_step_lists_the_available_ones(api, checkpoints):
    job_id = submit(api, real_uris(checkpoints[0]))
    result = etrain("export", job_id, "--step", "3")
    assert result.exit_code == 2
    assert (f"job {job_id} has no checkpoint at step 3; available steps: 2, 4 "
            "(pass one with --step)") in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("uris", "message"), [
    ({}, "has no committed checkpoints yet"),
    ({6: "s3://bucket/jobs/j/checkpoints/step_00000006"},
     "export reads the checkpoint storage directly and supports only file:// in this release"),
    ({6: "file:///nowhere/step_00000006"}, "does not exist on this machine"),
])
def test_unexportable_checkpoints_say_why(api, uris, message):
    job_id = submit(api, uris)
    result = etrain("export", job_id)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_unknown_job_and_format(api):
    result = etrain("export", "j-nope")
    assert result.exit_code == 2 and "job j-nope not found" in result.stderr
    result = etrain("export", "j-nope", "--format", "gguf")
    assert result.exit_code == 2 and "gguf" in result.output
