"""Each validator rejects a deliberately broken object and names the field."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from typer.testing import CliRunner

from service.cli import app
from service.k8s.gcs_redis import GcsRedis
from service.k8s.manifests import (
    RayClusterConfig,
    RayJobConfig,
    WorkerGroupConfig,
    build_raycluster,
    build_rayjob,
    dns1035_name,
    parse_worker_range,
)
from service.k8s.validate import ManifestError, object_errors, strict_schema, validate_objects

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "etrain"},
    "spec": {
        "selector": {"matchLabels": {"a": "b"}},
        "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
    },
}


def _cluster(**group) -> dict:
    return build_raycluster(RayClusterConfig(worker_groups=(WorkerGroupConfig(**group),)))


def _job(**kw) -> dict:
    base = dict(
        name="train-1",
        namespace="etrain",
        job_id="j-1",
        submission_id="train-1",
        env={},
        cluster_name="etrain",
    )
    return build_rayjob(RayJobConfig(**{**base, **kw}), spec_json="{}")


def _one_error(obj: dict) -> str:
    errors = object_errors(obj)
    assert len(errors) == 1, errors
    return errors[0]


def test_built_objects_are_valid():
    validate_objects(
        [_cluster(), _job(), _job(cluster_name=None, cluster=RayClusterConfig()), DEPLOYMENT]
    )


def test_crd_schema_rejects_unknown_fields_naming_them():
    obj = _cluster()
    obj["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    assert _one_error(obj) == (
        "RayCluster/etrain: spec.workerGroupSpecs[0]: Additional "
        "properties are not allowed ('maxReplica' was unexpected)"
    )
    obj = _cluster()
    obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePolicy"] = "x"
    assert "'imagePolicy' was unexpected" in _one_error(obj)


def test_crd_schema_rejects_wrong_types_naming_the_field():
    obj = _cluster()
    obj["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 8
    assert _one_error(obj) == (
        "RayCluster/etrain: spec.workerGroupSpecs[0].rayStartParams."
        "num-gpus: 8 is not of type 'string'"
    )
    obj = _cluster()
    obj["spec"]["autoscalerOptions"]["version"] = "v3"
    assert "spec.autoscalerOptions.version: 'v3' is not one of" in _one_error(obj)


def test_crd_metadata_is_checked_against_objectmeta():
    obj = _cluster()
    obj["metadata"]["lables"] = {}
    assert "metadata: Additional properties are not allowed ('lables'" in _one_error(obj)


def test_strictness_respects_preserve_unknown_fields():
    schema = {
        "type": "object",
        "properties": {
            "open": {
                "type": "object",
                "properties": {"a": {}},
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "closed": {"type": "object", "properties": {"a": {}}},
        },
    }
    strict = strict_schema(schema)
    assert strict["additionalProperties"] is False
    assert "additionalProperties" not in strict["properties"]["open"]
    assert strict["properties"]["map"]["additionalProperties"] == {"type": "string"}
    assert strict["properties"]["closed"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is left alone


def test_core_schema_rejects_unknown_and_mistyped_fields():
    bad = copy.deepcopy(DEPLOYMENT)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    error = _one_error(bad)
    assert error.startswith("Deployment/etrain: spec.template.spec.containers[0]:")
    assert "imagePullPolice" in error
    bad = copy.deepcopy(DEPLOYMENT)
    bad["spec"]["replicas"] = "two"
    assert _one_error(bad).startswith("Deployment/etrain: spec.replicas: 'two' is not of type")


@pytest.mark.parametrize(
    "mutate, field",
    [
        (
            lambda s: s["workerGroupSpecs"][0].update(minReplicas=5, maxReplicas=2, replicas=2),
            "spec.workerGroupSpecs[0].minReplicas (5) must be <= "
            "spec.workerGroupSpecs[0].maxReplicas",
        ),
        (
            lambda s: s["workerGroupSpecs"][0].update(replicas=9),
            "spec.workerGroupSpecs[0].replicas (9) must be within",
        ),
        (
            lambda s: s["workerGroupSpecs"].append(copy.deepcopy(s["workerGroupSpecs"][0])),
            "spec.workerGroupSpecs[1].groupName: 'gpu' is used twice",
        ),
        (
            lambda s: s["workerGroupSpecs"][0].update(resources={"GPU": "8"}),
            "spec.workerGroupSpecs[0]: set resources in rayStartParams or in resources, not both",
        ),
        (
            lambda s: s["headGroupSpec"]["template"]["spec"].update(restartPolicy="Always"),
            "spec.headGroupSpec.template.spec.restartPolicy: must be Never or unset",
        ),
        (
            lambda s: s["headGroupSpec"]["template"]["spec"].update(containers=[]),
            "spec.headGroupSpec.template.spec.containers: needs at least one container",
        ),
        (
            lambda s: s.update(authOptions={"mode": "token"}, rayVersion="2.40.0"),
            "spec.rayVersion: token auth needs Ray >= 2.52.0",
        ),
    ],
)
def test_operator_checks_on_rayclusters(mutate, field):
    obj = _cluster()
    mutate(obj["spec"])
    assert field in _one_error(obj)


def test_name_limits():
    obj = _cluster()
    obj["metadata"]["name"] = "a" * 54
    assert "RayCluster name should be no more than 53 characters" in _one_error(obj)
    job = _job(name="j" * 48)
    assert "RayJob name should be no more than 47 characters" in _one_error(job)
    assert len(dns1035_name("X" * 80, max_len=47)) == 47


@pytest.mark.parametrize(
    "mutate, field",
    [
        (
            lambda s: s.update(rayClusterSpec=build_raycluster(RayClusterConfig())["spec"]),
            "set exactly one of spec.rayClusterSpec and spec.clusterSelector",
        ),
        (lambda s: s.pop("clusterSelector"), "set exactly one of"),
        (
            lambda s: s.update(clusterSelector={"ray.io/cluster": ""}),
            "cluster name must not be empty",
        ),
        (
            lambda s: s.update(activeDeadlineSeconds=0),
            "spec.activeDeadlineSeconds: must be positive",
        ),
        (
            lambda s: s.update(runtimeEnvYAML="[a, b]"),
            "spec.runtimeEnvYAML: must be a YAML mapping",
        ),
        (lambda s: s.update(suspend=True), "spec.suspend: needs spec.shutdownAfterJobFinishes"),
    ],
)
def test_operator_checks_on_rayjobs(mutate, field):
    obj = _job()
    mutate(obj["spec"])
    assert field.replace("must be positive", "must be a positive integer") in " ".join(
        object_errors(obj)
    )


def test_bad_labels_are_rejected():
    obj = _cluster()
    obj["metadata"]["labels"]["etrain.io/job"] = "x" * 64
    assert "metadata.labels.etrain.io/job: label value" in _one_error(obj)


def test_validate_objects_raises_with_every_problem():
    a, b = _cluster(min_replicas=3, max_replicas=1), _job(name="Bad")
    with pytest.raises(ManifestError) as info:
        validate_objects([a, b])
    assert any("minReplicas (3)" in e for e in info.value.errors)
    assert any(e.startswith("RayJob/Bad:") for e in info.value.errors)


def test_rayjob_env_matches_the_ray_job_api_backend():
    job = _job(env={"ETRAIN_REPORT_URL": "http://x"})
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env == {"ETRAIN_JOB_ID": "j-1", "ETRAIN_JOB_SPEC": "{}", "ETRAIN_REPORT_URL": "http://x"}


def test_worker_range_parsing():
    assert parse_worker_range("2:16") == (2, 16)
    assert parse_worker_range("4") == (4, 4)
    for bad in ("16:2", "a:b", "0:0"):
        with pytest.raises(ValueError, match="worker range"):
            parse_worker_range(bad)


runner = CliRunner()


def test_cli_raycluster_prints_a_valid_sized_cluster():
    result = runner.invoke(
        app,
        [
            "manifests",
            "raycluster",
            "--gpus-per-node",
            "8",
            "--gpu-workers",
            "2:16",
            "--gpu-type",
            "NVIDIA-H100-80GB-HBM3",
        ],
    )
    assert result.exit_code == 0, result.output
    (obj,) = list(yaml.safe_load_all(result.stdout))
    validate_objects([obj])
    (group,) = obj["spec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"], group["replicas"]) == (2, 16, 2)
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_cli_raycluster_refuses_an_invalid_name():
    result = runner.invoke(app, ["manifests", "raycluster", "--name", "Not_Valid"])
    assert result.exit_code == 1
    assert "should be a valid DNS-1035 label" in result.output


@pytest.mark.parametrize("cluster", [None, "etrain"])
def test_cli_rayjob_from_an_example_spec(cluster):
    args = ["manifests", "rayjob", "examples/llama-7b-fsdp-8gpu.yaml"]
    result = runner.invoke(app, args + (["--cluster", cluster] if cluster else []))
    assert result.exit_code == 0, result.output
    (job,) = list(yaml.safe_load_all(result.stdout))
    validate_objects([job])
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    spec = json.loads(env["ETRAIN_JOB_SPEC"])
    assert spec["checkpoint"]["storage"] == "file:///var/lib/etrain/checkpoints"
    if cluster:
        assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "etrain"}
    else:
        (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        assert (group["minReplicas"], group["maxReplicas"]) == (8, 8)
        assert group["rayStartParams"] == {
            "num-cpus": "8",
            "metrics-export-port": "8080",
            "num-gpus": "1",
        }


def _ft_cluster() -> dict:
    return build_raycluster(RayClusterConfig(gcs_redis=GcsRedis()))


def _head_env(obj: dict, name: str, value: str) -> None:
    (head,) = obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    head.setdefault("env", []).append({"name": name, "value": value})


@pytest.mark.parametrize(
    "mutate, field",
    [
        (
            lambda o: o["metadata"].update(annotations={"ray.io/ft-enabled": "true"}),
            "metadata.annotations.ray.io/ft-enabled: use only spec.gcsFaultToleranceOptions",
        ),
        (
            lambda o: _head_env(o, "RAY_REDIS_ADDRESS", "redis:6379"),
            "env RAY_REDIS_ADDRESS: use spec.gcsFaultToleranceOptions.redisAddress",
        ),
        (
            lambda o: _head_env(o, "REDIS_PASSWORD", "x"),
            "env REDIS_PASSWORD: use spec.gcsFaultToleranceOptions.redisPassword",
        ),
        (
            lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].update({"redis-password": "x"}),
            "rayStartParams.redis-password: use spec.gcsFaultToleranceOptions.redisPassword",
        ),
        (
            lambda o: o["metadata"].update(annotations={"ray.io/external-storage-namespace": "ns"}),
            "use spec.gcsFaultToleranceOptions.externalStorageNamespace",
        ),
        (
            lambda o: _head_env(o, "REDIS_USERNAME", "u"),
            "set the Redis user in spec.gcsFaultToleranceOptions.redisUsername",
        ),
        (
            lambda o: o["spec"]["gcsFaultToleranceOptions"].update(backend="etcd"),
            "spec.gcsFaultToleranceOptions.backend",
        ),
    ],
)
def test_operator_checks_on_gcs_fault_tolerance(mutate, field):
    obj = _ft_cluster()
    assert object_errors(obj) == []
    mutate(obj)
    assert field in _one_error(obj)


def test_redis_set_by_env_alone_is_refused():
    obj = _cluster()
    _head_env(obj, "RAY_REDIS_ADDRESS", "redis:6379")
    assert "RAY_REDIS_ADDRESS needs spec.gcsFaultToleranceOptions" in _one_error(obj)
