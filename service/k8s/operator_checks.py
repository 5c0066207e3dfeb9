"""Checks the schemas do not carry: the KubeRay operator's and the API server's.

The KubeRay ones follow ``ray-operator/controllers/ray/utils/validation.go``
(KubeRay 1.7): a RayCluster or RayJob that fails them is accepted by the API
server and then refused by the operator, so it never runs. Each function
returns messages naming the field; it raises nothing.
"""

from __future__ import annotations

import re

import yaml

# A RayJob's cluster is named "<job>-<5 chars>"; a cluster's longest service
# suffix is "-serve-svc" (63 - 10 = 53).
MAX_RAYCLUSTER_NAME = 53
MAX_RAYJOB_NAME = 47
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
_AUTOSCALER_V2_ENV = "RAY_enable_autoscaler_v2"


def metadata_errors(obj: dict) -> list[str]:
    """API-server rules on any object: name a DNS-1123 subdomain, labels well formed."""
    meta = obj.get("metadata") or {}
    errors = []
    name = meta.get("name")
    if not name:
        errors.append("metadata.name: required")
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        errors.append(
            f"metadata.name: {name!r} is not a DNS-1123 subdomain "
            "(lowercase letters, digits, '-' and '.', at most 253)"
        )
    for key, value in (meta.get("labels") or {}).items():
        errors += [f"metadata.labels.{key}: {e}" for e in _label_errors(key, value)]
    return errors


def _label_errors(key: str, value: str) -> list[str]:
    errors = []
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        errors.append(f"label key prefix {prefix!r} is not a DNS-1123 subdomain")
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        errors.append(f"label key name {name!r} must be 1-63 alphanumerics, '-', '_' or '.'")
    if value and (len(str(value)) > 63 or not _LABEL_NAME.fullmatch(str(value))):
        errors.append(
            f"label value {value!r} must be at most 63 alphanumerics, '-', '_' or "
            "'.', starting and ending with an alphanumeric"
        )
    return errors


def _name_errors(name: str | None, *, kind: str, limit: int) -> list[str]:
    if not name:
        return []  # metadata_errors reports it
    errors = []
    if len(name) > limit:
        errors.append(
            f"metadata.name: {kind} name should be no more than {limit} characters "
            f"(got {len(name)})"
        )
    if not _DNS1035.fullmatch(name):
        errors.append(f"metadata.name: {kind} name {name!r} should be a valid DNS-1035 label")
    return errors


def operator_errors(obj: dict) -> list[str]:
    """KubeRay's checks for a RayCluster or RayJob."""
    kind, meta = obj.get("kind"), obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if kind == "RayCluster":
        return _name_errors(
            meta.get("name"), kind=kind, limit=MAX_RAYCLUSTER_NAME
        ) + raycluster_spec_errors(spec, prefix="spec", annotations=meta.get("annotations"))
    if kind == "RayJob":
        return _name_errors(
            meta.get("name"), kind=kind, limit=MAX_RAYJOB_NAME
        ) + rayjob_spec_errors(spec, annotations=meta.get("annotations"))
    return []


def _containers(group: dict) -> list[dict]:
    return (((group.get("template") or {}).get("spec") or {}).get("containers")) or []


def _env(container: dict) -> dict[str, str]:
    return {e.get("name"): e.get("value", "") for e in container.get("env") or []}


def _group_errors(group: dict, where: str, *, autoscaler_v2: bool) -> list[str]:
    errors = []
    if not _containers(group):
        errors.append(f"{where}.template.spec.containers: needs at least one container")
    params = group.get("rayStartParams") or {}
    if group.get("resources") and any(params.get(p) for p in _RESOURCE_PARAMS):
        errors.append(f"{where}: set resources in rayStartParams or in resources, not both")
    if "labels" in params:
        errors.append(f"{where}.rayStartParams.labels: not supported; use {where}.labels")
    policy = ((group.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if autoscaler_v2 and policy not in (None, "", "Never"):
        errors.append(
            f"{where}.template.spec.restartPolicy: must be Never or unset with autoscaler v2"
        )
    return errors


def _replica_errors(group: dict, where: str) -> list[str]:
    low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
    errors = []
    if low > high:
        errors.append(f"{where}.minReplicas ({low}) must be <= {where}.maxReplicas ({high})")
    if low < 0:
        errors.append(f"{where}.minReplicas ({low}) must be >= 0")
    replicas = group.get("replicas")
    if replicas is not None and low <= high and not low <= replicas <= high:
        errors.append(
            f"{where}.replicas ({replicas}) must be within [minReplicas, maxReplicas]"
            f" = [{low}, {high}]"
        )
    return errors


def _autoscaler_errors(spec: dict, prefix: str) -> list[str]:
    head = _containers(spec.get("headGroupSpec") or {})
    head_env = _env(head[0]) if head else {}
    errors = []
    enabled = bool(spec.get("enableInTreeAutoscaling"))
    if not enabled and head_env.get(_AUTOSCALER_V2_ENV) in ("1", "true"):
        errors.append(
            f"{prefix}.enableInTreeAutoscaling: must be true when the head sets "
            f"{_AUTOSCALER_V2_ENV}"
        )
    version = (spec.get("autoscalerOptions") or {}).get("version")
    if enabled and version and _AUTOSCALER_V2_ENV in head_env:
        errors.append(
            f"{prefix}.autoscalerOptions.version: set it or the head env "
            f"{_AUTOSCALER_V2_ENV}, not both"
        )
    return errors


def _autoscaler_v2(spec: dict) -> bool:
    if not spec.get("enableInTreeAutoscaling"):
        return False
    head = _containers(spec.get("headGroupSpec") or {})
    env = _env(head[0]) if head else {}
    return (spec.get("autoscalerOptions") or {}).get("version") == "v2" or env.get(
        _AUTOSCALER_V2_ENV
    ) in ("1", "true")


def raycluster_spec_errors(
    spec: dict, *, prefix: str, annotations: dict | None = None
) -> list[str]:
    """KubeRay's RayCluster spec checks (also applied to a RayJob's rayClusterSpec);
    ``annotations``: the object's (the RayCluster's, or the RayJob's)."""
    v2 = _autoscaler_v2(spec)
    errors = _group_errors(
        spec.get("headGroupSpec") or {}, f"{prefix}.headGroupSpec", autoscaler_v2=v2
    )
    names: set[str] = set()
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        where = f"{prefix}.workerGroupSpecs[{i}]"
        errors += _group_errors(group, where, autoscaler_v2=v2) + _replica_errors(group, where)
        if group.get("groupName") in names:
            errors.append(f"{where}.groupName: {group.get('groupName')!r} is used twice")
        names.add(group.get("groupName"))
        if v2 and group.get("suspend"):
            errors.append(
                f"{where}.suspend: a worker group cannot be suspended with the autoscaler enabled"
            )
    errors += _autoscaler_errors(spec, prefix)
    if (spec.get("authOptions") or {}).get("mode") == "token":
        errors += _auth_errors(spec.get("rayVersion"), prefix)
    return errors + gcs_ft_errors(spec, annotations or {}, prefix=prefix)


_FT_ANNOTATION = "ray.io/ft-enabled"
_STORAGE_NS_ANNOTATION = "ray.io/external-storage-namespace"


def gcs_ft_errors(spec: dict, annotations: dict, *, prefix: str) -> list[str]:
    """KubeRay's checks of GCS fault tolerance: ``gcsFaultToleranceOptions`` and nothing
    that configures Redis another way beside it."""
    head = _containers(spec.get("headGroupSpec") or {})
    env = _env(head[0]) if head else {}
    params = (spec.get("headGroupSpec") or {}).get("rayStartParams") or {}
    options = spec.get("gcsFaultToleranceOptions")
    errors = []
    if options is not None and annotations.get(_FT_ANNOTATION):
        errors.append(
            f"metadata.annotations.{_FT_ANNOTATION}: use only {prefix}.gcsFaultToleranceOptions"
        )
    ft_on = options is not None or str(annotations.get(_FT_ANNOTATION, "")).lower() == "true"
    if not ft_on and "RAY_REDIS_ADDRESS" in env:
        errors.append(
            f"{prefix}.headGroupSpec: RAY_REDIS_ADDRESS needs {prefix}.gcsFaultToleranceOptions"
        )
    if options is not None:
        where = f"{prefix}.gcsFaultToleranceOptions"
        if params.get("redis-password"):
            errors.append(
                f"{prefix}.headGroupSpec.rayStartParams.redis-password: use {where}.redisPassword"
            )
        for name, field in (
            ("REDIS_PASSWORD", "redisPassword"),
            ("RAY_REDIS_ADDRESS", "redisAddress"),
        ):
            if name in env:
                errors.append(f"{prefix}.headGroupSpec: env {name}: use {where}.{field}")
        if annotations.get(_STORAGE_NS_ANNOTATION):
            errors.append(
                f"metadata.annotations.{_STORAGE_NS_ANNOTATION}: "
                f"use {where}.externalStorageNamespace"
            )
    if params.get("redis-username") or "REDIS_USERNAME" in env:
        errors.append(
            f"{prefix}.headGroupSpec: set the Redis user in "
            f"{prefix}.gcsFaultToleranceOptions.redisUsername"
        )
    return errors


def _auth_errors(ray_version: str | None, prefix: str) -> list[str]:
    try:
        parts = tuple(int(p) for p in (ray_version or "").split(".")[:3])
    except ValueError:
        parts = ()
    if not parts:
        return [f"{prefix}.rayVersion: token auth needs a valid rayVersion (>= 2.52.0)"]
    if parts < (2, 52, 0):
        return [f"{prefix}.rayVersion: token auth needs Ray >= 2.52.0, got {ray_version}"]
    return []


def rayjob_spec_errors(spec: dict, *, annotations: dict | None = None) -> list[str]:
    """KubeRay's RayJob spec checks, plus rayClusterSpec xor clusterSelector."""
    errors = []
    selector, cluster = spec.get("clusterSelector"), spec.get("rayClusterSpec")
    if bool(selector) == (cluster is not None):
        errors.append("spec: set exactly one of spec.rayClusterSpec and spec.clusterSelector")
    if selector is not None and not selector.get("ray.io/cluster"):
        errors.append("spec.clusterSelector.ray.io/cluster: the cluster name must not be empty")
    if selector and spec.get("submissionMode") == "SidecarMode":
        errors.append("spec.submissionMode: clusterSelector is not supported in SidecarMode")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        errors.append("spec.suspend: needs spec.shutdownAfterJobFinishes: true")
    if spec.get("suspend") and selector:
        errors.append("spec.suspend: the clusterSelector mode cannot be suspended")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        errors.append("spec.ttlSecondsAfterFinished: must be >= 0")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        errors.append("spec.activeDeadlineSeconds: must be a positive integer")
    if spec.get("backoffLimit") is not None and spec["backoffLimit"] < 0:
        errors.append("spec.backoffLimit: must be >= 0")
    if spec.get("submissionMode") == "InteractiveMode" and (spec.get("backoffLimit") or 0) > 0:
        errors.append("spec.backoffLimit: incompatible with InteractiveMode")
    errors += _runtime_env_errors(spec.get("runtimeEnvYAML"))
    if cluster is not None:
        errors += raycluster_spec_errors(
            cluster, prefix="spec.rayClusterSpec", annotations=annotations
        )
    return errors


def _runtime_env_errors(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [f"spec.runtimeEnvYAML: not valid YAML ({e.__class__.__name__})"]
    if not isinstance(parsed, dict):
        return ["spec.runtimeEnvYAML: must be a YAML mapping"]
    env_vars = parsed.get("env_vars", {})
    if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
        return ["spec.runtimeEnvYAML.env_vars: must map names to strings"]
    return []
