"""The backend interface: how the control plane runs a job on a cluster."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from service.backends.standby import run_id, runner_of
from service.errors import BackendUnavailable
from workers.spec import JobSpec

if TYPE_CHECKING:
    from service.backends.standby import StandbyDrivers


class RunState(str, enum.Enum):
    """A backend job's state, normalised across backends."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    MISSING = "MISSING"  # the backend has no record of it (e.g. the Ray head was replaced)


@dataclass(frozen=True)
class RunStatus:
    """What the backend says about one submission."""

    state: RunState
    message: str = ""
    exit_code: int | None = None  # the driver's, once it exited


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a backend needs to start the job driver."""

    job_id: str
    submission_id: str
    spec_json: str  # the JobSpec as the driver reads it (ETRAIN_JOB_SPEC)
    env: dict[str, str] = field(default_factory=dict)  # may hold secrets: never log it
    tenant: str | None = None  # the job's tenant: KubeRay scopes its pods' Secret and volume

    @property
    def spec(self) -> JobSpec:
        """The job spec of ``spec_json``, validated (pydantic's ValidationError if it is not)."""
        return JobSpec.model_validate_json(self.spec_json)


@dataclass(frozen=True)
class ClusterInfo:
    """Cluster size as the scheduler sees it."""

    nodes: list[dict]
    total: dict[str, float]
    available: dict[str, float]
    dashboard_url: str | None


class Backend(ABC):
    """Submit, follow, stop and read logs of job drivers on a cluster."""

    @abstractmethod
    def submit(self, req: LaunchRequest) -> str:
        """Start the driver; return its dashboard URL. Idempotent per submission id."""

    @abstractmethod
    def status(self, submission_id: str) -> RunStatus:
        """Current state of a submission."""

    @abstractmethod
    def stop(self, submission_id: str) -> None:
        """Ask the cluster to stop a submission; a finished one is left alone."""

    @abstractmethod
    def logs(self, submission_id: str) -> str:
        """Driver (and forwarded worker) logs so far."""

    @abstractmethod
    def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        """Stream logs until the submission ends."""

    @abstractmethod
    def cluster(self) -> ClusterInfo:
        """Nodes and resources."""

    @abstractmethod
    def ping(self) -> None:
        """Raise BackendUnavailable when the cluster cannot be reached."""

    def not_ready(self) -> str | None:
        """Why the cluster cannot accept a job now (a short reason, no secrets); None when
        it can. By default: ``ping`` answers. Backends override it with a check that
        reaches what a submission needs, without submitting anything."""
        try:
            self.ping()
        except Exception as e:  # noqa: BLE001 - any failure means not ready
            return type(e).__name__
        return None

    def head_lost(self) -> str | None:
        """Why the Ray head this service runs itself (the embedded one) is gone, taking
        every job's driver and workers with it; None while it runs, or where the service
        runs no head (another cluster's head that restarts loses its jobs too: the
        reconciler finds them MISSING once it answers again)."""
        return None

    def restart_head(self) -> None:
        """Start the lost head again (:meth:`head_lost`); raises BackendUnavailable when it
        does not come up (the reconciler tries again on its next tick)."""
        raise BackendUnavailable("this service runs no Ray head of its own to restart")

    # Drivers started and warmed ahead of the jobs they will run (service.backends.standby);
    # a backend that can start them sets this up, the reconciler uses it through these.
    standby: StandbyDrivers | None = None

    def take_standby(self, req: LaunchRequest) -> str | None:
        """Hand ``req`` to a warm standby driver instead of submitting it: the submission
        id to record for the job from now on (``standby.run_id``: the standby's and the
        job's), or None (none idle: submit it)."""
        ray_id = self.standby.take(req) if self.standby else None
        return run_id(ray_id, req.submission_id) if ray_id else None

    def standby_outcome(self, submission_id: str) -> RunStatus | None:
        """SUCCEEDED for a job a standby ran and said succeeded; None otherwise (its status
        is then its Ray job's)."""
        own = runner_of(submission_id)[1]
        if own and self.standby and self.standby.state_of(own) == "done":
            return RunStatus(RunState.SUCCEEDED, "")
        return None

    def settle(self, submission_id: str) -> None:
        """The job's success is recorded: a standby that ran it may take the next one."""
        if self.standby:
            self.standby.settle(runner_of(submission_id)[1] or "")

    def keep_standby(self) -> None:
        """Keep the configured standby drivers started (each reconciler tick)."""
        if self.standby:
            self.standby.keep()

    def close(self) -> None:
        """The service is stopping: stop the idle standby drivers."""
        if self.standby:
            self.standby.close()

    def dashboard_links(self, submission_id: str) -> dict[str, str]:
        """Links to a submission's pages in the Ray dashboard, by name; none by default.

        Names in use: ``job`` (the Ray job page, driver logs) and ``train_runs``
        (Ray Train's run list; see ``service.backends.ray_jobs.TRAIN_RUNS_PATH``).
        """
        del submission_id
        return {}
