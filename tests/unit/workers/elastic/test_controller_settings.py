"""The Ray Train controller settings a job's driver sets before Ray Train reads them."""

from __future__ import annotations

import os

import pytest

from workers.elastic.settings import CONTROLLER_ENV, ELASTIC_CONTROLLER_ENV, apply_controller_env

NAMES = sorted(ELASTIC_CONTROLLER_ENV)


@pytest.fixture
def clean_env(monkeypatch):
    """A copy of the environment without the settings; nothing reaches the real one (a
    head started later in this session would pass it on to every job)."""
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in NAMES})


def test_every_job_polls_its_workers_every_half_second(clean_env):
    apply_controller_env(elastic=False)
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"
    # A fixed-size job waits for its resources as long as Ray does.
    assert "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S" not in os.environ
    assert {n: os.environ.get(n) for n in NAMES if n in os.environ} == CONTROLLER_ENV


def test_an_elastic_job_gets_the_timeouts_too(clean_env):
    apply_controller_env(elastic=False)
    apply_controller_env(elastic=True)
    assert {n: os.environ[n] for n in NAMES} == {
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
        "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S": "30",
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5",
    }


def test_the_jobs_own_environment_wins(clean_env):
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "2"
    apply_controller_env(elastic=True)
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "2"
