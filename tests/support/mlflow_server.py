"""A real MLflow tracking server on loopback for the tracking tests: ``mlflow server`` (from
mlflow-skinny, with the dev extra's Flask) over a SQLite database, artifacts proxied to a
local folder, on a free port of 127.0.0.1; started once per module, stopped at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """The server's URL (``http://127.0.0.1:<port>``), once it answers /health."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    command = [
        *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)),
        *("--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db"),
        *("--artifacts-destination", str(root / "artifacts")),
    ]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed at the end
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
