"""Item 15, throughput: what made every request slow under load, as counts that a
regression would change (the times themselves are measured by bench/api_load.py).

Each case runs against the real app (TestClient, FakeBackend, real SQLite store)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support.fakes import ADMIN_H, FakeBackend, dev_settings
from workers.spec import JobSpec

SPEC = {
    "name": "one",
    "resources": {"workers": 1},
    "train": {"steps": 5, "global_batch_size": 4, "micro_batch_size": 4},
}


class CountingBackend(FakeBackend):
    """A FakeBackend that counts how often the cluster is asked for its shape."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.cluster_calls = 0

    def cluster(self):
        self.cluster_calls += 1
        return super().cluster()


def _app(tmp_path, backend: FakeBackend) -> TestClient:
    return TestClient(create_app(dev_settings(tmp_path), backend=backend, reconcile=False))


def submits_share_one_cluster_read(tmp_path, monkeypatch) -> None:
    """Twenty submits in a row ask the cluster once, not once each (a Ray dashboard round
    trip in front of every POST /v1/jobs)."""
    backend = CountingBackend()
    with _app(tmp_path, backend) as client:
        for _ in range(20):
            assert client.post("/v1/jobs", json=SPEC, headers=ADMIN_H).status_code == 201
        assert backend.cluster_calls <= 2, backend.cluster_calls


def listing_a_page_parses_no_spec_twice(tmp_path, monkeypatch) -> None:
    """Listing the same page again validates no stored spec again (50 specs were decoded
    and validated on every GET /v1/jobs)."""
    with _app(tmp_path, FakeBackend()) as client:
        for _ in range(30):
            assert client.post("/v1/jobs", json=SPEC, headers=ADMIN_H).status_code == 201
        assert client.get("/v1/jobs?limit=50", headers=ADMIN_H).status_code == 200
        parsed = []
        real = JobSpec.model_validate.__func__

        def counting(cls, *args, **kwargs):
            parsed.append(1)
            return real(cls, *args, **kwargs)

        monkeypatch.setattr(JobSpec, "model_validate", classmethod(counting))
        page = client.get("/v1/jobs?limit=50", headers=ADMIN_H)
        assert page.status_code == 200 and len(page.json()["items"]) == 30
        assert parsed == []


CASES: dict[str, Callable] = {
    "item15-one-cluster-read-for-many-submits": submits_share_one_cluster_read,
    "item15-list-page-reuses-parsed-specs": listing_a_page_parses_no_spec_twice,
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_api_speed(case, tmp_path, monkeypatch):
    case(tmp_path, monkeypatch)
