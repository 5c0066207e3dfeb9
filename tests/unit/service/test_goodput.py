"""Goodput: a hand-computed timeline split into productive time and its breakdown,
edge cases, and GET /v1/jobs/{id}/goodput with tenant isolation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from service.domain.goodput import BREAKDOWN_KEYS, compute_goodput
from service.status import JobStatus
from service.store import EventRecord
from tests.support.api import reporter, submit, tenant_token
from tests.support.fakes import ADMIN_H
from tests.support.specs import spec

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(finished: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(created_at=T0, finished_at=None if finished is None else at(finished))


def ev(ts: float, kind: str, **data) -> EventRecord:
    return EventRecord(
        id=0, job_id="j", ts=at(ts), kind=kind, message=kind, data=data or None, dedup_key=None
    )


def run(
    first: int,
    last: int,
    start: float,
    *,
    step_s: float = 0.5,
    every: int = 20,
    block_s: float = 1.0,
    evaluate: int = 0,
    eval_s: float = 0.0,
) -> tuple[dict[int, dict], list[EventRecord], float]:
    """Steps first..last from ``start``, an evaluation of ``eval_s`` after every
    ``evaluate``-th step (it ends after the step's ``ts``), then a checkpoint blocking
    ``block_s`` after every ``every``-th step. Returns metrics by step, checkpoint_saved
    events, and the end time."""
    metrics, saves, t = {}, [], start
    for step in range(first, last + 1):
        t += step_s
        metrics[step] = {"step": step, "ts": at(t), "step_time_s": step_s, "world_size": 2}
        if evaluate and step % evaluate == 0:
            t += eval_s
            metrics[step].update(eval_loss=4.0 - step / 100, eval_s=eval_s, eval_samples=32)
        if every and step % every == 0:
            t += block_s
            saves.append(ev(t, "checkpoint_saved", step=step, bytes=10, save_s=2.0))
    return metrics, saves, t


def check_sums(g) -> None:
    assert set(g.breakdown) == set(BREAKDOWN_KEYS)
    assert all(v >= 0 for v in g.breakdown.values()) and g.productive_s >= 0
    assert g.productive_s + sum(g.breakdown.values()) == pytest.approx(g.wall_s)


def timeline(*, interruption: str = "worker_failed", **restored_extra):
    """Queued 10 s, start-up 20 s, 100 steps of 0.5 s, a checkpoint blocking 1 s every 20
    steps, an interruption at step 55 (0.2 s after it), a restore from step 40 that takes
    15 s to the next step, steps 41..55 recomputed, finished 2.3 s after the last save."""
    m1, saves1, _ = run(1, 55, 30.0)  # steps 1..55 end at 59.5
    m2, saves2, last_save = run(41, 100, 74.7)  # 74.7 + 60 x 0.5 + 3 x 1 = 107.7
    events = [
        ev(10, "admitted"),
        ev(11, "submitted"),
        ev(12, "started"),
        ev(30.2, "workers_started", world_size=2),
        ev(30.5, "memory"),
        *saves1,
        ev(59.7, interruption),
        ev(74.7, "workers_started", world_size=2),
        ev(74.7, "restored", step=40, world_size=2, **restored_extra),
        *saves2,
        ev(110, "succeeded"),
    ]
    # Only the newest three checkpoints are still stored (keep_last: 3).
    checkpoints = [{"step": s, "blocking_s": 1.0} for s in (60, 80, 100)]
    return events, {**m1, **m2}, checkpoints, last_save, m1


@pytest.mark.parametrize("interruption", ["worker_failed", "resized", "resubmitted"])
def test_a_finished_job_with_one_failure(interruption):
    events, metrics, checkpoints, last_save, _ = timeline(interruption=interruption)
    assert last_save == pytest.approx(107.7)
    g = compute_goodput(
        job=job(finished=110),
        events=events,
        metrics=list(metrics.values()),
        checkpoints=checkpoints,
        now=at(999),
    )
    assert g.wall_s == pytest.approx(110)
    assert g.productive_s == pytest.approx(50.0)  # 100 steps x 0.5 s, each once
    assert g.breakdown == pytest.approx(
        {
            "waiting_s": 10.0,
            "startup_s": 20.0,
            "checkpoint_blocking_s": 5.0,  # five saves, two no longer stored
            "eval_s": 0.0,
            "restart_restore_s": 15.0,
            "recomputed_s": 7.5,  # steps 41..55 twice
            "other_s": 2.5,
        }
    )  # 0.2 s to notice + 2.3 s teardown
    assert g.goodput == pytest.approx(50 / 110)
    assert (g.steps, g.recomputed_steps) == (100, 15)
    assert any("estimated from timestamps" in n for n in g.notes)
    assert any("2 save(s)" in n for n in g.notes)
    check_sums(g)


def test_a_running_job_is_measured_to_now_and_unredone_steps_are_not_productive():
    events, _, _, _, m1 = timeline()
    m2, _, _ = run(41, 50, 74.7)  # step 50 ends at 79.7
    metrics = {**m1, **m2}  # 51..55 still from the first run
    events = [e for e in events if e.ts <= at(80)]
    checkpoints = [{"step": 20, "blocking_s": 1.0}, {"step": 40, "blocking_s": 1.0}]
    g = compute_goodput(
        job=job(),
        events=events,
        metrics=list(metrics.values()),
        checkpoints=checkpoints,
        now=at(80),
    )
    assert g.wall_s == pytest.approx(80)
    assert g.productive_s == pytest.approx(25.0)  # steps 1..50; 51..55 were lost
    assert g.breakdown == pytest.approx(
        {
            "waiting_s": 10.0,
            "startup_s": 20.0,
            "checkpoint_blocking_s": 2.0,
            "eval_s": 0.0,
            "restart_restore_s": 15.0,
            "recomputed_s": 7.5,
            "other_s": 0.5,
        }
    )
    assert g.recomputed_steps == 15
    check_sums(g)


def test_a_reported_high_water_step_is_used_as_is():
    events, metrics, checkpoints, _, _ = timeline(reported_step=52)
    g = compute_goodput(
        job=job(finished=110),
        events=events,
        metrics=list(metrics.values()),
        checkpoints=checkpoints,
        now=at(999),
    )
    assert g.recomputed_steps == 12
    assert g.breakdown["recomputed_s"] == pytest.approx(6.0)
    assert g.breakdown["other_s"] == pytest.approx(4.0)
    assert not any("estimated from timestamps" in n for n in g.notes)
    check_sums(g)


def test_a_restart_before_the_first_checkpoint_recomputes_from_scratch():
    m1, _, _ = run(1, 10, 5.0, every=0)  # steps end at 10.0
    m2, _, _ = run(1, 10, 20.0, every=0)  # no restored event: from step 0
    events = [
        ev(0, "admitted"),
        ev(5, "workers_started"),
        ev(10.2, "worker_failed"),
        ev(20, "workers_started"),
        ev(25, "succeeded"),
    ]
    g = compute_goodput(
        job=job(finished=25),
        events=events,
        metrics=list({**m1, **m2}.values()),
        checkpoints=[],
        now=at(25),
    )
    assert g.productive_s == pytest.approx(5.0)
    assert g.recomputed_steps == 10
    assert g.breakdown == pytest.approx(
        {
            "waiting_s": 0.0,
            "startup_s": 5.0,
            "checkpoint_blocking_s": 0.0,
            "eval_s": 0.0,
            "restart_restore_s": 9.8,
            "recomputed_s": 5.0,
            "other_s": 0.2,
        }
    )
    check_sums(g)


def test_a_job_that_fails_for_good_keeps_its_last_steps_and_recomputes_nothing():
    metrics, saves, _ = run(1, 55, 30.0)
    events = [
        ev(10, "admitted"),
        ev(30, "workers_started"),
        *saves,
        ev(59.7, "worker_failed"),
        ev(65, "failed"),
    ]
    g = compute_goodput(
        job=job(finished=65),
        events=events,
        metrics=list(metrics.values()),
        checkpoints=[{"step": 40, "blocking_s": 1.0}],
        now=at(999),
    )
    assert g.productive_s == pytest.approx(27.5) and g.recomputed_steps == 0
    assert g.breakdown == pytest.approx(
        {
            "waiting_s": 10.0,
            "startup_s": 20.0,
            "checkpoint_blocking_s": 2.0,
            "eval_s": 0.0,
            "restart_restore_s": 5.3,
            "recomputed_s": 0.0,
            "other_s": 0.2,
        }
    )
    check_sums(g)


def test_evaluations_are_their_own_part_counted_once_per_step():
    """The same job with and without an evaluation every 5 steps: the evaluations' time
    is its own part, neither productive nor other; a point stored twice counts once."""

    def goodput(evaluate: int, eval_s: float, *, replays: tuple[int, ...] = ()):
        metrics, saves, end = run(1, 20, 30.0, every=10, evaluate=evaluate, eval_s=eval_s)
        events = [ev(10, "admitted"), ev(29.0, "workers_started"), *saves, ev(end, "succeeded")]
        points = [*metrics.values(), *(dict(metrics[s]) for s in replays)]
        g = compute_goodput(
            job=job(finished=end + 1.5), events=events, metrics=points, checkpoints=[], now=at(999)
        )
        return g, metrics, end

    plain, _, plain_end = goodput(0, 0.0)
    evaluated, metrics, end = goodput(5, 2.5, replays=(5, 10))
    evals = [m["eval_s"] for m in metrics.values() if "eval_s" in m]
    assert len(evals) == 4 and end == pytest.approx(plain_end + sum(evals))
    assert evaluated.breakdown["eval_s"] == pytest.approx(sum(evals))
    assert plain.breakdown["eval_s"] == 0.0
    assert evaluated.productive_s == pytest.approx(plain.productive_s)
    assert evaluated.productive_s == pytest.approx(sum(m["step_time_s"] for m in metrics.values()))
    assert evaluated.steps == plain.steps == 20
    assert evaluated.wall_s == pytest.approx(plain.wall_s + sum(evals))
    for key in set(BREAKDOWN_KEYS) - {"eval_s"}:
        assert evaluated.breakdown[key] == pytest.approx(plain.breakdown[key]), key
    check_sums(evaluated)


def test_no_metrics_yet():
    g = compute_goodput(
        job=job(),
        events=[ev(10, "admitted"), ev(11, "submitted")],
        metrics=[],
        checkpoints=[],
        now=at(25),
    )
    assert (g.wall_s, g.productive_s, g.goodput, g.steps) == (25, 0, 0, 0)
    assert g.breakdown["waiting_s"] == 10 and g.breakdown["startup_s"] == 15
    check_sums(g)


@pytest.mark.parametrize(
    ("finished", "now", "wall"),
    [(None, 40, 40), (40, 999, 40)],
    ids=["still-queued", "cancelled-in-queue"],
)
def test_a_job_that_never_started_only_waited(finished, now, wall):
    events = [ev(40, "cancelled")] if finished else []
    g = compute_goodput(job=job(finished), events=events, metrics=[], checkpoints=[], now=at(now))
    assert g.wall_s == wall and g.breakdown["waiting_s"] == wall and g.goodput == 0
    check_sums(g)


def test_requeued_time_is_waiting_not_startup():
    metrics, _, _ = run(1, 4, 25.0, every=0)  # steps end at 27.0
    events = [ev(10, "admitted"), ev(12, "requeued"), ev(20, "admitted"), ev(25, "workers_started")]
    g = compute_goodput(
        job=job(), events=events, metrics=list(metrics.values()), checkpoints=[], now=at(30)
    )
    assert g.productive_s == pytest.approx(2.0)
    assert g.breakdown == pytest.approx(
        {
            "waiting_s": 18.0,
            "startup_s": 7.0,
            "checkpoint_blocking_s": 0.0,
            "eval_s": 0.0,
            "restart_restore_s": 0.0,
            "recomputed_s": 0.0,
            "other_s": 3.0,
        }
    )


def test_a_zero_wall_time_and_overfull_parts_stay_consistent():
    empty = compute_goodput(job=job(), events=[], metrics=[], checkpoints=[], now=T0)
    assert (empty.wall_s, empty.goodput) == (0, 0)
    check_sums(empty)
    # Step times longer than the wall (clock skew) are cut to fit; nothing goes negative.
    metrics = [{"step": 1, "ts": at(5), "step_time_s": 30.0}]
    g = compute_goodput(
        job=job(finished=10),
        events=[],
        metrics=metrics,
        checkpoints=[{"step": 1, "blocking_s": 4.0}],
        now=at(10),
    )
    assert g.productive_s == 10 and g.goodput == 1.0
    check_sums(g)


def test_steps_without_a_step_time_count_at_the_median():
    metrics = [
        {"step": 1, "ts": at(5), "step_time_s": 1.0},
        {"step": 2, "ts": at(6), "step_time_s": 1.0},
        {"step": 3, "ts": at(7)},
    ]
    g = compute_goodput(
        job=job(finished=10),
        events=[ev(0, "admitted")],
        metrics=metrics,
        checkpoints=[],
        now=at(10),
    )
    assert g.productive_s == pytest.approx(3.0)
    assert any("no step_time_s" in n for n in g.notes)


# -- REST ---------------------------------------------------------------------------


def test_goodput_route_reports_a_tenants_own_job_only(client):
    a, b = tenant_token(client, "tenant-a"), tenant_token(client, "tenant-b")
    job_id = submit(client, a, base=spec(resources={"workers": 2}))["id"]
    stores = client.app.state.runtime.stores
    stores.jobs.update_job(job_id, status=JobStatus.PENDING)
    job = stores.jobs.get_job(job_id)
    sender = reporter(client, job_id)
    t0 = job.created_at.timestamp() + 10  # queued 10 s (never admitted), then 2 steps
    points = [{"step": s, "ts": t0 + s / 2, "world_size": 2, "step_time_s": 0.5} for s in (1, 2)]
    points[1].update(eval_loss=3.5, eval_s=0.75)
    assert (
        client.post(
            f"/v1/jobs/{job_id}/telemetry", json={"metrics": points}, headers=sender
        ).status_code
        == 200
    )
    stores.jobs.update_job(job_id, finished_at=job.created_at + timedelta(seconds=100))

    r = client.get(f"/v1/jobs/{job_id}/goodput", headers=a)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["wall_s"] == pytest.approx(100) and body["steps"] == 2
    assert body["productive_s"] == pytest.approx(1.0) and body["goodput"] == pytest.approx(0.01)
    assert set(body["breakdown"]) == set(BREAKDOWN_KEYS)
    assert body["breakdown"]["waiting_s"] == pytest.approx(10.0)
    assert body["breakdown"]["eval_s"] == pytest.approx(points[1]["eval_s"])
    assert body["productive_s"] + sum(body["breakdown"].values()) == pytest.approx(100)

    assert client.get(f"/v1/jobs/{job_id}/goodput", headers=b).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/goodput", headers=ADMIN_H).status_code == 200
    assert client.get("/v1/jobs/nope/goodput", headers=a).status_code == 404
