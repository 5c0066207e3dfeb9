"""Speculative imports pause while another job runs on the machine (workers.warm.speculation)."""

from __future__ import annotations

import os
import sys
import threading
import time

from workers.warm import speculation

GONE_PID = 2**22 + 1  # above Linux's largest pid: no such process


def test_a_process_pauses_only_while_another_job_is_busy_and_its_own_is_not(tmp_path):
    assert not speculation.should_pause("job-a", root=tmp_path)  # nothing runs
    assert not speculation.should_pause("job-a", root=tmp_path / "missing")
    with speculation.busy("job-b", root=tmp_path):
        assert speculation.should_pause("job-a", root=tmp_path)
        assert not speculation.should_pause("job-b", root=tmp_path)  # its own job
        own = speculation.mark_busy("job-a", root=tmp_path)
        assert not speculation.should_pause("job-a", root=tmp_path)  # its own job started
        own.unlink()
        assert speculation.should_pause("job-a", root=tmp_path)
    assert not list(tmp_path.iterdir())  # the run's marker went with it
    assert not speculation.should_pause("job-a", root=tmp_path)


def test_a_running_jobs_own_prestarts_never_pause(tmp_path):
    """Job a trains: its spares and next-run processes import while job b starts or trains;
    an idle Ray job's (a standby without a job) wait for both."""
    speculation.mark_busy("job-a", root=tmp_path)
    b = speculation.mark_busy("job-b", root=tmp_path)
    assert speculation.busy_jobs(tmp_path) == {"job-a", "job-b"}
    assert not speculation.should_pause("job-a", root=tmp_path)
    assert speculation.should_pause("idle", root=tmp_path)
    b.unlink()
    assert not speculation.should_pause("job-a", root=tmp_path)
    assert speculation.should_pause("idle", root=tmp_path)


def test_a_marker_of_a_process_that_exited_holds_nothing_and_is_removed(tmp_path):
    (tmp_path / f"job-b.{GONE_PID}").touch()
    (tmp_path / "not-a-marker").touch()
    assert not speculation.should_pause("job-a", root=tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_marker_that_cannot_be_written_is_no_error(tmp_path):
    (tmp_path / "file").touch()
    assert speculation.mark_busy("job-a", root=tmp_path / "file" / "below") is None
    assert speculation.mark_busy(None, root=tmp_path) is None  # outside Ray: no job
    with speculation.busy(None, root=tmp_path):
        pass


def test_the_finder_waits_between_imports_at_most_the_longest_pause():
    now = [0.0]
    answers = iter([True, True, True, False])
    finder = speculation.YieldingImports(
        lambda: next(answers),
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
        pause_max_s=10.0,
    )
    assert finder.find_spec("anything", None) is None  # finds nothing itself
    assert finder.paused_s == 3 * speculation.POLL_S
    # Then it looks again only after CHECK_EVERY_S, and a pause ends at pause_max_s in all.
    finder._pause = lambda: True
    assert finder.find_spec("next", None) is None and finder.paused_s == 3 * speculation.POLL_S
    now[0] += speculation.CHECK_EVERY_S
    finder.find_spec("later", None)
    assert abs(finder.paused_s - 10.0) < speculation.POLL_S + 1e-9
    paused = finder.paused_s
    now[0] += 1.0
    finder.find_spec("after", None)
    assert finder.paused_s == paused  # no more waiting in this process


def test_other_threads_never_wait():
    finder = speculation.YieldingImports(lambda: True, thread=threading.get_ident() + 1)
    finder.find_spec("anything", None)
    assert finder.paused_s == 0


def test_an_import_ahead_waits_for_the_other_job_and_goes_on_when_it_ends(tmp_path, monkeypatch):
    """A real import under ``yielding``: held while another job's marker is there."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "etrain_spec_probe.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(package))
    markers = tmp_path / "busy"
    other = speculation.mark_busy("job-b", root=markers)
    done: list[float] = []

    def end_other_job():
        time.sleep(0.6)
        done.append(time.monotonic())
        other.unlink()

    ender = threading.Thread(target=end_other_job)
    started = time.monotonic()
    ender.start()
    with speculation.yielding("job-a", root=markers) as finder:
        import etrain_spec_probe  # noqa: F401 - the import under test
    imported = time.monotonic()
    ender.join()
    assert imported >= done[0] >= started + 0.6
    assert finder.paused_s > 0 and finder not in sys.meta_path
    assert sys.modules["etrain_spec_probe"].VALUE == 7
    del sys.modules["etrain_spec_probe"]


def test_running_tells_a_live_process_from_a_gone_one():
    assert speculation.running(os.getpid()) and not speculation.running(GONE_PID)
