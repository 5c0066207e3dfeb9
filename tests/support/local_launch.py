"""Run job specs on N local processes with gloo, without Ray (tests and benchmarks).

One group of processes runs a list of jobs in order, so process start-up and
``init_process_group`` are paid once for a whole strategy matrix. Each job
builds its own mesh from its spec; every job must use all ``world_size``
ranks. Rank 0 writes each job's result (losses, step times, per-rank memory)
as JSON; a job that raises is recorded with its error and the rest go on.

:func:`run_local_groups` runs groups of different world sizes on one set of
processes (as many as the largest group): each group is a process group of its
own over the first ranks, and the others wait for it to end. Spawning a process
and importing torch and the workers costs seconds of CPU, so the ranks are spawned once
per process (a test session, a benchmark) and kept: each call hands them its plan, its
output folder and the caller's environment, and a rank that dies takes the pool with it
(the next call starts a new one). A rank runs each plan in a fork of itself, which ends
with the plan: gloo keeps every process group's threads after it is destroyed (each
wakes a few times a second), so a rank that ran the plans itself would gather hundreds
of them, and the memory of every job, and slow the whole machine down while it waits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = timedelta(seconds=120)  # rendezvous and collectives
POOL_SIZE = 4  # ranks kept: every caller's largest group


@dataclass(frozen=True)
class LocalJob:
    """One spec to run, and where its checkpoints go (a path or a URI of the spec's stores;
    None: no checkpoints)."""

    name: str
    spec: dict
    checkpoint_root: str | None = None
    stop_at: int | None = None
    # Record each rank's memory at the first step, with the activations traced through it
    # (every op: a second or more per job) unless trace_activations is False.
    measure_memory: bool = False
    trace_activations: bool = True


@dataclass
class LocalResult:
    """What rank 0 saw of one job."""

    losses: dict[int, float] = field(default_factory=dict)
    eval_losses: dict[int, float] = field(default_factory=dict)
    metrics: dict[int, dict] = field(default_factory=dict)  # the objective's, by step
    step_times: list[float] = field(default_factory=list)
    memory: list[dict] | None = None
    resumed_from: int | None = None
    error: str | None = None
    wall_s: float = 0.0  # rank 0's time for the job: set-up, steps and saves


def rendezvous(world_size: int) -> dist.TCPStore:
    """A group's rendezvous store, served by this (the parent) process on a port it keeps
    bound for the whole run: a port found free and bound again later by rank 0 could be
    taken in between by any other process on the machine (EADDRINUSE)."""
    return dist.TCPStore(
        "127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=TIMEOUT
    )


def _worker(rank: int, groups: list[tuple[int, int, list[LocalJob]]], out: str) -> None:
    """Run each (world_size, port, jobs) group this rank belongs to; a rank outside a group
    waits for the group's end (a file rank 0 writes after the group's last barrier)."""
    for i, (world_size, port, jobs) in enumerate(groups):
        done = Path(out, f"group{i}.done")
        if rank >= world_size:
            while not done.exists():
                time.sleep(0.1)
            continue
        _run_group(rank, world_size, port, jobs, out)
        if rank == 0:
            done.touch()


def join_group(rank: int, world_size: int, port: int) -> None:
    """Join the gloo process group whose :func:`rendezvous` store serves ``port``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)


def _run_group(rank: int, world_size: int, port: int, jobs: list[LocalJob], out: str) -> None:
    join_group(rank, world_size, port)
    from workers.spec import JobSpec
    from workers.storage.location import locate
    from workers.train_loop import RunEnv, run

    for job in jobs:
        record: dict = {}
        t0 = time.perf_counter()
        try:
            spec = JobSpec.model_validate(job.spec)
            root = job.checkpoint_root
            res = run(
                spec,
                RunEnv(
                    rank=rank,
                    world_size=world_size,
                    device=torch.device("cpu"),
                    checkpoints=locate(root, spec.stores) if root else None,
                    stop_at=job.stop_at,
                    measure_memory=job.measure_memory,
                    trace_activations=job.trace_activations,
                ),
            )
            record = {
                "losses": res.losses,
                "eval_losses": res.eval_losses,
                "metrics": res.metrics,
                "step_times": res.step_times,
                "memory": res.memory,
                "resumed_from": res.resumed_from,
                "wall_s": time.perf_counter() - t0,
            }
        except Exception:  # noqa: BLE001 - recorded for the caller, the next job runs
            record = {"error": f"rank {rank}: {traceback.format_exc()}"}
        if rank == 0 or "error" in record:
            Path(out, f"{job.name}.rank{rank}.json").write_text(json.dumps(record))
        dist.barrier()
    dist.destroy_process_group()


def run_local(jobs: list[LocalJob], *, world_size: int) -> dict[str, LocalResult]:
    """Run ``jobs`` in order on ``world_size`` local ranks; results by job name."""
    return run_local_groups([(world_size, jobs)])


def run_local_groups(groups: list[tuple[int, list[LocalJob]]]) -> dict[str, LocalResult]:
    """Run each ``(world_size, jobs)`` group in turn, its jobs in order, on the process's
    pool of spawned ranks (:data:`POOL_SIZE`, or the largest world size if more); results
    by job name, which must be unique across the groups."""
    names = [job.name for _, jobs in groups for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"job names repeat across the groups: {sorted(names)}")
    stores = [rendezvous(world) for world, _ in groups]  # held until the plan ends
    plan = [(world, st.port, jobs) for (world, jobs), st in zip(groups, stores, strict=True)]
    with tempfile.TemporaryDirectory() as out:
        pool = _ranks(max(POOL_SIZE, *(world for world, _ in groups)))
        try:
            pool.run(plan, out)
        except BaseException:  # a rank that failed outside a job may be anywhere: start anew
            close_pool()
            raise
        return {
            job.name: _collect(Path(out), job.name, world) for world, jobs in groups for job in jobs
        }


# -- the ranks, kept for the whole process --------------------------------------------------


class _Pool:
    """``size`` spawned ranks that run one plan after another: each call of
    :func:`run_local_groups` hands every rank the plan, the output folder and the caller's
    environment (a test may set variables, such as object-store keys, before it calls)."""

    def __init__(self, size: int):
        ctx = mp.get_context("spawn")
        self.size = size
        self.tasks = [ctx.SimpleQueue() for _ in range(size)]
        self.done = ctx.Queue()
        self.procs = [
            ctx.Process(target=_serve, args=(rank, self.tasks[rank], self.done), daemon=False)
            for rank in range(size)
        ]
        for proc in self.procs:
            proc.start()

    def run(self, plan: list, out: str) -> None:
        """Run ``plan`` on every rank; raise if a rank failed outside a job or died."""
        for tasks in self.tasks:
            tasks.put((plan, out, dict(os.environ)))
        failures, finished = [], 0
        while finished < self.size:
            try:
                rank, failure = self.done.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in self.procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"a local rank died (exit codes {dead})") from None
                continue
            finished += 1
            if failure:
                failures.append(f"rank {rank}: {failure}")
        if failures:
            raise RuntimeError("\n".join(failures))

    def close(self) -> None:
        """Stop the ranks (they end between plans; one still in a plan is terminated)."""
        for tasks in self.tasks:
            with contextlib.suppress(OSError, ValueError):
                tasks.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()


def _serve(rank: int, tasks, done) -> None:
    """A pool rank: run each plan it is handed, in the caller's environment, in a fork of
    this process (torch and the workers imported once, here), until None."""
    import workers.train_loop  # noqa: F401 - what every fork would import

    while (task := tasks.get()) is not None:
        plan, out, env = task
        failed = Path(out, f"rank{rank}.failure")
        pid = os.fork()
        if pid == 0:  # the plan's process: nothing of it outlives the plan
            code = 0
            try:
                os.environ.clear()
                os.environ.update(env)
                _worker(rank, plan, out)
            except BaseException:  # noqa: BLE001 - reported to the caller, the rank goes on
                failed.write_text(traceback.format_exc())
                code = 1
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        failure = failed.read_text() if failed.exists() else None
        if failure is None and status != 0:
            failure = f"the plan's process ended with {status}"
        done.put((rank, failure))


_pool: list[_Pool] = []


def _ranks(size: int) -> _Pool:
    """The process's pool of at least ``size`` ranks (started, or grown, on first need)."""
    if _pool and _pool[0].size >= size and all(p.is_alive() for p in _pool[0].procs):
        return _pool[0]
    close_pool()
    _pool.append(_Pool(size))
    return _pool[0]


def pool_threads() -> list[int]:
    """How many threads each rank of the process's pool has now (none: no pool)."""
    return [len(os.listdir(f"/proc/{p.pid}/task")) for p in _pool[0].procs] if _pool else []


@atexit.register
def close_pool() -> None:
    """Stop the pool's ranks (at exit; a test session may call it sooner)."""
    while _pool:
        _pool.pop().close()


def _collect(out: Path, name: str, world_size: int) -> LocalResult:
    errors = [
        json.loads((out / f"{name}.rank{r}.json").read_text())["error"]
        for r in range(world_size)
        if (out / f"{name}.rank{r}.json").exists()
        and "error" in json.loads((out / f"{name}.rank{r}.json").read_text())
    ]
    if errors:
        return LocalResult(error="\n".join(errors))
    data = json.loads((out / f"{name}.rank0.json").read_text())
    return LocalResult(
        losses={int(k): v for k, v in data["losses"].items()},
        eval_losses={int(k): v for k, v in data["eval_losses"].items()},
        metrics={int(k): v for k, v in data["metrics"].items()},
        step_times=data["step_times"],
        memory=data["memory"],
        resumed_from=data["resumed_from"],
        wall_s=data["wall_s"],
    )
