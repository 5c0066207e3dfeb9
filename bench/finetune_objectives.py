"""bench/finetune.py's objectives table: DPO beside supervised fine-tuning (SFT), in the
same group of 2 CPU workers (gloo) on the same preference rows (prompts of 4-24 words,
answers of 2-60), from the benchmark's model folder with a word tokenizer, AdamW, global
batch 8, micro-batch 2.

SFT trains on prompt + chosen answer (instruction rows); DPO on the (chosen, rejected)
pairs, so a DPO step forwards twice the sequences through the trained model and once more
through the reference without gradients. Rows: full DDP (the reference a frozen copy on
each rank), full FSDP ZeRO-3 (the copy sharded like the trained model), LoRA DDP (the
reference is the base with the adapters off: no copy). Per row: sequences (and tokens,
padding included) per second, the step time, and the largest rank's memory at its first
step by part: parameters, gradients, optimizer state, the reference model, activations.
Ratios are against the SFT row of the same kind, measured in the same run.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from finetune_workflow import WORDS

LORA = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
DDP, FSDP3 = {"strategy": "ddp"}, {"strategy": "fsdp", "fsdp": {"zero_stage": 3}}
# row -> (objective, LoRA, layout, the SFT row it is compared with)
ROWS = {
    "sft full ddp": ("causal_lm", None, DDP, "sft full ddp"),
    "dpo full ddp": ("dpo", None, DDP, "sft full ddp"),
    "sft full fsdp3": ("causal_lm", None, FSDP3, "sft full fsdp3"),
    "dpo full fsdp3": ("dpo", None, FSDP3, "sft full fsdp3"),
    "sft lora ddp": ("causal_lm", LORA, DDP, "sft lora ddp"),
    "dpo lora ddp": ("dpo", LORA, DDP, "sft lora ddp"),
}
PARTS = ("params_bytes", "grads_bytes", "optimizer_bytes", "reference_bytes", "activations_bytes")


def _rows(n: int) -> list[dict]:
    rng = random.Random(0)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi)))

    return [
        {"prompt": words(4, 24), "chosen": words(2, 60), "rejected": words(2, 60)} for _ in range(n)
    ]


def _spec(name: str, hf: Path, tok: Path, data: Path, *, seq: int, steps: int) -> dict:
    objective, lora, par, _ = ROWS[name]
    dpo = objective == "dpo"
    shape = (
        {"shape": "preference"} if dpo else {"shape": "instruction", "completion_field": "chosen"}
    )
    return {
        "name": name.replace(" ", "-"),
        "objective": objective,
        "model": {"hf": str(hf), "tokenizer": str(tok), **({"lora": lora} if lora else {})},
        "data": {"source": "jsonl", "path": str(data), "seq_len": seq, "truncate": True, **shape},
        "parallelism": par,
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2, "lr": 1e-4},
    }


def objectives_table(hf: Path, root: Path, *, steps: int, seq: int, warmup: int) -> list[dict]:
    """Run every row in one group of 2 processes; print the table; its rows."""
    from tests.support.hf_fixtures import make_word_tokenizer
    from tests.support.local_launch import LocalJob, run_local

    root.mkdir(parents=True, exist_ok=True)
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(256)))
    tok = root / "tok"
    make_word_tokenizer(tok, corpus=[" ".join(WORDS)])
    jobs = [
        LocalJob(n, _spec(n, hf, tok, data, seq=seq, steps=steps), measure_memory=True)
        for n in ROWS
    ]
    results = run_local(jobs, world_size=2)
    out, mib = [], 1024**2
    print(
        f"\nobjectives: 2 CPU workers, seq {seq}, global batch 8 rows (SFT) / pairs (DPO), "
        f"micro 2, AdamW, {steps} steps (first {warmup} not timed)"
    )
    print(
        f"{'row':16} {'seq/s':>7} {'x sft':>6} {'step ms':>8} {'params':>7} {'grads':>7} "
        f"{'optim':>7} {'ref':>7} {'activ':>7} {'total':>7} {'x sft':>6}   (MiB, largest rank)"
    )
    by_name: dict[str, dict] = {}
    for name, (objective, _, _, base) in ROWS.items():
        res = results[name]
        if res.error:
            print(f"{name:16} failed: {res.error.strip().splitlines()[-1][:90]}")
            continue
        step_s = statistics.median(res.step_times[warmup:])
        sequences = 8 * (2 if objective == "dpo" else 1)
        row = {"row": name, "sequences_per_s": sequences / step_s, "step_s": step_s}
        row["tokens_per_s"] = row["sequences_per_s"] * seq
        for key in PARTS:
            row[key] = max(r.get(key, 0) for r in res.memory)
        row["total_bytes"] = sum(row[k] for k in PARTS)
        by_name[name] = row
        ref = by_name.get(base, row)
        print(
            f"{name:16} {row['sequences_per_s']:7.1f} "
            f"{row['sequences_per_s'] / ref['sequences_per_s']:6.2f} {1e3 * step_s:8.0f} "
            + " ".join(f"{row[k] / mib:7.2f}" for k in PARTS)
            + f" {row['total_bytes'] / mib:7.2f} {row['total_bytes'] / ref['total_bytes']:6.2f}"
        )
        out.append(row)
    return out
