"""POST /v1/jobs/{id}/generate: who may call it, which jobs and checkpoints it serves, the
bounds it enforces, and what it hands the generating process (a recording runner here:
tests/integration/test_generate_service.py runs the real process)."""

from __future__ import annotations

import json

import pytest

from service.status import JobStatus
from tests.support.api import api_client, reporter, stores, submit, tenant_token
from tests.support.fakes import ADMIN_H

ANSWER = {
    "tokens": [5, 6, 1],
    "text": "hi",
    "prompt_tokens": 4,
    "stop_reason": "eos",
    "seed": None,
    "load_s": 0.5,
    "generate_s": 0.1,
}


class Runner:
    """Stands for ``python -m workers.generate``: records what it is given, answers a line."""

    def __init__(self, code: int = 0, answer: dict | None = None):
        self.calls: list[tuple] = []
        self.code, self.answer = code, ANSWER if answer is None else answer

    def __call__(self, request, env, timeout_s):
        self.calls.append((request, env, timeout_s))
        return self.code, "some log line\n" + json.dumps(self.answer) + "\n"


def finished_job(client, headers=ADMIN_H, steps=(2, 4), best: int | None = None) -> dict:
    """A SUCCEEDED job whose workers reported checkpoints at ``steps`` (``best``: evaluated
    lowest)."""
    job = submit(client, headers)
    root = f"{job['spec']['checkpoint']['storage']}/{job['id']}/checkpoints"
    items = [
        {
            "step": s,
            "uri": f"{root}/step_{s:08d}",
            "bytes": 1,
            "save_s": 0.1,
            "eval_loss": (1.0 if s == best else 2.0) if best is not None else None,
        }
        for s in steps
    ]
    if items:
        r = client.post(
            f"/v1/jobs/{job['id']}/telemetry",
            headers=reporter(client, job["id"]),
            json={"checkpoints": items},
        )
        assert r.status_code == 200, r.text
    stores(client).jobs.update_job(job["id"], status=JobStatus.SUCCEEDED)
    return {**job, "root": root}


@pytest.fixture
def gen(tmp_path):
    """(client, runner) of an app whose generation runs through a recording runner."""
    with api_client(tmp_path, generate_max_new_tokens=32, generate_timeout_s=30) as client:
        runner = Runner()
        client.app.state.runtime.generation.runner = runner
        yield client, runner


def post(client, job_id, headers=ADMIN_H, **body):
    return client.post(f"/v1/jobs/{job_id}/generate", headers=headers, json=body)


def test_greedy_by_default_from_the_best_checkpoint(gen):
    client, runner = gen
    job = finished_job(client, steps=(2, 4, 6), best=4)
    r = post(client, job["id"], prompt="Hello", chat=True)
    assert r.status_code == 200, r.text
    assert r.json() == {"job_id": job["id"], "step": 4, **ANSWER}
    ((request, env, timeout_s),) = runner.calls
    assert request.checkpoint_uri == f"{job['root']}/step_00000004"
    assert (request.prompt, request.chat, request.sampling) == ("Hello", True, False)
    assert request.max_new_tokens == 32  # the default 64, capped by the service's bound
    assert request.spec["checkpoint"]["storage"] == job["spec"]["checkpoint"]["storage"]
    assert timeout_s == 30 and request.timeout_s < 30 and request.device == "cpu"
    assert env["HF_HUB_OFFLINE"] == "1" and "ETRAIN_STORAGE_ROOTS" in env
    assert not [k for k in env if k.startswith("ETRAIN_") and k != "ETRAIN_STORAGE_ROOTS"]


def test_newest_without_a_best_and_a_given_step(gen):
    client, runner = gen
    job = finished_job(client)
    assert post(client, job["id"], prompt="x").json()["step"] == 4
    r = post(client, job["id"], prompt="x", step=2, top_p=0.9, temperature=0.7, seed=3)
    assert r.json()["step"] == 2
    request = runner.calls[-1][0]
    assert (request.sampling, request.top_p, request.temperature, request.seed) == (
        True,
        0.9,
        0.7,
        3,
    )
    r = post(client, job["id"], prompt="x", step=3)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "step"] and "available steps: 2, 4" in err["msg"]


def test_too_many_new_tokens_is_a_422_naming_the_field(gen):
    client, runner = gen
    job = finished_job(client)
    r = post(client, job["id"], prompt="x", max_new_tokens=33)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "max_new_tokens"] and "at most 32" in err["msg"]
    assert post(client, job["id"], prompt="x", max_new_tokens=32).status_code == 200
    assert runner.calls[-1][0].max_new_tokens == 32


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "temperature": 0}, "temperature"),
        ({"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "x", "beams": 4}, "beams"),
    ],
)
def test_a_malformed_body_is_a_422_naming_the_field(gen, body, field):
    client, runner = gen
    job = finished_job(client)
    r = client.post(f"/v1/jobs/{job['id']}/generate", headers=ADMIN_H, json=body)
    assert r.status_code == 422
    assert [e["loc"][-1] for e in r.json()["detail"]] == [field]
    assert not runner.calls


def test_greedy_with_sampling_fields_is_a_422(gen):
    client, _ = gen
    job = finished_job(client)
    r = post(client, job["id"], prompt="x", greedy=True, top_p=0.5)
    assert r.status_code == 422 and "greedy decoding takes no top_p" in r.text


def test_only_the_jobs_tenant_or_an_admin(gen):
    client, runner = gen
    mine, theirs = tenant_token(client, "team-a"), tenant_token(client, "team-b")
    job = finished_job(client, mine)
    assert post(client, job["id"], theirs, prompt="x").status_code == 404
    assert post(client, job["id"], {}, prompt="x").status_code == 401
    assert post(client, job["id"], mine, prompt="x").status_code == 200
    assert post(client, job["id"], prompt="x").status_code == 200  # admin
    assert len(runner.calls) == 2
    roots = json.loads(runner.calls[0][1]["ETRAIN_STORAGE_ROOTS"])
    assert all("team-b" not in r for r in roots["read"])  # the job's tenant's roots
    assert any(r.endswith("/team-a") for r in roots["read"])


def test_a_job_that_is_not_finished_or_has_no_checkpoint_is_a_409(gen):
    client, runner = gen
    queued = submit(client)
    r = post(client, queued["id"], prompt="x")
    assert r.status_code == 409 and "is QUEUED" in r.json()["detail"]
    bare = finished_job(client, steps=())
    r = post(client, bare["id"], prompt="x")
    assert r.status_code == 409 and "no committed checkpoint" in r.json()["detail"]
    assert not runner.calls


def test_a_checkpoint_outside_the_jobs_folder_is_refused(gen, tmp_path):
    client, runner = gen
    job = submit(client)
    other = submit(client)
    elsewhere = f"{other['spec']['checkpoint']['storage']}/{other['id']}/checkpoints/step_00000002"
    for uri in (elsewhere, f"{job['spec']['checkpoint']['storage']}/{job['id']}/../x/step_2"):
        client.post(
            f"/v1/jobs/{job['id']}/telemetry",
            headers=reporter(client, job["id"]),
            json={"checkpoints": [{"step": 2, "uri": uri, "bytes": 1, "save_s": 0.1}]},
        )
        stores(client).jobs.update_job(job["id"], status=JobStatus.SUCCEEDED)
        r = post(client, job["id"], prompt="x")
        assert r.status_code == 409 and "not in the job's checkpoints folder" in r.text
    assert not runner.calls


def test_a_disabled_service_says_so(tmp_path):
    with api_client(tmp_path, generate_enabled=False) as client:
        job = finished_job(client)
        r = post(client, job["id"], prompt="x")
        assert r.status_code == 403 and "ETRAIN_GENERATE_ENABLED" in r.json()["detail"]


@pytest.mark.parametrize(
    ("code", "answer", "status", "text"),
    [
        (2, {"error": "the prompt has 200 tokens", "refused": True}, 409, "the prompt has 200"),
        (1, {"error": "RuntimeError: boom"}, 502, "RuntimeError: boom"),
        (-9, {}, 502, "exited with status -9"),
    ],
)
def test_a_failed_process_is_reported(gen, code, answer, status, text):
    client, runner = gen
    runner.code, runner.answer = code, answer
    job = finished_job(client)
    r = post(client, job["id"], prompt="x")
    assert r.status_code == status and text in r.json()["detail"]
    assert f"job {job['id']} step 4" in r.json()["detail"]


def test_a_timeout_is_a_504_and_busy_is_a_429(gen):
    import subprocess

    client, _ = gen
    generation = client.app.state.runtime.generation
    job = finished_job(client)

    def slow(request, env, timeout_s):
        raise subprocess.TimeoutExpired("python", timeout_s)

    generation.runner = slow
    r = post(client, job["id"], prompt="x")
    assert r.status_code == 504 and "ETRAIN_GENERATE_TIMEOUT_S" in r.json()["detail"]
    assert generation._slots.acquire(blocking=False)  # the slot was given back; take it
    try:
        r = post(client, job["id"], prompt="x")
        assert r.status_code == 429 and "ETRAIN_GENERATE_CONCURRENCY" in r.json()["detail"]
    finally:
        generation._slots.release()
