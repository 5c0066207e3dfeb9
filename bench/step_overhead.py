"""Per-step and start-up overhead of etrain's Ray Train path against plain torchrun.

One run of this script trains the same job (gpt-tiny, synthetic data, DDP over
2 gloo workers, AdamW, no checkpoints) through ``workers.train_loop.run`` in
several ways and prints one table:

* ``torchrun``: ``torchrun --nproc-per-node 2`` running this file with
  ``--worker`` (``init_process_group("gloo")`` then ``run``). The baseline.
* ``etrain (Ray)``: a Ray Train ``TorchTrainer`` built like
  ``workers.launch.build_trainer`` (failure config, ``EventCallback``) whose
  train function builds ``RunEnv`` as ``workers.worker_entry.train_fn`` does, with the
  rank-0 ``TelemetryReporter`` posting per-step metrics to a local HTTP sink
  (the stand-in for the control plane) and no checkpoints (``RunEnv.checkpoints`` None).
* ``bare Ray Train``: the same ``TorchTrainer`` and ``run`` without anything
  etrain adds (no reporter, no callback, default run config).
* ``etrain + fix``: the etrain path with the candidate fix
  ``FIX_WORKER_RUNTIME_ENV`` (train workers at nice 0; see ``bench/README.md``).
* ``etrain+tb``: the etrain path with ``metrics.tensorboard`` on, rank 0 writing
  event files under a temporary checkpoint root (the run stops one step before
  the spec's last, so no checkpoint is ever due).

Ray runs on a private local head (``ray start --head --block`` with token auth,
GCS 6420, dashboard 8290) that this script starts and stops. The paths are
interleaved and repeated (``--repeats``); the table shows the median over
repeats of each repeat's per-step median and mean (first ``--warmup`` steps
excluded), start-up: wall time from launch (``Popen`` of torchrun, or
``trainer.fit()`` on a connected driver) to the end of the first step, and the
training thread's CPU time per step: ``time.thread_time()`` on the thread that
runs the loop, read at the start of every step (when the loop asks the sampler
for the step's batch), so each delta holds everything the loop does per step
(metrics, checkpoint checks, telemetry queueing); median per repeat, then the
median over repeats.

Last, what etrain's loop itself adds to the training thread per step is timed on its
own (``etrain_step_work_ms``: rank 0's metric point queued to a live reporter, the
only per-step work the ``etrain`` path has beyond ``bare``, a few thousand times): on 2
shared cores the paths' CPU per step varies by several percent from repeat to repeat,
more than the difference the ratio lines look for.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.telemetry_sink import TelemetrySink

PATHS = ("torchrun", "etrain", "bare", "etrain-fix", "etrain-tb")
# bare is opt-in: it differs from etrain only by the reporter and the callback,
# and a fourth path pushes a 3-repeat run past 5 minutes on 2 cores.
DEFAULT_PATHS = ("torchrun", "etrain", "etrain-fix")
LABELS = {
    "torchrun": "torchrun",
    "etrain": "etrain (Ray)",
    "bare": "bare Ray Train",
    "etrain-fix": "etrain + fix",
    "etrain-tb": "etrain+tb",
}
GCS_PORT, DASHBOARD_PORT = 6420, 8290


# ---------------------------------------------------------------- worker side


def build_spec_dict(*, steps: int, seq_len: int, global_batch: int, micro: int) -> dict:
    """The benchmark job as spec JSON: gpt-tiny, synthetic, DDP on 2 CPU workers."""
    return {
        "name": "bench-step-overhead",
        "model": {"preset": "gpt-tiny"},
        "data": {"source": "synthetic", "seq_len": seq_len},
        "parallelism": {"strategy": "ddp"},
        "resources": {"workers": 2, "cpus_per_worker": 1},
        "train": {
            "steps": steps,
            "global_batch_size": global_batch,
            "micro_batch_size": micro,
            "optimizer": "adamw",
        },
        "checkpoint": {"every_steps": None},
    }


# The candidate fix (see bench/README.md): Ray starts every worker process at
# nice 15 (RAY_worker_niceness) while its own daemons, and torchrun's ranks, run
# at nice 0. Asking for nice 0 for the train workers only, through
# RunConfig(worker_runtime_env=...), is what workers/launch.py would add.
FIX_WORKER_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}


def _busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait


def _probe(torch) -> dict:
    return {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_env": os.environ.get("OMP_NUM_THREADS"),
        "main_thread": threading.current_thread() is threading.main_thread(),
        "py_threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "affinity": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


def timed_run(spec_dict: dict, env, out_dir: str) -> None:
    """Run the loop under ``env`` and write this rank's timings to ``out_dir``."""
    import torch

    from workers import stepper, train_loop
    from workers.spec import JobSpec

    spec = JobSpec.model_validate(spec_dict)
    reduce_s: list[float] = []
    original = stepper.Stepper._reduce

    def timed_reduce(self, local, flag):  # the per-step loss all_reduce
        t = time.perf_counter()
        out = original(self, local, flag)
        reduce_s.append(time.perf_counter() - t)
        return out

    stepper.Stepper._reduce = timed_reduce
    # The start of every step: the loop asks for the step's batch first thing.
    marks: list[tuple[float, float]] = []  # (thread CPU, process CPU) at each step start
    next_batch = train_loop.GlobalBatchSampler.next_global_batch

    def marked_next_batch(self, n):
        marks.append((time.thread_time(), time.process_time()))
        return next_batch(self, n)

    train_loop.GlobalBatchSampler.next_global_batch = marked_next_batch
    before = _probe(torch)
    t_cpu, t_thread, j0, w0 = os.times(), time.thread_time(), _busy_jiffies(), time.time()
    result = train_loop.run(spec, env)
    t_end, j1, t_cpu1 = time.time(), _busy_jiffies(), os.times()
    train_loop.GlobalBatchSampler.next_global_batch = next_batch
    stepper.Stepper._reduce = original
    rec = {
        "rank": env.rank,
        "step_times": result.step_times,
        "reduce_s": reduce_s,
        # the end of step 1, from the end of the run minus the later steps
        "first_step_end": t_end - sum(result.step_times[1:]),
        "wall_s": t_end - w0,
        "before": before,
        "during": _probe(torch),
        "proc_cpu_s": (t_cpu1.user + t_cpu1.system) - (t_cpu.user + t_cpu.system),
        "thread_cpu_s": time.thread_time() - t_thread,
        # step k's CPU: from its start to step k+1's (so the last step has none)
        "step_thread_cpu_s": [b[0] - a[0] for a, b in itertools.pairwise(marks)],
        "step_proc_cpu_s": [b[1] - a[1] for a, b in itertools.pairwise(marks)],
        "machine_busy_s": (j1 - j0) / os.sysconf("SC_CLK_TCK"),
    }
    Path(out_dir, f"rank{env.rank}.json").write_text(json.dumps(rec))


def torchrun_worker(args: argparse.Namespace) -> None:
    """``--worker``: one torchrun rank (gloo), the same loop, timings to a file."""
    import torch
    import torch.distributed as dist

    from workers.train_loop import RunEnv

    dist.init_process_group("gloo")
    try:
        env = RunEnv(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            device=torch.device("cpu"),
        )
        timed_run(json.loads(args.spec), env, args.out)
    finally:
        dist.destroy_process_group()


def ray_train_fn(config: dict) -> None:
    """Ray Train worker: ``RunEnv`` as ``worker_entry.train_fn`` builds it, no checkpoints."""
    import ray.train
    import torch

    from workers.storage.location import locate
    from workers.telemetry.reporter import TelemetryReporter
    from workers.train_loop import RunEnv

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    reporter = None
    if config["report_url"] and rank == 0:  # etrain: rank 0 reports per-step metrics
        reporter = TelemetryReporter(url=config["report_url"], token=None, job_id=config["job_id"])
    env = RunEnv(
        rank=rank,
        world_size=ctx.get_world_size(),
        device=torch.device("cpu"),
        # etrain+tb: TensorBoard files go under the checkpoint root; none is saved.
        checkpoints=locate(config["tb_root"]) if config.get("tb_root") else None,
        reporter=reporter,
        stop_at=config.get("stop_at"),
    )
    try:
        timed_run(config["spec"], env, config["out"])
    finally:
        if reporter is not None:
            reporter.close()


# ---------------------------------------------------------------- driver side


class LocalRay:
    """A private ``ray start --head --block`` child with token auth; stop() takes it all down."""

    def __init__(self, work: Path):
        self.work, self.proc = work, None
        self.temp_dir = f"/tmp/etrain-bench-ray-{GCS_PORT}"

    def start(self) -> str:
        token = self.work / "ray_auth_token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        ray_bin = str(Path(sys.executable).with_name("ray"))
        # Ports away from the defaults so a concurrent `etrain serve` head is not disturbed.
        cmd = [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={GCS_PORT}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={DASHBOARD_PORT}",
            f"--temp-dir={self.temp_dir}",
            "--ray-client-server-port=10421",
            "--dashboard-agent-listen-port=52421",
            "--min-worker-port=21000",
            "--max-worker-port=21999",
            "--disable-usage-stats",
        ]
        # The child keeps its own copy of the log's descriptor; ours is closed after the start.
        with open(self.work / "ray-head.log", "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        import ray
        from ray._private.services import get_node_ip_address

        address = f"{get_node_ip_address()}:{GCS_PORT}"
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray head exited; see {self.work / 'ray-head.log'}")
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
                return address
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def stop(self) -> None:
        import ray

        from service.backends.embedded import stop_blocking_start

        ray.shutdown()
        if self.proc is not None:
            stop_blocking_start(self.proc, 60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_ranks(out: Path) -> list[dict]:
    return [json.loads(out.joinpath(f"rank{r}.json").read_text()) for r in (0, 1)]


def launch_torchrun(spec: dict, out: Path) -> tuple[float, list[dict]]:
    """Run torchrun; return the launch wall time and both ranks' records."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        os.path.abspath(__file__),
        "--worker",
        "--out",
        str(out),
        "--spec",
        json.dumps(spec),
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"torchrun failed:\n{proc.stderr[-3000:]}")
    return t0, _read_ranks(out)


def launch_ray(path: str, spec: dict, out: Path, *, report_url: str) -> tuple[float, list[dict]]:
    """Run one TorchTrainer.fit() on the connected cluster; same return as launch_torchrun."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from workers.elastic.callbacks import EventCallback

    etrain = path != "bare"
    job_id = f"bench-{path}-{out.name}"
    config = {
        "spec": spec,
        "out": str(out),
        "job_id": job_id,
        "report_url": report_url if etrain else None,
    }
    if path == "etrain-tb":
        # One step more in the spec than is run: the loop's save at the spec's last
        # step never comes, and the other paths' steps and schedule are kept.
        train = {**spec["train"], "steps": spec["train"]["steps"] + 1}
        config["spec"] = {**spec, "train": train, "metrics": {"tensorboard": True}}
        config["stop_at"] = spec["train"]["steps"]
        config["tb_root"] = str(out / "checkpoints")
    scaling = ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1})
    run_kw = {"name": job_id, "storage_path": str(out.parent / "ray-storage")}
    if etrain:  # what workers.launch.build_trainer adds
        run_kw.update(
            failure_config=FailureConfig(max_failures=3), callbacks=[EventCallback(job_id)]
        )
    if path == "etrain-fix":
        run_kw["worker_runtime_env"] = FIX_WORKER_RUNTIME_ENV
    trainer = TorchTrainer(
        ray_train_fn,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=RunConfig(**run_kw),
    )
    t0 = time.time()
    trainer.fit()
    return t0, _read_ranks(out)


def summarize(t0: float, ranks: list[dict], warmup: int) -> dict:
    """One run's numbers: per-step median/mean (slowest rank decides), start-up, CPU use."""
    steps = [max(a, b) for a, b in zip(ranks[0]["step_times"], ranks[1]["step_times"], strict=True)]
    kept = steps[warmup:]
    r0 = ranks[0]
    others = r0["machine_busy_s"] - sum(r["proc_cpu_s"] for r in ranks)
    return {
        "median_ms": 1e3 * statistics.median(kept),
        "mean_ms": 1e3 * statistics.mean(kept),
        "startup_s": max(r["first_step_end"] for r in ranks) - t0,
        "reduce_median_ms": 1e3 * statistics.median(r0["reduce_s"][warmup:]),
        # per rank: median over the steps after warm-up of the training thread's CPU
        "thread_cpu_ms": [1e3 * statistics.median(r["step_thread_cpu_s"][warmup:]) for r in ranks],
        "proc_cpu_ms": [1e3 * statistics.median(r["step_proc_cpu_s"][warmup:]) for r in ranks],
        "run_thread_cpu_s": r0["thread_cpu_s"],  # the whole run() on rank 0, build included
        "other_cores_busy": others / r0["wall_s"],
        "threads": {
            f"rank{r['rank']}": {"before": r["before"], "during": r["during"]} for r in ranks
        },
    }


def _median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _cpu(runs: list[dict], key: str, rank: int) -> float:
    return statistics.median(r[key][rank] for r in runs)


def _ratio(results: dict, a: str, b: str, value) -> str:
    if a not in results or b not in results:
        return "-"
    return f"{value(results[a]) / value(results[b]):.3f}"


def print_cpu_table(results: dict[str, list[dict]]) -> None:
    """Training-thread CPU per step (both ranks) and the ratios the goals are stated in."""
    print(
        f"{'path':<16}{'train-thread CPU ms/step r0 / r1':>34}{'process CPU ms/step r0':>24}"
        f"{'per-repeat thread CPU r0':>28}"
    )
    for path, runs in results.items():
        reps = " ".join(f"{r['thread_cpu_ms'][0]:.2f}" for r in runs)
        both = f"{_cpu(runs, 'thread_cpu_ms', 0):.2f} / {_cpu(runs, 'thread_cpu_ms', 1):.2f}"
        print(f"{LABELS[path]:<16}{both:>34}{_cpu(runs, 'proc_cpu_ms', 0):>24.2f}{reps:>28}")
    print()

    def cpu(runs):  # rank 0: the rank that reports and writes TensorBoard
        return _cpu(runs, "thread_cpu_ms", 0)

    def step(runs):
        return _median_of(runs, "median_ms")

    for label, a, b, value in (
        ("etrain / bare Ray Train, training-thread CPU per step", "etrain", "bare", cpu),
        ("etrain / torchrun, step time (median of medians)", "etrain", "torchrun", step),
        ("etrain / torchrun, training-thread CPU per step", "etrain", "torchrun", cpu),
    ):
        print(f"{label + ':':<56}{_ratio(results, a, b, value)}")
    print(
        f"tensorboard on / off (etrain+tb / etrain): step time "
        f"{_ratio(results, 'etrain-tb', 'etrain', step)}, "
        f"training-thread CPU {_ratio(results, 'etrain-tb', 'etrain', cpu)}"
    )


def print_table(results: dict[str, list[dict]]) -> None:
    """The comparison table: medians over repeats, ratios against torchrun."""
    base = results.get("torchrun")
    head = (
        f"{'path':<16}{'start-up s':>11}{'step median ms':>16}{'step mean ms':>14}"
        f"{'ratio vs torchrun (median)':>28}{'ratio (mean)':>14}"
    )
    print(head)
    print("-" * len(head))
    for path, runs in results.items():
        med, mean = _median_of(runs, "median_ms"), _median_of(runs, "mean_ms")
        ratio = f"{med / _median_of(base, 'median_ms'):.3f}" if base else "-"
        ratio_mean = f"{mean / _median_of(base, 'mean_ms'):.3f}" if base else "-"
        print(
            f"{LABELS[path]:<16}{_median_of(runs, 'startup_s'):>11.2f}{med:>16.2f}"
            f"{mean:>14.2f}{ratio:>28}{ratio_mean:>14}"
        )
    print()
    print_cpu_table(results)
    print()
    print(
        f"{'path':<16}{'per-repeat step medians ms':>30}{'loss all_reduce ms':>20}"
        f"{'run() thread CPU s':>20}{'other cores busy':>18}"
    )
    for path, runs in results.items():
        meds = " ".join(f"{r['median_ms']:.1f}" for r in runs)
        print(
            f"{LABELS[path]:<16}{meds:>30}{_median_of(runs, 'reduce_median_ms'):>20.2f}"
            f"{_median_of(runs, 'run_thread_cpu_s'):>20.2f}"
            f"{_median_of(runs, 'other_cores_busy'):>18.2f}"
        )
    print()
    for path, runs in results.items():
        t = runs[-1]["threads"]["rank0"]
        print(
            f"{LABELS[path]:<16} rank0 before run(): torch threads "
            f"{t['before']['torch_threads']}, interop {t['before']['interop_threads']}, "
            f"OMP_NUM_THREADS={t['before']['omp_env']}, main thread {t['before']['main_thread']}"
            f"; during: torch threads {t['during']['torch_threads']}, "
            f"OS threads {t['during']['os_threads']}, nice {t['during']['nice']}"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=5, help="leading steps left out of the stats")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds over the paths")
    p.add_argument(
        "--paths",
        default=",".join(DEFAULT_PATHS),
        help=f"comma-separated subset of {','.join(PATHS)}",
    )
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--json", metavar="OUT", help="also write every run's numbers here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = set(args.paths.split(",")) - set(PATHS)
    if unknown:
        p.error(f"unknown --paths {sorted(unknown)}; choose from {','.join(PATHS)}")
    if args.warmup >= args.steps:
        p.error("--warmup must be < --steps")
    return args


def bench(args: argparse.Namespace, work: Path) -> dict[str, list[dict]]:
    """Interleave the paths ``repeats`` times (rotating the order); return runs per path."""
    spec = build_spec_dict(
        steps=args.steps, seq_len=args.seq_len, global_batch=args.global_batch, micro=args.micro
    )
    paths = [p for p in PATHS if p in args.paths.split(",")]
    results: dict[str, list[dict]] = {p: [] for p in paths}
    ray_head = LocalRay(work) if any(p != "torchrun" for p in paths) else None
    sink = TelemetrySink()
    url = sink.url
    try:
        if ray_head is not None:
            t = time.time()
            print(f"ray head at {ray_head.start()} ({time.time() - t:.1f}s)", flush=True)
        for rep in range(args.repeats):
            k = rep % len(paths)
            for path in paths[k:] + paths[:k]:
                out = work / f"{path}-{rep}"
                out.mkdir()
                if path == "torchrun":
                    t0, ranks = launch_torchrun(spec, out)
                else:
                    t0, ranks = launch_ray(path, spec, out, report_url=url)
                s = summarize(t0, ranks, args.warmup)
                results[path].append(s)
                print(
                    f"[{rep + 1}/{args.repeats}] {LABELS[path]:<15} median "
                    f"{s['median_ms']:.2f} ms, mean {s['mean_ms']:.2f} ms, "
                    f"start-up {s['startup_s']:.1f}s",
                    flush=True,
                )
    finally:
        if ray_head is not None:
            ray_head.stop()
        sink.close()
    points = sum(len(b.get("metrics", [])) for b in sink.batches)
    print(f"telemetry points received by the sink: {points}")
    return results


def etrain_step_work_ms(spec_dict: dict, calls: int = 3000) -> float:
    """What etrain's loop adds to the training thread per step, timed on its own: rank 0's
    metric point (``train_loop._emit_metric``, as the loop calls it) queued to a live
    reporter posting to a local sink, less the same loop without it. Returns ms per step."""
    from types import SimpleNamespace

    import torch

    from workers import train_loop
    from workers.spec import JobSpec
    from workers.telemetry.reporter import TelemetryReporter

    spec = JobSpec.model_validate(spec_dict)
    sink = TelemetrySink()
    reporter = TelemetryReporter(url=sink.url, token=None, job_id="bench-step-work")
    env = train_loop.RunEnv(rank=0, world_size=2, device=torch.device("cpu"), reporter=reporter)
    stepper = SimpleNamespace(optimizers=[SimpleNamespace(param_groups=[{"lr": 1e-3}])])
    stepper.grad_norm = 1.0
    sampler = SimpleNamespace(state_dict=lambda: {"epoch": 0, "position": 0})
    times = {}
    try:
        for name in ("baseline", "emit"):
            t = time.thread_time()
            for step in range(calls):
                if name == "emit":
                    train_loop._emit_metric(
                        spec, env, step=step, loss=1.0, dt=0.03, stepper=stepper,
                        sampler=sampler, dataset_len=100,
                    )  # fmt: skip
                time.sleep(0.0005)  # the reporter's thread runs between steps, as in training
            times[name] = 1e3 * (time.thread_time() - t) / calls
    finally:
        reporter.close()
        sink.close()
    return times["emit"] - times["baseline"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--worker``, one torchrun rank)."""
    args = parse_args(argv)
    if args.worker:
        torchrun_worker(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="etrain-bench-") as tmp:
        t, load_before = time.time(), os.getloadavg()
        results = bench(args, Path(tmp))
        load = " ".join(f"{x:.2f}" for x in load_before + os.getloadavg())
        print(
            f"\n{args.steps} steps, warm-up {args.warmup}, {args.repeats} repeats, "
            f"total {time.time() - t:.0f}s; medians over repeats; load average "
            f"(1, 5, 15 min) before, after: {load}\n"
        )
        print_table(results)
        work_ms = etrain_step_work_ms(
            build_spec_dict(
                steps=args.steps,
                seq_len=args.seq_len,
                global_batch=args.global_batch,
                micro=args.micro,
            )
        )
        step_ms = _cpu(results["etrain"], "thread_cpu_ms", 0) if "etrain" in results else None
        share = f" ({100 * work_ms / step_ms:.2f} % of etrain's {step_ms:.2f})" if step_ms else ""
        print(
            f"\netrain's own per-step work on the training thread, timed alone: "
            f"{work_ms:.3f} ms{share}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
