"""A job database as an older release left it: migrated up to ``revision`` only, holding
the rows given, for tests of the migrations after it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import sqlalchemy as sa
from alembic import command

from service.store.migrate import build_alembic_config


def job_row(job_id: str, spec: dict, *, status: str, min_workers: int, at: dt.datetime) -> dict:
    """A ``jobs`` row of tenant ``t-1`` holding ``spec`` as it was stored."""
    return {
        "id": job_id,
        "tenant_id": "t-1",
        "name": job_id,
        "status": status,
        "spec": spec,
        "min_workers": min_workers,
        "created_at": at,
        "updated_at": at,
    }


def database_at(tmp_path: Path, revision: str, jobs: list[dict], *, at: dt.datetime) -> str:
    """The URL of a SQLite database migrated to ``revision``, with tenant ``t-1`` (acme)
    and the ``jobs`` rows (see :func:`job_row`) inserted as that release would have."""
    url = f"sqlite:///{tmp_path / 'etrain.db'}"
    command.upgrade(build_alembic_config(url), revision)
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.begin() as conn:
            conn.execute(
                meta.tables["tenants"].insert().values(id="t-1", name="acme", created_at=at)
            )
            conn.execute(meta.tables["jobs"].insert(), jobs)
    finally:
        engine.dispose()
    return url


def stored_specs(url: str) -> dict[str, dict]:
    """Job id -> the spec JSON as stored (not read through the current JobSpec)."""
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine)
    try:
        with engine.connect() as conn:
            jobs = meta.tables["jobs"]
            return {row.id: row.spec for row in conn.execute(sa.select(jobs.c.id, jobs.c.spec))}
    finally:
        engine.dispose()
