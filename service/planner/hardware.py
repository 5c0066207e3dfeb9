"""Known GPUs and links, and the cluster a plan is made for. Pure Python, no torch.

Numbers are vendor peaks: dense bf16 tensor throughput (no sparsity) and
aggregate link bandwidth as marketed (NVLink 4 "900 GB/s", PCIe 4.0 x16 about
32 GB/s). The planner uses them for relative estimates (which layout
communicates more, where communication dominates), not as promises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.ray_head import GPU_MEMORY_LABEL

GIB = 1024**3


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: memory, dense bf16 throughput and its usual intra-node link."""

    name: str
    memory_gib: float
    bf16_tflops: float
    link: str
    network: str  # what nodes of this class usually have between them


@dataclass(frozen=True)
class Link:
    """An interconnect: bandwidth per GPU in GB/s (1e9 bytes per second)."""

    name: str
    gbps: float

    @property
    def is_nvlink(self) -> bool:
        """NVLink (or NVSwitch) rather than PCIe."""
        return self.name.startswith("nvlink")


# Intra-node GPU-to-GPU links.
LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("pcie3", 16.0),
        Link("pcie4", 32.0),
        Link("pcie5", 64.0),
        Link("nvlink3", 600.0),
        Link("nvlink4", 900.0),
        Link("nvlink5", 1800.0),
    )
}
LINK_ALIASES = {"pcie": "pcie4", "nvlink": "nvlink4", "nvswitch": "nvlink4"}
# Inter-node networks, per GPU (rail-optimised clusters give each GPU its own NIC).
NETWORKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("ethernet-10g", 1.25),
        Link("ethernet-25g", 3.125),
        Link("ethernet-100g", 12.5),
        Link("ethernet-400g", 50.0),
        Link("ib-hdr", 25.0),
        Link("ib-ndr", 50.0),
        Link("ib-xdr", 100.0),
    )
}
NETWORK_ALIASES = {"ethernet": "ethernet-100g", "infiniband": "ib-ndr", "ib": "ib-ndr"}

GPUS: dict[str, GpuModel] = {
    g.name: g
    for g in (
        GpuModel("h100", 80, 989.0, "nvlink4", "ib-ndr"),
        GpuModel("h100-pcie", 80, 756.0, "pcie5", "ethernet-100g"),
        GpuModel("h200", 141, 989.0, "nvlink4", "ib-ndr"),
        GpuModel("b200", 180, 2250.0, "nvlink5", "ib-xdr"),
        GpuModel("a100", 80, 312.0, "nvlink3", "ib-hdr"),
        GpuModel("a100-40gb", 40, 312.0, "nvlink3", "ib-hdr"),
        GpuModel("l40s", 48, 362.0, "pcie4", "ethernet-100g"),
        GpuModel("a10g", 24, 125.0, "pcie4", "ethernet-25g"),
        GpuModel("l4", 24, 121.0, "pcie4", "ethernet-25g"),
        GpuModel("rtx4090", 24, 165.0, "pcie4", "ethernet-10g"),
        GpuModel("rtx3090", 24, 71.0, "pcie4", "ethernet-10g"),
        GpuModel("rtx3060", 12, 25.6, "pcie4", "ethernet-10g"),
    )
}
# Normalised spellings (lowercase, letters and digits only) -> table key. Ray
# reports accelerator types such as "H100", "A100-80G", "A10G", "L4".
_GPU_ALIASES = {
    "h10080gb": "h100",
    "h100sxm": "h100",
    "h100sxm5": "h100",
    "h100pcie": "h100-pcie",
    "h200141gb": "h200",
    "a10080gb": "a100",
    "a10080g": "a100",
    "a100sxm": "a100",
    "a10040gb": "a100-40gb",
    "a10040g": "a100-40gb",
    "geforcertx4090": "rtx4090",
    "geforcertx3090": "rtx3090",
    "geforcertx3060": "rtx3060",
    "nvidial40s": "l40s",
}
_TFLOPS_FP32_FACTOR = 0.5  # TF32 tensor cores: half the bf16 rate on these parts


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().removeprefix("nvidia"))


def find_gpu(name: str) -> GpuModel | None:
    """The table entry for a GPU name as users or Ray spell it ("H100-80GB", "RTX 4090")."""
    key = _norm(name)
    for gpu in GPUS.values():
        if _norm(gpu.name) == key:
            return gpu
    return GPUS.get(_GPU_ALIASES.get(key, ""))


@dataclass(frozen=True)
class GpuNode:
    """One node of a cluster described node by node: its GPUs and their memory."""

    name: str
    gpus: int
    memory_bytes: int
    gpu: str | None = None


@dataclass(frozen=True)
class ClusterHardware:
    """The cluster a plan is made for, resolved against the tables.

    ``gpu_memory_bytes`` is the smallest GPU's. Without ``gpu_nodes`` every rank is
    planned as if it had the smallest one; with them each rank goes to a GPU that holds
    it (:mod:`service.planner.placement`).
    """

    nodes: int | None = None
    gpus_per_node: int | None = None
    cpus_per_node: float | None = None
    gpu_names: tuple[str, ...] = ()
    gpu_memory_sizes: tuple[int, ...] = ()
    bf16_tflops: float | None = None
    link: Link | None = None
    network: Link | None = None
    host_memory_bytes: int | None = None
    gpu_nodes: tuple[GpuNode, ...] = ()

    @property
    def gpu_memory_bytes(self) -> int | None:
        """Memory of the smallest GPU, or None when unknown."""
        return min(self.gpu_memory_sizes) if self.gpu_memory_sizes else None

    @property
    def heterogeneous(self) -> bool:
        """GPUs of different memory sizes."""
        return len(set(self.gpu_memory_sizes)) > 1

    def tflops(self, precision: str) -> float | None:
        """Peak dense throughput for ``precision`` (bf16, or TF32 for fp32)."""
        if self.bf16_tflops is None:
            return None
        return self.bf16_tflops * (1.0 if precision == "bf16" else _TFLOPS_FP32_FACTOR)


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _resolve_link(
    name: str | None, table: dict[str, Link], aliases: dict[str, str], field: str, errors: list[str]
) -> Link | None:
    if name is None:
        return None
    key = aliases.get(name.lower(), name.lower())
    if key not in table:
        errors.append(f"{field} {name!r} is unknown; use one of {sorted(table) + sorted(aliases)}")
        return None
    return table[key]


def resolve_cluster(cluster: dict) -> tuple[ClusterHardware, list[str]]:
    """Resolve a cluster description (POST /v1/plan ``cluster``) into hardware numbers.

    Returns the hardware and errors naming the ``cluster.*`` field for names
    the tables do not know. ``gpu`` and ``gpu_memory_gb`` may be lists (one
    entry per kind of GPU in the cluster); an explicit ``gpu_memory_gb`` wins
    over the table's memory of ``gpu``.
    """
    errors: list[str] = []
    gpus = []
    for name in _as_list(cluster.get("gpu")):
        gpu = find_gpu(str(name))
        if gpu is None:
            errors.append(
                f"cluster.gpu {name!r} is unknown; use one of {sorted(GPUS)} or "
                "give cluster.gpu_memory_gb"
            )
        else:
            gpus.append(gpu)
    sizes = [int(float(gb) * GIB) for gb in _as_list(cluster.get("gpu_memory_gb"))]
    if not sizes:
        sizes = [int(g.memory_gib * GIB) for g in gpus]
    each = _gpu_nodes(cluster.get("gpu_nodes") or [], errors)
    if each:  # node by node: the sizes and models of every node's GPUs
        sizes = [n.memory_bytes for n in each]
        gpus = gpus or [g for g in (find_gpu(n.gpu) for n in each if n.gpu) if g is not None]
    link = _resolve_link(
        cluster.get("interconnect"), LINKS, LINK_ALIASES, "cluster.interconnect", errors
    )
    network = _resolve_link(
        cluster.get("network"), NETWORKS, NETWORK_ALIASES, "cluster.network", errors
    )
    if gpus:
        slowest = min(gpus, key=lambda g: g.bf16_tflops)
        link = link or LINKS[slowest.link]
        network = network or NETWORKS[slowest.network]
    host = cluster.get("host_memory_gb")
    return ClusterHardware(
        nodes=cluster["nodes"] if "nodes" in cluster else (len(each) or None),
        gpus_per_node=cluster.get("gpus_per_node", max((n.gpus for n in each), default=None)),
        cpus_per_node=cluster.get("cpus_per_node"),
        gpu_names=tuple(g.name for g in gpus),
        gpu_memory_sizes=tuple(sizes),
        bf16_tflops=min((g.bf16_tflops for g in gpus), default=None),
        link=link,
        network=network,
        host_memory_bytes=int(host * GIB) if host else None,
        gpu_nodes=each,
    ), errors


def _gpu_nodes(entries: list[dict], errors: list[str]) -> tuple[GpuNode, ...]:
    """``cluster.gpu_nodes`` resolved: one GpuNode per node (an entry's ``count`` nodes),
    memory from ``gpu_memory_gb`` or the table's ``gpu``."""
    out: list[GpuNode] = []
    for i, entry in enumerate(entries):
        gb, name = entry.get("gpu_memory_gb"), entry.get("gpu")
        if gb is None:
            gpu = find_gpu(str(name)) if name else None
            if gpu is None:
                errors.append(
                    f"cluster.gpu_nodes[{i}] needs gpu_memory_gb or a known gpu "
                    f"(one of {sorted(GPUS)})"
                )
                continue
            gb = gpu.memory_gib
        count = int(entry.get("count") or 1)
        for k in range(count):
            label = entry.get("name") or f"node-{len(out) + 1}"
            out.append(
                GpuNode(
                    name=label if count == 1 else f"{label}-{k + 1}",
                    gpus=int(entry.get("gpus") or 1),
                    memory_bytes=int(float(gb) * GIB),
                    gpu=str(name) if name else None,
                )
            )
    return tuple(out)


def cluster_from_nodes(nodes: list[dict]) -> dict:
    """A cluster description from Ray node resources (``GET /v1/cluster`` nodes).

    Ray reports ``GPU`` and ``CPU`` counts, host ``memory`` in bytes and an
    ``accelerator_type:<NAME>`` resource per GPU kind; GPU memory itself comes
    from the table. Nodes without GPUs are ignored for the GPU fields.
    """
    if not nodes:
        return {}
    res = [n.get("resources", {}) for n in nodes]
    gpus = [int(r.get("GPU", 0)) for r in res]
    cpus = [float(r.get("CPU", 0)) for r in res]
    kinds = sorted(
        {k.split(":", 1)[1] for r in res for k in r if k.startswith("accelerator_type:")}
    )
    known = [k for k in kinds if find_gpu(k) is not None]
    host = [
        float(r["memory"])
        for r, g in zip(res, gpus, strict=True)
        if "memory" in r and (g or not any(gpus))
    ]
    shape: dict = {
        "nodes": len(nodes),
        "cpus_per_node": max(cpus, default=0) or None,
        "gpus_per_node": max(gpus, default=0),
    }
    if known:
        shape["gpu"] = known[0] if len(known) == 1 else known
    if host:
        shape["host_memory_gb"] = min(host) / GIB
    mixed = mixed_gpu_nodes(nodes)
    if mixed is not None:  # GPUs of different sizes: each rank placed on one
        shape["gpu_nodes"] = [entry for _, entry in mixed]
    return shape


def mixed_gpu_nodes(nodes: list[dict]) -> list[tuple[dict, dict]] | None:
    """Each GPU node of Ray's ``nodes`` with its ``cluster.gpu_nodes`` entry
    (:func:`gpu_node_of`); None unless every one's GPU memory is known and they differ."""
    gpu = [n for n in nodes if int(n.get("resources", {}).get("GPU", 0))]
    each = [gpu_node_of(n) for n in gpu]
    if not each or None in each or len({e["gpu_memory_gb"] for e in each}) < 2:
        return None
    return list(zip(gpu, each, strict=True))


def gpu_memory_of(node: dict) -> tuple[float, str] | None:
    """The memory of each GPU of one node of Ray's ``nodes`` in GiB, and where it comes
    from: ``device`` (its reporter read the devices; the smallest), ``label`` (its
    GPU_MEMORY_LABEL) or ``type`` (the table's for its accelerator type). None: no GPUs,
    or unknown."""
    res = node.get("resources", {})
    if not res.get("GPU"):
        return None
    read = [g["memory_mb"] for g in node.get("gpus") or [] if g.get("memory_mb")]
    kinds = [find_gpu(k.split(":", 1)[1]) for k in res if k.startswith("accelerator_type:")]
    label = (node.get("labels") or {}).get(GPU_MEMORY_LABEL)
    if read:
        return min(read) / 1024, "device"
    if label:
        try:
            gb = float(label)
        except ValueError:
            return None
        return (gb, "label") if 0 < gb <= 4096 else None  # as cluster.gpu_memory_gb
    if kinds and kinds[0] is not None:
        return kinds[0].memory_gib, "type"
    return None


def gpu_node_of(node: dict) -> dict | None:
    """One GPU node of the connected cluster as a ``cluster.gpu_nodes`` entry: its GPUs'
    memory as :func:`gpu_memory_of` finds it (None: unknown)."""
    memory = gpu_memory_of(node)
    if memory is None:
        return None
    gb, res = memory[0], node["resources"]
    name = str(node.get("node_id") or "")[:8]
    return {
        "name": f"{node['ip']}/{name}" if node.get("ip") else name,
        "gpus": int(res["GPU"]),
        "gpu_memory_gb": gb,
    }
