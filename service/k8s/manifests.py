"""Build KubeRay objects (ray.io/v1 RayCluster and RayJob) as plain dicts.

One builder serves ``deploy/base/raycluster.yaml`` (generated with
``etrain manifests raycluster``), the CLI, the KubeRay backend and, through
tests that compare their output, the Helm chart's RayCluster template.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import yaml

from service.k8s.gcs_redis import GcsRedis
from service.k8s.operator_checks import MAX_RAYJOB_NAME
from service.k8s.pod_security import CHECKPOINT_MOUNT as CHECKPOINT_MOUNT  # the CLI's default
from service.k8s.pod_security import (
    RAY_GID,
    RAY_UID,
    checkpoint_mount,
    container_security,
    pod_security,
    writable_mounts,
    writable_volumes,
)
from service.ray_head import FAST_NODE_FAILURE_ENV
from workers.contract import RAY_VERSION, driver_command, launch_env

DEFAULT_WORKER_IMAGE = "etrain/worker:0.1.0"
ENTRYPOINT = driver_command("python")  # the image's python
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# Token auth (Ray >= 2.52, KubeRay >= 1.5.1): the operator reads the token from key
# auth_token of this Secret and sets RAY_AUTH_MODE / RAY_AUTH_TOKEN on every Ray container.
DEFAULT_RAY_AUTH_SECRET = "etrain-ray-token"
_DNS1035_BAD = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class WorkerGroupConfig:
    """One Ray worker group: identical pods the autoscaler adds and removes."""

    name: str = "gpu"
    min_replicas: int = 0
    max_replicas: int = 4
    gpus: int = 8  # per pod; 0 = a CPU group
    cpus: int = 32  # per pod: Ray's num-cpus and the pod's CPU request and limit
    memory: str = "256Gi"
    gpu_type: str | None = None  # value of the nvidia.com/gpu.product node label
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping, ...] = ()
    shm_size: str = "32Gi"


@dataclass(frozen=True)
class RayClusterConfig:
    """A RayCluster: a CPU head that runs no training, GPU worker groups, autoscaler v2."""

    name: str = "etrain"
    namespace: str = "etrain"
    image: str = DEFAULT_WORKER_IMAGE
    ray_version: str = RAY_VERSION
    head_cpus: int = 4
    head_memory: str = "16Gi"
    worker_groups: tuple[WorkerGroupConfig, ...] = (WorkerGroupConfig(),)
    idle_timeout_seconds: int = 60
    upscaling_mode: str = "Default"  # Default | Aggressive | Conservative
    checkpoint_claim: str | None = "etrain-checkpoints"  # RWX PVC on every Ray pod
    # Set for a per-job cluster: the pods mount only this folder of the claim (the job's
    # tenant's), at CHECKPOINT_MOUNT/<subpath>; unset: the whole claim at CHECKPOINT_MOUNT.
    checkpoint_subpath: str | None = None
    # Container env entries (secretKeyRef to one tenant's storage Secret) for every Ray
    # container; a shared cluster gets none, so no pod holds any tenant's keys.
    storage_env: tuple[Mapping, ...] = ()
    metrics_port: int = 8080
    auth_secret: str | None = DEFAULT_RAY_AUTH_SECRET  # Ray token Secret; None = no token auth
    # Set: the GCS keeps its state in this Redis and a head restart keeps the workers and
    # their jobs (the shared cluster of deploy/ and the chart); None: a per-job cluster.
    gcs_redis: GcsRedis | None = None


@dataclass(frozen=True)
class RayJobConfig:
    """A RayJob that runs one etrain submission's driver."""

    name: str
    namespace: str
    job_id: str
    submission_id: str
    env: Mapping[str, str]  # may hold secrets: never print or log it
    cluster_name: str | None = None  # set: clusterSelector; unset: embed ``cluster``
    cluster: RayClusterConfig | None = None
    ttl_seconds_after_finished: int = 3600
    active_deadline_seconds: int | None = None
    entrypoint: str = ENTRYPOINT


def _labels(component: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "etrain",
        "app.kubernetes.io/component": component,
        **(extra or {}),
    }


def _ray_container(
    cfg: RayClusterConfig, *, name: str, cpus: int, memory: str, gpus: int, ports: list[dict]
) -> dict:
    limits: dict = {"cpu": str(cpus), "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    container = {
        "name": name,
        "image": cfg.image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": str(cpus), "memory": memory}, "limits": limits},
        "ports": ports,
        "securityContext": container_security(),
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, *writable_mounts()],
    }
    if cfg.checkpoint_claim:
        container["volumeMounts"].append(checkpoint_mount(cfg.checkpoint_subpath))
    if cfg.storage_env:
        container["env"] = [dict(e) for e in cfg.storage_env]
    return container


def _pod_spec(
    cfg: RayClusterConfig,
    container: dict,
    *,
    shm_size: str,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Iterable[Mapping] = (),
) -> dict:
    volumes: list[dict] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
        *writable_volumes(),
    ]
    if cfg.checkpoint_claim:
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": cfg.checkpoint_claim}}
        )
    spec: dict = {
        "securityContext": pod_security(RAY_UID, RAY_GID),
        "containers": [container],
        "volumes": volumes,
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    tolerations = [dict(t) for t in tolerations]
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def _pod_metadata(cfg: RayClusterConfig, component: str) -> dict:
    # Annotation-based scraping: each Ray node exports metrics on metrics_port.
    return {
        "labels": _labels(component),
        "annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(cfg.metrics_port),
            "prometheus.io/path": "/metrics",
        },
    }


def build_head_group(cfg: RayClusterConfig) -> dict:
    """The head group: dashboard, GCS and the job drivers; ``num-cpus: "0"`` keeps training
    off it."""
    ports = [
        {"name": "gcs-server", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
        {"name": "metrics", "containerPort": cfg.metrics_port},
    ]
    container = _ray_container(
        cfg, name="ray-head", cpus=cfg.head_cpus, memory=cfg.head_memory, gpus=0, ports=ports
    )
    # GCS settings: the GCS runs in the head pod, so only the head needs them.
    gcs_env = [{"name": k, "value": v} for k, v in sorted(FAST_NODE_FAILURE_ENV.items())]
    container["env"] = container.get("env", []) + gcs_env
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            "num-cpus": "0",
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(cfg.metrics_port),
        },
        "template": {
            "metadata": _pod_metadata(cfg, "ray-head"),
            "spec": _pod_spec(cfg, container, shm_size="2Gi"),
        },
    }


def build_worker_group(cfg: RayClusterConfig, group: WorkerGroupConfig) -> dict:
    """One worker group; GPU groups get the GPU limit, toleration and product selector."""
    ports = [{"name": "metrics", "containerPort": cfg.metrics_port}]
    container = _ray_container(
        cfg, name="ray-worker", cpus=group.cpus, memory=group.memory, gpus=group.gpus, ports=ports
    )
    selector = dict(group.node_selector)
    if group.gpu_type:
        selector[GPU_PRODUCT_LABEL] = group.gpu_type
    tolerations = list(group.tolerations)
    if group.gpus and GPU_TOLERATION not in tolerations:
        tolerations.append(GPU_TOLERATION)
    params = {"num-cpus": str(group.cpus), "metrics-export-port": str(cfg.metrics_port)}
    if group.gpus:
        params["num-gpus"] = str(group.gpus)
    return {
        "groupName": group.name,
        "replicas": group.min_replicas,
        "minReplicas": group.min_replicas,
        "maxReplicas": group.max_replicas,
        "rayStartParams": params,
        "template": {
            "metadata": _pod_metadata(cfg, "ray-worker"),
            "spec": _pod_spec(
                cfg,
                container,
                shm_size=group.shm_size,
                node_selector=selector,
                tolerations=tolerations,
            ),
        },
    }


def build_raycluster_spec(cfg: RayClusterConfig) -> dict:
    """The RayCluster ``spec`` (also a RayJob's ``rayClusterSpec``), autoscaler v2 on.

    With ``cfg.auth_secret`` the cluster runs with Ray token auth, the token read
    from that existing Secret (key ``auth_token``); KubeRay then creates no Secret
    of its own, so the control plane can mount the same one. With ``cfg.gcs_redis`` its
    GCS is fault tolerant (KubeRay gives the workers a 600 s GCS reconnect timeout).
    """
    spec: dict = {"rayVersion": cfg.ray_version}
    if cfg.auth_secret:
        spec["authOptions"] = {"mode": "token", "secretName": cfg.auth_secret}
    if cfg.gcs_redis is not None:
        spec["gcsFaultToleranceOptions"] = cfg.gcs_redis.options()
    return spec | {
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "version": "v2",
            "upscalingMode": cfg.upscaling_mode,
            "idleTimeoutSeconds": cfg.idle_timeout_seconds,
            "resources": {
                "requests": {"cpu": "500m", "memory": "512Mi"},
                "limits": {"cpu": "500m", "memory": "512Mi"},
            },
            # The autoscaler sidecar (same image) runs as locked down as the Ray containers.
            "securityContext": container_security(),
            "volumeMounts": writable_mounts(),
        },
        "headGroupSpec": build_head_group(cfg),
        "workerGroupSpecs": [build_worker_group(cfg, g) for g in cfg.worker_groups],
    }


def build_raycluster(cfg: RayClusterConfig) -> dict:
    """A complete ray.io/v1 RayCluster object."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": cfg.name,
            "namespace": cfg.namespace,
            "labels": _labels("ray-cluster"),
        },
        "spec": build_raycluster_spec(cfg),
    }


def worker_group_for_job(
    *,
    min_workers: int,
    max_workers: int,
    gpus_per_worker: int,
    cpus_per_worker: float,
    template: WorkerGroupConfig,
) -> WorkerGroupConfig:
    """A group of one-Train-worker pods sized from a job's resources (for a per-job cluster)."""
    return WorkerGroupConfig(
        name="gpu" if gpus_per_worker else "cpu",
        min_replicas=min_workers,
        max_replicas=max_workers,
        gpus=gpus_per_worker,
        cpus=max(1, math.ceil(cpus_per_worker)),
        memory=template.memory,
        gpu_type=template.gpu_type if gpus_per_worker else None,
        node_selector=template.node_selector,
        tolerations=template.tolerations,
        shm_size=template.shm_size,
    )


def runtime_env_yaml(*, job_id: str, spec_json: str, env: Mapping[str, str]) -> str:
    """The RayJob ``runtimeEnvYAML``: the same env_vars the Ray-job-API backend sends."""
    env_vars = {**launch_env(job_id=job_id, spec_json=spec_json), **env}
    return yaml.safe_dump({"env_vars": env_vars}, sort_keys=True)


def build_rayjob(cfg: RayJobConfig, *, spec_json: str) -> dict:
    """A ray.io/v1 RayJob on an existing cluster (clusterSelector) or its own (rayClusterSpec)."""
    if (cfg.cluster_name is None) == (cfg.cluster is None):
        raise ValueError(
            "set exactly one of cluster_name (clusterSelector) and cluster (rayClusterSpec)"
        )
    spec: dict = {
        "entrypoint": cfg.entrypoint,
        "jobId": cfg.submission_id,
        "runtimeEnvYAML": runtime_env_yaml(job_id=cfg.job_id, spec_json=spec_json, env=cfg.env),
        "submissionMode": "K8sJobMode",
        "backoffLimit": 0,  # etrain resubmits whole jobs itself (failure.max_resubmits)
    }
    if cfg.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = cfg.active_deadline_seconds
    if cfg.cluster_name is not None:
        # A shared cluster outlives its jobs: nothing to shut down.
        spec["clusterSelector"] = {"ray.io/cluster": cfg.cluster_name}
        spec["shutdownAfterJobFinishes"] = False
    else:
        spec["rayClusterSpec"] = build_raycluster_spec(cfg.cluster)
        spec["shutdownAfterJobFinishes"] = True
        spec["ttlSecondsAfterFinished"] = cfg.ttl_seconds_after_finished
    labels = _labels(
        "ray-job",
        {
            "app.kubernetes.io/managed-by": "etrain",
            "etrain.io/job-id": label_value(cfg.job_id),
            "etrain.io/submission-id": label_value(cfg.submission_id),
        },
    )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": cfg.name, "namespace": cfg.namespace, "labels": labels},
        "spec": spec,
    }


def dns1035_name(text: str, *, max_len: int) -> str:
    """``text`` as a DNS-1035 label of at most ``max_len`` chars (hash-suffixed when cut)."""
    name = _DNS1035_BAD.sub("-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"x-{name}".rstrip("-")
    if len(name) <= max_len:
        return name
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{name[: max_len - 9].rstrip('-')}-{digest}"


def rayjob_name(submission_id: str) -> str:
    """The RayJob name for an etrain submission id (stable, so status and stop find it)."""
    return dns1035_name(submission_id, max_len=MAX_RAYJOB_NAME)


def label_value(text: str) -> str:
    """``text`` cut to a valid label value (63 chars, alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return value.strip("-_.")


def parse_worker_range(text: str) -> tuple[int, int]:
    """``"2:16"`` -> (2, 16); ``"4"`` -> (4, 4). Raises ValueError naming the format."""
    low, _, high = text.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"worker range must be MIN:MAX or N, got {text!r}") from None
    if lo < 0 or hi < 1 or lo > hi:
        raise ValueError(f"worker range needs 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return lo, hi


def dump_yaml(objects: Iterable[dict]) -> str:
    """Objects as a multi-document YAML stream, keys in builder order."""
    return yaml.safe_dump_all(list(objects), sort_keys=False, default_flow_style=False)
