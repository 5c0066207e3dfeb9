"""Three `etrain serve` on one PostgreSQL and the session's Ray cluster, as an operator runs
replicas: every replica serves the API and one leads the scheduler and the reconciler.
Clients submit and list against all three; the leader is SIGKILLed mid-run, and the
replica that took over is SIGSTOPped past its lease and then resumed. Every job runs on
Ray once and ends once in the database; the paused replica changes nothing after it
wakes (its lease's fencing token is stale)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.conftest import BIN, free_port
from tests.e2e.test_two_serves import _spec  # the same one-worker, three-step job
from tests.support.postgres import fresh_schema, postgres_server

pytestmark = pytest.mark.slow

LEASE_S = 2.0
JOBS = 2
CLIENTS = 50
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    for server in postgres_server(tmp_path_factory.mktemp("pg")):
        yield from fresh_schema(server)


def _ready(served) -> dict:
    try:
        return httpx.get(f"{served.url}/readyz", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _leader(replicas: list) -> object | None:
    leading = [r for r in replicas if _ready(r).get("role") == "leader"]
    assert len(leading) <= 1, [_ready(r) for r in replicas]
    return leading[0] if leading else None


def _wait_leader(replicas: list, timeout: float) -> tuple[object, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = _leader(replicas)
        if found is not None:
            return found, time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"no replica leads after {timeout}s: {[_ready(r) for r in replicas]}")


def test_replicas_share_the_jobs_and_a_lost_leader_is_replaced(
    ray_backend, serve_factory, tmp_path, database
):
    token = secrets.token_hex(16)
    env = {
        "ETRAIN_DATABASE_URL": database,
        "ETRAIN_ADMIN_TOKEN": token,
        "ETRAIN_LEADER_LEASE_S": str(LEASE_S),
    }
    first = serve_factory(tmp_path / "r0", ray_address=ray_backend.address, extra_env=env)
    replicas = [first]
    try:
        _wait_leader(replicas, 30)
        for i in (1, 2):
            replicas.append(
                serve_factory(tmp_path / f"r{i}", ray_address=ray_backend.address, extra_env=env)
            )
        states = [_ready(r) for r in replicas]
        assert [s["role"] for s in states] == ["leader", "follower", "follower"], states
        assert len({s["leader"] for s in states}) == 1

        def client(i: int) -> list[int]:
            served = replicas[i % 3]
            with served.client(token) as c:
                codes = []
                if i < JOBS:  # a submit on each replica: the followers wake the leader
                    codes.append(c.post("/v1/jobs", json=_spec(f"replica-{i}")).status_code)
                for _ in range(3):
                    codes.append(c.get("/v1/jobs", params={"limit": 50}).status_code)
                return codes

        with ThreadPoolExecutor(CLIENTS) as pool:
            codes = [code for codes in pool.map(client, range(CLIENTS)) for code in codes]
        assert codes.count(201) == JOBS and set(codes) == {200, 201}, codes

        with first.client(token) as c:
            jobs = [j["id"] for j in c.get("/v1/jobs").json()["items"]]
            admitted = lambda: [  # noqa: E731
                j for j in c.get("/v1/jobs").json()["items"] if j["status"] != "QUEUED"
            ]
            t0 = time.monotonic()
            while not admitted() and time.monotonic() - t0 < 30:
                time.sleep(0.2)
            assert admitted(), "the leader admitted no job"
        assert len(jobs) == JOBS

        first.proc.send_signal(signal.SIGKILL)  # the leader is lost mid-run
        first.proc.wait()
        second, took = _wait_leader(replicas[1:], 4 * LEASE_S)
        print(f"takeover after SIGKILL: {took:.2f}s (lease {LEASE_S}s)")
        assert took <= LEASE_S + 1.5  # within the lease, and the polling

        os.kill(second.proc.pid, signal.SIGSTOP)  # paused past its lease (GC, a frozen VM)
        try:
            others = [r for r in replicas[1:] if r is not second]
            third, took = _wait_leader(others, 4 * LEASE_S)
            print(f"takeover from a paused leader: {took:.2f}s")
        finally:
            os.kill(second.proc.pid, signal.SIGCONT)
        t0 = time.monotonic()  # awake, it finds out it no longer leads
        while _ready(second).get("role") != "follower" and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        awake, now_leading = _ready(second), _ready(third)
        assert awake["role"] == "follower" and now_leading["role"] == "leader", awake
        assert awake["leader"] == now_leading["leader"]

        with third.client(token) as c:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                listed = c.get("/v1/jobs").json()["items"]
                if all(j["status"] in TERMINAL for j in listed):
                    break
                time.sleep(1)
            assert {j["status"] for j in listed} == {"SUCCEEDED"}, listed
            for job_id in jobs:
                events = c.get(f"/v1/jobs/{job_id}/events").json()["items"]
                kinds = [e["kind"] for e in events]
                to_ray = [e["message"] for e in events if e["message"].startswith("submitted to")]
                assert to_ray == [f"submitted to Ray as etrain-{job_id}-0"], events
                assert kinds.count("admitted") == 1 and kinds.count("succeeded") == 1, kinds
                assert "resubmitted" not in kinds, kinds
    finally:
        for served in replicas:
            if served.proc.poll() is None:
                os.kill(served.proc.pid, signal.SIGCONT)
                served.stop()


def test_a_second_serve_on_the_same_sqlite_file_is_refused_at_start(served):
    """SQLite serves one process: a second `etrain serve` on the data dir of a running one
    stops at start and says to use PostgreSQL for replicas; the first one goes on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETRAIN_")}
    env.update(ETRAIN_DATA_DIR=str(served.data_dir), ETRAIN_PORT=str(free_port()))
    env.update(ETRAIN_RAY_ADDRESS="http://127.0.0.1:9")  # never reached: it stops before
    second = subprocess.run(
        [str(BIN / "etrain"), "serve"], env=env, capture_output=True, text=True, timeout=120
    )
    out = second.stdout + second.stderr
    assert second.returncode != 0, out
    assert "SQLite serves one process" in out and "ETRAIN_DATABASE_URL" in out, out[-3000:]
    assert f"process {served.proc.pid}" in out
    assert httpx.get(f"{served.url}/readyz", timeout=5).status_code == 200
