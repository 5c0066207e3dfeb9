"""What a RayCluster can hold at full scale-out, as the scheduler's ClusterInfo."""

from __future__ import annotations

from service.backends.base import ClusterInfo


def _quantity(text: str | int | float | None) -> float:
    """A CPU or count quantity ("4", "500m", 8) as a float."""
    if text is None or text == "":
        return 0.0
    text = str(text)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _group_resources(group: dict) -> dict[str, float]:
    params = group.get("rayStartParams") or {}
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    cpu = params.get("num-cpus", limits.get("cpu"))
    gpu = params.get("num-gpus", limits.get("nvidia.com/gpu"))
    return {"CPU": _quantity(cpu), "GPU": _quantity(gpu)}


def raycluster_capacity(obj: dict, *, dashboard_url: str | None) -> ClusterInfo:
    """What a RayCluster holds when every worker group is at maxReplicas."""
    spec = obj.get("spec") or {}
    nodes = [
        {
            "node_id": "head",
            "ip": None,
            "is_head": True,
            "resources": _group_resources(spec.get("headGroupSpec") or {}),
        }
    ]
    for group in spec.get("workerGroupSpecs") or []:
        res = _group_resources(group)
        hosts = group.get("numOfHosts", 1)
        for i in range(group.get("maxReplicas", 0) * hosts):
            nodes.append(
                {
                    "node_id": f"{group.get('groupName')}-{i}",
                    "ip": None,
                    "is_head": False,
                    "resources": dict(res),
                }
            )
    total = {k: sum(n["resources"][k] for n in nodes) for k in ("CPU", "GPU")}
    return ClusterInfo(nodes=nodes, total=total, available=dict(total), dashboard_url=dashboard_url)
