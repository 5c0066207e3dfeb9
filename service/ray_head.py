"""Settings of every Ray head etrain starts: the embedded local head and KubeRay's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# GCS settings: declare a node dead after 3 failed health checks 0.5 s apart (Ray's
# default: 5 checks 3 s apart, 15 s), so an elastic job that lost a node restarts at
# the smaller size without first waiting out a worker-group start on the dead node's
# stale resources. A slow (not dead) node still has each check's full timeout to
# answer. bench/recovery.py measures it.
FAST_NODE_FAILURE_ENV = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}

# What the head (and so every job's driver and workers) inherits from this process: the
# names below and those starting with a prefix below; nothing else. Not the admin token,
# not the AWS_* / GOOGLE_* keys, not any ETRAIN_* (ETRAIN_SECRET_<NAME>_* are tenants'
# keys): a job gets its own tenant's storage variables in its runtime env instead.
HEAD_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_HOME",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        # Storage switches that hold no secret (workers.storage.location).
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
        "STORAGE_EMULATOR_HOST",
    }
)
HEAD_ENV_PREFIXES = ("LC_", "RAY_", "NCCL_", "GLOO_", "NVIDIA_")


def head_env(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The allow-listed part of ``environ`` (plus the names in ``extra``) a Ray head gets."""
    allowed = HEAD_ENV_NAMES | set(extra)
    return {k: v for k, v in environ.items() if k in allowed or k.startswith(HEAD_ENV_PREFIXES)}


# A node label: the memory of each of the node's GPUs in GB, where Ray cannot read the GPUs
# (``etrain node join --gpu-memory-gb``); the planner places ranks by it (mixed GPU sizes).
GPU_MEMORY_LABEL = "etrain.io/gpu-memory-gb"
