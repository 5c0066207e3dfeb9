"""Persistent job store: SQLite by default, PostgreSQL by URL, Alembic-migrated.

One :class:`Database` per process and one store per group of tables on it:
:class:`JobStore` (jobs), :class:`EventStore` (job events), :class:`MetricStore`
(per-step metrics and checkpoints), :class:`TokenStore` (tenants and API tokens);
:class:`Stores` bundles them. Nothing here imports the domain.
"""

from service.store.database import Database
from service.store.events import EventStore
from service.store.jobs import JobStore
from service.store.migrate import head_revision, migrate
from service.store.models import EventRecord, JobRecord, TenantRecord, TokenRecord
from service.store.stores import Stores
from service.store.telemetry import MetricStore
from service.store.tokens import TokenStore

__all__ = [
    "Database",
    "EventRecord",
    "EventStore",
    "JobRecord",
    "JobStore",
    "MetricStore",
    "Stores",
    "TenantRecord",
    "TokenRecord",
    "TokenStore",
    "head_revision",
    "migrate",
]
