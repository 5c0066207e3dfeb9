"""Submitting jobs: validate the spec, plan it on the connected cluster, store it QUEUED.

The same steps, without storing, answer a dry run (``POST /v1/plan``), which
may also describe a cluster other than the connected one. Both check the places
the spec names against the operator's access policy
(:mod:`service.domain.access_policy`) before an object store is probed, so the
service sends requests only to stores the tenant may use, with the credentials
its job will use. The API calls the steps one by one (``prepare``, ``probe``,
``store``) so that the probe waits on the event loop, not in a thread the API needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from service.auth import Principal
from service.backends.base import Backend, ClusterInfo
from service.domain.access_policy import AccessPolicy, Tenant
from service.domain.cluster_view import cluster_info
from service.domain.data_check import data_refusals
from service.domain.model_source import check_model, check_reference
from service.domain.scheduler import max_queued_jobs
from service.domain.storage_check import StorageProbes
from service.domain.validation import field_errors, validate_spec
from service.errors import BackendUnavailable, InvalidSpec
from service.planner import ClusterSpec, Plan, plan_job
from service.planner.hardware import cluster_from_nodes
from service.settings.slices import SubmissionSettings
from service.store import JobRecord, JobStore
from workers.spec import JobSpec
from workers.storage.confine import UNCONFINED, Roots


@dataclass(frozen=True)
class Prepared:
    """A spec that passed validation, the access policy and planning, not yet probed."""

    tenant: Tenant
    tenant_id: str
    spec: JobSpec
    plan: Plan


class Submission:
    """Validation, planning and storing of new jobs."""

    def __init__(
        self,
        jobs: JobStore,
        backend: Backend,
        settings: SubmissionSettings,
        *,
        on_stored: Callable[[], None] | None = None,
    ):
        """Store into ``jobs``; plan on ``backend``'s cluster; defaults, quotas, probe
        bounds and the access policy from ``settings``; ``on_stored`` is called after each
        job is stored (the reconciler's wake, so that it is admitted now, not at the next
        poll)."""
        self.jobs, self.backend, self.settings = jobs, backend, settings
        self.on_stored = on_stored
        self.policy = AccessPolicy(settings.policy)
        self.probes = StorageProbes(
            workers=settings.probes.workers,
            per_tenant=settings.probes.per_tenant,
            timeout_s=settings.probes.timeout_s,
        )

    def tenant(self, principal: Principal) -> Tenant:
        """The tenant the access policy checks ``principal``'s specs for."""
        name = self.jobs.tenant_name(principal.tenant_id) or principal.tenant_id
        return Tenant(name=name, admin=principal.role == "admin")

    def submit(self, principal: Principal, data: Any) -> JobRecord:
        """Validate, check, plan, probe and store a job as QUEUED (all in this thread)."""
        prepared = self.prepare(principal, data)
        self.probes.check(prepared.tenant.name, prepared.spec)
        return self.store(prepared)

    def prepare(self, principal: Principal, data: Any) -> Prepared:
        """Validate ``data``, fill in the tenant's default storage, apply the access
        policy and plan the job; InvalidSpec (422) when any of them refuses."""
        tenant = self.tenant(principal)
        # A full queue is a 429 before the plan and the probe (store() checks again).
        self.jobs.check_queue_room(
            principal.tenant_id, max_queued_jobs(self.settings.quotas, tenant.name)
        )
        spec = self._with_defaults(validate_spec(data), tenant)
        prepared = self._checked_plan(principal, tenant, spec, cluster=None)
        plan = prepared.plan
        if plan.errors or plan.fits is False:  # None: cannot tell (unknown GPUs)
            raise InvalidSpec(
                "the plan for this job has errors",
                [{"loc": ["body"], "msg": m, "type": "plan"} for m in plan.errors],
            )
        return prepared

    def _checked_plan(
        self, principal: Principal, tenant: Tenant, spec: JobSpec, *, cluster: dict | None
    ) -> Prepared:
        """What a submission and a dry run share: the access policy, then the checks that
        read the model's config.json and the data (only once the policy allowed them; an
        object store's in a probe thread), then the plan on ``cluster`` (None: the
        connected cluster)."""
        self.policy.check(tenant, spec)
        roots = self.policy.roots(tenant)  # what the files are opened beneath, as on the workers
        model_config = check_model(spec, probes=self.probes, tenant=tenant.name, roots=roots)
        check_reference(spec, model_config, roots=roots)
        check_data(spec, probes=self.probes, tenant=tenant.name, roots=roots)
        shape = self.cluster_shape() if cluster is None else cluster
        plan = plan_job(spec, cluster=shape, model_config=model_config)
        return Prepared(tenant=tenant, tenant_id=principal.tenant_id, spec=spec, plan=plan)

    async def probe(self, prepared: Prepared) -> None:
        """Write-probe an object-store ``checkpoint.storage`` (422 when it cannot be
        written or does not answer in time; 429 past the probe bounds)."""
        await self.probes.check_async(prepared.tenant.name, prepared.spec)

    def store(self, prepared: Prepared) -> JobRecord:
        """Store a prepared (and probed) job as QUEUED; the scheduler takes it from there."""
        spec = prepared.spec
        job = self.jobs.create_job(
            tenant_id=prepared.tenant_id,
            name=spec.name,
            spec=spec,
            min_workers=spec.resources.min_workers,
            warnings=prepared.plan.warnings,
            # 429 past the tenant's queued-jobs quota (service.domain.scheduler).
            max_queued=max_queued_jobs(self.settings.quotas, prepared.tenant.name),
        )
        if self.on_stored is not None:
            self.on_stored()
        return job

    def _with_defaults(self, spec: JobSpec, tenant: Tenant) -> JobSpec:
        """``spec`` with the tenant's default storage and the service's metrics.tensorboard."""
        spec = self._with_default_storage(spec, tenant)
        if spec.metrics.tensorboard is not None:
            return spec
        metrics = spec.metrics.model_copy(update={"tensorboard": self.settings.tensorboard_default})
        return spec.model_copy(update={"metrics": metrics})

    def _with_default_storage(self, spec: JobSpec, tenant: Tenant) -> JobSpec:
        """``spec`` with the tenant's checkpoint area as storage when it names none."""
        if spec.checkpoint.storage is not None:
            return spec
        checkpoint = spec.checkpoint.model_copy(
            update={"storage": self.policy.default_storage(tenant)}
        )
        return spec.model_copy(update={"checkpoint": checkpoint})

    def plan(self, principal: Principal, data: Any) -> Plan:
        """Dry run in this thread: :meth:`prepare_plan`, then the storage probe."""
        prepared = self.prepare_plan(principal, data)
        self.probes.check(prepared.tenant.name, prepared.spec)
        return prepared.plan

    def prepare_plan(self, principal: Principal, data: Any) -> Prepared:
        """Validate ``{"spec": ..., "cluster": ...}``, apply the access policy and plan it
        (stores nothing). Without ``cluster`` the plan is for the connected cluster."""
        if not isinstance(data, dict) or "spec" not in data:
            raise InvalidSpec(
                'body must be {"spec": JobSpec, "cluster": {...}}',
                [{"loc": ["body", "spec"], "msg": "field required", "type": "missing"}],
            )
        tenant = self.tenant(principal)
        spec = validate_spec(data["spec"])
        cluster = _cluster_of(data.get("cluster"))  # refused before the model or data is read
        return self._checked_plan(principal, tenant, spec, cluster=cluster)

    def cluster_shape(self) -> dict:
        """Nodes, per-node CPUs, GPUs (and their model) and host memory of the connected
        cluster, as a plan's ``cluster`` (empty if it cannot be reached)."""
        try:
            nodes = cluster_info(self.backend).nodes  # read at most every 2 s (cluster_view)
        except BackendUnavailable:
            return {}
        return cluster_from_nodes(nodes)

    def cluster(self) -> ClusterInfo:
        """Nodes and resources of the connected cluster."""
        return self.backend.cluster()


def _cluster_of(given: Any) -> dict | None:
    """A dry run's ``cluster`` as a plan's (None when it names none: the connected one)."""
    try:
        cluster = ClusterSpec.model_validate(given or {})
    except ValidationError as e:
        raise InvalidSpec(
            "invalid cluster", field_errors(e, ["body", "cluster"], root=ClusterSpec)
        ) from e
    return cluster.model_dump(exclude_none=True) if given else None


def check_data(
    spec: JobSpec,
    *,
    loc: tuple = ("body",),
    probes: StorageProbes | None = None,
    tenant: str = "",
    roots: Roots = UNCONFINED,
) -> None:
    """InvalidSpec (422) naming the field when ``spec``'s data cannot be trained on (only
    after the access policy allowed the path: the check reads the file beneath ``roots``;
    an object-store one's head through ``probes``, for ``tenant``)."""
    refusals = data_refusals(spec, probes=probes, tenant=tenant, roots=roots)
    if refusals:
        raise InvalidSpec(
            "the job's data cannot be used",
            [{"loc": [*loc, *f], "msg": m, "type": "data"} for f, m in refusals],
        )
