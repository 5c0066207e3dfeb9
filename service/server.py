"""``etrain serve``: run the API with uvicorn (and an embedded Ray unless told otherwise)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.settings.slices import RaySettings


# Idle keep-alive connections are kept this long. A pooled client reuses an idle connection
# until its own expiry (httpx: 5 s, ingress-nginx's upstream pool: 60 s); a server that closes
# first races with the client's next request on it, which then gets a connection reset.
KEEP_ALIVE_S = 75


def describe_ray(ray: RaySettings) -> str:
    """Where jobs will run, as ``build_backend`` will decide it from ``ray``."""
    if ray.backend == "kuberay":
        name = ray.kuberay.cluster_name
        where = f"on RayCluster {name}" if name else "each on a RayCluster of its own"
        return f"KubeRay RayJobs in namespace {ray.kuberay.namespace}, {where}"
    if ray.address:
        return f"the Ray job API at {ray.address}"
    return "an embedded local Ray head (starting)"


def ray_token_line(ray: RaySettings) -> str | None:
    """Where the Ray dashboard's sign-in token is (never the token): the embedded head's
    token file (created now if missing, as the head would), or where an existing
    cluster's token comes from."""
    from service.domain.ray_dashboard import token_source

    if ray.backend != "kuberay" and not ray.address:
        from service.backends.embedded import ensure_ray_token

        ray.embedded.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the app does
        ensure_ray_token(ray.embedded.data_dir)
    where = token_source(ray)
    return f"etrain: Ray dashboard sign-in token in {where}" if where else None


def configure_logging() -> None:
    """The service's log: ``ETRAIN_LOG_LEVEL`` (INFO), without client libraries' chatter."""
    from workers.storage.location import quiet_storage_loggers
    from workers.telemetry.reporter import quiet_http_loggers

    logging.basicConfig(
        level=os.environ.get("ETRAIN_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    quiet_storage_loggers()  # even at DEBUG: botocore would log signed request headers
    quiet_http_loggers()  # not a line per cluster poll


def run_server(
    *,
    host: str | None = None,
    port: int | None = None,
    ray_address: str | None = None,
    data_dir: str | None = None,
) -> None:
    """Start the control plane in the foreground until interrupted."""
    import uvicorn

    from service.api.app import create_app
    from service.settings import Settings

    overrides = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "ray_address": ray_address,
            "data_dir": Path(data_dir) if data_dir else None,
        }.items()
        if v is not None
    }
    settings = Settings(**overrides)
    configure_logging()
    print(f"etrain: data dir {settings.data_path}; Ray: {describe_ray(settings.ray)}", flush=True)
    ray_token = ray_token_line(settings.ray)
    if ray_token:
        print(ray_token, flush=True)
    if settings.admin_token is None:
        print(
            f"etrain: admin token in {settings.data_path / 'admin_token'} "
            "(export ETRAIN_TOKEN=$(cat that file))",
            flush=True,
        )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=10,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
