"""Pick the backend from settings: an existing Ray cluster, or an embedded local head."""

from __future__ import annotations

import sys

from service.backends.base import Backend
from service.backends.embedded import EmbeddedRay, ensure_ray_token
from service.backends.ray_jobs import RayJobBackend
from service.settings import Settings


def build_backend(settings: Settings) -> tuple[Backend, EmbeddedRay | None]:
    """The backend to use, and the embedded head to stop on shutdown (if one was started)."""
    if settings.ray_address:
        # An existing cluster brings its own token (RAY_AUTH_TOKEN / ~/.ray/auth_token).
        return RayJobBackend(settings.ray_address,
                             python=settings.worker_python or "python"), None
    ensure_ray_token(settings.data_path)
    embedded = EmbeddedRay(data_dir=settings.data_path, num_cpus=settings.ray_num_cpus,
                           dashboard_port=settings.ray_dashboard_port,
                           gcs_port=settings.ray_gcs_port)
    address = embedded.start()
    return RayJobBackend(address, python=settings.worker_python or sys.executable), embedded
