"""A storage endpoint that accepts connections and never answers cannot stall the control
plane (item 8): each plan or submit that probes it is a 422 within ETRAIN_PROBE_TIMEOUT_S,
and while twenty of them hang, /healthz and another tenant's job list answer at once; a
tenant past its probe bound gets a 429.

The store is a real TCP listener on loopback (a thread; no process), reached by the real
probe (s3fs) from the real app.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.support.fakes import ADMIN_H, FakeBackend, dev_settings

TIMEOUT_S = 1.5
TENANTS = ("team-a", "team-b")


@contextlib.contextmanager
def _silent_server(on_connect=lambda conn: None):
    """http://127.0.0.1:<port>: accepts every connection, hands it to ``on_connect`` (which
    may read), and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except TimeoutError:
                continue
            held.append(conn)
            on_connect(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture
def black_hole():
    """A store that accepts every connection, reads nothing, answers nothing."""
    with _silent_server() as url:
        yield url


def _app(tmp_path, monkeypatch, endpoint, **probe):
    for tenant in TENANTS:
        prefix = f"ETRAIN_SECRET_{tenant.upper().replace('-', '_')}"
        monkeypatch.setenv(f"{prefix}_ACCESS_KEY_ID", "AKIAPROBETEST0000001")
        monkeypatch.setenv(f"{prefix}_SECRET_ACCESS_KEY", "probe-test-secret")
    settings = dev_settings(tmp_path).model_copy(
        update={
            "policy_object_stores": {"*": ["s3://ckpt/{tenant}"]},
            "policy_endpoints": {"*": [endpoint]},
            "probe_timeout_s": TIMEOUT_S,
            **probe,
        }
    )
    return create_app(settings, backend=FakeBackend(cpus=4), reconcile=False)


def _tokens(c):
    out = {}
    for tenant in TENANTS:
        r = c.post("/v1/tokens", json={"tenant": tenant}, headers=ADMIN_H)
        out[tenant] = {"Authorization": f"Bearer {r.json()['token']}"}
    return out


def _plan(c, headers, tenant, endpoint):
    spec = {
        "name": "probe",
        "resources": {"workers": 1},
        "checkpoint": {"storage": f"s3://ckpt/{tenant}/run"},
        "stores": {"s3": {"endpoint_url": endpoint, "credentials_secret": tenant}},
    }
    t0 = time.monotonic()
    r = c.post("/v1/plan", json={"spec": spec}, headers=headers)
    return r, time.monotonic() - t0


def test_item08_hanging_probes_do_not_stall_the_api(tmp_path, monkeypatch, black_hole):
    app = _app(tmp_path, monkeypatch, black_hole, probe_workers=32, probe_per_tenant=32)
    with TestClient(app) as c, ThreadPoolExecutor(20) as pool:
        tokens = _tokens(c)
        a_job = c.post("/v1/jobs", json={"name": "a-job"}, headers=tokens["team-a"])
        assert a_job.status_code == 201, a_job.text
        hanging = [pool.submit(_plan, c, tokens["team-b"], "team-b", black_hole) for _ in range(20)]
        time.sleep(0.3)  # the probes connect and wait for an answer that never comes
        for _ in range(5):
            t0 = time.monotonic()
            assert c.get("/healthz").status_code == 200
            jobs = c.get("/v1/jobs", headers=tokens["team-a"])
            assert jobs.status_code == 200 and jobs.json()["total"] == 1
            # Before: minutes, once the pool filled. 3 s leaves room for a busy 2-core host
            # (1 s failed there with other test runs beside it), far below minutes.
            assert time.monotonic() - t0 < 3.0
        for f in hanging:
            r, elapsed = f.result()
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"] == ["body", "checkpoint", "storage"]
            # Each one hung until the probe's timeout (none was answered early, whatever the
            # load on the host), and no longer (before: 10 s x retries).
            assert TIMEOUT_S - 0.05 <= elapsed < TIMEOUT_S + 3, elapsed


def test_item08_a_tenant_past_its_probe_bound_gets_a_429(tmp_path, monkeypatch, black_hole):
    # A longer timeout here: the first two probes must still hang when the others arrive.
    app = _app(
        tmp_path, monkeypatch, black_hole, probe_workers=8, probe_per_tenant=2, probe_timeout_s=3.0
    )
    with TestClient(app) as c, ThreadPoolExecutor(6) as pool:
        tokens = _tokens(c)
        b = [pool.submit(_plan, c, tokens["team-b"], "team-b", black_hole) for _ in range(5)]
        time.sleep(0.3)
        a, elapsed_a = _plan(c, tokens["team-a"], "team-a", black_hole)
        codes = sorted(f.result()[0].status_code for f in b)
        assert codes == [422, 422, 429, 429, 429], codes
        refused = next(f.result()[0] for f in b if f.result()[0].status_code == 429)
        assert "ETRAIN_PROBE_PER_TENANT" in refused.json()["detail"]
        assert a.status_code == 422 and elapsed_a < 3.0 + 3  # its own probe ran


def _read_the_headers(conn) -> None:
    conn.settimeout(0.2)
    with contextlib.suppress(TimeoutError):
        conn.recv(65536)  # the headers; then silence


@pytest.fixture
def waits_for_the_body():
    """A store that reads a request's headers, then waits for a body that a client sending
    `Expect: 100-continue` never sends (the server never says continue)."""
    with _silent_server(_read_the_headers) as url:
        yield url


def _probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("etrain-probe")]


def test_item08_probe_threads_end_on_their_deadline_and_never_block_exit(
    tmp_path, monkeypatch, waits_for_the_body
):
    """The probe's own thread ends by its deadline (fsspec's per-call timeout cancels the
    request), and it is a daemon: a store that never answers cannot keep `etrain serve`
    (or a test run) from exiting, as an executor's joined-at-exit thread did."""
    app = _app(tmp_path, monkeypatch, waits_for_the_body, probe_workers=4, probe_per_tenant=4)
    with TestClient(app) as c:
        tokens = _tokens(c)
        r, elapsed = _plan(c, tokens["team-a"], "team-a", waits_for_the_body)
        assert r.status_code == 422, r.text
        assert elapsed < TIMEOUT_S + 3, elapsed
        assert all(t.daemon for t in _probe_threads())
        deadline = time.monotonic() + 2 * TIMEOUT_S + 3
        while _probe_threads() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _probe_threads(), "a probe thread outlived its deadline"
