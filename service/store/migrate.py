"""Upgrade a job store database to the newest schema with Alembic's API.

There is no alembic.ini: the Config is built here so the packaged migrations
work from any working directory, and so Alembic never touches logging.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from service.store.database import build_engine

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
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        engine.dispose()
