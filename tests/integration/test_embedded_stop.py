"""What is left of the embedded head's process group is stopped with it (real processes)."""

from __future__ import annotations

import subprocess
import time

import psutil

from service.backends.embedded import group_members, stop_group


def _group(script: str) -> subprocess.Popen:
    """``bash -c script`` as the leader of a new session (as the embedded head is started)."""
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def _wait_for_members(pgid: int, n: int) -> list[int]:
    deadline = time.monotonic() + 10
    while len(members := group_members(pgid)) < n:
        assert time.monotonic() < deadline, "the test's processes did not start"
        time.sleep(0.05)
    return members


def _gone(pid: int) -> bool:
    """Checked apart from the group: the process no longer runs (or is a zombie)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_leader_gone_its_orphans_are_stopped():
    """`ray start` exited, a process it started (the dashboard's module) did not."""
    leader = _group("sleep 300 & sleep 300 & exit 0")
    leader.wait(10)
    orphans = _wait_for_members(leader.pid, 2)
    assert not any(_gone(pid) for pid in orphans)
    stop_group(leader.pid, grace=5)
    assert group_members(leader.pid) == []
    assert all(_gone(pid) for pid in orphans)


def test_what_ignores_sigterm_is_killed_after_the_grace():
    # The subshell ignores SIGTERM (as a process stuck in shutdown would), the leader exits.
    leader = _group("(trap '' TERM; while :; do sleep 0.1; done) & exit 0")
    leader.wait(10)
    stubborn = _wait_for_members(leader.pid, 1)
    start = time.monotonic()
    stop_group(leader.pid, grace=1)
    took = time.monotonic() - start
    assert all(_gone(pid) for pid in stubborn)
    assert took >= 1, f"SIGKILL came before the grace ({took:.2f} s)"


def test_a_dead_heads_leftovers_are_killed_without_the_grace():
    """What a head whose GCS died leaves behind has nothing to finish: no SIGTERM grace."""
    leader = _group("(trap '' TERM; while :; do sleep 0.1; done) & exit 0")
    leader.wait(10)
    stubborn = _wait_for_members(leader.pid, 1)
    start = time.monotonic()
    stop_group(leader.pid, grace=5, kill=True)
    assert time.monotonic() - start < 2
    assert all(_gone(pid) for pid in stubborn)


def test_an_empty_group_returns_at_once():
    leader = _group("exit 0")
    leader.wait(10)
    start = time.monotonic()
    stop_group(leader.pid, grace=5)
    assert time.monotonic() - start < 2
    assert group_members(leader.pid) == []


def test_a_zombie_does_not_count():
    """Only its parent can remove a zombie: stop_group does not wait on one."""
    leader = _group("exit 0")  # not waited for: a zombie child of this process
    deadline = time.monotonic() + 10
    while psutil.Process(leader.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert group_members(leader.pid) == []
    leader.wait(10)
