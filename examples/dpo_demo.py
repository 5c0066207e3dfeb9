"""`make dpo-demo`: preference tuning (DPO) of a pretrained Hugging Face model with LoRA.

Runs on the embedded default in a few minutes on a CPU. Nothing can be downloaded here, so
the "pretrained" model is a tiny Llama written with ``transformers`` and a BPE tokenizer
trained with ``tokenizers`` (the builders the tests use). The demo

1. writes the model folder and a chat preference set (per question, the right sum as
   the chosen answer and a wrong one as the rejected) into the admin tenant's data area,
   ``.etrain-dpo-demo/tenants/admin``;
2. starts ``etrain serve``, submits ``examples/dpo-tiny-llama-lora.yaml`` with
   ``model.hf`` and ``data.path`` pointed there, and follows it to the end;
3. prints how the rewards moved: the share of pairs whose chosen answer the model now
   prefers over the reference's preference (reward accuracy) and the reward margin, and
   the held-out DPO loss; exports the adapter (peft's format).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from examples.demo import serving, tune_and_export  # noqa: E402
from examples.finetune_demo import write_model_and_rows  # noqa: E402

SPEC = ROOT / "examples" / "dpo-tiny-llama-lora.yaml"
DATA_DIR = ROOT / ".etrain-dpo-demo"
AREA = DATA_DIR / "tenants" / "admin"
PORT = int(os.environ.get("DEMO_PORT", "8802"))
URL = f"http://127.0.0.1:{PORT}"
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def preferences(n: int, seed: int = 0) -> list[dict]:
    """Questions adding two small numbers in words; the right sum is chosen, one off is
    rejected."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(6), rng.randrange(5)
        wrong = a + b + rng.choice([-1, 1]) if a + b else 1
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {WORDS[a]} plus {WORDS[b]}?"}],
                "chosen": f"{WORDS[a]} plus {WORDS[b]} is {WORDS[a + b]}.",
                "rejected": f"{WORDS[a]} plus {WORDS[b]} is {WORDS[wrong]}.",
            }
        )
    return rows


def write_inputs() -> tuple[Path, Path]:
    """The model folder (tiny Llama + tokenizer) and the preference file, in the tenant's
    area."""
    rows = preferences(512)
    corpus = [r["prompt"][0]["content"] + " " + r["chosen"] for r in rows[:64]]
    return write_model_and_rows(AREA, "arithmetic-prefs.jsonl", rows, corpus)


def main() -> int:
    """Build the inputs, serve, tune, report; non-zero unless the rewards moved."""
    shutil.rmtree(DATA_DIR, ignore_errors=True)
    AREA.mkdir(parents=True)
    folder, prefs = write_inputs()
    with serving(DATA_DIR, PORT, dashboard_port="8867", gcs_port="6392") as (serve, env):
        return run(serve, env, folder, prefs)


def run(serve: subprocess.Popen, env: dict, folder: Path, prefs: Path) -> int:
    """Submit the spec, follow it, export the adapter, report the rewards."""
    job_id, job, points, out = tune_and_export(SPEC, folder, prefs, DATA_DIR, URL, serve, env)
    last = points[-10:]
    accuracy = sum(p["rewards_accuracy"] for p in last) / len(last)
    margin = sum(p["rewards_margin"] for p in last) / len(last)
    evals = [(p["step"], p["eval_loss"]) for p in points if p.get("eval_loss") is not None]
    print("\n=== DPO demo summary ===")
    print(f"job              {job_id}  {job['status']}")
    print(f"loss             {points[0]['loss']:.4f} at step 1 (log 2: the model is its reference)")
    print(f"loss             {sum(p['loss'] for p in last) / len(last):.4f} (mean of the last 10)")
    print(f"reward accuracy  {accuracy:.3f} (mean of the last 10 steps; 0.5 is chance)")
    print(f"reward margin    {margin:.4f} (chosen - rejected, mean of the last 10)")
    print("held-out loss    " + ", ".join(f"{v:.4f} at step {s}" for s, v in evals))
    print(f"adapter          {out} (peft's format)")
    return 0 if job["status"] == "SUCCEEDED" and accuracy > 0.75 and margin > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
