"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest

from service.store import Stores, migrate
from tests.support.api import api_client
from tests.support.fakes import FakeBackend
from tests.support.s3_fixture import s3_server  # noqa: F401 - one per session: moto's state is per process


def pytest_configure(config):
    """Session-wide environment, set before any test imports Ray or gcsfs.

    - The tests' GCS endpoints are plain-http emulators: gcsfs must run without its
      gRPC bucket lookup, which it decides when it is imported.
    - No Google metadata server: a ``gs://`` store without an endpoint resolves through
      Google's default credential chain, which would otherwise probe 169.254.169.254
      (off this machine's loopback) and wait out three timeouts. google.auth reads
      ``NO_GCE_CHECK`` when it is imported.
    - One Ray auth token for the whole session. A process reads RAY_AUTH_MODE and the
      token once (Ray caches them), so a unit test that touched Ray's auth helpers
      before the session's Ray head existed would leave every later client
      unauthenticated (401). Every head, job and `etrain serve` started by the tests
      uses this token (ensure_ray_token keeps it).
    """
    import secrets
    import tempfile

    from workers.storage.credentials import GCSFS_GRPC_ENV

    os.environ.setdefault(GCSFS_GRPC_ENV, "false")
    os.environ.setdefault("NO_GCE_CHECK", "true")
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_MODE"] = "token"
        return
    path = os.path.join(tempfile.mkdtemp(prefix="etrain-test-ray-"), "ray_auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=path)


# Fixtures that start or use the session's Ray cluster or an `etrain serve`.
RAY_FIXTURES = frozenset(
    {"ray_head", "ray_backend", "run_job", "served", "serve_factory", "overlay"}
)


def pytest_collection_modifyitems(config, items):
    """A test marked ``no_ray`` uses none of RAY_FIXTURES: ``make test`` runs those tests in
    a pytest of their own beside the Ray tests, at a lower priority (tests/run_beside.sh)."""
    for item in items:
        if item.get_closest_marker("no_ray") is not None:
            used = RAY_FIXTURES & set(getattr(item, "fixturenames", ()))
            if used:
                raise pytest.UsageError(f"{item.nodeid} is marked no_ray but uses {sorted(used)}")


@pytest.fixture
def store_url(tmp_path):
    """A SQLAlchemy URL for an empty database: a SQLite file here; a fresh PostgreSQL
    schema in tests/integration, whose conftest overrides this fixture."""
    return f"sqlite:///{tmp_path / 'etrain.db'}"


@pytest.fixture
def stores(store_url):
    """The stores of a migrated, empty database."""
    migrate(store_url)
    opened = Stores.open(store_url)
    yield opened
    opened.close()


@pytest.fixture
def backend() -> FakeBackend:
    """The fake cluster behind ``client``: script its answers, read what it was sent."""
    return FakeBackend()


@pytest.fixture
def client(tmp_path, backend):
    """The API on ``backend``, with ``fakes.ADMIN`` as its admin token (no reconciler)."""
    with api_client(tmp_path, backend) as c:
        yield c


@pytest.fixture(scope="session")
def ray_backend(ray_head):
    """A token-auth Ray head (dashboard on) shared by the session, behind the real backend.

    Integration tests submit jobs through it; e2e tests point `etrain serve
    --ray-address` at it. Its token reaches child processes through the
    RAY_AUTH_* variables that ensure_ray_token exports.
    """
    import sys

    from service.backends.ray_jobs import RayJobBackend

    backend = RayJobBackend(ray_head.address, python=sys.executable, probe_agent=True)
    yield backend


@pytest.fixture(scope="session")
def overlay():
    """A second host's network for this run (tests.support.netns): a namespace at
    ``overlay.node_ip``, reaching this machine at ``overlay.host_ip`` only."""
    from tests.support.netns import overlay as make

    with make() as net:
        yield net


# The session head's GCS waits 2 s (Ray: 10 s) for each health check of a node: a node
# whose link is cut (tests.support.ray_cluster.join_node) is declared dead after about 10 s
# instead of 35 s. A busy node still has 3 checks in a row of 2 s each to answer.
HEALTH_CHECK_TIMEOUT_ENV = {"RAY_health_check_timeout_ms": "2000"}


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory, overlay):
    """The session's Ray head (``ray_backend`` submits to it), on free ports: another test
    run, a dev server or a second checkout on this machine does not collide with it. It
    advertises ``overlay.host_ip``, where a node in the overlay's namespace joins it
    (``ray_head.gcs_address``; tests.support.ray_cluster.join_node).
    """
    from service.backends.embedded import EmbeddedRay

    head = EmbeddedRay(
        data_dir=tmp_path_factory.mktemp("ray-head"), num_cpus=2, node_ip=overlay.host_ip
    )
    head.gcs_env = {**head.gcs_env, **HEALTH_CHECK_TIMEOUT_ENV}
    head.start()
    yield head
    head.stop()
