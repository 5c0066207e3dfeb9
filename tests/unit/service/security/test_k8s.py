"""Items 7 and 19, Kubernetes: a job's Ray pods see only their tenant's storage Secret and
checkpoint folder and run locked down behind NetworkPolicies; the Helm chart installs as
documented. Cases drive the real app and reconciler with the KubeRay backend (on a
Kubernetes API that keeps objects in memory and validates them like the API server and
the operator), or read deploy/ and render the chart with Helm's own engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.backends.base import LaunchRequest
from service.backends.kuberay import KubeRayBackend
from tests.support.fakes import ADMIN_H, dev_settings
from tests.support.helm import CHART, by_kind, render
from tests.unit.k8s.fake_kube import FakeCustomObjectsApi

DEPLOY = Path(__file__).resolve().parents[4] / "deploy"
JOB = {
    "name": "tiny",
    "resources": {"workers": 1},
    "train": {"steps": 5, "global_batch_size": 4, "micro_batch_size": 4},
}


def _containers(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def _secrets(container: dict) -> set[str]:
    names = {f["secretRef"]["name"] for f in container.get("envFrom", []) if "secretRef" in f}
    names |= {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    return names


def _rayjobs_of_two_tenants(tmp_path) -> dict[str, dict]:
    """team-a and team-b each submit a job; the reconciler hands both to KubeRay."""
    api = FakeCustomObjectsApi()
    backend = KubeRayBackend(namespace="etrain", api_factory=lambda: api)
    settings = dev_settings(tmp_path).model_copy(update={"backend": "kuberay"})
    ids = {}
    with TestClient(create_app(settings, backend=backend, reconcile=False)) as client:
        for tenant in ("team-a", "team-b"):
            r = client.post("/v1/tokens", json={"tenant": tenant}, headers=ADMIN_H)
            headers = {"Authorization": f"Bearer {r.json()['token']}"}
            r = client.post("/v1/jobs", json=JOB, headers=headers)
            assert r.status_code == 201, r.text
            ids[r.json()["id"]] = tenant
        client.app.state.runtime.reconciler.tick()
    jobs = [o for (plural, _, _), o in api.objects.items() if plural == "rayjobs"]
    return {ids[j["metadata"]["labels"]["etrain.io/job-id"]]: j for j in jobs}


def job_pods_mount_only_their_tenants_checkpoint_folder(tmp_path) -> None:
    jobs = _rayjobs_of_two_tenants(tmp_path)
    assert set(jobs) == {"team-a", "team-b"}
    for tenant, job in jobs.items():
        for c in _containers(job["spec"]["rayClusterSpec"]):
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "checkpoints"]
            assert mount["subPath"] == tenant
            assert mount["mountPath"].endswith(f"/checkpoints/{tenant}")
            assert _secrets(c) == set()  # file:// storage needs no keys at all


def job_pods_read_credentials_from_their_own_tenants_secret_only(tmp_path) -> None:
    del tmp_path
    api = FakeCustomObjectsApi()
    backend = KubeRayBackend(namespace="etrain", api_factory=lambda: api)
    spec = JOB | {
        "checkpoint": {"storage": "s3://team-b-ckpt/x"},
        "stores": {"s3": {"credentials_secret": "team-b"}},
    }
    req = LaunchRequest(
        job_id="j-1", submission_id="etrain-j-1-0", spec_json=json.dumps(spec), tenant="team-b"
    )
    cluster = backend.build(req)["spec"]["rayClusterSpec"]
    for c in _containers(cluster):
        assert "envFrom" not in c
        assert _secrets(c) == {"etrain-storage-team-b"}


def shared_raycluster_loads_no_storage_secret(tmp_path) -> None:
    del tmp_path
    (deployed,) = yaml.safe_load_all((DEPLOY / "base/raycluster.yaml").read_text())
    charted = by_kind(render({})[0])[("RayCluster", "etrain")]
    for cluster in (deployed, charted):
        assert all(_secrets(c) == set() for c in _containers(cluster["spec"]))


def ray_pods_have_seccomp_and_a_read_only_root(tmp_path) -> None:
    del tmp_path
    (deployed,) = yaml.safe_load_all((DEPLOY / "base/raycluster.yaml").read_text())
    charted = by_kind(render({})[0])[("RayCluster", "etrain")]
    for spec in (deployed["spec"], charted["spec"]):
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for g in groups:
            pod = g["template"]["spec"]
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in [*_containers(spec), spec["autoscalerOptions"]]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def network_policies_deny_by_default_in_deploy_and_chart(tmp_path) -> None:
    del tmp_path
    kustomization = yaml.safe_load((DEPLOY / "base/kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in kustomization["resources"]
    deployed = [
        o
        for name in ("networkpolicy.yaml", "redis.yaml")
        for o in yaml.safe_load_all((DEPLOY / "base" / name).read_text())
        if o["kind"] == "NetworkPolicy"
    ]
    charted = [o for o in render({})[0] if o["kind"] == "NetworkPolicy"]
    for policies in (deployed, charted):
        deny = [p for p in policies if p["spec"]["podSelector"] == {}]
        assert [p["spec"]["policyTypes"] for p in deny] == [["Ingress"]]
        assert len(policies) == 4  # deny, the API's port, Ray, Redis (the GCS's state)


def chart_installs_without_fetching_dependencies(tmp_path) -> None:
    del tmp_path
    assert "dependencies" not in yaml.safe_load((CHART / "Chart.yaml").read_text())
    report = helm.lint(CHART, {}, strict=False, kube_version="v1.30.0")
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


CASES: dict[str, Callable] = {
    "item07-job-pods-mount-only-their-tenants-checkpoint-folder": (
        job_pods_mount_only_their_tenants_checkpoint_folder
    ),
    "item07-job-pods-read-only-their-tenants-secret": (
        job_pods_read_credentials_from_their_own_tenants_secret_only
    ),
    "item07-shared-raycluster-loads-no-storage-secret": shared_raycluster_loads_no_storage_secret,
    "item07-ray-pods-seccomp-read-only-root": ray_pods_have_seccomp_and_a_read_only_root,
    "item07-network-policies": network_policies_deny_by_default_in_deploy_and_chart,
    "item19-helm-install-needs-no-dependency": chart_installs_without_fetching_dependencies,
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_k8s(case, tmp_path):
    case(tmp_path)
