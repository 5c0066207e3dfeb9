"""Backend on the Ray Job Submission API (embedded local head or an existing cluster)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Protocol

from service.backends.base import Backend, ClusterInfo, LaunchRequest, RunState, RunStatus
from service.backends.standby import StandbyDrivers, runner_of
from service.backends.standby_logs import follow_part, job_part
from service.backends.warm_policy import WarmBudget
from service.errors import BackendError, BackendUnavailable
from workers.contract import driver_command, launch_env

# Ray 2.60's dashboard has no Train page (its web client routes jobs, actors, cluster,
# serve, metrics and logs; ray/dashboard/client/build); Ray Train runs are served only by
# TrainHead as JSON at this path: every Train V2 run of the cluster (name = etrain job id),
# with attempts and workers. It answers once a driver ran with
# RAY_TRAIN_ENABLE_STATE_TRACKING=1 (the reconciler sets it); there is no per-run URL.
TRAIN_RUNS_PATH = "/api/train/v2/runs/v1"
# Seconds each readiness request may take (GET /readyz answers within a few of them).
READY_TIMEOUT_S = 3.0
log = logging.getLogger(__name__)
_STATES = {
    "PENDING": RunState.PENDING,
    "RUNNING": RunState.RUNNING,
    "SUCCEEDED": RunState.SUCCEEDED,
    "FAILED": RunState.FAILED,
    "STOPPED": RunState.STOPPED,
}


class OwnHead(Protocol):
    """A Ray head this service started and restarts (``service.backends.embedded``)."""

    def exited(self) -> int | None: ...

    def restart(self) -> str: ...


class RayJobBackend(Backend):
    """Runs the job driver (``workers.contract.driver_command``) as a Ray job through the
    dashboard's job API.

    Token auth is taken from ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN(_PATH)`` in
    this process's environment, as Ray's own clients do.
    """

    def __init__(
        self,
        address: str,
        *,
        python: str = "python",
        probe_agent: bool = False,
        head: OwnHead | None = None,
    ):
        self.address = address.rstrip("/")
        self.python = python
        self.probe_agent = probe_agent
        self.head = head
        self._client = None

    def head_lost(self) -> str | None:
        """Why the embedded head stopped (``ray start`` exited: one of its Ray processes
        died, and it stopped the rest); None while it runs or with no head of its own."""
        code = self.head.exited() if self.head is not None else None
        if code is None:
            return None
        return f"the embedded Ray head stopped (exit code {code}; its log: ray-head.log)"

    def restart_head(self) -> None:
        """Start the embedded head again; its standby drivers went with the old one."""
        if self.head is None:
            super().restart_head()
        log.warning("the embedded Ray head stopped; restarting it")
        if self.standby:
            self.standby.lost_all()
        self._client = None
        self.address = self.head.restart().rstrip("/")
        log.warning("the embedded Ray head is back at %s", self.address)

    def use_standby(self, *, count: int, workers: int, report_url: str, budget: WarmBudget) -> None:
        """Keep ``count`` standby drivers warm (``service.backends.standby``), each warming
        ``workers`` worker processes on its node, within ``budget`` (sized to the head
        node, where Ray's job API starts drivers)."""
        self.standby = StandbyDrivers(
            lambda sid, env: self._submit_driver(
                sid, env, {"etrain_standby": sid}, what="a standby driver"
            ),
            self.stop,
            count=count,
            workers=workers,
            report_url=report_url,
            budget=budget,
            node=self._head_node,
        )

    def _head_node(self) -> tuple[float | None, float | None]:
        """The head node's CPUs and memory (bytes), as the dashboard reports them."""
        for node in self.cluster().nodes:
            if node["is_head"]:
                return node["resources"].get("CPU"), node.get("memory_bytes")
        raise BackendUnavailable("the cluster reports no head node")

    def _jobs(self):
        from ray.job_submission import JobSubmissionClient

        if self._client is None:
            try:
                self._client = JobSubmissionClient(self.address)
            except Exception as e:
                raise BackendUnavailable(f"cannot reach Ray at {self.address}: {e}") from e
        return self._client

    def dashboard_job_url(self, submission_id: str) -> str:
        """Link to the job's page in the Ray dashboard."""
        return f"{self.address}/#/jobs/{submission_id}"

    def dashboard_links(self, submission_id: str) -> dict[str, str]:
        """The Ray job page and the cluster's Ray Train run list."""
        return dashboard_links_at(self.address, runner_of(submission_id)[0])

    def submit(self, req: LaunchRequest) -> str:
        """Submit the driver with the job's environment; a repeated id is not an error."""
        env = {**launch_env(job_id=req.job_id, spec_json=req.spec_json), **req.env}
        self._submit_driver(
            req.submission_id, env, {"etrain_job_id": req.job_id}, what=f"job {req.job_id}"
        )
        return self.dashboard_job_url(req.submission_id)

    def _submit_driver(
        self, submission_id: str, env: dict[str, str], metadata: dict, *, what: str
    ) -> None:
        """Start the driver as Ray job ``submission_id`` (``what``: for messages); one that
        already exists is kept."""
        try:
            self._jobs().submit_job(
                entrypoint=driver_command(self.python),
                submission_id=submission_id,
                runtime_env={"env_vars": env},
                metadata=metadata,
            )
        except RuntimeError as e:
            if "already exists" in str(e):
                return
            if refused(str(e)):
                raise BackendError(f"Ray refused {what}: {e}") from e
            raise BackendUnavailable(f"Ray's job API cannot take {what} now: {e}") from e
        except Exception as e:
            raise BackendUnavailable(f"cannot submit to Ray at {self.address}: {e}") from e

    def status(self, submission_id: str) -> RunStatus:
        """Map Ray's job status; MISSING when Ray does not know the id. A job a standby
        runs: SUCCEEDED once the standby said so, else its Ray job's status."""
        if (done := self.standby_outcome(submission_id)) is not None:
            return done
        ray_id, own = runner_of(submission_id)
        status = self._ray_status(ray_id)
        if own and self.standby and status.state not in (RunState.PENDING, RunState.RUNNING):
            self.standby.forget(ray_id)
        return status

    def _ray_status(self, submission_id: str) -> RunStatus:
        try:
            info = self._jobs().get_job_info(submission_id)
        except RuntimeError as e:
            if "does not exist" in str(e) or "404" in str(e):
                return RunStatus(RunState.MISSING, str(e))
            raise BackendUnavailable(f"Ray job status failed: {e}") from e
        except Exception as e:
            raise BackendUnavailable(f"cannot reach Ray at {self.address}: {e}") from e
        return RunStatus(
            _STATES[str(info.status.value)],
            info.message or "",
            exit_code=getattr(info, "driver_exit_code", None),
        )

    def stop(self, submission_id: str) -> None:
        """Stop the Ray job (its workers go with the driver); a job a standby runs stops
        its standby, unless the job already ended there (the standby then runs another
        job, or waits for one). A standby the pool does not know is stopped."""
        submission_id, own = runner_of(submission_id)
        if own and self.standby:
            if self.standby.runs(submission_id, own) is False:
                return
            # The standby ends with the job: out of the pool now (the job's record ends
            # here, so no later status read would tell it), which starts another.
            self.standby.forget(submission_id)
        try:
            self._jobs().stop_job(submission_id)
        except RuntimeError as e:
            if "does not exist" not in str(e):
                raise BackendError(f"Ray could not stop {submission_id}: {e}") from e
        except Exception as e:
            raise BackendUnavailable(f"cannot reach Ray at {self.address}: {e}") from e

    def logs(self, submission_id: str) -> str:
        """The driver log, which carries the workers' output (log_to_driver); of a job a
        standby ran, that job's part of it (``standby_logs.job_part``)."""
        ray_id, own = runner_of(submission_id)
        try:
            text = self._jobs().get_job_logs(ray_id)
        except Exception as e:
            raise BackendUnavailable(f"cannot read logs of {ray_id}: {e}") from e
        return job_part(text, own) if own else text

    async def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        """Stream the driver log until the job ends (a standby's job: until its part ends)."""
        ray_id, own = runner_of(submission_id)
        chunks = self._jobs().tail_job_logs(ray_id)
        async for chunk in follow_part(chunks, own) if own else chunks:
            yield chunk

    def cluster(self) -> ClusterInfo:
        """Alive nodes and their total and available resources, from the dashboard."""
        return _cluster_from_summary(self._summary(timeout=10), self.address)

    def _summary(self, *, timeout: float) -> list[dict]:
        """The dashboard's node summary (every node, dead ones too)."""
        import httpx

        from workers.ray_compat import auth_headers

        try:
            r = httpx.get(
                f"{self.address}/nodes?view=summary", headers=auth_headers(), timeout=timeout
            )
            r.raise_for_status()
            return r.json()["data"]["summary"]
        except Exception as e:
            raise BackendUnavailable(f"cannot read cluster state from {self.address}: {e}") from e

    def ping(self) -> None:
        """Raise BackendUnavailable unless the job API answers."""
        self.cluster()

    def not_ready(self) -> str | None:
        """Whether Ray's job API could start a job now, checked without submitting one.

        A submission needs the job API (``/api/version``), an ALIVE head node, and that
        node's dashboard agent serving HTTP: the job API hands every submission to it, and
        without it answers ``No available agent to submit job``. With ``probe_agent`` (the
        embedded head, whose agent this process can reach) the agent's own health check
        must answer too; else its registered HTTP port must be set.
        """
        import httpx

        from workers.ray_compat import auth_headers

        try:
            headers = auth_headers()
            r = httpx.get(f"{self.address}/api/version", headers=headers, timeout=READY_TIMEOUT_S)
            if r.status_code != 200:
                return f"Ray job API answered {r.status_code}"
            head = _alive_head(self._summary(timeout=READY_TIMEOUT_S))
            if head is None:
                return "Ray has no ALIVE head node yet"
            port = int(head.get("dashboardAgentListenPort") or 0)
            if port <= 0:
                return "the Ray head's dashboard agent serves no HTTP, so no job can start"
        except (httpx.HTTPError, BackendUnavailable, ValueError, KeyError) as e:
            return f"cannot reach Ray's job API ({type(e).__name__})"
        if self.probe_agent:
            agent = f"http://{head.get('nodeManagerAddress', '127.0.0.1')}:{port}"
            try:
                r = httpx.get(f"{agent}/api/healthz", headers=headers, timeout=READY_TIMEOUT_S)
            except httpx.HTTPError as e:
                return f"the Ray head's dashboard agent does not answer ({type(e).__name__})"
            if r.status_code != 200:
                return f"the Ray head's dashboard agent answered {r.status_code}"
        return None


def _alive_head(summary: list[dict]) -> dict | None:
    """The raylet record of the ALIVE head node in a node summary, if there is one."""
    for node in summary:
        raylet = node.get("raylet", {})
        if raylet.get("isHeadNode") and raylet.get("state") == "ALIVE":
            return raylet
    return None


def refused(error: str) -> bool:
    """Whether an error of Ray's job client is a refusal (a 4xx), not a failure to try again.

    The client raises ``Request failed with status code N: <body>``. The head wraps what
    its job agent answered, so ``500: ... status code 400: ...`` is the agent's refusal:
    the innermost code decides. 5xx (``No available agent to submit job, please try again
    later``), 408 and 429 are worth retrying; so is an error with no code.
    """
    codes = re.findall(r"status code (\d{3})", error)
    if not codes:
        return False
    code = int(codes[-1])
    return 400 <= code < 500 and code not in (408, 429)


def dashboard_links_at(base: str, submission_id: str) -> dict[str, str]:
    """Dashboard links of ``submission_id`` on the dashboard at ``base``."""
    base = base.rstrip("/")
    return {"job": f"{base}/#/jobs/{submission_id}", "train_runs": f"{base}{TRAIN_RUNS_PATH}"}


def _cluster_from_summary(summary: list[dict], address: str) -> ClusterInfo:
    nodes, total, available = [], {}, {}
    for node in summary:
        raylet = node.get("raylet", {})
        if raylet.get("state") != "ALIVE":
            continue
        res_total = raylet.get("resourcesTotal", {})
        res_avail = raylet.get("resourcesAvailable", res_total)
        nodes.append(
            {
                "node_id": raylet.get("nodeId"),
                "ip": node.get("ip"),
                "is_head": raylet.get("isHeadNode", False),
                "labels": raylet.get("labels") or {},
                "resources": res_total,
                "available": res_avail,
                "memory_bytes": (node.get("mem") or [None])[0],  # the host's, as Ray saw it
                # The reporter agent's GPU list: model name and memory (MB) of each device.
                "gpus": [
                    {"name": g.get("name"), "memory_mb": g.get("memoryTotal")}
                    for g in node.get("gpus") or []
                ],
            }
        )
        for key in ("CPU", "GPU", "memory"):
            total[key] = total.get(key, 0.0) + float(res_total.get(key, 0.0))
            available[key] = available.get(key, 0.0) + float(res_avail.get(key, 0.0))
    return ClusterInfo(nodes=nodes, total=total, available=available, dashboard_url=address)
