"""The stores of one database, bundled for the composition root (``service.api.app``)."""

from __future__ import annotations

from dataclasses import dataclass

from service.store.database import Database
from service.store.events import EventStore
from service.store.jobs import JobStore
from service.store.telemetry import MetricStore
from service.store.tokens import TokenStore


@dataclass(frozen=True)
class Stores:
    """One store per group of tables, all on one :class:`Database`."""

    db: Database
    jobs: JobStore
    events: EventStore
    metrics: MetricStore
    tokens: TokenStore

    @classmethod
    def open(cls, url: str) -> Stores:
        """The stores on the (migrated) database at ``url``; nothing is queried yet."""
        db = Database(url)
        return cls(
            db=db,
            jobs=JobStore(db),
            events=EventStore(db),
            metrics=MetricStore(db),
            tokens=TokenStore(db),
        )

    @property
    def url(self) -> str:
        """The database URL."""
        return self.db.url

    def ping(self) -> None:
        """Raise the driver's error when the database is unreachable."""
        self.db.ping()

    def close(self) -> None:
        """Close the database's connections; no store may be used afterwards."""
        self.db.close()
