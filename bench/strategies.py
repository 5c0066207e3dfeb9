"""Every strategy on 4 CPU workers (gloo), the same model and data: step time and memory vs DDP.

Runs all layouts in one group of 4 processes (``tests.support.local_launch``), so
they share start-up and machine state, and prints one table with ratios
against DDP measured in the same run. Memory is what each rank reports at its
first step (``workers.telemetry.memory``; a DeepSpeed engine's own buffers by
``workers.telemetry.engine_memory``): local-shard bytes of parameters, gradients and
optimizer state (with DeepSpeed's fp32 master partitions), plus activations saved for
backward; the peak also holds DeepSpeed's reduce buckets. The table shows the largest
rank.

    .venv/bin/python bench/strategies.py [--steps 12] [--preset gpt-small] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.local_launch import LocalJob, run_local
from workers.spec import JobSpec

PP = {"pipeline": {"schedule": "1f1b", "microbatches": 4}}
LAYOUTS = {
    "ddp": {"strategy": "ddp"},
    "fsdp zero1": {"strategy": "fsdp", "fsdp": {"zero_stage": 1}},
    "fsdp zero2": {"strategy": "fsdp", "fsdp": {"zero_stage": 2}},
    "fsdp zero3": {"strategy": "fsdp", "fsdp": {"zero_stage": 3}},
    "fsdp zero3 offload": {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": True}},
    "tp4": {"strategy": "tp", "tp": 4},
    "pp4 1f1b": {"strategy": "pp", "pp": 4, **PP},
    "hybrid dp2 x tp2": {"strategy": "hybrid", "tp": 2},
    "hybrid pp2 x dp2": {"strategy": "hybrid", "pp": 2, **PP},
    "hybrid pp2 x tp2": {"strategy": "hybrid", "pp": 2, "tp": 2, **PP},
    "deepspeed zero1": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 1}},
    "deepspeed zero2": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}},
    "deepspeed zero3": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
    # DeepSpeed's reduce bucket is 5e8 elements unless set: 2 GB in fp32 whatever the model.
    "deepspeed zero3 bucket 5e6": {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "reduce_bucket_size": 5_000_000},
    },
    "deepspeed zero3 offload": {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    },
}
KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes")


def make_spec(name: str, par: dict, *, steps: int, preset: str) -> dict:
    """The shared job with one layout."""
    return JobSpec.model_validate(
        {
            "name": name.replace(" ", "-"),
            "model": {"preset": preset},
            "data": {"seq_len": 128, "num_samples": 1024},
            "parallelism": par,
            "resources": {"workers": 4, "cpus_per_worker": 0.5},
            "train": {
                "steps": steps,
                "global_batch_size": 16,
                "micro_batch_size": 2,
                "lr": 1e-3,
                "optimizer": "adamw",
            },
        }
    ).model_dump(mode="json", by_alias=True)


def summarise(results: dict, warmup: int) -> list[dict]:
    """One row per layout: median step time and the largest rank's memory."""
    rows = []
    for name in LAYOUTS:
        res = results[name]
        if res.error:
            rows.append({"layout": name, "error": res.error.strip().splitlines()[-1]})
            continue
        row = {
            "layout": name,
            "step_ms": 1e3 * statistics.median(res.step_times[warmup:]),
            "final_loss": res.losses[max(res.losses)],
        }
        for key in KEYS:
            row[key] = max(r[key] for r in res.memory)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    """Print absolute numbers and ratios against the DDP row."""
    base = next(r for r in rows if r["layout"] == "ddp")
    mib = 1024**2
    print(
        f"{'layout':20} {'step ms':>8} {'x ddp':>6} {'params MiB':>10} {'grads MiB':>9} "
        f"{'optim MiB':>9} {'activ MiB':>9} {'peak MiB':>8} {'x ddp':>6} {'loss':>7}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['layout']:20} failed: {r['error'][:90]}")
            continue
        print(
            f"{r['layout']:20} {r['step_ms']:8.1f} {r['step_ms'] / base['step_ms']:6.2f} "
            f"{r['params_bytes'] / mib:10.2f} {r['grads_bytes'] / mib:9.2f} "
            f"{r['optimizer_bytes'] / mib:9.2f} {r['activations_bytes'] / mib:9.2f} "
            f"{r['peak_bytes'] / mib:8.2f} {r['peak_bytes'] / base['peak_bytes']:6.2f} "
            f"{r['final_loss']:7.4f}"
        )


def main() -> int:
    """Run every layout once, in one process group, and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--preset", default="gpt-small")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    jobs = [
        LocalJob(
            name,
            make_spec(name, par, steps=args.steps, preset=args.preset),
            measure_memory=True,
        )
        for name, par in LAYOUTS.items()
    ]
    rows = summarise(run_local(jobs, world_size=4), args.warmup)
    print(
        f"{args.preset}, 4 CPU workers (gloo), seq 128, global batch 16, micro 2, AdamW, "
        f"{args.steps} steps (first {args.warmup} not timed); memory: largest rank"
    )
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
