"""Settings of every Ray head etrain starts: the embedded local head and KubeRay's."""

from __future__ import annotations

# GCS settings: declare a node dead after 3 failed health checks 0.5 s apart (Ray's
# default: 5 checks 3 s apart, 15 s), so an elastic job that lost a node restarts at
# the smaller size without first waiting out a worker-group start on the dead node's
# stale resources. A slow (not dead) node still has each check's full timeout to
# answer. bench/recovery.py measures it.
FAST_NODE_FAILURE_ENV = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
