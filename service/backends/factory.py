"""Pick the backend from settings: an existing Ray cluster, or an embedded local head."""

from __future__ import annotations

import logging
import sys

from service.backends.base import Backend
from service.backends.embedded import EmbeddedRay, ensure_ray_token
from service.backends.node_join import join_hint
from service.backends.ray_jobs import RayJobBackend
from service.backends.ray_ports import RayPorts, joinable
from service.settings.slices import (
    EmbeddedRaySettings,
    KubeRaySettings,
    RaySettings,
    StandbySettings,
)

log = logging.getLogger(__name__)


def build_backend(ray: RaySettings) -> tuple[Backend, EmbeddedRay | None]:
    """The backend to use, and the embedded head to stop on shutdown (if one was started)."""
    if ray.backend == "kuberay":
        return build_kuberay_backend(ray.kuberay), None
    if ray.address:
        # An existing cluster brings its own token (RAY_AUTH_TOKEN / ~/.ray/auth_token).
        backend = RayJobBackend(ray.address, python=ray.worker_python or "python")
        return with_standby(backend, ray.standby), None
    token_file = ensure_ray_token(ray.embedded.data_dir)
    embedded = EmbeddedRay(
        data_dir=ray.embedded.data_dir,
        num_cpus=ray.embedded.num_cpus,
        ports=embedded_ports(ray.embedded),
        extra_env=list(ray.embedded.extra_env),
        node_ip=ray.embedded.node_ip,
    )
    address = embedded.start()
    log.info("%s", join_hint(embedded.gcs_address, token_file))
    backend = RayJobBackend(
        address, python=ray.worker_python or sys.executable, probe_agent=True, head=embedded
    )
    return with_standby(backend, ray.standby), embedded


def with_standby(backend: RayJobBackend, standby: StandbySettings) -> RayJobBackend:
    """``backend`` keeping ``standby.drivers`` warm drivers (none when it is 0)."""
    if standby.drivers > 0:
        backend.use_standby(
            count=standby.drivers,
            workers=standby.workers,
            report_url=standby.report_url,
            budget=standby.budget,
        )
    return backend


def embedded_ports(embedded: EmbeddedRaySettings) -> RayPorts:
    """The embedded head's ports from the ``ETRAIN_RAY_*_PORT`` settings: 0 = a free one,
    or, on a head other machines join (``ETRAIN_RAY_NODE_IP``), its join port."""
    ports = RayPorts(**embedded.ports)
    return joinable(ports) if embedded.node_ip else ports


def build_kuberay_backend(kuberay: KubeRaySettings) -> Backend:
    """A KubeRayBackend from the ``ETRAIN_K8S_*`` / ``ETRAIN_RAYCLUSTER_NAME`` settings."""
    # Imported here: the kubernetes client is only needed in this mode.
    from service.backends.kuberay import KubeRayBackend
    from service.k8s.manifests import RayClusterConfig, WorkerGroupConfig

    template = RayClusterConfig(
        namespace=kuberay.namespace,
        image=kuberay.worker_image,
        checkpoint_claim=kuberay.checkpoint_claim,
        auth_secret=kuberay.ray_auth_secret or None,
        worker_groups=(WorkerGroupConfig(gpu_type=kuberay.gpu_type),),
    )
    return KubeRayBackend(
        namespace=kuberay.namespace,
        cluster_name=kuberay.cluster_name,
        cluster_template=template,
        dashboard_url=kuberay.dashboard_url,
        ttl_seconds_after_finished=kuberay.job_ttl_s,
        active_deadline_seconds=kuberay.active_deadline_s,
        quota={"CPU": kuberay.max_cpus, "GPU": kuberay.max_gpus},
    )
