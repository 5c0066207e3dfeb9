"""The job state machine: every (from, to) pair against an explicit table, and
``change_status``, the one way the service changes a stored job's status."""

from __future__ import annotations

import itertools

import pytest

from service.domain.states import change_status, transition
from service.errors import InvalidTransition
from service.status import TERMINAL, JobStatus
from workers.spec import JobSpec

Q, P, R = JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING
S, F, C = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED

# Written out by hand (not derived from the module) so a change to the state
# machine has to change this table too. Staying put is always allowed.
ALLOWED = {
    Q: {Q, P, C, F},  # admitted, cancelled, or refused outright
    P: {P, R, Q, S, F, C},  # -> QUEUED: the backend had no room after all
    R: {R, P, S, F, C},  # -> PENDING: resubmitted after a cluster-level loss
    S: {S},
    F: {F},
    C: {C},
}

PAIRS = list(itertools.product(JobStatus, repeat=2))


def test_table_covers_every_status():
    assert set(ALLOWED) == set(JobStatus)
    assert len(PAIRS) == 36


@pytest.mark.parametrize(
    ("current", "target"), PAIRS, ids=[f"{a.value}->{b.value}" for a, b in PAIRS]
)
def test_transition(current, target):
    if target in ALLOWED[current]:
        assert transition(current, target) is target
    else:
        with pytest.raises(InvalidTransition) as info:
            transition(current, target)
        # The message names both ends so a 409 explains itself.
        assert current.value in str(info.value) and target.value in str(info.value)


@pytest.mark.parametrize("status", list(JobStatus), ids=[s.value for s in JobStatus])
def test_terminal(status):
    assert status.terminal is (status in {S, F, C})
    assert (status in TERMINAL) is status.terminal


def test_invalid_transition_is_a_409():
    assert InvalidTransition.status_code == 409


def test_status_values_are_the_public_names():
    assert [s.value for s in JobStatus] == [
        "QUEUED",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
    ]
    assert JobStatus("RUNNING") is R


@pytest.fixture
def job(stores):
    """A QUEUED job in a real store (SQLite and PostgreSQL)."""
    tenant = stores.tokens.create_tenant("acme").id
    return stores.jobs.create_job(
        tenant_id=tenant, name="tiny", min_workers=1, spec=JobSpec.model_validate({"name": "tiny"})
    )


def test_invalid_transition_changes_nothing(stores, job):
    with pytest.raises(InvalidTransition):
        change_status(stores.jobs, job, S, error="x", event=("done", "m", None))
    with pytest.raises(InvalidTransition):
        change_status(stores.jobs, job, R)
    assert stores.jobs.get_job(job.id) == job
    assert [e.kind for e in stores.events.list_events(job.id)] == ["submitted"]


def test_change_status_writes_the_fields_and_the_event_together(stores, job):
    moved = change_status(
        stores.jobs,
        job,
        P,
        submission_id="s-1",
        event=("admitted", "admitted by the scheduler", {"n": 1}),
    )
    assert moved.status is P and moved.submission_id == "s-1"
    assert [(e.kind, e.data) for e in stores.events.list_events(job.id)] == [
        ("submitted", None),
        ("admitted", {"n": 1}),
    ]


def test_change_status_loses_to_a_change_made_since_the_job_was_read(stores, job):
    assert change_status(stores.jobs, job, C) is not None
    # ``job`` is the stale QUEUED read: the compare-and-set on QUEUED loses, nothing is written.
    assert change_status(stores.jobs, job, P, event=("admitted", "late", None)) is None
    assert stores.jobs.get_job(job.id).status is C
    assert [e.kind for e in stores.events.list_events(job.id)] == ["submitted"]
