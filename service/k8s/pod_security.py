"""How Ray pods are locked down, and what each job's pods may see.

Every Ray container (head, workers, the autoscaler sidecar) runs as the image's
``ray`` user with the runtime's default seccomp profile, no capabilities, no
privilege escalation and a read-only root file system. Ray writes its session
directory (``/tmp/ray``: sockets, logs, spilled objects, runtime environments)
and temp files under ``/tmp``, and pip / torch / triton write caches under
``~/.cache``; both are emptyDir volumes, so nothing else in the image can be
changed by a job. The checkpoint claim is mounted whole on a shared cluster and
as one tenant's folder (``subPath``) on a per-job cluster. A per-job cluster's
storage credentials come from its tenant's Secret only (:func:`tenant_storage_env`).
"""

from __future__ import annotations

import re

from workers.spec import JobSpec
from workers.storage.credentials import AWS_ENV
from workers.storage.location import (
    job_credential_env_names,
    job_store_env_names,
    job_tracking_env_names,
)

CHECKPOINT_MOUNT = "/var/lib/etrain/checkpoints"
RAY_UID, RAY_GID = 1000, 100  # the `ray` user of the rayproject/ray images
# Writable emptyDirs on a read-only root file system: name -> mount path.
RAY_WRITABLE_DIRS = {"tmp": "/tmp", "cache": "/home/ray/.cache"}
WRITABLE_SIZE_LIMIT = "32Gi"  # /tmp/ray holds spilled objects and runtime environments
DEFAULT_STORAGE_SECRET_PREFIX = "etrain-storage"
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FOLDER = re.compile(r"[a-z0-9][-a-z0-9_.]*")


def pod_security(uid: int, gid: int) -> dict:
    """Pod-level securityContext: a fixed non-root user and the default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "fsGroup": gid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict:
    """Container-level securityContext of every Ray container."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def writable_volumes() -> list[dict]:
    """The emptyDir volumes behind :func:`writable_mounts`."""
    return [
        {"name": name, "emptyDir": {"sizeLimit": WRITABLE_SIZE_LIMIT}} for name in RAY_WRITABLE_DIRS
    ]


def writable_mounts() -> list[dict]:
    """Mounts of the folders Ray writes to, on a read-only root file system."""
    return [{"name": name, "mountPath": path} for name, path in RAY_WRITABLE_DIRS.items()]


def checkpoint_mount(subpath: str | None) -> dict:
    """The checkpoint claim: whole at CHECKPOINT_MOUNT, or one folder of it at
    CHECKPOINT_MOUNT/<subpath> (the same path as on the control plane)."""
    if subpath is None:
        return {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}
    if not _FOLDER.fullmatch(subpath) or subpath in (".", ".."):
        raise ValueError(f"checkpoint subPath must be one folder name, got {subpath!r}")
    return {"name": "checkpoints", "mountPath": f"{CHECKPOINT_MOUNT}/{subpath}", "subPath": subpath}


def tenant_storage_secret(tenant: str, *, prefix: str = DEFAULT_STORAGE_SECRET_PREFIX) -> str:
    """The name of ``tenant``'s storage Secret: ``<prefix>-<tenant>``."""
    name = f"{prefix}-{tenant}"
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"tenant {tenant!r} gives no valid Secret name ({name!r} is not a DNS-1123 "
            "subdomain); use tenant names of lowercase letters, digits and inner '-'"
        )
    return name


def storage_env_names(spec: JobSpec) -> tuple[str, ...]:
    """The credential variables a job's stores read (names only): those of every store
    its spec names (checkpoint.storage, model.hf, model.tokenizer, data.path,
    data.eval.path; :func:`~workers.storage.location.job_store_uris`).

    ``s3://``: ``ETRAIN_SECRET_<NAME>_*`` of ``stores.s3.credentials_secret``,
    else ``AWS_*``. ``file://`` and ``gs://`` (Google's chain, e.g. Workload
    Identity) read none. Then the experiment trackers' secrets' variables.
    """
    return job_credential_env_names(spec)


def tenant_storage_env(
    tenant: str,
    spec: JobSpec,
    *,
    prefix: str = DEFAULT_STORAGE_SECRET_PREFIX,
) -> tuple[dict, ...]:
    """Container env entries that read the job's credentials from its tenant's Secret.

    One ``secretKeyRef`` per variable the job's storage reads, each key named
    like the variable. A named ``credentials_secret``'s key pair is required (a
    missing key keeps the pod from starting, with the key's name in its events);
    the ``AWS_*`` keys and every session token are optional, so a tenant without
    them falls back to the default AWS chain (e.g. the pods' service account role).
    Experiment trackers' keys (``metrics.mlflow`` / ``metrics.wandb``
    ``credentials_secret``) follow, all optional: without them the job runs untracked.
    """
    stores, trackers = job_store_env_names(spec), job_tracking_env_names(spec)
    if not stores and not trackers:
        return ()
    secret = tenant_storage_secret(tenant, prefix=prefix)
    named = stores != AWS_ENV
    optional = [i == 2 or not named for i in range(len(stores))] + [True] * len(trackers)
    return tuple(
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": name, "optional": opt}},
        }
        for name, opt in zip((*stores, *trackers), optional, strict=True)
    )
