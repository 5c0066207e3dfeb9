"""The persistent job store: tenants, tokens, jobs, events, metrics, checkpoints.

Every method runs its own short transaction and returns plain frozen records or
dicts, so callers never hold a session or a lazily-loading ORM object.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from service.domain.states import JobStatus, transition
from service.errors import JobNotFound
from service.store.models import (
    ApiToken,
    EventRecord,
    Job,
    JobCheckpoint,
    JobEvent,
    JobMetric,
    JobRecord,
    Tenant,
    build_engine,
    utcnow,
)
from service.store.tenants import TenantTokenMixin, new_id

TENANTS, TOKENS, JOBS = Tenant.__table__, ApiToken.__table__, Job.__table__
EVENTS, METRICS, CHECKPOINTS = JobEvent.__table__, JobMetric.__table__, JobCheckpoint.__table__

METRIC_COLUMNS = ("world_size", "loss", "lr", "samples_per_s", "tokens_per_s")
# Columns update_job may not set: identity, ownership and bookkeeping the store owns.
_FROZEN_JOB_FIELDS = frozenset({"id", "tenant_id", "created_at", "updated_at"})
_UPDATABLE_JOB_FIELDS = frozenset(c.name for c in JOBS.columns) - _FROZEN_JOB_FIELDS
# update_job without expect_status re-reads and retries this often when it races a writer.
_UPDATE_ATTEMPTS = 3


def _job_record(row: Any) -> JobRecord:
    """Convert a ``jobs`` row into a JobRecord."""
    values = dict(row._mapping)
    values["status"] = JobStatus(values["status"])
    return JobRecord(**values)


def _to_datetime(ts: float | dt.datetime | None) -> dt.datetime:
    """Accept epoch seconds or a datetime (naive means UTC); None means now."""
    if ts is None:
        return utcnow()
    if isinstance(ts, dt.datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=dt.timezone.utc)
    return dt.datetime.fromtimestamp(float(ts), tz=dt.timezone.utc)


def _status_values(statuses: Iterable[JobStatus | str] | None) -> list[str] | None:
    """Normalise a status filter to stored string values."""
    return None if statuses is None else [JobStatus(s).value for s in statuses]


class JobStore(TenantTokenMixin):
    """Synchronous job store on SQLite (default) or PostgreSQL, chosen by URL.

    The schema must exist: run ``service.store.migrate.migrate(url)`` first.
    Safe to share between threads; each call is its own transaction.
    """

    def __init__(self, url: str):
        """Connect to ``url`` (a SQLAlchemy URL; nothing is queried yet)."""
        self.url = url
        self._engine = build_engine(url)
        self._dialect = self._engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection; the store must not be used afterwards."""
        self._engine.dispose()

    def ping(self) -> None:
        """Run ``SELECT 1``; raises the driver's error when the database is unreachable."""
        with self._engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def _insert(self, table: Any) -> Any:
        """Return the dialect's INSERT, which supports ON CONFLICT on both backends."""
        if self._dialect == "postgresql":
            return postgresql.insert(table)
        if self._dialect == "sqlite":
            return sqlite.insert(table)
        raise NotImplementedError(f"unsupported database {self._dialect!r}; use sqlite or postgresql")

    # -- jobs -------------------------------------------------------------

    def create_job(
        self, *, tenant_id: str, name: str, spec: dict, min_workers: int,
        warnings: list[str] | None = None,
    ) -> JobRecord:
        """Store a new QUEUED job and its "submitted" event in one transaction."""
        now = utcnow()
        values = {
            "id": new_id("j-"), "tenant_id": tenant_id, "name": name,
            "status": JobStatus.QUEUED.value, "spec": spec, "min_workers": min_workers,
            "world_size": None, "restarts": 0, "resubmits": 0, "step": 0,
            "submission_id": None, "dashboard_url": None, "error": None,
            "latest_metrics": None, "warnings": warnings, "created_at": now,
            "started_at": None, "finished_at": None, "updated_at": now,
        }
        with self._engine.begin() as conn:
            conn.execute(insert(JOBS).values(values))
            self._insert_event(conn, values["id"], "submitted", f"job {name} submitted", None, None)
        return _job_record_from_values(values)

    def get_job(self, job_id: str, *, tenant_id: str | None = None) -> JobRecord:
        """Return the job, or raise JobNotFound (also when it belongs to another tenant)."""
        with self._engine.connect() as conn:
            row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).first()
        # Same error for "absent" and "not yours" so tenants cannot probe for ids.
        if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
            raise JobNotFound(f"no job {job_id!r}; list your jobs with GET /v1/jobs")
        return _job_record(row)

    def _job_filter(self, query: Any, tenant_id: str | None, statuses: Any) -> Any:
        """Apply the tenant and status filters shared by list_jobs and count_jobs."""
        if tenant_id is not None:
            query = query.where(JOBS.c.tenant_id == tenant_id)
        values = _status_values(statuses)
        if values is not None:
            query = query.where(JOBS.c.status.in_(values))
        return query

    def list_jobs(
        self, *, tenant_id: str | None = None, statuses: Iterable[JobStatus] | None = None,
        limit: int = 50, offset: int = 0,
    ) -> list[JobRecord]:
        """Return one page of jobs, newest first."""
        query = self._job_filter(select(JOBS), tenant_id, statuses)
        query = query.order_by(JOBS.c.created_at.desc(), JOBS.c.id.desc()).limit(limit).offset(offset)
        with self._engine.connect() as conn:
            return [_job_record(row) for row in conn.execute(query)]

    def count_jobs(
        self, *, tenant_id: str | None = None, statuses: Iterable[JobStatus] | None = None
    ) -> int:
        """Count the jobs list_jobs would page through with the same filters."""
        query = self._job_filter(select(func.count()).select_from(JOBS), tenant_id, statuses)
        with self._engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def list_jobs_fifo(self, statuses: Iterable[JobStatus]) -> list[JobRecord]:
        """Return every job in ``statuses``, oldest first (the scheduler's queue order)."""
        query = self._job_filter(select(JOBS), None, statuses)
        query = query.order_by(JOBS.c.created_at.asc(), JOBS.c.id.asc())
        with self._engine.connect() as conn:
            return [_job_record(row) for row in conn.execute(query)]

    def update_job(
        self, job_id: str, *, expect_status: JobStatus | None = None,
        event: tuple[str, str, dict | None] | None = None, **fields: Any,
    ) -> JobRecord | None:
        """Atomically update a job's columns, optionally only if it is in ``expect_status``.

        Returns the updated job, or None when ``expect_status`` was given and the
        job had moved on (compare-and-set lost; also after repeated races without it). A ``status`` in ``fields`` must be
        a legal transition (InvalidTransition otherwise; nothing is written).
        ``event`` = (kind, message, data) is stored in the same transaction.
        """
        unknown = set(fields) - _UPDATABLE_JOB_FIELDS
        if unknown:
            raise TypeError(f"update_job cannot set {sorted(unknown)}")
        if "status" in fields:
            fields["status"] = JobStatus(fields["status"])
        with self._engine.begin() as conn:
            if not self._apply_update(conn, job_id, expect_status, fields):
                return None
            if event is not None:
                kind, message, data = event
                self._insert_event(conn, job_id, kind, message, data, None)
            return _job_record(conn.execute(select(JOBS).where(JOBS.c.id == job_id)).one())

    def _apply_update(
        self, conn: Connection, job_id: str, expect_status: JobStatus | None, fields: dict
    ) -> bool:
        """Validate and run update_job's UPDATE; False when the compare-and-set lost."""
        for _ in range(_UPDATE_ATTEMPTS):
            guard = expect_status
            if guard is None and "status" in fields:
                # Validate against what is stored and make that the guard, so a
                # concurrent change cannot slip an unchecked transition through.
                guard = self._current_status(conn, job_id)
            if guard is not None and "status" in fields:
                transition(JobStatus(guard), fields["status"])
            if self._guarded_update(conn, job_id, guard, fields):
                return True
            if guard is None or self._current_status(conn, job_id) is None:
                raise JobNotFound(f"no job {job_id!r}")
            if expect_status is not None:
                return False
            # The status moved between our read and our write: re-validate against it.
        return False

    def _current_status(self, conn: Connection, job_id: str) -> JobStatus | None:
        """Return the stored status of ``job_id``; None when there is no such job."""
        value = conn.execute(select(JOBS.c.status).where(JOBS.c.id == job_id)).scalar_one_or_none()
        return None if value is None else JobStatus(value)

    def _guarded_update(
        self, conn: Connection, job_id: str, guard: JobStatus | None, fields: dict[str, Any]
    ) -> bool:
        """UPDATE the job (WHERE status = guard when given); True when a row matched."""
        values = {k: (v.value if isinstance(v, JobStatus) else v) for k, v in fields.items()}
        query = update(JOBS).where(JOBS.c.id == job_id).values(**values, updated_at=utcnow())
        if guard is not None:
            query = query.where(JOBS.c.status == JobStatus(guard).value)
        return conn.execute(query).rowcount == 1

    # -- events -----------------------------------------------------------

    def _insert_event(
        self, conn: Connection, job_id: str, kind: str, message: str,
        data: dict | None, dedup_key: str | None,
    ) -> bool:
        """Insert one event unless (job_id, dedup_key) exists; True when inserted."""
        query = self._insert(EVENTS).values(
            job_id=job_id, ts=utcnow(), kind=kind, message=message, data=data, dedup_key=dedup_key
        ).on_conflict_do_nothing(index_elements=["job_id", "dedup_key"])
        # RETURNING, not rowcount: drivers disagree on rowcount for inserts that fetch keys.
        return conn.execute(query.returning(EVENTS.c.id)).first() is not None

    def _require_job(self, conn: Connection, job_id: str) -> None:
        """Raise JobNotFound unless ``job_id`` exists (clearer than a foreign key error)."""
        if self._current_status(conn, job_id) is None:
            raise JobNotFound(f"no job {job_id!r}")

    def add_event(
        self, job_id: str, *, kind: str, message: str, data: dict | None = None,
        dedup_key: str | None = None,
    ) -> bool:
        """Store an event; False (not an error) when ``dedup_key`` was already stored."""
        with self._engine.begin() as conn:
            self._require_job(conn, job_id)
            return self._insert_event(conn, job_id, kind, message, data, dedup_key)

    def list_events(self, job_id: str, *, after_id: int = 0, limit: int = 1000) -> list[EventRecord]:
        """Return the job's events with id > ``after_id``, oldest first."""
        query = (
            select(EVENTS).where(EVENTS.c.job_id == job_id, EVENTS.c.id > after_id)
            .order_by(EVENTS.c.id).limit(limit)
        )
        with self._engine.connect() as conn:
            return [EventRecord(**row._mapping) for row in conn.execute(query)]

    def latest_event(self, job_id: str, *, kind: str) -> EventRecord | None:
        """The newest event of one kind, or None."""
        query = (select(EVENTS).where(EVENTS.c.job_id == job_id, EVENTS.c.kind == kind)
                 .order_by(EVENTS.c.id.desc()).limit(1))
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else EventRecord(**row._mapping)

    # -- metrics and checkpoints -------------------------------------------

    def upsert_metrics(self, job_id: str, points: list[dict]) -> int:
        """Insert or replace per-step metrics; returns how many steps were written.

        Keys other than step, ts and METRIC_COLUMNS go into ``data``. The job's
        ``step`` and ``latest_metrics`` follow the newest point by time, so a
        restore that recomputes earlier steps moves progress back honestly, while a
        replayed old batch does not.
        """
        rows = _metric_rows(job_id, points)
        if not rows:
            return 0
        query = self._insert(METRICS).values(rows)
        excluded = query.excluded
        query = query.on_conflict_do_update(
            index_elements=["job_id", "step"],
            set_={c: excluded[c] for c in ("ts", *METRIC_COLUMNS, "data")},
        )
        newest = max(rows, key=lambda r: (r["ts"], r["step"]))
        latest = _metric_dict(newest, epoch=True)
        with self._engine.begin() as conn:
            current = conn.execute(
                select(JOBS.c.latest_metrics).where(JOBS.c.id == job_id)
            ).one_or_none()
            if current is None:
                raise JobNotFound(f"no job {job_id!r}")
            conn.execute(query)
            stored = current.latest_metrics
            if stored is None or latest["ts"] >= float(stored.get("ts", 0.0)):
                conn.execute(
                    update(JOBS).where(JOBS.c.id == job_id)
                    .values(step=newest["step"], latest_metrics=latest, updated_at=utcnow())
                )
        return len(rows)

    def list_metrics(self, job_id: str, *, after_step: int = -1, limit: int = 10000) -> list[dict]:
        """Return metric points with step > ``after_step``, ascending by step."""
        query = (
            select(METRICS).where(METRICS.c.job_id == job_id, METRICS.c.step > after_step)
            .order_by(METRICS.c.step).limit(limit)
        )
        with self._engine.connect() as conn:
            return [_metric_dict(dict(row._mapping)) for row in conn.execute(query)]

    def upsert_checkpoint(
        self, job_id: str, *, step: int, uri: str, bytes: int, save_s: float,
        blocking_s: float | None = None,
    ) -> dict:
        """Record a committed checkpoint; a second one at the same step replaces it."""
        values = {
            "job_id": job_id, "step": step, "uri": uri, "bytes": bytes, "save_s": save_s,
            "blocking_s": blocking_s, "created_at": utcnow(),
        }
        query = self._insert(CHECKPOINTS).values(values)
        query = query.on_conflict_do_update(
            index_elements=["job_id", "step"],
            set_={c: query.excluded[c] for c in ("uri", "bytes", "save_s", "blocking_s", "created_at")},
        )
        with self._engine.begin() as conn:
            self._require_job(conn, job_id)
            conn.execute(query)
        return values

    def list_checkpoints(self, job_id: str) -> list[dict]:
        """Return the job's checkpoints, ascending by step."""
        query = select(CHECKPOINTS).where(CHECKPOINTS.c.job_id == job_id).order_by(CHECKPOINTS.c.step)
        with self._engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def delete_checkpoint(self, job_id: str, step: int) -> bool:
        """Forget the checkpoint at ``step``; False when there was none."""
        query = delete(CHECKPOINTS).where(CHECKPOINTS.c.job_id == job_id, CHECKPOINTS.c.step == step)
        with self._engine.begin() as conn:
            return conn.execute(query).rowcount == 1


def _job_record_from_values(values: dict[str, Any]) -> JobRecord:
    """Build the JobRecord for values just inserted (no need to read them back)."""
    return JobRecord(**{**values, "status": JobStatus(values["status"])})


def _metric_rows(job_id: str, points: list[dict]) -> list[dict]:
    """Turn reported points into job_metrics rows; the last point per step wins."""
    rows: dict[int, dict] = {}
    for point in points:
        extra = {k: v for k, v in point.items() if k not in ("step", "ts", *METRIC_COLUMNS)}
        row = {c: point.get(c) for c in METRIC_COLUMNS}
        step = int(point["step"])
        # PostgreSQL rejects one ON CONFLICT statement touching a row twice, so dedupe here.
        rows[step] = {
            **row, "job_id": job_id, "step": step, "ts": _to_datetime(point.get("ts")),
            "data": extra or None,
        }
    return list(rows.values())


def _metric_dict(row: dict, *, epoch: bool = False) -> dict:
    """Flatten a job_metrics row back into the reported shape (extras at top level)."""
    point = {**(row.get("data") or {}), "step": row["step"]}
    point["ts"] = row["ts"].timestamp() if epoch else row["ts"]
    for column in METRIC_COLUMNS:
        point[column] = row[column]
    return point
