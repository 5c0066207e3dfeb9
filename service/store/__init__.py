"""Persistent job store: SQLite by default, PostgreSQL by URL, Alembic-migrated."""

from service.store.jobs import JobStore
from service.store.migrate import head_revision, migrate
from service.store.models import EventRecord, JobRecord, TenantRecord, TokenRecord

__all__ = [
    "EventRecord",
    "JobRecord",
    "JobStore",
    "TenantRecord",
    "TokenRecord",
    "head_revision",
    "migrate",
]
