"""Job events: the lifecycle record of each job, de-duplicated on ``dedup_key``."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from sqlalchemy import select

from service.store.database import Database
from service.store.models import EventRecord, utcnow
from service.store.tables import EVENTS, event_insert, event_row, insert_event, require_job

# (job_id, kind, message, data, dedup_key) of one event in add_events.
JobEvent = tuple[str, str | enum.Enum, str, dict | None, str | None]


class EventStore:
    """The ``job_events`` table. Every call is its own transaction."""

    def __init__(self, db: Database):
        """Use the tables of ``db``."""
        self._db = db

    def add_event(
        self,
        job_id: str,
        *,
        kind: str | enum.Enum,
        message: str,
        data: dict | None = None,
        dedup_key: str | None = None,
    ) -> bool:
        """Store an event; False (not an error) when ``dedup_key`` was already stored."""
        with self._db.begin() as conn:
            require_job(conn, job_id)
            return insert_event(self._db, conn, job_id, kind, message, data, dedup_key)

    def add_events(self, events: Sequence[JobEvent]) -> None:
        """Store many events (of existing jobs) in one transaction; an event whose
        ``dedup_key`` its job already has is skipped."""
        now = utcnow()
        rows = [event_row(*event, now) for event in events]
        if not rows:
            return
        with self._db.begin() as conn:  # one statement, executed for each row
            conn.execute(event_insert(self._db.dialect, returning=False), rows)

    def list_events(
        self, job_id: str, *, after_id: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        """Return the job's events with id > ``after_id``, oldest first."""
        query = (
            select(EVENTS)
            .where(EVENTS.c.job_id == job_id, EVENTS.c.id > after_id)
            .order_by(EVENTS.c.id)
            .limit(limit)
        )
        with self._db.connect() as conn:
            return [EventRecord(**row._mapping) for row in conn.execute(query)]

    def latest_event(self, job_id: str, *, kind: str | enum.Enum) -> EventRecord | None:
        """The newest event of one kind, or None."""
        kind = kind.value if isinstance(kind, enum.Enum) else kind
        query = (
            select(EVENTS)
            .where(EVENTS.c.job_id == job_id, EVENTS.c.kind == kind)
            .order_by(EVENTS.c.id.desc())
            .limit(1)
        )
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else EventRecord(**row._mapping)
