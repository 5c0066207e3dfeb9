"""Clusters of mixed GPUs: each rank on a GPU that holds it, the ranks that bound the layout,
nodes that hold none, from a described cluster and from the connected cluster's nodes."""

from __future__ import annotations

import itertools
import random

import pytest

from service.planner.hardware import GIB, GPU_MEMORY_LABEL, GpuNode, cluster_from_nodes, find_gpu
from service.planner.placement import place, rank_needs
from service.planner.planning import layout_of, plan_job, workload_of
from tests.support.api import api_client
from tests.support.fakes import ADMIN_H, FakeBackend
from tests.support.specs import MIXED_GPU_CLUSTER, MIXED_GPU_JOB
from workers.spec import JobSpec

MIXED = MIXED_GPU_CLUSTER


def _spec(workers: int, parallelism: dict) -> JobSpec:
    """MIXED_GPU_JOB on ``workers`` GPUs under ``parallelism``."""
    resources = {**MIXED_GPU_JOB["resources"], "workers": workers}
    return JobSpec.model_validate(
        {**MIXED_GPU_JOB, "resources": resources, "parallelism": parallelism}
    )


def _nodes(*sizes_gib: float, gpus: int = 1) -> tuple[GpuNode, ...]:
    return tuple(GpuNode(f"n{i}", gpus, int(s * GIB)) for i, s in enumerate(sizes_gib))


def test_the_largest_needs_go_to_the_largest_gpus():
    p = place([5 * GIB, 20 * GIB, 11 * GIB], _nodes(12, 24, 8, 24), gpus_per_worker=1)
    # 20 on the first 24 (ties: the node listed first), 11 on the other, 5 on the 12.
    assert p.fits and p.on == (0, 1, 3)
    assert [p.room(r) for r in range(3)] == [7 * GIB, 4 * GIB, 13 * GIB]
    assert p.bounding == [1]


def test_bounding_ranks_have_the_least_room_left():
    p = place([20 * GIB, 20 * GIB, 3 * GIB], _nodes(24, 24, 8), gpus_per_worker=1)
    assert p.fits and p.bounding == [0, 1]
    assert [p.room(r) for r in range(3)] == [4 * GIB, 4 * GIB, 5 * GIB]


def test_a_worker_takes_its_gpus_on_one_node():
    # Two 24 GiB nodes of 3 GPUs: one 2-GPU worker each (the third GPU of each stays free).
    p = place([10 * GIB] * 3, _nodes(24, 24, gpus=3), gpus_per_worker=2)
    assert not p.fits and p.unplaced == [2]


@pytest.mark.parametrize("seed", range(40))
def test_a_rank_is_never_placed_where_it_does_not_fit_and_a_fit_is_never_missed(seed):
    """Random needs and nodes: every placed rank holds on its GPU, no node gives more
    slots than it has, and the greedy order places everything whenever some assignment
    (found by brute force) does."""
    rng = random.Random(seed)
    nodes = tuple(
        GpuNode(f"n{i}", rng.choice([1, 2]), rng.choice([8, 12, 16, 24]) * GIB)
        for i in range(rng.randint(1, 4))
    )
    needs = [rng.choice([4, 9, 11, 14, 20, 26]) * GIB for _ in range(rng.randint(1, 5))]
    p = place(needs, nodes, gpus_per_worker=1)
    for rank, node in enumerate(p.on):
        assert node is None or nodes[node].memory_bytes >= needs[rank]
    for i, node in enumerate(nodes):
        assert p.on.count(i) <= node.gpus
    slots = [i for i, node in enumerate(nodes) for _ in range(node.gpus)]
    possible = any(
        all(nodes[slot].memory_bytes >= need for slot, need in zip(pick, needs, strict=True))
        for pick in itertools.permutations(slots, len(needs))
    )
    assert p.fits == possible


def test_pipeline_stages_need_different_memory_and_the_larger_takes_the_larger_gpu():
    spec = _spec(2, {"strategy": "pp", "pp": 2, "pipeline": {"microbatches": 4}})
    needs = rank_needs(workload_of(spec), layout_of(spec, 2))
    assert needs[0] != needs[1]
    nodes = _nodes(16, 24)
    p = place(needs, nodes, gpus_per_worker=1)
    big = max(range(2), key=lambda r: needs[r])
    assert p.fits and p.on[big] == 1


def test_data_parallel_on_two_big_gpus_and_the_small_one_named():
    plan = plan_job(_spec(2, {"strategy": "fsdp"}), cluster=MIXED)
    assert plan.fits and plan.placement is not None
    nodes = {n.node: n for n in plan.placement.nodes}
    assert nodes["home-1"].ranks == [0] and nodes["home-2"].ranks == [1]
    assert nodes["laptop"].ranks == [] and not nodes["laptop"].holds_a_rank
    assert plan.placement.bounding_ranks == [0, 1]
    assert "laptop" in plan.placement.summary
    assert any("laptop (12.0 GiB) cannot hold a rank" in w for w in plan.warnings)
    # Planned at the GPUs it runs on, not at the laptop's 12 GiB.
    assert not any("planned at the smallest" in w for w in plan.warnings)


def test_a_third_rank_without_a_gpu_that_holds_it_does_not_fit_and_says_which():
    plan = plan_job(_spec(3, {"strategy": "fsdp"}), cluster=MIXED)
    assert plan.fits is False and plan.placement is not None
    assert not plan.placement.fits and plan.placement.bounding_ranks == [2]
    (error,) = plan.errors
    assert "cannot put every rank on a GPU that holds it" in error
    assert "rank(s) 2 need" in error and "2 worker slot(s)" in error
    assert "set parallelism.strategy" in error  # and how to make it fit


def test_when_every_rank_fits_the_small_gpu_the_smallest_bounds_data_parallelism():
    spec = _spec(3, {"strategy": "fsdp", "fsdp": {"cpu_offload": True}})
    plan = plan_job(spec, cluster=MIXED)
    assert plan.fits and sorted(r for n in plan.placement.nodes for r in n.ranks) == [0, 1, 2]
    assert any("planned at the smallest (12 GiB)" in w for w in plan.warnings)


def test_the_candidates_fit_by_placement_not_by_the_smallest_gpu():
    plan = plan_job(_spec(2, {"strategy": "fsdp"}), cluster=MIXED)
    same = [c for c in plan.candidates if c.layout == "fsdp zero3 dp=2"]
    assert same and same[0].fits  # 21.5 GiB a rank: more than the laptop, less than 24


def test_a_uniform_cluster_has_no_placement():
    plan = plan_job(_spec(2, {"strategy": "fsdp"}), cluster={"gpu_memory_gb": 24})
    assert plan.placement is None


def _node(node_id: str, count: int, **extra) -> dict:
    """A Ray node of ``count`` GPUs (``extra``: its labels, its reporter's GPU list)."""
    resources = {"CPU": 8.0, "GPU": float(count)}
    return {"node_id": node_id, "ip": "198.18.0.2", "resources": resources, **extra}


def test_the_connected_clusters_gpu_nodes_come_from_labels_the_reporter_or_the_table():
    nodes = [
        _node("aaaaaaaaaaaa", 2, labels={GPU_MEMORY_LABEL: "24"}),
        _node("bbbbbbbbbbbb", 1, gpus=[{"name": "NVIDIA RTX 3060", "memory_mb": 12288}]),
        _node("cccccccccccc", 0),
    ]
    shape = cluster_from_nodes(nodes)
    assert shape["gpu_nodes"] == [
        {"name": "198.18.0.2/aaaaaaaa", "gpus": 2, "gpu_memory_gb": 24.0},
        {"name": "198.18.0.2/bbbbbbbb", "gpus": 1, "gpu_memory_gb": 12.0},
    ]
    # The same size everywhere: the plan sizes every rank at it, no node by node.
    same = [
        _node("a", 1, labels={GPU_MEMORY_LABEL: "24"}),
        _node("b", 1, labels={GPU_MEMORY_LABEL: "24"}),
    ]
    assert "gpu_nodes" not in cluster_from_nodes(same)


@pytest.mark.parametrize("label", ["", "lots", "0", "-4", "inf", "nan", "1e9"])
def test_a_gpu_memory_label_that_is_no_size_leaves_the_node_unknown(label):
    nodes = [
        _node("a", 1, labels={GPU_MEMORY_LABEL: label}),
        _node("b", 1, labels={GPU_MEMORY_LABEL: "12"}),
    ]
    assert "gpu_nodes" not in cluster_from_nodes(nodes)


def _mixed_backend() -> FakeBackend:
    backend = FakeBackend(cpus=16, gpus=2)
    backend.info.nodes[0]["labels"] = {GPU_MEMORY_LABEL: "24"}
    backend.info.nodes.append(
        {**_node("laptop00000", 1, labels={GPU_MEMORY_LABEL: "12"}), "is_head": False}
    )
    return backend


def test_the_api_plans_on_the_connected_mixed_cluster_and_shows_its_gpu_nodes(tmp_path):
    body = _spec(2, {"strategy": "fsdp"}).model_dump(mode="json", by_alias=True)
    with api_client(tmp_path, _mixed_backend()) as c:
        plan = c.post("/v1/plan", json={"spec": body}, headers=ADMIN_H).json()
        cluster = c.get("/v1/cluster", headers=ADMIN_H).json()
    placement = plan["placement"]
    assert placement["fits"] and [n["ranks"] for n in placement["nodes"]] == [[0, 1], []]
    assert [n["gpu_memory_gb"] for n in cluster["gpu_nodes"]] == [24.0, 12.0]


def test_a_described_node_needs_its_gpu_memory(tmp_path):
    body = _spec(2, {"strategy": "fsdp"}).model_dump(mode="json", by_alias=True)
    bad = {"gpu_nodes": [{"gpus": 1, "gpu_memory_gb": 0}]}
    unknown = {"gpu_nodes": [{"gpus": 1}]}
    with api_client(tmp_path, FakeBackend()) as c:
        r = c.post("/v1/plan", json={"spec": body, "cluster": bad}, headers=ADMIN_H)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][-3:] == ["gpu_nodes", 0, "gpu_memory_gb"]
        r = c.post("/v1/plan", json={"spec": body, "cluster": unknown}, headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["fits"] is False
    assert any("cluster.gpu_nodes[0] needs gpu_memory_gb" in e for e in r.json()["errors"])


def test_the_cluster_answer_gives_each_nodes_gpu_memory_and_its_source():
    """GET /v1/cluster's node view reads each node's GPU memory by the planner's rule, the
    accelerator type's table included (the cluster page prints it as it is)."""
    from service.api.cluster_schemas import NodePublic

    typed = _node("t", 1, resources={"GPU": 1.0, "accelerator_type:A100": 1.0})
    views = [
        NodePublic(is_head=False, **n)
        for n in (
            _node("l", 2, labels={GPU_MEMORY_LABEL: "24"}),
            _node("d", 1, gpus=[{"name": "NVIDIA RTX 3060", "memory_mb": 12288}]),
            typed,
            _node("c", 0),
            _node("u", 1, labels={GPU_MEMORY_LABEL: "lots"}),
        )
    ]
    got = [(v.gpu_memory_gb, v.gpu_memory_source) for v in views]
    a100 = find_gpu("A100").memory_gib
    assert got == [(24.0, "label"), (12.0, "device"), (a100, "type"), (None, None), (None, None)]
    assert views[0].model_dump()["gpu_memory_source"] == "label"  # in the API's JSON
