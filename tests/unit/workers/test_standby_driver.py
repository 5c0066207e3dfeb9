"""A standby driver's side: asking the service for its job, and taking it on."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest

from workers.contract import (
    JOB_ID_ENV,
    JOB_SPEC_ENV,
    REPORT_URL_ENV,
    STANDBY_ID_ENV,
    STANDBY_ROUTE,
    STANDBY_TOKEN_ENV,
)
from workers.warm import standby


class Service:
    """A real HTTP server answering the standby route from a script of (status, body)."""

    def __init__(self, answers: list[tuple[int, dict | None]], port: int = 0):
        self.answers, self.requests = list(answers), []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                service.requests.append((self.path, self.headers.get("Authorization")))
                status, body = service.answers.pop(0) if service.answers else (404, None)
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def standby_env(monkeypatch):
    monkeypatch.setenv(STANDBY_ID_ENV, "abc123")
    monkeypatch.setenv(STANDBY_TOKEN_ENV, "s3cret")
    return monkeypatch


JOB = {"job_id": "j-9", "spec_json": '{"name": "n"}', "env": {"ETRAIN_REPORT_TOKEN": "t"}}


def test_it_asks_until_the_service_hands_it_a_job(standby_env):
    service = Service([(204, None), (204, None), (200, JOB)])
    standby_env.setenv(REPORT_URL_ENV, service.url + "/")
    try:
        got = standby.wait_for_job(poll_wait_s=0.1)
    finally:
        service.close()
    assert got == standby.Assignment("j-9", '{"name": "n"}', {"ETRAIN_REPORT_TOKEN": "t"})
    path = STANDBY_ROUTE.format(standby_id="abc123")
    assert [r[0].split("?")[0] for r in service.requests] == [path] * 3
    assert all(auth == "Bearer s3cret" for _, auth in service.requests)
    assert "wait=0.1" in service.requests[0][0]


def _pss(proc: psutil.Process) -> int:
    try:
        return proc.memory_full_info().pss
    except psutil.Error:
        return 0


def test_each_ask_says_how_much_memory_the_standby_holds(standby_env):
    def held(pid: int) -> int:
        return psutil.Process(pid).memory_full_info().pss  # Linux, as in CI

    own = held(os.getpid())
    assert standby.memory_held() >= own * 0.9  # not connected to Ray: its own process
    # Another process, as a spare it started would be: one whose memory this user may
    # read (the run's parent may be init, whose memory is not).
    # The largest, so that leaving it out could not pass for noise in this one's figure.
    other = max((p for p in psutil.process_iter() if p.pid != os.getpid()), key=_pss).pid
    standby_env.setattr("ray.is_initialized", lambda: True)
    standby_env.setattr("workers.warm.spares.started_pids", lambda: [other])
    assert standby.memory_held() >= (own + held(other)) * 0.9
    service = Service([(204, None), (200, JOB)])
    standby_env.setenv(REPORT_URL_ENV, service.url)
    try:
        standby.wait_for_job(poll_wait_s=0.1)
    finally:
        service.close()
    sent = [int(parse_qs(urlsplit(path).query)["memory"][0]) for path, _ in service.requests]
    assert len(sent) == 2 and all(m > own * 0.9 for m in sent)
    standby_env.setattr(standby, "memory_held", lambda: None)  # cannot tell: not sent
    service = Service([(200, JOB)])
    standby_env.setenv(REPORT_URL_ENV, service.url)
    try:
        standby.wait_for_job(poll_wait_s=0.1)
    finally:
        service.close()
    assert "memory" not in service.requests[0][0]


def test_its_first_asks_are_short_so_its_memory_figure_follows_the_warm_up(standby_env):
    service = Service([(204, None)] * 7 + [(200, JOB)])
    standby_env.setenv(REPORT_URL_ENV, service.url)
    try:
        standby.wait_for_job(poll_wait_s=20)  # this service answers at once
    finally:
        service.close()
    waits = [parse_qs(urlsplit(path).query)["wait"][0] for path, _ in service.requests]
    assert waits == ["5.0"] * standby.WARMING_POLLS + ["20"] * 2


def test_a_standby_the_service_does_not_know_exits(standby_env):
    service = Service([(204, None), (401, {"detail": "unknown standby driver or token"})])
    standby_env.setenv(REPORT_URL_ENV, service.url)
    try:
        assert standby.wait_for_job(poll_wait_s=0.1) is None
    finally:
        service.close()


def test_a_standby_whose_service_is_gone_exits_soon(standby_env):
    """Connections refused (the service was killed): its own, short limit, not the long
    one kept for a network that may heal, so its warm processes go back to the cluster."""
    service = Service([])
    url = service.url
    service.close()  # nothing listens there now
    standby_env.setenv(REPORT_URL_ENV, url)
    t0 = time.monotonic()
    assert standby.wait_for_job(poll_wait_s=0.1, give_up_s=600, refused_give_up_s=0.5) is None
    assert time.monotonic() - t0 < 30


def test_a_refused_connection_then_an_answer_keeps_the_standby(standby_env):
    """A restart on the same address within the limit: the standby asks again and is
    answered (here: handed its job)."""
    service = Service([])
    port = service.server.server_address[1]
    service.close()
    standby_env.setenv(REPORT_URL_ENV, f"http://127.0.0.1:{port}")
    got: list = []
    asking = threading.Thread(
        target=lambda: got.append(standby.wait_for_job(poll_wait_s=0.1, refused_give_up_s=60))
    )
    asking.start()
    time.sleep(1.0)  # refused meanwhile
    back = Service([(200, {"job_id": "j-1", "spec_json": "{}", "env": {}})], port=port)
    try:
        asking.join(30)
        assert got and got[0] is not None and got[0].job_id == "j-1"
    finally:
        back.close()


def test_taking_a_job_sets_what_a_driver_started_for_it_has(standby_env):
    for name in (JOB_ID_ENV, JOB_SPEC_ENV, "ETRAIN_REPORT_TOKEN"):
        standby_env.delenv(name, raising=False)
    standby.take_job(standby.Assignment(**JOB))
    assert os.environ[JOB_ID_ENV] == "j-9"
    assert os.environ[JOB_SPEC_ENV] == '{"name": "n"}'
    assert os.environ["ETRAIN_REPORT_TOKEN"] == "t"


class Group:
    """Runs what the controller would execute on each of its workers, here."""

    def __init__(self):
        self.calls = []

    def execute(self, fn, *args):
        self.calls.append(fn)
        fn(*pickle.loads(pickle.dumps(args)))


def test_the_jobs_variables_reach_the_controller_and_each_group(monkeypatch):
    monkeypatch.delenv("ETRAIN_TEST_STANDBY_VAR", raising=False)
    callback = pickle.loads(pickle.dumps(standby.JobEnvironment({"ETRAIN_TEST_STANDBY_VAR": "1"})))
    callback.after_controller_start(None)
    assert os.environ["ETRAIN_TEST_STANDBY_VAR"] == "1"
    monkeypatch.delenv("ETRAIN_TEST_STANDBY_VAR")
    group = Group()
    callback.after_worker_group_start(group)
    assert group.calls == [standby.set_env]  # a module function: Ray pickles it by name
    assert os.environ["ETRAIN_TEST_STANDBY_VAR"] == "1"


@pytest.mark.parametrize("now, same", [("env-a", True), ("env-b", False)])
def test_warm_processes_count_only_when_the_jobs_actors_get_their_environment(
    monkeypatch, now, same
):
    import workers.ray_compat as ray_compat

    monkeypatch.setattr(ray_compat, "train_worker_runtime_env", lambda extra: now)
    assert standby.Warm(2, "env-a").same_env() is same
    assert standby.Warm().same_env() is False  # a driver started for its job warmed nothing
