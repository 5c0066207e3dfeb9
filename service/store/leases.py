"""Leases: which replica of the service holds a role (the control loop's leader), until when.

A lease is one row. Taking it is one statement that succeeds only when the row is missing
or has lapsed, and that adds one to the row's ``token``: every holder has a token no
earlier holder had. A write that must come from the holder carries :meth:`LeaseStore.fence`
in its WHERE clause, so the database itself refuses it once the lease lapsed or passed on,
whatever the writer believes (a process paused past its lease wakes up still thinking it
leads; its first write finds out it does not).

Time is the database's clock on PostgreSQL (``now()``), so replicas on hosts whose clocks
disagree still agree on who holds the lease. SQLite serves one process and uses this
process's clock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Interval, exists, func, literal, select, update

from service.store.database import Database
from service.store.models import UTCDateTime, utcnow
from service.store.tables import LEASES


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease, with which token, until when (the database's time)."""

    holder: str
    token: int
    expires_at: dt.datetime


class LeaseStore:
    """Take, renew, hand back and read leases; fence writes by them."""

    def __init__(self, db: Database):
        self._db = db

    def _now(self, plus_s: float = 0.0) -> Any:
        """The database's now, ``plus_s`` seconds on, as an SQL expression."""
        delta = dt.timedelta(seconds=plus_s)
        if self._db.dialect == "postgresql":
            return func.now() + literal(delta, Interval())
        return literal(utcnow() + delta, UTCDateTime())

    def acquire(self, name: str, holder: str, ttl_s: float) -> int | None:
        """Take lease ``name`` for ``ttl_s`` seconds if nobody holds it or it lapsed; the new
        token, or None when another holder's lease still runs (or it is ``holder``'s own:
        a holder renews, it does not take again)."""
        insert = self._db.insert(LEASES).values(
            name=name, holder=holder, token=1, expires_at=self._now(ttl_s)
        )
        query = insert.on_conflict_do_update(
            index_elements=["name"],
            set_={
                "holder": insert.excluded.holder,
                "token": LEASES.c.token + 1,
                "expires_at": insert.excluded.expires_at,
            },
            where=LEASES.c.expires_at <= self._now(),
        )
        with self._db.begin() as conn:
            row = conn.execute(query.returning(LEASES.c.token)).first()
        return None if row is None else int(row[0])

    def renew(self, name: str, holder: str, token: int, ttl_s: float) -> bool:
        """Extend ``holder``'s lease by ``ttl_s`` from now; False when it lapsed or passed on
        (the holder no longer holds it and must stop acting on it)."""
        query = (
            update(LEASES)
            .where(LEASES.c.name == name, LEASES.c.holder == holder, LEASES.c.token == token)
            .where(LEASES.c.expires_at > self._now())
            .values(expires_at=self._now(ttl_s))
        )
        with self._db.begin() as conn:
            return conn.execute(query).rowcount == 1

    def release(self, name: str, holder: str, token: int) -> None:
        """Hand the lease back now (a replica that stops): another takes it at its next try
        instead of after the lease runs out."""
        query = (
            update(LEASES)
            .where(LEASES.c.name == name, LEASES.c.holder == holder, LEASES.c.token == token)
            .values(expires_at=self._now(-1.0))
        )
        with self._db.begin() as conn:
            conn.execute(query)

    def holder(self, name: str) -> LeaseHolder | None:
        """Who holds lease ``name`` now; None when nobody does (never taken, or lapsed)."""
        query = select(LEASES.c.holder, LEASES.c.token, LEASES.c.expires_at).where(
            LEASES.c.name == name, LEASES.c.expires_at > self._now()
        )
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else LeaseHolder(row.holder, int(row.token), row.expires_at)

    def fence(self, name: str, token: int) -> Any:
        """A WHERE condition true only while lease ``name`` is held with ``token``: a write
        that carries it is refused by the database once the lease lapsed or passed on."""
        return exists().where(
            LEASES.c.name == name, LEASES.c.token == token, LEASES.c.expires_at > self._now()
        )
