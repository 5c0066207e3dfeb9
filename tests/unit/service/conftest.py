"""Fixtures shared by the service unit tests."""

from __future__ import annotations

import pytest
from tests.unit.service.fakes import FakeBackend, dev_settings
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.store import JobStore, migrate


@pytest.fixture
def store(store_url):
    """A migrated, empty JobStore on SQLite and on PostgreSQL."""
    migrate(store_url)
    job_store = JobStore(store_url)
    yield job_store
    job_store.close()


@pytest.fixture
def client(tmp_path):
    """The API on a fake backend, with ``fakes.ADMIN`` as its admin token (no reconciler)."""
    with TestClient(create_app(dev_settings(tmp_path), backend=FakeBackend(),
                               reconcile=False)) as c:
        yield c
