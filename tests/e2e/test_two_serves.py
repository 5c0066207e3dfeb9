"""Two `etrain serve` on one machine (two users, a test run beside a dev server), each with its
own embedded Ray head (the default: no Ray address): no port collides (one keeps the ports
its operator pinned, the other picks free ones), both are ready only when their job API can
take a job, both run a job to SUCCEEDED at the same time, no job sees the service's secrets,
and each stops its own Ray with it, at once. One head's GCS server is killed mid-job: its
serve restarts the head on the same ports and resubmits the job, which resumes from its
checkpoint and ends with the very curve of the other serve's uninterrupted run."""

from __future__ import annotations

import datetime as dt
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
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


STEPS, EVERY = 30, 8
KILL_AFTER = 10  # steps: past the first checkpoint


def _spec(name: str) -> dict:
    return {
        "name": name,
        "data": {"seq_len": 16, "num_samples": 64},
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "train": {"steps": STEPS, "global_batch_size": 2, "micro_batch_size": 2},
        "checkpoint": {"every_steps": EVERY},
    }


def _kill_gcs(serve_pid: int) -> float:
    """SIGKILL the GCS server of the embedded head under ``serve_pid``; when it was."""
    gcs = [
        p for p in psutil.Process(serve_pid).children(recursive=True) if p.name() == "gcs_server"
    ]
    assert len(gcs) == 1, gcs
    gcs[0].send_signal(signal.SIGKILL)
    return time.time()


def _ts(event: dict) -> float:
    when = dt.datetime.fromisoformat(event["ts"])
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


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


# Serve "one" keeps the ports its operator pinned; "two" picks free ones at each start.
PINNED = {"ETRAIN_RAY_DASHBOARD_PORT": "8330", "ETRAIN_RAY_GCS_PORT": "6530"}


def _ray_processes(serve_pid: int) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(serve_pid).children(recursive=True)
        if "ray" in " ".join(p.cmdline()[:3])
    ]


def test_two_embedded_serves_each_run_a_job_and_stop_their_own_ray(serve_factory, tmp_path):
    def start(name: str):
        env = {**SECRETS, "ETRAIN_ADMIN_TOKEN": f"et_admin-{name}-0123456789abcdef0123456789"}
        env.update(PINNED if name == "one" else {})
        return serve_factory(
            tmp_path / name, ray_address=None, extra_env={**env, "ETRAIN_RAY_NUM_CPUS": "1"}
        )

    with ThreadPoolExecutor(2) as pool:
        serves = list(pool.map(start, ["one", "two"]))
    heads = [_ray_processes(s.proc.pid) for s in serves]
    try:
        assert all(heads), "no Ray head process under an etrain serve"
        clients = [s.client() for s in serves]
        # Ready means each job API can take a job: a head whose agent lost a port is not.
        assert [c.get("/readyz").status_code for c in clients] == [200, 200]
        clusters = [c.get("/v1/cluster").json() for c in clients]
        assert [c["total"]["CPU"] for c in clusters] == [1, 1]
        dashboards = [c["dashboard_url"] for c in clusters]
        assert dashboards[0].endswith(":8330") and len(set(dashboards)) == 2, dashboards
        assert [httpx.get(s.url + "/v1/jobs").status_code for s in serves] == [401, 401]

        jobs = []
        for i, c in enumerate(clients):
            r = c.post("/v1/jobs", json=_spec(f"two-serves-{i}"))
            assert r.status_code == 201, r.text
            jobs.append(r.json()["id"])
        seen: dict[str, list[set[str]]] = {}
        deadline = time.monotonic() + 420
        killed_at = None

        def status() -> list[dict]:
            return [c.get(f"/v1/jobs/{j}").json() for c, j in zip(clients, jobs, strict=True)]

        polls = 0
        while time.monotonic() < deadline and not all(j["status"] in TERMINAL for j in status()):
            now = status()
            if polls % 3 == 0:  # reading every process's environment is not free on 2 cores
                for job_id, envs in _job_envs(now).items():
                    seen.setdefault(job_id, []).extend(envs)
            polls += 1
            if killed_at is None and (now[0]["step"] or 0) >= KILL_AFTER:
                killed_at = _kill_gcs(serves[0].proc.pid)
            time.sleep(0.3)
        final = status()
        assert [j["status"] for j in final] == ["SUCCEEDED", "SUCCEEDED"], [
            (j["status"], j["error"]) for j in final
        ]
        assert killed_at is not None and [j["resubmits"] for j in final] == [1, 0]

        # The lost head was noticed within seconds; the job resumed from its checkpoint on
        # the head that came back on the same ports, and trained each step once, on the
        # very curve of the run no one interrupted.
        events = clients[0].get(f"/v1/jobs/{jobs[0]}/events").json()["items"]
        lost = next(e for e in events if e["kind"] == "resubmitted")
        assert lost["message"].startswith("the embedded Ray head stopped"), lost
        assert _ts(lost) - killed_at < 10, _ts(lost) - killed_at
        restored = [e for e in events if e["kind"] == "restored"]
        assert restored and restored[-1]["data"]["step"] >= EVERY, restored
        assert clients[0].get("/v1/cluster").json()["dashboard_url"].endswith(":8330")
        curves = [
            c.get(f"/v1/jobs/{j}/metrics").json()["items"]
            for c, j in zip(clients, jobs, strict=True)
        ]
        assert [[m["step"] for m in curve] for curve in curves] == [list(range(1, STEPS + 1))] * 2
        losses = [[m["loss"] for m in curve] for curve in curves]
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)

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

        # Each printed how another machine joins its head (the token file named, not its text).
        hint = "etrain node join --head 127.0.0.1:6530 --token-file <a copy of "
        assert hint in serves[0].log.read_text()

        # No log line per cluster poll (service) or per telemetry post (the job's logs).
        for s, c, job_id in zip(serves, clients, jobs, strict=True):
            assert "HTTP Request:" not in s.log.read_text()
            assert "HTTP Request:" not in c.get(f"/v1/jobs/{job_id}/logs").text
    finally:
        heads = [h + _ray_processes(s.proc.pid) for h, s in zip(heads, serves, strict=True)]
        codes = [s.stop() for s in serves]
    assert codes == [0, 0]
    # Each head stopped on its SIGTERM (it does not drain; a drain waits for Ray Train's
    # detached actors, which never end), not on the SIGKILL after the stop's timeout.
    for s in serves:
        assert "did not stop within" not in s.log.read_text()
    procs = [p for head in heads for p in head]
    alive = [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"Ray processes left behind: {alive}"
