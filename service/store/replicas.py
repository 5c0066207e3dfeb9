"""What the service's replicas share through the database: a wake-up call (PostgreSQL's
``NOTIFY`` / ``LISTEN``), and, on SQLite, the rule that one process serves a database."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import make_url, text

from service.errors import EtrainError
from service.store.database import Database

log = logging.getLogger(__name__)

CHANNEL = "etrain_wake"
RECONNECT_S = 2.0  # between tries while the database is away


class WakeChannel:
    """Wake the leader from any replica: a job stored on a follower is admitted now, not
    at the leader's next poll. A no-op on SQLite (one process: the caller wakes it)."""

    def __init__(self, db: Database):
        self._db = db

    @property
    def shared(self) -> bool:
        """Whether replicas can share this database (PostgreSQL)."""
        return self._db.dialect == "postgresql"

    def notify(self) -> None:
        """Wake every replica that listens (delivered when this transaction commits)."""
        if self.shared:
            with self._db.begin() as conn:
                conn.execute(text(f"NOTIFY {CHANNEL}"))

    def listen(self, on_wake: Callable[[], None], stop: threading.Event) -> None:
        """Call ``on_wake`` for each notification until ``stop`` is set (blocks: run it in a
        thread). A lost connection is opened again; ``on_wake`` runs after each (re)connect,
        for whatever was notified while nobody listened."""
        import psycopg

        url = make_url(self._db.url).set(drivername="postgresql")
        conninfo = url.render_as_string(hide_password=False)
        while not stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    on_wake()
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            on_wake()
            except psycopg.Error as e:
                why = type(e).__name__
                log.warning("wake channel: %s; listening again in %gs", why, RECONNECT_S)
                stop.wait(RECONNECT_S)


class SqliteInUse(EtrainError):
    """Another process serves this SQLite database."""

    status_code = 409


_HELD: dict[Path, int] = {}  # the lock files this process holds


def hold_sqlite(db: Database) -> int | None:
    """On SQLite, make this process the only one that serves the database file: a POSIX lock
    on ``<file>.serve.lock``, held until the process exits (a lock per process: the same
    process may open the database again). Its file descriptor, or None (not SQLite, or an
    in-memory database). Raises SqliteInUse when another process holds it."""
    url = make_url(db.url)
    if db.dialect != "sqlite" or not url.database or url.database == ":memory:":
        return None
    if url.database.startswith("file:"):
        return None
    path = Path(url.database).expanduser().resolve()
    if path in _HELD:
        return _HELD[path]
    lock = path.with_name(path.name + ".serve.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise SqliteInUse(
            f"{path} is already served by process {holder}: SQLite serves one process. To run "
            "several replicas of etrain serve, point each at one PostgreSQL database "
            "(ETRAIN_DATABASE_URL=postgresql://...)."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _HELD[path] = fd  # never closed: closing any descriptor of the file drops the lock
    return fd
