"""What integration tests need: real Ray (one token-auth head per session, jobs through
Ray's job API), S3 and GCS endpoints and a PostgreSQL server on loopback, kustomize."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from service.backends.base import RunState
from tests.support.gcs_fixture import gcs_server  # noqa: F401 - the GCS endpoint fixture
from tests.support.kustomize import INSTALL_HINT, build, kustomize_path
from tests.support.mlflow_server import mlflow_server  # noqa: F401 - a tracking server
from tests.support.object_store_fixture import object_store  # noqa: F401 - S3 and GCS in turn
from tests.support.postgres import fresh_schema, postgres_server
from tests.support.ray_cluster import submit_job, wait_for_job
from tests.support.telemetry_sink import TelemetrySink


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory) -> str:
    """The session's PostgreSQL server (ETRAIN_TEST_POSTGRES_URL, else one it starts)."""
    yield from postgres_server(tmp_path_factory.mktemp("pg"))


@pytest.fixture
def store_url(postgres_url):
    """A fresh PostgreSQL schema (the unit tests' ``store_url`` is a SQLite file), dropped
    afterwards."""
    yield from fresh_schema(postgres_url)


@pytest.fixture(scope="session")
def telemetry_sink() -> TelemetrySink:
    """The session's telemetry receiver."""
    sink = TelemetrySink()
    yield sink
    sink.close()
    assert sink.refused == [], (
        f"the workers posted batches the service would refuse: {sink.refused}"
    )


def load_checkpoint_tensors(path: str | Path) -> dict:
    """All tensors of a committed DCP checkpoint as one plain state dict."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = Path(path).parent / f"{Path(path).name}.pt"
    if not out.exists():
        dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="session")
def run_job(ray_backend, telemetry_sink):
    """Run a spec as a real Ray job (workers.launch) reporting to the telemetry sink."""

    def run(*, job_id: str, spec: dict, extra_env: dict | None = None) -> RunState:
        submission = submit_job(
            ray_backend, job_id=job_id, spec=spec, report_url=telemetry_sink.url, env=extra_env
        )
        return wait_for_job(ray_backend, submission)

    return run


@pytest.fixture(scope="session")
def checkpoint_tensors():
    """Loader of a committed checkpoint's tensors."""
    return load_checkpoint_tensors


@pytest.fixture(scope="session")
def kustomize_build() -> Callable[[Path], list[dict]]:
    """``kustomize build`` by the real binary (`make kustomize` installs it); a missing
    binary fails, never skips.

    Builds are cached for the session because kustomize 4.5.4 spends about a
    second of CPU loading its OpenAPI schema on every run; each call gets a copy.
    """
    binary = kustomize_path()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(f"no kustomize binary at {binary}; {INSTALL_HINT}", pytrace=False)

    @functools.cache
    def cached(directory: Path) -> list[dict]:
        return build(directory, binary=binary)

    return lambda directory: copy.deepcopy(cached(Path(directory).resolve()))
