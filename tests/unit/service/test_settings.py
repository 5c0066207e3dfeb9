"""Settings refuse unsafe defaults in production, whichever way they are given."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from service.settings import Settings

PG = "postgresql+psycopg://etrain:pw@db:5432/etrain"


@pytest.fixture(autouse=True)
def no_etrain_env(monkeypatch):
    """Only what each test passes counts: no ETRAIN_* from the environment."""
    for name in [n for n in os.environ if n.startswith("ETRAIN_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"admin_token": "t"}, "ETRAIN_DATABASE_URL"),  # unset: the SQLite default
        ({"admin_token": "t", "database_url": "sqlite:////tmp/x.db"}, "ETRAIN_DATABASE_URL"),
        ({"admin_token": "t", "database_url": "mysql://x/y"}, "ETRAIN_DATABASE_URL"),
        ({"database_url": PG}, "ETRAIN_ADMIN_TOKEN"),
    ],
    ids=["sqlite-default", "sqlite-explicit", "not-postgres", "no-admin-token"],
)
def test_production_refuses_unsafe_defaults(given, refused):
    with pytest.raises(ValidationError, match=refused):
        Settings(env="production", **given)


def test_production_refusals_also_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ETRAIN_ENV", "production")
    monkeypatch.setenv("ETRAIN_ADMIN_TOKEN", "t")
    with pytest.raises(ValidationError, match="ETRAIN_DATABASE_URL"):
        Settings()
    monkeypatch.setenv("ETRAIN_DATABASE_URL", PG)
    assert Settings().db_url == PG


def test_production_with_postgres_and_a_token_is_accepted():
    s = Settings(env="production", admin_token="t", database_url=PG)
    assert s.env == "production" and s.db_url == PG


def test_development_keeps_the_sqlite_default(tmp_path):
    s = Settings(data_dir=tmp_path)
    assert s.db_url == f"sqlite:///{tmp_path / 'etrain.db'}"
