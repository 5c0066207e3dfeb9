"""Ray on this machine for the tests and benchmarks: more nodes, and jobs that report to a
telemetry endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from service.backends.base import Backend, LaunchRequest, RunState
from service.backends.embedded import EmbeddedRay
from service.backends.node_join import join_command, join_hint, ray_start_args
from service.backends.ray_ports import RayPorts
from service.ray_head import head_env
from tests.support.netns import Overlay
from tests.support.polling import wait_for
from workers.contract import REPORT_TOKEN_ENV, REPORT_URL_ENV


def start_node(head: EmbeddedRay, *, cpus: int) -> subprocess.Popen:
    """Another Ray node joining ``head``, in its own process group (so that killing the
    group takes its raylet and workers down as a lost node would). Its ports are free ones
    (0: Ray's choice), like the head's, and it gets the head's allow-listed environment."""
    command = ray_start_args(head.gcs_address, num_cpus=cpus, ports=RayPorts())
    return subprocess.Popen(
        command,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env=head_env(os.environ),
    )


def join_node(
    head: EmbeddedRay, net: Overlay, *, cpus: int, token_file: Path, log: Path
) -> subprocess.Popen:
    """A Ray node joining ``head`` from the namespace of ``net``, as an operator would join
    another machine: ``etrain node join`` with a token file, on the documented join ports.
    It runs in a process group of its own (``ip netns exec`` execs the command, which execs
    ``ray start``): killing the group takes its raylet and workers down. Its session folder
    is a short one under /tmp (Ray's socket paths must stay under 108 bytes)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="etrain-node-", dir="/tmp"))
    # The command `etrain serve` prints for this head, the token file filled in.
    _, *args = join_command(head.gcs_address)
    assert " ".join(join_command(head.gcs_address)) in join_hint(head.gcs_address, None)
    command = [
        str(Path(sys.executable).with_name("etrain")),
        *args,
        f"--token-file={token_file}",
        f"--num-cpus={cpus}",
        f"--temp-dir={temp_dir}",
    ]
    return subprocess.Popen(
        net.command(command),
        start_new_session=True,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=head_env(os.environ),
    )


def submit_job(
    backend: Backend,
    *,
    job_id: str,
    spec: dict,
    report_url: str,
    env: dict | None = None,
    submission_id: str | None = None,
) -> str:
    """Start the job driver for ``spec`` on ``backend``, reporting to ``report_url``; return
    the submission id."""
    submission_id = submission_id or f"it-{job_id}"
    backend.submit(
        LaunchRequest(
            job_id=job_id,
            submission_id=submission_id,
            spec_json=json.dumps(spec),
            env={REPORT_URL_ENV: report_url, REPORT_TOKEN_ENV: "test-token", **(env or {})},
        )
    )
    return submission_id


def wait_for_job(backend: Backend, submission_id: str, *, timeout: float = 300) -> RunState:
    """Wait for a submitted Ray job to end and return its final state; on a timeout, stop it
    and raise with the end of its log."""
    running = (RunState.PENDING, RunState.RUNNING)
    try:
        return wait_for(
            lambda: (s := backend.status(submission_id).state) not in running and s,
            timeout=timeout,
            what=f"Ray job {submission_id} to end",
        )
    except TimeoutError as e:
        backend.stop(submission_id)
        raise TimeoutError(f"{e}\n{backend.logs(submission_id)[-3000:]}") from None
