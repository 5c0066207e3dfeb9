"""A job's first worker group started ahead: on the driver, as soon as it has connected to
Ray and before it imports torch and builds its trainer, its node's share of the group's
processes is asked of the raylet (``workers.warm.spares``), so they import the training
stack while the driver and Ray Train's controller start."""

from __future__ import annotations

import logging

from workers.ray_compat import this_node
from workers.warm import waves
from workers.warm.spares import RUN_ACTORS, prestart_for_run

log = logging.getLogger(__name__)


def first_group_here(resources: dict, *, workers: int, cpus: float, gpus: float) -> int:
    """How many of a group's ``workers`` (each ``cpus`` and ``gpus``) a node with
    ``resources`` (Ray's totals) can hold."""
    fits = [workers]
    if cpus > 0:
        fits.append(int(resources.get("CPU", 0) // cpus))
    if gpus > 0:
        fits.append(int(resources.get("GPU", 0) // gpus))
    return max(min(fits), 0)


def prestart_first_group(resources_spec, *, already: int = 0, run_actors: bool = True) -> int:
    """On the driver: start this node's share of the first worker group's processes now.

    ``resources_spec`` is the job spec's ``resources``. Asks for at most as many
    processes as the group has workers and this node can place (none on a head that
    offers no CPU), less ``already`` started (by a standby driver, ``workers.warm.standby``),
    then (``run_actors``) for the processes of Ray Train's own actors
    (``spares.prestart_for_run``) where the node has the cores for them
    (:func:`room_for_run_actors`). Any of them the group does not use stays a spare for its
    restarts and ends with the job. Returns how many workers were asked for; never raises.
    """
    try:
        count = node_capacity(
            resources_spec.max_workers,
            cpus=resources_spec.cpus_per_worker,
            gpus=resources_spec.gpus_per_worker,
        )
        count = max(count - already, 0)
        run_actors = run_actors and room_for_run_actors(count)
    except Exception as e:  # noqa: BLE001 - only makes the start faster
        log.warning("etrain: could not prestart worker processes: %s: %s", type(e).__name__, e)
        return 0
    prestart_for_run(count, run_actors=run_actors)
    return count


def room_for_run_actors(workers: int) -> bool:
    """Whether this node's raylet starts the ``RUN_ACTORS`` processes in the same wave
    as ``workers`` prestarted workers and the driver itself. Each of them imports torch
    until the controller is placed (``spares.setup_hook``): where they would queue, they hold
    the cores the controller's own start needs. Measured on a 2-core node (2-worker
    gpt-tiny, a Ray job each, back to back): first step 20.1 s after the driver's start
    with them prestarted, 14.4 s without (both with the workers prestarted), 18.5 s
    with nothing prestarted."""
    return waves.startup_concurrency() >= workers + RUN_ACTORS + 1


def node_capacity(workers: int, *, cpus: float, gpus: float) -> int:
    """How many of ``workers`` (each ``cpus`` and ``gpus``) this process's node can hold."""
    resources = this_node().get("Resources", {})
    return first_group_here(resources, workers=workers, cpus=cpus, gpus=gpus)
