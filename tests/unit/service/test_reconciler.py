"""Reconciler.tick() with an in-memory backend and a real JobStore (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from service.auth import Principal, authenticate
from service.backends.base import RunState, RunStatus
from service.domain.lifecycle import Lifecycle
from service.domain.reconciler import Reconciler
from service.domain.recovery import EXIT_TRAINING_FAILED
from service.errors import BackendError, BackendUnavailable, Unauthorized
from service.settings import Settings
from service.status import JobStatus
from service.store import JobRecord, Stores
from tests.support.fakes import FakeBackend
from workers.spec import parse_spec


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(env="development", data_dir=tmp_path, port=8123, reconcile_interval_s=0.01)


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend(cpus=4)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reconciler(stores, backend, settings, clock) -> Reconciler:
    return Reconciler(stores, backend, settings.reconciler, clock=clock)


@pytest.fixture
def tenant(stores) -> str:
    return stores.tokens.create_tenant("acme").id


def _job(db: Stores, tenant: str, name: str = "tiny", **sections) -> JobRecord:
    spec = parse_spec({"name": name, **sections})
    return db.jobs.create_job(
        tenant_id=tenant, name=name, spec=spec, min_workers=spec.resources.min_workers
    )


def _kinds(stores: Stores, job_id: str) -> list[str]:
    return [e.kind for e in stores.events.list_events(job_id)]


def _submitted(stores: Stores, job: JobRecord) -> JobRecord:
    """Put ``job`` where a first successful tick leaves it (PENDING with a submission)."""
    return stores.jobs.update_job(
        job.id, status=JobStatus.PENDING, submission_id=f"etrain-{job.id}-0"
    )


# -- admission -----------------------------------------------------------------


def test_fifo_admission_by_cluster_cpus(stores, tenant, backend, reconciler):
    jobs = [_job(stores, tenant, f"job-{i}") for i in range(3)]  # 2 workers x 1 CPU each
    reconciler.tick()

    first, second, third = (stores.jobs.get_job(j.id) for j in jobs)
    for job in (first, second):
        assert job.status is JobStatus.PENDING
        assert job.submission_id == f"etrain-{job.id}-0"
        assert job.dashboard_url == f"http://ray.test:8265/#/jobs/etrain-{job.id}-0"
        assert _kinds(stores, job.id) == ["submitted", "admitted", "submitted"]
    assert [r.submission_id for r in backend.submitted] == [
        first.submission_id,
        second.submission_id,
    ]
    assert third.status is JobStatus.QUEUED and third.submission_id is None
    waiting = [e for e in stores.events.list_events(third.id) if e.kind == "waiting"]
    assert len(waiting) == 1 and "needs 2 CPU" in waiting[0].message

    reconciler.tick()  # nothing changed on the cluster: nothing new happens
    assert len(backend.submitted) == 2
    assert _kinds(stores, third.id).count("waiting") == 1
    assert stores.jobs.get_job(third.id).status is JobStatus.QUEUED


def test_a_job_that_does_not_fit_now_does_not_block_smaller_ones(
    stores, tenant, backend, reconciler
):
    small = _job(stores, tenant, "small")
    big = _job(stores, tenant, "big", resources={"workers": 4})
    behind = _job(
        stores,
        tenant,
        "behind",
        resources={"workers": 1},
        train={"global_batch_size": 16, "micro_batch_size": 4},
    )
    reconciler.tick()
    assert stores.jobs.get_job(small.id).status is JobStatus.PENDING
    assert stores.jobs.get_job(big.id).status is JobStatus.QUEUED
    assert "waiting" in _kinds(stores, big.id)
    # 2 CPUs are free and "behind" needs 1: it starts (no head-of-line blocking; the big
    # job gets a reservation only once it has waited ETRAIN_SCHEDULER_RESERVE_AFTER_S).
    assert stores.jobs.get_job(behind.id).status is JobStatus.PENDING
    assert "waiting" not in _kinds(stores, behind.id)


def test_active_jobs_hold_their_resources(stores, tenant, backend, reconciler):
    running = _job(stores, tenant, "running", resources={"workers": 4})
    _submitted(stores, running)
    stores.jobs.update_job(running.id, status=JobStatus.RUNNING)
    queued = _job(stores, tenant, "queued")
    reconciler.tick()
    assert stores.jobs.get_job(queued.id).status is JobStatus.QUEUED
    assert backend.submitted == []

    backend.statuses[f"etrain-{running.id}-0"] = RunStatus(RunState.SUCCEEDED)
    reconciler.tick()  # the finished job frees its CPUs in the same tick
    assert stores.jobs.get_job(running.id).status is JobStatus.SUCCEEDED
    assert stores.jobs.get_job(queued.id).status is JobStatus.PENDING


@pytest.mark.parametrize(
    ("resources", "admitted"),
    [
        ({"workers": {"min": 1, "max": 8}}, 4),  # elastic: room for the minimum
        ({"workers": 2, "cpus_per_worker": 0.5}, 4),  # fractional CPUs
        ({"workers": 2, "cpus_per_worker": 1.5}, 1),
        ({"workers": 1, "gpus_per_worker": 1}, 0),  # no GPUs on the fake cluster
    ],
    ids=["elastic-min", "half-cpus", "one-and-a-half-cpus", "gpu-on-cpu-cluster"],
)
def test_admission_counts_min_workers_times_per_worker_resources(
    stores, tenant, backend, reconciler, resources, admitted
):
    train = {"global_batch_size": 840, "micro_batch_size": 1}  # 840 = lcm(1..8): any dp fits
    jobs = [_job(stores, tenant, f"job-{i}", resources=resources, train=train) for i in range(5)]
    reconciler.tick()
    statuses = [stores.jobs.get_job(j.id).status for j in jobs]
    assert statuses == [JobStatus.PENDING] * admitted + [JobStatus.QUEUED] * (5 - admitted)


def test_gpu_jobs_are_admitted_on_gpu_clusters(stores, tenant, settings):
    backend = FakeBackend(cpus=16, gpus=2)
    jobs = [
        _job(
            stores,
            tenant,
            f"gpu-{i}",
            resources={"workers": 1, "gpus_per_worker": 1},
            train={"global_batch_size": 16, "micro_batch_size": 4},
        )
        for i in range(3)
    ]
    Reconciler(stores, backend, settings.reconciler).tick()
    assert [stores.jobs.get_job(j.id).status for j in jobs] == [
        JobStatus.PENDING,
        JobStatus.PENDING,
        JobStatus.QUEUED,
    ]


# -- the launch request ----------------------------------------------------------


def test_launch_request_carries_the_spec_and_a_job_scoped_reporter_token(
    stores, tenant, backend, reconciler, settings
):
    job = _job(stores, tenant)
    other = _job(stores, tenant, "other")
    reconciler.tick()
    req = next(r for r in backend.submitted if r.job_id == job.id)
    assert req.submission_id == f"etrain-{job.id}-0"
    assert json.loads(req.spec_json) == job.spec.model_dump(mode="json", by_alias=True)
    assert parse_spec(json.loads(req.spec_json)).name == "tiny"  # the worker re-validates it
    assert req.env["ETRAIN_REPORT_URL"] == settings.report_url == "http://127.0.0.1:8123"
    principal = authenticate(stores.tokens, f"Bearer {req.env['ETRAIN_REPORT_TOKEN']}")
    assert principal == Principal(tenant_id=tenant, role="reporter", job_id=job.id)
    other_req = next(r for r in backend.submitted if r.job_id == other.id)
    assert other_req.env["ETRAIN_REPORT_TOKEN"] != req.env["ETRAIN_REPORT_TOKEN"]


SERVICE_SECRETS = {
    "ETRAIN_ADMIN_TOKEN": "et_admin-secret",
    "AWS_ACCESS_KEY_ID": "AKIASERVICE000000001",
    "AWS_SECRET_ACCESS_KEY": "service-secret",
    "ETRAIN_SECRET_ACME_ACCESS_KEY_ID": "AKIAACME000000000001",
    "ETRAIN_SECRET_ACME_SECRET_ACCESS_KEY": "acme-secret",
    "ETRAIN_SECRET_TEAMB_ACCESS_KEY_ID": "AKIATEAMB00000000001",
    "ETRAIN_SECRET_TEAMB_SECRET_ACCESS_KEY": "team-b-secret",
}


def test_a_jobs_ray_env_holds_only_its_own_storage_keys(
    stores, tenant, backend, reconciler, monkeypatch
):
    from service.backends.ray_jobs import RayJobBackend

    for name, value in SERVICE_SECRETS.items():
        monkeypatch.setenv(name, value)
    job = _job(
        stores,
        tenant,
        checkpoint={"storage": "s3://acme-bucket/ckpt"},
        stores={"s3": {"credentials_secret": "acme"}},
    )
    reconciler.tick()
    req = backend.submitted[0]
    assert req.job_id == job.id
    assert sorted(req.env) == [
        "ETRAIN_REPORT_TOKEN",
        "ETRAIN_REPORT_URL",
        "ETRAIN_SECRET_ACME_ACCESS_KEY_ID",
        "ETRAIN_SECRET_ACME_SECRET_ACCESS_KEY",
        "ETRAIN_STORAGE_ROOTS",
        "RAY_TRAIN_ENABLE_STATE_TRACKING",
    ]
    # The folders the job may open are its tenant's, from the access policy (not the spec).
    roots = json.loads(req.env["ETRAIN_STORAGE_ROOTS"])
    name = stores.tokens.get_tenant(tenant).name
    assert roots["write"] and all(p.endswith(f"/checkpoints/{name}") for p in roots["write"])
    assert any(p.endswith(f"/tenants/{name}") for p in roots["read"])

    # What Ray's job API is handed: that, and which job to run; nothing of the service's.
    class Client:
        def submit_job(self, **kwargs):
            self.kwargs = kwargs

    ray = RayJobBackend("http://ray.test:8265")
    ray._client = client = Client()
    ray.submit(req)
    sent = client.kwargs["runtime_env"]["env_vars"]
    assert set(sent) == {*req.env, "ETRAIN_JOB_ID", "ETRAIN_JOB_SPEC"}
    assert not {"acme-secret", "AKIAACME000000000001"} ^ {
        v for k, v in sent.items() if k.startswith("ETRAIN_SECRET_")
    }


def test_drivers_record_their_train_runs_for_the_dashboard(stores, tenant, backend, reconciler):
    """Ray's dashboard lists Train runs only for drivers with state tracking on."""
    _job(stores, tenant)
    reconciler.tick()
    (req,) = backend.submitted
    assert req.env["RAY_TRAIN_ENABLE_STATE_TRACKING"] == "1"


# -- following submitted jobs ----------------------------------------------------------

FOLLOW = {
    "pending": (RunStatus(RunState.PENDING), JobStatus.PENDING, None),
    "running": (RunStatus(RunState.RUNNING), JobStatus.RUNNING, None),
    "succeeded": (RunStatus(RunState.SUCCEEDED, "done"), JobStatus.SUCCEEDED, None),
    "failed": (
        RunStatus(
            RunState.FAILED, "Traceback ...\nRuntimeError: boom", exit_code=EXIT_TRAINING_FAILED
        ),
        JobStatus.FAILED,
        "RuntimeError: boom",
    ),
    "stopped": (RunStatus(RunState.STOPPED), JobStatus.FAILED, "stopped outside etrain"),
}


@pytest.mark.parametrize(
    ("run_status", "expected", "error"), list(FOLLOW.values()), ids=list(FOLLOW)
)
def test_backend_status_maps_to_job_status(
    stores, tenant, backend, reconciler, run_status, expected, error
):
    job = _job(stores, tenant)
    reconciler.tick()
    token = backend.submitted[0].env["ETRAIN_REPORT_TOKEN"]
    backend.statuses[f"etrain-{job.id}-0"] = run_status
    reconciler.tick()

    got = stores.jobs.get_job(job.id)
    assert got.status is expected
    if error is None:
        assert got.error is None
    else:
        assert error in got.error
    if expected.terminal:
        assert got.finished_at is not None
        assert _kinds(stores, job.id)[-1] == (
            "succeeded" if expected is JobStatus.SUCCEEDED else "failed"
        )
        with pytest.raises(Unauthorized):  # the job's reporter token died with it
            authenticate(stores.tokens, f"Bearer {token}")
    else:
        assert got.finished_at is None
        assert authenticate(stores.tokens, f"Bearer {token}").job_id == job.id
    if expected is JobStatus.RUNNING:
        assert got.started_at is not None and _kinds(stores, job.id)[-1] == "started"


@pytest.mark.parametrize("state", [RunState.SUCCEEDED, RunState.FAILED])
def test_running_job_finishes(stores, tenant, backend, reconciler, state):
    job = _job(stores, tenant)
    reconciler.tick()
    backend.statuses[f"etrain-{job.id}-0"] = RunStatus(RunState.RUNNING)
    reconciler.tick()
    started = stores.jobs.get_job(job.id).started_at
    backend.statuses[f"etrain-{job.id}-0"] = RunStatus(state, "bye", exit_code=EXIT_TRAINING_FAILED)
    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert got.status.value == state.value
    assert got.started_at == started and got.finished_at >= started
    reconciler.tick()  # a finished job is no longer followed
    assert stores.jobs.get_job(job.id) == got


def test_long_failure_messages_keep_their_tail(stores, tenant, backend, reconciler):
    job = _job(stores, tenant)
    reconciler.tick()
    backend.statuses[f"etrain-{job.id}-0"] = RunStatus(
        RunState.FAILED, "x" * 5000 + "END", exit_code=EXIT_TRAINING_FAILED
    )
    reconciler.tick()
    error = stores.jobs.get_job(job.id).error
    assert len(error) == 2000 and error.endswith("END")


def test_running_is_not_restarted_by_repeated_polls(stores, tenant, backend, reconciler):
    job = _job(stores, tenant)
    reconciler.tick()
    backend.statuses[f"etrain-{job.id}-0"] = RunStatus(RunState.RUNNING)
    for _ in range(3):
        reconciler.tick()
    assert _kinds(stores, job.id).count("started") == 1
    assert len(backend.submitted) == 1


# -- races and failures -----------------------------------------------------------


def test_job_cancelled_during_submit_has_its_submission_stopped(
    stores, tenant, backend, reconciler, settings
):
    job = _job(stores, tenant)
    lifecycle = Lifecycle(stores, backend)
    user = Principal(tenant_id=tenant, role="user")
    backend.on_submit = lambda req: lifecycle.cancel(user, req.job_id)
    reconciler.tick()

    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.CANCELLED
    assert backend.stopped == [f"etrain-{job.id}-0"]
    assert got.submission_id is None
    with pytest.raises(Unauthorized):
        authenticate(stores.tokens, f"Bearer {backend.submitted[0].env['ETRAIN_REPORT_TOKEN']}")


NO_AGENT = BackendUnavailable(
    "Ray's job API cannot take job j-1 now: Request failed with status code 500: "
    "No available agent to submit job, please try again later.."
)


def test_backend_unavailable_on_submit_requeues(stores, tenant, backend, reconciler, clock):
    job = _job(stores, tenant)
    backend.submit_error = BackendUnavailable("ray head unreachable")
    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.QUEUED and got.submission_id is None
    requeued = [e for e in stores.events.list_events(job.id) if e.kind == "requeued"]
    assert len(requeued) == 1 and "ray head unreachable" in requeued[0].message

    backend.submit_error = None
    clock.now += 1
    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.PENDING
    assert got.submission_id == f"etrain-{job.id}-0"  # the same idempotent id


def test_a_transient_submit_error_is_retried_with_backoff_until_ray_takes_the_job(
    stores, tenant, backend, reconciler, clock
):
    job = _job(stores, tenant)
    backend.submit_failures = [NO_AGENT, NO_AGENT, NO_AGENT]
    waits = []
    for _ in range(3):
        reconciler.tick()
        got = stores.jobs.get_job(job.id)
        assert got.status is JobStatus.QUEUED and got.error is None
        event = [e for e in stores.events.list_events(job.id) if e.kind == "requeued"][-1]
        assert "No available agent" in event.message
        waits.append(event.data["retry_in_s"])
        calls = backend.submit_calls
        reconciler.tick()  # still backing off: not tried again, not admitted
        assert backend.submit_calls == calls
        assert stores.jobs.get_job(job.id).status is JobStatus.QUEUED
        clock.now += event.data["retry_in_s"]
    assert waits == [1, 2, 4]  # doubling

    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.PENDING and got.submission_id == f"etrain-{job.id}-0"
    assert backend.submit_calls == 4 and len(backend.submitted) == 1
    assert _kinds(stores, job.id)[-2:] == ["admitted", "submitted"]


def test_a_cluster_that_keeps_turning_the_job_away_fails_it_after_submit_retry_s(
    stores, tenant, backend, tmp_path, clock
):
    settings = Settings(env="development", data_dir=tmp_path, submit_retry_s=60)
    reconciler = Reconciler(stores, backend, settings.reconciler, clock=clock)
    job = _job(stores, tenant)
    backend.submit_error = NO_AGENT
    for _ in range(50):
        reconciler.tick()
        if stores.jobs.get_job(job.id).status is JobStatus.FAILED:
            break
        clock.now += 5
    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.FAILED
    assert "did not accept the job within 60s" in got.error and "No available agent" in got.error
    # Bounded tries (1, 2, 4, 8, 16, 30 s apart), and a try that may have reached Ray is stopped.
    assert 5 <= backend.submit_calls <= 8
    assert backend.stopped == [f"etrain-{job.id}-0"]
    assert _live_reporter_tokens(stores, job.id) == 0


def _live_reporter_tokens(stores: Stores, job_id: str) -> int:
    """Unrevoked reporter tokens of one job, counted around the store."""
    engine = sa.create_engine(stores.url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT count(*) FROM api_tokens WHERE job_id = :j AND revoked_at IS NULL"),
                {"j": job_id},
            ).scalar_one()
    finally:
        engine.dispose()


def test_retried_submissions_keep_at_most_one_live_reporter_token(
    stores, tenant, backend, reconciler, clock
):
    # At most one, not zero: a submit that timed out may still have reached Ray, and that
    # driver (found again by its idempotent submission id) reports with the first token.
    job = _job(stores, tenant)
    backend.submit_error = BackendUnavailable("ray head unreachable")
    for _ in range(3):
        reconciler.tick()
        clock.now += 30
    assert backend.submit_calls == 3
    assert stores.jobs.get_job(job.id).status is JobStatus.QUEUED
    assert _live_reporter_tokens(stores, job.id) <= 1


def test_backend_refusing_a_submission_fails_the_job(stores, tenant, backend, reconciler):
    job = _job(stores, tenant)
    backend.submit_error = BackendError("runtime_env rejected")
    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert backend.submit_calls == 1  # a refusal is not tried again
    assert got.status is JobStatus.FAILED and got.finished_at is not None
    assert "submission refused" in got.error and "runtime_env rejected" in got.error


def test_backend_unavailable_while_following_admits_nothing(stores, tenant, backend, reconciler):
    active = _job(stores, tenant, "active")
    reconciler.tick()
    queued = _job(
        stores,
        tenant,
        "queued",
        resources={"workers": 1},
        train={"global_batch_size": 16, "micro_batch_size": 4},
    )
    backend.status_error = BackendUnavailable("down")
    reconciler.tick()
    assert stores.jobs.get_job(active.id).status is JobStatus.PENDING
    assert stores.jobs.get_job(queued.id).status is JobStatus.QUEUED
    assert len(backend.submitted) == 1

    backend.status_error = None
    reconciler.tick()
    assert stores.jobs.get_job(queued.id).status is JobStatus.PENDING


def test_a_cluster_that_stops_answering_is_an_event_once_per_outage(
    stores, tenant, backend, reconciler, clock
):
    job = _submitted(stores, _job(stores, tenant))
    backend.status_error = BackendUnavailable("connection refused")
    reconciler.tick()  # a blip is no event
    clock.now += 4
    reconciler.tick()
    assert "cluster_unreachable" not in _kinds(stores, job.id)
    clock.now += 2
    reconciler.tick()
    clock.now += 10
    reconciler.tick()
    (event,) = [e for e in stores.events.list_events(job.id) if e.kind == "cluster_unreachable"]
    assert event.message.startswith("the Ray cluster has not answered for 6s (connection refused)")
    backend.status_error = None
    reconciler.tick()  # back: followed as before; a new outage is a new event
    backend.status_error = BackendUnavailable("timed out")
    for _ in range(2):
        reconciler.tick()
        clock.now += 6
    assert _kinds(stores, job.id).count("cluster_unreachable") == 2
    assert stores.jobs.get_job(job.id).status is JobStatus.PENDING  # nothing else changed


def test_admitted_but_unsubmitted_job_is_submitted_on_the_next_tick(
    stores, tenant, backend, reconciler
):
    # The service stopped between admission (PENDING) and submission.
    job = _job(stores, tenant)
    stores.jobs.update_job(job.id, status=JobStatus.PENDING)
    reconciler.tick()
    assert [r.job_id for r in backend.submitted] == [job.id]
    assert stores.jobs.get_job(job.id).submission_id == f"etrain-{job.id}-0"


def test_background_loop_ticks_until_stopped(stores, tenant, backend, reconciler):
    job = _job(stores, tenant)
    reconciler.start()
    try:
        deadline = time.monotonic() + 10
        while (
            stores.jobs.get_job(job.id).status is JobStatus.QUEUED and time.monotonic() < deadline
        ):
            time.sleep(0.01)
    finally:
        reconciler.stop()
    assert stores.jobs.get_job(job.id).status is JobStatus.PENDING
    submitted = len(backend.submitted)
    _job(stores, tenant, "after-stop")
    time.sleep(0.05)
    assert len(backend.submitted) == submitted  # no ticks after stop()


def test_background_loop_survives_a_failing_tick(stores, tenant, backend, reconciler):
    job = _job(stores, tenant)
    reconciler.tick()
    backend.status_error = RuntimeError("unexpected")
    reconciler.start()
    try:
        time.sleep(0.05)
        backend.status_error = None
        backend.statuses[f"etrain-{job.id}-0"] = RunStatus(RunState.SUCCEEDED)
        deadline = time.monotonic() + 10
        while not stores.jobs.get_job(job.id).status.terminal and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        reconciler.stop()
    assert stores.jobs.get_job(job.id).status is JobStatus.SUCCEEDED


# -- job-level recovery ----------------------------------------------------------------


@pytest.mark.parametrize(
    "lost",
    [
        RunStatus(RunState.MISSING, "no such job"),
        RunStatus(RunState.FAILED, "killed", exit_code=-9),
        RunStatus(RunState.FAILED, "supervisor died"),
    ],
    ids=["head-restarted", "driver-killed", "supervisor-lost"],
)
def test_a_lost_driver_is_resubmitted_until_the_budget_is_spent(
    stores, tenant, backend, reconciler, lost
):
    job = _job(stores, tenant)
    reconciler.tick()
    for n in (1, 2):  # the default failure.max_resubmits is 2
        backend.statuses[f"etrain-{job.id}-{n - 1}"] = lost
        reconciler.tick()
        got = stores.jobs.get_job(job.id)
        assert got.status is JobStatus.PENDING and got.resubmits == n
        assert got.submission_id == f"etrain-{job.id}-{n}"
        assert backend.submitted[-1].submission_id == f"etrain-{job.id}-{n}"
        assert _kinds(stores, job.id)[-2:] == ["resubmitted", "submitted"]
    backend.statuses[f"etrain-{job.id}-2"] = lost
    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.FAILED and got.resubmits == 2
    assert len(backend.submitted) == 3


def test_a_lost_head_resubmits_every_submitted_job_once_it_is_back(
    stores, tenant, backend, reconciler
):
    """The embedded head died: each submitted job's attempt is lost at once (an event that
    says why), counted against its budget, and submitted again only on the head that came
    back; a job with no budget left fails; a queued one waits."""
    running = _submitted(stores, _job(stores, tenant, "running"))
    spent = _submitted(stores, _job(stores, tenant, "spent", failure={"max_resubmits": 0}))
    queued = _job(stores, tenant, "queued", resources={"workers": 2})
    backend.head_gone = "the embedded Ray head stopped (exit code 1)"
    backend.restart_failures = 1
    reconciler.tick()  # the restart fails: nothing is submitted to a head that is not there
    got = stores.jobs.get_job(running.id)
    assert (got.status, got.resubmits, got.submission_id) == (JobStatus.PENDING, 1, None)
    resubmitted = stores.events.list_events(running.id)[-1]
    assert resubmitted.kind == "resubmitted"
    assert resubmitted.message == (
        "the embedded Ray head stopped (exit code 1); resubmitting (1/2)"
    )
    assert resubmitted.data == {"previous_submission": f"etrain-{running.id}-0"}
    failed = stores.jobs.get_job(spent.id)
    assert failed.status is JobStatus.FAILED
    assert "failure.max_resubmits (0) already used" in failed.error
    assert backend.submitted == [] and stores.jobs.get_job(queued.id).status is JobStatus.QUEUED
    reconciler.tick()  # the head is back: the lost job goes first, then admission
    assert backend.restarts == 2
    assert backend.submitted[0].submission_id == f"etrain-{running.id}-1"
    reconciler.tick()
    assert _kinds(stores, running.id).count("resubmitted") == 1  # once per loss


def test_a_training_failure_is_not_resubmitted(stores, tenant, backend, reconciler):
    job = _job(stores, tenant)
    reconciler.tick()
    backend.statuses[f"etrain-{job.id}-0"] = RunStatus(
        RunState.FAILED, "etrain: training failed: ValueError", exit_code=EXIT_TRAINING_FAILED
    )
    reconciler.tick()
    got = stores.jobs.get_job(job.id)
    assert got.status is JobStatus.FAILED and got.resubmits == 0
    assert len(backend.submitted) == 1


def test_exit_code_contract_matches_the_driver():
    import workers.launch

    assert workers.launch.EXIT_TRAINING_FAILED == EXIT_TRAINING_FAILED


# -- Ray's job API: what is a refusal, what is worth another try ---------------------------


class _JobClient:
    """Ray's JobSubmissionClient, answering every submit with one error."""

    def __init__(self, error: Exception):
        self.error = error

    def submit_job(self, **_):
        raise self.error


def _ray_submit(error: Exception) -> str:
    from service.backends.base import LaunchRequest
    from service.backends.ray_jobs import RayJobBackend

    backend = RayJobBackend("http://ray.test:8265")
    backend._client = _JobClient(error)
    req = LaunchRequest(job_id="j-1", submission_id="etrain-j-1-0", spec_json="{}")
    return backend.submit(req)


@pytest.mark.parametrize(
    "answer",
    [
        "Request failed with status code 500: No available agent to submit job, please "
        "try again later..",
        "Request failed with status code 503: Service Unavailable.",
        "Request failed with status code 429: Too Many Requests.",
    ],
)
def test_ray_job_api_errors_worth_another_try_are_unavailable(answer):
    with pytest.raises(BackendUnavailable, match="cannot take job j-1 now"):
        _ray_submit(RuntimeError(answer))
    with pytest.raises(BackendUnavailable):
        _ray_submit(ConnectionError("Connection refused"))


@pytest.mark.parametrize(
    "answer",
    [
        "Request failed with status code 400: runtime_env: invalid env_vars.",
        # The head wraps its agent's answer: the agent's 400 is the refusal.
        "Request failed with status code 500: Traceback ...\nRuntimeError: Request failed "
        "with status code 400: ValueError: invalid runtime_env.",
    ],
)
def test_ray_job_api_refusals_are_backend_errors(answer):
    with pytest.raises(BackendError, match="Ray refused job j-1"):
        _ray_submit(RuntimeError(answer))


def test_a_submission_ray_already_has_is_not_an_error():
    already = "Request failed with status code 500: ... Job with submission_id etrain-j-1-0 "
    url = _ray_submit(RuntimeError(already + "already exists. Please use a different one."))
    assert url.endswith("/#/jobs/etrain-j-1-0")


def test_ray_readiness_needs_the_head_agent_serving_http(monkeypatch):
    import httpx

    from service.backends.ray_jobs import RayJobBackend

    agent_port = {"value": -1}

    def get(url, **_):
        if url.endswith("/api/version"):
            return httpx.Response(200, json={"version": "4"})
        raylet = {
            "isHeadNode": True,
            "state": "ALIVE",
            "nodeManagerAddress": "10.0.0.1",
            "dashboardAgentListenPort": agent_port["value"],
        }
        return httpx.Response(
            200, json={"data": {"summary": [{"raylet": raylet}]}}, request=httpx.Request("GET", url)
        )

    monkeypatch.setattr(httpx, "get", get)
    backend = RayJobBackend("http://ray.test:8265")
    assert "dashboard agent serves no HTTP" in backend.not_ready()
    agent_port["value"] = 52365
    assert backend.not_ready() is None


class _Head:
    """An embedded head that stops when told and comes back on other ports."""

    def __init__(self):
        self.code: int | None = None

    def exited(self) -> int | None:
        return self.code

    def restart(self) -> str:
        self.code = None
        return "http://127.0.0.1:9999/"


def test_a_stopped_embedded_head_is_restarted_and_followed_at_its_address():
    from service.backends.ray_jobs import RayJobBackend
    from service.backends.standby import StandbyDrivers

    head = _Head()
    backend = RayJobBackend("http://127.0.0.1:8265", head=head)
    backend.standby = StandbyDrivers(
        lambda sid, env: None, lambda sid: None, count=1, workers=0, report_url=""
    )
    backend.standby.keep()
    backend._client = object()
    assert backend.head_lost() is None and backend.standby.status().idle == 1
    head.code = 1
    assert backend.head_lost() == (
        "the embedded Ray head stopped (exit code 1; its log: ray-head.log)"
    )
    backend.restart_head()
    assert backend.address == "http://127.0.0.1:9999" and backend._client is None
    assert backend.head_lost() is None
    assert backend.standby.status().idle == 0  # its standby went with the old head
    with pytest.raises(BackendUnavailable):  # another cluster's head: nothing to restart
        RayJobBackend("http://ray.test:8265").restart_head()
    assert RayJobBackend("http://ray.test:8265").head_lost() is None
