"""Per-job Prometheus series: telemetry posted through the API, read back from /metrics."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from service.api import prometheus as prom
from service.auth import create_reporter_token
from service.domain.job_metrics import JobMetrics
from service.status import JobStatus
from tests.support.fakes import ADMIN_H

SPEC = {"name": "tiny", "resources": {"workers": {"min": 1, "max": 2}}, "train": {"steps": 50}}


@pytest.fixture(autouse=True)
def _fresh_series(monkeypatch):
    """The registry is process-wide: start and end each test without per-job series."""
    for job_id in prom.JOB_METRICS.tracked():
        prom.JOB_METRICS.forget(job_id)
    yield
    for job_id in prom.JOB_METRICS.tracked():
        prom.JOB_METRICS.forget(job_id)


def _running_job(client: TestClient) -> tuple[str, dict]:
    r = client.post("/v1/jobs", json=SPEC, headers=ADMIN_H)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    stores = client.app.state.runtime.stores
    stores.jobs.update_job(job_id, status=JobStatus.PENDING, submission_id=f"etrain-{job_id}-0")
    token = create_reporter_token(
        stores.tokens, tenant_id=stores.jobs.get_job(job_id).tenant_id, job_id=job_id
    )
    return job_id, {"Authorization": f"Bearer {token}"}


def _post(client, job_id, headers, **batch) -> None:
    r = client.post(f"/v1/jobs/{job_id}/telemetry", headers=headers, json=batch)
    assert r.status_code == 200, r.text


def _series(client: TestClient, job_id: str) -> dict[str, float]:
    """Sample name -> value of every series labelled with ``job_id``."""
    r = client.get("/metrics", headers=ADMIN_H)  # per-job series: admin scrapes only
    assert r.status_code == 200
    return {
        s.name: s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
        if s.labels.get("job_id") == job_id and not s.name.endswith("_created")
    }


def _point(step: int, ts: float, **kw) -> dict:
    return {
        "step": step,
        "ts": ts,
        "loss": 4.0 - step / 100,
        "lr": 3e-4,
        "samples_per_s": 64.0 * step,
        "tokens_per_s": 8192.0 * step,
        "world_size": 2,
        "step_time_s": 0.25,
        **kw,
    }


def _event(kind: str, key: str) -> dict:
    return {"kind": kind, "message": kind, "dedup_key": key}


def test_metric_points_set_the_gauges_from_the_newest_point(client):
    job_id, rep = _running_job(client)
    now = time.time()
    _post(
        client,
        job_id,
        rep,
        metrics=[_point(9, now - 1), _point(10, now, world_size=4, step_time_s=0.5)],
    )
    series = _series(client, job_id)
    assert series["etrain_job_step"] == 10
    assert series["etrain_job_step_time_seconds"] == 0.5
    assert series["etrain_job_samples_per_second"] == 640.0
    assert series["etrain_job_tokens_per_second"] == 81920.0
    assert series["etrain_job_world_size"] == 4
    assert series["etrain_job_loss"] == pytest.approx(3.9)
    # A late replay of an older batch does not move the gauges back.
    _post(client, job_id, rep, metrics=[_point(3, now - 60, world_size=1, step_time_s=9.0)])
    series = _series(client, job_id)
    assert (series["etrain_job_step"], series["etrain_job_world_size"]) == (10, 4)
    assert series["etrain_job_step_time_seconds"] == 0.5


def test_the_eval_gauges_follow_the_newest_evaluation_until_a_restore_goes_back(client):
    job_id, rep = _running_job(client)
    now = time.time()
    _post(client, job_id, rep, metrics=[_point(1, now - 10)])
    assert not {"etrain_job_eval_loss", "etrain_job_eval_perplexity"} & set(_series(client, job_id))
    evaluated = _point(2, now - 9, eval_loss=3.25, eval_perplexity=25.8, eval_s=0.5)
    _post(client, job_id, rep, metrics=[evaluated, _point(3, now - 8)])
    _post(client, job_id, rep, metrics=[_point(4, now - 7)])  # no evaluation: it stays
    series = _series(client, job_id)
    assert series["etrain_job_step"] == 4 and series["etrain_job_eval_loss"] == 3.25
    assert series["etrain_job_eval_perplexity"] == 25.8
    _post(client, job_id, rep, metrics=[_point(5, now - 6, eval_loss=3.125)])  # overflowed
    series = _series(client, job_id)
    assert series["etrain_job_eval_loss"] == 3.125
    assert "etrain_job_eval_perplexity" not in series
    # Restored from step 1: step 2 is recomputed, the evaluation of step 5 is gone.
    _post(client, job_id, rep, metrics=[_point(2, now)])
    series = _series(client, job_id)
    assert series["etrain_job_step"] == 2 and "etrain_job_eval_loss" not in series


def test_restarts_and_resizes_count_new_events_only(client):
    job_id, rep = _running_job(client)
    batch = [
        _event("worker_failed", "fail:1"),
        _event("resized", "resize:1"),
        _event("checkpoint_saved", "ckpt:10"),
    ]
    for _ in range(3):  # the reporter retries the same batch
        _post(client, job_id, rep, events=batch)
    series = _series(client, job_id)
    assert series["etrain_job_restarts_total"] == 1
    assert series["etrain_job_resizes_total"] == 1
    _post(client, job_id, rep, events=[_event("worker_failed", "fail:2")])
    assert _series(client, job_id)["etrain_job_restarts_total"] == 2
    job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["restarts"] == 2  # the same count the store keeps


def test_counters_start_at_zero(client):
    job_id, rep = _running_job(client)
    _post(client, job_id, rep, metrics=[_point(1, time.time())])
    series = _series(client, job_id)
    assert series["etrain_job_restarts_total"] == 0 and series["etrain_job_resizes_total"] == 0


def test_checkpoint_blocking_follows_the_newest_checkpoint(client):
    job_id, rep = _running_job(client)

    def ck(step, blocking):
        return {
            "step": step,
            "uri": f"file:///c/{step}",
            "bytes": 10,
            "save_s": 1.0,
            "blocking_s": blocking,
        }

    _post(client, job_id, rep, checkpoints=[ck(10, 0.25), ck(20, 0.125)])
    assert _series(client, job_id)["etrain_job_checkpoint_blocking_seconds"] == 0.125
    _post(client, job_id, rep, checkpoints=[ck(10, 0.25)])  # a replayed older one
    assert _series(client, job_id)["etrain_job_checkpoint_blocking_seconds"] == 0.125
    _post(client, job_id, rep, checkpoints=[ck(30, 0.5)])
    assert _series(client, job_id)["etrain_job_checkpoint_blocking_seconds"] == 0.5


def test_series_of_an_ended_job_go_after_the_grace_period(client, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(prom.JOB_METRICS, "_clock", lambda: clock[0])
    monkeypatch.setattr(prom.JOB_METRICS, "ended_grace_s", 120.0)
    ended, rep = _running_job(client)
    alive, rep2 = _running_job(client)
    _post(client, ended, rep, metrics=[_point(5, time.time())])
    _post(client, alive, rep2, metrics=[_point(7, time.time())])
    # As the reconciler finishes a job (it revokes the reporter token afterwards).
    client.app.state.runtime.stores.jobs.update_job(ended, status=JobStatus.SUCCEEDED)

    assert _series(client, ended)["etrain_job_step"] == 5  # first scrape after the end
    clock[0] += 119
    assert _series(client, ended)["etrain_job_step"] == 5
    clock[0] += 1
    assert _series(client, ended) == {}
    assert _series(client, alive)["etrain_job_step"] == 7
    assert prom.JOB_METRICS.tracked() == {alive}
    # Telemetry that arrives after the end is ignored and brings nothing back.
    _post(client, ended, rep, events=[_event("worker_failed", "late")])
    assert _series(client, ended) == {}


def test_names_follow_prometheus_conventions():
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    metrics.observe_point("j-1", {"step": 1, "step_time_s": 0.5, "loss": None, "world_size": True})
    metrics.count_event("j-1", "resized")
    metrics.observe_checkpoint("j-1", 0.1)
    families = {f.name: f.type for f in registry.collect()}
    assert families["etrain_job_restarts"] == families["etrain_job_resizes"] == "counter"
    assert {n for n, t in families.items() if t == "gauge"} == {
        "etrain_job_rewards_accuracy",
        "etrain_job_rewards_margin",
        "etrain_job_step",
        "etrain_job_step_time_seconds",
        "etrain_job_samples_per_second",
        "etrain_job_tokens_per_second",
        "etrain_job_world_size",
        "etrain_job_loss",
        "etrain_job_eval_loss",
        "etrain_job_eval_perplexity",
        "etrain_job_checkpoint_blocking_seconds",
    }
    samples = {
        s.name: s.value
        for f in registry.collect()
        for s in f.samples
        if not s.name.endswith("_created")
    }
    assert samples == {
        "etrain_job_step": 1,
        "etrain_job_step_time_seconds": 0.5,
        "etrain_job_restarts_total": 0,
        "etrain_job_resizes_total": 1,
        "etrain_job_checkpoint_blocking_seconds": 0.1,
    }  # None and bool skipped
    metrics.forget("j-1")
    assert [s for f in registry.collect() for s in f.samples] == []
