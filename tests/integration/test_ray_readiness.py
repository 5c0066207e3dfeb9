"""Readiness and submission on a real Ray head whose dashboard agent could not open its HTTP
port (another head on this machine holds it): what a second `etrain serve` met when both used
Ray's fixed 52365. /readyz must say not ready, and a submission is a failure to retry later
(Ray answers 500 "No available agent"), not a refusal that fails the job."""

from __future__ import annotations

import contextlib
import socket
import sys

import pytest

from service.backends.base import LaunchRequest
from service.backends.embedded import EmbeddedRay, HeadExited
from service.backends.ray_jobs import RayJobBackend
from service.backends.ray_ports import RayPorts
from service.errors import BackendUnavailable


@contextlib.contextmanager
def head_with_taken_port(tmp_path, port: str):
    """A head (not started) whose ``port`` (a RayPorts field) is pinned to a port another
    process listens on; stopped, and the port freed, on the way out."""
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        head = EmbeddedRay(
            data_dir=tmp_path, num_cpus=1, ports=RayPorts(**{port: taken.getsockname()[1]})
        )
        try:
            yield head
        finally:
            head.stop()


@pytest.fixture
def head_without_agent_http(tmp_path):
    """A head whose pinned dashboard agent port is already taken by another process."""
    with head_with_taken_port(tmp_path, "dashboard_agent_http") as head:
        head.start()
        yield RayJobBackend(head.address, python=sys.executable, probe_agent=True)


def test_the_session_head_is_ready(ray_backend):
    assert ray_backend.not_ready() is None


def test_a_head_whose_agent_lost_its_port_is_not_ready_and_submits_are_retried_later(
    head_without_agent_http,
):
    backend = head_without_agent_http
    backend.ping()  # the dashboard answers: what /readyz used to check
    reason = backend.not_ready()
    assert reason is not None and "dashboard agent" in reason, reason

    req = LaunchRequest(job_id="j-noagent", submission_id="etrain-j-noagent-0", spec_json="{}")
    with pytest.raises(BackendUnavailable, match="No available agent"):
        backend.submit(req)


def test_a_head_that_loses_its_client_port_is_not_taken_for_ready(tmp_path):
    """Ray reports the node alive before its client server binds; when that port is taken
    (by anyone, in the gap after it was chosen free), `ray start` stops the whole head a
    second later. The start must see that, not hand out the address of a dying head."""
    with head_with_taken_port(tmp_path, "client_server") as head, pytest.raises(HeadExited):
        head.start(attempts=1)
