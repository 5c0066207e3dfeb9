"""GET /v1/cluster's queue (scheduling order, the scheduler's reasons, tenant scoping) and
GET /v1/jobs/{id}/memory's planned bytes (the planner's own numbers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from service.backends.base import ClusterInfo
from service.domain.queue_view import ADMITTED, OTHER_JOB, admission
from service.domain.scheduler import decide_admissions, policy_of, queue_demand
from service.planner import plan_job
from service.status import JobStatus
from tests.support.api import api_client, submit, tenant_token
from tests.support.fakes import ADMIN_H, FakeBackend
from tests.support.specs import spec
from workers.spec import JobSpec

# One worker by default; a global batch of 24 divides by every worker count used here.
TINY = spec(
    model={"preset": "gpt-tiny"},
    resources={"workers": 1},
    train={"steps": 5, "micro_batch_size": 1, "global_batch_size": 24},
)


def _run(client: TestClient, job_id: str) -> None:
    jobs = client.app.state.runtime.stores.jobs
    assert jobs.update_job(job_id, status=JobStatus.RUNNING) is not None


def _age(client: TestClient, job_id: str, seconds: float) -> None:
    """Make a job look queued ``seconds`` ago (the reservation rule goes by age)."""
    from sqlalchemy import update

    from service.store.tables import JOBS

    jobs = client.app.state.runtime.stores.jobs
    with jobs._db.begin() as conn:
        conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id)
            .values(created_at=datetime.now(UTC) - timedelta(seconds=seconds))
        )


def _queue(client: TestClient, headers) -> list[dict]:
    r = client.get("/v1/cluster", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["queue"]


def test_queue_reasons_are_the_schedulers_own(tmp_path):
    with api_client(tmp_path, FakeBackend(cpus=4.0)) as client:
        a, b = tenant_token(client, "team-a"), tenant_token(client, "team-b")
        running = submit(client, a, base=TINY, name="a-running", resources={"workers": 3})
        _run(client, running["id"])  # 3 of 4 CPUs held
        wide = submit(client, a, base=TINY, name="a-wide", resources={"workers": 2})["id"]
        huge = submit(client, b, base=TINY, name="b-huge", resources={"workers": 8})["id"]
        small = submit(client, b, base=TINY, name="b-small")["id"]
        queue = _queue(client, ADMIN_H)
        by_id = {e["job_id"]: e for e in queue}
        assert [e["position"] for e in queue] == [1, 2, 3]
        # team-b holds nothing, so its turn comes first and b-small takes the free CPU;
        # those that can never start come last.
        assert [e["job_id"] for e in queue] == [small, wide, huge]
        assert by_id[small]["reason"] == ADMITTED
        assert by_id[wide]["reason"] == (
            "waiting for resources: needs 2 CPU / 0 GPU, free 0 CPU / 0 GPU"
        )
        assert by_id[huge]["reason"].startswith("can never fit this cluster: needs 8 CPU")
        assert {by_id[wide]["name"], by_id[small]["tenant"]} == {"a-wide", "team-b"}
        # The same reasons as the scheduler's decision on the same stored jobs.
        jobs, quotas = client.app.state.runtime.stores.jobs, client.app.state.runtime.cluster.quotas
        queued, now = jobs.list_queue({JobStatus.QUEUED}), datetime.now(UTC)
        active = jobs.list_queue({JobStatus.RUNNING})
        direct = decide_admissions(
            [queue_demand(e, now) for e in queued],
            free_cpus=1.0,
            free_gpus=0.0,
            total_cpus=4.0,
            total_gpus=0.0,
            held=[queue_demand(e, now) for e in active],
            policy=policy_of(quotas),
        )
        assert {w.job_id: w.reason for w in direct.waiting} == {
            e["job_id"]: e["reason"] for e in queue if e["reason"] != ADMITTED
        }
        assert direct.admit == (small,)
        cluster = ClusterInfo(nodes=[], total={"CPU": 4.0}, available={}, dashboard_url=None)
        assert admission(queued, active, cluster, quotas, now) == direct


def test_queue_names_the_tenant_quota(tmp_path):
    with api_client(tmp_path, FakeBackend(cpus=8.0), max_running_workers_per_tenant=2) as client:
        a = tenant_token(client, "team-a")
        _run(client, submit(client, a, base=TINY, name="a-running", resources={"workers": 2})["id"])
        waiting = submit(client, a, base=TINY, name="a-next")["id"]
        [entry] = _queue(client, a)
        assert entry["job_id"] == waiting and entry["position"] == 1
        assert entry["reason"].startswith("tenant 'team-a' runs 2 of its 2 workers")


def test_other_tenants_jobs_are_anonymous_but_keep_their_place(tmp_path):
    # b-old waited longest: it holds a reservation, so it is taken up first.
    with api_client(tmp_path, FakeBackend(cpus=2.0), scheduler_reserve_after_s=60.0) as client:
        a, b = tenant_token(client, "team-a"), tenant_token(client, "team-b")
        _run(client, submit(client, a, base=TINY, name="a-running")["id"])  # 1 of 2 CPUs free
        old = submit(client, b, base=TINY, name="b-old", resources={"workers": 2})["id"]
        _age(client, old, 600)
        mine = submit(client, a, base=TINY, name="a-mine")["id"]
        admin = _queue(client, ADMIN_H)
        assert [(e["job_id"], e["position"]) for e in admin] == [(old, 1), (mine, 2)]
        assert old in admin[1]["reason"]  # waiting behind the reservation, by id
        seen_by_a = _queue(client, a)
        assert seen_by_a[0] == {
            "job_id": None,
            "name": None,
            "tenant": None,
            "position": 1,
            "reason": None,
        }
        assert seen_by_a[1]["job_id"] == mine and seen_by_a[1]["position"] == 2
        assert old not in seen_by_a[1]["reason"]
        assert seen_by_a[1]["reason"].startswith(f"waiting behind {OTHER_JOB}, queued longest")
        assert "team-b" not in str(seen_by_a)
        seen_by_b = _queue(client, b)
        assert [e["job_id"] for e in seen_by_b] == [old, None]


def test_empty_queue(tmp_path):
    with api_client(tmp_path, FakeBackend(cpus=4)) as client:
        assert _queue(client, ADMIN_H) == []


@pytest.mark.parametrize(
    "spec, world",
    [
        ({"resources": {"workers": 2}}, None),
        ({"resources": {"workers": {"min": 1, "max": 2}}}, 2),
        (
            {
                "resources": {"workers": 2},
                "parallelism": {"strategy": "fsdp"},
                "model": {"preset": "gpt-tiny", "activation_checkpointing": "full"},
            },
            None,
        ),
    ],
)
def test_planned_memory_is_the_planners_own(tmp_path, spec, world):
    with api_client(tmp_path, FakeBackend(cpus=4)) as client:
        job_id = submit(client, ADMIN_H, base=TINY, name="planned", **spec)["id"]
        jobs = client.app.state.runtime.stores.jobs
        if world is not None:  # a step reported at this world size
            assert jobs.update_job(job_id, world_size=world) is not None
        r = client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H)
        assert r.status_code == 200, r.text
        planned = r.json()["planned"]
    stored = JobSpec.model_validate(client.app.state.runtime.stores.jobs.get_job(job_id).spec)
    at = stored.model_copy(
        update={"resources": stored.resources.model_copy(update={"workers": world})}
    )
    expected = plan_job(at if world else stored).per_rank
    assert planned == {
        "params_bytes": expected.params_bytes,
        "grads_bytes": expected.grads_bytes,
        "optimizer_bytes": expected.optimizer_bytes,
        "activations_bytes": expected.activations_bytes,
        "reference_bytes": 0,  # the frozen parts of other objectives
        "vae_bytes": 0,
        "text_encoder_bytes": 0,
        "total_bytes": expected.total_bytes,
    }
    assert planned["params_bytes"] > 0 and planned["total_bytes"] >= sum(
        planned[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")
    )


def test_planned_memory_changes_with_the_world_size(tmp_path):
    with api_client(tmp_path, FakeBackend(cpus=4)) as client:
        spec = {"resources": {"workers": {"min": 1, "max": 4}}, "parallelism": {"strategy": "fsdp"}}
        job_id = submit(client, ADMIN_H, base=TINY, name="elastic", **spec)["id"]
        at_one = client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H).json()["planned"]
        client.app.state.runtime.stores.jobs.update_job(job_id, world_size=4)
        at_four = client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H).json()["planned"]
    # FSDP shards the state over the ranks: four ranks hold a quarter each.
    assert at_four["params_bytes"] < at_one["params_bytes"]


def test_an_unsizable_model_is_asked_again_only_after_the_retry_period(monkeypatch):
    import service.domain.planned_memory as pm

    calls: list[int] = []
    answers = iter([None, {"total_bytes": 1}])
    monkeypatch.setattr(
        pm, "planned_memory", lambda spec, world, tenant="": calls.append(world) or next(answers)
    )
    spec = JobSpec.model_validate({"name": "x"})
    cache = pm.PlannedMemory(retry_s=3600)
    assert cache.of("j-1", spec, 2) is None and cache.of("j-1", spec, 2) is None
    assert calls == [2]  # the store that did not answer is not asked on every poll
    cache.retry_s = 0.0
    assert cache.of("j-1", spec, 2) == {"total_bytes": 1}
    assert cache.of("j-1", spec, 2) == {"total_bytes": 1} and calls == [2, 2]


@pytest.mark.parametrize("lora", [False, True])
def test_a_dpo_jobs_plan_names_its_reference_model(lora):
    """The frozen reference copy is the plan's own figure (none with LoRA: the base is it)."""
    from service.domain.planned_memory import planned_memory

    model = {"preset": "gpt-tiny", "tokenizer": "/t"} | ({"lora": {"rank": 4}} if lora else {})
    spec = JobSpec.model_validate(
        {
            "name": "dpo",
            "objective": "dpo",
            "model": model,
            "data": {"source": "jsonl", "path": "/d/p.jsonl", "shape": "preference"},
            "resources": {"workers": 2},
            "parallelism": {"strategy": "fsdp"},
            "train": {"global_batch_size": 8, "micro_batch_size": 2},
        }
    )
    planned = planned_memory(spec, 2)
    reference = plan_job(spec).breakdown.buffers.get("dpo_reference_model")
    assert planned.get("reference_bytes") == reference
    assert (reference is None) == lora
