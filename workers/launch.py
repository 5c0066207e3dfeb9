"""The job driver: ``python -m workers.launch`` runs as a Ray job and drives a TorchTrainer.

What each worker runs is :mod:`workers.worker_entry`; this module runs only in the driver.

The service passes the job through the environment of the Ray job
(``workers.contract.launch_env``: the job id, and the validated spec as JSON with
the checkpoint storage filled in) plus the telemetry URL and a token scoped to the
job. The driver exits 0 when training finished and ``EXIT_TRAINING_FAILED``
otherwise, which is what the Ray job status and the reconciler go by.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time

from workers.contract import EXIT_TRAINING_FAILED, GPU_NODES_ENV, JOB_ID_ENV, JOB_SPEC_ENV
from workers.elastic.settings import apply_controller_env
from workers.ray_compat import PREEMPTION_WATCHER_ENV
from workers.spec import JobSpec
from workers.warm import speculation, standby
from workers.worker_entry import job_storage, train_fn


def pinned_nodes(node_ids: str | None) -> dict[str, str] | None:
    """Ray's label selector for workers pinned to ``node_ids`` (GPU_NODES_ENV: the nodes
    whose GPUs hold the job's ranks, on a cluster of mixed GPUs); None: any node."""
    ids = [i for i in (node_ids or "").split(",") if i]
    return {"ray.io/node-id": f"in({','.join(ids)})"} if ids else None


def build_trainer(
    spec: JobSpec,
    *,
    job_id: str,
    startup: dict[str, float] | None = None,
    job_env: dict[str, str] | None = None,
):
    """The TorchTrainer for ``spec``: scaling, storage under the job id, failure policy.

    Checkpoints are not registered with Ray Train: etrain commits, lists, restores
    and prunes them itself (``workers.checkpoint.manager``), so Ray's run snapshot
    never names a checkpoint etrain's retention deleted. ``startup``: the driver's
    timestamps (``workers.warm.startup_times``), passed on to rank 0's first event.
    ``job_env``: variables the job's Ray job lacks (a standby driver's job, set in the
    controller and the workers by ``workers.warm.standby.JobEnvironment``).
    """
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig

    from workers.elastic.scaling import LayoutScalingPolicy
    from workers.elastic.settings import resize_monitor_interval_s
    from workers.ray_compat import trainer_class
    from workers.warm import spares as warm_spares

    res = spec.resources
    per_worker = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        per_worker["GPU"] = res.gpus_per_worker
    elastic = res.min_workers != res.max_workers
    scaling = ScalingConfig(
        num_workers=(res.min_workers, res.max_workers) if elastic else res.min_workers,
        use_gpu=res.gpus_per_worker > 0,
        resources_per_worker=per_worker,
        elastic_resize_monitor_interval_s=resize_monitor_interval_s(),
        label_selector=pinned_nodes({**os.environ, **(job_env or {})}.get(GPU_NODES_ENV)),
    )
    config = {
        "spec": spec.model_dump(mode="json", by_alias=True),
        "job_id": job_id,
        "startup": startup or {},
        "driver_node": warm_spares.ray_node_id(),  # where the controller runs
    }
    policy = (
        LayoutScalingPolicy(scaling, unit=spec.parallelism.model_parallel_size, job_id=job_id)
        if elastic
        else None
    )
    return trainer_class()(
        train_fn,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=_run_config(spec, job_id=job_id, job_env=job_env),
        scaling_policy=policy,
        torch_config=TorchConfig(backend=process_group_backend(res.gpus_per_worker > 0)),
    )


def _run_config(spec: JobSpec, *, job_id: str, job_env: dict[str, str] | None):
    """Storage under the job id, the failure policy, etrain's callbacks, the workers' env."""
    from ray.train import FailureConfig, RunConfig

    from workers.elastic.callbacks import EventCallback, ReleaseStaleReservation, StartupTimes
    from workers.warm import spares as warm_spares

    loc = job_storage(spec)
    if loc.scheme == "file":  # Ray Train and etrain write beneath it: no link, in the roots
        from workers.storage.confine import Roots, check_folder

        check_folder(loc.join(job_id), Roots.from_env(), write=True, create=True)
    ray_path, ray_fs = loc.ray_storage()
    return RunConfig(
        name=job_id,
        storage_path=ray_path,
        storage_filesystem=ray_fs,
        failure_config=FailureConfig(max_failures=spec.failure.max_failures),
        callbacks=[
            *([standby.JobEnvironment(job_env)] if job_env else []),  # first: others read it
            EventCallback(job_id),
            ReleaseStaleReservation(loc.uri_of(job_id, "ray_reservation"), spec.stores),
            StartupTimes(),
        ],
        worker_runtime_env=(warm_spares.worker_runtime_env() if spec.failure.warm_spares else {}),
    )


def process_group_backend(use_gpu: bool) -> str:
    """gloo on CPUs; on GPUs NCCL for CUDA tensors and gloo for CPU ones. etrain's own small
    collectives (checkpoint votes, object broadcasts) use CPU tensors, which the NCCL-only
    group Ray Train makes on GPUs by default refuses ("No backend type associated with
    device type cpu")."""
    return "cpu:gloo,cuda:nccl" if use_gpu else "gloo"


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


def _abort_on_sigterm(*, warm_spares: bool) -> None:
    """Connect to Ray (``warm_spares``: with the spares' setup hook) and stop the run on
    SIGTERM as Ray Train stops it on Ctrl-C.

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

    from workers.warm import spares

    if not ray.is_initialized():
        # Merged by Ray with the runtime environment the job was submitted with.
        ray.init(runtime_env=(spares.job_runtime_env() if warm_spares else None))
    signal.signal(signal.SIGTERM, on_sigterm)


def main() -> int:
    """Run the job described by the environment (or, for a standby driver, the jobs the
    service hands it); return the process exit code."""
    _die_with_parent()
    # Before anything computes the controller's runtime environment (prestarts do).
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    apply_controller_env(elastic=False)  # a standby's controller is prestarted with them
    if standby.is_standby():
        return _serve_as_standby()
    from workers.warm.startup_times import process_start_time

    startup = {"driver_process": process_start_time() or time.time()}
    code = run_job(startup, standby.Warm(), {})
    _forget_spares()
    return code


def run_job(startup: dict[str, float], warm: standby.Warm, job_env: dict[str, str]) -> int:
    """Run the job in this process's environment (``job_env``: what a standby's Ray job
    lacks); its exit code."""
    job_id = os.environ[JOB_ID_ENV]
    spec = JobSpec.model_validate(json.loads(os.environ[JOB_SPEC_ENV]))
    _abort_on_sigterm(warm_spares=spec.failure.warm_spares)
    if "assigned" not in startup:  # a standby connected long before its job came
        startup["ray_connected"] = time.time()
    if spec.resources.min_workers != spec.resources.max_workers:
        apply_controller_env(elastic=True)
    # Processes other Ray jobs start ahead pause while this one runs (speculation).
    with speculation.busy():
        return _fit(spec, job_id, startup, warm, job_env)


def _fit(spec: JobSpec, job_id: str, startup: dict, warm: standby.Warm, job_env: dict) -> int:
    """Start the run's processes ahead, build the trainer and fit it; the exit code."""
    if spec.failure.warm_spares:
        from workers.warm.first_group import prestart_first_group

        # Before torch is imported here: the workers' imports overlap the driver's.
        same = warm.same_env()
        prestart_first_group(
            spec.resources, already=warm.workers if same else 0, run_actors=not same
        )
    trainer = build_trainer(spec, job_id=job_id, startup=startup, job_env=job_env)
    startup["driver_ready"] = time.time()  # the dict goes to the workers with fit()
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 - the driver's exit code is the report
        print(f"etrain: training failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return EXIT_TRAINING_FAILED
    print("etrain: training finished", flush=True)
    return 0


def _serve_as_standby() -> int:
    """A standby driver: warm up, then run the jobs the service hands it, one at a time,
    until it hands none, a job fails, or ``standby.MAX_RUNS`` ran; the last job's exit
    code (0 when none came)."""
    _abort_on_sigterm(warm_spares=True)
    warm, code = standby.warm_up(), 0
    between_jobs = dict(os.environ)
    for runs in range(1, standby.MAX_RUNS + 1):
        assignment = standby.wait_for_job()
        if assignment is None:
            break
        standby.take_job(assignment)
        code = run_job({"assigned": time.time()}, warm, assignment.env)
        standby.end_job(assignment)
        if code != 0 or runs == standby.MAX_RUNS or not standby.report_done(assignment):
            break
        os.environ.clear()  # nothing of this job's (its tokens, keys) reaches the next
        os.environ.update(between_jobs)
        # Ray Train's SIGINT handler holds the run's controller: without it (and its cycles
        # collected) Ray ends the controller's process now, not at the next run's start.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        gc.collect()
        warm = standby.warm_again()
    _forget_spares()
    return code


def _forget_spares() -> None:
    """The Ray job ends: drop its spares' keys in Ray's GCS (``warm_spares.forget_ready``)."""
    from workers.warm.spares import forget_ready

    forget_ready()


def _exit(code: int) -> None:
    """End the driver: Ray disconnected and the exit handlers run (log handlers flushed,
    finalizers), then ``os._exit`` without the interpreter's teardown of torch's and Ray's
    modules, which took 0.7-1 s at the end of every job (measured on 2 cores), while the
    job still showed as running and the next job waited."""
    import atexit

    import ray

    ray.shutdown()
    atexit._run_exitfuncs()  # CPython's own exit path runs exactly these
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
