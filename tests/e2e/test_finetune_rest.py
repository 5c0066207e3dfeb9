"""Fine-tune a pretrained Hugging Face model through the REST API of a real `etrain serve`
on real Ray, evaluating a held-out set, keeping the best checkpoint and stopping early;
export the best, load it with transformers: its logits equal etrain's model at that step,
and generating from the job (REST and `etrain generate`) equals its greedy generate.

The tiny Llama and its tokenizer are built in the test (tests/support/hf_fixtures.py) and
put in the tenant's data area, as a user would; etrain's final model is the job's last
checkpoint loaded into etrain's own Transformer in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
import torch.distributed.checkpoint as dcp
import transformers

from tests.e2e.conftest import BIN
from tests.support.hf_fixtures import CORPUS, make_hf_folder
from workers.models.hf_load import hf_model_config
from workers.models.llama import Transformer

pytestmark = pytest.mark.slow

TENANT = "ft-e2e"
STEPS = 8
# Evaluated every 2 steps; an improvement must beat the best by 100, so the second
# evaluation (step 4) ends the job: patience 1.
STOPS_AT = 4
GENERATED = 5  # tokens generated from the best checkpoint


def _spec(folder: Path, corpus: Path) -> dict:
    return {
        "name": "ft-rest",
        "model": {"hf": str(folder)},
        "data": {"source": "text", "path": str(corpus), "seq_len": 16, "eval_fraction": 0.2},
        "resources": {"workers": 2},
        "parallelism": {"strategy": "fsdp"},
        "train": {
            "steps": STEPS,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1e-2,
            "eval_every_steps": 2,
            "early_stopping": {"patience": 1, "min_delta": 100},
        },
        "checkpoint": {"every_steps": 2, "keep_last": 1, "keep_best": 1},
    }


def _etrain_final_model(folder: Path, step_dir: str) -> Transformer:
    """etrain's Transformer with the job's last checkpoint loaded (DCP, this process)."""
    model = Transformer(hf_model_config(str(folder)))
    state = model.state_dict()
    dcp.load({"app": {"model": state}}, checkpoint_id=step_dir)
    model.load_state_dict(state)
    return model.eval()


def test_finetune_export_and_load_with_transformers(served, tmp_path, waiter):
    with served.client() as admin:
        r = admin.post("/v1/tokens", json={"tenant": TENANT})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
    area = served.data_dir / "tenants" / TENANT
    folder = area / "tiny-llama"
    base = make_hf_folder(folder, "llama")
    corpus = area / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 40))

    with served.client(token) as c:
        r = c.post("/v1/jobs", json=_spec(folder, corpus))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        waiter(
            lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] in {"SUCCEEDED", "FAILED"},
            what="fine-tune finished",
            timeout=600,
        )
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "SUCCEEDED", c.get(f"/v1/jobs/{job_id}/logs").text[-3000:]
        events = c.get(f"/v1/jobs/{job_id}/events").json()["items"]
        assert [e["data"]["step"] for e in events if e["kind"] == "early_stopped"] == [STOPS_AT]
        points = c.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
        assert max(p["step"] for p in points) == STOPS_AT
        evals = {p["step"]: p["eval_loss"] for p in points if "eval_loss" in p}
        assert sorted(evals) == [2, STOPS_AT]
        assert job["metrics"]["eval_loss"] == evals[STOPS_AT]
        # keep_last 1 and keep_best 1: the stop's checkpoint and the lowest evaluated.
        best_step = min(evals, key=lambda s: (evals[s], s))
        ckpts = c.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
        assert {ck["step"] for ck in ckpts} == {STOPS_AT, best_step}
        (ckpt,) = [ck for ck in ckpts if ck["best"]]
        assert ckpt["step"] == best_step and ckpt["eval_loss"] == evals[best_step]

    out = tmp_path / "exported"
    env = {**os.environ, "ETRAIN_URL": served.url, "ETRAIN_TOKEN": token}
    done = subprocess.run(
        [str(BIN / "etrain"), "export", job_id, "--best", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "tokenizer.json").is_file()

    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = _etrain_final_model(folder, urlsplit(ckpt["uri"]).path)
    tokens = torch.randint(
        0, base.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        want = ours(tokens)
        got = exported(tokens).logits
        before = base(tokens).logits
    assert not torch.allclose(want, before, atol=1e-3), "the job did not change the model"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    # Generation from the best checkpoint: the service (in a child process) and `etrain
    # generate` (in its own) both continue a prompt as transformers' greedy generate does
    # on the exported best, token for token.
    prompt = "The quick brown fox"
    ids = torch.tensor([transformers.AutoTokenizer.from_pretrained(out)(prompt)["input_ids"]])
    with torch.no_grad():
        greedy = exported.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=GENERATED, do_sample=False
        )
    want = greedy[0, ids.shape[1] :].tolist()
    with served.client(token) as c:
        body = {"prompt": prompt, "max_new_tokens": GENERATED}
        r = c.post(f"/v1/jobs/{job_id}/generate", json=body, timeout=180)
    assert r.status_code == 200, r.text
    assert (r.json()["step"], r.json()["tokens"]) == (best_step, want)
    args = ["generate", job_id, "--prompt", prompt, "--max-new-tokens", str(GENERATED), "--json"]
    done = subprocess.run(
        [str(BIN / "etrain"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["tokens"] == want
