"""The tables by name, and the row-level helpers several stores use inside their transactions."""

from __future__ import annotations

import enum
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
    kind = kind.value if isinstance(kind, enum.Enum) else kind
    row = {"job_id": job_id, "ts": utcnow(), "kind": kind, "message": message}
    row |= {"data": data, "dedup_key": dedup_key}
    # RETURNING, not rowcount: drivers disagree on rowcount for inserts that fetch keys.
    return conn.execute(_EVENT_INSERTS[db.dialect], row).first() is not None


class _EventInserts(dict):
    """The event INSERT of each dialect, built once: values given as parameters, not with
    ``.values()``, whose statement SQLAlchemy keys and compiles anew at every call."""

    def __missing__(self, dialect: str) -> Any:
        self[dialect] = _event_insert(dialect)
        return self[dialect]


def _event_insert(dialect: str) -> Any:
    return (
        Database.insert_for(dialect, EVENTS)
        .on_conflict_do_nothing(index_elements=["job_id", "dedup_key"])
        .returning(EVENTS.c.id)
    )


_EVENT_INSERTS = _EventInserts()
