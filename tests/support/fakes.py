"""An in-memory Backend for unit tests: the real interface, scripted answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from service.backends.base import Backend, ClusterInfo, LaunchRequest, RunState, RunStatus
from service.errors import BackendUnavailable
from service.settings import Settings

# The first admin token of the service the REST tests start (``client`` in conftest.py).
ADMIN = "et_admin-token-for-the-service-tests-0123456789"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


def dev_settings(tmp_path, **overrides) -> Settings:
    """Development settings with ``ADMIN`` and a SQLite database under ``tmp_path``;
    ``overrides`` are other settings (validated like the service's own)."""
    values = {
        "env": "development",
        "data_dir": tmp_path,
        "admin_token": ADMIN,
        "database_url": f"sqlite:///{tmp_path / 'etrain.db'}",
    }
    return Settings(**{**values, **overrides})


class FakeBackend(Backend):
    """Records submissions and stops; answers scripted statuses, logs and errors."""

    def __init__(self, *, cpus: float = 2.0, gpus: float = 0.0):
        self.submitted: list[LaunchRequest] = []
        self.submit_calls = 0
        self.stopped: list[str] = []
        self.statuses: dict[str, RunStatus] = {}
        self.log_text: dict[str, str] = {}
        self.submit_error: Exception | None = None
        self.status_error: Exception | None = None
        self.ping_error: Exception | None = None
        self.not_ready_reason: str | None = None  # the job API cannot take a job now
        # Raised by the next submits, one each, before ``submit_error`` is looked at.
        self.submit_failures: list[Exception] = []
        self.on_submit: Callable[[LaunchRequest], None] | None = None
        # The head this service runs is gone (why), until a restart that does not fail.
        self.head_gone: str | None = None
        self.restart_failures = 0
        self.restarts = 0
        total = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        self.info = ClusterInfo(
            nodes=[{"node_id": "n-1", "ip": "10.0.0.1", "is_head": True, "resources": total}],
            total=total,
            available=dict(total),
            dashboard_url="http://ray.test:8265",
        )

    def submit(self, req: LaunchRequest) -> str:
        self.submit_calls += 1
        if self.submit_failures:
            raise self.submit_failures.pop(0)
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append(req)
        if self.on_submit is not None:
            self.on_submit(req)
        return f"http://ray.test:8265/#/jobs/{req.submission_id}"

    def status(self, submission_id: str) -> RunStatus:
        if self.status_error is not None:
            raise self.status_error
        if (done := self.standby_outcome(submission_id)) is not None:
            return done
        return self.statuses.get(submission_id, RunStatus(RunState.PENDING))

    def stop(self, submission_id: str) -> None:
        self.stopped.append(submission_id)

    def head_lost(self) -> str | None:
        return self.head_gone

    def restart_head(self) -> None:
        self.restarts += 1
        if self.restart_failures:
            self.restart_failures -= 1
            raise BackendUnavailable("the head did not come up")
        self.head_gone = None
        self.statuses.clear()  # a new head knows none of the old one's jobs

    def logs(self, submission_id: str) -> str:
        return self.log_text.get(submission_id, "")

    async def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        for line in self.log_text.get(submission_id, "").splitlines(keepends=True):
            yield line

    def cluster(self) -> ClusterInfo:
        return self.info

    def ping(self) -> None:
        if self.ping_error is not None:
            raise self.ping_error

    def not_ready(self) -> str | None:
        return self.not_ready_reason or super().not_ready()
