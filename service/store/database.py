"""The database every store shares: one engine, chosen by URL, and the SQL that differs by
dialect."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.pool import StaticPool

# SQLite waits this long for another writer's lock before failing with "database is locked".
SQLITE_BUSY_TIMEOUT_S = 30.0
# Pooled connections: the API's threadpool (40 threads) and the reconciler share the pool;
# a request waiting for a connection is a request not answered.
POOL_SIZE, POOL_OVERFLOW = 10, 30


def _configure_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
    """Per-connection SQLite settings: WAL so readers never block the writer, real FKs."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # WAL + NORMAL is durable across application crashes, which is what a job store needs.
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _private_file(path: Path) -> None:
    """Create the SQLite file (and its folder) readable by its owner only, before SQLite does.

    The database holds token hashes and specs; SQLite gives its -wal and -shm files
    the main file's mode. A file an older version left group- or world-readable is
    tightened.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)


def build_engine(url: str) -> Engine:
    """Create an Engine for ``url`` with the settings the store relies on.

    SQLite gets WAL, a busy timeout and cross-thread use (the API and the
    scheduler share one store); a missing parent directory is created.
    PostgreSQL URLs without a driver use psycopg 3, and every non-SQLite engine
    pre-pings connections so a restarted database is survived.
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        # psycopg (3) is the driver we ship; SQLAlchemy's bare default is psycopg2.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() != "sqlite":
        return create_engine(
            parsed, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW
        )
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
    }
    database = parsed.database
    if not database or database == ":memory:":
        # Every new connection to :memory: is a new empty database; share one.
        kwargs["poolclass"] = StaticPool
    else:
        # All kept: a connection made past the pool's size is closed when returned, and
        # opening one (with the pragmas above) costs more than a request's queries.
        kwargs.update(pool_size=POOL_SIZE + POOL_OVERFLOW, max_overflow=0)
        if not database.startswith("file:"):
            _private_file(Path(database).expanduser())
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _configure_sqlite)
    return engine


class Database:
    """One connection pool on SQLite (default) or PostgreSQL, chosen by URL.

    The schema must exist: run ``service.store.migrate.migrate(url)`` first.
    Safe to share between threads; each ``begin`` is its own transaction.
    """

    def __init__(self, url: str):
        """Connect to ``url`` (a SQLAlchemy URL; nothing is queried yet)."""
        self.url = url
        self._engine = build_engine(url)
        self._dialect = self._engine.dialect.name
        # SQLite has one writer at a time, and a writer that finds the lock taken sleeps in
        # growing steps (up to 100 ms) before it looks again. Writers of this process queue
        # on a lock instead and start the moment the previous one commits.
        self._write_lock = threading.RLock() if self._dialect == "sqlite" else None

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._dialect

    def begin(self) -> AbstractContextManager[Connection]:
        """A connection in a transaction that commits on exit (rolls back on an error)."""
        if self._write_lock is None:
            return self._engine.begin()
        return self._serialised_begin()

    @contextmanager
    def _serialised_begin(self) -> Iterator[Connection]:
        assert self._write_lock is not None
        with self._write_lock, self._engine.begin() as conn:
            yield conn

    def connect(self) -> AbstractContextManager[Connection]:
        """A connection for reads."""
        return self._engine.connect()

    def insert(self, table: Any) -> Any:
        """The dialect's INSERT, which supports ON CONFLICT on both backends."""
        return self.insert_for(self._dialect, table)

    @staticmethod
    def insert_for(dialect: str, table: Any) -> Any:
        """The INSERT of ``dialect`` (``Database.dialect``)."""
        if dialect == "postgresql":
            return postgresql.insert(table)
        if dialect == "sqlite":
            return sqlite.insert(table)
        raise NotImplementedError(f"unsupported database {dialect!r}; use sqlite or postgresql")

    def ping(self) -> None:
        """Run ``SELECT 1``; raises the driver's error when the database is unreachable."""
        with self._engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def close(self) -> None:
        """Close every pooled connection; the stores on it must not be used afterwards."""
        self._engine.dispose()
