"""Between two jobs of a standby driver (``workers.warm.standby``): what its next run
finds started, and what is left to start.

A standby runs job after job in one Ray job, so the processes a run started ahead stay
for the next: the spare worker processes and the run-actor processes its workers asked
for after the first step (``spares.top_up``). Once a job ended, :func:`prestart_for_next_run`
starts only what is missing.
"""

from __future__ import annotations

import contextlib

from workers.ray_compat import train_worker_runtime_env
from workers.warm.spares import (
    CONTROLLER_HERE,
    NEXT_RUN_ASKED,
    READY,
    RUN_ACTORS,
    RUN_ACTORS_DIR,
    WARMING,
    idle_run_actors,
    prestart_waves,
    spare_dir,
    spares_in,
    worker_runtime_env,
)


def prestart_for_next_run(workers: int, *, stop=None) -> str:
    """In a standby driver between jobs: ask this node's raylet for what the next run needs
    and is not here yet: ``workers`` worker processes less the spares (ready or importing),
    ``RUN_ACTORS`` run-actor processes less the idle ones, unless the run asked for them
    already (``spares.top_up``: some may still wait for their wave). The next run's first
    run actors are numbered from 1 again and its controller is not here yet. Returns the
    workers' runtime environment."""
    folder = spare_dir()
    asked = (folder / NEXT_RUN_ASKED).exists()
    (folder / NEXT_RUN_ASKED).unlink(missing_ok=True)
    (folder / CONTROLLER_HERE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        for f in (folder / RUN_ACTORS_DIR).iterdir():
            f.unlink()
    spares = spares_in(folder, states=(WARMING, READY))
    env = train_worker_runtime_env(worker_runtime_env())
    requests = [
        (max(workers - len(spares), 0), env),
        (
            0 if asked else max(RUN_ACTORS - idle_run_actors(folder), 0),
            train_worker_runtime_env({}),
        ),
    ]
    prestart_waves([r for r in requests if r[0]], stop=stop)
    return env
