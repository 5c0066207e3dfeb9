"""The device mesh and who holds what on it: one 3-D mesh ("pp", "dp", "tp"), and the
gradient norm over parameters that live on different sub-meshes of it.

TP is the innermost dimension, so a TP group is consecutive world ranks (which
Ray places on one node); PP is outermost. Size-1 dimensions are kept so that
every strategy sees the same three names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from workers.spec import JobSpec

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Coordinates:
    """This rank's place in the mesh."""

    pp_rank: int = 0
    pp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1


def build_mesh(spec: JobSpec, *, world_size: int, device: torch.device) -> DeviceMesh | None:
    """The ("pp", "dp", "tp") mesh for ``world_size``; None when running as one plain process."""
    if not dist.is_initialized():
        return None
    par = spec.parallelism
    dp = spec.data_parallel_size(world_size)
    return init_device_mesh(device.type, (par.pp, dp, par.tp), mesh_dim_names=MESH_DIMS)


def coordinates(mesh: DeviceMesh | None) -> Coordinates:
    """Ranks and sizes along each mesh dimension (all zeros and ones without a mesh)."""
    if mesh is None:
        return Coordinates()
    get = {d: (mesh[d].get_local_rank(), mesh[d].size()) for d in MESH_DIMS}
    return Coordinates(
        pp_rank=get["pp"][0],
        pp_size=get["pp"][1],
        dp_rank=get["dp"][0],
        dp_size=get["dp"][1],
        tp_rank=get["tp"][0],
        tp_size=get["tp"][1],
    )


def check_tp_placement(node_ranks: list[int], *, tp: int) -> None:
    """Refuse a layout whose TP groups (consecutive world ranks) span nodes.

    ``node_ranks[r]`` is the node of world rank ``r``. TP all-reduces every
    layer, so it must stay inside one node's fast interconnect.
    """
    for start in range(0, len(node_ranks), tp):
        nodes = sorted(set(node_ranks[start : start + tp]))
        if len(nodes) > 1:
            raise ValueError(
                f"parallelism.tp ({tp}) group of world ranks {start}..{start + tp - 1} spans "
                f"nodes {nodes}; reduce parallelism.tp to at most the workers per node, or "
                "give each node a multiple of tp workers"
            )


def total_grad_norm(params: list[nn.Parameter]) -> torch.Tensor:
    """The L2 norm of the gradients of ``params`` (one rank's whole model), as a plain tensor.

    TP and FSDP leave DTensor gradients on different meshes ((dp, tp), dp, tp)
    next to plain replicated ones, which ``clip_grad_norm_`` cannot stack: each
    mesh's gradients get one norm, made whole (``full_tensor``) before combining.
    """
    by_mesh: dict = {}
    for p in params:
        by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    norms = []
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, foreach=False)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
