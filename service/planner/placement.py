"""Ranks on the GPUs of a cluster whose nodes differ: which GPU each rank can go to.

A cluster described node by node (``cluster.gpu_nodes``, or the connected cluster's nodes
with their GPU memory) may mix GPU sizes: two 24 GiB cards and one 12 GiB card, say. The
ranks of a layout need different memory too (a pipeline's first and last stages hold the
embedding and the head). Each rank (``gpus_per_worker`` GPUs of one node) is given a GPU
that holds it, the largest needs first on the largest GPUs: with one threshold per pair
(a rank fits a GPU when its need is at most the GPU's memory) that order places every
rank whenever any order can. The plan then says where each rank goes, which ranks bound
the layout (the least room left, or no GPU large enough) and which nodes hold none.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from service.planner.hardware import GIB, ClusterHardware, GpuNode
from service.planner.memory_model import rank_memory
from service.planner.workload import Layout, Workload


def rank_needs(work: Workload, layout: Layout) -> list[int]:
    """Device bytes of every rank, in rank order (the mesh is ("pp", "dp", "tp"): a pipeline
    stage's ranks are consecutive; dp and tp ranks of a stage need the same)."""
    per_stage = [rank_memory(work, layout, pp_rank=r).device_total for r in range(layout.pp)]
    return [need for need in per_stage for _ in range(layout.dp * layout.tp)]


@dataclass(frozen=True)
class Placement:
    """Where each rank goes: ``on[rank]`` is the index of its node in ``nodes`` (None: no
    GPU left that holds it)."""

    needs: tuple[int, ...]
    nodes: tuple[GpuNode, ...]
    on: tuple[int | None, ...]
    gpus_per_worker: int

    @property
    def fits(self) -> bool:
        return all(node is not None for node in self.on)

    @property
    def unplaced(self) -> list[int]:
        return [rank for rank, node in enumerate(self.on) if node is None]

    def gpu_bytes(self, rank: int) -> int | None:
        """Memory of the GPU ``rank`` was placed on (None: not placed)."""
        node = self.on[rank]
        return None if node is None else self.nodes[node].memory_bytes

    def room(self, rank: int) -> int | None:
        """Bytes left on the GPU of ``rank`` (None: not placed)."""
        held = self.gpu_bytes(rank)
        return None if held is None else held - self.needs[rank]

    @property
    def bounding(self) -> list[int]:
        """The ranks that bound the layout: those without a GPU, else those with the least
        room left on theirs."""
        if not self.fits:
            return self.unplaced
        least = min(self.room(r) for r in range(len(self.needs)))
        return [r for r in range(len(self.needs)) if self.room(r) == least]

    def used_sizes(self) -> tuple[int, ...]:
        """The memory of each GPU a rank was placed on."""
        return tuple(self.nodes[n].memory_bytes for n in self.on if n is not None)


def place(needs: list[int], nodes: tuple[GpuNode, ...], *, gpus_per_worker: int) -> Placement:
    """Each rank on a node with ``gpus_per_worker`` free GPUs that hold it, the largest
    needs on the largest GPUs first (ties: the node listed first)."""
    free = [node.gpus // max(1, gpus_per_worker) for node in nodes]
    by_size = sorted(range(len(nodes)), key=lambda n: (-nodes[n].memory_bytes, n))
    on: list[int | None] = [None] * len(needs)
    for rank in sorted(range(len(needs)), key=lambda r: (-needs[r], r)):
        for n in by_size:
            if free[n] and nodes[n].memory_bytes >= needs[rank]:
                on[rank], free[n] = n, free[n] - 1
                break
    return Placement(tuple(needs), nodes, tuple(on), gpus_per_worker)


def place_job(
    work: Workload, layout: Layout, hw: ClusterHardware, *, gpus_per_worker: int
) -> Placement | None:
    """The ranks of ``layout`` on ``hw``'s GPU nodes (None: a CPU job, or a cluster not
    described node by node)."""
    if not (work.on_gpu and hw.gpu_nodes):
        return None
    return place(rank_needs(work, layout), hw.gpu_nodes, gpus_per_worker=gpus_per_worker)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


class NodePlacement(BaseModel):
    """One node of the cluster and the job's ranks on it."""

    node: str
    gpu: str | None = Field(description="The GPU model, when known.")
    gpus: int
    gpu_memory_bytes: int
    ranks: list[int] = Field(description="The job's ranks placed on this node's GPUs.")
    holds_a_rank: bool = Field(description="False: every rank needs more than its GPUs have.")


class PlacementView(BaseModel):
    """Where each rank of the job goes on a cluster described node by node."""

    fits: bool = Field(description="Every rank has a GPU that holds it.")
    rank_bytes: list[int] = Field(description="Device bytes each rank needs, in rank order.")
    nodes: list[NodePlacement]
    bounding_ranks: list[int] = Field(
        description="The ranks that bound the layout: without a GPU that holds them, else "
        "with the least memory left on theirs."
    )
    summary: str = Field(description="The same in one sentence.")

    @classmethod
    def of(cls, p: Placement) -> PlacementView:
        """The view of ``p``."""
        smallest = min(p.needs, default=0)
        nodes = [
            NodePlacement(
                node=node.name,
                gpu=node.gpu,
                gpus=node.gpus,
                gpu_memory_bytes=node.memory_bytes,
                ranks=[r for r, n in enumerate(p.on) if n == i],
                holds_a_rank=node.memory_bytes >= smallest,
            )
            for i, node in enumerate(p.nodes)
        ]
        return cls(
            fits=p.fits,
            rank_bytes=list(p.needs),
            nodes=nodes,
            bounding_ranks=p.bounding,
            summary=summary(p),
        )


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def summary(p: Placement) -> str:
    """Where the ranks go and what bounds them, in one sentence."""
    bound = p.bounding
    need = max((p.needs[r] for r in bound), default=0)
    if not p.fits:
        big = sum(n.gpus for n in p.nodes if n.memory_bytes >= need) // max(1, p.gpus_per_worker)
        return (
            f"rank(s) {_ranks(bound)} need {_gib(need)} each and no GPU left holds them: "
            f"{big} worker slot(s) have GPUs of at least {_gib(need)} for "
            f"{len(p.needs)} ranks"
        )
    where = p.nodes[p.on[bound[0]]]
    idle = [n.name for n in p.nodes if n.memory_bytes < min(p.needs, default=0)]
    out = (
        f"rank(s) {_ranks(bound)} bound the layout: {_gib(need)} each on {where.name}'s "
        f"{_gib(where.memory_bytes)} GPU(s), {_gib(where.memory_bytes - need)} left"
    )
    if idle:
        out += f"; {', '.join(idle)} cannot hold a rank of this job"
    return out
