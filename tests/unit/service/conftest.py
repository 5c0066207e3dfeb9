"""Fixtures shared by the service unit tests."""

from __future__ import annotations

import pytest

from service.store import JobStore, migrate


@pytest.fixture
def store(store_url):
    """A migrated, empty JobStore on SQLite and on PostgreSQL."""
    migrate(store_url)
    job_store = JobStore(store_url)
    yield job_store
    job_store.close()
