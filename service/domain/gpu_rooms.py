"""The GPUs of a cluster whose nodes differ in GPU memory, as the scheduler counts them.

On such a cluster a job's rank fits only the GPUs with at least its planned bytes: the
scheduler counts those (in whole workers per node: a worker's GPUs are on one node),
takes them as it admits jobs (the smallest that hold a rank first, so the larger ones stay
for the jobs that need them), and the job's workers are pinned to those nodes
(``queue_view.pin_gpu_nodes``, read by ``workers.launch``). On a cluster whose GPU nodes
are all the same, or whose GPU memory is unknown, there are no rooms and nothing changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from service.planner.hardware import GIB, mixed_gpu_nodes


class Demand(Protocol):
    """What the rooms read of a scheduler demand (``service.domain.scheduler.Demand``)."""

    gpus: float
    workers: int
    gpu_bytes: int


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _per_worker(d: Demand) -> int:
    """GPUs per worker of ``d`` (its GPUs over its minimum workers)."""
    return round(d.gpus / d.workers) if d.workers else 0


@dataclass
class Room:
    """One GPU node: its id, its GPUs' memory, how many it has and how many are free."""

    node_id: str
    memory_bytes: int
    gpus: int
    free: float


class GpuRooms:
    """The GPU nodes of a mixed cluster, free GPUs taken as jobs are admitted."""

    def __init__(self, rooms: list[Room]):
        self.rooms = sorted(rooms, key=lambda r: (r.memory_bytes, r.node_id))

    @classmethod
    def of(cls, nodes: list[dict]) -> GpuRooms | None:
        """The rooms of Ray's ``nodes`` (``ClusterInfo.nodes``); None unless their GPU
        nodes differ in memory and every one's is known."""
        mixed = mixed_gpu_nodes(nodes)
        if mixed is None:
            return None
        return cls(
            [
                Room(
                    str(node.get("node_id")),
                    int(entry["gpu_memory_gb"] * GIB),
                    entry["gpus"],
                    float(node.get("available", node["resources"]).get("GPU", 0.0)),
                )
                for node, entry in mixed
            ]
        )

    def _holding(self, need: int) -> list[Room]:
        return [r for r in self.rooms if r.memory_bytes >= need]

    def slots(self, need: int, gpus_per_worker: int, *, free: bool) -> int:
        """Workers of ``gpus_per_worker`` GPUs that fit on GPUs of at least ``need`` bytes
        (``free``: on the GPUs free now, else on all of them)."""
        per = max(1, gpus_per_worker)
        return sum(math.floor((r.free if free else r.gpus) / per) for r in self._holding(need))

    def take(self, need: int, workers: int, gpus_per_worker: int) -> None:
        """Take ``workers`` workers' GPUs from the smallest GPUs that hold ``need``."""
        per = max(1, gpus_per_worker)
        for room in self._holding(need):
            n = min(workers, math.floor(room.free / per))
            room.free -= n * per
            workers -= n
            if not workers:
                return

    def cannot_ever(self, d: Demand) -> str | None:
        """Why ``d`` never fits these GPUs (too few hold its ranks), or None."""
        if not (d.gpus and d.gpu_bytes):
            return None
        slots = self.slots(d.gpu_bytes, _per_worker(d), free=False)
        if slots >= d.workers:
            return None
        return (
            f"can never fit this cluster's GPUs: each rank needs {_gib(d.gpu_bytes)} of GPU "
            f"memory and the GPUs that hold it take {slots} of its minimum {d.workers} "
            "workers; it starts only if such GPUs join (cancel it, or shard more: "
            "POST /v1/plan says where each rank fits); it blocks no other job"
        )

    def cannot_now(self, d: Demand) -> str | None:
        """Why ``d`` waits for GPUs that hold its ranks, or None when enough are free."""
        if not (d.gpus and d.gpu_bytes):
            return None
        free = self.slots(d.gpu_bytes, _per_worker(d), free=True)
        if free >= d.workers:
            return None
        return (
            f"waiting for GPUs of at least {_gib(d.gpu_bytes)}: its {d.workers} workers' "
            f"ranks need that much each, and the GPUs that hold it are free for {free}"
        )

    def take_for(self, d: Demand) -> None:
        """Take what the admitted ``d`` runs on (any GPU when its need is unknown)."""
        if d.gpus:
            self.take(d.gpu_bytes, d.workers, _per_worker(d))

    def beside(self, reserved: Demand) -> GpuRooms:
        """These rooms with what ``reserved`` would run on held for it: the free GPUs that
        hold its ranks, smallest first, as many as its workers take. A job admitted beside
        a reservation fits the rest, so it never takes the large GPUs the reserved job waits
        for (the count of free GPUs alone let it)."""
        held = GpuRooms([Room(r.node_id, r.memory_bytes, r.gpus, r.free) for r in self.rooms])
        held.take_for(reserved)
        return held

    def nodes_for(self, need: int) -> list[str]:
        """The ids of the nodes whose GPUs hold ``need`` bytes."""
        return [r.node_id for r in self._holding(need)]
