"""The job state machine: every (from, to) pair against an explicit table."""

from __future__ import annotations

import itertools

import pytest

from service.domain.states import TERMINAL, JobStatus, transition
from service.errors import InvalidTransition

Q, P, R = JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING
S, F, C = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED

# Written out by hand (not derived from the module) so a change to the state
# machine has to change this table too. Staying put is always allowed.
ALLOWED = {
    Q: {Q, P, C, F},        # admitted, cancelled, or refused outright
    P: {P, R, Q, S, F, C},  # -> QUEUED: the backend had no room after all
    R: {R, P, S, F, C},     # -> PENDING: resubmitted after a cluster-level loss
    S: {S},
    F: {F},
    C: {C},
}

PAIRS = list(itertools.product(JobStatus, repeat=2))


def test_table_covers_every_status():
    assert set(ALLOWED) == set(JobStatus)
    assert len(PAIRS) == 36


@pytest.mark.parametrize(("current", "target"), PAIRS,
                         ids=[f"{a.value}->{b.value}" for a, b in PAIRS])
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
        "QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"]
    assert JobStatus("RUNNING") is R
