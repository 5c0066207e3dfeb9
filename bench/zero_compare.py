"""DeepSpeed ZeRO against FSDP, the same model and data: tokens/s, step time, memory, save.

Every layout runs in one group of processes (``tests.support.local_launch`` on the CPU
with gloo; ``--device cuda``: one process per GPU, ``cpu:gloo,cuda:nccl`` and bf16), in
``--rounds`` interleaved rounds (the second in reverse order), so drift hits every row
alike. Each job saves two checkpoints (mid-run and at the end) through etrain's DCP
path; the save time is the one its manifest records (``save_s``: write and commit, on
rank 0). Then the same again while a background process spins a 1-thread torch matmul
loop (a busy machine). Ratios are against FSDP ZeRO-3 measured in the same run, the
layout DeepSpeed ZeRO is the alternative to. Memory: the largest rank's, measured at its
first step (``workers.telemetry.memory``; a DeepSpeed engine's own buffers by
``workers.telemetry.engine_memory``, its reduce buckets in ``buckets``); on CUDA the
peak is ``torch.cuda.max_memory_allocated``.

    .venv/bin/python bench/zero_compare.py [--steps 10] [--rounds 2] [--workers 2|4]
        [--preset gpt-small] [--device cpu|cuda] [--no-busy] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.strategies import KEYS, make_spec
from tests.support import local_launch
from tests.support.local_launch import LocalJob, run_local

BASE = "fsdp zero3"
B5E6 = {"reduce_bucket_size": 5_000_000}
CPU_OPT = {"offload_optimizer": "cpu"}


def ds(stage: int, **kw) -> dict:
    return {"strategy": "deepspeed", "deepspeed": {"zero_stage": stage, **kw}}


ROWS = {
    "fsdp zero2": {"strategy": "fsdp", "fsdp": {"zero_stage": 2}},
    BASE: {"strategy": "fsdp", "fsdp": {"zero_stage": 3}},
    "fsdp zero3 offload": {"strategy": "fsdp", "fsdp": {"zero_stage": 3, "cpu_offload": True}},
    "ds zero1": ds(1, **B5E6),
    "ds zero2": ds(2, **B5E6),
    "ds zero3": ds(3, **B5E6),
    "ds zero3 bucket 5e8": ds(3),  # DeepSpeed's default reduce bucket: 2 GB of fp32
    "ds zero1 +opt off": ds(1, **B5E6, **CPU_OPT),
    "ds zero2 +opt off": ds(2, **B5E6, **CPU_OPT),
    "ds zero3 +opt off": ds(3, **B5E6, **CPU_OPT),
    "ds zero3 +opt+par off": ds(3, **B5E6, **CPU_OPT, offload_param="cpu"),
}
QUICK = (BASE, "ds zero2", "ds zero3", "ds zero3 +opt+par off")
MEM_KEYS = (*KEYS[:3], "buckets_bytes", *KEYS[3:])
NCCL = "cpu:gloo,cuda:nccl"  # workers.launch.process_group_backend(use_gpu=True)


def spec_for(name: str, par: dict, args, world: int) -> dict:
    """strategies.py's job (seq 128, global batch 16, micro 2, AdamW) at ``world`` workers,
    a checkpoint mid-run and at the end; on CUDA one GPU per worker and bf16."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # a job name's alphabet
    spec = make_spec(slug, par, steps=args.steps, preset=args.preset)
    cores = os.cpu_count() or 1
    spec["resources"].update(workers=world, cpus_per_worker=max(1, cores // world))
    spec["checkpoint"].update(every_steps=max(1, args.steps // 2), keep_last=2)
    if args.device == "cuda":
        spec["resources"]["gpus_per_worker"] = 1
        spec["train"]["precision"] = "bf16"
    return spec


# -- running the jobs --------------------------------------------------------------------


def _join_nccl(rank: int, world_size: int, port: int) -> None:
    """local_launch.join_group on a GPU: NCCL for CUDA tensors, gloo for etrain's CPU ones."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    tout = local_launch.TIMEOUT
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=tout)
    dist.init_process_group(NCCL, store=store, rank=rank, world_size=world_size, timeout=tout)


def _cuda_worker(rank: int, world: int, port: int, jobs: list[LocalJob], out: str) -> None:
    """local_launch's job loop (the same records and error handling) on ``cuda:rank``: its
    group joined with NCCL, each run on the GPU with its peak counted from its own start."""
    import workers.train_loop as train_loop

    device, real_run = torch.device("cuda", rank), train_loop.run
    torch.cuda.set_device(device)

    def run_on_gpu(spec, env):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        res = real_run(spec, dataclasses.replace(env, device=device))
        res.parts.clear()  # the model leaves the GPU before the next job
        return res

    train_loop.run = run_on_gpu  # _run_group imports it at its call
    local_launch.join_group = _join_nccl
    local_launch._run_group(rank, world, port, jobs, out)


def run_jobs(jobs: list[LocalJob], world: int, device: str) -> dict:
    """Results by job name: run_local on the CPU; one spawned process per GPU on CUDA."""
    if device == "cpu":
        return run_local(jobs, world_size=world)
    store = local_launch.rendezvous(world)
    with tempfile.TemporaryDirectory() as out:
        args = (world, store.port, jobs, out)
        mp.start_processes(_cuda_worker, args=args, nprocs=world, start_method="spawn")
        return {job.name: local_launch._collect(Path(out), job.name, world) for job in jobs}


def _spin(stop) -> None:
    """The background load: one thread of float32 matmuls until ``stop`` is set."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = torch.tanh(a @ a)


@contextlib.contextmanager
def background_load(on: bool):
    """A spawned process spinning :func:`_spin` for the block's duration (``on``)."""
    if not on:
        yield
        return
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_spin, args=(stop,), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join()


def save_times(root: Path) -> list[float]:
    """``save_s`` of every checkpoint committed under ``root`` (their manifests), by step."""
    found = sorted(root.rglob("manifest.json"))
    return [json.loads(p.read_text())["save_s"] for p in found]


# -- measuring and summarising -----------------------------------------------------------


def measure(names: list[str], args, world: int, *, busy: bool) -> dict[str, dict]:
    """Every layout in ``args.rounds`` interleaved rounds on one process group, after a
    warm-up job (DeepSpeed's import, the first DCP save); what each round gave, by layout."""
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        jobs, where = [], {}
        warm = {"steps": 3, "preset": args.preset, "device": args.device}
        warm_args = argparse.Namespace(**warm)
        spec = spec_for("warm-up", ds(3, **B5E6), warm_args, world)
        jobs.append(LocalJob("warm-up", spec, checkpoint_root=f"{tmp}/warm-up"))
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                job = f"{name} r{r}"
                where[job] = Path(tmp, job.replace(" ", "_"))
                spec = spec_for(job, ROWS[name], args, world)
                jobs.append(LocalJob(job, spec, checkpoint_root=str(where[job])))
        t0, load0 = time.perf_counter(), os.getloadavg()[0]
        with background_load(busy):
            results = run_jobs(jobs, world, args.device)
        took, load1 = time.perf_counter() - t0, os.getloadavg()[0]
        state = "busy" if busy else "idle"
        print(
            f"  {state}: {len(jobs)} jobs in {took:.0f} s, load average {load0:.1f} -> {load1:.1f}"
        )
        return {
            name: {
                "results": [results[f"{name} r{r}"] for r in range(args.rounds)],
                "saves": [s for r in range(args.rounds) for s in save_times(where[f"{name} r{r}"])],
            }
            for name in names
        }


def summarise(name: str, got: dict, *, warmup: int, tokens: int) -> dict:
    """One layout's row: median step (all rounds' steps after the warm-up), tokens/s, the
    spread of the rounds' medians, the largest rank's memory, the median save."""
    results = got["results"]
    failed = [r.error for r in results if r.error]
    if failed:
        return {"layout": name, "error": failed[0].strip().splitlines()[-1]}
    steps = [t for r in results for t in r.step_times[warmup:]]
    medians = [statistics.median(r.step_times[warmup:]) for r in results]
    row = {
        "layout": name,
        "step_ms": 1e3 * statistics.median(steps),
        "spread_pct": 100 * (max(medians) - min(medians)) / min(medians),
        "save_s": statistics.median(got["saves"]) if got["saves"] else float("nan"),
        "saves": len(got["saves"]),
        "final_loss": results[0].losses[max(results[0].losses)],
    }
    row["tokens_per_s"] = tokens / (row["step_ms"] / 1e3)
    for key in MEM_KEYS:
        row[key] = max(m.get(key, 0) for r in results for m in r.memory)
    return row


def print_table(title: str, rows: list[dict]) -> None:
    """Absolute numbers and ratios against the baseline row."""
    base, mib = next(r for r in rows if r["layout"] == BASE), 1024**2
    print(f"\n{title}")
    print(
        f"{'layout':22} {'tok/s':>6} {'x fsdp3':>7} {'step ms':>7} {'rnd%':>5} {'params':>6} "
        f"{'grads':>6} {'optim':>6} {'bucket':>6} {'activ':>6} {'peak MiB':>8} {'x fsdp3':>7} "
        f"{'save s':>6} {'x fsdp3':>7} {'loss':>6}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['layout']:22} failed: {r['error'][:100]}")
            continue
        mem = " ".join(f"{r[k] / mib:6.1f}" for k in MEM_KEYS[:-1])
        print(
            f"{r['layout']:22} {r['tokens_per_s']:6.0f} "
            f"{r['tokens_per_s'] / base['tokens_per_s']:7.2f} {r['step_ms']:7.1f} "
            f"{r['spread_pct']:5.1f} {mem} {r['peak_bytes'] / mib:8.1f} "
            f"{r['peak_bytes'] / base['peak_bytes']:7.2f} {r['save_s']:6.3f} "
            f"{r['save_s'] / base['save_s']:7.2f} {r['final_loss']:6.3f}"
        )


def print_busy(idle: list[dict], busy: list[dict]) -> None:
    """Per layout: step time and save time busy against idle."""
    print("\nbusy / idle (same layouts, a 1-thread matmul loop in the background)")
    print(
        f"{'layout':22} {'step ms idle':>12} {'busy':>8} {'x':>5} "
        f"{'save s idle':>11} {'busy':>7} {'x':>5}"
    )
    for i, b in zip(idle, busy, strict=True):
        if "error" in i or "error" in b:
            print(f"{i['layout']:22} failed")
            continue
        print(
            f"{i['layout']:22} {i['step_ms']:12.1f} {b['step_ms']:8.1f} "
            f"{b['step_ms'] / i['step_ms']:5.2f} {i['save_s']:11.3f} {b['save_s']:7.3f} "
            f"{b['save_s'] / i['save_s']:5.2f}"
        )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="first steps of a job not timed")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--preset", default="gpt-small")
    ap.add_argument("--workers", type=int, default=2, choices=(1, 2, 4))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--no-busy", action="store_true", help="skip the busy-machine pass")
    ap.add_argument("--rows", help="comma-separated layouts (default: all; --quick: a few)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="4 steps, 1 round, 4 layouts")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup, args.rounds = 4, 1, 1
    names = args.rows.split(",") if args.rows else list(QUICK if args.quick else ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown layouts {unknown}; known: {', '.join(ROWS)}")
    args.names = names if BASE in names else [BASE, *names]
    return args


def main() -> int:
    args = parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # the workers' c10d noise
    world = args.workers
    if args.device == "cuda":  # one GPU per rank: NCCL refuses two ranks on one device
        world = min(world, torch.cuda.device_count())
        if world < 1:
            raise SystemExit("--device cuda: no CUDA device is visible")
    probe = spec_for("probe", ROWS[BASE], args, world)
    tokens = probe["train"]["global_batch_size"] * probe["data"]["seq_len"]
    where = (
        f"{world} CUDA GPU(s) (nccl), bf16"
        if args.device == "cuda"
        else f"{world} CPU workers (gloo), fp32"
    )
    print(
        f"{args.preset}, {where}, {probe['resources']['cpus_per_worker']} threads each, "
        f"seq 128, global batch 16, micro 2, AdamW, {args.steps} steps (first {args.warmup} "
        f"not timed) x {args.rounds} rounds; saves at steps {args.steps // 2} and {args.steps}"
    )
    out = {"setup": {k: v for k, v in vars(args).items() if k != "json"} | {"world": world}}
    for cond in ("idle",) if args.no_busy else ("idle", "busy"):
        got = measure(args.names, args, world, busy=cond == "busy")
        out[cond] = [summarise(n, got[n], warmup=args.warmup, tokens=tokens) for n in args.names]
    for cond in ("idle", "busy"):
        if cond in out:
            print_table(f"{cond} machine; ratios against {BASE}; memory: largest rank", out[cond])
    if "busy" in out:
        print_busy(out["idle"], out["busy"])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
