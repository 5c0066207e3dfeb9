"""Service settings from ``ETRAIN_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.settings import generation_docs as gen
from service.settings import policy_docs, slices
from service.settings import warm_pool_docs as docs
from service.settings.slices import RAY_PORTS, TenantQuota


def _port(what: str):
    """An ``ETRAIN_RAY_*_PORT`` field: 0 = a free port, or with ETRAIN_RAY_NODE_IP the
    documented join port (service/backends/ray_ports.py JOIN_PORTS)."""
    return Field(0, ge=0, le=65535, description=f"{what}; 0 = {docs.PORT_ZERO}.")


class Settings(BaseSettings):
    """Control-plane settings: the one reader of the flat ``ETRAIN_*`` environment. Its
    properties (``policy``, ``quotas``, ``ray``, ...) cut it into the slices of
    :mod:`service.settings.slices` that each service takes. Job specs are separate
    (``workers.spec``)."""

    model_config = SettingsConfigDict(env_prefix="ETRAIN_", extra="ignore")

    env: Literal["development", "production"] = Field(
        "development", description="production refuses unsafe defaults."
    )
    data_dir: Path = Field(Path("~/.etrain"), description="SQLite file, checkpoints, tokens.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite under data_dir."
    )
    ray_address: str | None = Field(
        None,
        description="Ray job API (dashboard) URL, e.g. http://head:8265; "
        "unset = start an embedded local Ray head.",
    )
    admin_token: SecretStr | None = Field(
        None, description="First admin API token; generated under data_dir when unset."
    )
    host: str = Field("127.0.0.1", description="Bind address of the API.")
    port: int = Field(8000, description="Port of the API.")
    public_url: str | None = Field(
        None,
        description="URL at which Ray workers reach this API (telemetry); "
        "default http://127.0.0.1:<port>.",
    )
    worker_python: str | None = Field(
        None,
        description="Python on the cluster for the job driver; default: this "
        "interpreter for the embedded Ray, 'python' for an external cluster.",
    )
    ray_num_cpus: int | None = Field(None, description="CPUs of the embedded Ray head.")
    ray_node_ip: str | None = Field(None, description=docs.RAY_NODE_IP)
    ray_dashboard_port: int = _port("Embedded Ray dashboard (job API) port")
    ray_gcs_port: int = _port("Embedded Ray GCS port")
    ray_client_server_port: int = _port("Embedded Ray client server port")
    ray_dashboard_agent_port: int = _port("Embedded Ray dashboard agent HTTP port")
    ray_dashboard_agent_grpc_port: int = _port("Embedded Ray dashboard agent gRPC port")
    ray_metrics_export_port: int = _port("Embedded Ray Prometheus metrics port")
    ray_runtime_env_agent_port: int = _port("Embedded Ray runtime-env agent port")
    ray_node_manager_port: int = _port("Embedded Ray node manager port")
    ray_object_manager_port: int = _port("Embedded Ray object manager port")
    ray_min_worker_port: int = _port("Lowest port of embedded Ray workers")
    ray_max_worker_port: int = _port("Highest port of embedded Ray workers")
    ray_dashboard_metrics_port: int = _port("Embedded Ray dashboard's Prometheus port")
    ray_autoscaler_metrics_port: int = _port("Embedded Ray autoscaler's Prometheus port")
    ray_head_env: str = Field(
        "",
        description="Comma-separated names of more variables the embedded Ray head (and so "
        "every job) inherits from the service, beyond its allow-list (PATH, HOME, LANG, LC_*, "
        "RAY_*, PYTHONPATH, ...); never ETRAIN_*, AWS_* or GOOGLE_* unless named here.",
    )
    tensorboard_default: bool = Field(
        False,
        description="metrics.tensorboard for jobs whose spec leaves it unset: write "
        "TensorBoard event files under the job's checkpoint storage.",
    )
    reconcile_interval_s: float = Field(1.0, gt=0, description="Reconciler poll period.")
    leader_lease_s: float = Field(10.0, ge=1, le=300, description=policy_docs.LEADER_LEASE)
    standby_drivers: int = Field(1, ge=0, le=8, description=docs.STANDBY_DRIVERS)
    standby_workers: int = Field(2, ge=0, le=64, description=docs.STANDBY_WORKERS)
    warm_pool_processes: int | None = Field(None, ge=0, le=4096, description=docs.POOL_PROCESSES)
    warm_pool_memory_bytes: int | None = Field(None, ge=0, description=docs.POOL_MEMORY)
    warm_pool_idle_s: float = Field(900.0, gt=0, description=docs.POOL_IDLE)
    submit_retry_s: float = Field(
        300,
        gt=0,
        description="How long a job whose submission the cluster turns away for now (Ray job "
        "API 5xx, no agent, unreachable) goes back to the queue and is tried again, with "
        "backoff from 1 s to 30 s, before it fails; a refusal (4xx) fails it at once.",
    )
    backend: Literal["ray-jobs", "kuberay"] = Field(
        "ray-jobs",
        description="ray-jobs: Ray's job API (embedded head, or ETRAIN_RAY_ADDRESS, "
        "e.g. a KubeRay head service); kuberay: one ray.io/v1 RayJob per submission.",
    )
    k8s_namespace: str = Field("etrain", description="Namespace of the RayJobs (kuberay).")
    raycluster_name: str | None = Field(
        None,
        description="Run RayJobs on this existing RayCluster (clusterSelector); unset = "
        "a RayCluster per job, sized from its resources (kuberay).",
    )
    ray_dashboard_url: str | None = Field(
        None,
        description="Ray dashboard URL for job links, e.g. http://localhost:8265 behind "
        "kubectl port-forward (kuberay; default: the head service).",
    )
    k8s_worker_image: str = Field(
        "etrain/worker:0.1.0", description="Ray image of per-job clusters (kuberay)."
    )
    k8s_checkpoint_claim: str | None = Field(
        "etrain-checkpoints",
        description="RWX PVC mounted at /var/lib/etrain/checkpoints on per-job Ray pods (kuberay).",
    )
    k8s_gpu_type: str | None = Field(
        None, description="nvidia.com/gpu.product node label for per-job GPU pods (kuberay)."
    )
    k8s_job_ttl_s: int = Field(
        3600, ge=0, description="Seconds a per-job cluster is kept after its job ends (kuberay)."
    )
    k8s_active_deadline_s: int | None = Field(
        None, gt=0, description="RayJob activeDeadlineSeconds; unset = no deadline (kuberay)."
    )
    k8s_ray_auth_secret: str | None = Field(
        "etrain-ray-token",
        description="Existing Secret (key auth_token) with the Ray token of "
        "per-job clusters (authOptions); '' = no token auth (kuberay).",
    )
    k8s_max_gpus: float = Field(8, ge=0, description="GPUs one per-job cluster may use (kuberay).")
    k8s_max_cpus: float = Field(64, gt=0, description="CPUs one per-job cluster may use (kuberay).")
    # -- per-tenant quotas and the scheduler (service/domain/scheduler.py) --
    max_queued_jobs_per_tenant: int = Field(
        100,
        ge=0,
        description="Jobs one tenant may have QUEUED; one more is a 429 "
        "(per tenant: ETRAIN_TENANT_QUOTAS).",
    )
    max_running_workers_per_tenant: int | None = Field(
        None,
        ge=1,
        description="Workers (at each job's minimum) one tenant's admitted jobs may hold; "
        "unset = no limit (per tenant: ETRAIN_TENANT_QUOTAS).",
    )
    max_running_gpus_per_tenant: float | None = Field(
        None,
        ge=0,
        description="GPUs (at each job's minimum) one tenant's admitted jobs may hold; "
        "unset = no limit (per tenant: ETRAIN_TENANT_QUOTAS).",
    )
    tenant_quotas: dict[str, TenantQuota] = Field(
        default_factory=dict,
        description='Per-tenant overrides by tenant name, as JSON, e.g. {"team-a": '
        '{"max_queued_jobs": 500, "max_running_gpus": 16, "weight": 2}}; unset fields '
        "take the ETRAIN_MAX_* defaults.",
    )
    scheduler_reserve_after_s: float | None = Field(
        300.0,
        ge=0,
        description="A queued job that waited this long (the longest-waiting one) reserves "
        "the room it needs: smaller jobs stop going around it; unset = never.",
    )
    max_body_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest request body the API reads; a larger one is a 413 before "
        "it is read or authenticated.",
    )
    metrics_job_labels: bool = Field(
        False,
        description="Serve per-job series (labelled job_id) on /metrics to any scraper; "
        "off = only to a scrape with an admin token (Authorization: Bearer).",
    )
    # -- what a job spec may touch (service/domain/access_policy.py, docs/job-spec.md) --
    policy_checkpoint_root: Path | None = Field(
        None,
        description="Tenant T's file:// checkpoint.storage must lie in <this>/T (its "
        "default storage); unset = <data_dir>/checkpoints.",
    )
    policy_data_root: Path | None = Field(
        None,
        description="Tenant T's data.path and data.eval.path must lie in <this>/T (or a shared "
        "data root); "
        "unset = <data_dir>/tenants.",
    )
    policy_shared_data_roots: list[Path] = Field(
        default_factory=list,
        description="Folders every tenant's data.path and data.eval.path may read, as JSON, "
        'e.g. ["/datasets"].',
    )
    policy_admin_roots: list[Path] = Field(
        default_factory=lambda: [Path("/")],
        description="Where admin tokens may name file:// storage, data.path and "
        'data.eval.path, as JSON (default ["/"]); the '
        "service's data dir, other tenants' areas and /etc, /proc, /sys, /dev, /boot, /root "
        "and /run stay refused.",
    )
    policy_object_stores: dict[str, list[str]] = Field(
        default_factory=dict, description=policy_docs.OBJECT_STORES
    )
    policy_endpoints: dict[str, list[str]] = Field(
        default_factory=dict, description=policy_docs.ENDPOINTS
    )
    policy_tracking_uris: dict[str, list[str]] = Field(
        default_factory=dict, description=policy_docs.TRACKING_URIS
    )
    policy_secrets: dict[str, list[str]] = Field(
        default_factory=dict, description=policy_docs.SECRETS
    )
    policy_ambient_credentials: list[str] = Field(
        default_factory=list,
        description="Tenants whose s3:// jobs may run without credentials_secret, with the "
        "service's own AWS_* keys, as JSON; unset = none.",
    )
    policy_nvme_root: Path | None = Field(None, description=policy_docs.NVME_ROOT)
    policy_admin_any_store: bool = Field(
        True,
        description="Admin tokens may name any bucket, endpoint and credentials secret and use "
        "the service's own keys.",
    )
    probe_timeout_s: float = Field(
        5.0,
        gt=0,
        le=120,
        description="Connect and read timeout of the object-store probe at submit and plan; "
        "a store that does not answer in time is a 422.",
    )
    probe_workers: int = Field(
        8, ge=1, le=256, description="Object-store probes in flight at once (their own threads)."
    )
    probe_per_tenant: int = Field(
        2,
        ge=1,
        le=256,
        description="Probes one tenant may have in flight; one more is a 429.",
    )
    generate_enabled: bool = Field(True, description=gen.GENERATE_ENABLED)
    generate_max_new_tokens: int = Field(256, ge=1, le=65536, description=gen.GENERATE_TOKENS)
    generate_timeout_s: float = Field(120.0, ge=5, le=3600, description=gen.GENERATE_TIMEOUT)
    generate_concurrency: int = Field(1, ge=1, le=64, description=gen.GENERATE_CONCURRENCY)

    @model_validator(mode="after")
    def _safe_outside_development(self) -> Settings:
        if self.env == "production" and self.admin_token is None:
            raise ValueError("ETRAIN_ADMIN_TOKEN must be set when ETRAIN_ENV=production")
        if self.env == "production" and not self.db_url.startswith("postgresql"):
            # db_url, not database_url: unset means the SQLite default, refused just the same.
            raise ValueError(
                "ETRAIN_DATABASE_URL must point at PostgreSQL (postgresql+psycopg://...) "
                "when ETRAIN_ENV=production; SQLite (the default when it is unset) is for "
                "development"
            )
        return self

    @property
    def data_path(self) -> Path:
        """``data_dir`` with ``~`` expanded."""
        return self.data_dir.expanduser()

    @property
    def db_url(self) -> str:
        """The database URL in force."""
        return self.database_url or f"sqlite:///{self.data_path / 'etrain.db'}"

    @property
    def report_url(self) -> str:
        """Where workers send telemetry."""
        if self.public_url:
            return self.public_url.rstrip("/")
        # Listening everywhere: the address the head's other nodes reach, else loopback.
        if self.host in ("0.0.0.0", "::"):
            return f"http://{self.ray_node_ip or '127.0.0.1'}:{self.port}"
        return f"http://{self.host}:{self.port}"

    # -- the slices each service takes (service.settings.slices) --

    @property
    def policy(self) -> slices.PolicySettings:
        """The access policy's slice (``ETRAIN_POLICY_*``)."""
        return slices.PolicySettings(
            data_dir=self.data_path,
            checkpoint_root=self.policy_checkpoint_root,
            data_root=self.policy_data_root,
            shared_data_roots=tuple(self.policy_shared_data_roots),
            admin_roots=tuple(self.policy_admin_roots),
            object_stores=self.policy_object_stores,
            endpoints=self.policy_endpoints,
            tracking_uris=self.policy_tracking_uris,
            secrets=self.policy_secrets,
            ambient_credentials=tuple(self.policy_ambient_credentials),
            admin_any_store=self.policy_admin_any_store,
            nvme_root=self.policy_nvme_root,
        )

    @property
    def quotas(self) -> slices.QuotaSettings:
        """The scheduler's slice: per-tenant quotas, weights and the reservation."""
        return slices.QuotaSettings(
            max_queued_jobs=self.max_queued_jobs_per_tenant,
            max_running_workers=self.max_running_workers_per_tenant,
            max_running_gpus=self.max_running_gpus_per_tenant,
            tenant_quotas=self.tenant_quotas,
            reserve_after_s=self.scheduler_reserve_after_s,
        )

    @property
    def submission(self) -> slices.SubmissionSettings:
        """The submission service's slice."""
        probes = slices.ProbeSettings(
            self.probe_timeout_s, self.probe_workers, self.probe_per_tenant
        )
        return slices.SubmissionSettings(self.policy, self.quotas, probes, self.tensorboard_default)

    @property
    def reconciler(self) -> slices.ReconcilerSettings:
        """The reconciler's slice."""
        return slices.ReconcilerSettings(
            policy=self.policy,
            quotas=self.quotas,
            interval_s=self.reconcile_interval_s,
            submit_retry_s=self.submit_retry_s,
            report_url=self.report_url,
            storage_keys_in_env=self.backend != "kuberay",
        )

    @property
    def ray(self) -> slices.RaySettings:
        """Where jobs run: the backend factory's slice."""
        embedded = slices.EmbeddedRaySettings(
            data_dir=self.data_path,
            num_cpus=self.ray_num_cpus,
            ports={name: getattr(self, field) for name, field in RAY_PORTS.items()},
            extra_env=tuple(n.strip() for n in self.ray_head_env.split(",") if n.strip()),
            node_ip=self.ray_node_ip,
        )
        standby = slices.StandbySettings(
            self.standby_drivers,
            self.standby_workers,
            self.report_url,
            slices.WarmBudget(
                self.warm_pool_processes, self.warm_pool_memory_bytes, self.warm_pool_idle_s
            ),
        )
        return slices.RaySettings(
            self.backend, self.ray_address, self.worker_python, embedded, self.kuberay, standby
        )

    @property
    def kuberay(self) -> slices.KubeRaySettings:
        """The KubeRay backend's slice."""
        return slices.KubeRaySettings(
            namespace=self.k8s_namespace,
            cluster_name=self.raycluster_name,
            dashboard_url=self.ray_dashboard_url,
            worker_image=self.k8s_worker_image,
            checkpoint_claim=self.k8s_checkpoint_claim,
            gpu_type=self.k8s_gpu_type,
            job_ttl_s=self.k8s_job_ttl_s,
            active_deadline_s=self.k8s_active_deadline_s,
            ray_auth_secret=self.k8s_ray_auth_secret,
            max_cpus=self.k8s_max_cpus,
            max_gpus=self.k8s_max_gpus,
        )

    @property
    def generation(self) -> slices.GenerationSettings:
        """POST /v1/jobs/{id}/generate's slice (``ETRAIN_GENERATE_*``) and the policy's."""
        g = (self.generate_enabled, self.generate_max_new_tokens, self.generate_timeout_s)
        return slices.GenerationSettings(*g, self.generate_concurrency, self.policy)

    @property
    def api(self) -> slices.ApiSettings:
        """The HTTP layer's slice."""
        return slices.ApiSettings(self.max_body_bytes, self.metrics_job_labels)
