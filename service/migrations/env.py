"""Alembic environment for the etrain job store.

Configured programmatically by ``service.store.migrate.migrate``; there is no
alembic.ini and no logging setup here (the service owns logging).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from service.store.database import build_engine
from service.store.models import Base

target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    """Bind the migration context to ``connection``."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    """Emit the migration SQL for ``sqlalchemy.url`` without connecting."""
    url = context.config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations on the caller's connection, or on a fresh engine for the URL."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = build_engine(context.config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
