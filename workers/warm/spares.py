"""Warm spare worker processes: a restarted worker group starts in about a second, not ten.

Ray Train replaces every worker process of a group on any failure or resize; a new
process imports torch, Ray Train and etrain (about 5 s of CPU) before it can load a
checkpoint. Ray's raylet can keep processes ready (``PrestartWorkers``: idle processes
of a job and runtime environment, where the next such actor is placed).

So, per node of a running group:

- the driver installs :func:`setup_hook` as the job's ``worker_process_setup_hook``
  (public Ray API); it runs at the start of every worker process of the job and
  imports the training stack only in processes whose environment carries
  ``ETRAIN_WARM_WORKER=1``, which ``RunConfig.worker_runtime_env`` gives Ray
  Train's worker actors (and so the spares started with their environment);
- after the group's first step, one worker per node (:func:`top_up`) asks its
  own raylet for as many spares as the node runs workers, less the spares
  still alive; the request uses the worker's own runtime-environment string,
  so the spares match the next group's actors exactly.

The same mechanism starts a job's first worker processes early (``first_group``: the
driver asks before it imports torch) and, in a standby driver's Ray job, the next run's
processes (:func:`top_up`, ``next_run``).

A spare that becomes a worker leaves the count (:func:`claim`); spares end with the job's
Ray job or after ``KEEP_ALIVE_S``, hold about 0.35 GB (PSS, CPU torch) and no GPU.
``failure.warm_spares: false`` in the job spec turns this off.

``PrestartWorkers`` is a raylet RPC (Ray's ``NodeManagerService``), not a public
Python API (``workers.ray_compat.prestart_workers``); :func:`top_up` only ever logs
its failures, and without spares a restart is as slow as Ray's default, never wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import logging
import os
import tempfile
import threading
from pathlib import Path

from workers import collective_net
from workers.contract import STANDBY_ID_ENV, WARM_WORKER_ENV
from workers.ray_compat import (
    RUN_ACTOR_MODULES,
    WORKER_MODULES,
    kv_count,
    kv_delete,
    kv_put,
    train_worker_runtime_env,
)
from workers.warm import speculation, waves
from workers.warm.speculation import running

log = logging.getLogger(__name__)

HOOK = f"{__name__}.setup_hook"
# Long enough for any job; spares of a finished job are ended by the raylet anyway.
KEEP_ALIVE_S = 24 * 3600
# One file per spare, <pid>.warming while it imports, then <pid>.ready, under
# <root>/<Ray job id>/<node id>/ (nodes on one machine share the root).
SPARES_ROOT = Path(tempfile.gettempdir()) / "etrain-spares"
WARMING, READY, WORKER = "warming", "ready", "worker"
# <root>/<Ray job id>/<node id>/started/<pid>: every process of the job that reached the
# setup hook, so past the raylet's start-up (prestart_waves counts them).
STARTED = "started"
# Ready spares also in Ray's GCS key-value store, which any node reads (a joined node's
# files are on another machine): key <Ray job id>/<node id>/<pid> (:func:`ready_on`).
KV_NAMESPACE = "etrain-spares"
_LEADER_LOCK = None  # this node's leader.lock, while this worker is the node's leader
# What a Ray Train worker imports before its first step after a restore: Ray's
# worker actor module and torch backend (workers.ray_compat.WORKER_MODULES), etrain's
# loop (checkpoints, DCP), every strategy (get_strategy loads them all), and
# torch._dynamo, which DistributedDataParallel imports on construction (about 200
# modules, 1-3 s).
WARM_MODULES = (
    "torch",
    "torch._dynamo",
    "torch.distributed.checkpoint",
    *WORKER_MODULES,
    "workers.worker_entry",
    "workers.train_loop",
    "workers.strategies.ddp",
    "workers.strategies.fsdp",
    "workers.strategies.hybrid",
    "workers.strategies.pp",
    "workers.strategies.tp",
)


# Ray Train's own actors of a run, each in a process of its own with the controller's
# runtime environment: the controller, its placement-group cleaner, and each worker
# group's synchronisation actor (etrain's trainer runs no dataset manager and no
# preemption watcher: ray_compat). A new process for each imports Ray Train (1-2 s of
# CPU apiece), one after the other as the run starts.
RUN_ACTORS = 3
RUN_ACTORS_PER_GROUP = 1  # of them, started again for every group: the sync actor
# What their processes import ahead: Ray Train's modules, and etrain's callbacks and
# scaling policy, which the controller unpickles (no torch).
RUN_ACTOR_IMPORTS = (*RUN_ACTOR_MODULES, "workers.elastic.callbacks", "workers.elastic.scaling")
# What the controller also imports as it unpickles its arguments: the trainer's TorchConfig
# (in its backend and accelerator callbacks), whose module imports torch (1.6 s of CPU,
# 135 MB). The job's first RUN_ACTORS run-actor processes on a node import it ahead (none
# can tell which is the controller's) until the controller is here (CONTROLLER_HERE); after
# that, as many as a standby driver's run left tickets for (TORCH_TICKETS: it runs job after
# job, and these are for its next run's controller).
CONTROLLER_IMPORTS = ("ray.train.torch.config",)
TORCH_TICKETS = "torch-tickets"
NEXT_RUN_ASKED = "next-run-asked"  # a standby's run asked for its next run's run actors
RUN_ACTORS_DIR = "run-actors"  # <pid> per run-actor process of the job on the node
# Made by mark_controller: later run-actor processes are Ray Train's others (no torch).
CONTROLLER_HERE = "controller-here"


def worker_runtime_env() -> dict:
    """``RunConfig.worker_runtime_env``: marks Ray Train's worker actors (and their spares)."""
    return {"env_vars": {WARM_WORKER_ENV: "1"}}


def job_runtime_env() -> dict:
    """The driver's ``ray.init(runtime_env=...)``: the hook every process of the job runs."""
    return {"worker_process_setup_hook": HOOK}


def setup_hook() -> None:
    """Ray's per-process setup hook: import the training stack in worker-actor processes.

    Every process of the job runs this at start: those started with the worker actors'
    environment (``ETRAIN_WARM_WORKER=1``) import the training stack, the others (Ray
    Train's controller and its other actors, :data:`RUN_ACTORS`) Ray Train's modules,
    torch too where it may become a controller (:data:`CONTROLLER_IMPORTS`). Each marks
    itself started (:func:`prestart_waves` counts).
    """
    _mark_started(STARTED)
    if os.environ.get(WARM_WORKER_ENV) != "1":  # the controller or another run actor
        first = _mark_started(RUN_ACTORS_DIR) <= RUN_ACTORS
        first = first and not (spare_dir() / CONTROLLER_HERE).exists()
        torch = first or (bool(os.environ.get(STANDBY_ID_ENV)) and _ticket(-1))
        for name in (*RUN_ACTOR_IMPORTS, *(CONTROLLER_IMPORTS if torch else ())):
            importlib.import_module(name)
        return
    collective_net.pin_to_node_ip()  # before its process group starts: reachable by the others
    warming = _spare_file(WARMING)
    warming.touch()
    # Only a worker's process pauses (speculation): no other Ray job's actor can run in
    # it, while a run-actor process may host Ray Train's cluster-wide actors every job uses.
    with speculation.yielding():
        for name in WARM_MODULES:
            importlib.import_module(name)
    warming.rename(_spare_file(READY))
    _announce(ready=True)


def mark_controller() -> None:
    """In the run's controller, as it unpickles its arguments (before it creates any actor)."""
    with contextlib.suppress(Exception):  # only makes a start cheaper
        if ray_node_id() is not None:  # in Ray (not unpickled in a test, say)
            (spare_dir() / CONTROLLER_HERE).touch()


def claim() -> None:
    """This process is now a training worker on its node: a worker, no longer a spare."""
    if os.environ.get(WARM_WORKER_ENV) == "1":
        was_ready = _spare_file(READY).exists()  # then its key is in the GCS, too
        for state in (WARMING, READY):
            _spare_file(state).unlink(missing_ok=True)
        _spare_file(WORKER).touch()
        if was_ready:  # a new process was no spare: no GCS call on its start
            _announce(ready=False)


def ready_on(node_id: str) -> int:
    """How many of this job's spares on ``node_id`` are ready (from any node of the job)."""
    return kv_count(_kv_key(node_id), namespace=KV_NAMESPACE)


def forget_ready() -> None:
    """On the driver, once the job ended: drop its spares' keys (:data:`KV_NAMESPACE`)."""
    try:
        import ray

        if ray.is_initialized():
            job_id = ray.get_runtime_context().get_job_id()
            kv_delete(f"{job_id}/", namespace=KV_NAMESPACE, prefix=True)
    except Exception as e:  # noqa: BLE001 - a few bytes left in the GCS
        log.warning("etrain: could not drop the spares' keys: %s: %s", type(e).__name__, e)


def top_up(controller_node: str | None = None) -> int:
    """Ask this node's raylet for one spare per training worker here; return how many were
    asked for. On ``controller_node`` (the node of Ray Train's controller) also for the
    processes of the next group's own actors (:data:`RUN_ACTORS_PER_GROUP`).

    Every worker calls this once all workers have claimed their processes (after
    the first step, a collective). One per node acts: the first to lock the
    node's ``leader.lock``, which it holds until it dies, so the next group's
    workers elect a new one. Ray Train's local ranks cannot pick it, as they
    group workers by IP address, not by Ray node. Never raises.
    """
    global _LEADER_LOCK
    if os.environ.get(WARM_WORKER_ENV) != "1":  # the driver did not ask for spares
        return 0
    try:
        folder = spare_dir()
        lock = open(folder / "leader.lock", "w")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return 0
        _LEADER_LOCK = lock
        spares = spares_in(folder, states=(WARMING, READY))  # ready or still importing
        missing = max(len(spares_in(folder, states=(WORKER,))) - len(spares), 0)
        requests = [(missing, None)]  # None: this worker's own runtime environment
        if controller_node and controller_node == ray_node_id():
            requests.append((_run_actors_wanted(), _controller_env()))
        prestart_waves(requests)
        if missing:
            log.info("etrain: asked for %d warm spare worker(s) on this node", missing)
        return missing
    except Exception as e:  # noqa: BLE001 - spares only make restarts faster
        log.warning("etrain: could not start warm spare workers: %s: %s", type(e).__name__, e)
        return 0


def _run_actors_wanted() -> int:
    """Run-actor processes to start ahead on the controller's node after a group's first
    step: the next group's sync actor; in a standby driver's Ray job, every run actor of
    its next run (controller, cleaner, sync actor) less those idle already."""
    if not os.environ.get(STANDBY_ID_ENV):  # not a standby driver's Ray job
        return RUN_ACTORS_PER_GROUP
    wanted = max(RUN_ACTORS - idle_run_actors(spare_dir()), 0)
    _ticket(wanted)  # they import torch: any may be the next run's controller
    (spare_dir() / NEXT_RUN_ASKED).touch()  # the driver asks for none again after the job
    return wanted


def idle_run_actors(folder: Path) -> int:
    """This job's run-actor processes on this node that run nothing: started, no spare
    (``folder``: the node's spare folder), titled idle by Ray."""
    import psutil

    spares = set(spares_in(folder, states=(WARMING, READY)))
    idle = 0
    for pid in (pid for pid in started_pids() if pid not in spares):
        with contextlib.suppress(psutil.Error):
            idle += psutil.Process(pid).name() == "ray::IDLE"
    return idle


def _ticket(change: int) -> bool:
    """Add ``change`` (> 0) tickets to import torch, or take one (-1): whether one was
    there to take. Never raises."""
    try:
        with open(spare_dir() / TORCH_TICKETS, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            held = int(f.read() or 0)
            if held + change < 0:
                return False
            f.seek(0)
            f.truncate()
            f.write(str(held + change))
            return True
    except (OSError, ValueError) as e:
        log.warning("etrain: torch tickets: %s", e)
        return False


def top_up_in_background(controller_node: str | None = None) -> threading.Thread:
    """:func:`top_up` on a daemon thread: its raylet and GCS calls (and its waves) stay off
    the training thread, which runs it after the first step of every group."""
    thread = threading.Thread(
        target=top_up,
        kwargs={"controller_node": controller_node},
        name="etrain-top-up",
        daemon=True,
    )
    thread.start()
    return thread


def prestart_for_run(workers: int, *, run_actors: bool = True, then=None, stop=None) -> str:
    """On the driver: ask this node's raylet for ``workers`` processes with the runtime
    environment Ray Train's worker actors will have, then (``run_actors``) for
    :data:`RUN_ACTORS` with the controller's, for Ray Train's own actors of the run, so
    all of them import what they need while nobody waits (:func:`prestart_waves`, which
    calls ``then`` once they started, unless ``stop`` was set first). Returns the
    workers' runtime environment; never raises."""
    env = train_worker_runtime_env(worker_runtime_env())
    requests = [(workers, env)]
    if run_actors:
        requests.append((RUN_ACTORS, train_worker_runtime_env({})))  # the controller's
    prestart_waves(requests, then=then, stop=stop)
    return env


def prestart_waves(requests: list[tuple[int, str | None]], *, then=None, stop=None):
    """This job's processes on this node (``requests``: (count, serialized runtime env,
    None for this process's own)), in waves the raylet takes (:func:`waves.prestart`);
    the thread that sends the later ones, or None. Never raises."""
    try:
        started = spare_dir() / STARTED
    except Exception as e:  # noqa: BLE001 - prestarted processes only make starts faster
        log.warning("etrain: could not prestart processes: %s: %s", type(e).__name__, e)
        return None
    return waves.prestart(
        requests, started=started, keep_alive_s=KEEP_ALIVE_S, then=then, stop=stop
    )


def _mark_started(name: str) -> int:
    """Mark this process in the node's folder ``name``; return how many it holds now
    (0 when it cannot be written)."""
    try:
        folder = spare_dir() / name
        folder.mkdir(exist_ok=True)
        (folder / str(os.getpid())).touch()
        return waves.count_files(folder)
    except OSError as e:
        log.warning("etrain: could not mark this process started: %s", e)
        return 0


def started_pids() -> list[int]:
    """This job's running processes on this node that ran the setup hook (workers, spares
    and Ray Train's actors)."""
    folder = spare_dir() / STARTED
    if not folder.is_dir():
        return []
    return [int(f.name) for f in folder.iterdir() if f.name.isdigit() and running(int(f.name))]


def spares_in(folder: Path, *, states: tuple[str, ...] = (READY,)) -> list[int]:
    """Pids of running spares under ``folder`` (recursively) in one of ``states``."""
    spares = []
    for state in states:
        for path in folder.rglob(f"*.{state}"):
            pid = int(path.name.split(".")[0])
            if running(pid):
                spares.append(pid)
            else:
                path.unlink(missing_ok=True)
    return spares


def ray_node_id() -> str | None:
    """This process's Ray node (None before it connected to Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _controller_env() -> str:
    """The controller's runtime environment, from a worker's: the same, less the variables
    Ray Train's worker actors get beyond it (:func:`worker_runtime_env`)."""
    import json

    import ray

    env = json.loads(ray.get_runtime_context().get_runtime_env_string())
    for name in worker_runtime_env()["env_vars"]:
        env["env_vars"].pop(name, None)
    return json.dumps(env, sort_keys=True, separators=(",", ":"))


def _announce(*, ready: bool) -> None:
    """This spare is ready (or no longer a spare) in :data:`KV_NAMESPACE`. Never raises."""
    try:
        key = _kv_key(pid=str(os.getpid()))
        (kv_put if ready else kv_delete)(key, namespace=KV_NAMESPACE)
    except Exception as e:  # noqa: BLE001 - only a joined node's resize waits for it
        log.warning("etrain: could not record this spare: %s: %s", type(e).__name__, e)


def _kv_key(node_id: str | None = None, pid: str = "") -> str:
    """A spare's key in :data:`KV_NAMESPACE` (node: by default this process's; without
    ``pid``: the prefix of every key of the node)."""
    import ray

    ctx = ray.get_runtime_context()
    return f"{ctx.get_job_id()}/{node_id or ctx.get_node_id()}/{pid}"


def spare_dir() -> Path:
    import ray

    ctx = ray.get_runtime_context()
    path = SPARES_ROOT / ctx.get_job_id() / ctx.get_node_id()[:16]
    path.mkdir(parents=True, exist_ok=True)
    return path


def _spare_file(state: str) -> Path:
    return spare_dir() / f"{os.getpid()}.{state}"
