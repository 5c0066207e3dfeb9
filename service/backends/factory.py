"""Pick the backend from settings: an existing Ray cluster, or an embedded local head."""

from __future__ import annotations

import sys

from service.backends.base import Backend
from service.backends.embedded import EmbeddedRay, ensure_ray_token
from service.backends.ray_jobs import RayJobBackend
from service.settings import Settings


def build_backend(settings: Settings) -> tuple[Backend, EmbeddedRay | None]:
    """The backend to use, and the embedded head to stop on shutdown (if one was started)."""
    if settings.backend == "kuberay":
        return build_kuberay_backend(settings), None
    if settings.ray_address:
        # An existing cluster brings its own token (RAY_AUTH_TOKEN / ~/.ray/auth_token).
        return RayJobBackend(settings.ray_address, python=settings.worker_python or "python"), None
    ensure_ray_token(settings.data_path)
    embedded = EmbeddedRay(
        data_dir=settings.data_path,
        num_cpus=settings.ray_num_cpus,
        dashboard_port=settings.ray_dashboard_port,
        gcs_port=settings.ray_gcs_port,
    )
    address = embedded.start()
    return RayJobBackend(address, python=settings.worker_python or sys.executable), embedded


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
