"""Initial schema: tenants, api_tokens, jobs, job_events, job_metrics, job_checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written out by hand rather than importing service.store.models: a migration is
history and must keep creating exactly this schema when the models move on.
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _ts(name: str, nullable: bool = False) -> sa.Column:
    """A timezone-aware timestamp column."""
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    """Create every table of the first schema."""
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.UniqueConstraint("name", name="uq_tenants_name"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_api_tokens_tenant_id_tenants"
        ),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    _create_jobs()
    _create_job_children()


def _create_jobs() -> None:
    """Create the jobs table and its indexes."""
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("min_workers", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("restarts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("resubmits", sa.Integer(), server_default="0", nullable=False),
        sa.Column("step", sa.Integer(), server_default="0", nullable=False),
        sa.Column("submission_id", sa.String(128), nullable=True),
        sa.Column("dashboard_url", sa.String(512), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latest_metrics", sa.JSON(), nullable=True),
        sa.Column("warnings", sa.JSON(), nullable=True),
        _ts("created_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_jobs_tenant_id_tenants"),
    )
    op.create_index("ix_jobs_tenant_id", "jobs", ["tenant_id"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])


def _create_job_children() -> None:
    """Create the per-job event, metric and checkpoint tables."""
    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(32), nullable=False),
        _ts("ts"),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("dedup_key", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs"),
        sa.UniqueConstraint("job_id", "dedup_key", name="uq_job_events_job_id_dedup_key"),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "job_metrics",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        _ts("ts"),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.Column("samples_per_s", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "step", name="pk_job_metrics"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_metrics_job_id_jobs"),
    )
    op.create_table(
        "job_checkpoints",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("uri", sa.String(1024), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("save_s", sa.Float(), nullable=False),
        sa.Column("blocking_s", sa.Float(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("job_id", "step", name="pk_job_checkpoints"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_checkpoints_job_id_jobs"
        ),
    )


def downgrade() -> None:
    """Drop every table, children first."""
    for table in ("job_checkpoints", "job_metrics", "job_events", "jobs", "api_tokens", "tenants"):
        op.drop_table(table)
