"""A standby job driver: started before any etrain job needs it, warmed up, then handed one.

Most of a job's start is not training: a Ray job's driver process imports torch and Ray
Train and connects to Ray (about 4 s here), Ray Train's controller actor starts in a new
process (5-8 s on two busy cores) and each worker process imports the training stack.
The service therefore keeps one driver ahead (``service.backends.standby``): a Ray job
started with ``STANDBY_ID_ENV`` / ``STANDBY_TOKEN_ENV`` instead of a job spec, which

1. connects to Ray with the job's setup hook (``workers.warm.spares``);
2. asks its raylet for idle processes with the runtime environments Ray Train will give
   the first worker group (``STANDBY_WORKERS_ENV`` of them, at most what the node can
   place, one CPU each) and its own actors (``warm_spares.RUN_ACTORS``), which import
   what they will need (``warm_spares.setup_hook``) while nobody waits;
3. imports what it will build the trainer with;
4. asks the service for its job (:func:`wait_for_job`, a long poll on ``STANDBY_ROUTE``)
   and, once it has one, runs it as a driver started for it would;
5. once that job succeeded, says so (:func:`report_done`), starts what the next job will
   need that is not idle already (:func:`warm_again`: the spares and run-actor processes
   the finished run started ahead stay, as its Ray job goes on) and asks for the next
   job. A failed job, a job it could not report or ``MAX_RUNS`` jobs end it instead, its
   exit code being the last job's, as a driver started for that job would have.

The job's environment (its reporter token, object-store keys) arrives with the job, not
with the Ray job: :class:`JobEnvironment` (below) sets it in the
controller and in every worker before anything reads it. A standby the service no longer
knows (it restarted), finds nothing listening at its address for ``REFUSED_GIVE_UP_S``
(the service was stopped or killed: a new one would not know it either) or cannot reach
for ``GIVE_UP_S`` (a network that may heal) exits 0 without training, so its warm
processes go back to the cluster.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial

from workers.contract import (
    REPORT_URL_ENV,
    STANDBY_DONE_ROUTE,
    STANDBY_ID_ENV,
    STANDBY_ROUTE,
    STANDBY_RUN_BEGIN,
    STANDBY_RUN_END,
    STANDBY_TOKEN_ENV,
    STANDBY_WORKERS_ENV,
    TRAIN_STATE_TRACKING_ENV,
)
from workers.ray_compat import ControllerCallback, WorkerGroupCallback, create_train_singletons

# What the driver imports to build and fit a trainer (workers.launch.build_trainer).
DRIVER_MODULES = (
    "torch",
    "ray.train",
    "ray.train.torch",
    "ray.train.v2.api.data_parallel_trainer",
    "workers.elastic.callbacks",
    "workers.elastic.scaling",
    "workers.storage.location",
)
# Set once the job came: the warm-up stops asking for processes (warm_spares.prestart_waves).
STOP_WARMING = threading.Event()
POLL_WAIT_S = 20.0  # how long the service holds one poll open
# ... at most for the first asks: each says what the standby holds (memory_held), and its
# processes are still importing then, so the figure the service shows follows the warm-up.
WARMING_POLLS, WARMING_POLL_WAIT_S = 6, 5.0
GIVE_UP_S = 120.0  # service unreachable (time-outs, a network down) this long: exit
REFUSED_GIVE_UP_S = 10.0  # connections refused this long (nothing listens there): exit
# Jobs one standby driver runs before it ends and the service starts a new one: bounds what
# one long-lived process may accumulate (caches, Ray's per-run records in its memory).
MAX_RUNS = 50


@dataclass(frozen=True)
class Assignment:
    """The job a standby driver was handed: what a driver started for it gets in its env."""

    job_id: str
    spec_json: str
    env: dict[str, str]
    submission_id: str = ""  # the job's own (etrain) submission id


def is_standby() -> bool:
    """Whether this driver was started as a standby (no job yet)."""
    return bool(os.environ.get(STANDBY_ID_ENV))


@dataclass(frozen=True)
class Warm:
    """The worker processes a standby started, and the runtime environment they have (its
    run actors' processes have the same, less the workers' own variables)."""

    workers: int = 0
    runtime_env: str | None = None

    def same_env(self) -> bool:
        """Whether the job's actors get the environment these processes have: not when its
        driver set other Ray Train variables (an elastic job's controller settings)."""
        if self.runtime_env is None:
            return False
        from workers.ray_compat import train_worker_runtime_env
        from workers.warm.spares import worker_runtime_env

        return train_worker_runtime_env(worker_runtime_env()) == self.runtime_env


def warm_up() -> Warm:
    """Prestart the first group's and the run actors' processes and import the driver's
    stack; what was started for the workers."""
    from workers.warm import spares as warm_spares

    env, count = None, 0
    # The first run on a cluster would create these, each in a new process. Created once
    # the run's processes started, so that theirs are not among the run's first (which
    # import torch for the controller, warm_spares.CONTROLLER_IMPORTS).
    tracking = all(os.environ.get(k) == v for k, v in TRAIN_STATE_TRACKING_ENV.items())
    singletons = partial(create_train_singletons, state_tracking=tracking)
    try:
        count = _workers_here()
        env = warm_spares.prestart_for_run(count, then=singletons, stop=STOP_WARMING)
        _say(f"{count} worker and {warm_spares.RUN_ACTORS} run actor process(es) warming")
    except Exception as e:  # noqa: BLE001 - only makes the start faster
        _say(f"not all processes started ahead: {type(e).__name__}: {e}")
    for name in DRIVER_MODULES:
        importlib.import_module(name)
    return Warm(count, env)


def wait_for_job(
    *,
    give_up_s: float = GIVE_UP_S,
    refused_give_up_s: float = REFUSED_GIVE_UP_S,
    poll_wait_s: float = POLL_WAIT_S,
):
    """Ask the service for this standby's job until it has one: the :class:`Assignment`, or
    None when the service no longer wants this standby, refuses connections for
    ``refused_give_up_s`` (it is gone) or stays unreachable for ``give_up_s``."""
    import httpx

    from workers.telemetry.reporter import quiet_http_loggers

    quiet_http_loggers()
    standby_id = os.environ[STANDBY_ID_ENV]
    url = os.environ[REPORT_URL_ENV].rstrip("/") + STANDBY_ROUTE.format(standby_id=standby_id)
    headers = {"Authorization": f"Bearer {os.environ[STANDBY_TOKEN_ENV]}"}
    unreachable_since, asks = None, 0
    with httpx.Client(timeout=poll_wait_s + 10) as client:
        while True:
            asks += 1
            wait = poll_wait_s if asks > WARMING_POLLS else min(poll_wait_s, WARMING_POLL_WAIT_S)
            params = {"wait": wait}
            if (held := memory_held()) is not None:
                params["memory"] = held
            try:
                r = client.get(url, headers=headers, params=params)
            except httpx.HTTPError as e:
                unreachable_since = unreachable_since or time.monotonic()
                limit = refused_give_up_s if isinstance(e, httpx.ConnectError) else give_up_s
                if time.monotonic() - unreachable_since > limit:
                    _say(f"the service at {url} is unreachable ({type(e).__name__}); exiting")
                    return None
                time.sleep(min(2.0, poll_wait_s))
                continue
            unreachable_since = None
            if r.status_code == 200:
                body = r.json()
                return Assignment(
                    body["job_id"],
                    body["spec_json"],
                    dict(body["env"]),
                    body.get("submission_id") or "",
                )
            if r.status_code != 204:
                _say(f"the service does not want this standby ({r.status_code}); exiting")
                return None


def memory_held() -> int | None:
    """Bytes of host memory this standby holds: its own process and the ones it started
    ahead on its node (``warm_spares.started_pids``), each one's PSS (its pages, and its
    share of pages it shares, such as torch's libraries) where the OS reports it, else
    RSS; None if it cannot tell."""
    try:
        import psutil
        import ray

        from workers.warm.spares import started_pids

        total = 0
        for pid in {os.getpid(), *(started_pids() if ray.is_initialized() else ())}:
            with contextlib.suppress(psutil.Error):
                info = psutil.Process(pid).memory_full_info()
                total += getattr(info, "pss", info.rss)  # shared pages once (Linux)
        return total
    except Exception:  # noqa: BLE001 - the figure is only shown, never acted on
        return None


def take_job(assignment: Assignment) -> None:
    """Make this process the driver of ``assignment``: its variables in the environment;
    the processes its warm-up has not asked for yet are left to the job's start."""
    STOP_WARMING.set()
    os.environ.update(assignment.env)
    from workers.contract import JOB_ID_ENV, JOB_SPEC_ENV

    os.environ[JOB_ID_ENV] = assignment.job_id
    os.environ[JOB_SPEC_ENV] = assignment.spec_json
    print(f"{STANDBY_RUN_BEGIN}{assignment.submission_id} (job {assignment.job_id})", flush=True)


def end_job(assignment: Assignment) -> None:
    """The job's last line in this driver's log (the service's cut of the job's log ends at
    it)."""
    sys.stderr.flush()
    print(f"{STANDBY_RUN_END}{assignment.submission_id}", flush=True)


def report_done(assignment: Assignment, *, timeout_s: float = 10.0) -> bool:
    """Tell the service the job succeeded; whether it took that (then it may hand this
    standby another job). Never raises."""
    import httpx

    standby_id = os.environ[STANDBY_ID_ENV]
    url = os.environ[REPORT_URL_ENV].rstrip("/") + STANDBY_DONE_ROUTE.format(standby_id=standby_id)
    headers = {"Authorization": f"Bearer {os.environ[STANDBY_TOKEN_ENV]}"}
    params = {"submission_id": assignment.submission_id}
    try:
        r = httpx.post(url, headers=headers, params=params, timeout=timeout_s)
    except httpx.HTTPError as e:
        _say(f"could not report the job's end ({type(e).__name__}); exiting")
        return False
    if r.status_code != 204:
        _say(f"the service did not take the job's end ({r.status_code}); exiting")
        return False
    return True


def warm_again() -> Warm:
    """Between jobs: start what the next job's start would otherwise wait for and is not
    idle here already (worker spares and run-actor processes the last run started ahead);
    what was started for the workers."""
    from workers.warm.next_run import prestart_for_next_run

    STOP_WARMING.clear()
    env, count = None, 0
    try:
        count = _workers_here()
        env = prestart_for_next_run(count, stop=STOP_WARMING)
    except Exception as e:  # noqa: BLE001 - only makes the start faster
        _say(f"not all processes started ahead: {type(e).__name__}: {e}")
    return Warm(count, env)


def _workers_here() -> int:
    """How many of the workers the service asked this standby to warm its node can hold."""
    from workers.warm.first_group import node_capacity

    return node_capacity(int(os.environ.get(STANDBY_WORKERS_ENV) or 0), cpus=1.0, gpus=0.0)


def _say(message: str) -> None:
    print(f"etrain: standby driver: {message}", file=sys.stderr, flush=True)


class JobEnvironment(ControllerCallback, WorkerGroupCallback):
    """The job's variables in the Ray Train controller and every worker of each group.

    A standby driver's Ray job was started before it had a job, so its processes lack the
    variables a driver started for the job gets from its Ray job (reporter URL and token,
    object-store keys). This sets them in the controller as it starts, before the other
    callbacks read them, and in each group's workers once the group is up, before the
    train function runs. Pickled to the controller with the run, never exported as the
    train loop's config is (Ray's Train state API shows that).
    """

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)

    def after_controller_start(self, train_run_context) -> None:
        """Before the callbacks listed after this one start."""
        set_env(self.env)

    def after_worker_group_start(self, worker_group) -> None:
        """The group's process group is formed; its train function has not started."""
        worker_group.execute(set_env, self.env)


def set_env(env: dict[str, str]) -> None:
    """Set ``env`` in this process's environment (run on each worker)."""
    os.environ.update(env)
