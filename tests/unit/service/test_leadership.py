"""The control loop's lease: one leader at a time, takeover once it lapses, and a replica
that lost it refused by the database (a real store: SQLite here, PostgreSQL again in
tests/integration/test_store_postgres.py)."""

from __future__ import annotations

import time

import pytest

from service.backends.base import RunState, RunStatus
from service.domain.leadership import LEASE, Leadership, NotLeader
from service.domain.reconciler import Reconciler
from service.settings import Settings
from service.status import JobStatus
from service.store.leases import LeaseStore
from tests.support.fakes import FakeBackend
from workers.spec import parse_spec

TTL = 0.5  # seconds: the database's clock decides expiry, so the tests wait it out


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _replica(stores, name: str, clock=time.monotonic) -> Leadership:
    return Leadership(LeaseStore(stores.db), ttl_s=TTL, holder=name, clock=clock)


def test_one_leader_at_a_time_and_a_takeover_once_the_lease_lapses(stores):
    a, b = _replica(stores, "a"), _replica(stores, "b")
    assert a.campaign() and not b.campaign()
    assert a.leads() and not b.leads()
    assert LeaseStore(stores.db).holder(LEASE).holder == "a"
    first = a.token()
    time.sleep(TTL + 0.1)  # a stops renewing (killed, paused, cut off)
    assert not a.leads()  # by its own clock, before any round tells it
    assert b.campaign() and b.token() == first + 1
    assert not a.campaign()  # its renewal is refused: the lease passed on
    assert a.token() is None and b.leads()


def test_renewing_keeps_the_lease_and_a_handback_frees_it_at_once(stores):
    a, b = _replica(stores, "a"), _replica(stores, "b")
    assert a.campaign()
    for _ in range(3):
        time.sleep(TTL / 3)
        assert a.campaign() and not b.campaign()
    a.stop()  # a replica that stops hands the lease back
    assert not a.leads() and b.campaign()


def test_a_database_error_ends_the_leadership(stores, monkeypatch):
    a = _replica(stores, "a")
    assert a.campaign()

    def away(*args, **kwargs):
        raise ConnectionError("the database is away")

    monkeypatch.setattr(a.leases, "renew", away)
    monkeypatch.setattr(a.leases, "acquire", away)
    assert not a.campaign() and not a.leads()
    with pytest.raises(NotLeader):
        a.fence()


def test_a_replica_paused_past_its_lease_changes_no_job(stores, tmp_path):
    """The fencing token: a replica that still believes it leads (its own clock was not
    consulted: a pause between the check and the write) is refused by the database."""
    tenant = stores.tokens.create_tenant("acme").id
    spec = parse_spec({"name": "tiny"})
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=spec, min_workers=1)
    clock = Clock()
    old = _replica(stores, "old", clock)
    assert old.campaign()
    stale_fence = old.fence()
    time.sleep(TTL + 0.1)
    new = _replica(stores, "new")
    assert new.campaign()
    assert stores.jobs.update_job(job.id, fence=stale_fence, status=JobStatus.FAILED) is None
    assert stores.jobs.get_job(job.id).status == JobStatus.QUEUED
    moved = stores.jobs.update_job(job.id, fence=new.fence(), status=JobStatus.PENDING)
    assert moved is not None and moved.status == JobStatus.PENDING


def test_only_the_leader_reconciles_and_a_follower_takes_over_in_flight_jobs(stores, tmp_path):
    settings = Settings(env="development", data_dir=tmp_path, reconcile_interval_s=0.01)
    backend = FakeBackend(cpus=4)
    a, b = _replica(stores, "a"), _replica(stores, "b")
    first = Reconciler(stores, backend, settings.reconciler, leadership=a)
    second = Reconciler(stores, backend, settings.reconciler, leadership=b)
    tenant = stores.tokens.create_tenant("acme").id
    spec = parse_spec({"name": "tiny"})
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=spec, min_workers=1)
    assert a.campaign() and not b.campaign()
    with pytest.raises(NotLeader):
        second.tick()  # a follower's tick writes nothing
    assert stores.jobs.get_job(job.id).status == JobStatus.QUEUED
    first.tick()
    submitted = stores.jobs.get_job(job.id)
    assert submitted.status == JobStatus.PENDING and len(backend.submitted) == 1
    time.sleep(TTL + 0.1)  # the leader dies
    assert b.campaign()
    backend.statuses[submitted.submission_id] = RunStatus(RunState.SUCCEEDED)
    second.tick()  # the new leader follows the job the old one submitted
    assert stores.jobs.get_job(job.id).status == JobStatus.SUCCEEDED
    assert len(backend.submitted) == 1  # never submitted twice
    events = [(e.kind, e.message) for e in stores.events.list_events(job.id)]
    assert [m for _, m in events if m.startswith("submitted to Ray")] == [
        f"submitted to Ray as {submitted.submission_id}"
    ]
    assert [k for k, _ in events].count("succeeded") == 1, events
