"""The leases table: which replica leads the control loop, until when, with a fencing token.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, Sequence[str], None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Create the leases table."""
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )


def downgrade() -> None:
    """Drop the leases table."""
    op.drop_table("leases")
