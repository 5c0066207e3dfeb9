"""A real PostgreSQL server for the store tests.

``ETRAIN_TEST_POSTGRES_URL`` names an existing server (CI starts Debian's with
``.ci/postgres.sh``); without it the session starts its own from the ``pgserver``
wheel (PostgreSQL 16, no root or apt needed) in a temporary folder and stops it at
the end. Either way the store tests run: a missing server is a failure, never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

URL_ENV = "ETRAIN_TEST_POSTGRES_URL"


def postgres_server(folder: Path) -> Iterator[str]:
    """A SQLAlchemy URL (psycopg 3) of a PostgreSQL server for this session."""
    url = os.environ.get(URL_ENV)
    if url:
        yield url
        return
    import pgserver

    server = pgserver.get_server(folder, cleanup_mode="stop")
    try:
        yield server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        server.cleanup()


def fresh_schema(url: str) -> Iterator[str]:
    """A URL of ``url``'s server whose connections use a new, empty schema (made their
    search_path through the URL); the schema is dropped afterwards, so tests never share
    rows."""
    import sqlalchemy as sa

    base = sa.make_url(url)
    schema = f"etrain_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        scoped = base.update_query_dict({"options": f"-csearch_path={schema}"})
        yield scoped.render_as_string(hide_password=False)
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()
