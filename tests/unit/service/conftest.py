"""Fixtures of the service's unit tests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client, submit


@pytest.fixture(scope="module")
def module_client(tmp_path_factory):
    """The API on a fake backend, one per test module: for tests that change nothing."""
    with api_client(tmp_path_factory.mktemp("api")) as client:
        yield client


@pytest.fixture(scope="module")
def shared(module_client) -> tuple[TestClient, str]:
    """One app and one QUEUED job for the read-only matrices (401s, 403s, 404s, 422s)."""
    return module_client, submit(module_client, name="shared")["id"]
