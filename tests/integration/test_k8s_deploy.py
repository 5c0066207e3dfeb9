"""deploy/: every kustomization builds with the real kustomize, every object validates,
and the base is what it claims."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.k8s.manifests import RayClusterConfig, build_raycluster
from service.k8s.validate import validate_objects
from service.settings import Settings
from tests.support.helm import by_kind as _by_kind
from tests.support.helm import render
from tests.support.k8s_expected import ray_auth_env
from tests.support.kustomize import KustomizeError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Every buildable kustomization (deploy/, base, overlays); components only build inside one.
KUSTOMIZATIONS = sorted(
    str(k.parent.relative_to(DEPLOY))
    for k in DEPLOY.rglob("kustomization.yaml")
    if yaml.safe_load(k.read_text()).get("kind") != "Component"
)


@pytest.fixture(scope="module")
def base(kustomize_build) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in kustomize_build(DEPLOY)}


@pytest.mark.parametrize("where", KUSTOMIZATIONS)
def test_every_kustomization_builds_valid_objects(where, kustomize_build):
    objects = kustomize_build(DEPLOY / where)
    validate_objects(objects)
    assert all(
        o["metadata"].get("namespace") == "etrain" for o in objects if o["kind"] != "Namespace"
    )


def test_every_yaml_file_is_used_by_a_kustomization():
    used = set()
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kfile.read_text())
        used |= {(kfile.parent / e).resolve() for e in spec.get("resources", [])}
        used |= {(kfile.parent / p["path"]).resolve() for p in spec.get("patches", [])}
    files = {p.resolve() for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert files - used == set()


def test_base_has_the_promised_objects(base):
    assert set(base) == {
        ("Namespace", "etrain"),
        ("ServiceAccount", "etrain"),
        ("Role", "etrain-control-plane"),
        ("RoleBinding", "etrain-control-plane"),
        ("ConfigMap", "etrain-config"),
        ("PersistentVolumeClaim", "etrain-data"),
        ("PersistentVolumeClaim", "etrain-checkpoints"),
        ("Deployment", "etrain"),
        ("Service", "etrain"),
        ("RayCluster", "etrain"),
    }


def test_raycluster_file_is_the_builders_output(base):
    assert base[("RayCluster", "etrain")] == build_raycluster(RayClusterConfig())


def test_raycluster_head_takes_no_work_and_gpu_group_autoscales(base):
    spec = base[("RayCluster", "etrain")]["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    (gpu,) = spec["workerGroupSpecs"]
    assert gpu["minReplicas"] < gpu["maxReplicas"]
    assert gpu["rayStartParams"]["num-gpus"] == "8"
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8"


def test_role_is_least_privilege(base):
    role = base[("Role", "etrain-control-plane")]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("ray.io",), ("rayjobs",)): {"create", "get", "list", "watch", "delete"},
        (("ray.io",), ("rayclusters",)): {"get", "list", "watch"},
    }
    binding = base[("RoleBinding", "etrain-control-plane")]
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "etrain", "namespace": "etrain"}
    ]


def test_control_plane_deployment_is_locked_down_and_probed(base):
    pod = base[("Deployment", "etrain")]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["serviceAccountName"] == "etrain"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert set(c["resources"]) == {"requests", "limits"}
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
    assert secrets["ETRAIN_ADMIN_TOKEN"]["name"] == "etrain-secrets"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/var/lib/etrain", "/var/lib/etrain/checkpoints", "/tmp"} <= mounts


def test_configmap_keys_are_real_settings(base):
    data = base[("ConfigMap", "etrain-config")]["data"]
    fields = {f"ETRAIN_{name.upper()}" for name in Settings.model_fields}
    unknown = {k for k in data if k.startswith("ETRAIN_")} - fields
    assert unknown == set()
    settings = Settings(**{k[7:].lower(): v for k, v in data.items() if k.startswith("ETRAIN_")})
    assert settings.backend == "kuberay" and settings.raycluster_name == "etrain"


def test_postgres_overlay_switches_to_production(kustomize_build):
    objects = {
        (o["kind"], o["metadata"]["name"]): o for o in kustomize_build(DEPLOY / "overlays/postgres")
    }
    assert objects[("ConfigMap", "etrain-config")]["data"]["ETRAIN_ENV"] == "production"
    assert objects[("ConfigMap", "etrain-config")]["data"]["ETRAIN_BACKEND"] == "kuberay"
    assert ("StatefulSet", "etrain-postgres") in objects


def test_a_broken_kustomization_fails_with_kustomizes_message(tmp_path, kustomize_build):
    (tmp_path / "kustomization.yaml").write_text("resources: [a.yaml, a.yaml]\n")
    (tmp_path / "a.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n")
    with pytest.raises(KustomizeError, match="already registered id: Namespace"):
        kustomize_build(tmp_path)


def test_control_plane_authenticates_with_the_rayclusters_token(base):
    secret = base[("RayCluster", "etrain")]["spec"]["authOptions"]["secretName"]
    (c,) = base[("Deployment", "etrain")]["spec"]["template"]["spec"]["containers"]
    env = [e for e in c["env"] if e["name"].startswith("RAY_AUTH")]
    assert env == ray_auth_env(secret)
    assert env[1]["valueFrom"]["secretKeyRef"] == {"name": "etrain-ray-token", "key": "auth_token"}


def test_chart_and_deploy_agree_on_the_control_plane(kustomize_build):
    chart = _by_kind(render({})[0])
    deploy = _by_kind(kustomize_build(DEPLOY))
    assert (
        chart[("Role", "etrain-control-plane")]["rules"]
        == deploy[("Role", "etrain-control-plane")]["rules"]
    )
    (a,) = chart[("Deployment", "etrain")]["spec"]["template"]["spec"]["containers"]
    (b,) = deploy[("Deployment", "etrain")]["spec"]["template"]["spec"]["containers"]
    for key in ("securityContext", "livenessProbe", "readinessProbe", "startupProbe", "ports"):
        assert a[key] == b[key], key
    assert [e for e in a["env"] if e["name"].startswith("RAY_AUTH")] == [
        e for e in b["env"] if e["name"].startswith("RAY_AUTH")
    ]
