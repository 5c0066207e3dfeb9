"""helm/etrain rendered by Helm's own engine (helm-python-sdk: Helm's Go SDK in-process).

Each values file renders, lints, and every object validates strictly; the
RayCluster template agrees with the Python builder; values.yaml is documented.
"""

from __future__ import annotations

import re
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from service.k8s.gcs_redis import GcsRedis
from service.k8s.manifests import RayClusterConfig, WorkerGroupConfig, build_raycluster
from service.k8s.validate import ManifestError, object_errors, validate_objects
from service.settings import Settings
from tests.support.helm import CHART, NS, render
from tests.support.helm import by_kind as _by_kind
from tests.support.k8s_expected import ray_auth_env

ROOT = Path(__file__).resolve().parents[3]
VALUES_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))


def _values(name: str | None) -> dict:
    return yaml.safe_load((CHART / "ci" / name).read_text()) if name else {}


@pytest.mark.parametrize("values_file", [None, *VALUES_FILES])
def test_chart_renders_valid_objects(values_file):
    objects, notes = render(_values(values_file))
    validate_objects(objects)
    assert all(o["metadata"]["namespace"] == NS for o in objects)
    assert "port-forward svc/etrain-head-svc 8265:8265" in notes


@pytest.mark.parametrize("values_file", [None, *VALUES_FILES])
def test_chart_lints_clean(values_file):
    report = helm.lint(CHART, _values(values_file), strict=False, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert report["errors"] == [] and problems == []


def test_chart_has_no_dependencies_to_fetch():
    # Helm 3 refuses `helm install` of a chart whose Chart.yaml lists a dependency that
    # is not in charts/, even one whose condition is false.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert "dependencies" not in chart and not (CHART / "charts").exists()


def _config_from_values(values: dict, *, name: str) -> RayClusterConfig:
    """What ``etrain manifests raycluster`` would be asked for, from chart values."""
    merged = helm.Chart.load(CHART).merge_values(values)
    ray = merged["ray"]
    groups = tuple(
        WorkerGroupConfig(
            name=g["name"],
            min_replicas=g["minReplicas"],
            max_replicas=g["maxReplicas"],
            gpus=g["gpus"],
            cpus=g["cpus"],
            memory=g["memory"],
            gpu_type=g["gpuType"] or None,
            node_selector=g["nodeSelector"],
            tolerations=tuple(g["tolerations"]),
            shm_size=g["shmSize"],
        )
        for g in ray["workerGroups"]
    )
    return RayClusterConfig(
        name=name,
        namespace=NS,
        image=merged["images"]["worker"],
        ray_version=ray["version"],
        head_cpus=ray["head"]["cpus"],
        head_memory=ray["head"]["memory"],
        worker_groups=groups,
        idle_timeout_seconds=ray["autoscaler"]["idleTimeoutSeconds"],
        upscaling_mode=ray["autoscaler"]["upscalingMode"],
        checkpoint_claim=f"{name}-checkpoints",
        metrics_port=ray["metricsPort"],
        auth_secret=ray["authSecret"] or None,
        gcs_redis=_gcs_redis(ray["gcsFaultTolerance"], name=name),
    )


def _gcs_redis(ft: dict, *, name: str) -> GcsRedis | None:
    """``--gcs-redis`` / ``--gcs-redis-secret`` from chart values (the chart's own Redis is
    its release's ``<name>-redis`` Service)."""
    if not ft["enabled"]:
        return None
    return GcsRedis(ft["redisAddress"] or f"{name}-redis:6379", ft["passwordSecret"] or None)


def _drop_pull_secrets(spec: dict) -> None:
    pods = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    for group in pods:
        group["template"]["spec"].pop("imagePullSecrets", None)


@pytest.mark.parametrize(
    "values",
    [
        None,
        "gpu-pools-values.yaml",
        {"ray": {"authSecret": "team-a-ray-token"}},
        {"ray": {"authSecret": ""}},
        {"ray": {"gcsFaultTolerance": {"redisAddress": "redis-ha.db:6379", "passwordSecret": ""}}},
        {"ray": {"gcsFaultTolerance": {"enabled": False}}},
    ],
    ids=["default", "gpu-pools", "auth-secret", "no-auth", "existing-redis", "no-gcs-ft"],
)
def test_raycluster_template_agrees_with_the_builder(values):
    values = values if isinstance(values, dict) else _values(values)
    objects, _ = render(values, release="train")
    rendered = _by_kind(objects)[("RayCluster", "train-etrain")]
    expected = build_raycluster(_config_from_values(values, name="train-etrain"))
    _drop_pull_secrets(rendered["spec"])
    assert rendered["spec"] == expected["spec"]


def test_gpu_pools_are_rendered_as_asked():
    objects, _ = render(_values("gpu-pools-values.yaml"))
    spec = _by_kind(objects)[("RayCluster", "etrain")]["spec"]
    h100, a100 = spec["workerGroupSpecs"]
    assert (h100["minReplicas"], h100["maxReplicas"], a100["maxReplicas"]) == (2, 16, 4)
    assert h100["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "h100",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert len(h100["template"]["spec"]["tolerations"]) == 2
    assert h100["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert ("Ingress", "etrain") in _by_kind(objects)


def test_configmap_is_real_settings_for_every_mode():
    for values_file, backend in [
        (None, "kuberay"),
        ("per-job-clusters-values.yaml", "kuberay"),
        ("ray-jobs-postgres-minio-values.yaml", "ray-jobs"),
    ]:
        objects, _ = render(_values(values_file))
        data = _by_kind(objects)[("ConfigMap", "etrain-config")]["data"]
        fields = {f"ETRAIN_{n.upper()}" for n in Settings.model_fields}
        assert {k for k in data if k.startswith("ETRAIN_")} <= fields
        env = {k[7:].lower(): v for k, v in data.items() if k.startswith("ETRAIN_")}
        if env["env"] == "production":
            env["admin_token"], env["database_url"] = "t", "postgresql+psycopg://h/db"
        settings = Settings(**env)
        assert settings.backend == backend
    assert settings.ray_address == "http://etrain-head-svc.ml.svc.cluster.local:8265"
    assert settings.env == "production"


def test_per_job_mode_has_no_shared_cluster():
    objects, _ = render(_values("per-job-clusters-values.yaml"))
    kinds = _by_kind(objects)
    assert not any(kind == "RayCluster" for kind, _ in kinds)
    assert "ETRAIN_RAYCLUSTER_NAME" not in kinds[("ConfigMap", "etrain-config")]["data"]


@pytest.mark.parametrize("values_file", [None, *VALUES_FILES])
def test_control_plane_and_ray_pods_share_the_ray_token(values_file):
    values = _values(values_file)
    kinds = _by_kind(render(values)[0])
    (c,) = kinds[("Deployment", "etrain")]["spec"]["template"]["spec"]["containers"]
    assert [e for e in c["env"] if e["name"].startswith("RAY_AUTH")] == ray_auth_env(
        "etrain-ray-token"
    )
    data = kinds[("ConfigMap", "etrain-config")]["data"]
    if data["ETRAIN_BACKEND"] == "kuberay":  # per-job clusters are built from this setting
        assert (
            Settings(k8s_ray_auth_secret=data["ETRAIN_K8S_RAY_AUTH_SECRET"]).k8s_ray_auth_secret
            == "etrain-ray-token"
        )
    for kind, name in kinds:
        if kind == "RayCluster":
            assert kinds[(kind, name)]["spec"]["authOptions"] == {
                "mode": "token",
                "secretName": "etrain-ray-token",
            }


def test_token_auth_can_be_switched_off():
    objects, notes = render({"ray": {"authSecret": ""}})
    kinds = _by_kind(objects)
    validate_objects(objects)
    assert "authOptions" not in kinds[("RayCluster", "etrain")]["spec"]
    (c,) = kinds[("Deployment", "etrain")]["spec"]["template"]["spec"]["containers"]
    assert not any(e["name"].startswith("RAY_AUTH") for e in c["env"])
    assert kinds[("ConfigMap", "etrain-config")]["data"]["ETRAIN_K8S_RAY_AUTH_SECRET"] == ""
    assert "auth_token" not in notes


def test_a_bad_worker_group_is_caught_by_the_validators():
    values = {
        "ray": {
            "workerGroups": [
                {
                    "name": "gpu",
                    "minReplicas": 8,
                    "maxReplicas": 2,
                    "gpus": 8,
                    "cpus": 32,
                    "memory": "1Ti",
                    "gpuType": "",
                    "nodeSelector": {},
                    "tolerations": [],
                    "shmSize": "8Gi",
                }
            ]
        }
    }
    objects, _ = render(values)
    with pytest.raises(ManifestError, match=r"minReplicas \(8\) must be <= "):
        validate_objects(objects)


def test_a_bad_backend_fails_rendering():
    with pytest.raises(
        helm.HelmError, match=re.escape("controlPlane.backend must be kuberay or ray-jobs")
    ):
        render({"controlPlane": {"backend": "slurm"}})


def test_a_long_release_name_stays_within_kuberay_limits():
    objects, _ = render({}, release="a-very-long-release-name-for-a-training-platform-team")
    cluster = _by_kind(objects)
    (name,) = [n for kind, n in cluster if kind == "RayCluster"]
    assert len(name) <= 53
    assert object_errors(cluster[("RayCluster", name)]) == []


def test_every_values_key_has_a_description():
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not re.match(r"^\s*(- )?[\w.-]+:", line):
            continue
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and "# --" not in lines[j]:
            j -= 1
        if j < 0 or "# --" not in lines[j]:
            missing.append(line.strip())
    assert missing == []


def _control_plane(objects: list[dict]) -> tuple[dict, dict]:
    kinds = _by_kind(objects)
    return kinds, kinds[("Deployment", "etrain")]["spec"]


def test_replicas_on_postgres_roll_and_keep_one_through_drains():
    kinds, deploy = _control_plane(render(_values("ray-jobs-postgres-minio-values.yaml"))[0])
    assert deploy["replicas"] == 2
    assert deploy["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pdb = kinds[("PodDisruptionBudget", "etrain")]["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"]["matchLabels"] == deploy["selector"]["matchLabels"]
    volumes = {v["name"]: v for v in deploy["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]  # no ReadWriteOnce volume for two pods to share
    assert ("PersistentVolumeClaim", "etrain-data") not in kinds
    (c,) = deploy["template"]["spec"]["containers"]
    token = next(e for e in c["env"] if e["name"] == "ETRAIN_ADMIN_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == "etrain-secrets"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_sqlite_keeps_one_replica_on_its_volume():
    kinds, deploy = _control_plane(render({"controlPlane": {"replicas": 3}})[0])
    assert deploy["replicas"] == 1 and deploy["strategy"] == {"type": "Recreate"}
    assert not any(kind == "PodDisruptionBudget" for kind, _ in kinds)
    volumes = {v["name"]: v for v in deploy["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "etrain-data"


def test_one_replica_on_postgres_has_no_budget_that_blocks_drains():
    values = {"database": {"existingSecret": "etrain-db"}, "controlPlane": {"replicas": 1}}
    kinds, deploy = _control_plane(render(values)[0])
    assert deploy["replicas"] == 1
    assert not any(kind == "PodDisruptionBudget" for kind, _ in kinds)


def _redis_kinds(values: dict) -> set[tuple[str, str]]:
    return {(k, n) for k, n in _by_kind(render(values)[0]) if n == "etrain-redis"}


def test_the_chart_runs_its_own_redis_only_for_a_gcs_without_one():
    own = {
        ("Service", "etrain-redis"),
        ("PersistentVolumeClaim", "etrain-redis"),
        ("Deployment", "etrain-redis"),
        ("NetworkPolicy", "etrain-redis"),
    }
    assert _redis_kinds({}) == own
    existing = {"ray": {"gcsFaultTolerance": {"redisAddress": "redis-ha.db:6379"}}}
    assert _redis_kinds(existing) == set()
    assert _redis_kinds({"ray": {"gcsFaultTolerance": {"enabled": False}}}) == set()
    per_job = {"controlPlane": {"backend": "kuberay", "sharedCluster": False}}
    assert _redis_kinds(per_job) == set()  # no shared cluster: each job gets its own
    with pytest.raises(helm.HelmError, match=re.escape("ray.gcsFaultTolerance.passwordSecret")):
        render({"ray": {"gcsFaultTolerance": {"passwordSecret": ""}}})
