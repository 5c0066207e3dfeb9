"""Persistent job store: SQLite by default, PostgreSQL by URL, Alembic-migrated."""

from service.store.jobs import EventRecord, JobRecord, JobStore, TenantRecord, TokenRecord
from service.store.migrate import head_revision, migrate

__all__ = [
    "EventRecord",
    "JobRecord",
    "JobStore",
    "TenantRecord",
    "TokenRecord",
    "head_revision",
    "migrate",
]
