"""`etrain serve` as a user runs it: a subprocess, driven through the CLI and REST."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.polling import wait_for

BIN = Path(sys.executable).parent


def free_port() -> int:
    """An unused loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """A running control plane and how to talk to it."""

    proc: subprocess.Popen
    url: str
    data_dir: Path
    token: str
    log: Path

    def client(self, token: str | None = None) -> httpx.Client:
        """An HTTP client with a bearer token (the admin's by default)."""
        return httpx.Client(
            base_url=self.url,
            timeout=30,
            headers={"Authorization": f"Bearer {token or self.token}"},
        )

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run the `etrain` CLI against this service."""
        env = {**os.environ, "ETRAIN_URL": self.url, "ETRAIN_TOKEN": self.token, "COLUMNS": "200"}
        return subprocess.run(
            [str(BIN / "etrain"), *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    def stop(self) -> int:
        """SIGINT (Ctrl-C) and wait, as a user stopping `etrain serve`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode


def start_serve(
    data_dir: Path, *, ray_address: str | None, extra_env: dict | None = None, timeout: float = 180
) -> Served:
    """Start `etrain serve` and wait for /readyz. Without ``ray_address`` it starts its own
    embedded Ray head; an ``ETRAIN_ADMIN_TOKEN`` in ``extra_env`` is used, none inherited.

    The port is picked free here but bound by the service seconds later, after its Ray head
    started: another process (a Ray worker of a head starting beside it) may take it first.
    Then it starts again on another port, at most twice more."""
    for attempt in range(3):
        try:
            return _start_serve(data_dir, ray_address, extra_env, timeout)
        except PortTaken:
            if (extra_env or {}).get("ETRAIN_PORT") or attempt == 2:
                raise
    raise AssertionError("unreachable")


class PortTaken(RuntimeError):
    """The service could not bind the port it was given."""


def _start_serve(
    data_dir: Path, ray_address: str | None, extra_env: dict | None, timeout: float
) -> Served:
    port = int((extra_env or {}).get("ETRAIN_PORT") or free_port())
    env = {k: v for k, v in os.environ.items() if k != "ETRAIN_ADMIN_TOKEN"}
    env.update(
        {
            "ETRAIN_DATA_DIR": str(data_dir),
            "ETRAIN_PORT": str(port),
            "ETRAIN_RECONCILE_INTERVAL_S": "0.5",
            # The session cluster runs on this machine, from this venv.
            "ETRAIN_WORKER_PYTHON": sys.executable,
            **(extra_env or {}),
        }
    )
    if ray_address:
        env["ETRAIN_RAY_ADDRESS"] = ray_address
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "serve.log"
    # The child keeps its own copy of the log's descriptor; ours is closed after the start.
    with open(log, "a") as log_file:
        proc = subprocess.Popen(
            [str(BIN / "etrain"), "serve"], env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            taken = f"('127.0.0.1', {port}): address already in use" in text
            raise (PortTaken if taken else RuntimeError)(
                f"etrain serve exited {proc.returncode}:\n{text[-3000:]}"
            )
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        raise TimeoutError(f"etrain serve not ready:\n{log.read_text()[-3000:]}")
    token = env.get("ETRAIN_ADMIN_TOKEN") or (data_dir / "admin_token").read_text().strip()
    return Served(proc=proc, url=url, data_dir=data_dir, token=token, log=log)


@pytest.fixture(scope="package")
def served(ray_backend, tmp_path_factory):
    """One control plane for the e2e tests, on the session's Ray cluster, with the default
    standby driver: these tests submit job after job, as users do, and it runs them one
    after the other with what each run started ahead for the next. It stops after the last
    e2e test: its reconciler would otherwise run on through the rest of the session."""
    s = start_serve(tmp_path_factory.mktemp("etrain-e2e"), ray_address=ray_backend.address)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def waiter():
    """The polling helper, as a fixture (test modules do not import conftest)."""
    return wait_for


@pytest.fixture(scope="session")
def serve_factory():
    """Start another control plane (the caller stops it). It keeps no standby driver unless
    ``extra_env`` asks for one: a test that restarts or doubles the service is not about
    standby drivers, and each one warming (a Ray job, its Ray Train controller and two
    worker processes importing torch) takes the two cores from the job under test."""

    def start(data_dir: Path, *, ray_address: str | None, extra_env: dict | None = None, **kw):
        env = {"ETRAIN_STANDBY_DRIVERS": "0", **(extra_env or {})}
        return start_serve(data_dir, ray_address=ray_address, extra_env=env, **kw)

    return start


@pytest.fixture(scope="package")
def browser():
    """One headless Debian chromium for the e2e tests (tests/support/browser.py), closed
    after the last of them."""
    from tests.support.browser import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def open_tab(browser, tmp_path):
    """``open_tab(width=..., height=...)`` -> a loopback-only :class:`Tab`; screenshots go under
    the test's ``tmp_path/shots``. Call ``tab.check()`` to fail on console errors."""
    from tests.support.browser import tabs

    with tabs(browser, tmp_path / "shots") as factory:
        yield factory
