"""Shared pytest fixtures."""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa
from tests.support.gcs_fixture import gcs_server  # noqa: F401 - the session-scoped GCS endpoint fixture
from tests.support.object_store_fixture import object_store  # noqa: F401 - S3 and GCS in turn
from tests.support.postgres import postgres_server
from tests.support.s3_fixture import s3_server  # noqa: F401 - the session-scoped S3 endpoint fixture


def pytest_configure(config):
    """One Ray auth token for the whole session, set before any test imports Ray.

    A process reads RAY_AUTH_MODE and the token once (Ray caches them), so a unit
    test that touched Ray's auth helpers before the session's Ray head existed
    would leave every later client unauthenticated (401). Every head, job and
    `etrain serve` started by the tests uses this token (ensure_ray_token keeps it).
    """
    import secrets
    import tempfile

    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_MODE"] = "token"
        return
    path = os.path.join(tempfile.mkdtemp(prefix="etrain-test-ray-"), "ray_auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=path)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory) -> str:
    """The session's PostgreSQL server (ETRAIN_TEST_POSTGRES_URL, else one it starts)."""
    yield from postgres_server(tmp_path_factory.mktemp("pg"))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    """A SQLAlchemy URL for an empty database: a SQLite file, or a fresh PostgreSQL schema.

    Each PostgreSQL test gets its own schema (made the connection's search_path
    through the URL) and the schema is dropped afterwards, so tests never share rows.
    """
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'etrain.db'}"
        return
    base = sa.make_url(request.getfixturevalue("postgres_url"))
    schema = f"etrain_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        url = base.update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def ray_backend(tmp_path_factory):
    """A token-auth Ray head (dashboard on) shared by the session, behind the real backend.

    Integration tests submit jobs through it; e2e tests point `etrain serve
    --ray-address` at it. Its token reaches child processes through the
    RAY_AUTH_* variables that ensure_ray_token exports.
    """
    import sys

    from service.backends.embedded import EmbeddedRay
    from service.backends.ray_jobs import RayJobBackend

    head = EmbeddedRay(data_dir=tmp_path_factory.mktemp("ray-head"), num_cpus=2,
                       dashboard_port=8310, gcs_port=6510)
    backend = RayJobBackend(head.start(), python=sys.executable)
    yield backend
    head.stop()
