"""The job store schema (SQLAlchemy 2 declarative tables) and the records the stores hand out.

The tables here are the *current* shape; the versioned history that creates them
lives in ``service/migrations/versions``. A test compares the two so they cannot drift.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.status import JobStatus
from workers.spec import JobSpec

# Explicit constraint names so migrations (and SQLite batch ALTERs) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Event ids grow without bound on PostgreSQL; SQLite only autoincrements INTEGER keys.
EVENT_ID_TYPE = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> dt.datetime:
    """Return the current time as a timezone-aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


def new_id(prefix: str) -> str:
    """Return ``prefix`` + 12 random hex digits (e.g. ``j-3f9a0c1b2d4e``)."""
    return prefix + secrets.token_hex(6)


class UTCDateTime(TypeDecorator):
    """A timestamp that is always timezone-aware UTC in Python, on every backend.

    SQLite has no time zone type and hands back naive values; PostgreSQL hands
    back the session's zone. Normalising here keeps callers free of both quirks.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        """Store naive values as UTC and aware values converted to UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        """Return stored values as aware UTC datetimes."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base for every store table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    """A tenant: the unit of isolation for jobs and tokens."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class ApiToken(Base):
    """An API token, stored only as the sha256 hex digest of its secret."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    # A reporter token may only report for this one job.
    job_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class Job(Base):
    """A training job and its latest known state."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_created_at", "created_at"),
        # A tenant's queued-jobs quota (counted at every submit) and its pages, newest first.
        Index("ix_jobs_tenant_status", "tenant_id", "status"),
        Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict] = mapped_column(JSON)
    min_workers: Mapped[int] = mapped_column(Integer)
    world_size: Mapped[int | None] = mapped_column(Integer)
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    resubmits: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    step: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    submission_id: Mapped[str | None] = mapped_column(String(128))
    dashboard_url: Mapped[str | None] = mapped_column(String(512))
    error: Mapped[str | None] = mapped_column(Text)
    latest_metrics: Mapped[dict | None] = mapped_column(JSON)
    warnings: Mapped[list | None] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class JobEvent(Base):
    """One lifecycle event of a job; ``dedup_key`` makes replayed events idempotent."""

    __tablename__ = "job_events"
    __table_args__ = (UniqueConstraint("job_id", "dedup_key"),)

    id: Mapped[int] = mapped_column(EVENT_ID_TYPE, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict | None] = mapped_column(JSON)
    dedup_key: Mapped[str | None] = mapped_column(String(255))


class JobMetric(Base):
    """One training step's metrics; a step recomputed after a restore replaces the old row."""

    __tablename__ = "job_metrics"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    world_size: Mapped[int | None] = mapped_column(Integer)
    loss: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    data: Mapped[dict | None] = mapped_column(JSON)


class JobCheckpoint(Base):
    """A committed checkpoint of a job at one step."""

    __tablename__ = "job_checkpoints"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    uri: Mapped[str] = mapped_column(String(1024))
    bytes: Mapped[int] = mapped_column(BigInteger)
    save_s: Mapped[float] = mapped_column(Float)
    blocking_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    eval_loss: Mapped[float | None] = mapped_column(Float)


class Lease(Base):
    """Who holds a named role among the service's replicas (the control loop's leader), and
    until when. ``token`` grows by one with every new holder: a write fenced by it is refused
    once the lease has passed to another replica, or lapsed."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


# -- records: what the store hands out instead of ORM objects ---------------


@dataclasses.dataclass(frozen=True, slots=True)
class TenantRecord:
    """A stored tenant."""

    id: str
    name: str
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class TokenRecord:
    """A stored API token (only its hash is ever stored)."""

    id: str
    tenant_id: str
    token_hash: str
    name: str
    role: str
    job_id: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


@dataclasses.dataclass(frozen=True, slots=True)
class JobRecord:
    """A stored job: every column of ``jobs``, with ``status`` as a JobStatus and ``spec``
    as the validated JobSpec (stored as its JSON, aliases included)."""

    id: str
    tenant_id: str
    name: str
    status: JobStatus
    spec: JobSpec
    min_workers: int
    world_size: int | None
    restarts: int
    resubmits: int
    step: int
    submission_id: str | None
    dashboard_url: str | None
    error: str | None
    latest_metrics: dict | None
    warnings: list[str] | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class QueueEntry:
    """What the scheduler needs of a job, read without its whole spec."""

    id: str
    tenant_id: str
    tenant: str  # the tenant's name (quotas and weights are set by name)
    status: JobStatus
    min_workers: int
    cpus_per_worker: float
    gpus_per_worker: int
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class EventRecord:
    """A stored job event."""

    id: int
    job_id: str
    ts: dt.datetime
    kind: str
    message: str
    data: dict | None
    dedup_key: str | None
