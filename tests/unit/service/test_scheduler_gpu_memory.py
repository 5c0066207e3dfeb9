"""Scheduling on a cluster of mixed GPUs (scheduler rule 6): a job counts only the GPUs that
hold its planned rank, takes the smallest of them, and its workers are pinned to the nodes
whose GPUs hold it (ETRAIN_GPU_NODES, a Ray label selector in the driver)."""

from __future__ import annotations

import dataclasses

import pytest

from service.backends.base import ClusterInfo
from service.domain.gpu_rooms import GpuRooms
from service.domain.reconciler import Reconciler
from service.domain.scheduler import Demand, WaitCode, decide_admissions
from service.planner.hardware import GIB, GPU_MEMORY_LABEL
from service.settings import Settings
from service.status import JobStatus
from tests.support.fakes import FakeBackend
from workers.contract import GPU_NODES_ENV
from workers.launch import pinned_nodes
from workers.spec import parse_spec


def _node(node_id: str, gpus: int, gib: float, free: float | None = None) -> dict:
    resources = {"CPU": 8.0, "GPU": float(gpus)}
    return {
        "node_id": node_id,
        "ip": "198.18.0.9",
        "is_head": False,
        "resources": resources,
        "available": {**resources, "GPU": float(gpus if free is None else free)},
        "labels": {GPU_MEMORY_LABEL: f"{gib:g}"},
    }


# Two 24 GiB GPUs (one node each) and a 12 GiB one.
NODES = [_node("big-1", 1, 24), _node("big-2", 1, 24), _node("small", 1, 12)]


def _demand(job_id: str, workers: int, gib: float, gpus_per_worker: int = 1) -> Demand:
    d = Demand.for_spec(job_id, min_workers=workers, cpus_per_worker=1, gpus_per_worker=1)
    return Demand(
        job_id,
        cpus=d.cpus,
        gpus=float(workers * gpus_per_worker),
        workers=workers,
        gpu_bytes=int(gib * GIB),
    )


def _decide(queued: list[Demand], nodes: list[dict] = NODES):
    rooms = GpuRooms.of(nodes)
    assert rooms is not None
    gpus = sum(n["resources"]["GPU"] for n in nodes)
    return decide_admissions(queued, free_cpus=24, free_gpus=gpus, rooms=rooms)


def test_rooms_exist_only_where_the_gpu_nodes_differ_and_are_known():
    assert GpuRooms.of([_node("a", 1, 24), _node("b", 2, 24)]) is None
    unknown = {**_node("c", 1, 12), "labels": {}}
    assert GpuRooms.of([_node("a", 1, 24), unknown]) is None
    rooms = GpuRooms.of(NODES)
    assert rooms.nodes_for(int(20 * GIB)) == ["big-1", "big-2"]
    assert rooms.nodes_for(int(4 * GIB)) == ["small", "big-1", "big-2"]


def test_a_job_waits_for_gpus_that_hold_its_rank_although_a_smaller_one_is_free():
    decision = _decide([_demand("a", 2, 20), _demand("b", 1, 20)])
    assert decision.admit == ("a",)
    (waiting,) = decision.waiting
    assert waiting.code == WaitCode.RESOURCES
    assert "GPUs of at least 20.0 GiB" in waiting.reason and "free for 0" in waiting.reason


def test_a_small_job_takes_the_small_gpu_and_leaves_the_large_ones():
    decision = _decide([_demand("small-job", 1, 8), _demand("large-job", 2, 20)])
    assert decision.admit == ("small-job", "large-job")


def test_too_few_gpus_that_hold_the_rank_can_never_start_and_block_nothing():
    decision = _decide([_demand("huge", 3, 20), _demand("fine", 1, 8)])
    assert decision.admit == ("fine",)
    (waiting,) = decision.waiting
    assert waiting.code == WaitCode.NEVER_FITS
    assert "take 2 of its minimum 3 workers" in waiting.reason


def test_busy_large_gpus_as_ray_reports_them_are_not_counted_free():
    nodes = [_node("big-1", 1, 24, free=0), _node("big-2", 1, 24), _node("small", 1, 12)]
    decision = _decide([_demand("a", 2, 20)], nodes)
    assert decision.admit == ()


def test_a_worker_of_two_gpus_needs_them_on_one_node():
    nodes = [_node("two", 2, 24), _node("one-a", 1, 24), _node("small", 1, 12)]
    assert _decide([_demand("pair", 1, 20, gpus_per_worker=2)], nodes).admit == ("pair",)
    nodes = [_node("one-a", 1, 24), _node("one-b", 1, 24), _node("small", 2, 12)]
    decision = _decide([_demand("pair", 1, 20, gpus_per_worker=2)], nodes)
    assert decision.waiting[0].code == WaitCode.NEVER_FITS


def test_the_driver_pins_its_workers_with_a_ray_label_selector():
    assert pinned_nodes("big-1,big-2") == {"ray.io/node-id": "in(big-1,big-2)"}
    assert pinned_nodes("") is None and pinned_nodes(None) is None


# -- the reconciler on a mixed cluster ------------------------------------------------


@pytest.fixture
def mixed_backend() -> FakeBackend:
    backend = FakeBackend(cpus=32, gpus=4)
    nodes = [*NODES, _node("small-2", 1, 12)]  # two 24 GiB GPUs, two 12 GiB ones
    backend.info = ClusterInfo(
        nodes=nodes, total={"CPU": 32.0, "GPU": 4.0}, available={}, dashboard_url=None
    )
    return backend


def _gpu_job(stores, tenant: str, name: str, workers: int, preset: str):
    spec = parse_spec(
        {
            "name": name,
            "model": {"preset": preset},
            "data": {"seq_len": 1024},
            "resources": {"workers": workers, "gpus_per_worker": 1},
            "parallelism": {"strategy": "fsdp"},
            "train": {"global_batch_size": 24, "micro_batch_size": 1, "precision": "bf16"},
        }
    )
    return stores.jobs.create_job(tenant_id=tenant, name=name, spec=spec, min_workers=workers)


def test_the_reconciler_admits_by_gpu_memory_and_pins_each_job_to_the_nodes_that_hold_it(
    stores, mixed_backend, tmp_path
):
    settings = Settings(env="development", data_dir=tmp_path, port=8123)
    tenant = stores.tokens.create_tenant("home-lab").id
    # llama-1b, FSDP over 2 GPUs: 21.5 GiB a rank (only the 24 GiB GPUs hold it). The
    # second waits with 2 GPUs free: they have 12 GiB.
    first = _gpu_job(stores, tenant, "first", 2, "llama-1b")
    second = _gpu_job(stores, tenant, "second", 2, "llama-1b")
    small = _gpu_job(stores, tenant, "small", 1, "gpt-small")
    Reconciler(stores, mixed_backend, settings.reconciler).tick()

    status = {j.id: stores.jobs.get_job(j.id).status for j in (first, second, small)}
    assert status == {
        first.id: JobStatus.PENDING,
        second.id: JobStatus.QUEUED,
        small.id: JobStatus.PENDING,
    }
    pins = {r.job_id: r.env.get(GPU_NODES_ENV) for r in mixed_backend.submitted}
    assert pins == {first.id: "big-1,big-2", small.id: "small,small-2,big-1,big-2"}
    (waiting,) = [e for e in stores.events.list_events(second.id) if e.kind == "waiting"]
    assert "waiting for GPUs of at least 21.5 GiB" in waiting.message


def test_a_reservation_holds_the_large_gpus_its_job_waits_for():
    """The longest-waiting job needs both 24 GiB GPUs and one is busy: it holds the free
    one. By the count of free GPUs (3, 2 reserved) a job whose rank needs 16 GiB could start
    beside it, on that very GPU, and the reserved job would wait on; it waits instead, and a
    job that fits the 12 GiB GPUs starts there."""
    nodes = [
        _node("big-1", 1, 24, free=0),
        _node("big-2", 1, 24),
        _node("small-1", 1, 12),
        _node("small-2", 1, 12),
    ]
    oldest = dataclasses.replace(_demand("oldest", 2, 20), waited_s=3600)
    queued = [oldest, _demand("mid", 1, 16), _demand("light", 1, 8)]
    decision = decide_admissions(
        queued, free_cpus=24, free_gpus=3, total_gpus=4, rooms=GpuRooms.of(nodes)
    )
    assert decision.reserved == "oldest"
    assert decision.admit == ("light",)
    waits = {w.job_id: w.code for w in decision.waiting}
    assert waits == {"oldest": WaitCode.RESOURCES, "mid": WaitCode.RESERVED}
    # Without the reservation (not yet old enough) the same job starts on the large GPU.
    queued[0] = _demand("oldest", 2, 20)
    decision = decide_admissions(
        queued, free_cpus=24, free_gpus=3, total_gpus=4, rooms=GpuRooms.of(nodes)
    )
    assert decision.reserved is None and set(decision.admit) == {"mid", "light"}
