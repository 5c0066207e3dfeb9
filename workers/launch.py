"""The job driver: ``python -m workers.launch`` runs as a Ray job and drives a TorchTrainer.

The service passes the job through the environment of the Ray job:
``ETRAIN_JOB_ID``, ``ETRAIN_JOB_SPEC`` (the validated spec as JSON, with the
checkpoint storage filled in), and ``ETRAIN_REPORT_URL`` / ``ETRAIN_REPORT_TOKEN``
for telemetry. The driver exits 0 when training finished and non-zero
otherwise, which is what the Ray job status and the reconciler go by.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from workers.spec import JobSpec

# Exit code of a driver whose training itself failed (after Ray Train's own
# restarts): the service does not resubmit those. service.domain.recovery
# holds the same number; a unit test keeps them equal.
EXIT_TRAINING_FAILED = 3
# How often a healthy elastic job checks whether more workers could run.
RESIZE_MONITOR_INTERVAL_S = float(os.environ.get("ETRAIN_RESIZE_MONITOR_INTERVAL_S", "5"))
# Ray Train controller settings for elastic jobs (bench/recovery.py measures them
# against Ray's defaults). The driver sets them unless the job's environment does;
# Ray propagates them from the driver to its controller.
#  - poll the workers every second, not every 2 s;
#  - a worker whose health poll hangs 30 s (node unreachable, not dead) is lost,
#    not after Ray's 10 minutes;
#  - wait 5 s, not 60 s, for a worker group's resources: an elastic group is
#    sized from reserved resources, so a longer wait only means they were stale
#    (a node just died) and a retry at the size now available is the fix.
#    Start timeouts do not count against failure.max_failures.
ELASTIC_CONTROLLER_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1",
    "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S": "30",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5",
}


def job_storage(spec: JobSpec):
    """The job's checkpoint store (credentials from this process's environment)."""
    from workers.storage import resolve_checkpoint_storage

    return resolve_checkpoint_storage(spec.checkpoint)


def train_fn(config: dict) -> None:
    """Ray Train worker entry point: re-validate the spec and run the loop."""
    import ray.train
    import torch
    from ray.train import Checkpoint
    from ray.train.v2.api.report_config import CheckpointUploadMode

    from workers import warm_spares
    from workers.telemetry import TelemetryReporter
    from workers.train_loop import RunEnv, run

    warm_spares.claim()
    spec = JobSpec.model_validate(config["spec"])
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    if spec.resources.gpus_per_worker > 0:
        import ray.train.torch as rtt
        device = rtt.get_device()
    else:
        device = torch.device("cpu")

    loc = job_storage(spec)
    filesystem = loc.ray_storage()[1]

    def register(info, metrics: dict) -> None:
        # Registration only (no upload): the files are already in the run directory.
        ckpt = Checkpoint(info.path, filesystem=filesystem) if info is not None else None
        ray.train.report(metrics, checkpoint=ckpt,
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
                         checkpoint_dir_name=f"step_{metrics['step']:08d}")

    _check_placement(spec, node_rank=ctx.get_node_rank())
    reporter = TelemetryReporter.from_env(config["job_id"]) if rank == 0 else None
    env = RunEnv(rank=rank, world_size=ctx.get_world_size(), device=device,
                 checkpoint_root=loc.uri_of(config["job_id"], "checkpoints"),
                 reporter=reporter, on_checkpoint=register, prune_checkpoints=False,
                 # After the first step every worker has claimed its process, so each
                 # node's spares can be counted and topped up for the next restart.
                 after_first_step=warm_spares.top_up)
    try:
        run(spec, env)
    finally:
        if reporter is not None:
            reporter.close()


def _check_placement(spec: JobSpec, *, node_rank: int) -> None:
    """Refuse to train when a TP group's consecutive world ranks landed on different nodes."""
    import torch.distributed as dist

    from workers.parallel import check_tp_placement

    if spec.parallelism.tp == 1 or not dist.is_initialized():
        return
    nodes: list = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node_rank)
    check_tp_placement(nodes, tp=spec.parallelism.tp)


def build_trainer(spec: JobSpec, *, job_id: str):
    """The TorchTrainer for ``spec``: scaling, storage under the job id, failure policy."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from workers import warm_spares
    from workers.events import EventCallback
    from workers.scaling import LayoutScalingPolicy, ReleaseStaleReservation

    res = spec.resources
    per_worker = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        per_worker["GPU"] = res.gpus_per_worker
    elastic = res.min_workers != res.max_workers
    scaling = ScalingConfig(
        num_workers=(res.min_workers, res.max_workers) if elastic else res.min_workers,
        use_gpu=res.gpus_per_worker > 0, resources_per_worker=per_worker,
        # Ray's default (60 s) lets a joined node idle for a minute before the group grows.
        elastic_resize_monitor_interval_s=RESIZE_MONITOR_INTERVAL_S)
    loc = job_storage(spec)
    ray_path, ray_fs = loc.ray_storage()
    run_config = RunConfig(
        name=job_id, storage_path=ray_path, storage_filesystem=ray_fs,
        failure_config=FailureConfig(max_failures=spec.failure.max_failures),
        # Ray Train deletes the checkpoints it registered beyond keep_last, so its run
        # snapshot stays valid for a resubmitted job (see CheckpointManager).
        checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep_last),
        callbacks=[EventCallback(job_id), ReleaseStaleReservation(
            loc.uri_of(job_id, "ray_reservation"), spec.checkpoint)],
        worker_runtime_env=(warm_spares.worker_runtime_env()
                            if spec.failure.warm_spares else {}),
    )
    config = {"spec": spec.model_dump(mode="json", by_alias=True), "job_id": job_id}
    policy = LayoutScalingPolicy(scaling, unit=spec.parallelism.model_parallel_size,
                                 job_id=job_id) if elastic else None
    return _trainer_class()(train_fn, train_loop_config=config, scaling_config=scaling,
                            run_config=run_config, scaling_policy=policy)


def _trainer_class():
    """TorchTrainer that runs with etrain's elastic scaling policy when one is given.

    Ray builds its own policy inside ``fit``; the controller's keyword argument is
    the one seam to hand it another (Ray 2.60 DataParallelTrainer).
    """
    from ray.train.torch import TorchTrainer

    class EtrainTrainer(TorchTrainer):
        def __init__(self, *args, scaling_policy=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.etrain_scaling_policy = scaling_policy

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            if self.etrain_scaling_policy is not None:
                controller_init_kwargs["scaling_policy"] = self.etrain_scaling_policy
            return super()._initialize_and_run_controller(**controller_init_kwargs)

    return EtrainTrainer


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this driver when its parent (Ray's job supervisor) dies.

    If the parent is killed, the job is reported failed and the service
    resubmits it, while an orphaned driver would go on training into the same
    checkpoint folder. PR_SET_PDEATHSIG prevents it. (The entrypoint is
    ``exec python -m workers.launch``: with a shell in between, the shell's death
    on a stop's SIGTERM would SIGKILL the driver before it could abort cleanly.)
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not Linux/glibc: nothing to arm
        pass


def _abort_on_sigterm(spec: JobSpec) -> None:
    """Stop the run on SIGTERM as Ray Train stops it on Ctrl-C.

    Cancelling a Ray job sends its driver SIGTERM (SIGKILL 3 s later). Ray
    Train's SIGINT handler aborts the controller, which releases the run's
    resource reservation at once; killed outright, the reservation would hold
    the workers' resources for another 180 s.
    """

    def on_sigterm(signum, frame):
        print("etrain: SIGTERM: aborting the run", file=sys.stderr, flush=True)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler not in (signal.default_int_handler,):
            handler(signal.SIGINT, frame)
        sys.exit(128 + signum)

    # Installed after ray.init(): connecting installs Ray's own SIGTERM handler, which
    # would otherwise replace this one and end the driver without the abort.
    import ray

    from workers import warm_spares

    if not ray.is_initialized():
        # Merged by Ray with the runtime environment the job was submitted with.
        ray.init(runtime_env=(warm_spares.job_runtime_env()
                              if spec.failure.warm_spares else None))
    signal.signal(signal.SIGTERM, on_sigterm)


def main() -> int:
    """Run the job described by the environment; return the process exit code."""
    _die_with_parent()
    job_id = os.environ["ETRAIN_JOB_ID"]
    spec = JobSpec.model_validate(json.loads(os.environ["ETRAIN_JOB_SPEC"]))
    _abort_on_sigterm(spec)
    if spec.resources.min_workers != spec.resources.max_workers:
        for key, value in ELASTIC_CONTROLLER_ENV.items():
            os.environ.setdefault(key, value)
    trainer = build_trainer(spec, job_id=job_id)
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 - the driver's exit code is the report
        print(f"etrain: training failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return EXIT_TRAINING_FAILED
    print("etrain: training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
