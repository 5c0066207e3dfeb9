"""The tables by name, and the row-level helpers several stores use inside their transactions."""

from __future__ import annotations

import enum
import functools
from typing import Any

from sqlalchemy import Connection, select

from service.errors import JobNotFound
from service.status import JobStatus
from service.store.database import Database
from service.store.models import (
    ApiToken,
    Job,
    JobCheckpoint,
    JobEvent,
    JobMetric,
    Lease,
    Tenant,
    utcnow,
)

TENANTS, TOKENS, JOBS = Tenant.__table__, ApiToken.__table__, Job.__table__
LEASES = Lease.__table__
EVENTS, METRICS, CHECKPOINTS = JobEvent.__table__, JobMetric.__table__, JobCheckpoint.__table__


def current_status(conn: Connection, job_id: str) -> JobStatus | None:
    """The stored status of ``job_id``; None when there is no such job."""
    value = conn.execute(select(JOBS.c.status).where(JOBS.c.id == job_id)).scalar_one_or_none()
    return None if value is None else JobStatus(value)


def require_job(conn: Connection, job_id: str) -> None:
    """Raise JobNotFound unless ``job_id`` exists (clearer than a foreign key error)."""
    if current_status(conn, job_id) is None:
        raise JobNotFound(f"no job {job_id!r}")


def insert_event(
    db: Database,
    conn: Connection,
    job_id: str,
    kind: str | enum.Enum,
    message: str,
    data: dict | None,
    dedup_key: str | None,
) -> bool:
    """Insert one event unless (job_id, dedup_key) exists; True when inserted.

    ``kind`` may be an ``EventKind``: its value is stored (drivers would store the
    member's name for a str subclass).
    """
    row = event_row(job_id, kind, message, data, dedup_key, utcnow())
    # RETURNING, not rowcount: drivers disagree on rowcount for inserts that fetch keys.
    return conn.execute(event_insert(db.dialect, returning=True), row).first() is not None


def event_row(
    job_id: str,
    kind: str | enum.Enum,
    message: str,
    data: dict | None,
    dedup_key: str | None,
    ts: Any,
) -> dict[str, Any]:
    """The ``job_events`` row of one event (an ``EventKind`` stored as its value)."""
    kind = kind.value if isinstance(kind, enum.Enum) else kind
    row = {"job_id": job_id, "ts": ts, "kind": kind, "message": message, "data": data}
    return row | {"dedup_key": dedup_key}


@functools.cache
def event_insert(dialect: str, *, returning: bool) -> Any:
    """The event INSERT of ``dialect`` (``Database.dialect``) that skips a (job_id,
    dedup_key) already stored, built once: rows go in as parameters (``.values()`` made
    SQLAlchemy key and compile the statement anew at every call)."""
    query = Database.insert_for(dialect, EVENTS).on_conflict_do_nothing(
        index_elements=["job_id", "dedup_key"]
    )
    return query.returning(EVENTS.c.id) if returning else query
