"""Admission policy: fit, no head-of-line blocking, never-fits, reservation, fairness, quotas."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from service.domain.scheduler import (
    AdmissionDecision,
    Demand,
    Policy,
    TenantLimits,
    WaitCode,
    decide_admissions,
    max_queued_jobs,
    policy_of,
    queue_demand,
)
from service.settings import Settings, TenantQuota
from service.status import JobStatus
from service.store.models import QueueEntry


def _cpu(job_id: str, cpus: float, tenant: str = "a", waited_s: float = 0.0) -> Demand:
    return Demand(job_id, cpus=cpus, gpus=0.0, tenant=tenant, workers=int(cpus), waited_s=waited_s)


def _gpu(job_id: str, gpus: float, tenant: str = "a", waited_s: float = 0.0) -> Demand:
    return Demand(job_id, cpus=1, gpus=gpus, tenant=tenant, workers=1, waited_s=waited_s)


# (queued, free cpus, free gpus, admitted in order, waiting job ids); no reservation here.
CASES = {
    "empty-queue": ([], 4, 0, (), ()),
    "all-fit-in-order": ([_cpu("a", 1), _cpu("b", 1), _cpu("c", 2)], 4, 0, ("a", "b", "c"), ()),
    "stops-when-full": ([_cpu("a", 2), _cpu("b", 2), _cpu("c", 2)], 4, 0, ("a", "b"), ("c",)),
    # A job that does not fit now is skipped: the smaller one behind it starts.
    "no-head-of-line-blocking": ([_cpu("big", 4), _cpu("small", 1)], 2, 0, ("small",), ("big",)),
    "skipped-in-the-middle": (
        [_cpu("a", 2), _cpu("big", 4), _cpu("small", 1)],
        3,
        0,
        ("a", "small"),
        ("big",),
    ),
    "exact-fit": ([_cpu("a", 4)], 4, 0, ("a",), ()),
    "exact-fit-after-others": ([_cpu("a", 1.5), _cpu("b", 2.5)], 4, 0, ("a", "b"), ()),
    "just-over": ([_cpu("a", 4.5)], 4, 0, (), ("a",)),
    "fractional-cpus": (
        [_cpu("a", 0.5), _cpu("b", 0.5), _cpu("c", 0.5)],
        1,
        0,
        ("a", "b"),
        ("c",),
    ),
    # 0.1 + 0.2 > 0.3 in binary; the policy must not refuse an exact fit for that.
    "float-rounding": ([_cpu("a", 0.1), _cpu("b", 0.2)], 0.3, 0, ("a", "b"), ()),
    "gpu-fits": ([Demand("a", cpus=2, gpus=2)], 4, 2, ("a",), ()),
    "gpu-short-cpu-plenty": ([Demand("a", cpus=1, gpus=4)], 64, 2, (), ("a",)),
    "gpu-job-does-not-block-cpu-job": (
        [Demand("a", cpus=1, gpus=4), _cpu("b", 1)],
        64,
        2,
        ("b",),
        ("a",),
    ),
    "gpus-consumed-in-order": (
        [_gpu("a", 1), _gpu("b", 1), _gpu("c", 1)],
        8,
        2,
        ("a", "b"),
        ("c",),
    ),
    "no-free-room": ([_cpu("a", 1)], 0, 0, (), ("a",)),
    "negative-free-room": ([_cpu("a", 1)], -2, 0, (), ("a",)),
}


@pytest.mark.parametrize(
    ("queued", "cpus", "gpus", "admit", "waits"), list(CASES.values()), ids=list(CASES)
)
def test_decide_admissions(queued, cpus, gpus, admit, waits):
    decision = decide_admissions(
        queued, free_cpus=cpus, free_gpus=gpus, policy=Policy(reserve_after_s=None)
    )
    assert decision.admit == admit
    assert tuple(w.job_id for w in decision.waiting) == waits
    assert decision.reserved is None


def test_the_issue_case_never_fitting_head_does_not_block_another_tenant():
    """Tenant A's 64-worker job on a 4-CPU idle cluster; tenant B's 1-worker job starts."""
    queued = [_cpu("a-huge", 64, tenant="A", waited_s=9999), _cpu("b-one", 1, tenant="B")]
    decision = decide_admissions(queued, free_cpus=4, free_gpus=0, total_cpus=4, total_gpus=0)
    assert decision.admit == ("b-one",)
    (w,) = decision.waiting
    assert (w.job_id, w.code) == ("a-huge", WaitCode.NEVER_FITS)
    assert "can never fit this cluster" in w.reason and "4 CPU / 0 GPU in total" in w.reason
    assert decision.reserved is None  # no reservation for what can never start


def test_never_fits_by_gpus_on_a_cluster_without_gpus():
    decision = decide_admissions(
        [_gpu("g", 1), _cpu("c", 1)], free_cpus=2, free_gpus=0, total_cpus=2, total_gpus=0
    )
    assert decision.admit == ("c",)
    assert decision.waiting[0].code is WaitCode.NEVER_FITS


def test_waiting_reason_names_the_demand_and_the_free_room():
    decision = decide_admissions(
        [_cpu("a", 3), Demand("b", cpus=2, gpus=1)],
        free_cpus=4,
        free_gpus=0,
        total_cpus=4,
        total_gpus=2,
    )
    assert decision.admit == ("a",)
    assert decision.waiting[0].code is WaitCode.RESOURCES
    assert "2 CPU / 1 GPU" in decision.waiting_reason
    assert "free 1 CPU / 0 GPU" in decision.waiting_reason


# -- the reservation: the longest waiter stops being overtaken --------------------------


def test_a_job_that_waited_long_enough_reserves_its_room():
    held = [_cpu("running", 3, tenant="x")]
    queued = [_cpu("big", 4, waited_s=301), _cpu("small", 1, waited_s=10)]
    policy = Policy(reserve_after_s=300)
    decision = decide_admissions(queued, free_cpus=1, free_gpus=0, held=held, policy=policy)
    assert decision.admit == () and decision.reserved == "big"
    reasons = {w.job_id: w for w in decision.waiting}
    assert "holds a reservation" in reasons["big"].reason
    assert reasons["small"].code is WaitCode.RESERVED and "big" in reasons["small"].reason

    # Before the threshold the small job goes around it.
    young = [dataclasses.replace(queued[0], waited_s=299), queued[1]]
    decision = decide_admissions(young, free_cpus=1, free_gpus=0, held=held, policy=policy)
    assert decision.admit == ("small",) and decision.reserved is None


def test_the_reservation_is_per_resource_cpu_jobs_use_the_cpus_beside_a_gpu_reservation():
    queued = [_gpu("gpu-job", 4, waited_s=1000), _cpu("cpu-job", 2, tenant="b")]
    decision = decide_admissions(
        queued, free_cpus=8, free_gpus=2, total_cpus=8, total_gpus=4, policy=Policy()
    )
    assert decision.reserved == "gpu-job" and decision.admit == ("cpu-job",)


def test_the_reserved_job_starts_first_when_it_fits_even_against_fairness():
    held = [_cpu("a-running", 2, tenant="a")]
    queued = [_cpu("a-old", 2, tenant="a", waited_s=400), _cpu("b-new", 2, tenant="b")]
    decision = decide_admissions(queued, free_cpus=2, free_gpus=0, held=held, policy=Policy())
    assert decision.admit == ("a-old",)
    assert decision.waiting[0].job_id == "b-new"


def test_the_longest_waiter_among_many_holds_the_one_reservation():
    queued = [_cpu("x", 8, waited_s=500), _cpu("y", 8, tenant="b", waited_s=900)]
    decision = decide_admissions(queued, free_cpus=4, free_gpus=0, total_cpus=8, total_gpus=0)
    assert decision.reserved == "y"
    assert {w.job_id: w.code for w in decision.waiting} == {
        "x": WaitCode.RESOURCES,
        "y": WaitCode.RESOURCES,
    }


# -- fairness between tenants -----------------------------------------------------------


def test_tenants_take_turns_instead_of_first_come_first_served():
    queued = [_cpu(f"a{i}", 1, tenant="a") for i in range(4)] + [
        _cpu(f"b{i}", 1, tenant="b") for i in range(4)
    ]
    decision = decide_admissions(queued, free_cpus=4, free_gpus=0, policy=Policy())
    assert decision.admit == ("a0", "b0", "a1", "b1")


def test_a_tenant_already_holding_the_cluster_goes_last():
    held = [_cpu("a-running", 4, tenant="a")]
    queued = [_cpu("a1", 1, tenant="a"), _cpu("b1", 1, tenant="b"), _cpu("b2", 1, tenant="b")]
    decision = decide_admissions(queued, free_cpus=2, free_gpus=0, held=held, policy=Policy())
    assert decision.admit == ("b1", "b2")


def test_weights_give_a_tenant_a_bigger_share():
    queued = [_cpu(f"a{i}", 1, tenant="a") for i in range(6)] + [
        _cpu(f"b{i}", 1, tenant="b") for i in range(6)
    ]
    policy = Policy(limits={"a": TenantLimits(weight=2.0)})
    decision = decide_admissions(queued, free_cpus=6, free_gpus=0, policy=policy)
    assert sum(j.startswith("a") for j in decision.admit) == 4
    assert sum(j.startswith("b") for j in decision.admit) == 2


# -- per-tenant running quotas ----------------------------------------------------------


def test_running_worker_quota_caps_a_tenant_and_lets_others_use_the_room():
    held = [_cpu("a-running", 2, tenant="a")]
    queued = [_cpu("a1", 1, tenant="a"), _cpu("a2", 1, tenant="a"), _cpu("b1", 1, tenant="b")]
    policy = Policy(default=TenantLimits(max_workers=3))
    decision = decide_admissions(queued, free_cpus=8, free_gpus=0, held=held, policy=policy)
    assert decision.admit == ("b1", "a1")  # b holds nothing yet: it goes first
    (w,) = decision.waiting
    assert (w.job_id, w.code) == ("a2", WaitCode.QUOTA)
    assert "runs 3 of its 3 workers" in w.reason
    assert "ETRAIN_MAX_RUNNING_WORKERS_PER_TENANT" in w.reason


def test_gpu_quota_and_a_job_over_the_quota_never_blocks():
    policy = Policy(limits={"a": TenantLimits(max_gpus=2)})
    queued = [_gpu("a-too-big", 4, tenant="a", waited_s=10_000), _gpu("a-fits", 2, tenant="a")]
    decision = decide_admissions(queued, free_cpus=8, free_gpus=8, policy=policy)
    assert decision.admit == ("a-fits",)
    assert decision.reserved is None
    assert decision.waiting[0].code is WaitCode.OVER_QUOTA
    assert "may run at most 2" in decision.waiting[0].reason


def test_a_tenant_at_its_quota_does_not_get_the_reservation():
    held = [_cpu("a-running", 2, tenant="a")]
    queued = [_cpu("a-old", 2, tenant="a", waited_s=900), _cpu("b-new", 1, tenant="b")]
    policy = Policy(default=TenantLimits(max_workers=2))
    decision = decide_admissions(queued, free_cpus=2, free_gpus=0, held=held, policy=policy)
    assert decision.reserved is None and decision.admit == ("b-new",)
    assert decision.waiting[0].code is WaitCode.QUOTA


# -- properties of the function ---------------------------------------------------------


def test_decision_is_a_frozen_value_and_deterministic():
    queued = [_cpu(f"j{i}", 1 + i % 3, tenant="abc"[i % 3], waited_s=i * 50) for i in range(30)]
    first = decide_admissions(queued, free_cpus=10, free_gpus=0, total_cpus=12, total_gpus=0)
    again = decide_admissions(list(queued), free_cpus=10, free_gpus=0, total_cpus=12, total_gpus=0)
    assert first == again
    assert decide_admissions([_cpu("a", 1)], free_cpus=1, free_gpus=0) == AdmissionDecision(("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.admit = ()  # type: ignore[misc]


def test_input_queue_is_not_modified():
    queued = [_cpu("a", 1, waited_s=999), _cpu("b", 8)]
    decide_admissions(queued, free_cpus=2, free_gpus=0, total_cpus=8, total_gpus=0)
    assert queued == [_cpu("a", 1, waited_s=999), _cpu("b", 8)]


@pytest.mark.parametrize(
    ("min_workers", "cpus", "gpus", "expected"),
    [
        (2, 1.0, 0, Demand("j", cpus=2.0, gpus=0.0, workers=2)),
        (3, 0.5, 0, Demand("j", cpus=1.5, gpus=0.0, workers=3)),
        (4, 2.0, 8, Demand("j", cpus=8.0, gpus=32.0, workers=4)),
        (1, 0.25, 1, Demand("j", cpus=0.25, gpus=1.0, workers=1)),
    ],
)
def test_demand_for_spec_is_min_workers_times_per_worker(min_workers, cpus, gpus, expected):
    demand = Demand.for_spec(
        "j", min_workers=min_workers, cpus_per_worker=cpus, gpus_per_worker=gpus
    )
    assert demand == expected
    assert isinstance(demand.gpus, float)


def test_queue_demand_counts_the_wait_from_creation():
    created = datetime(2026, 1, 1, tzinfo=UTC)
    entry = QueueEntry("j", "t-1", "team-a", JobStatus.QUEUED, 2, 0.5, 1, created)
    demand = queue_demand(entry, created + timedelta(seconds=90))
    assert demand == Demand("j", cpus=1.0, gpus=2.0, tenant="team-a", workers=2, waited_s=90)


def test_policy_and_queued_quota_from_settings(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        max_running_workers_per_tenant=8,
        max_queued_jobs_per_tenant=50,
        tenant_quotas={"big": TenantQuota(max_queued_jobs=500, max_running_gpus=16, weight=3)},
        scheduler_reserve_after_s=60,
    )
    policy = policy_of(settings.quotas)
    assert policy.of("anyone") == TenantLimits(max_workers=8)
    assert policy.of("big") == TenantLimits(max_workers=8, max_gpus=16, weight=3)
    assert policy.reserve_after_s == 60
    assert max_queued_jobs(settings.quotas, "anyone") == 50
    assert max_queued_jobs(settings.quotas, "big") == 500


def test_the_reconciler_records_each_reason_once_and_retries_a_failed_write(stores, tmp_path):
    from service.domain.reconciler import Reconciler
    from tests.support.fakes import FakeBackend
    from workers.spec import parse_spec

    tenant = stores.tokens.create_tenant("team-a").id
    train = {"steps": 5, "global_batch_size": 32, "micro_batch_size": 4}
    spec = parse_spec({"name": "big", "resources": {"workers": 8}, "train": train})
    job = stores.jobs.create_job(tenant_id=tenant, name="big", spec=spec, min_workers=8)
    reconciler = Reconciler(stores, FakeBackend(cpus=4), Settings(data_dir=tmp_path).reconciler)
    real_add = stores.events.add_events
    calls = []

    def failing_once(events):
        calls.append(events)
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        real_add(events)

    object.__setattr__(stores.events, "add_events", failing_once)
    with pytest.raises(RuntimeError):
        reconciler.tick()
    for _ in range(3):
        reconciler.tick()
    assert [len(c) for c in calls] == [1, 1, 0, 0]  # retried once, then nothing new
    (event,) = [e for e in stores.events.list_events(job.id) if e.kind == "waiting"]
    assert event.data == {"reason": "never_fits"} and "can never fit" in event.message
