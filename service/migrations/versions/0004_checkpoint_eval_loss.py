"""Committed checkpoints keep the held-out loss of their step.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

Jobs may evaluate a held-out set and keep their best checkpoints by it
(``checkpoint.keep_best``): each checkpoint record now carries the ``eval_loss`` of its
step, stored in a nullable column (checkpoints stored before, and those of steps that did
not evaluate, have none).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_checkpoints") as batch:
        batch.add_column(sa.Column("eval_loss", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_checkpoints") as batch:
        batch.drop_column("eval_loss")
