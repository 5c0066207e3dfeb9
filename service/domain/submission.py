"""Submitting jobs: validate the spec, plan it on the connected cluster, store it QUEUED.

The same steps, without storing, answer a dry run (``POST /v1/plan``), which
may also describe a cluster other than the connected one.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from service.auth import Principal
from service.backends.base import Backend, ClusterInfo
from service.domain.scheduler import max_queued_jobs
from service.domain.storage_check import check_checkpoint_storage
from service.domain.validation import field_errors, validate_spec
from service.errors import BackendUnavailable, InvalidSpec
from service.planner import ClusterSpec, Plan, plan_job
from service.planner.hardware import cluster_from_nodes
from service.settings import Settings
from service.store import JobRecord, JobStore
from workers.spec import JobSpec


class Submission:
    """Validation, planning and storing of new jobs."""

    def __init__(self, jobs: JobStore, backend: Backend, settings: Settings):
        """Store into ``jobs``; plan on ``backend``'s cluster; defaults from ``settings``."""
        self.jobs, self.backend, self.settings = jobs, backend, settings

    def submit(self, principal: Principal, data: Any) -> JobRecord:
        """Validate, plan and store a job as QUEUED; the scheduler takes it from there."""
        spec = self._with_default_storage(validate_spec(data))
        plan = plan_job(spec, cluster=self.cluster_shape())
        if plan.errors or plan.fits is False:  # None: cannot tell (unknown GPUs)
            raise InvalidSpec(
                "the plan for this job has errors",
                [{"loc": ["body"], "msg": m, "type": "plan"} for m in plan.errors],
            )
        check_checkpoint_storage(spec.checkpoint)  # s3:// and gs:// only: a write probe
        return self.jobs.create_job(
            tenant_id=principal.tenant_id,
            name=spec.name,
            spec=spec,
            min_workers=spec.resources.min_workers,
            warnings=plan.warnings,
            # 429 past the tenant's queued-jobs quota (service.domain.scheduler).
            max_queued=max_queued_jobs(self.settings, self.jobs.tenant_name(principal.tenant_id)),
        )

    def _with_default_storage(self, spec: JobSpec) -> JobSpec:
        """``spec`` with the service's checkpoint storage when it names none."""
        if spec.checkpoint.storage is not None:
            return spec
        checkpoint = spec.checkpoint.model_copy(
            update={"storage": self.settings.default_checkpoint_storage}
        )
        return spec.model_copy(update={"checkpoint": checkpoint})

    def plan(self, data: Any) -> Plan:
        """Dry run: validate ``{"spec": ..., "cluster": ...}`` and plan it (stores nothing).

        Without ``cluster`` the plan is for the connected cluster.
        """
        if not isinstance(data, dict) or "spec" not in data:
            raise InvalidSpec(
                'body must be {"spec": JobSpec, "cluster": {...}}',
                [{"loc": ["body", "spec"], "msg": "field required", "type": "missing"}],
            )
        spec = validate_spec(data["spec"])
        check_checkpoint_storage(spec.checkpoint)
        try:
            cluster = ClusterSpec.model_validate(data.get("cluster") or {})
        except ValidationError as e:
            raise InvalidSpec(
                "invalid cluster", field_errors(e, ["body", "cluster"], root=ClusterSpec)
            ) from e
        shape = (
            cluster.model_dump(exclude_none=True) if data.get("cluster") else self.cluster_shape()
        )
        return plan_job(spec, cluster=shape)

    def cluster_shape(self) -> dict:
        """Nodes, per-node CPUs, GPUs (and their model) and host memory of the connected
        cluster, as a plan's ``cluster`` (empty if it cannot be reached)."""
        try:
            nodes = self.backend.cluster().nodes
        except BackendUnavailable:
            return {}
        return cluster_from_nodes(nodes)

    def cluster(self) -> ClusterInfo:
        """Nodes and resources of the connected cluster."""
        return self.backend.cluster()
