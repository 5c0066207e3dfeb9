"""What each job's Ray pods may see on Kubernetes: only their tenant's storage Secret and
checkpoint folder, a locked-down container, and no shared storage Secret anywhere."""

from __future__ import annotations

import json

import pytest

from service.backends.base import LaunchRequest
from service.backends.kuberay import KubeRayBackend
from service.errors import BackendError
from service.k8s.manifests import RayClusterConfig, build_raycluster
from service.k8s.pod_security import CHECKPOINT_MOUNT, RAY_WRITABLE_DIRS
from service.k8s.validate import validate_objects
from tests.unit.k8s.fake_kube import FakeCustomObjectsApi


def _spec(sections: dict | None = None) -> str:
    spec = {"name": "tiny", "resources": {"workers": {"min": 1, "max": 2}}, **(sections or {})}
    return json.dumps(spec)


S3_NAMED = {
    "checkpoint": {"storage": "s3://team-a-ckpt/run"},
    "stores": {"s3": {"credentials_secret": "teama"}},
}
S3_DEFAULT = {"checkpoint": {"storage": "s3://team-a-ckpt/run"}}


def _submit(spec_json: str, *, tenant: str | None = "team-a", **kw) -> dict:
    api = FakeCustomObjectsApi()  # validates every object it is sent
    backend = KubeRayBackend(namespace="etrain", api_factory=lambda: api, **kw)
    backend.submit(
        LaunchRequest(
            job_id="j-1", submission_id="etrain-j-1-0", spec_json=spec_json, tenant=tenant
        )
    )
    ((_, job),) = api.objects.items()
    return job


def _pods(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [g["template"]["spec"] for g in groups]


def _containers(cluster_spec: dict) -> list[dict]:
    return [c for pod in _pods(cluster_spec) for c in pod["containers"]]


def _secret_refs(container: dict) -> set[tuple[str, str]]:
    refs = {
        (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    refs |= {(f["secretRef"]["name"], "*") for f in container.get("envFrom", [])}
    return refs


def test_per_job_pods_read_only_their_tenants_secret_and_only_the_keys_the_job_needs():
    cluster = _submit(_spec(S3_NAMED))["spec"]["rayClusterSpec"]
    for c in _containers(cluster):
        assert "envFrom" not in c
        assert _secret_refs(c) == {
            ("etrain-storage-team-a", "ETRAIN_SECRET_TEAMA_ACCESS_KEY_ID"),
            ("etrain-storage-team-a", "ETRAIN_SECRET_TEAMA_SECRET_ACCESS_KEY"),
            ("etrain-storage-team-a", "ETRAIN_SECRET_TEAMA_SESSION_TOKEN"),
        }
        optional = {
            e["name"]: e["valueFrom"]["secretKeyRef"]["optional"]
            for e in c["env"]
            if "valueFrom" in e
        }
        assert optional == {
            "ETRAIN_SECRET_TEAMA_ACCESS_KEY_ID": False,
            "ETRAIN_SECRET_TEAMA_SECRET_ACCESS_KEY": False,
            "ETRAIN_SECRET_TEAMA_SESSION_TOKEN": True,
        }


def test_another_tenants_job_gets_its_own_secret_and_folder():
    cluster = _submit(_spec(S3_DEFAULT), tenant="team-b")["spec"]["rayClusterSpec"]
    for c in _containers(cluster):
        assert {name for name, _ in _secret_refs(c)} == {"etrain-storage-team-b"}
        assert {k for _, k in _secret_refs(c)} == {
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
        }
        (ckpt,) = [m for m in c["volumeMounts"] if m["name"] == "checkpoints"]
        assert ckpt == {
            "name": "checkpoints",
            "mountPath": f"{CHECKPOINT_MOUNT}/team-b",
            "subPath": "team-b",
        }


def test_a_file_storage_job_gets_no_secret_at_all():
    cluster = _submit(_spec())["spec"]["rayClusterSpec"]
    assert all(_secret_refs(c) == set() for c in _containers(cluster))


def test_a_per_job_cluster_needs_the_jobs_tenant():
    with pytest.raises(BackendError, match="no tenant"):
        _submit(_spec(), tenant=None)


def test_a_tenant_name_that_makes_no_secret_name_is_refused():
    with pytest.raises(BackendError, match="DNS-1123"):
        _submit(_spec(S3_DEFAULT), tenant="team-")


def test_the_shared_cluster_refuses_a_named_credentials_secret():
    with pytest.raises(BackendError, match="needs a RayCluster per job"):
        _submit(_spec(S3_NAMED), cluster_name="etrain")
    job = _submit(_spec(S3_DEFAULT), cluster_name="etrain")  # the pods' own identity
    assert "rayClusterSpec" not in job["spec"]


def test_no_ray_pod_of_the_shared_cluster_loads_a_storage_secret():
    spec = build_raycluster(RayClusterConfig())["spec"]
    assert all(_secret_refs(c) == set() for c in _containers(spec))
    for c in _containers(spec):  # the whole claim: the cluster runs every tenant's jobs
        (ckpt,) = [m for m in c["volumeMounts"] if m["name"] == "checkpoints"]
        assert ckpt == {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}


@pytest.mark.parametrize("where", ["shared", "per-job"])
def test_ray_pods_are_locked_down(where):
    if where == "shared":
        cluster = build_raycluster(RayClusterConfig())
        validate_objects([cluster])
        spec = cluster["spec"]
    else:
        spec = _submit(_spec(S3_NAMED))["spec"]["rayClusterSpec"]
    for pod in _pods(spec):
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert all("emptyDir" in volumes[name] for name in RAY_WRITABLE_DIRS)
    autoscaler = spec["autoscalerOptions"]
    for c in [*_containers(spec), autoscaler]:
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert set(RAY_WRITABLE_DIRS.values()) <= mounts  # /tmp (Ray's /tmp/ray), ~/.cache
