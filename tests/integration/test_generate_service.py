"""Generation for real: POST /v1/jobs/{id}/generate runs `python -m workers.generate` as a
child process of the app (confined to the job's tenant's folders), and `etrain generate`
runs in the CLI's process; both equal transformers' greedy generate on the checkpoint's
export, token for token.

The job's checkpoint is committed in this process the way its workers' checkpoint manager
commits one (a perturbed tiny Llama fine-tuned from a model.hf folder in the tenant's data
area), then reported through the job's telemetry as its workers report it.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service import cli
from service.api.app import create_app
from service.status import JobStatus
from tests.support.api import auth, reporter
from tests.support.cli_bridge import bridge_cli
from tests.support.fakes import ADMIN_H, FakeBackend, dev_settings
from tests.support.generation import perturb, save_checkpoint
from tests.support.hf_fixtures import make_hf_folder
from workers.checkpoint.export import export_checkpoint
from workers.generate import load

pytestmark = pytest.mark.slow

TENANT = "gen"
PROMPT = "Elastic training resumes"
N = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app (real generation), a tenant's token, its SUCCEEDED model.hf job with one
    committed checkpoint (the best), and that checkpoint exported as a Hugging Face folder."""
    tmp = tmp_path_factory.mktemp("gen")
    app = create_app(
        dev_settings(tmp, generate_timeout_s=120), backend=FakeBackend(), reconcile=False
    )
    with TestClient(app) as client:
        r = client.post("/v1/tokens", json={"tenant": TENANT}, headers=ADMIN_H)
        token = r.json()["token"]
        folder = tmp / "tenants" / TENANT / "tiny-llama"
        make_hf_folder(folder, "llama", seed=5)
        spec = {"name": "gen", "model": {"hf": str(folder)}, "resources": {"workers": 1}}
        r = client.post("/v1/jobs", json=spec, headers=auth(token))
        assert r.status_code == 201, r.text
        job = r.json()
        root = f"{job['spec']['checkpoint']['storage']}/{job['id']}/checkpoints"
        tuned = load.model_from_folder(str(folder))
        perturb(tuned, seed=4)
        uri = save_checkpoint(tuned, root.removeprefix("file://"), step=2, extra={})
        assert uri == f"{root}/step_00000002"
        # Step 2 evaluated best; step 8's folder is gone (as if deleted by hand).
        items = [
            {"step": 2, "uri": uri, "bytes": 1, "save_s": 0.1, "eval_loss": 1.0},
            {
                "step": 8,
                "uri": f"{root}/step_00000008",
                "bytes": 1,
                "save_s": 0.1,
                "eval_loss": 2.0,
            },
        ]
        r = client.post(
            f"/v1/jobs/{job['id']}/telemetry",
            headers=reporter(client, job["id"]),
            json={"checkpoints": items},
        )
        assert r.status_code == 200, r.text
        client.app.state.runtime.stores.jobs.update_job(job["id"], status=JobStatus.SUCCEEDED)
        export_checkpoint(uri, tmp / "exported", hf=str(folder))
        yield {"client": client, "token": token, "job": job, "exported": tmp / "exported"}


def transformers_greedy(folder, text: str, n: int = N) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([tok(text)["input_ids"]])
    out = model.eval().generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
    )
    return out[0, ids.shape[1] :].tolist()


def test_the_route_generates_in_a_child_process(served):
    client, job = served["client"], served["job"]
    body = {"prompt": PROMPT, "max_new_tokens": N}
    r = client.post(f"/v1/jobs/{job['id']}/generate", json=body, headers=auth(served["token"]))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["step"] == 2 and answer["stop_reason"] in {"max_new_tokens", "eos"}
    assert answer["tokens"] == transformers_greedy(served["exported"], PROMPT)
    tok = transformers.AutoTokenizer.from_pretrained(served["exported"])
    assert answer["text"] == tok.decode(answer["tokens"], skip_special_tokens=True)

    sampled = {**body, "top_p": 0.8, "temperature": 1.3, "seed": 9}
    a, b = (
        client.post(f"/v1/jobs/{job['id']}/generate", json=sampled, headers=ADMIN_H).json()
        for _ in range(2)
    )
    assert a["tokens"] == b["tokens"] and a["seed"] == 9 and len(a["tokens"]) <= N


def test_a_checkpoint_gone_from_storage_is_a_409(served):
    client, job = served["client"], served["job"]
    body = {"prompt": PROMPT, "max_new_tokens": 2, "step": 8}
    r = client.post(f"/v1/jobs/{job['id']}/generate", json=body, headers=ADMIN_H)
    assert r.status_code == 409, r.text
    assert "step_00000008" in r.json()["detail"] and "does not exist" in r.json()["detail"]


@pytest.fixture
def bridged(served, monkeypatch):
    """The CLI's requests go to the served app in-process."""
    bridge_cli(monkeypatch, served["client"])
    return served


def etrain(served, *args: str):
    env = {"ETRAIN_TOKEN": served["token"], "ETRAIN_URL": "http://etrain.test"}
    return CliRunner().invoke(cli.app, list(args), env=env)


def test_the_cli_generates_from_the_job_and_from_a_folder(bridged):
    job_id, want = bridged["job"]["id"], transformers_greedy(bridged["exported"], PROMPT)
    result = etrain(bridged, "generate", job_id, "--prompt", PROMPT, "--max-new-tokens", str(N))
    assert result.exit_code == 0, result.output
    tok = transformers.AutoTokenizer.from_pretrained(bridged["exported"])
    assert result.stdout.strip() == tok.decode(want, skip_special_tokens=True).strip()
    assert f"tokens from job {job_id} step 2" in result.stderr
    as_json = etrain(
        bridged, "generate", job_id, "--prompt", PROMPT, "--max-new-tokens", "6", "--json"
    )
    assert json.loads(as_json.stdout)["tokens"] == want
    folder = etrain(
        bridged,
        "generate",
        "--model",
        str(bridged["exported"]),
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        str(N),
        "--json",
    )
    assert folder.exit_code == 0, folder.output
    assert json.loads(folder.stdout)["tokens"] == want


def test_the_cli_says_what_to_change(bridged):
    job_id = bridged["job"]["id"]
    missing = etrain(bridged, "generate", job_id, "--prompt", "x", "--step", "3")
    assert missing.exit_code == 2 and "available steps: 2, 8" in missing.stderr
    gone = etrain(bridged, "generate", job_id, "--prompt", "x", "--step", "8")
    assert gone.exit_code == 2 and "step_00000008" in gone.stderr
    both = etrain(bridged, "generate", job_id, "--model", "/m", "--prompt", "x")
    assert both.exit_code == 2 and "a job id or --model DIR" in both.stderr
    mixed = etrain(bridged, "generate", job_id, "--prompt", "x", "--greedy", "--top-p", "0.5")
    assert mixed.exit_code == 2 and "greedy decoding takes no top_p" in mixed.stderr
    assert "Traceback" not in mixed.output
