"""What replicas share through the database: on SQLite, one serving process per file; on
PostgreSQL, a wake-up call (tests/integration/test_store_postgres.py runs these there)."""

from __future__ import annotations

import threading
import time

from service.store.database import Database
from service.store.replicas import WakeChannel, hold_sqlite


def test_one_process_may_open_its_sqlite_file_again(tmp_path):
    """The lock is the process's (tests/e2e/test_replicas.py: another process is refused)."""
    url = f"sqlite:///{tmp_path / 'etrain.db'}"
    held = hold_sqlite(Database(url))
    assert held is not None and hold_sqlite(Database(url)) == held
    assert hold_sqlite(Database(f"sqlite:///{tmp_path / 'other.db'}")) != held


def test_the_wake_channel_reaches_a_replica_listening_on_the_database(store_url):
    """On SQLite there is one process: notify is a no-op and nobody listens. On PostgreSQL
    a NOTIFY from one replica's connection wakes the listener of another."""
    sender, receiver = WakeChannel(Database(store_url)), WakeChannel(Database(store_url))
    if not sender.shared:
        sender.notify()  # nothing to reach, nothing raised
        return
    woken, stop = threading.Event(), threading.Event()
    calls: list[float] = []

    def on_wake() -> None:
        calls.append(time.monotonic())
        woken.set()

    listener = threading.Thread(target=receiver.listen, args=(on_wake, stop), daemon=True)
    listener.start()
    try:
        assert woken.wait(10)  # the first call: once listening
        woken.clear()
        sender.notify()
        assert woken.wait(10) and len(calls) == 2
    finally:
        stop.set()
        listener.join(5)
    assert not listener.is_alive()
