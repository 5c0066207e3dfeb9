"""Fine-tune a pretrained Hugging Face model through the REST API of a real `etrain serve`
on real Ray, export it, load it with transformers: its logits equal etrain's final model's.

The tiny Llama and its tokenizer are built in the test (tests/support/hf_fixtures.py) and
put in the tenant's data area, as a user would; etrain's final model is the job's last
checkpoint loaded into etrain's own Transformer in this process.
"""

from __future__ import annotations

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
STEPS = 4


def _spec(folder: Path, corpus: Path) -> dict:
    return {
        "name": "ft-rest",
        "model": {"hf": str(folder)},
        "data": {"source": "text", "path": str(corpus), "seq_len": 16},
        "resources": {"workers": 2},
        "parallelism": {"strategy": "fsdp"},
        "train": {"steps": STEPS, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2},
        "checkpoint": {"every_steps": STEPS},
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
        (ckpt,) = [ck for ck in c.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]]
        assert ckpt["step"] == STEPS

    out = tmp_path / "exported"
    env = {**os.environ, "ETRAIN_URL": served.url, "ETRAIN_TOKEN": token}
    done = subprocess.run(
        [str(BIN / "etrain"), "export", job_id, "--out", str(out)],
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
