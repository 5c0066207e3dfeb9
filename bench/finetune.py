"""Fine-tuning a pretrained Hugging Face model: full vs LoRA, DDP vs FSDP, with/without recompute.

Builds one Llama-shaped Hugging Face model folder (random weights, sharded
safetensors, written with ``transformers``' ``save_pretrained``), then runs every
row of the table from it on 2 CPU workers (gloo) in one group of processes
(``tests.support.local_launch``), so the rows share start-up and machine state.
Memory is what each rank reports at its first step (``workers.telemetry.memory``:
local bytes of parameters, gradients, optimizer state and activations saved for
backward); the table shows the largest rank and ratios against full fine-tuning
with DDP measured in the same run. A second table loads a ~190 MB sharded
checkpoint under FSDP, TP and DDP (``tests.support.hf_load_memory``): seconds and
peak host-memory growth per rank while its part is materialised and filled,
against the whole model's size. A third, "tracking off / on", runs full fine-tuning in
this process (one rank) with ``metrics.mlflow`` (a local SQLite store) and
``metrics.wandb`` (offline) off, then on, in turns: the training thread's CPU per step
(``time.thread_time`` between consecutive steps, taken on the training thread by a run
hook) with the trackers' sink thread working beside it; the goal is on / off <= 1.02.
Then the workflow tables (``bench/finetune_workflow.py``): packing off / on (padding,
samples per step, tokens/s) and the seconds one evaluation of 64 held-out samples costs;
the objectives table (``bench/finetune_objectives.py``): DPO beside SFT, full and
LoRA, DDP and FSDP, sequences/s and memory by part (the reference model's included);
and the diffusion table (``bench/finetune_diffusion.py``): Stable Diffusion LoRA's
images/s and memory by part with the latent cache off and on.

    .venv/bin/python bench/finetune.py [--steps 8] [--dim 256] [--layers 4] [--json OUT]
        [--no-load] [--no-tracking] [--tracking-steps 40] [--tracking-only]
        [--no-workflow] [--workflow-steps 12] [--workflow-only]
        [--no-objectives] [--objectives-steps 8] [--objectives-only]
        [--no-diffusion] [--diffusion-only]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from finetune_diffusion import diffusion_table
from finetune_objectives import objectives_table
from finetune_workflow import workflow_tables

from tests.support.hf_load_memory import measure_load, write_random_llama
from tests.support.local_launch import LocalJob, run_local
from workers.hooks import RunHooks
from workers.spec import JobSpec

LORA = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
FSDP = {"strategy": "fsdp", "fsdp": {"zero_stage": 3}}
DDP = {"strategy": "ddp"}
AC_SUFFIX = {"none": "", "full": " +ac", "selective": " +sel-ac"}
ROWS = {
    f"{kind} {name}{AC_SUFFIX[ac]}": (lora, par, ac)
    for kind, lora in (("full", None), ("lora", LORA))
    for name, par in (("ddp", DDP), ("fsdp3", FSDP))
    for ac in AC_SUFFIX
}
KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes")


def write_model(folder: Path, *, dim: int, layers: int, vocab: int) -> Path:
    """A random-weight Llama folder in sharded safetensors, as a hub download looks."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=dim * 8 // 3 // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=max(1, dim // 64),
        num_key_value_heads=max(1, dim // 128),
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder, max_shard_size="20MB")
    return folder


def make_spec(name: str, *, hf: Path, lora, par: dict, ac: str, steps: int, seq: int) -> dict:
    """The shared job with one row's model options and layout."""
    model = {"hf": str(hf), "activation_checkpointing": ac}
    if lora:
        model["lora"] = lora
    return JobSpec.model_validate(
        {
            "name": name.replace(" ", "-").replace("+", ""),
            "model": model,
            "data": {"seq_len": seq, "num_samples": 1024},
            "parallelism": par,
            "resources": {"workers": 2, "cpus_per_worker": 1},
            "train": {
                "steps": steps,
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "lr": 1e-4,
                "optimizer": "adamw",
            },
        }
    ).model_dump(mode="json", by_alias=True)


def summarise(results: dict, warmup: int, tokens_per_step: int) -> list[dict]:
    """One row per configuration: tokens/s from the median step and the largest rank's memory."""
    rows = []
    for name in ROWS:
        res = results[name]
        if res.error:
            rows.append({"row": name, "error": res.error.strip().splitlines()[-1]})
            continue
        step_s = statistics.median(res.step_times[warmup:])
        row = {"row": name, "tokens_per_s": tokens_per_step / step_s, "step_ms": 1e3 * step_s}
        for key in KEYS:
            row[key] = max(r[key] for r in res.memory)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    """Absolute numbers, and peak memory and speed as ratios against full DDP."""
    base = rows[0]
    mib = 1024**2
    print(
        f"{'row':22} {'tok/s':>8} {'x full':>6} {'params':>8} {'grads':>8} {'optim':>8} "
        f"{'activ':>8} {'peak':>8} {'x full':>6}   (MiB, largest rank)"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['row']:22} failed: {r['error'][:90]}")
            continue
        print(
            f"{r['row']:22} {r['tokens_per_s']:8.0f} "
            f"{r['tokens_per_s'] / base.get('tokens_per_s', float('nan')):6.2f} "
            f"{r['params_bytes'] / mib:8.2f} {r['grads_bytes'] / mib:8.2f} "
            f"{r['optimizer_bytes'] / mib:8.2f} {r['activations_bytes'] / mib:8.2f} "
            f"{r['peak_bytes'] / mib:8.2f} "
            f"{r['peak_bytes'] / base.get('peak_bytes', float('nan')):6.2f}"
        )


def print_load_table(folder: Path) -> list[dict]:
    """Load a sharded checkpoint under each layout on 2 ranks; print time and peak memory."""
    total = write_random_llama(folder)
    ranks = measure_load(folder, world_size=2)
    mib = 1024**2
    print(f"\nloading a sharded checkpoint of {total / mib:.0f} MiB (fp32) on 2 ranks")
    print(f"{'layout':8} {'rank':>4} {'seconds':>8} {'peak MiB':>9} {'x model':>8}")
    rows = []
    for layout in ranks[0]:
        for rank, record in enumerate(ranks):
            r = record[layout]
            rows.append({"layout": layout, "rank": rank, **r, "model_bytes": total})
            print(
                f"{layout:8} {rank:4d} {r['seconds']:8.2f} {r['peak_bytes'] / mib:9.1f} "
                f"{r['peak_bytes'] / total:8.2f}"
            )
    return rows


class _ThreadCpu(RunHooks):
    """The training thread's CPU time at the end of each step (after_step runs on it)."""

    def __init__(self):
        self.marks: list[float] = []

    def after_step(self, *, step: int, rank: int) -> None:
        self.marks.append(time.thread_time())


def tracking_table(hf: Path, root: Path, *, steps: int, seq: int, warmup: int) -> dict:
    """Training-thread CPU per step, trackers off and on (two turns each, in turns)."""
    import torch

    from workers.storage.location import locate
    from workers.train_loop import RunEnv, run

    os.environ.setdefault("WANDB_SILENT", "true")
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    for turn in range(2):
        for mode in ("off", "on"):
            spec = make_spec("full ddp", hf=hf, lora=None, par=DDP, ac="none", steps=steps, seq=seq)
            spec["resources"]["workers"] = 1
            spec["checkpoint"] = {"every_steps": steps}  # one save, at the end
            if mode == "on":
                spec["metrics"] = {
                    "mlflow": {"tracking_uri": f"file://{root}/mlflow", "experiment": "bench"},
                    "wandb": {"project": "bench", "mode": "offline"},
                }
            spec["name"] = f"bench-tracking-{mode}-{turn}"
            cpu = _ThreadCpu()
            ckpts = locate(str(root / f"ckpt-{mode}-{turn}"))
            env = RunEnv(0, 1, torch.device("cpu"), ckpts, hooks=cpu, measure_memory=False)
            run(JobSpec.model_validate(spec), env)
            per_step[mode] += [b - a for a, b in itertools.pairwise(cpu.marks)][warmup:]
    off, on = (statistics.median(per_step[m]) for m in ("off", "on"))
    print(f"\ntracking off / on: training-thread CPU per step, 1 rank, {steps} steps x 2 turns")
    print(f"{'tracking':8} {'cpu ms/step':>12} {'x off':>6}")
    for mode, value in (("off", off), ("on", on)):
        print(f"{mode:8} {1e3 * value:12.2f} {value / off:6.3f}")
    return {"off_cpu_s_per_step": off, "on_cpu_s_per_step": on, "ratio": on / off}


def main() -> int:
    """Write the model, run every row in one process group, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-load", dest="load", action="store_false", help="skip the load table")
    ap.add_argument("--no-tracking", dest="tracking", action="store_false")
    ap.add_argument("--tracking-steps", type=int, default=40)
    ap.add_argument("--tracking-only", action="store_true", help="only the tracking table")
    ap.add_argument("--no-workflow", dest="workflow", action="store_false")
    ap.add_argument("--workflow-steps", type=int, default=12)
    ap.add_argument(
        "--workflow-only", action="store_true", help="only the packing and evaluation tables"
    )
    ap.add_argument("--no-objectives", dest="objectives", action="store_false")
    ap.add_argument("--objectives-steps", type=int, default=8)
    ap.add_argument("--objectives-only", action="store_true", help="only the objectives table")
    ap.add_argument("--no-diffusion", dest="diffusion", action="store_false")
    ap.add_argument("--diffusion-only", action="store_true", help="only the diffusion table")
    args = ap.parse_args()
    if args.diffusion_only:
        print(json.dumps(diffusion_table()))
        return 0
    with tempfile.TemporaryDirectory(prefix="etrain-bench-finetune-") as tmp:
        hf = write_model(Path(tmp) / "model", dim=args.dim, layers=args.layers, vocab=args.vocab)
        objectives = lambda: objectives_table(  # noqa: E731
            hf, Path(tmp) / "objectives", steps=args.objectives_steps, seq=args.seq, warmup=2
        )
        if args.objectives_only:
            print(json.dumps(objectives()))
            return 0
        if args.workflow_only:
            workflow = workflow_tables(
                hf, Path(tmp) / "workflow", steps=args.workflow_steps, seq=args.seq, warmup=2
            )
            print(json.dumps(workflow))
            return 0
        if args.tracking_only:
            tracking = tracking_table(
                hf,
                Path(tmp) / "tracking",
                steps=args.tracking_steps,
                seq=args.seq,
                warmup=args.warmup,
            )
            print(json.dumps(tracking))
            return 0
        jobs = [
            LocalJob(
                name,
                make_spec(name, hf=hf, lora=lora, par=par, ac=ac, steps=args.steps, seq=args.seq),
            )
            for name, (lora, par, ac) in ROWS.items()
        ]
        rows = summarise(run_local(jobs, world_size=2), args.warmup, 8 * args.seq)
        print(
            f"HF Llama dim {args.dim}, {args.layers} layers, vocab {args.vocab}; 2 CPU workers "
            f"(gloo), seq {args.seq}, global batch 8, micro 2, AdamW, {args.steps} steps "
            f"(first {args.warmup} not timed); LoRA r={LORA['rank']} on q/k/v/o"
        )
        print_table(rows)
        load_rows = print_load_table(Path(tmp) / "big") if args.load else []
        tracking = (
            tracking_table(
                hf,
                Path(tmp) / "tracking",
                steps=args.tracking_steps,
                seq=args.seq,
                warmup=args.warmup,
            )
            if args.tracking
            else {}
        )
        workflow = (
            workflow_tables(
                hf, Path(tmp) / "workflow", steps=args.workflow_steps, seq=args.seq, warmup=2
            )
            if args.workflow
            else {}
        )
        objective_rows = objectives() if args.objectives else []
        diffusion_rows = diffusion_table() if args.diffusion else {}
    if args.json:
        out = {"train": rows, "load": load_rows, "tracking": tracking, "workflow": workflow}
        out["objectives"] = objective_rows
        out["diffusion"] = diffusion_rows
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
