"""Admission policy: FIFO, head-of-line blocking, GPUs, exact fit, fractional CPUs."""

from __future__ import annotations

import dataclasses

import pytest

from service.domain.scheduler import AdmissionDecision, Demand, decide_admissions


def _cpu(job_id: str, cpus: float) -> Demand:
    return Demand(job_id, cpus=cpus, gpus=0.0)


CASES = {
    "empty-queue": ([], 4, 0, (), False),
    "all-fit-in-order": ([_cpu("a", 1), _cpu("b", 1), _cpu("c", 2)], 4, 0, ("a", "b", "c"), False),
    "fifo-stops-at-first-misfit": (
        [_cpu("a", 2), _cpu("b", 2), _cpu("c", 2)],
        4,
        0,
        ("a", "b"),
        True,
    ),
    # A small job behind a big one waits, so the big one is not starved.
    "head-of-line-blocks-smaller": ([_cpu("big", 8), _cpu("small", 1)], 4, 0, (), True),
    "blocked-in-the-middle": ([_cpu("a", 2), _cpu("big", 8), _cpu("small", 1)], 4, 0, ("a",), True),
    "exact-fit": ([_cpu("a", 4)], 4, 0, ("a",), False),
    "exact-fit-after-others": ([_cpu("a", 1.5), _cpu("b", 2.5)], 4, 0, ("a", "b"), False),
    "just-over": ([_cpu("a", 4.5)], 4, 0, (), True),
    "fractional-cpus": ([_cpu("a", 0.5), _cpu("b", 0.5), _cpu("c", 0.5)], 1, 0, ("a", "b"), True),
    # 0.1 + 0.2 > 0.3 in binary; the policy must not refuse an exact fit for that.
    "float-rounding": ([_cpu("a", 0.1), _cpu("b", 0.2)], 0.3, 0, ("a", "b"), False),
    "gpu-fits": ([Demand("a", cpus=2, gpus=2)], 4, 2, ("a",), False),
    "gpu-short-cpu-plenty": ([Demand("a", cpus=1, gpus=4)], 64, 2, (), True),
    "gpu-blocks-cpu-job-behind": ([Demand("a", cpus=1, gpus=4), _cpu("b", 1)], 64, 2, (), True),
    "gpus-consumed-in-order": (
        [Demand("a", cpus=1, gpus=1), Demand("b", cpus=1, gpus=1), Demand("c", cpus=1, gpus=1)],
        8,
        2,
        ("a", "b"),
        True,
    ),
    "no-free-room": ([_cpu("a", 1)], 0, 0, (), True),
    "negative-free-room": ([_cpu("a", 1)], -2, 0, (), True),
}


@pytest.mark.parametrize(
    ("queued", "cpus", "gpus", "admit", "waits"), list(CASES.values()), ids=list(CASES)
)
def test_decide_admissions(queued, cpus, gpus, admit, waits):
    decision = decide_admissions(queued, free_cpus=cpus, free_gpus=gpus)
    assert decision.admit == admit
    assert (decision.waiting_reason is not None) is waits


def test_waiting_reason_names_the_blocked_demand_and_the_free_room():
    decision = decide_admissions(
        [_cpu("a", 3), Demand("b", cpus=2, gpus=1)], free_cpus=4, free_gpus=0
    )
    assert decision.admit == ("a",)
    assert "2 CPU / 1 GPU" in decision.waiting_reason
    assert "free 1 CPU / 0 GPU" in decision.waiting_reason


def test_decision_is_a_frozen_value():
    decision = decide_admissions([_cpu("a", 1)], free_cpus=1, free_gpus=0)
    assert decision == AdmissionDecision(("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.admit = ()  # type: ignore[misc]


def test_input_queue_is_not_modified():
    queued = [_cpu("a", 1), _cpu("b", 8)]
    decide_admissions(queued, free_cpus=2, free_gpus=0)
    assert queued == [_cpu("a", 1), _cpu("b", 8)]


@pytest.mark.parametrize(
    ("min_workers", "cpus", "gpus", "expected"),
    [
        (2, 1.0, 0, Demand("j", cpus=2.0, gpus=0.0)),
        (3, 0.5, 0, Demand("j", cpus=1.5, gpus=0.0)),
        (4, 2.0, 8, Demand("j", cpus=8.0, gpus=32.0)),
        (1, 0.25, 1, Demand("j", cpus=0.25, gpus=1.0)),
    ],
)
def test_demand_for_spec_is_min_workers_times_per_worker(min_workers, cpus, gpus, expected):
    demand = Demand.for_spec(
        "j", min_workers=min_workers, cpus_per_worker=cpus, gpus_per_worker=gpus
    )
    assert demand == expected
    assert isinstance(demand.gpus, float)
