"""Ray token auth and fast node-failure detection in every RayCluster etrain builds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from service.backends.base import LaunchRequest
from service.backends.embedded import FAST_NODE_FAILURE_ENV
from service.backends.factory import build_kuberay_backend
from service.backends.kuberay import KubeRayBackend
from service.cli import app
from service.k8s.manifests import (
    DEFAULT_RAY_AUTH_SECRET,
    RayClusterConfig,
    RayJobConfig,
    build_raycluster,
    build_rayjob,
)
from service.k8s.validate import ManifestError, object_errors, validate_objects
from service.settings import Settings
from tests.unit.k8s.fake_kube import FakeCustomObjectsApi

ROOT = Path(__file__).resolve().parents[3]
TOKEN_SECRET_CMD = (
    "kubectl create secret generic etrain-ray-token -n etrain "
    "--from-literal=auth_token=$(openssl rand -hex 32)"
)


def _head_env(spec: dict) -> dict[str, str]:
    (head,) = spec["headGroupSpec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in head.get("env", [])}


def test_raycluster_runs_with_token_auth_from_the_named_secret():
    spec = build_raycluster(RayClusterConfig())["spec"]
    assert DEFAULT_RAY_AUTH_SECRET == "etrain-ray-token"
    assert spec["authOptions"] == {"mode": "token", "secretName": "etrain-ray-token"}
    custom = build_raycluster(RayClusterConfig(auth_secret="team-a-token"))["spec"]
    assert custom["authOptions"]["secretName"] == "team-a-token"
    assert "authOptions" not in build_raycluster(RayClusterConfig(auth_secret=None))["spec"]


def test_token_auth_needs_a_ray_version_that_has_it():
    obj = build_raycluster(RayClusterConfig(ray_version="2.50.0"))
    assert object_errors(obj) == [
        "RayCluster/etrain: spec.rayVersion: token auth needs Ray >= 2.52.0, got 2.50.0"
    ]
    validate_objects([build_raycluster(RayClusterConfig(ray_version="2.50.0", auth_secret=None))])


def test_per_job_cluster_of_a_rayjob_has_token_auth():
    job = build_rayjob(
        RayJobConfig(
            name="train-1",
            namespace="etrain",
            job_id="j-1",
            submission_id="train-1",
            env={},
            cluster=RayClusterConfig(),
        ),
        spec_json="{}",
    )
    validate_objects([job])
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {
        "mode": "token",
        "secretName": "etrain-ray-token",
    }


def test_only_the_head_gets_the_fast_node_failure_settings():
    spec = build_raycluster(RayClusterConfig())["spec"]
    assert FAST_NODE_FAILURE_ENV == {
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_failure_threshold": "3",
    }
    assert _head_env(spec) == FAST_NODE_FAILURE_ENV
    for group in spec["workerGroupSpecs"]:
        (worker,) = group["template"]["spec"]["containers"]
        assert "env" not in worker


def test_kuberay_backend_gives_per_job_clusters_the_configured_secret(monkeypatch, tmp_path):
    monkeypatch.setenv("ETRAIN_BACKEND", "kuberay")
    monkeypatch.setenv("ETRAIN_K8S_RAY_AUTH_SECRET", "team-a-token")
    backend = build_kuberay_backend(Settings(data_dir=tmp_path).kuberay)
    assert backend.template.auth_secret == "team-a-token"
    monkeypatch.setenv("ETRAIN_K8S_RAY_AUTH_SECRET", "")
    assert build_kuberay_backend(Settings(data_dir=tmp_path).kuberay).template.auth_secret is None
    monkeypatch.delenv("ETRAIN_K8S_RAY_AUTH_SECRET")
    assert (
        build_kuberay_backend(Settings(data_dir=tmp_path).kuberay).template.auth_secret
        == "etrain-ray-token"
    )

    api = FakeCustomObjectsApi()
    spec = json.dumps({"name": "tiny", "resources": {"workers": {"min": 1, "max": 2}}})
    KubeRayBackend(
        namespace="etrain",
        api_factory=lambda: api,
        cluster_template=RayClusterConfig(auth_secret="team-a-token"),
    ).submit(
        LaunchRequest(job_id="j-1", submission_id="etrain-j-1-0", spec_json=spec, tenant="team-a")
    )
    (job,) = api.objects.values()
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": "team-a-token"}
    assert _head_env(cluster) == FAST_NODE_FAILURE_ENV


runner = CliRunner()


@pytest.mark.parametrize(
    "args, secret",
    [([], "etrain-ray-token"), (["--auth-secret", "mine"], "mine"), (["--auth-secret", ""], None)],
)
def test_cli_sets_or_drops_token_auth(args, secret):
    for command in (
        ["manifests", "raycluster"],
        ["manifests", "rayjob", "examples/llama-7b-fsdp-8gpu.yaml"],
    ):
        result = runner.invoke(app, command + args)
        assert result.exit_code == 0, result.output
        (obj,) = list(yaml.safe_load_all(result.stdout))
        spec = obj["spec"].get("rayClusterSpec", obj["spec"])
        assert spec.get("authOptions") == (
            {"mode": "token", "secretName": secret} if secret else None
        )


def test_a_bad_auth_mode_is_rejected_naming_the_field():
    obj = build_raycluster(RayClusterConfig())
    obj["spec"]["authOptions"]["mode"] = "password"
    with pytest.raises(ManifestError, match=re.escape("spec.authOptions.mode")):
        validate_objects([obj])


def test_docs_say_how_to_create_the_token_secret_and_why_fast_failure():
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert TOKEN_SECRET_CMD in text
    assert text.index(TOKEN_SECRET_CMD) < text.index("kubectl apply -k my-etrain/")
    assert "RAY_health_check_period_ms" in text and "RAY_health_check_failure_threshold" in text
