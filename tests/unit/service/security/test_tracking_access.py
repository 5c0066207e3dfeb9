"""What a tenant's metrics.mlflow / metrics.wandb may name: its own secrets only (like
stores.s3.credentials_secret), the tracking servers the operator lists (when it lists any),
a file: store inside its checkpoint area; and how the secrets reach the job's pods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.backends.base import LaunchRequest
from service.backends.kuberay import KubeRayBackend
from service.domain.access_policy import AccessPolicy, Tenant
from service.errors import BackendError
from service.k8s.pod_security import tenant_storage_env
from service.settings.slices import PolicySettings
from tests.unit.k8s.fake_kube import FakeCustomObjectsApi
from workers.spec import JobSpec

A = Tenant("team-a")
MLFLOW = {"tracking_uri": "https://mlflow.example.com", "experiment": "llama"}
WANDB = {"project": "llama", "mode": "offline"}


def _policy(tmp_path: Path, **kw) -> AccessPolicy:
    settings = {
        "data_dir": tmp_path,
        "checkpoint_root": None,
        "data_root": None,
        "shared_data_roots": (),
        "admin_roots": (Path("/"),),
        "object_stores": {},
        "endpoints": {},
        "secrets": {},
        "ambient_credentials": (),
        "admin_any_store": True,
        "tracking_uris": {},
        **kw,
    }
    return AccessPolicy(PolicySettings(**settings))


def _spec(**metrics) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "metrics": metrics})


def _refusals(policy, spec, tenant=A) -> dict:
    return {".".join(field): msg for field, msg in policy.refusals(tenant, spec)}


@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
def test_a_tenant_names_only_its_own_tracking_secret(tmp_path, tracker):
    policy = _policy(tmp_path)
    base = MLFLOW if tracker == "mlflow" else WANDB
    own = _spec(**{tracker: {**base, "credentials_secret": "team-a"}})
    assert _refusals(policy, own) == {}
    other = _spec(**{tracker: {**base, "credentials_secret": "team-b"}})
    field = f"metrics.{tracker}.credentials_secret"
    assert _refusals(policy, other) == {
        field: f"{field} 'team-b' is not a secret tenant 'team-a' may use; use one of: "
        "team-a (ETRAIN_POLICY_SECRETS)"
    }
    assert (
        _refusals(
            _policy(tmp_path, secrets={"*": ["shared"]}),
            _spec(**{tracker: {**base, "credentials_secret": "shared"}}),
        )
        == {}
    )
    assert _refusals(policy, other, Tenant("admin", admin=True)) == {}


def test_the_operator_may_list_the_tracking_servers(tmp_path):
    spec = _spec(mlflow=MLFLOW)
    assert _refusals(_policy(tmp_path), spec) == {}  # none listed: any http(s) server
    listed = _policy(tmp_path, tracking_uris={"*": ["https://mlflow.internal/"]})
    why = _refusals(listed, spec)["metrics.mlflow.tracking_uri"]
    assert "is not a tracking server tenant 'team-a' may use" in why
    assert "ETRAIN_POLICY_TRACKING_URIS" in why
    under = _spec(mlflow={**MLFLOW, "tracking_uri": "https://mlflow.internal/team-a"})
    assert _refusals(listed, under) == {}
    prefix_trick = _spec(mlflow={**MLFLOW, "tracking_uri": "https://mlflow.internal.evil"})
    assert "metrics.mlflow.tracking_uri" in _refusals(listed, prefix_trick)


def test_a_file_store_lies_inside_the_tenants_checkpoint_area(tmp_path):
    policy = _policy(tmp_path)
    inside = f"file://{tmp_path}/checkpoints/team-a/mlflow"
    assert _refusals(policy, _spec(mlflow={**MLFLOW, "tracking_uri": inside})) == {}
    for outside in (f"file://{tmp_path}/checkpoints/team-b/mlflow", "file:///etc/mlflow"):
        why = _refusals(policy, _spec(mlflow={**MLFLOW, "tracking_uri": outside}))
        assert "metrics.mlflow.tracking_uri" in why["metrics.mlflow.tracking_uri"]


def test_per_job_pods_get_the_tracking_keys_from_the_tenants_secret_all_optional():
    spec = _spec(
        mlflow={**MLFLOW, "credentials_secret": "team-a"},
        wandb={**WANDB, "credentials_secret": "team-a"},
    )
    env = tenant_storage_env("team-a", spec)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env}
    assert list(refs) == [
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_TOKEN",
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_USERNAME",
        "ETRAIN_SECRET_TEAM_A_MLFLOW_TRACKING_PASSWORD",
        "ETRAIN_SECRET_TEAM_A_WANDB_API_KEY",
    ]
    assert all(r["name"] == "etrain-storage-team-a" and r["optional"] for r in refs.values())
    assert tenant_storage_env("team-a", _spec(mlflow=MLFLOW)) == ()


def test_the_shared_cluster_refuses_a_tracking_secret():
    api = FakeCustomObjectsApi()
    backend = KubeRayBackend(namespace="etrain", api_factory=lambda: api, cluster_name="etrain")
    spec = {"name": "t", "metrics": {"wandb": {**WANDB, "credentials_secret": "team-a"}}}
    request = LaunchRequest(
        job_id="j-1", submission_id="etrain-j-1-0", spec_json=json.dumps(spec), tenant="team-a"
    )
    with pytest.raises(
        BackendError, match=r"metrics\.wandb\.credentials_secret needs a RayCluster"
    ):
        backend.submit(request)
