"""Upgrade a job store database to the newest schema with Alembic's API.

There is no alembic.ini: the Config is built here so the packaged migrations
work from any working directory, and so Alembic never touches logging.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text

from service.store.database import build_engine

LOCK_KEY = 0x657472616E  # "etran": the advisory lock replicas take to migrate one at a time
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def build_alembic_config(url: str) -> Config:
    """Return an Alembic Config for ``url`` pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Config values go through ConfigParser interpolation; escape '%' (URL-encoded passwords).
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """Return the newest migration revision shipped with this package."""
    head = ScriptDirectory.from_config(build_alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found under {MIGRATIONS_DIR}; reinstall the package")
    return head


def migrate(url: str) -> None:
    """Upgrade the database at ``url`` to the newest schema; a no-op when already there."""
    config = build_alembic_config(url)
    # Run on our own engine so SQLite gets the same pragmas (WAL, busy timeout) as the store.
    engine = build_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # Replicas starting together migrate one at a time; the others then find
                # the schema at head. Held until this transaction ends.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        engine.dispose()
