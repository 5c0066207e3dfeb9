"""The parts of the settings each service reads, as small typed values.

:class:`service.settings.Settings` stays the one reader of the flat ``ETRAIN_*``
environment (the names operators set, in ``docs/settings.md``); its properties cut it
into these slices, and the composition root (``service/api/app.py``) hands each service
only its own. So a constructor says which settings a service depends on, and a test
builds a service from ``Settings(...).<slice>`` without wiring the rest. The slices carry
no defaults of their own: every default is the ``Settings`` field's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The embedded head's ports: ``backends.embedded.RayPorts`` field -> the Settings field
# (``ETRAIN_<FIELD>``) that pins it.
RAY_PORTS = {
    "gcs": "ray_gcs_port",
    "dashboard": "ray_dashboard_port",
    "client_server": "ray_client_server_port",
    "dashboard_agent_http": "ray_dashboard_agent_port",
    "dashboard_agent_grpc": "ray_dashboard_agent_grpc_port",
    "metrics_export": "ray_metrics_export_port",
    "runtime_env_agent": "ray_runtime_env_agent_port",
    "node_manager": "ray_node_manager_port",
    "object_manager": "ray_object_manager_port",
    "min_worker": "ray_min_worker_port",
    "max_worker": "ray_max_worker_port",
    "dashboard_metrics": "ray_dashboard_metrics_port",
    "autoscaler_metrics": "ray_autoscaler_metrics_port",
}


class TenantQuota(BaseModel):
    """One tenant's quotas and fair-share weight (``ETRAIN_TENANT_QUOTAS``); unset = default."""

    model_config = ConfigDict(extra="forbid")

    max_queued_jobs: int | None = Field(None, ge=0, description="QUEUED jobs.")
    max_running_workers: int | None = Field(None, ge=1, description="Admitted workers.")
    max_running_gpus: float | None = Field(None, ge=0, description="Admitted GPUs.")
    weight: float = Field(1.0, gt=0, le=1000, description="Fair-share weight.")


@dataclass(frozen=True)
class PolicySettings:
    """What a job spec may touch (``ETRAIN_POLICY_*``): ``domain/access_policy.py``."""

    data_dir: Path  # the service's own (expanded): never a spec's; the default roots' parent
    checkpoint_root: Path | None  # None: <data_dir>/checkpoints
    data_root: Path | None  # None: <data_dir>/tenants
    shared_data_roots: tuple[Path, ...]
    admin_roots: tuple[Path, ...]
    object_stores: Mapping[str, list[str]]
    endpoints: Mapping[str, list[str]]
    secrets: Mapping[str, list[str]]
    ambient_credentials: tuple[str, ...]
    admin_any_store: bool
    tracking_uris: Mapping[str, list[str]]  # metrics.mlflow.tracking_uri
    nvme_root: Path | None = None  # DeepSpeed's NVMe offload swaps beneath <this>/<tenant>


@dataclass(frozen=True)
class QuotaSettings:
    """Per-tenant quotas and the scheduler's reservation: ``domain/scheduler.py``."""

    max_queued_jobs: int
    max_running_workers: int | None
    max_running_gpus: float | None
    tenant_quotas: Mapping[str, TenantQuota]
    reserve_after_s: float | None


@dataclass(frozen=True)
class ProbeSettings:
    """Bounds of the object-store probes at submit and plan: ``domain/storage_check.py``."""

    timeout_s: float
    workers: int
    per_tenant: int


@dataclass(frozen=True)
class SubmissionSettings:
    """What ``domain/submission.py`` reads: the policy, quotas, probes and spec defaults."""

    policy: PolicySettings
    quotas: QuotaSettings
    probes: ProbeSettings
    tensorboard_default: bool


@dataclass(frozen=True)
class ReconcilerSettings:
    """What ``domain/reconciler.py`` reads to admit, launch and follow jobs."""

    policy: PolicySettings  # each job's storage roots
    quotas: QuotaSettings  # admission
    interval_s: float
    submit_retry_s: float
    report_url: str  # where a job's workers send telemetry
    # A job's runtime env carries the service's object-store keys (not under KubeRay: a
    # RayJob's runtime env is stored in the cluster in plain text).
    storage_keys_in_env: bool


PROCESSES_PER_CPU, PROCESSES_BASE = 2, 2  # 6 on a 2-CPU node: driver, 3 run actors, 2 workers
MEMORY_SHARE = 0.20  # of the node's memory
FALLBACK_MEMORY = 2 * 1024**3  # when the node's memory is unknown


@dataclass(frozen=True)
class WarmBudget:
    """What the warm pool of standby drivers may hold (``service.backends.warm_policy``);
    None: sized to the node (:meth:`for_node`): ``PROCESSES_PER_CPU`` per CPU plus
    ``PROCESSES_BASE``, and ``MEMORY_SHARE`` of its memory."""

    processes: int | None = None
    memory_bytes: int | None = None
    idle_s: float = 900.0

    def for_node(self, cpus: float | None, memory_bytes: float | None) -> WarmBudget:
        """This budget with what is unset sized to a node of ``cpus`` and ``memory_bytes``."""
        processes = self.processes
        if processes is None:
            processes = PROCESSES_BASE + PROCESSES_PER_CPU * max(int(cpus or 1), 1)
        memory = self.memory_bytes
        if memory is None:
            memory = int(memory_bytes * MEMORY_SHARE) if memory_bytes else FALLBACK_MEMORY
        return WarmBudget(processes, memory, self.idle_s)


@dataclass(frozen=True)
class StandbySettings:
    """Standby drivers kept warm ahead of the next job (ray-jobs backend)."""

    drivers: int
    workers: int
    report_url: str
    budget: WarmBudget  # what they may hold, and after how long idle they stop


@dataclass(frozen=True)
class EmbeddedRaySettings:
    """The embedded local Ray head, started when no ``ETRAIN_RAY_ADDRESS`` is set."""

    data_dir: Path  # expanded; its Ray token and logs
    num_cpus: int | None
    ports: Mapping[str, int]  # by ``backends.embedded.RayPorts`` field; 0 = a free one
    extra_env: tuple[str, ...]  # more variables the head inherits (ETRAIN_RAY_HEAD_ENV)
    node_ip: str | None = None  # the address other machines join it at (ETRAIN_RAY_NODE_IP)


@dataclass(frozen=True)
class KubeRaySettings:
    """One RayJob per submission (``ETRAIN_K8S_*``, ``ETRAIN_RAYCLUSTER_NAME``)."""

    namespace: str
    cluster_name: str | None
    dashboard_url: str | None
    worker_image: str
    checkpoint_claim: str | None
    gpu_type: str | None
    job_ttl_s: int
    active_deadline_s: int | None
    ray_auth_secret: str | None  # None (or ''): no token auth
    max_cpus: float
    max_gpus: float


@dataclass(frozen=True)
class RaySettings:
    """Where jobs run: ``backends/factory.py`` builds the backend from this."""

    backend: Literal["ray-jobs", "kuberay"]
    address: str | None  # an existing cluster's job API; None: the embedded head
    worker_python: str | None
    embedded: EmbeddedRaySettings
    kuberay: KubeRaySettings
    standby: StandbySettings


@dataclass(frozen=True)
class ApiSettings:
    """What the HTTP layer reads: the body limit and who sees per-job series."""

    max_body_bytes: int
    metrics_job_labels: bool


@dataclass(frozen=True)
class GenerationSettings:
    """What ``domain/generation.py`` reads: whether it serves, its bounds, the policy's
    roots the generating process is confined to."""

    enabled: bool
    max_new_tokens: int
    timeout_s: float
    concurrency: int
    policy: PolicySettings
