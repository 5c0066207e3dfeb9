"""Two `etrain serve` on one machine (two users, a test run beside a dev server), each with its
own embedded Ray head: no port collides, both are ready only when their job API can take a
job, both run a job to SUCCEEDED at the same time, and no job sees the service's secrets."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests.support.processes import runs_job

pytestmark = pytest.mark.slow

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
# What each service process holds and no job's driver or worker may see.
SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIASERVICEKEY000001",
    "AWS_SECRET_ACCESS_KEY": "service-secret-key-that-no-job-may-read",
    "ETRAIN_SECRET_OTHERTEAM_ACCESS_KEY_ID": "AKIAOTHERTEAM0000001",
    "ETRAIN_SECRET_OTHERTEAM_SECRET_ACCESS_KEY": "other-team-secret-key",
}


def _spec(name: str) -> dict:
    return {
        "name": name,
        "data": {"seq_len": 16, "num_samples": 64},
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "train": {"steps": 3, "global_batch_size": 2, "micro_batch_size": 2},
        "checkpoint": {"every_steps": 100},
    }


def _job_envs(jobs: list[dict]) -> dict[str, list[set[str]]]:
    """Variable names of every live process that runs one of ``jobs`` (driver, workers)."""
    found: dict[str, list[set[str]]] = {}
    for p in psutil.process_iter():
        try:
            env = p.environ()
        except psutil.Error:
            continue
        for job in jobs:
            if runs_job(env, job):
                found.setdefault(job["id"], []).append(set(env))
    return found


def _raylet_env(serve_pid: int) -> set[str]:
    for p in psutil.Process(serve_pid).children(recursive=True):
        if p.name() == "raylet":
            return set(p.environ())
    raise AssertionError("no raylet under this etrain serve")


def test_two_serves_each_run_a_job_to_succeeded(serve_factory, tmp_path):
    def start(name: str):
        env = {**SECRETS, "ETRAIN_ADMIN_TOKEN": f"et_admin-{name}-0123456789abcdef0123456789"}
        return serve_factory(
            tmp_path / name, ray_address=None, extra_env={**env, "ETRAIN_RAY_NUM_CPUS": "1"}
        )

    with ThreadPoolExecutor(2) as pool:
        serves = list(pool.map(start, ["one", "two"]))
    try:
        clients = [s.client() for s in serves]
        # Ready means each job API can take a job: a head whose agent lost a port is not.
        assert [c.get("/readyz").status_code for c in clients] == [200, 200]
        dashboards = {c.get("/v1/cluster").json()["dashboard_url"] for c in clients}
        assert len(dashboards) == 2  # two heads, two dashboards

        jobs = []
        for i, c in enumerate(clients):
            r = c.post("/v1/jobs", json=_spec(f"two-serves-{i}"))
            assert r.status_code == 201, r.text
            jobs.append(r.json()["id"])
        seen: dict[str, list[set[str]]] = {}
        deadline = time.monotonic() + 420

        def status() -> list[dict]:
            return [c.get(f"/v1/jobs/{j}").json() for c, j in zip(clients, jobs, strict=True)]

        while time.monotonic() < deadline and not all(j["status"] in TERMINAL for j in status()):
            for job_id, envs in _job_envs(status()).items():
                seen.setdefault(job_id, []).extend(envs)
            time.sleep(0.3)
        final = status()
        assert [j["status"] for j in final] == ["SUCCEEDED", "SUCCEEDED"], [
            (j["status"], j["error"]) for j in final
        ]

        # Both ran at once, each on its own head.
        starts = [j["started_at"] for j in final]
        ends = [j["finished_at"] for j in final]
        assert max(starts) < min(ends), (starts, ends)

        # The heads, and so the jobs' drivers and workers, never saw the service's secrets.
        assert set(seen) == set(jobs), "every job's processes were looked at"
        for s in serves:
            assert not _raylet_env(s.proc.pid) & {*SECRETS, "ETRAIN_ADMIN_TOKEN"}
        for job_id, envs in seen.items():
            for names in envs:
                leaked = names & {*SECRETS, "ETRAIN_ADMIN_TOKEN"}
                assert not leaked, f"{job_id} saw {leaked}"
                assert not [n for n in names if n.startswith("ETRAIN_SECRET_")]

        # No log line per cluster poll (service) or per telemetry post (the job's logs).
        for s, c, job_id in zip(serves, clients, jobs, strict=True):
            assert "HTTP Request:" not in s.log.read_text()
            assert "HTTP Request:" not in c.get(f"/v1/jobs/{job_id}/logs").text
    finally:
        for s in serves:
            s.stop()
