"""The cluster shape shared by requests: read at most once per period, failures included."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from service.domain.cluster_view import cluster_info
from service.errors import BackendUnavailable
from tests.support.fakes import FakeBackend


class CountingBackend(FakeBackend):
    def __init__(self, *, delay_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.reads, self.delay_s, self.error = 0, delay_s, None

    def cluster(self):
        self.reads += 1
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return super().cluster()


def test_reads_within_the_period_share_one_answer_then_it_is_read_again():
    backend = CountingBackend(cpus=4)
    assert cluster_info(backend, max_age_s=0.2).total == {"CPU": 4}
    assert cluster_info(backend, max_age_s=0.2) is cluster_info(backend, max_age_s=0.2)
    assert backend.reads == 1
    time.sleep(0.25)
    cluster_info(backend, max_age_s=0.2)
    assert backend.reads == 2
    assert cluster_info(CountingBackend(cpus=8)).total == {"CPU": 8}  # per backend


def test_concurrent_requests_wait_for_one_read_instead_of_each_asking():
    backend = CountingBackend(cpus=2, delay_s=0.2)
    answers = []
    threads = [
        threading.Thread(target=lambda: answers.append(cluster_info(backend))) for _ in range(20)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert backend.reads == 1 and len(answers) == 20


def test_an_unreachable_cluster_costs_one_read_per_period():
    backend = CountingBackend()
    backend.error = BackendUnavailable("dashboard does not answer")
    for _ in range(5):
        with pytest.raises(BackendUnavailable, match="does not answer"):
            cluster_info(backend, max_age_s=0.2)
    assert backend.reads == 1
    backend.error = None
    time.sleep(0.25)
    assert cluster_info(backend, max_age_s=0.2).total == {"CPU": 2.0}


def test_past_the_period_one_request_reads_while_the_others_keep_the_previous_answer():
    backend = CountingBackend(cpus=2)
    first = cluster_info(backend, max_age_s=0.05)
    time.sleep(0.1)
    backend.delay_s = 0.5
    backend.info = dataclasses.replace(backend.info, total={"CPU": 6.0})
    reader = threading.Thread(target=lambda: cluster_info(backend, max_age_s=0.05))
    reader.start()
    time.sleep(0.1)  # the reader is inside backend.cluster() now
    t0 = time.monotonic()
    assert cluster_info(backend, max_age_s=0.05) is first  # not waiting for the reader
    assert time.monotonic() - t0 < 0.2
    reader.join()
    assert cluster_info(backend, max_age_s=5).total == {"CPU": 6.0}
    assert backend.reads == 2
