"""GCS fault tolerance of a RayCluster: the Redis its GCS keeps its state in."""

from __future__ import annotations

from dataclasses import dataclass

# GCS fault tolerance: the GCS keeps its tables in this Redis, so a head pod that restarts
# finds its nodes, actors and jobs again and the worker pods live on (deploy/base/redis.yaml,
# the chart's ray.gcsFaultTolerance). The password comes from key ``password`` of a Secret.
DEFAULT_GCS_REDIS = "etrain-redis:6379"
DEFAULT_REDIS_SECRET = "etrain-redis"


@dataclass(frozen=True)
class GcsRedis:
    """The Redis a RayCluster's GCS keeps its state in (KubeRay ``gcsFaultToleranceOptions``)."""

    address: str = DEFAULT_GCS_REDIS  # host:port (or redis:// / rediss:// URL)
    password_secret: str | None = DEFAULT_REDIS_SECRET  # Secret with key ``password``; None: none

    def options(self) -> dict:
        """The ``spec.gcsFaultToleranceOptions`` object."""
        options: dict = {"redisAddress": self.address}
        if self.password_secret:
            ref = {"name": self.password_secret, "key": "password"}
            options["redisPassword"] = {"valueFrom": {"secretKeyRef": ref}}
        return options
