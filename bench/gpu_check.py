"""One-GPU check of etrain's worker code: NCCL, bf16 training and MFU, memory vs the planner, LoRA.

Runs etrain's own pieces on one GPU (``workers.train_loop.run``, ``workers.stepper.Stepper``,
``workers.strategies.fsdp``, ``workers.models.lora``, ``workers.telemetry.memory``) and
compares with the planner (``service.planner``). Five parts, each on its own (one failing
does not lose the others), each printed as a markdown table; everything lands in
``<out>/gpu_check.json`` (rewritten after every part).

1. nccl: a world-1 process group as Ray's TorchConfig makes it on a GPU (backend "nccl"):
   all_reduce / all_gather correctness, a 1 GiB all_reduce's time (a smoke test: at world 1
   nothing crosses a link, bus bandwidth is 0 by definition; multi-GPU NCCL needs > 1 GPU),
   and whether the CPU float64 all_reduce etrain's Stepper does for the loss works on it.
2. bf16: ``train_loop.run`` on llama-1b at seq 2048 (micro batch: the largest the planner
   fits in 75% of the GPU), tokens/s and MFU; step-1 loss against an fp32 run's.
3. memory: FSDP2 ``fully_shard`` at world 1 (etrain's options), activation checkpointing
   none / full / selective, and LoRA; ``memory_report`` against the planner's prediction.
4. lora-7b: LoRA rank 16 on every projection of llama-7b, bf16 frozen base: tokens/s, memory.
5. deepspeed: DeepSpeed ZeRO-1/2/3 (+ CPU offload, + its default reduce bucket) against FSDP
   ZeRO-2/3 on gpt-small, bf16, NCCL: ``bench/zero_compare.py --device cuda`` in a process of
   its own (one rank per GPU); tokens/s, peak memory and checkpoint save time vs FSDP ZeRO-3.
   DeepSpeed must be importable there (carried, see bench/README.md), else its rows fail.

QLoRA (4-bit) is not checked: bitsandbytes is not on the GPU machine and etrain does not ship it.

    python3 bench/gpu_check.py --out DIR            # on a GPU, ~5-8 min
    .venv/bin/python bench/gpu_check.py --cpu --tiny --out /tmp/gc   # dry run, tiny models
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from service.planner.hardware import GPUS, find_gpu
from service.planner.memory_model import Layout, worst_rank_memory
from service.planner.planning import layout_of, workload_of
from service.planner.step_time import MFU as PLANNER_MFU
from service.planner.workload import LORA_TARGETS
from workers.data import GlobalBatchSampler
from workers.models.config import count_params, get_model_config
from workers.models.llama import build_model
from workers.models.lora import hold_frozen_linears_in, init_lora, inject_lora
from workers.optim import build_optimizer
from workers.spec import JobSpec
from workers.stepper import Stepper
from workers.strategies import StrategyConfig
from workers.strategies.fsdp import decoder_blocks, fully_shard_options, reshard_after_forward
from workers.strategies.mesh import Coordinates
from workers.telemetry.memory import ActivationMeter, memory_report
from workers.train_loop import RunEnv, _dataset, run

GIB = 2**30
H200_TFLOPS = GPUS["h200"].bf16_tflops  # dense bf16 peak, the planner's table (H200 SXM: 989)
PROFILES = {  # micro batches: the largest the planner fits in 75% of the device is tried first
    "gpu": {"preset": "llama-1b", "seq": 2048, "steps": 8, "mbs": (16, 8, 4, 2, 1), "mem_mbs": 2,
            "lora_preset": "llama-7b", "lora_mbs": (8, 4, 2, 1), "allreduce_bytes": GIB,
            "deepspeed": ("--preset", "gpt-small", "--steps", "12", "--rounds", "2")},
    "tiny": {"preset": "gpt-tiny", "seq": 64, "steps": 4, "mbs": (8, 4), "mem_mbs": 2,
             "lora_preset": "gpt-small", "lora_mbs": (4, 2), "allreduce_bytes": 2**20,
             "deepspeed": ("--preset", "gpt-tiny", "--quick")},
}  # fmt: skip
DEEPSPEED_TIMEOUT_S = 480  # part 5's bench/zero_compare.py, then killed with the ranks it spawned
MIB = 2**20


def job(
    preset: str, *, seq: int, mbs: int, gbs: int, steps: int, gpu: bool, precision="bf16",
    recompute="none", lora: bool = False,
) -> JobSpec:  # fmt: skip
    """A one-worker job as etrain would get it (synthetic data, AdamW, FSDP strategy)."""
    model = {"preset": preset, "activation_checkpointing": recompute}
    if lora:
        model["lora"] = {"rank": 16, "alpha": 32, "target_modules": list(LORA_TARGETS)}
    return JobSpec.model_validate(
        {
            "name": "gpu-check",
            "model": model,
            "data": {"seq_len": seq, "num_samples": max(64, gbs * (steps + 1))},
            "parallelism": {"strategy": "fsdp"},
            "resources": {"workers": 1, "gpus_per_worker": int(gpu), "cpus_per_worker": 8},
            "train": {
                "steps": steps,
                "global_batch_size": gbs,
                "micro_batch_size": mbs,
                "precision": precision,
                "lr": 1e-4,
                "grad_clip": 1.0,
                "optimizer": "adamw",
            },
        }
    )


@dataclasses.dataclass(frozen=True)
class ShardedAtOne(Layout):
    """The planner's FSDP branch at dp=1 (etrain itself leaves one rank unwrapped; this
    script wraps it with ``fully_shard`` to measure FSDP2's own buffers)."""

    @property
    def fsdp(self) -> bool:
        return True


def predicted(spec: JobSpec, *, sharded: bool):
    """The planner's memory of the job's one rank."""
    layout = layout_of(spec, 1)
    if sharded:
        layout = ShardedAtOne(
            **{f.name: getattr(layout, f.name) for f in dataclasses.fields(layout)}
        )
    return worst_rank_memory(workload_of(spec), layout)


def largest_fitting(make, candidates, limit: int, attempt):
    """``attempt(spec)`` for the largest micro batch whose predicted device memory fits
    ``limit`` bytes; on a CUDA out-of-memory error, again with the next smaller one."""
    fits = [m for m in candidates if predicted(make(m), sharded=False).device_total <= limit]
    for mbs in fits or candidates[-1:]:
        try:
            return attempt(make(mbs))
        except torch.OutOfMemoryError as exc:
            print(f"micro batch {mbs}: out of memory ({exc}), trying a smaller one", flush=True)
        free(torch.device("cuda", torch.cuda.current_device()))  # the failed step's frames are gone
    raise RuntimeError(f"no micro batch of {candidates} fits")


def flops_per_token(cfg, seq: int, *, lora: bool = False) -> float:
    """The planner's count (service.planner.step_time): 6N (4N with a frozen base) + causal
    attention 6 * layers * seq * dim, forward + backward; no recompute counted (MFU, not HFU)."""
    return (4 if lora else 6) * count_params(cfg) + 6 * cfg.n_layers * seq * cfg.dim


def table(title: str, rows: list[dict]) -> str:
    """A markdown table of ``rows`` (the union of their keys, in first-seen order)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# -- 1. NCCL -------------------------------------------------------------------------------


def init_group(backend: str) -> None:
    """A world-1 process group (a fresh file store each time)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    store = Path(tempfile.mkdtemp(prefix="gpu-check-pg-")) / "store"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)


def timed_all_reduce(nbytes: int, device, iters: int = 10) -> float:
    """Mean seconds of an all_reduce of ``nbytes`` of fp32 (after 3 warm-ups)."""
    buf = torch.ones(nbytes // 4, device=device)
    for _ in range(3):
        dist.all_reduce(buf)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync(device)
    return (time.perf_counter() - t0) / iters


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def part_nccl(ctx) -> list[dict]:
    """Collectives at world 1 on the backend Ray's TorchConfig picks; then the group the
    training parts use (nccl, plus gloo for CPU tensors if nccl refuses them)."""
    device, backend = ctx["device"], ("nccl" if ctx["device"].type == "cuda" else "gloo")
    init_group(backend)
    x = torch.arange(1024, dtype=torch.float32, device=device)
    y = x.clone()
    dist.all_reduce(y)
    gathered = torch.empty(1024 * dist.get_world_size(), device=device)
    dist.all_gather_into_tensor(gathered, x)
    nbytes = ctx["p"]["allreduce_bytes"]
    secs = timed_all_reduce(nbytes, device)
    n = dist.get_world_size()
    rows = [
        {"check": "backend", "result": backend},
        {"check": "nccl version", "result": str(nccl_version())},
        {"check": "all_reduce sum correct", "result": bool(torch.equal(y, x * n))},
        {"check": "all_gather correct", "result": bool(torch.equal(gathered, x.repeat(n)))},
        {"check": f"all_reduce {nbytes / GIB:.3g} GiB, ms", "result": 1e3 * secs},
        {"check": "algbw GB/s (world 1: local, no link)", "result": nbytes / secs / 1e9},
        {"check": "busbw GB/s (2(n-1)/n x algbw)", "result": nbytes / secs / 1e9 * 2 * (n - 1) / n},
    ]
    try:  # what Stepper._reduce does with the loss: a CPU float64 all_reduce
        buf = torch.ones(2, dtype=torch.float64)
        dist.all_reduce(buf)
        rows.append({"check": "CPU float64 all_reduce (Stepper loss)", "result": "ok"})
        ctx["group"] = backend
    except Exception as exc:  # noqa: BLE001 - the finding itself
        rows.append({"check": "CPU float64 all_reduce (Stepper loss)", "result": f"FAILS: {exc}"})
        ctx["group"] = "cpu:gloo,cuda:nccl"
        init_group(ctx["group"])
    rows.append({"check": "group used by parts 2-4", "result": ctx["group"]})
    rows.append({"check": "multi-GPU NCCL", "result": "not checked: needs > 1 GPU"})
    return rows


def nccl_version():
    try:
        return torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - CPU builds
        return "n/a"


# -- 2. bf16 training through train_loop.run ----------------------------------------------


def free(device) -> None:
    """Drop cached blocks and restart the peak, so each measurement stands alone."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def train(spec: JobSpec, device):
    """``workers.train_loop.run`` as a one-worker job runs it (no checkpoints, no reporter)."""
    free(device)
    return run(spec, RunEnv(rank=0, world_size=1, device=device))


def throughput(ctx, cfg, seq: int, tokens_per_step: int, step_s: float, *, lora=False):
    """Tokens/s, achieved TFLOP/s, MFU against the GPU's dense bf16 peak, and the step time
    the planner assumes (its MFU of 0.4)."""
    fpt, peak = flops_per_token(cfg, seq, lora=lora), ctx["peak_tflops"]
    tflops = tokens_per_step / step_s * fpt / 1e12
    return {
        "tokens/s": tokens_per_step / step_s,
        "TFLOP/s": tflops,
        "MFU": tflops / peak if ctx["gpu"] else "n/a (CPU)",
        "planner step s (MFU 0.4)": tokens_per_step * fpt / (peak * 1e12 * PLANNER_MFU),
    }


def part_bf16(ctx) -> list[dict]:
    """llama-1b, bf16 autocast over fp32 master weights (train.precision bf16), one GPU."""
    p, device, gpu = ctx["p"], ctx["device"], ctx["gpu"]
    seq, steps, cfg = p["seq"], p["steps"], get_model_config(p["preset"])

    def make(mbs, **kw):
        return job(p["preset"], seq=seq, mbs=mbs, gbs=kw.pop("gbs", mbs), gpu=gpu, **kw)

    spec, res = largest_fitting(
        lambda m: make(m, steps=steps), p["mbs"], ctx["limit"], lambda s: (s, train(s, device))
    )
    mbs = spec.train.micro_batch_size
    res.parts.clear()  # the trained model leaves the GPU before the fp32 run
    ctx["plain"] = (spec, res.memory[0])
    step_s = statistics.median(res.step_times[1:])  # step 1 carries the memory meter
    # fp32 reference: the same weights and global batch, in micro batches of 1.
    ref = train(make(1, gbs=mbs, steps=1, precision="fp32"), device)
    b16, f32 = res.losses[1], ref.losses[1]
    row = {
        "model": f"{p['preset']} ({count_params(cfg) / 1e9:.3g}B)",
        "seq x micro batch": f"{seq} x {mbs}",
        "steps": steps,
        "step s (median of 2..)": step_s,
        **throughput(ctx, cfg, seq, mbs * seq, step_s),
        "loss step 1 bf16": b16,
        "loss step 1 fp32": f32,
        "rel diff": abs(b16 - f32) / abs(f32),
        f"loss step {steps}": res.losses[steps],
        "all finite": all(math.isfinite(v) for v in res.losses.values()),
        "peak MiB": res.memory[0]["peak_bytes"] / MIB,
    }
    return [row]


# -- 3./4. memory against the planner -----------------------------------------------------


def fast_model(spec: JobSpec, device):
    """build_model's module initialised on the device by ``init_weights`` (the device's RNG
    seeded from train.seed: a CPU init of billions of parameters takes minutes), then
    LoRA as ``train_loop._build`` adds it."""
    model = build_model(get_model_config(spec.model.preset), seed=spec.train.seed, device="meta")
    model.to_empty(device=device)
    torch.manual_seed(spec.train.seed)
    model.init_weights()
    model.checkpoint_blocks = spec.model.activation_checkpointing
    if spec.model.lora is not None:
        inject_lora(model, spec.model.lora)
        if spec.train.precision == "bf16":
            hold_frozen_linears_in(model, torch.bfloat16)
    return model


def shard_at_one(model, spec: JobSpec, device):
    """``fully_shard`` every block, then the root, with etrain's options, over a 1-rank mesh."""
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    cfg = StrategyConfig(parallelism=spec.parallelism, precision=spec.train.precision)
    opts = fully_shard_options(dp_mesh=mesh, cfg=cfg)
    rs = reshard_after_forward(spec.parallelism.fsdp)
    for block in decoder_blocks(model):
        fully_shard(block, reshard_after_forward=rs, **opts)
    fully_shard(model, **opts)
    return model


def measure(spec: JobSpec, device, *, shard: bool, steps: int) -> tuple[dict, list[float]]:
    """Steps of etrain's Stepper; step 1's ``memory_report`` and the step times."""
    free(device)
    model = fast_model(spec, device)
    if shard:
        shard_at_one(model, spec, device)
    if spec.model.lora is not None:
        init_lora([model], seed=spec.train.seed)
    dataset = _dataset(spec, get_model_config(spec.model.preset))
    t = spec.train
    stepper = Stepper(
        parts=[model],
        optimizers=[build_optimizer(model, train=t)],
        dataset=dataset,
        coords=Coordinates(),
        device=device,
        micro_batch_size=t.micro_batch_size,
        microbatches=1,
        precision=t.precision,
        grad_clip=t.grad_clip,
    )
    sampler = GlobalBatchSampler(len(dataset), seed=t.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, mem = [], {}
    for step in range(steps):
        stepper.meter = ActivationMeter(stepper.parts) if step == 0 else None
        t0 = time.perf_counter()
        stepper.step(sampler.next_global_batch(t.global_batch_size))
        sync(device)
        times.append(time.perf_counter() - t0)
        if step == 0:
            mem = memory_report(stepper.parts, stepper.optimizers, stepper.meter, device)
        stepper.zero_grad()
    del stepper, model
    free(device)
    return mem, times


def mem_row(name: str, mem: dict, pred) -> dict:
    """Measured / predicted MiB per component, and the ratios that matter."""
    st = pred.device_state

    def pair(measured: int, predicted_: int) -> str:
        return f"{measured / MIB:.1f} / {predicted_ / MIB:.1f}"

    return {
        "config": name,
        "params": pair(mem["params_bytes"], st.params),
        "grads": pair(mem["grads_bytes"], st.grads),
        "optimizer": pair(mem["optimizer_bytes"], st.optimizer),
        "activations": pair(mem["activations_bytes"], pred.activations),
        "act ratio": mem["activations_bytes"] / max(pred.activations, 1),
        "buffers pred": f"{pred.buffers / MIB:.1f}",
        "peak": pair(mem["peak_bytes"], pred.device_total),
        "peak ratio": mem["peak_bytes"] / max(pred.device_total, 1),
        "peak source": mem["peak_source"],
    }


def part_memory(ctx) -> list[dict]:
    """FSDP2 fully_shard at world 1: no / full / selective recompute, LoRA; and part 2's run."""
    p, device, gpu = ctx["p"], ctx["device"], ctx["gpu"]
    rows = []
    if "plain" in ctx:
        spec, mem = ctx["plain"]
        name = f"plain module (etrain fsdp at dp=1), mbs {spec.train.micro_batch_size}"
        rows.append(mem_row(name, mem, predicted(spec, sharded=False)))
    for recompute, lora in (("none", False), ("full", False), ("selective", False), ("none", True)):
        kw = {"seq": p["seq"], "mbs": p["mem_mbs"], "gbs": p["mem_mbs"], "steps": 1, "gpu": gpu}
        spec = job(p["preset"], recompute=recompute, lora=lora, **kw)
        name = f"fully_shard zero3 mbs {p['mem_mbs']}, recompute {recompute}"
        name += ", LoRA r16 all" if lora else ""
        try:
            mem, _ = measure(spec, device, shard=True, steps=1)
            rows.append(mem_row(name, mem, predicted(spec, sharded=True)))
        except Exception as exc:  # noqa: BLE001 - one row's failure is a result too
            traceback.print_exc()
            rows.append({"config": name, "params": f"ERROR {type(exc).__name__}: {exc}"[:300]})
    return rows


def part_lora(ctx) -> list[dict]:
    """LoRA rank 16 on all seven projections of a 7B-shaped model, bf16 frozen base, one rank."""
    p, device, gpu = ctx["p"], ctx["device"], ctx["gpu"]
    seq, preset = p["seq"], p["lora_preset"]

    def make(mbs):
        return job(preset, seq=seq, mbs=mbs, gbs=mbs, steps=6, gpu=gpu, lora=True)

    spec, (mem, times) = largest_fitting(
        make, p["lora_mbs"], ctx["limit"], lambda s: (s, measure(s, device, shard=False, steps=6))
    )
    cfg, mbs = get_model_config(preset), spec.train.micro_batch_size
    step_s = statistics.median(times[1:])
    row = {
        "model": f"{preset} ({count_params(cfg) / 1e9:.3g}B) + LoRA r16 on all 7 projections",
        "seq x micro batch": f"{seq} x {mbs}",
        "step s": step_s,
        **throughput(ctx, cfg, seq, mbs * seq, step_s, lora=True),
    }
    memory = mem_row("", mem, predicted(spec, sharded=False))
    return [row | {k: v for k, v in memory.items() if k != "config"}]


# -- 5. DeepSpeed ZeRO against FSDP: bench/zero_compare.py on this device ---------------------


def run_deepspeed_bench(args: list[str], timeout: float) -> dict:
    """``bench/zero_compare.py ARGS --json F``'s JSON, run in a session of its own: killed with
    the ranks it spawned when it outlives ``timeout``; its output's tail on a failure."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-ds-") as tmp:
        out = Path(tmp, "deepspeed.json")
        script = Path(__file__).resolve().with_name("zero_compare.py")
        cmd = [sys.executable, str(script), *args, "--json", str(out)]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            msg = f"bench/zero_compare.py ran past {timeout:.0f} s:\n{text[-2000:]}"
            raise RuntimeError(msg) from None
        print(text, flush=True)
        if proc.returncode or not out.exists():
            raise RuntimeError(f"bench/zero_compare.py exited {proc.returncode}:\n{text[-2000:]}")
        return json.loads(out.read_text())


def part_deepspeed(ctx) -> list[dict]:
    """DeepSpeed ZeRO-1/2/3 (with optimizer and parameter offload, with DeepSpeed's default
    5e8 reduce bucket) against FSDP ZeRO-2/3 on this device: ``bench/zero_compare.py`` with
    bf16 on CUDA (NCCL, one rank per GPU: world 1 on a one-GPU machine, where ZeRO
    partitions nothing and the rows compare what each engine keeps and costs), idle machine
    only. A process of its own: it spawns its ranks, and this one holds a process group."""
    args = ["--device", "cuda" if ctx["gpu"] else "cpu", "--no-busy", *ctx["p"]["deepspeed"]]
    data = run_deepspeed_bench(args, DEEPSPEED_TIMEOUT_S)
    rows, world = data["idle"], data["setup"]["world"]
    base = next(r for r in rows if r["layout"] == "fsdp zero3" and "error" not in r)
    out = []
    for r in rows:
        if "error" in r:
            out.append({"layout": r["layout"], "world": world, "tokens/s": f"ERROR {r['error']}"})
            continue
        out.append(
            {
                "layout": r["layout"],
                "world": world,
                "tokens/s": r["tokens_per_s"],
                "x fsdp3": r["tokens_per_s"] / base["tokens_per_s"],
                "step ms": r["step_ms"],
                "optim MiB": r["optimizer_bytes"] / MIB,
                "buckets MiB": r["buckets_bytes"] / MIB,
                "peak MiB": r["peak_bytes"] / MIB,
                "peak x fsdp3": r["peak_bytes"] / base["peak_bytes"],
                "save s": r["save_s"],
                "save x fsdp3": r["save_s"] / base["save_s"],
                "loss": r["final_loss"],
            }
        )
    return out


PARTS = {
    "nccl": part_nccl,
    "bf16": part_bf16,
    "memory": part_memory,
    "lora": part_lora,
    "deepspeed": part_deepspeed,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (gloo)")
    ap.add_argument("--tiny", action="store_true", help="tiny models (a dry run)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = not args.cpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    total = torch.cuda.get_device_properties(device).total_memory if gpu else 8 * GIB
    ctx = {"p": PROFILES["tiny" if args.tiny else "gpu"], "device": device, "gpu": gpu}
    ctx["limit"] = int(0.75 * total)
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    known = find_gpu(name) if gpu else None  # "NVIDIA H200" -> the planner's h200 entry
    ctx["peak_tflops"] = known.bf16_tflops if known else H200_TFLOPS
    report = {
        "device": name,
        "device_memory_gib": total / GIB,
        "torch": torch.__version__,
        "peak_bf16_tflops": ctx["peak_tflops"],
        "peak_from": f"planner table: {known.name}" if known else "H200 (989, device not in table)",
        "profile": "tiny" if args.tiny else "gpu",
        "parts": {},
    }
    print(
        f"# GPU check: {name}, torch {torch.__version__}, peak {ctx['peak_tflops']} TFLOP/s "
        f"({report['peak_from']})\n"
    )
    failed = 0
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            rows = PARTS[part](ctx)
            entry = {"rows": rows}
            print(table(f"{part} ({time.perf_counter() - t0:.1f} s)", rows), flush=True)
        except Exception as exc:  # noqa: BLE001 - one part's failure must not lose the others
            failed += 1
            entry = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            print(f"### {part}: FAILED\n\n```\n{entry['traceback']}```\n", flush=True)
        entry["seconds"] = time.perf_counter() - t0
        report["parts"][part] = entry
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
