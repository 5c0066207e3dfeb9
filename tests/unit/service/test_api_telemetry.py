"""A job's reporter token sends telemetry (metrics, events, checkpoints, memory); the job's
logs, metrics, events, checkpoints and memory routes answer with what was sent."""

from __future__ import annotations

import time

import pytest

from service.status import JobStatus
from tests.support.api import (
    api_client,
    make_pending,
    metric_point,
    reporter,
    stores,
    submit,
    tenant_token,
)
from tests.support.fakes import ADMIN_H

# -- logs ------------------------------------------------------------------------


def test_logs_before_and_after_submission(client, backend):
    job_id = submit(client)["id"]
    assert client.get(f"/v1/jobs/{job_id}/logs", headers=ADMIN_H).text == ""
    make_pending(client, job_id, submission_id="etrain-x-0")
    backend.log_text["etrain-x-0"] = "step 1 loss 5.5\nstep 2 loss 5.1\n"
    r = client.get(f"/v1/jobs/{job_id}/logs", headers=ADMIN_H)
    assert r.status_code == 200 and r.text == "step 1 loss 5.5\nstep 2 loss 5.1\n"
    followed = client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=ADMIN_H)
    assert followed.status_code == 200 and followed.text == r.text


# -- telemetry -------------------------------------------------------------------


def test_telemetry_needs_the_jobs_own_reporter_token(client):
    job_id = submit(client)["id"]
    other_id = submit(client, name="other")["id"]
    batch = {"metrics": [metric_point(1)]}
    assert (
        client.post(f"/v1/jobs/{job_id}/telemetry", json=batch, headers=ADMIN_H).status_code == 403
    )
    user = tenant_token(client, "acme")
    assert client.post(f"/v1/jobs/{job_id}/telemetry", json=batch, headers=user).status_code == 403
    assert (
        client.post(
            f"/v1/jobs/{job_id}/telemetry", json=batch, headers=reporter(client, other_id)
        ).status_code
        == 403
    )
    assert client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"] == []


def test_telemetry_metrics_move_a_pending_job_to_running(client):
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    sender = reporter(client, job_id)
    r = client.post(
        f"/v1/jobs/{job_id}/telemetry",
        headers=sender,
        json={"metrics": [metric_point(1), metric_point(2, step_time_s=0.5)]},
    )
    assert r.status_code == 200 and r.json() == {"accepted": 2}

    items = client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"]
    assert [p["step"] for p in items] == [1, 2]
    assert items[1]["loss"] == pytest.approx(4.8) and items[1]["step_time_s"] == 0.5
    after = client.get(
        f"/v1/jobs/{job_id}/metrics", params={"after_step": 1}, headers=ADMIN_H
    ).json()["items"]
    assert [p["step"] for p in after] == [2]

    job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["status"] == "RUNNING" and job["started_at"]
    assert job["step"] == 2 and job["world_size"] == 2
    assert job["metrics"]["loss"] == pytest.approx(4.8)


def test_telemetry_events_dedupe_and_worker_failures_count_restarts(client):
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    sender = reporter(client, job_id)
    saved = {
        "kind": "checkpoint_saved",
        "message": "checkpoint saved at step 2",
        "data": {"step": 2},
        "dedup_key": "ckpt:2",
    }
    failed = {
        "kind": "worker_failed",
        "message": "worker(s) [1] failed: killed",
        "dedup_key": "fail:1",
    }
    for _ in range(2):  # a retried batch must not double-count
        r = client.post(
            f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"events": [saved, failed]}
        )
        assert r.status_code == 200
    events = client.get(f"/v1/jobs/{job_id}/events", headers=ADMIN_H).json()["items"]
    assert [e["kind"] for e in events].count("checkpoint_saved") == 1
    assert [e["kind"] for e in events].count("worker_failed") == 1
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["restarts"] == 1

    second = {**failed, "dedup_key": "fail:2"}
    client.post(f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"events": [second]})
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["restarts"] == 2


def test_telemetry_checkpoints_are_listed(client):
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    sender = reporter(client, job_id)
    ckpts = [
        {
            "step": s,
            "uri": f"file:///ckpt/{job_id}/step-{s}",
            "bytes": 1000 * s,
            "save_s": 0.25,
            "blocking_s": 0.05,
        }
        for s in (2, 4)
    ]
    r = client.post(f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"checkpoints": ckpts})
    assert r.status_code == 200 and r.json() == {"accepted": 0}
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [(c["step"], c["uri"], c["bytes"]) for c in items] == [
        (2, f"file:///ckpt/{job_id}/step-2", 2000),
        (4, f"file:///ckpt/{job_id}/step-4", 4000),
    ]
    # Telemetry with only checkpoints does not claim the job is training.
    assert client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()["status"] == "PENDING"


def test_checkpoint_list_follows_what_the_cluster_deleted(client):
    """The workers' retention deletes old folders and says so with the next commit; the
    list follows what they report, not a rule the service applies on its own."""
    job_id = submit(client, checkpoint={"keep_last": 2})["id"]
    sender = reporter(client, job_id)
    deleted = {10: [], 20: [], 30: [10], 40: [20]}
    for step in (10, 20, 30, 40):
        ck = {
            "step": step,
            "uri": f"file:///c/{step}",
            "bytes": 1,
            "save_s": 0.1,
            "deleted_steps": deleted[step],
        }
        assert (
            client.post(
                f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"checkpoints": [ck]}
            ).status_code
            == 200
        )
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [c["step"] for c in items] == [30, 40]
    # A milestone the cluster kept (checkpoint.keep_every) stays listed: nothing guesses.
    ck = {"step": 50, "uri": "file:///c/50", "bytes": 1, "save_s": 0.1, "deleted_steps": [40]}
    client.post(f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"checkpoints": [ck]})
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [c["step"] for c in items] == [30, 50]


def test_the_checkpoint_with_the_lowest_held_out_loss_is_marked_best(client):
    job_id = submit(client)["id"]
    sender = reporter(client, job_id)
    losses = {2: 3.5, 4: 2.25, 6: None, 8: 2.25, 10: 2.75}  # step 6 did not evaluate
    ckpts = [
        {"step": s, "uri": f"file:///c/{s}", "bytes": 1, "save_s": 0.1, "eval_loss": loss}
        for s, loss in losses.items()
    ]
    client.post(f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"checkpoints": ckpts})
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert {c["step"]: c["eval_loss"] for c in items} == losses
    assert [c["step"] for c in items if c["best"]] == [4]  # the tie goes to the earlier step
    # The best is deleted by the cluster's retention: the next lowest takes its place.
    gone = {"step": 12, "uri": "file:///c/12", "bytes": 1, "save_s": 0.1, "deleted_steps": [4]}
    client.post(f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"checkpoints": [gone]})
    items = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=ADMIN_H).json()["items"]
    assert [c["step"] for c in items if c["best"]] == [8]


def test_telemetry_for_a_finished_job_is_ignored(client):
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    sender = reporter(client, job_id)
    stores(client).jobs.update_job(job_id, status=JobStatus.FAILED)
    r = client.post(
        f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"metrics": [metric_point(1)]}
    )
    assert r.status_code == 200 and r.json() == {"accepted": 0}
    job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["status"] == "FAILED" and job["step"] == 0


def test_malformed_telemetry_is_422(tmp_path):
    with api_client(tmp_path, raise_server_exceptions=False) as c:
        job_id = submit(c)["id"]
        r = c.post(
            f"/v1/jobs/{job_id}/telemetry", json=[metric_point(1)], headers=reporter(c, job_id)
        )
    assert r.status_code == 422


def test_memory_endpoint_returns_the_newest_per_rank_report(client):
    job_id = submit(client)["id"]
    assert client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H).json()["ranks"] == []
    for gen in (1, 2):
        ranks = [
            {
                "params_bytes": 100 * gen + r,
                "grads_bytes": 1,
                "optimizer_bytes": 2,
                "activations_bytes": 3,
                "peak_bytes": 106,
            }
            for r in range(2)
        ]
        r = client.post(
            f"/v1/jobs/{job_id}/telemetry",
            headers=reporter(client, job_id),
            json={
                "events": [
                    {
                        "kind": "memory",
                        "message": "m",
                        "data": {"ranks": ranks},
                        "dedup_key": f"m{gen}",
                    }
                ]
            },
        )
        assert r.status_code == 200
    got = client.get(f"/v1/jobs/{job_id}/memory", headers=ADMIN_H).json()
    assert [rk["params_bytes"] for rk in got["ranks"]] == [200, 201]
    assert got["measured_at"] is not None


def test_stored_points_keep_the_fields_the_workers_sent(client):
    """Typed on the wire, but a point is stored as sent: no null stand-ins for fields a
    worker did not report, and a newer worker's extra metric is kept."""
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    point = metric_point(1, mfu=0.41)
    r = client.post(
        f"/v1/jobs/{job_id}/telemetry", headers=reporter(client, job_id), json={"metrics": [point]}
    )
    assert r.status_code == 200
    (stored,) = client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"]
    assert set(stored) == set(point) and stored["mfu"] == 0.41


def test_a_jobs_metrics_keep_the_newest_evaluation_past_later_steps(client):
    job_id = submit(client)["id"]
    make_pending(client, job_id, submission_id="etrain-x-0")
    sender = reporter(client, job_id)
    t0 = time.time()
    evaluated = metric_point(
        3, ts=t0 + 3, eval_loss=3.9, eval_perplexity=49.4, eval_s=0.25, eval_samples=16
    )
    for batch in ([metric_point(2, ts=t0 + 2), evaluated], [metric_point(4, ts=t0 + 4)]):
        r = client.post(f"/v1/jobs/{job_id}/telemetry", headers=sender, json={"metrics": batch})
        assert r.status_code == 200, r.text

    job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_H).json()
    assert job["step"] == 4 and job["metrics"]["loss"] == pytest.approx(4.6)
    assert job["metrics"]["eval_loss"] == 3.9 and job["metrics"]["eval_perplexity"] == 49.4
    assert job["metrics"]["eval_step"] == 3
    items = client.get(f"/v1/jobs/{job_id}/metrics", headers=ADMIN_H).json()["items"]
    assert [("eval_loss" in p, p.get("eval_s")) for p in items] == [
        (False, None),
        (True, 0.25),
        (False, None),
    ]
