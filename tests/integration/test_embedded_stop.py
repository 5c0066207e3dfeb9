"""What is left of the embedded head's process group is stopped with it (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from service.backends.embedded import group_alive, stop_group


def _group(script: str) -> subprocess.Popen:
    """``bash -c script`` as the leader of a new session (as the embedded head is started)."""
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def _members(pgid: int) -> list[int]:
    """The live (not zombie) processes of group ``pgid``."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _wait_for_members(pgid: int, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(_members(pgid)) < n:
        assert time.monotonic() < deadline, "the test's processes did not start"
        time.sleep(0.05)


def test_the_leader_gone_its_orphans_are_stopped():
    """`ray start` exited, a process it started (the dashboard's module) did not."""
    leader = _group("sleep 300 & sleep 300 & exit 0")
    leader.wait(10)
    _wait_for_members(leader.pid, 2)
    assert group_alive(leader.pid)
    stop_group(leader.pid, grace=5)
    assert not group_alive(leader.pid)
    assert _members(leader.pid) == []


def test_what_ignores_sigterm_is_killed_after_the_grace():
    # The subshell ignores SIGTERM (as a process stuck in shutdown would), the leader exits.
    leader = _group("(trap '' TERM; while :; do sleep 0.1; done) & exit 0")
    leader.wait(10)
    _wait_for_members(leader.pid, 1)
    start = time.monotonic()
    stop_group(leader.pid, grace=1)
    took = time.monotonic() - start
    assert not group_alive(leader.pid)
    assert took >= 1, f"SIGKILL came before the grace ({took:.2f} s)"


def test_an_empty_group_returns_at_once():
    leader = _group("exit 0")
    leader.wait(10)
    start = time.monotonic()
    stop_group(leader.pid, grace=5)
    assert time.monotonic() - start < 2
    assert not group_alive(leader.pid)


def test_a_zombie_does_not_count():
    """Only its parent can remove a zombie: stop_group does not wait on one."""
    leader = _group("exit 0")  # not waited for: a zombie child of this process
    deadline = time.monotonic() + 10
    while psutil.Process(leader.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not group_alive(leader.pid)
    leader.send_signal(signal.SIGTERM)  # no effect on a zombie
    leader.wait(10)
