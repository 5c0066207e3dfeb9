"""The ``jobs`` table: create, read, list and compare-and-set updates.

A job's ``spec`` is a :class:`workers.spec.JobSpec` on this side of the store
and its JSON (aliases included, as the workers read it) in the database.
Whether a status may follow another is not decided here: the domain checks
its rule, then updates with ``expect_status`` so a concurrent change makes the
write lose instead of slipping through.
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from sqlalchemy import bindparam, func, insert, select, update

from service.errors import JobNotFound, QuotaExceeded
from service.status import JobStatus
from service.store.database import Database
from service.store.job_pages import count_matching, page_keys, status_values
from service.store.models import JobRecord, QueueEntry, new_id, utcnow
from service.store.queue_reads import QueueReads
from service.store.tables import JOBS, TENANTS, insert_event, require_job
from workers.contract import EventKind
from workers.spec import JobSpec

# Columns update_job may not set: identity, ownership and bookkeeping the store owns.
_FROZEN_JOB_FIELDS = frozenset({"id", "tenant_id", "created_at", "updated_at"})
_UPDATABLE_JOB_FIELDS = frozenset(c.name for c in JOBS.columns) - _FROZEN_JOB_FIELDS
# (kind, message, data) of an event stored with an update.
NewEvent = tuple[str | enum.Enum, str, dict | None]


# Values go in as parameters: ``insert(JOBS).values(row)`` is keyed and compiled at each call.
_INSERT_JOB = insert(JOBS)


def _spec_json(spec: JobSpec) -> dict:
    """The stored form of a spec: JSON types, with the aliases the workers read (``async``)."""
    return spec.model_dump(mode="json", by_alias=True)


def _job_record(values: Any) -> JobRecord:
    """Convert a ``jobs`` row (or the values just inserted) into a JobRecord."""
    values = dict(values)
    values["status"] = JobStatus(values["status"])
    if not isinstance(values["spec"], JobSpec):
        values["spec"] = JobSpec.model_validate(values["spec"])
    return JobRecord(**values)


# Every column but the spec: pages of jobs read the spec through _SpecCache.
_NO_SPEC = [c for c in JOBS.c if c.name != "spec"]
V = TypeVar("V")


class _Recent(Generic[V]):
    """Values by job id, the most recently used ``size`` of them (thread-safe)."""

    def __init__(self, size: int = 4096):
        self._size, self._lock = size, threading.Lock()
        self._values: OrderedDict[str, V] = OrderedDict()

    def get(self, job_id: str) -> V | None:
        with self._lock:
            value = self._values.get(job_id)
            if value is not None:
                self._values.move_to_end(job_id)
            return value

    def put(self, job_id: str, value: V) -> None:
        with self._lock:
            self._values[job_id] = value
            self._values.move_to_end(job_id)
            while len(self._values) > self._size:
                self._values.popitem(last=False)

    def drop(self, job_id: str) -> None:
        with self._lock:
            self._values.pop(job_id, None)


def _column_values(fields: dict[str, Any]) -> dict[str, Any]:
    """update_job's fields as column values (statuses and specs in their stored form)."""
    unknown = set(fields) - _UPDATABLE_JOB_FIELDS
    if unknown:
        raise TypeError(f"update_job cannot set {sorted(unknown)}")
    values = dict(fields)
    if "status" in values:
        values["status"] = JobStatus(values["status"]).value
    if isinstance(values.get("spec"), JobSpec):
        values["spec"] = _spec_json(values["spec"])
    return values


_COUNT_QUEUED = (
    select(func.count())
    .select_from(JOBS)
    .where(JOBS.c.tenant_id == bindparam("tenant"), JOBS.c.status == JobStatus.QUEUED.value)
)
# A no-op write that locks the tenant's row (see JobStore._check_queue_quota).
_LOCK_TENANT = (
    update(TENANTS).where(TENANTS.c.id == bindparam("tenant")).values(name=TENANTS.c.name)
)


def _refuse_a_full_queue(conn: Any, tenant_id: str, max_queued: int) -> None:
    queued = conn.execute(_COUNT_QUEUED, {"tenant": tenant_id}).scalar_one()
    if queued >= max_queued:
        raise QuotaExceeded(
            f"this tenant has {queued} queued jobs, its quota of {max_queued} "
            "(ETRAIN_MAX_QUEUED_JOBS_PER_TENANT, or max_queued_jobs in the tenant's "
            "ETRAIN_TENANT_QUOTAS entry): wait until some start or cancel some, or ask "
            "the operator to raise it"
        )


class JobStore:
    """The ``jobs`` table. Every call is its own transaction; records are frozen values."""

    def __init__(self, db: Database):
        """Use the tables of ``db``."""
        self._db = db
        self._specs: _Recent[JobSpec] = _Recent()  # written once, at submit
        self._rows: _Recent[JobRecord] = _Recent()  # as of their updated_at
        self._tenant_names: dict[str, str] = {}
        self._queue = QueueReads(db)

    def _records(self, conn: Any, query: Any) -> list[JobRecord]:
        """The jobs ``query`` (a select of ``_NO_SPEC``) selects, in its order.

        A job's row changes only with its ``updated_at``, and its spec not at all, so the
        query reads each job's (id, updated_at) first and then the rows and specs of only
        the jobs not cached as they are now: building 50 records from their rows (dates,
        JSON) was most of a ``GET /v1/jobs``.
        """
        keys = conn.execute(query.with_only_columns(JOBS.c.id, JOBS.c.updated_at)).all()
        return self._records_of(conn, keys)

    def _records_of(self, conn: Any, keys: list[Any]) -> list[JobRecord]:
        """:meth:`_records` from the keys read (rows that begin with id, updated_at)."""
        records: dict[str, JobRecord | None] = {}
        for job_id, updated_at, *_ in keys:
            known = self._rows.get(job_id)
            records[job_id] = known if known and known.updated_at == updated_at else None
        missing = [job_id for job_id, record in records.items() if record is None]
        if missing:
            rows = conn.execute(select(*_NO_SPEC).where(JOBS.c.id.in_(missing))).all()
            specs = self._specs_of(conn, [row.id for row in rows])
            for row in rows:  # maybe newer than its key: a write between the two reads
                records[row.id] = _job_record({**row._mapping, "spec": specs[row.id]})
                self._rows.put(row.id, records[row.id])
        return [record for job_id, *_ in keys if (record := records[job_id]) is not None]

    def _specs_of(self, conn: Any, job_ids: list[str]) -> dict[str, JobSpec]:
        """The specs of ``job_ids``, reading and parsing only those not cached."""
        specs = {job_id: self._specs.get(job_id) for job_id in job_ids}
        missing = [job_id for job_id, spec in specs.items() if spec is None]
        if missing:
            stored = select(JOBS.c.id, JOBS.c.spec).where(JOBS.c.id.in_(missing))
            for job_id, raw in conn.execute(stored):
                specs[job_id] = JobSpec.model_validate(raw)
                self._specs.put(job_id, specs[job_id])
        return specs

    def create_job(
        self,
        *,
        tenant_id: str,
        name: str,
        spec: JobSpec,
        min_workers: int,
        warnings: list[str] | None = None,
        max_queued: int | None = None,
    ) -> JobRecord:
        """Store a new QUEUED job and its "submitted" event in one transaction.

        With ``max_queued``, QuotaExceeded (nothing stored) when the tenant already has
        that many QUEUED jobs; concurrent submits of one tenant cannot slip past it.
        """
        now = utcnow()
        values = {
            "id": new_id("j-"),
            "tenant_id": tenant_id,
            "name": name,
            "status": JobStatus.QUEUED.value,
            "spec": _spec_json(spec),
            "min_workers": min_workers,
            "world_size": None,
            "restarts": 0,
            "resubmits": 0,
            "step": 0,
            "submission_id": None,
            "dashboard_url": None,
            "error": None,
            "latest_metrics": None,
            "warnings": warnings,
            "created_at": now,
            "started_at": None,
            "finished_at": None,
            "updated_at": now,
        }
        with self._db.begin() as conn:
            if max_queued is not None:
                self._check_queue_quota(conn, tenant_id, max_queued)
            conn.execute(_INSERT_JOB, values)
            insert_event(
                self._db,
                conn,
                values["id"],
                EventKind.SUBMITTED,
                f"job {name} submitted",
                None,
                None,
            )
        # Built from what was stored (the spec is the model its JSON was dumped from, so it
        # is not parsed back), so it equals what get_job reads back.
        record = _job_record({**values, "spec": spec})
        self._specs.put(record.id, record.spec)
        return record

    @staticmethod
    def _check_queue_quota(conn: Any, tenant_id: str, max_queued: int) -> None:
        """Raise QuotaExceeded when ``tenant_id`` has ``max_queued`` QUEUED jobs.

        The no-op UPDATE of the tenant's row first takes a lock that a concurrent submit
        of the same tenant waits on (a row lock on PostgreSQL, the write lock on SQLite),
        so the count below cannot be stale when the insert follows it.
        """
        conn.execute(_LOCK_TENANT, {"tenant": tenant_id})
        _refuse_a_full_queue(conn, tenant_id, max_queued)

    def check_queue_room(self, tenant_id: str, max_queued: int) -> None:
        """QuotaExceeded now when ``tenant_id`` already has ``max_queued`` QUEUED jobs: a
        cheap early answer before planning and probing (``create_job`` decides)."""
        with self._db.connect() as conn:
            _refuse_a_full_queue(conn, tenant_id, max_queued)

    def tenant_name(self, tenant_id: str) -> str:
        """The name of tenant ``tenant_id`` ('' when there is none). A tenant's name never
        changes, so each is read once (read at every submit before)."""
        name = self._tenant_names.get(tenant_id)
        if name is None:
            with self._db.connect() as conn:
                name = conn.execute(
                    select(TENANTS.c.name).where(TENANTS.c.id == tenant_id)
                ).scalar_one_or_none()
            if name is None:
                return ""
            self._tenant_names[tenant_id] = name
        return name

    def list_queue(self, statuses: Iterable[JobStatus]) -> list[QueueEntry]:
        """Every job in ``statuses``, oldest first, with only what the scheduler needs
        (its spec is not read whole)."""
        return self._queue.list_queue(statuses)

    def get_job(self, job_id: str, *, tenant_id: str | None = None) -> JobRecord:
        """Return the job, or raise JobNotFound (also when it belongs to another tenant)."""
        with self._db.connect() as conn:
            rows = self._records(conn, select(*_NO_SPEC).where(JOBS.c.id == job_id))
        # Same error for "absent" and "not yours" so tenants cannot probe for ids.
        if not rows or (tenant_id is not None and rows[0].tenant_id != tenant_id):
            raise JobNotFound(f"no job {job_id!r}; list your jobs with GET /v1/jobs")
        return rows[0]

    def list_jobs(
        self,
        *,
        tenant_id: str | None = None,
        statuses: Iterable[JobStatus] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[JobRecord]:
        """Return one page of jobs, newest first."""
        with self._db.connect() as conn:
            keys = page_keys(conn, tenant_id, statuses, limit, offset, total=False)
            return self._records_of(conn, keys)

    def count_jobs(
        self, *, tenant_id: str | None = None, statuses: Iterable[JobStatus] | None = None
    ) -> int:
        """Count the jobs list_jobs would page through with the same filters."""
        with self._db.connect() as conn:
            return count_matching(conn, tenant_id, statuses)

    def page_jobs(
        self,
        *,
        tenant_id: str | None = None,
        statuses: Iterable[JobStatus] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[JobRecord], int]:
        """:meth:`list_jobs` and :meth:`count_jobs` in one statement (the count rides on
        the page's keys; a second statement only for a page past the end)."""
        statuses = None if statuses is None else list(statuses)  # read twice
        with self._db.connect() as conn:
            keys = page_keys(conn, tenant_id, statuses, limit, offset, total=True)
            if keys:
                return self._records_of(conn, keys), int(keys[0][2])
            if offset == 0 and limit > 0:
                return [], 0
            return [], count_matching(conn, tenant_id, statuses)

    def list_jobs_fifo(self, statuses: Iterable[JobStatus]) -> list[JobRecord]:
        """Return every job in ``statuses``, oldest first (the scheduler's queue order)."""
        query = select(*_NO_SPEC).where(JOBS.c.status.in_(status_values(statuses)))
        query = query.order_by(JOBS.c.created_at.asc(), JOBS.c.id.asc())
        with self._db.connect() as conn:
            return self._records(conn, query)

    def update_job(
        self,
        job_id: str,
        *,
        expect_status: JobStatus | None = None,
        expect_unsubmitted: bool = False,
        event: NewEvent | None = None,
        fence: Any = None,
        **fields: Any,
    ) -> JobRecord | None:
        """Update a job's columns in one transaction; with ``expect_status``, only if the job
        is still in that status (compare-and-set); with ``expect_unsubmitted``, only if no
        submission is recorded yet.

        Returns the updated job, or None when the compare-and-set lost (the job
        moved on). The store does not judge status changes: callers that change
        ``status`` go through ``service.domain.states.change_status``, which checks
        the rule and sets ``expect_status``. ``event`` = (kind, message, data) is
        stored in the same transaction. ``fence`` (``LeaseStore.fence``): written only
        while the lease it names is held with its token; None too when it is not.
        JobNotFound when there is no such job.
        """
        values = _column_values(fields)
        query = update(JOBS).where(JOBS.c.id == job_id).values(**values, updated_at=utcnow())
        if expect_status is not None:
            query = query.where(JOBS.c.status == JobStatus(expect_status).value)
        if expect_unsubmitted:  # its submission is recorded once, by one leader
            query = query.where(JOBS.c.submission_id.is_(None))
        if fence is not None:
            query = query.where(fence)
        with self._db.begin() as conn:
            if conn.execute(query).rowcount != 1:
                require_job(conn, job_id)
                return None
            if event is not None:
                kind, message, data = event
                insert_event(self._db, conn, job_id, kind, message, data, None)
            if "spec" in values:
                self._specs.drop(job_id)
            (record,) = self._records(conn, select(*_NO_SPEC).where(JOBS.c.id == job_id))
        if "spec" in values:  # a reader may have cached the old spec before this commit
            self._specs.drop(job_id)
        return record
