"""workers.warm.waves against a raylet that starts processes as Ray's worker pool does.

The real raylet (7 processes asked for on a 2-CPU node: 2 start at once, 7 in waves) is
what the standby and warm-spare integration tests run on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.support.polling import wait_for
from workers.warm import waves

KEEP = 3600


def prestart(folder: Path, requests, **kw):
    """This job's processes, their started marks under ``folder``."""
    return waves.prestart(requests, started=folder / "started", keep_alive_s=KEEP, **kw)


class Raylet:
    """A raylet's PrestartWorkers as Ray's worker pool has it: it starts a process per worker
    asked for while fewer than ``concurrency`` are starting and silently drops the rest; a
    process stops starting once it reaches the job's setup hook (marks itself started)."""

    def __init__(self, folder: Path, concurrency: int):
        self.folder, self.concurrency = folder, concurrency
        self.starting: list = []
        self.started: list[str | None] = []  # the runtime env of each process started
        self.next_pid = 1000

    def prestart_workers(self, count, *, keep_alive_s, runtime_env=None):
        assert keep_alive_s == KEEP
        for _ in range(count):
            if len(self.starting) >= self.concurrency:
                return  # TooManyStartingWorkerProcesses, ignored by PrestartWorkers
            self.next_pid += 1
            timer = threading.Timer(0.05, self._hook, (self.next_pid, runtime_env))
            self.starting.append(timer)
            timer.start()

    def _hook(self, pid, runtime_env):
        self.starting.pop()  # registered with the raylet, then the hook runs
        self.started.append(runtime_env)
        (self.folder / "started" / str(pid)).touch()


def test_prestarts_go_in_waves_the_raylet_takes(monkeypatch, tmp_path):
    """Seven processes on a raylet that starts two at a time: all seven start, in order."""
    raylet = Raylet(tmp_path, concurrency=2)
    monkeypatch.setattr(waves, "startup_concurrency", lambda: 2)
    monkeypatch.setattr(waves, "prestart_workers", raylet.prestart_workers)
    thread = prestart(tmp_path, [(2, "workers"), (5, "controller")])
    thread.join(timeout=10)  # the last wave asked for
    assert not thread.is_alive()
    wait_for(lambda: len(raylet.started) >= 7, timeout=5, every=0.05, what="7 processes")
    time.sleep(0.2)
    assert raylet.started == ["workers"] * 2 + ["controller"] * 5

    # Asked for at once, the raylet would have started two of them.
    once = Raylet(tmp_path, concurrency=2)
    once.prestart_workers(7, keep_alive_s=KEEP)
    time.sleep(0.3)
    assert len(once.started) == 2


def test_waves_are_the_requests_cut_to_size_and_one_wave_needs_no_thread(monkeypatch, tmp_path):
    assert list(waves.split([(3, "a"), (0, "x"), (2, "b")], 2)) == [
        [(2, "a")],
        [(1, "a"), (1, "b")],
        [(1, "b")],
    ]
    assert list(waves.split([(0, "a")], 2)) == []
    asked = []
    monkeypatch.setattr(waves, "startup_concurrency", lambda: 4)
    monkeypatch.setattr(waves, "prestart_workers", lambda n, **kw: asked.append(n))
    assert prestart(tmp_path, [(3, None), (1, "b")]) is None and asked == [3, 1]
    assert prestart(tmp_path, [(0, None)]) is None and asked == [3, 1]


def test_a_wave_that_never_starts_does_not_stop_the_next(monkeypatch, tmp_path):
    """Processes that never reach the hook (a raylet that dropped them) hold the next wave
    back for WAVE_WAIT_S only."""
    asked = []
    monkeypatch.setattr(waves, "startup_concurrency", lambda: 1)
    monkeypatch.setattr(waves, "WAVE_WAIT_S", 0.2)
    monkeypatch.setattr(waves, "prestart_workers", lambda n, **kw: asked.append(n))
    prestart(tmp_path, [(3, None)]).join(timeout=5)
    assert asked == [1, 1, 1]


def test_once_stopped_no_further_wave_goes_and_nothing_follows(monkeypatch, tmp_path):
    """A standby handed its job stops its warm-up: what was not asked for yet is not."""
    raylet = Raylet(tmp_path, concurrency=2)
    monkeypatch.setattr(waves, "startup_concurrency", lambda: 2)
    monkeypatch.setattr(waves, "prestart_workers", raylet.prestart_workers)
    stop, followed = threading.Event(), []
    stop.set()  # the job came while the first wave started
    thread = prestart(
        tmp_path, [(2, "workers"), (5, "controller")], then=lambda: followed.append(1), stop=stop
    )
    thread.join(timeout=5)
    wait_for(lambda: len(raylet.started) >= 2, timeout=5, every=0.05, what="the first wave")
    time.sleep(0.2)
    assert raylet.started == ["workers"] * 2 and followed == []

    # Not stopped, on a raylet of its own (the first one's processes may still be starting
    # on a busy machine, and it would drop this one's): it runs once the last wave started.
    raylet = Raylet(tmp_path / "next", concurrency=2)
    monkeypatch.setattr(waves, "prestart_workers", raylet.prestart_workers)
    thread = prestart(tmp_path / "next", [(3, "a")], then=lambda: followed.append(1))
    thread.join(timeout=5)
    assert followed == [1] and raylet.started == ["a"] * 3
