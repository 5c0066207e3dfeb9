"""deploy/: every kustomization builds with the real kustomize, every object validates,
and the base is what it claims."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from service.k8s.gcs_redis import GcsRedis
from service.k8s.manifests import RayClusterConfig, build_raycluster
from service.k8s.validate import validate_objects
from service.settings import Settings
from tests.support.helm import (
    CHART,
    HELM_INSTALL_HINT,
    discovery_server,
    helm_path,
    render,
    run_helm,
)
from tests.support.helm import by_kind as _by_kind
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
        ("Service", "etrain-redis"),
        ("PersistentVolumeClaim", "etrain-redis"),
        ("Deployment", "etrain-redis"),
        ("NetworkPolicy", "etrain-redis"),
        ("NetworkPolicy", "etrain-default-deny-ingress"),
        ("NetworkPolicy", "etrain-api"),
        ("NetworkPolicy", "etrain-ray"),
    }


def test_raycluster_file_is_the_builders_output(base):
    """`etrain manifests raycluster` with its defaults: GCS fault tolerance on etrain-redis."""
    expected = build_raycluster(RayClusterConfig(gcs_redis=GcsRedis()))
    assert base[("RayCluster", "etrain")] == expected
    ft = expected["spec"]["gcsFaultToleranceOptions"]
    assert ft["redisAddress"] == "etrain-redis:6379"
    secret = ft["redisPassword"]["valueFrom"]["secretKeyRef"]
    redis = base[("Deployment", "etrain-redis")]["spec"]["template"]["spec"]
    (env,) = redis["containers"][0]["env"]
    assert env["valueFrom"]["secretKeyRef"] == secret  # the one password both sides read
    port = base[("Service", "etrain-redis")]["spec"]["ports"][0]["port"]
    assert ft["redisAddress"].endswith(f":{port}")


def test_chart_and_deploy_run_the_same_redis(kustomize_build):
    deploy = _by_kind(kustomize_build(DEPLOY))
    chart = _by_kind(render({})[0])
    for kind in ("Service", "PersistentVolumeClaim", "Deployment"):
        assert chart[(kind, "etrain-redis")]["spec"] == deploy[(kind, "etrain-redis")]["spec"]


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


# --- tenant isolation and network policy ---------------------------------------------------
RAY_COMPONENTS = {"ray-head", "ray-worker"}


def _ray_containers(objects: list[dict]) -> list[dict]:
    out = []
    for o in objects:
        if o["kind"] == "RayCluster":
            spec = o["spec"]
            for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
                out += group["template"]["spec"]["containers"]
    return out


@pytest.mark.parametrize("where", KUSTOMIZATIONS)
def test_no_ray_pod_loads_a_storage_secret(where, kustomize_build):
    containers = _ray_containers(kustomize_build(DEPLOY / where))
    assert containers
    for c in containers:
        assert "envFrom" not in c
        assert not [e for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels / In / NotIn / Exists) matches ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        value, op = labels.get(e["key"]), e["operator"]
        if (op == "In" and value not in e["values"]) or (op == "NotIn" and value in e["values"]):
            return False
        if (op == "Exists") != (value is not None) and op in ("Exists", "DoesNotExist"):
            return False
    return True


def _pod_labels(component: str) -> dict:
    return {"app.kubernetes.io/name": "etrain", "app.kubernetes.io/component": component}


def _may_reach(policies: list[dict], src: dict, dst: dict, port: int, *, same_ns=True) -> bool:
    """Whether NetworkPolicy ``policies`` let a pod labelled ``src`` reach ``dst``:``port``."""
    mine = [p["spec"] for p in policies if _selects(p["spec"]["podSelector"], dst)]
    if not any("Ingress" in p["policyTypes"] for p in mine):
        return True
    for p in mine:
        for rule in p.get("ingress", []):
            ports = [x["port"] for x in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if peers is None or any(
                ("namespaceSelector" in peer or same_ns)
                and _selects(peer.get("podSelector", {}), src)
                for peer in peers
            ):
                return True
    return False


@pytest.mark.parametrize(
    "src, dst, port, allowed",
    [
        ({}, "control-plane", 8000, True),  # users, an ingress controller, telemetry
        ("ray-worker", "control-plane", 8000, True),
        ("control-plane", "ray-head", 8265, True),  # job API and logs
        ("control-plane", "ray-head", 6379, False),  # GCS: Ray pods only
        ("ray-worker", "ray-head", 6379, True),
        ("ray-head", "ray-worker", 12345, True),  # Ray's own ports, between Ray pods
        ({"batch.kubernetes.io/job-name": "rj-abc"}, "ray-head", 8265, True),  # submitter
        ({"batch.kubernetes.io/job-name": "rj-abc"}, "ray-head", 6379, False),
        ({"app": "other"}, "ray-head", 8265, False),
        ({"app": "other"}, "ray-worker", 12345, False),
        ({"app": "other"}, "ray-worker", 8080, True),  # Prometheus
        ("control-plane", "postgres", 5432, True),
        ("ray-worker", "postgres", 5432, False),
        ({"app": "other"}, "postgres", 5432, False),
        ("ray-worker", "minio", 9000, True),
        ("control-plane", "minio", 9000, True),
        ({"app": "other"}, "minio", 9000, False),
        ("minio-setup", "minio", 9000, True),
        ("ray-worker", "minio", 9001, False),
        ("ray-head", "redis", 6379, True),  # the GCS's state
        ("ray-worker", "redis", 6379, False),
        ("control-plane", "redis", 6379, False),
        ({"app": "other"}, "redis", 6379, False),
    ],
)
def test_network_policies_allow_only_what_etrain_needs(src, dst, port, allowed, kustomize_build):
    objects = kustomize_build(DEPLOY / "overlays/postgres-minio")
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    src_labels = _pod_labels(src) if isinstance(src, str) else src
    assert _may_reach(policies, src_labels, _pod_labels(dst), port) is allowed


def test_operator_reaches_the_head_from_its_namespace(base):
    policies = [o for o in base.values() if o["kind"] == "NetworkPolicy"]
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    assert _may_reach(policies, operator, _pod_labels("ray-head"), 8265, same_ns=False)
    assert not _may_reach(policies, operator, _pod_labels("ray-head"), 6379, same_ns=False)


def test_every_pod_template_is_covered_by_the_default_deny(kustomize_build):
    objects = kustomize_build(DEPLOY / "overlays/postgres-minio")
    (deny,) = [o for o in objects if o["metadata"]["name"] == "etrain-default-deny-ingress"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    egress_locked = {
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "NetworkPolicy" and "Egress" in o["spec"]["policyTypes"]
    }
    assert egress_locked == {
        "etrain-postgres",
        "etrain-minio",
        "etrain-minio-setup",
        "etrain-redis",
    }


def test_chart_and_deploy_render_the_same_network_policies(kustomize_build):
    deploy = _by_kind(kustomize_build(DEPLOY / "overlays/postgres-minio"))
    chart = _by_kind(render({"postgresql": {"enabled": True}, "minio": {"enabled": True}})[0])
    names = {n for kind, n in deploy if kind == "NetworkPolicy"}
    assert names == {n for kind, n in chart if kind == "NetworkPolicy"}
    for name in names:
        assert chart[("NetworkPolicy", name)]["spec"] == deploy[("NetworkPolicy", name)]["spec"]
    off = _by_kind(render({"networkPolicy": {"enabled": False}})[0])
    assert not [k for k, _ in off if k == "NetworkPolicy"]


# --- the real Helm 3 CLI, as the docs use it -----------------------------------------------
@pytest.fixture(scope="module")
def helm_home(tmp_path_factory):
    binary = helm_path()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(f"no helm binary at {binary}; {HELM_INSTALL_HINT}", pytrace=False)
    version = run_helm(["version", "--template", "{{.Version}}"], home=tmp_path_factory.mktemp("h"))
    assert version.stdout.startswith("v3."), version.stdout
    return tmp_path_factory.mktemp("helm")


VALUES = [None, *sorted(str(p) for p in (CHART / "ci").glob("*-values.yaml"))]


def _values_args(values_file: str | None) -> list[str]:
    return ["-f", values_file] if values_file else []


def _quiet(result) -> str:
    """stdout and stderr together; the test asserts neither has a warning or an error."""
    return result.stdout + result.stderr


@pytest.mark.parametrize("values_file", VALUES)
def test_helm_lint_passes_without_warnings(values_file, helm_home):
    result = run_helm(["lint", str(CHART), *_values_args(values_file)], home=helm_home)
    out = _quiet(result)
    assert result.returncode == 0, out
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out and "missing" not in out, out


@pytest.mark.parametrize("values_file", VALUES)
def test_helm_template_renders_valid_objects(values_file, helm_home):
    args = ["template", "etrain", str(CHART), "-n", "ml", *_values_args(values_file)]
    result = run_helm(args, home=helm_home)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    validate_objects(objects)
    assert {"Deployment", "NetworkPolicy"} <= {o["kind"] for o in objects}


@pytest.mark.parametrize("values_file", VALUES)
def test_helm_install_works_as_documented(values_file, helm_home):
    """`helm install etrain helm/etrain` as docs/kubernetes.md has it, in client dry-run.

    Helm 3 checks the chart's dependencies first (a listed one missing from charts/
    fails the install even when its condition is false), then asks the cluster for its
    version and API groups: a loopback server answers those discovery reads only. Helm's
    own OpenAPI check would need the server's OpenAPI document; the objects are checked
    here instead, strictly, against Kubernetes' and KubeRay's schemas.
    """
    with discovery_server() as server:
        result = run_helm(
            [
                "install",
                "etrain",
                str(CHART),
                "--namespace",
                "ml",
                "--dry-run=client",
                "--disable-openapi-validation",
                *_values_args(values_file),
            ],
            home=helm_home,
            server=server,
        )
    out = _quiet(result)
    assert result.returncode == 0, out
    assert result.stderr == "" and "WARNING" not in out and "missing in charts" not in out
    assert "STATUS: pending-install" in result.stdout
    manifest = result.stdout.split("MANIFEST:", 1)[1].split("NOTES:", 1)
    objects = [o for o in yaml.safe_load_all(manifest[0]) if o]
    validate_objects(objects)
    assert ("Deployment", "etrain") in _by_kind(objects)
    assert "port-forward svc/etrain-head-svc 8265:8265" in manifest[1]
