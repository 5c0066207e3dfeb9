"""bench/finetune.py's workflow tables: packing off / on, and what one evaluation costs.

Both run one rank in this process on the same instruction rows (lengths drawn like
people's: prompts of 4-24 words, completions of 2-60), from the benchmark's model
folder with a word tokenizer, AdamW, global batch 8 (rows), micro-batch 2.

- **packing**: the padding share of the rows each way, and per step the trained
  (counted) tokens, the real tokens and the samples; tokens/s is real tokens over the
  step time, so a packed run that does more work per step shows it.
- **eval**: a held-out tenth of the rows (64 samples) evaluated every 4 steps: seconds
  per evaluation against the median step time of the same run.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

WORDS = [
    *["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"],
    *["answer", "four", "train", "model", "data", "token", "batch", "step", "loss", "rank"],
]


def _rows(n: int) -> list[dict]:
    rng = random.Random(0)
    return [
        {
            "prompt": " ".join(rng.choices(WORDS, k=rng.randint(4, 24))),
            "completion": " ".join(rng.choices(WORDS, k=rng.randint(2, 60))),
        }
        for _ in range(n)
    ]


def _spec(hf: Path, tok: Path, rows: Path, *, seq: int, steps: int, **data) -> dict:
    return {
        "name": "bench-workflow",
        "model": {"hf": str(hf), "tokenizer": str(tok)},
        "data": {"source": "jsonl", "path": str(rows), "shape": "instruction", "seq_len": seq}
        | data,
        "resources": {"workers": 1},
        "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2, "lr": 1e-3},
        "checkpoint": {"every_steps": steps},
    }


def _run(spec: dict, root: Path):
    import torch

    from tests.support.recording import RecordingReporter
    from workers.spec import JobSpec
    from workers.storage.location import locate
    from workers.train_loop import RunEnv, run

    reporter = RecordingReporter()
    env = RunEnv(0, 1, torch.device("cpu"), locate(str(root)), reporter, measure_memory=False)
    return run(JobSpec.model_validate(spec), env), reporter


def workflow_tables(hf: Path, root: Path, *, steps: int, seq: int, warmup: int) -> dict:
    """Print the packing and evaluation tables; their numbers as a dict."""
    from tests.support.hf_fixtures import make_word_tokenizer
    from workers.build import stores_of
    from workers.data.packing import PackedDataset, padding_fraction
    from workers.spec import JobSpec
    from workers.train_loop import _dataset, spec_model_config

    root.mkdir(parents=True, exist_ok=True)
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in _rows(512)))
    tok = root / "tok"
    make_word_tokenizer(tok, corpus=[" ".join(WORDS)])
    out: dict = {"packing": {}}
    print(f"\npacking off / on: 1 rank, {steps} steps (first {warmup} not timed), seq {seq}")
    print(f"{'packing':8} {'padding':>8} {'samples/step':>13} {'tokens/s':>9} {'x off':>6}")
    for mode in ("off", "on"):
        spec = _spec(hf, tok, rows, seq=seq, steps=steps, packing=mode == "on")
        job = JobSpec.model_validate(spec)
        base = _dataset(job, spec_model_config(job, stores_of(job)))
        packed = PackedDataset(base)
        lengths = packed.lengths
        window = seq + 1
        per_row = len(base) / len(packed) if mode == "on" else 1.0
        padding = padding_fraction(lengths, len(packed) if mode == "on" else len(base), window)
        result, _ = _run(spec, root / f"ckpt-{mode}")
        step_s = statistics.median(result.step_times[warmup:])
        real_tokens = 8 * per_row * statistics.mean(lengths)
        tps = real_tokens / step_s
        out["packing"][mode] = {
            "padding": padding,
            "samples_per_step": 8 * per_row,
            "tokens_per_s": tps,
            "step_s": step_s,
        }
        base_tps = out["packing"]["off"]["tokens_per_s"]
        print(f"{mode:8} {padding:8.1%} {8 * per_row:13.1f} {tps:9.0f} {tps / base_tps:6.2f}")
    spec = _spec(hf, tok, rows, seq=seq, steps=steps, eval_fraction=0.125)
    spec["train"] |= {"eval_every_steps": 4, "eval_samples": 64}
    result, reporter = _run(spec, root / "ckpt-eval")
    evals = [p.model_dump()["eval_s"] for p in reporter.metrics if "eval_s" in p.model_dump()]
    step_s = statistics.median(result.step_times[warmup:])
    per_eval = statistics.median(evals)
    print(f"\neval: 64 held-out samples every 4 steps, {len(evals)} evaluations")
    print(f"{'s/eval':>8} {'s/step':>8} {'steps':>6}")
    print(f"{per_eval:8.3f} {step_s:8.3f} {per_eval / step_s:6.2f}")
    out["eval"] = {"eval_s": per_eval, "step_s": step_s, "evaluations": len(evals)}
    return out
