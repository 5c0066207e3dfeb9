"""Start-up timestamps (workers.warm.startup_times) and the first group's prestart count."""

from __future__ import annotations

import time

from workers.contract import EventKind
from workers.warm import startup_times
from workers.warm.first_group import first_group_here


class Recorder:
    def __init__(self):
        self.events = []

    def event(self, kind, message, *, data=None, dedup_key=None):
        self.events.append((kind, data))


def test_this_process_started_before_now_and_after_boot():
    started = startup_times.process_start_time()
    assert started is not None
    assert time.time() - 24 * 3600 * 365 < started <= time.time()


def test_only_the_first_workers_started_event_carries_the_timestamps():
    reporter = Recorder()
    startup_times.stamp_workers_started(reporter, {"train_fn": 1.0})
    reporter.event(EventKind.MEMORY, "m", data={"x": 1})
    reporter.event(EventKind.WORKERS_STARTED, "2 workers started", data={"world_size": 2})
    reporter.event(EventKind.WORKERS_STARTED, "again", data={"world_size": 2})
    assert reporter.events == [
        (EventKind.MEMORY, {"x": 1}),
        (EventKind.WORKERS_STARTED, {"world_size": 2, "startup": {"train_fn": 1.0}}),
        (EventKind.WORKERS_STARTED, {"world_size": 2}),
    ]


def test_a_worker_reports_the_drivers_the_controllers_and_its_own_times():
    startup_times.note_group_times({"group_start": 5.0, "backend_ready": 6.0})
    times = startup_times.worker_startup({"driver_ready": 4.0}, train_fn=7.0)
    assert times["driver_ready"] == 4.0 and times["group_start"] == 5.0
    assert times["backend_ready"] == 6.0 and times["train_fn"] == 7.0
    assert times["worker_process"] <= time.time()


def test_the_first_group_is_prestarted_only_where_it_fits():
    assert first_group_here({"CPU": 2.0}, workers=2, cpus=1, gpus=0) == 2
    assert first_group_here({"CPU": 16.0}, workers=4, cpus=1, gpus=0) == 4
    assert first_group_here({"CPU": 3.0}, workers=4, cpus=2, gpus=0) == 1
    assert first_group_here({"CPU": 0.0}, workers=2, cpus=1, gpus=0) == 0  # a 0-CPU head
    assert first_group_here({"CPU": 64.0, "GPU": 2.0}, workers=8, cpus=4, gpus=1) == 2
    assert first_group_here({"CPU": 64.0}, workers=8, cpus=4, gpus=1) == 0
