"""Indexes for a tenant's jobs: by status (the queued-jobs quota counted at every
submit) and newest first (a page of GET /v1/jobs). With only ix_jobs_status, the quota's
count read every QUEUED job of every tenant.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from typing import Sequence, Union

from alembic import op

revision: str = "0006"
down_revision: Union[str, Sequence[str], None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Index (tenant_id, status) and (tenant_id, created_at, id); the first replaces
    ix_jobs_tenant_id, which it begins with."""
    op.create_index("ix_jobs_tenant_status", "jobs", ["tenant_id", "status"])
    op.create_index("ix_jobs_tenant_created", "jobs", ["tenant_id", "created_at", "id"])
    op.drop_index("ix_jobs_tenant_id", table_name="jobs")


def downgrade() -> None:
    """Back to the single-column index."""
    op.create_index("ix_jobs_tenant_id", "jobs", ["tenant_id"])
    op.drop_index("ix_jobs_tenant_created", table_name="jobs")
    op.drop_index("ix_jobs_tenant_status", table_name="jobs")
