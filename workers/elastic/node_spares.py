"""A node that joins a running elastic job: warm spares there at once, and a resize now.

Without this, a joining node idles until Ray Train's resize monitor looks again
(every ``elastic_resize_monitor_interval_s``) through the AutoscalingCoordinator's
node list (refreshed every 20 s), and the grown group's workers on the new node then
start as fresh processes that import torch, Ray Train and etrain (8-15 s on busy
cores): 25-30 s from the node's arrival to a step at the new size.

:class:`NodeWatch` runs in the Ray Train controller, called by the scaling policy
on every control-loop iteration (about once a second). It lists the cluster's live
nodes at most every ``POLL_S``; for each node that joined since the controller
started it

- asks that node's raylet for warm spare processes (``PrestartWorkers``, as
  :mod:`workers.warm.spares` does for nodes that run workers), with the
  runtime environment Ray Train's worker actors get, so the grown group's actors
  on that node are placed in processes that started importing the training stack
  the moment the node was seen; at most as many as the node can run workers of
  the job (its CPUs and GPUs per worker) and the group can still add; only when
  the job keeps spares (its setup hook is :data:`warm_spares.HOOK`). Each request
  is printed to the controller's log (the job's log); the spares end with the job
  like every other;
- records the join (``joined_at``), so that the policy considers a resize at once,
  from a reservation recomputed from the live node list;
- says whether a joined node's spares still import (:meth:`NodeWatch.warming`): each
  records itself ready in Ray's GCS (:func:`warm_spares.ready_on`), and the policy keeps
  the running group training until they are, for at most ``SPARES_WAIT_S`` after the
  join. Resizing at once would stop the group and then wait for those imports anyway
  (the grown group is placed in them), with the old group's cores idle.
"""

from __future__ import annotations

import logging
import sys
import time

from workers.ray_compat import prestart_workers, setup_hook_of_this_job, train_worker_runtime_env
from workers.warm import spares as warm_spares
from workers.warm.first_group import first_group_here

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often the controller lists the cluster's nodes (one GCS call)
SPARES_WAIT_S = 20.0  # a resize waits this long at most for a joined node's spares


class NodeWatch:
    """Nodes that join while the controller runs (see the module docstring)."""

    def __init__(self, *, max_workers: int, cpus: float, gpus: float):
        self.max_workers, self.cpus, self.gpus = max_workers, cpus, gpus
        self.joined_at: float | None = None  # monotonic time of the latest join
        self.pending: dict[str, int] = {}  # node id -> spares asked for, since the last resize
        self._known: set[str] | None = None  # every node seen alive so far
        self._polled = float("-inf")
        self._env: str | None = None  # the worker actors' runtime env ("" = no spares)

    def poll(self, group_size: int = 0) -> list[str]:
        """Look for joined nodes (at most every ``POLL_S``); return their ids.

        ``group_size``: workers of the running group (0 if none). Never raises.
        """
        now = time.monotonic()
        if now - self._polled < POLL_S:
            return []
        self._polled = now
        try:
            nodes = self._alive_nodes()
        except Exception as e:  # noqa: BLE001 - the resize monitor is the fallback
            log.warning("etrain: could not list the cluster's nodes: %s: %s", type(e).__name__, e)
            return []
        if self._known is None:  # nodes there at the start: the driver and top_up serve them
            self._known = set(nodes)
            return []
        # Every node ever seen stays known (Ray never reuses a node id): should the list
        # drop a node for a moment, its return is no new join and asks for no more spares.
        joined = [n for n in nodes if n not in self._known]
        self._known |= set(nodes)
        if joined:
            self.joined_at = now
        room = max(self.max_workers - group_size, 0)
        for node_id in joined:
            room -= self._prestart(node_id, nodes[node_id], room)
        return joined

    def warming(self) -> dict[str, int]:
        """Joined nodes (since :meth:`resized`) whose spares are not all ready yet: node id ->
        spares still importing; empty once ``SPARES_WAIT_S`` passed since the latest join.
        Never raises (a count it cannot read is taken as ready)."""
        if self.joined_at is None or time.monotonic() - self.joined_at >= SPARES_WAIT_S:
            return {}
        waiting = {}
        for node_id, asked in self.pending.items():
            try:
                left = asked - warm_spares.ready_on(node_id)
            except Exception as e:  # noqa: BLE001 - then resize without waiting
                log.warning("etrain: could not count a joined node's spares: %s", e)
                left = 0
            if left > 0:
                waiting[node_id] = left
        return waiting

    def resized(self) -> None:
        """The group was resized: joins before now are acted on."""
        self.joined_at, self.pending = None, {}

    def _alive_nodes(self) -> dict[str, dict]:
        """Live nodes by id, with their total resources."""
        import ray

        if not ray.is_initialized():
            return {}
        return {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}

    def _prestart(self, node_id: str, resources: dict, room: int) -> int:
        """Ask ``node_id``'s raylet for its spares; return how many were asked for."""
        count = first_group_here(
            resources, workers=min(room, self.max_workers), cpus=self.cpus, gpus=self.gpus
        )
        env = self._worker_env()
        if count <= 0 or not env:
            return 0
        try:
            prestart_workers(
                count, keep_alive_s=warm_spares.KEEP_ALIVE_S, runtime_env=env, node_id=node_id
            )
        except Exception as e:  # noqa: BLE001 - spares only make the resize faster
            log.warning("etrain: could not start warm spares on a joined node: %s", e)
            return 0
        self.pending[node_id] = count
        print(
            f"etrain: node {node_id[:8]} joined: asked for {count} warm spare worker(s) there",
            file=sys.stderr,
            flush=True,
        )
        return count

    def _worker_env(self) -> str:
        """The worker actors' serialized runtime env, or "" when the job keeps no spares."""
        if self._env is None:
            spares = setup_hook_of_this_job() == warm_spares.HOOK
            self._env = train_worker_runtime_env(warm_spares.worker_runtime_env()) if spares else ""
        return self._env
