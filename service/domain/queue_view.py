"""The queue as the scheduler sees it: queued jobs in the order it takes them up, and why
each waits, for ``GET /v1/cluster``.

The order and the reasons come from the scheduler's own decision
(:func:`admission`, which the reconciler admits jobs with), made on the same stored jobs
and the connected cluster's capacity; nothing here decides anything. A tenant sees its own
queued jobs by id and name and every other tenant's as an anonymous entry (no id, name,
tenant or reason), so its position is honest without telling who is ahead; a reason that
names another tenant's job says "another tenant's job" instead. Admins see every entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from service.auth import Principal
from service.backends.base import Backend, ClusterInfo
from service.backends.standby import PoolStatus
from service.domain.cluster_view import cluster_info
from service.domain.queries import scope
from service.domain.scheduler import AdmissionDecision, decide_admissions, policy_of, queue_demand
from service.planner.hardware import cluster_from_nodes
from service.settings.slices import QuotaSettings
from service.status import JobStatus
from service.store import JobStore
from service.store.models import QueueEntry

ACTIVE = frozenset({JobStatus.PENDING, JobStatus.RUNNING})
ADMITTED = "starting: the scheduler admits it on its next pass"
OTHER_JOB = "another tenant's job"


def admission(
    queued: list[QueueEntry],
    active: list[QueueEntry],
    total: dict[str, float],
    quotas: QuotaSettings,
    now: datetime,
) -> AdmissionDecision:
    """The scheduler's decision on ``queued`` (oldest first) beside the ``active`` jobs,
    on a cluster of ``total`` resources under the ``quotas``' policy."""
    held = [queue_demand(e, now) for e in active]
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    return decide_admissions(
        [queue_demand(e, now) for e in queued],
        free_cpus=cpus - sum(d.cpus for d in held),
        free_gpus=gpus - sum(d.gpus for d in held),
        total_cpus=cpus,
        total_gpus=gpus,
        held=held,
        policy=policy_of(quotas),
    )


@dataclass(frozen=True)
class QueuedJob:
    """One place in the queue (``job_id``, ``name``, ``tenant`` None when not the caller's)."""

    job_id: str | None
    name: str | None
    tenant: str | None
    position: int
    reason: str | None


@dataclass(frozen=True)
class ClusterStatus(ClusterInfo):
    """The connected cluster and its queue."""

    queue: list[QueuedJob]
    standby: PoolStatus | None = None  # the standby drivers kept warm (none configured: None)
    gpu_nodes: list[dict] | None = None  # GPU nodes of different sizes, as plans place on them


def _scrub(reason: str, foreign: set[str]) -> str:
    """``reason`` without the ids of jobs the caller may not see."""
    for job_id in foreign:
        if job_id in reason:
            reason = reason.replace(job_id, OTHER_JOB)
    return reason


def _names(jobs: JobStore, tenant: str | None, wanted: int) -> dict[str, str]:
    """Names of the queued jobs ``tenant`` sees (every tenant's: None), a page at a time."""
    names: dict[str, str] = {}
    offset = 0
    while len(names) < wanted:
        page = jobs.list_jobs(
            tenant_id=tenant, statuses={JobStatus.QUEUED}, limit=500, offset=offset
        )
        if not page:
            break
        names.update((j.id, j.name) for j in page)
        offset += len(page)
    return names


def queue_of(
    jobs: JobStore,
    quotas: QuotaSettings,
    principal: Principal,
    total: dict[str, float],
    now: datetime | None = None,
) -> list[QueuedJob]:
    """The queued jobs in scheduling order, as ``principal`` may see them."""
    queued = jobs.list_queue({JobStatus.QUEUED})
    if not queued:
        return []
    decision = admission(queued, jobs.list_queue(ACTIVE), total, quotas, now or datetime.now(UTC))
    reasons = {w.job_id: w.reason for w in decision.waiting}
    entries = {e.id: e for e in queued}
    tenant = scope(principal)
    foreign = {e.id for e in queued if tenant is not None and e.tenant_id != tenant}
    names = _names(jobs, tenant, len(queued) - len(foreign))
    out = []
    for position, job_id in enumerate(decision.order, start=1):
        entry = entries[job_id]
        if job_id in foreign:
            out.append(QueuedJob(None, None, None, position, None))
            continue
        reason = _scrub(reasons.get(job_id, ADMITTED), foreign)
        out.append(QueuedJob(job_id, names.get(job_id), entry.tenant or None, position, reason))
    return out


def cluster_status(
    backend: Backend, jobs: JobStore, quotas: QuotaSettings, principal: Principal
) -> ClusterStatus:
    """Nodes and resources (read at most every few seconds: ``cluster_view``), the queue
    ``principal`` may see, and the standby drivers kept warm."""
    info: ClusterInfo = cluster_info(backend)
    pool = backend.standby.status() if backend.standby else None
    return ClusterStatus(
        **vars(info),
        queue=queue_of(jobs, quotas, principal, info.total),
        standby=pool,
        gpu_nodes=cluster_from_nodes(info.nodes).get("gpu_nodes"),
    )


class ClusterView:
    """``GET /v1/cluster`` for a caller: the connected cluster, its queue, the standbys."""

    def __init__(self, backend: Backend, jobs: JobStore, quotas: QuotaSettings):
        """Read nodes and standbys from ``backend``, the queue from ``jobs`` (ordered under
        ``quotas``, as the scheduler would)."""
        self.backend, self.jobs, self.quotas = backend, jobs, quotas

    def status(self, principal: Principal) -> ClusterStatus:
        """What :func:`cluster_status` says to ``principal``."""
        return cluster_status(self.backend, self.jobs, self.quotas, principal)
