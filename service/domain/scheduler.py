"""Admission policy: which queued jobs may start now. Pure: decides, does not act.

The rule, applied to the queue (oldest first) on every reconciler tick:

1. **Never blocks what can never start.** A job whose minimum (workers x per-worker
   CPUs and GPUs) exceeds the cluster's *total* capacity, or its tenant's running quota,
   waits with a reason that says so (it starts if the cluster grows or the quota is
   raised) and holds nothing back.
2. **No head-of-line blocking.** A job that does not fit the free room now is skipped
   with a reason; jobs behind it that fit may start.
3. **No starvation.** The job that has waited longest, once it has waited
   ``reserve_after_s``, could fit the total capacity and its tenant's quota has room for
   it, is considered first and gets a *reservation*: while it does not fit, the CPUs and
   GPUs it needs are held back (per resource), so the others start only in what is left
   beside it and it starts as soon as enough running jobs end. One reservation at a time.
4. **Fair between tenants.** Otherwise tenants take turns: next is the tenant with the
   lowest dominant share (the larger of its CPU and GPU fraction of the total capacity,
   held by its active jobs plus what this decision admitted, divided by its weight),
   ties to the tenant whose oldest queued job is older; within a tenant, oldest first.
5. **Quotas.** A tenant's active jobs (counted at their minimum workers, as the room is)
   stay within its running-worker and running-GPU quotas.
6. **GPUs that hold the ranks.** With GPU nodes of different memory, a GPU job counts only
   the GPUs that hold its planned rank, and takes the smallest of them (``gpu_rooms``); a
   reservation holds the free GPUs that hold the reserved job's ranks.

The same inputs always give the same decision.
"""

from __future__ import annotations

import enum
import heapq
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from service.domain.gpu_rooms import GpuRooms
from service.settings.slices import QuotaSettings
from service.store.models import QueueEntry

_EPS = 1e-9  # 0.1 + 0.2 > 0.3 in binary; never refuse an exact fit for that
_QUOTA_SETTINGS = "ETRAIN_MAX_RUNNING_{}_PER_TENANT or the tenant's ETRAIN_TENANT_QUOTAS entry"


@dataclass(frozen=True)
class Demand:
    """What a job needs to start: its minimum workers times per-worker resources.

    ``tenant`` names the tenant its quota and weight are looked up by; ``waited_s`` is how
    long it has been queued (for the reservation rule); ``gpu_bytes`` what each rank needs
    of its GPU (0: any GPU; on a cluster of mixed GPUs only those that hold it count).
    """

    job_id: str
    cpus: float
    gpus: float
    tenant: str = ""
    workers: int = 0
    waited_s: float = 0.0
    gpu_bytes: int = 0

    @classmethod
    def for_spec(
        cls,
        job_id: str,
        *,
        min_workers: int,
        cpus_per_worker: float,
        gpus_per_worker: int,
        tenant: str = "",
        waited_s: float = 0.0,
        gpu_bytes: int = 0,
    ) -> Demand:
        """The demand of a job spec's minimum worker count."""
        return cls(
            job_id,
            cpus=min_workers * cpus_per_worker,
            gpus=float(min_workers * gpus_per_worker),
            tenant=tenant,
            workers=min_workers,
            waited_s=waited_s,
            gpu_bytes=gpu_bytes,
        )


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's running quotas (None: unlimited) and its fair-share weight."""

    max_workers: int | None = None
    max_gpus: float | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class Policy:
    """Per-tenant limits (by tenant name, else ``default``) and the reservation age."""

    limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    default: TenantLimits = TenantLimits()
    reserve_after_s: float | None = 300.0

    def of(self, tenant: str) -> TenantLimits:
        """The limits of ``tenant``."""
        return self.limits.get(tenant, self.default)


class WaitCode(enum.StrEnum):
    """Why a queued job did not start (stored with its ``waiting`` event)."""

    RESOURCES = "resources"  # not enough free room now
    RESERVED = "reserved"  # it would fit, but the room is held for the longest-waiting job
    QUOTA = "quota"  # its tenant runs up to its quota now
    NEVER_FITS = "never_fits"  # more than the cluster's total capacity
    OVER_QUOTA = "over_quota"  # more than its tenant may ever run


@dataclass(frozen=True)
class Waiting:
    """A queued job that stays queued, and why."""

    job_id: str
    code: WaitCode
    reason: str


@dataclass(frozen=True)
class AdmissionDecision:
    """The jobs to submit now (in order), why each of the others waits, and the job
    holding the reservation (if any)."""

    admit: tuple[str, ...]
    waiting: tuple[Waiting, ...] = ()
    reserved: str | None = None
    # Every queued job in the order this decision took it up: the reservation, the
    # fair-share turns, then those that can never start (the queue's real order). It
    # follows from the rest, so two decisions compare equal on admit, waiting and reserved.
    order: tuple[str, ...] = field(default=(), compare=False)

    @property
    def waiting_reason(self) -> str | None:
        """The reason of the first job (in queue order) that waits."""
        return self.waiting[0].reason if self.waiting else None


def _res(cpus: float, gpus: float) -> str:
    return f"{cpus:g} CPU / {gpus:g} GPU"


@dataclass
class _Usage:
    cpus: float = 0.0
    gpus: float = 0.0
    workers: int = 0

    def add(self, d: Demand) -> None:
        self.cpus, self.gpus, self.workers = (
            self.cpus + d.cpus,
            self.gpus + d.gpus,
            self.workers + d.workers,
        )


class _Round:
    """The room and the per-tenant usage as one decision admits jobs."""

    def __init__(self, free: tuple[float, float], total: tuple[float, float], held, policy, rooms):
        self.rooms: GpuRooms | None = rooms
        self.free_cpus, self.free_gpus = free
        self.total_cpus, self.total_gpus = total
        self.policy = policy
        self.usage: dict[str, _Usage] = defaultdict(_Usage)
        for d in held:
            self.usage[d.tenant].add(d)
        self.reserved: Demand | None = None

    def never(self, d: Demand) -> Waiting | None:
        """Why ``d`` can never start here (cluster capacity, tenant quota), or None."""
        if d.cpus > self.total_cpus + _EPS or d.gpus > self.total_gpus + _EPS:
            return Waiting(
                d.job_id,
                WaitCode.NEVER_FITS,
                f"can never fit this cluster: needs {_res(d.cpus, d.gpus)} at its minimum of "
                f"{d.workers} workers, the cluster has {_res(self.total_cpus, self.total_gpus)} "
                "in total; it starts only if the cluster grows (cancel it, or lower "
                "resources.workers or the per-worker resources); it blocks no other job",
            )
        if self.rooms is not None and (why := self.rooms.cannot_ever(d)):
            return Waiting(d.job_id, WaitCode.NEVER_FITS, why)
        lim = self.policy.of(d.tenant)
        for what, need, cap in (
            ("workers", d.workers, lim.max_workers),
            ("GPUs", d.gpus, lim.max_gpus),
        ):
            if cap is not None and need > cap + _EPS:
                return Waiting(
                    d.job_id,
                    WaitCode.OVER_QUOTA,
                    f"needs {need:g} {what} but tenant {d.tenant!r} may run at most {cap:g} "
                    f"({_QUOTA_SETTINGS.format(what.upper())}); it can never start under this "
                    "quota and blocks no other job",
                )
        return None

    def quota(self, d: Demand) -> Waiting | None:
        """Why ``d``'s tenant may not run it now (its running quota is used), or None."""
        lim, used = self.policy.of(d.tenant), self.usage[d.tenant]
        for what, have, need, cap in (
            ("workers", used.workers, d.workers, lim.max_workers),
            ("GPUs", used.gpus, d.gpus, lim.max_gpus),
        ):
            if cap is not None and have + need > cap + _EPS:
                return Waiting(
                    d.job_id,
                    WaitCode.QUOTA,
                    f"tenant {d.tenant!r} runs {have:g} of its {cap:g} {what} "
                    f"({_QUOTA_SETTINGS.format(what.upper())}) and this job needs {need:g}; "
                    "it starts when the tenant's other jobs end",
                )
        return None

    def fits(self, d: Demand, *, beside_reservation: bool) -> bool:
        held = self.reserved if beside_reservation and self.reserved is not None else None
        cpus = self.free_cpus - (held.cpus if held else 0.0)
        gpus = self.free_gpus - (held.gpus if held else 0.0)
        # A resource the job does not use is no reason to wait, even when none is left.
        room = all(need <= _EPS or need <= r + _EPS for need, r in ((d.cpus, cpus), (d.gpus, gpus)))
        return room and not (held and self.rooms and self.rooms.beside(held).cannot_now(d))

    def try_admit(self, d: Demand) -> Waiting | None:
        """Admit ``d`` (None) or say why it waits."""
        blocked = self.quota(d)
        if blocked is not None:
            return blocked
        if not self.fits(d, beside_reservation=False):
            return Waiting(
                d.job_id,
                WaitCode.RESOURCES,
                f"waiting for resources: needs {_res(d.cpus, d.gpus)}, "
                f"free {_res(self.free_cpus, self.free_gpus)}",
            )
        if self.rooms is not None and (why := self.rooms.cannot_now(d)):
            return Waiting(d.job_id, WaitCode.RESOURCES, why)
        if not self.fits(d, beside_reservation=True):
            r = self.reserved
            assert r is not None
            return Waiting(
                d.job_id,
                WaitCode.RESERVED,
                f"waiting behind {r.job_id}, queued longest ({r.waited_s:.0f} s), which holds "
                f"a reservation of {_res(r.cpus, r.gpus)} until it can start",
            )
        self.free_cpus -= d.cpus
        self.free_gpus -= d.gpus
        self.usage[d.tenant].add(d)
        if self.rooms is not None:
            self.rooms.take_for(d)
        return None

    def share(self, tenant: str) -> float:
        """``tenant``'s dominant share of the total capacity over its weight."""
        used = self.usage[tenant]
        cpu = used.cpus / self.total_cpus if self.total_cpus > _EPS else 0.0
        gpu = used.gpus / self.total_gpus if self.total_gpus > _EPS else 0.0
        return max(cpu, gpu) / max(self.policy.of(tenant).weight, _EPS)


def _reservation(eligible: Sequence[Demand], rnd: _Round) -> Demand | None:
    """The longest-waiting job past ``reserve_after_s`` whose tenant has quota room now."""
    after = rnd.policy.reserve_after_s
    if after is None:
        return None
    aged = [
        (-d.waited_s, i, d)
        for i, d in enumerate(eligible)
        if d.waited_s >= after and rnd.quota(d) is None
    ]
    return min(aged, key=lambda t: t[:2])[2] if aged else None


def _fair_turns(
    eligible: Iterable[Demand],
    rnd: _Round,
    waiting: dict[str, Waiting],
    admit: list[str],
    order: list[str],
) -> None:
    """Tenants take turns by dominant share; each turn decides the tenant's oldest job."""
    queues: dict[str, deque[tuple[int, Demand]]] = defaultdict(deque)
    for i, d in enumerate(eligible):
        queues[d.tenant].append((i, d))
    turns = [(rnd.share(t), q[0][0], t) for t, q in queues.items()]
    heapq.heapify(turns)
    while turns:
        _, _, tenant = heapq.heappop(turns)
        _, d = queues[tenant].popleft()
        order.append(d.job_id)
        why = rnd.try_admit(d)
        if why is None:
            admit.append(d.job_id)
        else:
            waiting[d.job_id] = why
        if queues[tenant]:
            heapq.heappush(turns, (rnd.share(tenant), queues[tenant][0][0], tenant))


def decide_admissions(
    queued: Sequence[Demand],
    *,
    free_cpus: float,
    free_gpus: float,
    total_cpus: float | None = None,
    total_gpus: float | None = None,
    held: Sequence[Demand] = (),
    policy: Policy | None = None,
    rooms: GpuRooms | None = None,
) -> AdmissionDecision:
    """Which of ``queued`` (oldest first) start now, by the rule in this module's doc.

    ``free_*`` is the room not held by the active jobs ``held``; ``total_*`` the cluster's
    whole capacity (default: free plus held); ``rooms`` mixed GPU nodes (rule 6).
    """
    policy = policy or Policy()
    total = (
        free_cpus + sum(d.cpus for d in held) if total_cpus is None else total_cpus,
        free_gpus + sum(d.gpus for d in held) if total_gpus is None else total_gpus,
    )
    rnd = _Round((free_cpus, free_gpus), total, held, policy, rooms)
    waiting: dict[str, Waiting] = {}
    admit: list[str] = []
    eligible = []
    for d in queued:
        never = rnd.never(d)
        if never is not None:
            waiting[d.job_id] = never
        else:
            eligible.append(d)
    reserved = _reservation(eligible, rnd)
    considered = [reserved.job_id] if reserved is not None else []
    if reserved is not None:
        eligible.remove(reserved)
        why = rnd.try_admit(reserved)
        if why is None:
            admit.append(reserved.job_id)
            reserved = None
        else:
            waiting[reserved.job_id] = Waiting(
                reserved.job_id,
                WaitCode.RESOURCES,
                f"{why.reason}; queued longest ({reserved.waited_s:.0f} s), so it holds a "
                "reservation: other jobs start only beside it",
            )
            rnd.reserved = reserved
    _fair_turns(eligible, rnd, waiting, admit, considered)
    order = [d.job_id for d in queued if d.job_id in waiting]
    taken = set(considered)
    return AdmissionDecision(
        tuple(admit),
        tuple(waiting[j] for j in order),
        reserved.job_id if reserved is not None else None,
        tuple(considered + [d.job_id for d in queued if d.job_id not in taken]),
    )


def policy_of(quotas: QuotaSettings) -> Policy:
    """The scheduling policy the settings describe (``ETRAIN_MAX_RUNNING_*``, quotas)."""
    default = TenantLimits(max_workers=quotas.max_running_workers, max_gpus=quotas.max_running_gpus)
    limits = {
        name: TenantLimits(
            max_workers=q.max_running_workers
            if q.max_running_workers is not None
            else default.max_workers,
            max_gpus=q.max_running_gpus if q.max_running_gpus is not None else default.max_gpus,
            weight=q.weight,
        )
        for name, q in quotas.tenant_quotas.items()
    }
    return Policy(limits, default, quotas.reserve_after_s)


def max_queued_jobs(quotas: QuotaSettings, tenant: str) -> int:
    """How many QUEUED jobs the tenant called ``tenant`` may have."""
    override = quotas.tenant_quotas.get(tenant)
    if override is not None and override.max_queued_jobs is not None:
        return override.max_queued_jobs
    return quotas.max_queued_jobs


def queue_demand(entry: QueueEntry, now: datetime, *, gpu_bytes: int = 0) -> Demand:
    """The demand of a stored job at its minimum workers, and how long it has waited."""
    return Demand.for_spec(
        entry.id,
        min_workers=entry.min_workers,
        cpus_per_worker=entry.cpus_per_worker,
        gpus_per_worker=entry.gpus_per_worker,
        tenant=entry.tenant,
        waited_s=max(0.0, (now - entry.created_at).total_seconds()),
        gpu_bytes=gpu_bytes,
    )
