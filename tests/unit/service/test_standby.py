"""Standby job drivers on the service side: the pool, its route, the reconciler's hand-over."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from service.backends.base import LaunchRequest
from service.backends.standby import (
    HANDOVER_S,
    RETRY_S,
    SEEN_TIMEOUT_S,
    START_GRACE_S,
    SUBMISSION_PREFIX,
    NotItsJob,
    StandbyDrivers,
    UnknownStandby,
    run_id,
)
from service.domain.reconciler import STARTING_S, Reconciler, starting
from service.errors import BackendUnavailable
from service.settings import Settings
from service.status import JobStatus
from tests.support.api import api_client
from tests.support.fakes import ADMIN_H, FakeBackend
from workers.contract import (
    REPORT_TOKEN_ENV,
    REPORT_URL_ENV,
    STANDBY_DONE_ROUTE,
    STANDBY_ID_ENV,
    STANDBY_ROUTE,
    STANDBY_TOKEN_ENV,
    STANDBY_WORKERS_ENV,
)
from workers.spec import parse_spec


class Ray:
    """Records the standby Ray jobs started and stopped; can refuse starts."""

    def __init__(self):
        self.started: dict[str, dict[str, str]] = {}
        self.stopped: list[str] = []
        self.refuse = False

    def start(self, submission_id: str, env: dict[str, str]) -> None:
        if self.refuse:
            raise BackendUnavailable("job API down")
        self.started[submission_id] = env

    def stop(self, submission_id: str) -> None:
        self.stopped.append(submission_id)

    def token(self, submission_id: str) -> tuple[str, str]:
        env = self.started[submission_id]
        return env[STANDBY_ID_ENV], env[STANDBY_TOKEN_ENV]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pool(ray: Ray, clock: Clock, count: int = 1) -> StandbyDrivers:
    return StandbyDrivers(
        ray.start, ray.stop, count=count, workers=3, report_url="http://cp:8080", clock=clock
    )


def _req(job: str = "j-1", n: int = 0, **env: str) -> LaunchRequest:
    return LaunchRequest(
        job_id=job,
        submission_id=f"etrain-{job}-{n}",
        spec_json='{"name": "x"}',
        env={REPORT_TOKEN_ENV: f"reporter-{job}", **env},
    )


def test_keep_starts_the_configured_number_with_only_standby_variables():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, count=2)
    pool.keep()
    pool.keep()  # already enough: nothing more
    assert len(ray.started) == 2 and pool.status().idle == 2
    for submission_id, env in ray.started.items():
        assert submission_id == SUBMISSION_PREFIX + env[STANDBY_ID_ENV]
        assert env[STANDBY_WORKERS_ENV] == "3" and env[REPORT_URL_ENV] == "http://cp:8080"
        assert REPORT_TOKEN_ENV not in env  # a job's secrets never go into the Ray job
    tokens = [env[STANDBY_TOKEN_ENV] for env in ray.started.values()]
    assert len(set(tokens)) == 2 and all(len(t) >= 32 for t in tokens)


def test_a_job_is_handed_once_and_the_standby_comes_back_once_its_success_is_recorded():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock)
    assert pool.take(_req()) is None  # none started yet
    pool.keep()
    (submission_id,) = ray.started
    standby_id, token = ray.token(submission_id)
    assert pool.fetch(standby_id, token, wait_s=0) is None  # no job yet: 204
    assert pool.take(_req("j-1", S3_KEY="k")) == submission_id
    assert pool.take(_req("j-1")) == submission_id  # the same submission asked again
    assert pool.take(_req("j-2")) is None  # the only standby is taken
    job = pool.fetch(standby_id, token, wait_s=0)
    assert job == {
        "job_id": "j-1",
        "submission_id": "etrain-j-1-0",
        "spec_json": '{"name": "x"}',
        "env": {REPORT_TOKEN_ENV: "reporter-j-1", "S3_KEY": "k"},
    }
    assert pool.fetch(standby_id, token, wait_s=0) is None  # handed out once
    pool.keep()  # one standby is kept, busy or not: no second one
    assert len(ray.started) == 1 and pool.status().busy == 1
    assert pool.state_of("etrain-j-1-0") == "running" and pool.state_of("etrain-j-2-0") is None
    with pytest.raises(NotItsJob):
        pool.done(standby_id, token, "etrain-j-2-0")
    with pytest.raises(UnknownStandby):
        pool.done(standby_id, token + "x", "etrain-j-1-0")
    pool.done(standby_id, token, "etrain-j-1-0")
    assert pool.state_of("etrain-j-1-0") == "done"
    assert pool.take(_req("j-2")) is None  # not before the job's end is recorded
    pool.settle("etrain-j-1-0")
    assert pool.state_of("etrain-j-1-0") is None and pool.status().idle == 1
    assert pool.take(_req("j-2")) == submission_id  # the same driver runs the next job
    assert pool.fetch(standby_id, token, wait_s=0)["job_id"] == "j-2"
    pool.forget(submission_id)  # its Ray job ended (the job failed, say)
    pool.keep()
    assert len(ray.started) == 2 and pool.status().idle == 1


def test_a_wrong_token_or_id_learns_nothing():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock)
    pool.keep()
    (submission_id,) = ray.started
    standby_id, token = ray.token(submission_id)
    pool.take(_req())
    for sid, tok in ((standby_id, token + "x"), ("nope", token), (standby_id, "")):
        with pytest.raises(UnknownStandby):
            pool.fetch(sid, tok, wait_s=0)
    assert pool.fetch(standby_id, token, wait_s=0)["job_id"] == "j-1"


def test_a_waiting_standby_gets_its_job_as_soon_as_it_is_handed():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock)
    pool.keep()
    standby_id, token = ray.token(next(iter(ray.started)))
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(pool.fetch(standby_id, token, wait_s=30)))
    waiting.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    pool.take(_req())
    waiting.join(5)
    assert got and got[0]["job_id"] == "j-1"
    assert time.monotonic() - t0 < 2  # woken, not after its 30 s


def test_a_warm_standby_is_handed_a_job_before_one_still_starting():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, count=2)
    pool.keep()
    _first, second = ray.started
    clock.now += 1
    pool.fetch(*ray.token(second), wait_s=0)  # the second has asked: it is warm
    assert pool.take(_req()) == second


@pytest.mark.parametrize(
    "seen, wait, lost",
    [
        (False, START_GRACE_S - 1, False),
        (False, START_GRACE_S + 1, True),  # it never asked: its start failed
        (True, SEEN_TIMEOUT_S - 1, False),
        (True, SEEN_TIMEOUT_S + 1, True),  # it stopped asking
    ],
)
def test_lost_standbys_are_stopped_and_replaced(seen, wait, lost):
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock)
    pool.keep()
    (first,) = ray.started
    if seen:
        pool.fetch(*ray.token(first), wait_s=0)
    clock.now += wait
    pool.keep()
    assert (ray.stopped == [first]) is lost
    assert len(ray.started) == (2 if lost else 1) and pool.status().idle == 1


def test_a_job_its_standby_never_fetched_is_given_up_after_the_handover_time():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock)
    pool.keep()
    (first,) = ray.started
    pool.take(_req())
    clock.now += HANDOVER_S + 1
    pool.keep()
    assert ray.stopped == [first]  # its Ray job stops; the reconciler sees the job end


def test_a_failed_start_is_retried_after_a_pause_not_every_tick():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock)
    ray.refuse = True
    pool.keep()
    ray.refuse = False
    pool.keep()
    assert not ray.started and pool.status().idle == 0
    clock.now += RETRY_S
    pool.keep()
    assert len(ray.started) == 1


def test_close_stops_the_idle_standbys_only():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, count=2)
    pool.keep()
    taken = pool.take(_req())
    pool.close()
    assert set(ray.stopped) == set(ray.started) - {taken}


def test_the_pool_counts_its_warm_standbys_and_their_memory():
    ray, clock = Ray(), Clock()
    pool = _pool(ray, clock, count=3)
    pool.keep()
    first, second = (ray.token(s) for s in list(ray.started)[:2])
    pool.fetch(*first, wait_s=0, memory_bytes=2_000_000_000)
    pool.fetch(*second, wait_s=0)  # one that cannot measure itself is warm all the same
    status = pool.status()
    assert (status.configured, status.idle, status.warm) == (3, 3, 2)
    assert status.memory_bytes == 2_000_000_000
    pool.fetch(*first, wait_s=0, memory_bytes=2_500_000_000)  # its latest figure counts
    assert pool.status().memory_bytes == 2_500_000_000
    pool.take(_req())  # the warm one with the figure goes first; it is the job's now
    status = pool.status()
    assert (status.idle, status.warm, status.memory_bytes) == (2, 1, 0)


# -- the route -------------------------------------------------------------------------------


@pytest.fixture
def standby_api(tmp_path):
    """The API on a fake backend with a standby pool (no reconciler); the pool's Ray."""
    ray, backend = Ray(), FakeBackend()
    backend.standby = _pool(ray, time.monotonic)
    with api_client(tmp_path, backend) as c:
        yield c, backend.standby, ray


def _route(standby_id: str) -> str:
    return STANDBY_ROUTE.format(standby_id=standby_id)


def test_the_route_hands_the_job_once_to_its_standby_only(standby_api):
    c, pool, ray = standby_api
    pool.keep()
    standby_id, token = ray.token(next(iter(ray.started)))
    auth = {"Authorization": f"Bearer {token}"}
    assert c.get(_route(standby_id), params={"wait": 0}).status_code == 401
    wrong = c.get(_route(standby_id), params={"wait": 0}, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and "standby" in wrong.json()["detail"]
    assert c.get(_route(standby_id), params={"wait": 0}, headers=auth).status_code == 204
    assert c.get(_route(standby_id), params={"wait": 99}, headers=auth).status_code == 422
    pool.take(_req())
    r = c.get(_route(standby_id), params={"wait": 0}, headers=auth)
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    assert r.json()["env"][REPORT_TOKEN_ENV] == "reporter-j-1"
    assert c.get(_route(standby_id), params={"wait": 0}, headers=auth).status_code == 204
    done = STANDBY_DONE_ROUTE.format(standby_id=standby_id)
    assert c.post(done, params={"submission_id": "etrain-j-1-0"}).status_code == 401
    other = c.post(done, params={"submission_id": "etrain-j-9-0"}, headers=auth)
    assert other.status_code == 409 and "submission_id" in other.json()["detail"]
    assert c.post(done, params={"submission_id": "etrain-j-1-0"}, headers=auth).status_code == 204
    assert pool.state_of("etrain-j-1-0") == "done"


def test_a_standby_reports_its_memory_and_the_cluster_shows_it(standby_api):
    c, pool, ray = standby_api
    pool.keep()
    standby_id, token = ray.token(next(iter(ray.started)))
    auth = {"Authorization": f"Bearer {token}"}

    def shown():
        pool = c.get("/v1/cluster", headers=ADMIN_H).json()["standby"]
        return {k: pool[k] for k in ("configured", "idle", "warm", "memory_bytes")}

    assert shown() == {"configured": 1, "idle": 1, "warm": 0, "memory_bytes": 0}
    bad = c.get(_route(standby_id), params={"wait": 0, "memory": -1}, headers=auth)
    assert bad.status_code == 422 and "memory" in bad.text
    ok = c.get(_route(standby_id), params={"wait": 0, "memory": 1_900_000_000}, headers=auth)
    assert ok.status_code == 204
    assert shown() == {"configured": 1, "idle": 1, "warm": 1, "memory_bytes": 1_900_000_000}
    # A wrong token's figure is not taken.
    c.get(_route(standby_id), params={"wait": 0, "memory": 5}, headers={"Authorization": "x"})
    assert shown()["memory_bytes"] == 1_900_000_000


def test_without_standbys_the_route_knows_none(client):
    r = client.get(_route("abc"), params={"wait": 0}, headers={"Authorization": "Bearer t"})
    assert r.status_code == 401


# -- the reconciler --------------------------------------------------------------------------


def test_an_admitted_job_goes_to_an_idle_standby_and_keeps_its_ray_id(stores, tmp_path):
    ray, backend = Ray(), FakeBackend(cpus=4)
    backend.standby = _pool(ray, time.monotonic)
    settings = Settings(env="development", data_dir=tmp_path, port=8123)
    reconciler = Reconciler(stores, backend, settings.reconciler)
    tenant = stores.tokens.create_tenant("acme").id
    jobs = []
    for name in ("a", "b"):
        spec = parse_spec({"name": name, "resources": {"workers": 1}})
        jobs.append(stores.jobs.create_job(tenant_id=tenant, name=name, spec=spec, min_workers=1))
    reconciler.tick()
    standby = next(iter(ray.started))  # started before admission
    got = [stores.jobs.get_job(j.id) for j in jobs]
    assert [j.status for j in got] == [JobStatus.PENDING, JobStatus.PENDING]
    # The standby started first took the first job: its Ray job and the job's own id.
    assert got[0].submission_id == run_id(standby, f"etrain-{jobs[0].id}-0")
    assert got[1].submission_id == f"etrain-{jobs[1].id}-0"  # none idle: submitted
    assert [r.job_id for r in backend.submitted] == [jobs[1].id]
    events = stores.events.list_events(jobs[0].id)
    assert any(e.kind == "submitted" and standby in e.message for e in events)
    # Not replaced: it takes the next job once this one succeeded.
    for job in jobs:  # both report their first step
        stores.jobs.update_job(job.id, step=1)
    reconciler.tick()
    assert len(ray.started) == 1 and backend.standby.status().busy == 1
    pool = backend.standby
    standby_id, token = ray.token(standby)
    assert pool.fetch(standby_id, token, wait_s=0)["job_id"] == jobs[0].id
    pool.done(standby_id, token, f"etrain-{jobs[0].id}-0")
    reconciler.tick()
    assert stores.jobs.get_job(jobs[0].id).status == JobStatus.SUCCEEDED
    assert pool.status().idle == 1 and len(ray.started) == 1  # back in the pool, warm


def test_a_job_counts_as_starting_until_its_first_step_or_for_at_most_a_minute(stores):
    tenant = stores.tokens.create_tenant("acme").id
    spec = parse_spec({"name": "a", "resources": {"workers": 1}})
    job = stores.jobs.create_job(tenant_id=tenant, name="a", spec=spec, min_workers=1)
    now = datetime.now(UTC)
    assert not starting(job, now)  # QUEUED: nothing starts yet
    stores.jobs.update_job(job.id, status=JobStatus.PENDING)
    pending = stores.jobs.get_job(job.id)
    assert starting(pending, now)
    assert not starting(pending, now + timedelta(seconds=STARTING_S + 1))  # stuck: not forever
    stores.jobs.update_job(job.id, status=JobStatus.RUNNING, started_at=now)
    assert starting(stores.jobs.get_job(job.id), now)
    stores.jobs.update_job(job.id, step=1)
    assert not starting(stores.jobs.get_job(job.id), now)


def test_a_finished_job_wakes_the_reconciler_at_once_and_only_a_real_one():
    from service.domain.standby_jobs import StandbyJobs
    from service.errors import InvalidTransition, Unauthorized

    ray, backend, woken = Ray(), FakeBackend(), []
    backend.standby = _pool(ray, Clock())
    jobs = StandbyJobs(backend, on_done=lambda: woken.append(1))
    backend.standby.keep()
    standby_id, token = ray.token(next(iter(ray.started)))
    backend.standby.take(_req())
    jobs.fetch(standby_id, f"Bearer {token}", wait_s=0)
    with pytest.raises(Unauthorized):
        jobs.done(standby_id, "Bearer nope", "etrain-j-1-0")
    with pytest.raises(InvalidTransition):
        jobs.done(standby_id, f"Bearer {token}", "etrain-j-2-0")
    assert not woken
    jobs.done(standby_id, f"Bearer {token}", "etrain-j-1-0")
    assert woken == [1]  # recorded now, not at the reconciler's next poll


class _StopClient:
    def __init__(self):
        self.stopped: list[str] = []

    def stop_job(self, submission_id: str) -> None:
        self.stopped.append(submission_id)


def test_stopping_a_job_a_standby_runs_stops_that_standby_only_while_it_runs_the_job():
    from service.backends.ray_jobs import RayJobBackend

    ray, backend = Ray(), RayJobBackend("http://ray.test:8265")
    backend._client = client = _StopClient()
    backend.standby = pool = _pool(ray, Clock())
    pool.keep()
    (standby,) = ray.started
    standby_id, token = ray.token(standby)
    recorded = backend.take_standby(_req("j-1"))
    pool.fetch(standby_id, token, wait_s=0)
    pool.done(standby_id, token, "etrain-j-1-0")
    backend.stop(recorded)  # it ended there: nothing to stop
    pool.settle("etrain-j-1-0")
    second = backend.take_standby(_req("j-2"))
    backend.stop(recorded)  # a late stop of the first job leaves the second one running
    assert client.stopped == [] and pool.status().busy == 1
    backend.stop(second)  # cancelled while it runs: its standby stops and leaves the pool
    assert client.stopped == [standby] and pool.status().busy == 0
    pool.keep()
    assert len(ray.started) == 2  # replaced
    unknown = run_id("etrain-standby-gone", "etrain-j-3-0")  # after a service restart
    backend.stop(unknown)
    assert client.stopped == [standby, "etrain-standby-gone"]
