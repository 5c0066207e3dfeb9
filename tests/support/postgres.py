"""A real PostgreSQL server for the store tests.

``ETRAIN_TEST_POSTGRES_URL`` names an existing server (CI starts Debian's with
``.ci/postgres.sh``); without it the session starts its own from the ``pgserver``
wheel (PostgreSQL 16, no root or apt needed) in a temporary folder and stops it at
the end. Either way the store tests run: a missing server is a failure, never a skip.
"""

from __future__ import annotations

import os
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
