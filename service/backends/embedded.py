"""An embedded local Ray head that ``etrain serve`` starts and stops as its child."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import psutil

from service.backends.ray_ports import RayPorts
from service.errors import BackendUnavailable
from service.ray_head import FAST_NODE_FAILURE_ENV, head_env

log = logging.getLogger(__name__)

# The embedded head stops only with `etrain serve` (its jobs stop with it; the next serve
# resubmits them), so it does not drain. Ray 2.60's `ray start` drains its node on SIGTERM
# for up to 30 s, until no worker lease is held, and Ray Train's detached actors (its
# TrainStateActor) hold theirs for the cluster's life: every stop after a job waited out
# the stop timeout here (15 s) and ended in SIGKILL.
NO_DRAIN_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
# Nor does its raylet start a worker process per CPU for the first driver that connects
# (Ray's default): etrain's drivers start what their runs use (``workers.warm``), and those
# went unused, two processes of ~45 MB (PSS) each on a 2-core node, for the head's life,
# whose start took CPU from the first job's.
NO_FIRST_DRIVER_PRESTART_ENV = {"RAY_prestart_worker_first_driver": "0"}


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


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that are not zombies."""
    members = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(p.pid)
    return members


def stop_group(pgid: int, grace: float = 5.0, *, kill: bool = False) -> None:
    """SIGTERM what is left in process group ``pgid``; SIGKILL what outlives ``grace`` s
    (at once with ``kill``).

    Returns once no live process is left in it (zombies, which only their parent can
    remove, do not count).
    """
    for sig in (signal.SIGKILL,) if kill else (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


def stop_blocking_start(proc: subprocess.Popen, timeout: float) -> None:
    """Stop a running ``ray start --block`` child (started in a session of its own) and all
    it started; of one that exited already (one of its Ray processes died), what it left."""
    if proc.poll() is not None:
        # A head whose GCS or raylet died has nothing left to shut down in order: what
        # it leaves (dashboard, its modules) waited out the SIGTERM grace, 5 s of the
        # restart's 12.
        stop_group(proc.pid, kill=True)
        return
    # SIGTERM to `ray start --block` makes it stop all Ray processes it started.
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("the Ray head did not stop within %.0f s of SIGTERM: killing it", timeout)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # `ray start` can exit before all it started has: a dashboard killed after its grace
    # second leaves its forkserver and module processes behind. Its group goes too.
    stop_group(proc.pid)


class HeadExited(BackendUnavailable):
    """``ray start`` gave up while starting (e.g. a port it was given was taken)."""


class EmbeddedRay:
    """``ray start --head --block`` as a child process, with dashboard and token auth.

    ``--block`` keeps the head in the foreground so that stopping this one
    child takes the whole local cluster (raylet, GCS, dashboard) down with it.
    The head runs with an allow-listed environment (:func:`head_env`), its own
    temp dir, and ports that do not collide with another head on this machine.
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        num_cpus: int | None = None,
        ports: RayPorts | None = None,
        fast_node_failure: bool = True,
        extra_env: Iterable[str] = (),
        node_ip: str | None = None,
    ):
        """``node_ip``: the address other nodes reach this head at (they join it there);
        None: this machine's own choice (Ray's), for a head no other machine joins."""
        self.data_dir = data_dir
        self.node_ip = node_ip
        self.gcs_env = FAST_NODE_FAILURE_ENV if fast_node_failure else {}
        self.num_cpus = num_cpus
        self.requested = ports or RayPorts()
        self.ports = self.requested
        self.extra_env = tuple(extra_env)
        self.proc: subprocess.Popen | None = None
        self.temp_dir: Path | None = None

    @property
    def address(self) -> str:
        """The job API / dashboard URL."""
        return f"http://127.0.0.1:{self.ports.dashboard}"

    @property
    def gcs_address(self) -> str:
        """Where another node joins this head (``ray start --address``)."""
        return f"{self.node_ip or '127.0.0.1'}:{self.ports.gcs}"

    def start(self, *, timeout: float = 120.0, attempts: int = 3) -> str:
        """Start the head and wait until its job API answers; return its address.

        A start whose ports were chosen here and whose ``ray start`` exits (another
        process took one of them in between) is tried again with other ports.
        """
        ensure_ray_token(self.data_dir)
        tries = attempts if self.requested.auto else 1
        for attempt in range(1, tries + 1):
            try:
                self._start_once(timeout)
                return self.address
            except HeadExited:
                if attempt == tries:
                    raise
                log.warning("embedded Ray head failed to start; retrying with other ports")
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> None:
        self.ports = self.requested.chosen()
        # Ray's unix socket paths must stay short: a unique dir directly under /tmp.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="etrain-ray-", dir="/tmp"))
        cmd = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            *self.ports.flags(),
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]
        if self.num_cpus is not None:
            cmd.append(f"--num-cpus={self.num_cpus}")
        if self.node_ip:
            cmd.append(f"--node-ip-address={self.node_ip}")
        log_path = self.data_dir / "ray-head.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={
                    **NO_DRAIN_ENV,  # unless the operator's RAY_* say otherwise
                    **NO_FIRST_DRIVER_PRESTART_ENV,
                    **head_env(os.environ, self.extra_env),
                    **self.gcs_env,
                    **self.ports.env(),
                },
            )
        self._wait_ready(timeout, log_path)

    def _wait_ready(self, timeout: float, log_path: Path) -> None:
        from workers.ray_compat import auth_headers

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                # Whatever it had started before it gave up goes with its process group.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.stop()
                raise HeadExited(f"embedded Ray head exited with {code}; see {log_path}")
            try:
                # Ready means the job API answers and the head's raylet has registered
                # (the dashboard comes up a moment before the node is listed).
                r = httpx.get(
                    f"{self.address}/nodes?view=summary", timeout=2, headers=auth_headers()
                )
                if (
                    r.status_code == 200
                    and any(
                        n.get("raylet", {}).get("state") == "ALIVE"
                        for n in r.json()["data"]["summary"]
                    )
                    and self._listens_on_client_port()
                ):
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        self.stop()
        raise BackendUnavailable(
            f"embedded Ray head not ready after {timeout:.0f}s; see {log_path}"
        )

    def _listens_on_client_port(self) -> bool:
        """Whether a process of this head listens on its Ray client port. Ray starts that
        server last, and it may report the node alive before the server has bound the port
        chosen for it; if something else took the port meanwhile, `ray start` stops the
        whole head a second later, after it was taken for ready."""
        group = set(group_members(self.proc.pid))
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == self.ports.client_server
            for c in psutil.net_connections(kind="tcp")
            if c.pid in group and c.laddr
        )

    def exited(self) -> int | None:
        """``ray start``'s exit code once the head is gone (it exits, and stops the rest,
        when any of its Ray processes dies: the GCS, the raylet); None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def restart(self, timeout: float = 120.0) -> str:
        """Start the head again after it died; return its address. It keeps the ports it
        had, so its dashboard links and the address nodes join stay valid; where those
        were free ports and one was taken meanwhile, it takes other free ones."""
        self.stop()
        requested = self.requested
        self.requested = self.ports
        try:
            return self.start(timeout=timeout)
        except HeadExited:
            if not requested.auto:
                raise
        finally:
            self.requested = requested
        return self.start(timeout=timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the head and everything it started; remove its temp dir."""
        if self.proc is not None:
            stop_blocking_start(self.proc, timeout)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
