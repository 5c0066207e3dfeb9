"""The reconciler's loop admits a queued job when woken, without waiting out its period."""

from __future__ import annotations

import itertools
import time

from service.domain.reconciler import Reconciler
from service.settings import Settings
from service.status import JobStatus
from tests.support.fakes import FakeBackend
from tests.support.polling import wait_for
from workers.spec import parse_spec


def test_a_wake_admits_at_once_and_stop_does_not_wait_out_the_period(stores, tmp_path):
    settings = Settings(env="development", data_dir=tmp_path, port=8123, reconcile_interval_s=60)
    backend = FakeBackend(cpus=4)
    reconciler = Reconciler(stores, backend, settings.reconciler)
    tenant = stores.tokens.create_tenant("acme").id
    spec = parse_spec({"name": "tiny"})
    reconciler.start()
    try:
        time.sleep(0.1)  # the loop is waiting: its first tick is 60 s away
        job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=spec, min_workers=1)
        time.sleep(0.3)
        assert stores.jobs.get_job(job.id).status is JobStatus.QUEUED  # no tick without a wake
        t0 = time.monotonic()
        reconciler.wake()
        wait_for(lambda: backend.submitted, timeout=10, every=0.01, what="a submit after wake()")
        assert time.monotonic() - t0 < 5
        assert stores.jobs.get_job(job.id).status is JobStatus.PENDING
    finally:
        t_stop = time.monotonic()
        reconciler.stop()
    assert time.monotonic() - t_stop < 5
    assert not reconciler._thread.is_alive()


def test_a_burst_of_wakes_shares_ticks(stores, tmp_path, monkeypatch):
    settings = Settings(env="development", data_dir=tmp_path, port=8123, reconcile_interval_s=60)
    reconciler = Reconciler(stores, FakeBackend(cpus=4), settings.reconciler)
    ticks: list[float] = []
    monkeypatch.setattr(reconciler, "tick", lambda: ticks.append(time.monotonic()))
    reconciler.start()
    try:
        time.sleep(0.05)
        reconciler.wake()
        wait_for(lambda: ticks, timeout=5, every=0.005, what="the first woken tick")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:  # 100 submissions in half a second
            last = time.monotonic()
            reconciler.wake()
            time.sleep(0.005)
        wait_for(lambda: ticks[-1] > last, timeout=5, every=0.005, what="a tick after the last")
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        assert 2 <= len(ticks) <= 8 and min(gaps) >= 0.099, ticks  # not one per wake
    finally:
        reconciler.stop()


def test_the_loops_ticks_and_their_cpu_are_scraped(stores, tmp_path):
    """/metrics counts the control loop's ticks and the CPU of its thread (a load bench
    tells the loop's share of a replica's CPU from the requests' with it)."""
    from service.api import prometheus as prom
    from service.domain.monitoring import Monitoring

    settings = Settings(env="development", data_dir=tmp_path, port=8123, reconcile_interval_s=60)
    backend = FakeBackend(cpus=4)
    reconciler = Reconciler(stores, backend, settings.reconciler)
    monitoring = Monitoring(stores, backend, prom.JOB_METRICS, loop=reconciler)
    assert monitoring.loop_load() == (0, 0.0)
    tenant = stores.tokens.create_tenant("acme").id
    spec = parse_spec({"name": "tiny", "resources": {"workers": 1, "cpus_per_worker": 64}})
    for i in range(200):  # a queue to read that never fits: ticks with work in them
        stores.jobs.create_job(tenant_id=tenant, name=f"q{i}", spec=spec, min_workers=1)
    reconciler.start()
    try:
        reconciler.wake()
        wait_for(lambda: reconciler.ticks >= 1, timeout=10, every=0.01, what="a tick")
    finally:
        reconciler.stop()
    ticks, cpu_s = monitoring.loop_load()
    assert ticks >= 1 and 0 < cpu_s < 10
    lines = prom.render({}, with_jobs=False, loop=(ticks, cpu_s)).decode().splitlines()
    assert f"etrain_reconciler_ticks_total {float(ticks)}" in lines
    assert f"etrain_reconciler_tick_cpu_seconds_total {cpu_s}" in lines
