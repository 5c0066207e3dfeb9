"""Stored specs with their object-store options in the new ``stores`` section.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03

Until this release a spec carried the options of its ``s3://`` / ``gs://`` stores as
``checkpoint.s3`` / ``checkpoint.gcs``, although they governed ``model.hf``,
``model.tokenizer`` and ``data.path`` as much as ``checkpoint.storage``. They now live in
a section of their own, ``stores.s3`` / ``stores.gcs``; each stored spec is rewritten to
that form (the values unchanged). The move is written out here, as it was in this
release: a migration is history.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# checkpoint.<name> -> stores.<name> as of this release.
SECTIONS = ("s3", "gcs")


def with_stores(spec: dict) -> dict | None:
    """``spec`` with ``checkpoint.s3`` / ``checkpoint.gcs`` moved into ``stores``; None
    when it has neither key (nothing to rewrite). A value already in ``stores`` wins."""
    checkpoint = spec.get("checkpoint")
    if not isinstance(checkpoint, dict) or not any(n in checkpoint for n in SECTIONS):
        return None
    checkpoint = dict(checkpoint)
    stores = dict(spec.get("stores") or {})
    for name in SECTIONS:
        value = checkpoint.pop(name, None)
        if stores.get(name) is None:
            stores[name] = value
    return {**spec, "checkpoint": checkpoint, "stores": stores}


def without_stores(spec: dict) -> dict | None:
    """The inverse of :func:`with_stores`: ``stores`` moved back under ``checkpoint``."""
    stores = spec.get("stores")
    if not isinstance(stores, dict):
        return None
    checkpoint = {**(spec.get("checkpoint") or {}), **{n: stores.get(n) for n in SECTIONS}}
    rest = {k: v for k, v in spec.items() if k != "stores"}
    return {**rest, "checkpoint": checkpoint}


def _rewrite(change: Any) -> None:
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("spec", sa.JSON),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    conn = op.get_bind()
    now = dt.datetime.now(dt.UTC)
    for row in conn.execute(sa.select(jobs.c.id, jobs.c.spec)).all():
        spec = change(row.spec or {})
        if spec is not None:
            conn.execute(
                sa.update(jobs).where(jobs.c.id == row.id).values(spec=spec, updated_at=now)
            )


def upgrade() -> None:
    """Move every stored spec's checkpoint.s3 / checkpoint.gcs to stores.s3 / stores.gcs."""
    _rewrite(with_stores)


def downgrade() -> None:
    """Move stores.s3 / stores.gcs back under checkpoint (the form the release before read)."""
    _rewrite(without_stores)
