"""An embedded local Ray head that ``etrain serve`` starts and stops as its child."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.errors import BackendUnavailable
from service.ray_head import FAST_NODE_FAILURE_ENV

log = logging.getLogger(__name__)


def ensure_ray_token(data_dir: Path) -> Path | None:
    """Export the cluster's auth token settings for Ray clients; create a token if none.

    Ray 2.60 clients read ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN`` /
    ``RAY_AUTH_TOKEN_PATH`` from the environment, and a process reads them only
    once. A token this environment already names (an operator's, or a test
    session's) is kept; otherwise ``<data_dir>/ray_auth_token`` (mode 0600) is used,
    created if missing. Returns the token file, or None for a token given inline.
    """
    os.environ["RAY_AUTH_MODE"] = "token"
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    given = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if given and Path(given).is_file():
        return Path(given)
    path = data_dir / "ray_auth_token"
    if not path.is_file():
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return path


class EmbeddedRay:
    """``ray start --head --block`` as a child process, with dashboard and token auth.

    ``--block`` keeps the head in the foreground so that stopping this one
    child takes the whole local cluster (raylet, GCS, dashboard) down with it.
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        num_cpus: int | None = None,
        dashboard_port: int = 8265,
        gcs_port: int = 6379,
        fast_node_failure: bool = True,
    ):
        self.data_dir = data_dir
        self.gcs_env = FAST_NODE_FAILURE_ENV if fast_node_failure else {}
        self.num_cpus = num_cpus
        self.dashboard_port = dashboard_port
        self.gcs_port = gcs_port
        self.proc: subprocess.Popen | None = None
        # Ray's unix socket paths must stay short; keep its temp dir near /tmp.
        self.temp_dir = Path("/tmp") / f"etrain-ray-{gcs_port}"

    @property
    def address(self) -> str:
        """The job API / dashboard URL."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, *, timeout: float = 120.0) -> str:
        """Start the head and wait until its job API answers; return its address."""
        ensure_ray_token(self.data_dir)
        ray_bin = str(Path(sys.executable).with_name("ray"))
        cmd = [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={self.gcs_port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        if self.num_cpus is not None:
            cmd.append(f"--num-cpus={self.num_cpus}")
        log_path = self.data_dir / "ray-head.log"
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.gcs_env},
            )
        self._wait_ready(timeout, log_path)
        return self.address

    def _wait_ready(self, timeout: float, log_path: Path) -> None:
        from workers.ray_compat import auth_headers

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BackendUnavailable(
                    f"embedded Ray head exited with {self.proc.returncode}; see {log_path}"
                )
            try:
                # Ready means the job API answers and the head's raylet has registered
                # (the dashboard comes up a moment before the node is listed).
                r = httpx.get(
                    f"{self.address}/nodes?view=summary", timeout=2, headers=auth_headers()
                )
                if r.status_code == 200 and any(
                    n.get("raylet", {}).get("state") == "ALIVE" for n in r.json()["data"]["summary"]
                ):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        self.stop()
        raise BackendUnavailable(
            f"embedded Ray head not ready after {timeout:.0f}s; see {log_path}"
        )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the head and everything it started."""
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGTERM to `ray start --block` makes it stop all Ray processes it started.
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
