"""The cluster as the Ray dashboard's node summary describes it: alive nodes, each with its
total and free resources and its GPU devices; the totals over alive nodes."""

from __future__ import annotations

from service.api.cluster_schemas import ClusterPublic
from service.backends.ray_jobs import _cluster_from_summary

GIB = 2**30


def _node(node_id, *, alive=True, head=False, total, free, gpus=None):
    node = {
        "ip": f"10.0.0.{len(node_id)}",
        "raylet": {
            "nodeId": node_id,
            "state": "ALIVE" if alive else "DEAD",
            "isHeadNode": head,
            "resourcesTotal": total,
            "resourcesAvailable": free,
        },
    }
    if gpus is not None:
        node["gpus"] = gpus
    return node


SUMMARY = [
    _node("head", head=True, total={"CPU": 4.0, "memory": 8 * GIB}, free={"CPU": 1.0}),
    _node(
        "gpu-node",
        total={"CPU": 16.0, "GPU": 2.0, "memory": 64 * GIB, "accelerator_type:H100": 1.0},
        free={"CPU": 14.0, "GPU": 1.0, "memory": 60 * GIB},
        gpus=[
            {"index": i, "name": "NVIDIA H100 80GB HBM3", "memoryTotal": 81559, "memoryUsed": 9}
            for i in range(2)
        ],
    ),
    _node("gone", alive=False, total={"CPU": 64.0}, free={"CPU": 64.0}),
]


def test_each_alive_node_has_its_free_resources_and_gpu_devices():
    info = _cluster_from_summary(SUMMARY, "http://ray:8265")
    public = ClusterPublic.model_validate({**info.__dict__, "queue": []})
    head, gpu = public.nodes
    assert [n.node_id for n in public.nodes] == ["head", "gpu-node"]  # the dead one left out
    assert head.is_head and head.available == {"CPU": 1.0} and head.gpus == []
    assert gpu.available["GPU"] == 1.0 and gpu.available["CPU"] == 14.0
    assert [(g.name, g.memory_mb) for g in gpu.gpus] == [("NVIDIA H100 80GB HBM3", 81559)] * 2
    assert public.total["CPU"] == 20.0 and public.available["CPU"] == 15.0
    assert public.total["GPU"] == 2.0 and public.available["GPU"] == 1.0
