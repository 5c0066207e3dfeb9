"""Pick the backend from settings: an existing Ray cluster, or an embedded local head."""

from __future__ import annotations

import sys

from service.backends.base import Backend
from service.backends.embedded import EmbeddedRay, RayPorts, ensure_ray_token
from service.backends.ray_jobs import RayJobBackend
from service.settings import Settings


def build_backend(settings: Settings) -> tuple[Backend, EmbeddedRay | None]:
    """The backend to use, and the embedded head to stop on shutdown (if one was started)."""
    if settings.backend == "kuberay":
        return build_kuberay_backend(settings), None
    if settings.ray_address:
        # An existing cluster brings its own token (RAY_AUTH_TOKEN / ~/.ray/auth_token).
        backend = RayJobBackend(settings.ray_address, python=settings.worker_python or "python")
        return with_standby(backend, settings), None
    ensure_ray_token(settings.data_path)
    embedded = EmbeddedRay(
        data_dir=settings.data_path,
        num_cpus=settings.ray_num_cpus,
        ports=embedded_ports(settings),
        extra_env=[n.strip() for n in settings.ray_head_env.split(",") if n.strip()],
    )
    address = embedded.start()
    backend = RayJobBackend(
        address, python=settings.worker_python or sys.executable, probe_agent=True
    )
    return with_standby(backend, settings), embedded


def with_standby(backend: RayJobBackend, settings: Settings) -> RayJobBackend:
    """``backend`` keeping ``standby_drivers`` warm drivers (none when it is 0)."""
    if settings.standby_drivers > 0:
        backend.use_standby(
            count=settings.standby_drivers,
            workers=settings.standby_workers,
            report_url=settings.report_url,
        )
    return backend


def embedded_ports(settings: Settings) -> RayPorts:
    """The embedded head's ports from the ``ETRAIN_RAY_*_PORT`` settings (0 = a free one)."""
    return RayPorts(
        gcs=settings.ray_gcs_port,
        dashboard=settings.ray_dashboard_port,
        client_server=settings.ray_client_server_port,
        dashboard_agent_http=settings.ray_dashboard_agent_port,
        dashboard_agent_grpc=settings.ray_dashboard_agent_grpc_port,
        metrics_export=settings.ray_metrics_export_port,
        runtime_env_agent=settings.ray_runtime_env_agent_port,
        node_manager=settings.ray_node_manager_port,
        object_manager=settings.ray_object_manager_port,
        min_worker=settings.ray_min_worker_port,
        max_worker=settings.ray_max_worker_port,
        dashboard_metrics=settings.ray_dashboard_metrics_port,
        autoscaler_metrics=settings.ray_autoscaler_metrics_port,
    )


def build_kuberay_backend(settings: Settings) -> Backend:
    """A KubeRayBackend from the ``ETRAIN_K8S_*`` / ``ETRAIN_RAYCLUSTER_NAME`` settings."""
    # Imported here: the kubernetes client is only needed in this mode.
    from service.backends.kuberay import KubeRayBackend
    from service.k8s.manifests import RayClusterConfig, WorkerGroupConfig

    template = RayClusterConfig(
        namespace=settings.k8s_namespace,
        image=settings.k8s_worker_image,
        checkpoint_claim=settings.k8s_checkpoint_claim,
        auth_secret=settings.k8s_ray_auth_secret or None,
        worker_groups=(WorkerGroupConfig(gpu_type=settings.k8s_gpu_type),),
    )
    return KubeRayBackend(
        namespace=settings.k8s_namespace,
        cluster_name=settings.raycluster_name,
        cluster_template=template,
        dashboard_url=settings.ray_dashboard_url,
        ttl_seconds_after_finished=settings.k8s_job_ttl_s,
        active_deadline_seconds=settings.k8s_active_deadline_s,
        quota={"CPU": settings.k8s_max_cpus, "GPU": settings.k8s_max_gpus},
    )
