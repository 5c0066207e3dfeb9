"""What each Ray Train worker runs: ``train_fn`` builds the worker's ``RunEnv`` and runs the loop.

The job driver (:mod:`workers.launch`) hands ``train_fn`` to the ``TorchTrainer``; Ray
Train calls it in every worker process with the loop config the driver built (the
spec as JSON, the job id, the driver's start-up timestamps and node).
"""

from __future__ import annotations

import contextlib
import time
from functools import partial

from workers.spec import JobSpec


def job_storage(spec: JobSpec):
    """The job's checkpoint store (credentials from this process's environment)."""
    from workers.storage.location import StorageError, resolve_store

    if not spec.checkpoint.storage:
        raise StorageError(
            "checkpoint.storage must be set before launch (the service fills in its default)"
        )
    return resolve_store(spec.checkpoint.storage, spec.stores)


def train_fn(config: dict) -> None:
    """Ray Train worker entry point: re-validate the spec and run the loop."""
    import ray.train
    import torch

    from workers.hooks import load_hooks
    from workers.telemetry.reporter import TelemetryReporter
    from workers.train_loop import RunEnv, run
    from workers.warm import spares as warm_spares
    from workers.warm import speculation, startup_times

    entered = time.time()
    warm_spares.claim()
    # While this process trains, idle standbys' prestarts wait; the marker goes with the run
    # (a pid's marker left behind would hold them back once the pid is reused).
    busy = contextlib.ExitStack()
    busy.enter_context(speculation.busy())
    spec = JobSpec.model_validate(config["spec"])
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    if spec.resources.gpus_per_worker > 0:
        import ray.train.torch as rtt

        device = rtt.get_device()
    else:
        device = torch.device("cpu")
    _check_placement(spec, node_rank=ctx.get_node_rank())
    reporter = TelemetryReporter.from_env(config["job_id"]) if rank == 0 else None
    if reporter is not None:
        startup = startup_times.worker_startup(config.get("startup"), train_fn=entered)
        startup_times.stamp_workers_started(reporter, startup)
    env = RunEnv(
        rank=rank,
        world_size=ctx.get_world_size(),
        device=device,
        checkpoints=job_storage(spec).child(config["job_id"], "checkpoints"),
        reporter=reporter,
        hooks=load_hooks(),
        # After the first step every worker has claimed its process, so each
        # node's spares can be counted and topped up for the next restart.
        after_first_step=partial(
            warm_spares.top_up_in_background, controller_node=config.get("driver_node")
        ),
    )
    try:
        run(spec, env)
    finally:
        busy.close()
        if reporter is not None:
            reporter.close()


def _check_placement(spec: JobSpec, *, node_rank: int) -> None:
    """Refuse to train when a TP group's consecutive world ranks landed on different nodes."""
    import torch.distributed as dist

    from workers.strategies.mesh import check_tp_placement

    if spec.parallelism.tp == 1 or not dist.is_initialized():
        return
    nodes: list = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node_rank)
    check_tp_placement(nodes, tp=spec.parallelism.tp)
