"""Fixtures of the service's unit tests."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client, submit


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[TestClient, str]:
    """One app and one QUEUED job for the read-only matrices (401s, 403s, 404s, 422s)."""
    with api_client(tmp_path_factory.mktemp("shared")) as client:
        yield client, submit(client, name="shared")["id"]
