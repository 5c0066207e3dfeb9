"""Real Ray for integration tests: one local head per session, jobs through Ray's job API."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from service.backends.ray_jobs import RayJobBackend
from service.backends.base import RunState
from tests.support.telemetry_sink import TelemetrySink


@pytest.fixture(scope="session")
def telemetry_sink() -> TelemetrySink:
    """The session's telemetry receiver."""
    sink = TelemetrySink()
    yield sink
    sink.close()
    assert sink.refused == [], f"the workers posted batches the service would refuse: {sink.refused}"


def run_ray_job(backend: RayJobBackend, *, job_id: str, spec_json: str, env: dict,
                timeout: float = 300) -> RunState:
    """Submit ``python -m workers.launch`` for a spec and wait for the Ray job to end."""
    from service.backends.base import LaunchRequest

    backend.submit(LaunchRequest(job_id=job_id, submission_id=f"it-{job_id}",
                                 spec_json=spec_json, env=env))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = backend.status(f"it-{job_id}").state
        if state not in (RunState.PENDING, RunState.RUNNING):
            return state
        time.sleep(0.5)
    backend.stop(f"it-{job_id}")
    raise TimeoutError(f"Ray job {job_id} did not finish in {timeout}s:\n"
                       + backend.logs(f"it-{job_id}")[-3000:])


def load_checkpoint_tensors(path: str | Path) -> dict:
    """All tensors of a committed DCP checkpoint as one plain state dict."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = Path(path).parent / f"{Path(path).name}.pt"
    if not out.exists():
        dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="session")
def run_job(ray_backend, telemetry_sink):
    """Run a spec as a real Ray job (workers.launch) reporting to the telemetry sink."""

    def run(*, job_id: str, spec: dict, extra_env: dict | None = None) -> RunState:
        env = {"ETRAIN_REPORT_URL": telemetry_sink.url, "ETRAIN_REPORT_TOKEN": "test-token",
               **(extra_env or {})}
        return run_ray_job(ray_backend, job_id=job_id, spec_json=json.dumps(spec), env=env)

    return run


@pytest.fixture(scope="session")
def checkpoint_tensors():
    """Loader of a committed checkpoint's tensors."""
    return load_checkpoint_tensors
