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
from service.domain.gpu_rooms import GpuRooms
from service.domain.planned_memory import PlannedMemory
from service.domain.queries import scope
from service.domain.scheduler import AdmissionDecision, decide_admissions, policy_of, queue_demand
from service.errors import BackendUnavailable
from service.planner.hardware import cluster_from_nodes
from service.settings.slices import QuotaSettings
from service.status import JobStatus
from service.store import JobStore
from service.store.models import JobRecord, QueueEntry
from workers.contract import GPU_NODES_ENV
from workers.spec import JobSpec

ACTIVE = frozenset({JobStatus.PENDING, JobStatus.RUNNING})
ADMITTED = "starting: the scheduler admits it on its next pass"
OTHER_JOB = "another tenant's job"


# The planned bytes of queued and active GPU jobs, for the scheduler on a cluster of mixed
# GPUs (the reconciler's and GET /v1/cluster's decisions share them).
_PLANNED = PlannedMemory()


def rank_gpu_bytes(job_id: str, spec: JobSpec, min_workers: int, tenant: str) -> int:
    """What the largest rank of a GPU job needs of its GPU at its minimum workers, as
    planned (0: not a GPU job, or its model cannot be sized now)."""
    if not spec.resources.gpus_per_worker:
        return 0
    planned = _PLANNED.of(job_id, spec, min_workers, tenant=tenant)
    return int((planned or {}).get("total_bytes", 0))


def _sized(jobs: JobStore, e: QueueEntry) -> int:
    if not e.gpus_per_worker:
        return 0
    return rank_gpu_bytes(e.id, jobs.get_job(e.id).spec, e.min_workers, e.tenant)


def admission(
    queued: list[QueueEntry],
    active: list[QueueEntry],
    cluster: ClusterInfo,
    quotas: QuotaSettings,
    now: datetime,
    jobs: JobStore | None = None,
) -> AdmissionDecision:
    """The scheduler's decision on ``queued`` (oldest first) beside the ``active`` jobs,
    on ``cluster`` under the ``quotas``' policy; on a cluster of mixed GPUs, with the
    rank sizes of ``jobs``' GPU jobs (scheduler rule 6)."""
    rooms = GpuRooms.of(cluster.nodes) if jobs is not None else None
    sized = (lambda e: _sized(jobs, e)) if rooms is not None else (lambda e: 0)
    held = [queue_demand(e, now, gpu_bytes=sized(e)) for e in active]
    for entry, d in zip(active, held, strict=True):
        if rooms is not None and entry.status == JobStatus.PENDING:
            rooms.take_for(d)  # admitted, and not on Ray's nodes yet
    cpus, gpus = cluster.total.get("CPU", 0.0), cluster.total.get("GPU", 0.0)
    return decide_admissions(
        [queue_demand(e, now, gpu_bytes=sized(e)) for e in queued],
        free_cpus=cpus - sum(d.cpus for d in held),
        free_gpus=gpus - sum(d.gpus for d in held),
        total_cpus=cpus,
        total_gpus=gpus,
        held=held,
        policy=policy_of(quotas),
        rooms=rooms,
    )


def pin_gpu_nodes(backend: Backend, job: JobRecord, tenant: str | None) -> dict[str, str]:
    """The driver variable that keeps ``job``'s workers on the nodes whose GPUs hold its
    ranks, on a cluster of mixed GPUs (empty elsewhere, or when it cannot be read)."""
    if not job.spec.resources.gpus_per_worker:
        return {}
    try:
        rooms = GpuRooms.of(cluster_info(backend).nodes)
    except BackendUnavailable:
        return {}
    # Planned only on a cluster of mixed GPUs (model.hf's config.json is read for it).
    need = rank_gpu_bytes(job.id, job.spec, job.min_workers, tenant or "") if rooms else 0
    return {GPU_NODES_ENV: ",".join(rooms.nodes_for(need))} if need else {}


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
    cluster: ClusterInfo,
    now: datetime | None = None,
) -> list[QueuedJob]:
    """The queued jobs in scheduling order, as ``principal`` may see them."""
    queued = jobs.list_queue({JobStatus.QUEUED})
    if not queued:
        return []
    active, now = jobs.list_queue(ACTIVE), now or datetime.now(UTC)
    decision = admission(queued, active, cluster, quotas, now, jobs)
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
        queue=queue_of(jobs, quotas, principal, info),
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
