"""The stores and migrations, run against SQLite and PostgreSQL (the ``store_url`` fixture)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.errors import JobNotFound, QuotaExceeded
from service.status import JobStatus
from service.store import Stores, head_revision, migrate
from service.store import jobs as jobs_module
from service.store.models import Base
from workers.contract import EventKind
from workers.spec import JobSpec

TABLES = {"tenants", "api_tokens", "jobs", "job_events", "job_metrics", "job_checkpoints"}
SPEC = JobSpec.model_validate({"name": "tiny", "resources": {"workers": 2}})


@pytest.fixture
def tenant(stores):
    """One tenant's id."""
    return stores.tokens.create_tenant("acme").id


def _count(url: str, table: str, job_id: str | None = None) -> int:
    """Count rows of ``table`` (of one job when given), bypassing the store."""
    engine = sa.create_engine(url)
    try:
        query = f"SELECT count(*) FROM {table}"
        params = {}
        if job_id is not None:
            query += " WHERE job_id = :job_id"
            params["job_id"] = job_id
        with engine.connect() as conn:
            return conn.execute(sa.text(query), params).scalar_one()
    finally:
        engine.dispose()


def test_migrate_creates_schema_and_is_idempotent(store_url):
    migrate(store_url)
    migrate(store_url)
    engine = sa.create_engine(store_url)
    try:
        assert set(sa.inspect(engine).get_table_names()) >= TABLES
        with engine.connect() as conn:
            assert conn.execute(
                sa.text("SELECT version_num FROM alembic_version")
            ).scalars().all() == [head_revision()]
            # The migration history and the models describe the same schema.
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_create_get_and_tenant_isolation(stores, tenant):
    other = stores.tokens.create_tenant("globex").id
    job = stores.jobs.create_job(
        tenant_id=tenant, name="tiny", spec=SPEC, min_workers=2, warnings=["w"]
    )
    assert job.id.startswith("j-") and len(job.id) == 14
    assert job.status is JobStatus.QUEUED and job.step == 0 and job.restarts == 0

    got = stores.jobs.get_job(job.id, tenant_id=tenant)
    assert got == job
    assert got.spec == SPEC and got.warnings == ["w"]
    assert got.created_at.tzinfo is not None and got.created_at.utcoffset() == dt.timedelta(0)
    with pytest.raises(JobNotFound):
        stores.jobs.get_job(job.id, tenant_id=other)
    with pytest.raises(JobNotFound):
        stores.jobs.get_job("j-000000000000")
    assert stores.jobs.list_jobs(tenant_id=other) == []
    assert [e.kind for e in stores.events.list_events(job.id)] == ["submitted"]


def test_spec_is_stored_as_json_with_its_aliases(stores, store_url, tenant):
    spec = JobSpec.model_validate({"name": "tiny", "checkpoint": {"async": True}})
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=spec, min_workers=2)
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            stored = conn.execute(sa.select(Base.metadata.tables["jobs"].c.spec)).scalar_one()
    finally:
        engine.dispose()
    assert stored == spec.model_dump(mode="json", by_alias=True)
    assert stored["checkpoint"]["async"] is True and "async_" not in stored["checkpoint"]
    assert stores.jobs.get_job(job.id).spec == spec


def test_tenants_and_tokens(stores, tenant):
    assert stores.tokens.get_tenant_by_name("acme").id == tenant
    assert stores.tokens.get_tenant_by_name("nobody") is None
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    token = stores.tokens.add_token(tenant_id=tenant, token_hash="a" * 64, name="ci", role="user")
    reporter = stores.tokens.add_token(
        tenant_id=tenant, token_hash="b" * 64, name="rep", role="reporter", job_id=job.id
    )
    assert stores.tokens.find_token("a" * 64) == token
    assert stores.tokens.find_token("b" * 64).job_id == job.id
    assert stores.tokens.find_token("c" * 64) is None
    with pytest.raises(ValueError, match="role"):
        stores.tokens.add_token(tenant_id=tenant, token_hash="d" * 64, name="x", role="root")
    assert reporter.revoked_at is None


def test_list_pagination_and_status_filter(stores, tenant):
    ids = [
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1).id
        for i in range(5)
    ]
    assert stores.jobs.update_job(ids[1], status=JobStatus.PENDING) is not None

    assert [j.id for j in stores.jobs.list_jobs(tenant_id=tenant)] == ids[::-1]
    assert [j.id for j in stores.jobs.list_jobs(tenant_id=tenant, limit=2, offset=1)] == [
        ids[3],
        ids[2],
    ]
    assert stores.jobs.count_jobs(tenant_id=tenant) == 5
    queued = stores.jobs.list_jobs(tenant_id=tenant, statuses={JobStatus.QUEUED})
    assert [j.id for j in queued] == [ids[4], ids[3], ids[2], ids[0]]
    assert stores.jobs.count_jobs(statuses=[JobStatus.PENDING]) == 1
    assert stores.jobs.count_jobs(statuses=[JobStatus.RUNNING]) == 0


def test_fifo_order(stores, tenant):
    ids = [
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1).id
        for i in range(4)
    ]
    stores.jobs.update_job(ids[2], status=JobStatus.CANCELLED)
    fifo = stores.jobs.list_jobs_fifo({JobStatus.QUEUED, JobStatus.PENDING})
    assert [j.id for j in fifo] == [ids[0], ids[1], ids[3]]


def test_list_queue_reads_what_the_scheduler_needs_oldest_first(stores, tenant):
    spec = JobSpec.model_validate(
        {"name": "g", "resources": {"workers": 4, "cpus_per_worker": 0.5, "gpus_per_worker": 2}}
    )
    first = stores.jobs.create_job(tenant_id=tenant, name="a", spec=SPEC, min_workers=2)
    second = stores.jobs.create_job(tenant_id=tenant, name="g", spec=spec, min_workers=4)
    stores.jobs.update_job(first.id, status=JobStatus.RUNNING)
    entries = stores.jobs.list_queue({JobStatus.QUEUED, JobStatus.RUNNING})
    assert [(e.id, e.tenant, e.status) for e in entries] == [
        (first.id, "acme", JobStatus.RUNNING),
        (second.id, "acme", JobStatus.QUEUED),
    ]
    assert (entries[0].min_workers, entries[0].cpus_per_worker, entries[0].gpus_per_worker) == (
        2,
        1.0,
        0,
    )
    assert (entries[1].cpus_per_worker, entries[1].gpus_per_worker) == (0.5, 2)
    assert entries[1].created_at == second.created_at
    assert stores.jobs.list_queue({JobStatus.CANCELLED}) == []
    assert stores.jobs.tenant_name(tenant) == "acme" and stores.jobs.tenant_name("t-none") == ""


def test_the_queue_reads_each_jobs_entry_once_and_sees_every_write(stores, tenant, monkeypatch):
    """The scheduler reads the queue at every tick: a job's entry is read once, its status
    at every call, and what another replica wrote is seen at once."""
    from service.store import queue_reads

    def submit(store: Stores, name: str) -> str:
        return store.jobs.create_job(tenant_id=tenant, name=name, spec=SPEC, min_workers=1).id

    ids = [submit(stores, f"j{i}") for i in range(3)]
    read = []
    real = queue_reads.QueueEntry
    monkeypatch.setattr(queue_reads, "QueueEntry", lambda **v: read.append(v["id"]) or real(**v))
    both = {JobStatus.QUEUED, JobStatus.RUNNING}
    assert [e.id for e in stores.jobs.list_queue({JobStatus.QUEUED})] == ids
    assert [e.id for e in stores.jobs.list_queue(both)] == ids
    assert sorted(read) == sorted(ids * 2)  # once per status set asked for
    read.clear()
    replica = Stores.open(stores.url)
    try:
        ids.append(submit(replica, "j3"))
        replica.jobs.update_job(ids[0], status=JobStatus.RUNNING)
        replica.jobs.update_job(ids[1], status=JobStatus.CANCELLED)
    finally:
        replica.close()
    queued = stores.jobs.list_queue({JobStatus.QUEUED})
    assert [e.id for e in queued] == ids[2:] and read == [ids[3]]
    active = stores.jobs.list_queue(both)
    assert [(e.id, e.status) for e in active] == [
        (ids[0], JobStatus.RUNNING),
        (ids[2], JobStatus.QUEUED),
        (ids[3], JobStatus.QUEUED),
    ]
    assert read == [ids[3]] * 2
    fresh = Stores.open(stores.url)  # nothing kept: every entry read whole
    try:
        assert fresh.jobs.list_queue(both) == active
    finally:
        fresh.close()


def test_queued_quota_holds_under_concurrent_submits(stores, tenant):
    for i in range(3):
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1)
    other = stores.tokens.create_tenant("other").id
    outcomes: list[str] = []

    def submit(n: int) -> None:
        try:
            stores.jobs.create_job(
                tenant_id=tenant, name=f"c{n}", spec=SPEC, min_workers=1, max_queued=5
            )
            outcomes.append("stored")
        except QuotaExceeded as e:
            assert "ETRAIN_MAX_QUEUED_JOBS_PER_TENANT" in str(e)
            outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 8 + ["stored"] * 2
    assert stores.jobs.count_jobs(tenant_id=tenant, statuses={JobStatus.QUEUED}) == 5
    # Jobs that left the queue do not count; other tenants have their own quota.
    stores.jobs.update_job(stores.jobs.list_jobs(tenant_id=tenant)[0].id, status=JobStatus.PENDING)
    stores.jobs.create_job(tenant_id=tenant, name="n", spec=SPEC, min_workers=1, max_queued=5)
    stores.jobs.create_job(tenant_id=other, name="o", spec=SPEC, min_workers=1, max_queued=5)
    with pytest.raises(QuotaExceeded):
        stores.jobs.create_job(tenant_id=tenant, name="x", spec=SPEC, min_workers=1, max_queued=5)
    with pytest.raises(QuotaExceeded, match="5 queued jobs, its quota of 5"):
        stores.jobs.check_queue_room(tenant, 5)
    stores.jobs.check_queue_room(tenant, 6)
    stores.jobs.check_queue_room(other, 5)


def test_pages_parse_each_spec_once_and_see_a_rewritten_spec(stores, tenant, monkeypatch):
    ids = [
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1).id
        for i in range(3)
    ]
    fresh = Stores.open(stores.url)  # another process: nothing cached yet
    parsed = []
    real = JobSpec.model_validate
    monkeypatch.setattr(
        jobs_module.JobSpec, "model_validate", lambda v: parsed.append(v) or real(v)
    )
    try:
        assert [j.spec for j in fresh.jobs.list_jobs(tenant_id=tenant)] == [SPEC] * 3
        assert len(parsed) == 3
        fresh.jobs.list_jobs(tenant_id=tenant)
        fresh.jobs.get_job(ids[0])
        assert len(parsed) == 3
        bigger = SPEC.model_copy(update={"name": "renamed"})
        fresh.jobs.update_job(ids[0], spec=bigger)
        assert fresh.jobs.get_job(ids[0]).spec.name == "renamed"
    finally:
        fresh.close()


def test_pages_build_each_record_once_and_see_every_write(stores, tenant, monkeypatch):
    """Records are kept as of their updated_at: a page builds only the new or changed ones,
    and a write by another replica (another store on the database) is seen at once."""
    ids = [
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1).id
        for i in range(3)
    ]
    built = []
    real = jobs_module._job_record
    monkeypatch.setattr(jobs_module, "_job_record", lambda v: built.append(v["id"]) or real(v))
    assert [j.id for j in stores.jobs.list_jobs(tenant_id=tenant)] == ids[::-1]
    assert sorted(built) == sorted(ids)
    built.clear()
    stores.jobs.page_jobs(tenant_id=tenant)
    stores.jobs.get_job(ids[0])
    assert built == []
    replica = Stores.open(stores.url)
    try:
        replica.jobs.update_job(ids[1], step=7, latest_metrics={"step": 7, "world_size": 1})
    finally:
        replica.close()
    built.clear()  # the replica's own read-back
    page, total = stores.jobs.page_jobs(tenant_id=tenant)
    assert built == [ids[1]] and total == 3
    assert [(j.id, j.step) for j in page] == [(ids[2], 0), (ids[1], 7), (ids[0], 0)]
    assert stores.jobs.get_job(ids[1]).latest_metrics == {"step": 7, "world_size": 1}
    # The count rides on the page; past the end it is read on its own.
    assert stores.jobs.page_jobs(tenant_id=tenant, limit=2, offset=2)[1] == 3
    assert stores.jobs.page_jobs(tenant_id=tenant, offset=5) == ([], 3)
    assert stores.jobs.page_jobs(tenant_id=tenant, statuses=[JobStatus.RUNNING]) == ([], 0)


def test_compare_and_set(stores, tenant):
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    lost = stores.jobs.update_job(job.id, expect_status=JobStatus.PENDING, status=JobStatus.RUNNING)
    assert lost is None
    assert stores.jobs.get_job(job.id).status is JobStatus.QUEUED

    won = stores.jobs.update_job(
        job.id,
        expect_status=JobStatus.QUEUED,
        status=JobStatus.PENDING,
        submission_id="raysubmit_1",
        event=("admitted", "submitted to Ray", {"workers": 2}),
    )
    assert won.status is JobStatus.PENDING and won.submission_id == "raysubmit_1"
    assert won.updated_at >= job.updated_at
    events = stores.events.list_events(job.id)
    assert [e.kind for e in events] == ["submitted", "admitted"]
    assert events[1].data == {"workers": 2}
    with pytest.raises(JobNotFound):
        stores.jobs.update_job("j-000000000000", expect_status=JobStatus.QUEUED, step=1)
    with pytest.raises(TypeError):
        stores.jobs.update_job(job.id, tenant_id="t-other")


def test_a_submission_is_recorded_once(stores, tenant):
    """Two leaders (one paused mid-write, then its successor) record the same submission:
    the second write finds one recorded and changes nothing, its event included."""
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    stores.jobs.update_job(job.id, status=JobStatus.PENDING)
    record = {
        "expect_status": JobStatus.PENDING,
        "expect_unsubmitted": True,
        "submission_id": f"etrain-{job.id}-0",
        "event": ("submitted", "submitted to Ray", None),
    }
    assert stores.jobs.update_job(job.id, **record).submission_id == f"etrain-{job.id}-0"
    assert stores.jobs.update_job(job.id, **record) is None
    kinds = [e.kind for e in stores.events.list_events(job.id)]
    assert kinds.count("submitted") == 2  # the job's own at create, and the one recorded


def test_compare_and_set_has_one_winner_under_concurrency(stores, tenant):
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    results = []

    def admit(n: int) -> None:
        results.append(
            stores.jobs.update_job(
                job.id,
                expect_status=JobStatus.QUEUED,
                status=JobStatus.PENDING,
                submission_id=f"s{n}",
                event=("admitted", f"by {n}", None),
            )
        )

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [r for r in results if r is not None]
    assert len(results) == 8 and len(winners) == 1
    assert stores.jobs.get_job(job.id).submission_id == winners[0].submission_id
    assert [e.kind for e in stores.events.list_events(job.id)].count("admitted") == 1


def test_create_job_failure_writes_nothing(stores, store_url, tenant, monkeypatch):
    with pytest.raises(sa.exc.IntegrityError):  # no such tenant: the job row itself is refused
        stores.jobs.create_job(tenant_id="t-000000000000", name="bad", spec=SPEC, min_workers=1)
    assert _count(store_url, "jobs") == 0 and _count(store_url, "job_events") == 0

    # Fail after the job row is written: the job insert must be rolled back too.
    def broken_event(*args, **kwargs):
        raise RuntimeError("event insert failed")

    monkeypatch.setattr(jobs_module, "insert_event", broken_event)
    with pytest.raises(RuntimeError):
        stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    assert _count(store_url, "jobs") == 0 and _count(store_url, "job_events") == 0


def test_event_dedup(stores, tenant):
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    assert (
        stores.events.add_event(job.id, kind="restored", message="from step 10", dedup_key="r-10")
        is True
    )
    assert (
        stores.events.add_event(job.id, kind="restored", message="from step 10", dedup_key="r-10")
        is False
    )
    # Without a key nothing is deduplicated.
    assert stores.events.add_event(job.id, kind="note", message="a") is True
    assert stores.events.add_event(job.id, kind="note", message="a") is True
    events = stores.events.list_events(job.id)
    assert [e.kind for e in events] == ["submitted", "restored", "note", "note"]
    assert [e.kind for e in stores.events.list_events(job.id, after_id=events[1].id, limit=1)] == [
        "note"
    ]
    with pytest.raises(JobNotFound):
        stores.events.add_event("j-000000000000", kind="x", message="y")


def test_add_events_stores_many_in_one_go_and_skips_known_keys(stores, tenant):
    jobs = [
        stores.jobs.create_job(tenant_id=tenant, name=f"j{i}", spec=SPEC, min_workers=1).id
        for i in range(3)
    ]
    stores.events.add_event(jobs[0], kind="waiting", message="old", dedup_key="waiting:x")
    stores.events.add_events(
        [(j, EventKind.WAITING, f"why {j}", {"reason": "x"}, "waiting:x") for j in jobs]
        + [(jobs[1], "note", "no key", None, None)] * 2
    )
    stores.events.add_events([])
    waiting = {
        j: [e.message for e in stores.events.list_events(j) if e.kind == "waiting"] for j in jobs
    }
    assert waiting == {jobs[0]: ["old"], jobs[1]: [f"why {jobs[1]}"], jobs[2]: [f"why {jobs[2]}"]}
    assert stores.events.list_events(jobs[2])[-1].data == {"reason": "x"}
    assert [e.kind for e in stores.events.list_events(jobs[1])].count("note") == 2


def _point(step: int, ts: float, loss: float, **extra) -> dict:
    """A metric point as a worker reports it."""
    return {
        "step": step,
        "ts": ts,
        "world_size": 2,
        "loss": loss,
        "lr": 1e-3,
        "samples_per_s": 100.0,
        "tokens_per_s": 12800.0,
        **extra,
    }


def test_metrics_upsert_replaces_recomputed_step(stores, tenant):
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    t0 = 1_700_000_000.0
    assert (
        stores.metrics.upsert_metrics(
            job.id, [_point(s, t0 + s, 5.0 - s / 10, grad_norm=1.5) for s in range(1, 6)]
        )
        == 5
    )
    current = stores.jobs.get_job(job.id)
    assert current.step == 5 and current.latest_metrics["loss"] == pytest.approx(4.5)
    assert current.latest_metrics["grad_norm"] == 1.5 and current.latest_metrics["ts"] == t0 + 5

    # Restored from step 3: steps 4.. are recomputed later and replace the old points.
    restored_at = dt.datetime.fromtimestamp(t0 + 100, tz=dt.UTC)
    assert stores.metrics.upsert_metrics(job.id, [_point(4, restored_at, 9.0)]) == 1
    points = stores.metrics.list_metrics(job.id)
    assert [p["step"] for p in points] == [1, 2, 3, 4, 5]
    assert (
        points[3]["loss"] == 9.0 and points[3]["ts"] == restored_at and "grad_norm" not in points[3]
    )
    assert points[0]["grad_norm"] == 1.5
    current = stores.jobs.get_job(job.id)
    assert current.step == 4 and current.latest_metrics["loss"] == 9.0

    # A replayed old batch does not move progress backwards.
    stores.metrics.upsert_metrics(job.id, [_point(2, t0 + 2, 4.8)])
    assert stores.jobs.get_job(job.id).step == 4
    assert [p["step"] for p in stores.metrics.list_metrics(job.id, after_step=3, limit=1)] == [4]
    with pytest.raises(JobNotFound):
        stores.metrics.upsert_metrics("j-000000000000", [_point(1, t0, 1.0)])


def test_latest_metrics_keep_the_newest_evaluation_until_a_restore_goes_back_past_it(
    stores, tenant
):
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    t0 = 1_700_000_000.0

    def latest():
        return stores.jobs.get_job(job.id).latest_metrics

    evals = {4: {"eval_loss": 3.5, "eval_perplexity": 33.1, "eval_s": 0.4, "eval_samples": 8}}
    batch = [_point(s, t0 + s, 5.0 - s / 10, **evals.get(s, {})) for s in range(1, 6)]
    stores.metrics.upsert_metrics(job.id, batch)
    got = latest()
    assert got["step"] == 5 and got["loss"] == pytest.approx(4.5)
    assert (got["eval_loss"], got["eval_perplexity"], got["eval_step"]) == (3.5, 33.1, 4)
    assert "eval_s" not in got and "eval_samples" not in got  # they describe step 4 only

    # Later batches without an evaluation carry it on; one with an evaluation replaces it,
    # and a perplexity that overflowed is not taken from the older one.
    stores.metrics.upsert_metrics(job.id, [_point(6, t0 + 6, 4.4), _point(7, t0 + 7, 4.3)])
    assert (latest()["step"], latest()["eval_loss"], latest()["eval_step"]) == (7, 3.5, 4)
    stores.metrics.upsert_metrics(
        job.id, [_point(8, t0 + 8, 4.2, eval_loss=800.0), _point(9, t0 + 9, 4.1)]
    )
    got = latest()
    assert (got["step"], got["eval_loss"], got["eval_step"]) == (9, 800.0, 8)
    assert "eval_perplexity" not in got
    stores.metrics.upsert_metrics(job.id, [_point(10, t0 + 10, 4.0, eval_loss=3.2)])
    assert (latest()["eval_loss"], latest()["eval_step"]) == (3.2, 10)
    # The stored point of the step that evaluated is left as it was sent.
    assert "eval_step" not in stores.metrics.list_metrics(job.id, after_step=9)[0]

    # A replayed old batch moves nothing.
    stores.metrics.upsert_metrics(job.id, [_point(4, t0 + 4, 4.6, **evals[4])])
    assert (latest()["step"], latest()["eval_loss"], latest()["eval_step"]) == (10, 3.2, 10)

    # Restored from step 6: step 7 recomputed later; the evaluation of step 10 is gone.
    stores.metrics.upsert_metrics(job.id, [_point(7, t0 + 100, 4.35)])
    got = latest()
    assert got["step"] == 7 and not {"eval_loss", "eval_perplexity", "eval_step"} & set(got)
    stores.metrics.upsert_metrics(job.id, [_point(8, t0 + 101, 4.25, eval_loss=3.3)])
    stores.metrics.upsert_metrics(job.id, [_point(9, t0 + 102, 4.15)])
    assert (latest()["step"], latest()["eval_loss"], latest()["eval_step"]) == (9, 3.3, 8)


def test_checkpoints(stores, tenant):
    job = stores.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    stores.metrics.upsert_checkpoint(job.id, step=20, uri="file:///c/20", bytes=2_000, save_s=0.5)
    stores.metrics.upsert_checkpoint(
        job.id, step=10, uri="file:///c/10", bytes=5_000_000_000, save_s=1.0, blocking_s=0.1
    )
    stores.metrics.upsert_checkpoint(job.id, step=20, uri="file:///c/20b", bytes=3_000, save_s=0.7)
    checkpoints = stores.metrics.list_checkpoints(job.id)
    assert [(c["step"], c["uri"], c["bytes"]) for c in checkpoints] == [
        (10, "file:///c/10", 5_000_000_000),
        (20, "file:///c/20b", 3_000),
    ]
    assert checkpoints[0]["blocking_s"] == 0.1 and checkpoints[1]["blocking_s"] is None
    assert stores.metrics.delete_checkpoint(job.id, 10) is True
    assert stores.metrics.delete_checkpoint(job.id, 10) is False
    assert [c["step"] for c in stores.metrics.list_checkpoints(job.id)] == [20]


def test_data_survives_restart(store_url):
    migrate(store_url)
    first = Stores.open(store_url)
    tenant = first.tokens.create_tenant("acme").id
    job = first.jobs.create_job(tenant_id=tenant, name="tiny", spec=SPEC, min_workers=1)
    first.jobs.update_job(job.id, status=JobStatus.PENDING, dashboard_url="http://127.0.0.1:8265")
    first.close()

    migrate(store_url)  # the service migrates on every start
    second = Stores.open(store_url)
    try:
        second.ping()
        again = second.jobs.get_job(job.id, tenant_id=tenant)
        assert again.status is JobStatus.PENDING and again.dashboard_url == "http://127.0.0.1:8265"
        assert [e.kind for e in second.events.list_events(job.id)] == ["submitted"]
    finally:
        second.close()


def test_a_tenants_quota_and_page_read_only_its_own_jobs(tmp_path):
    """The queued-jobs count at every submit and a page of GET /v1/jobs search an index
    that begins with the tenant (SQLite's plan for the store's own statements): with
    only ix_jobs_status the count read every queued job of every tenant."""
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    migrate(url)
    stores = Stores.open(url)
    statements: list[tuple[str, tuple]] = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    try:
        tenant = stores.tokens.create_tenant("acme").id
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
        try:
            stores.jobs.check_queue_room(tenant, 100)
            stores.jobs.list_jobs(tenant_id=tenant, limit=50)
            stores.jobs.count_jobs(tenant_id=tenant)
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    finally:
        stores.close()
    assert len(statements) == 3
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            for statement, parameters in statements:
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
                details = " ".join(row[-1] for row in plan.all())
                assert "INDEX ix_jobs_tenant_" in details, (statement, details)
                assert "TEMP B-TREE" not in details, (statement, details)
    finally:
        engine.dispose()
