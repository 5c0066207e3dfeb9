"""Item 15, throughput: what made every request slow under load, as counts that a
regression would change (the times themselves are measured by bench/api_load.py).

Each case runs against the real app (TestClient, FakeBackend, real SQLite store)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import yaml

from service.api import parsing
from tests.support.api import api_client
from tests.support.fakes import ADMIN_H, FakeBackend
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


def submits_share_one_cluster_read(tmp_path, monkeypatch) -> None:
    """Twenty submits in a row ask the cluster once, not once each (a Ray dashboard round
    trip in front of every POST /v1/jobs)."""
    backend = CountingBackend()
    with api_client(tmp_path, backend) as client:
        for _ in range(20):
            assert client.post("/v1/jobs", json=SPEC, headers=ADMIN_H).status_code == 201
        assert backend.cluster_calls <= 2, backend.cluster_calls


def listing_a_page_parses_no_spec_twice(tmp_path, monkeypatch) -> None:
    """Listing the same page again validates no stored spec again (50 specs were decoded
    and validated on every GET /v1/jobs)."""
    with api_client(tmp_path) as client:
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


def yaml_is_decoded_off_the_event_loop(tmp_path, monkeypatch) -> None:
    """A request sent while a YAML body is being decoded is answered before that ends (a
    299-byte body of aliases decoded on the event loop held every request for 0.3-2 s)."""
    entered, release = threading.Event(), threading.Event()
    decode = parsing._load_yaml

    def slow_decode(text: str, media_type: str):
        entered.set()
        release.wait(30)
        return decode(text, media_type)

    monkeypatch.setattr(parsing, "_load_yaml", slow_decode)
    answers: dict = {}
    with api_client(tmp_path) as client:

        def send(name: str, *args, **kwargs) -> threading.Thread:
            def call():
                answers[name] = client.request(*args, **kwargs)

            thread = threading.Thread(target=call)
            thread.start()
            return thread

        yaml_headers = {**ADMIN_H, "Content-Type": "application/yaml"}
        submit = send(
            "yaml", "POST", "/v1/jobs", content=yaml.safe_dump(SPEC), headers=yaml_headers
        )
        try:
            assert entered.wait(10), "the YAML body was never decoded"
            send("list", "GET", "/v1/jobs", headers=ADMIN_H).join(10)
            assert "list" in answers, "GET /v1/jobs waited for a YAML body being decoded"
            assert answers["list"].status_code == 200 and "yaml" not in answers
        finally:
            release.set()
            submit.join(30)
        assert answers["yaml"].status_code == 201, answers["yaml"].text


CASES: dict[str, Callable] = {
    "item15-one-cluster-read-for-many-submits": submits_share_one_cluster_read,
    "item15-list-page-reuses-parsed-specs": listing_a_page_parses_no_spec_twice,
    "yaml-decoded-off-the-event-loop": yaml_is_decoded_off_the_event_loop,
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_api_speed(case, tmp_path, monkeypatch):
    case(tmp_path, monkeypatch)
