"""KubeRayBackend against a fake CustomObjectsApi: RayJobs created, followed, deleted."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from service.backends.base import LaunchRequest, RunState
from service.backends.factory import build_backend
from service.backends.kuberay import KubeRayBackend, map_rayjob_status
from service.errors import BackendError, BackendUnavailable
from service.k8s.manifests import RayClusterConfig, build_raycluster
from service.settings import Settings
from tests.unit.k8s.fake_kube import FakeCustomObjectsApi

NS = "etrain"
SECRET = "tok-0123456789abcdef"


def _spec(workers, gpus=1, cpus=4):
    return json.dumps(
        {
            "name": "llama-fsdp",
            "parallelism": {"strategy": "fsdp"},
            "resources": {"workers": workers, "gpus_per_worker": gpus, "cpus_per_worker": cpus},
            "train": {"global_batch_size": 48, "micro_batch_size": 1},
        }
    )


def _req(sub="etrain-j-0a1b2c3d4e5f-0", workers=None):
    return LaunchRequest(
        job_id="j-0a1b2c3d4e5f",
        submission_id=sub,
        spec_json=_spec(workers or {"min": 2, "max": 4}),
        env={"ETRAIN_REPORT_URL": "http://etrain.etrain.svc:8000", "ETRAIN_REPORT_TOKEN": SECRET},
        tenant="team-a",
    )


@pytest.fixture
def api():
    return FakeCustomObjectsApi()


def _backend(api, **kw):
    return KubeRayBackend(namespace=NS, api_factory=lambda: api, **kw)


def _only_rayjob(api):
    ((_key, obj),) = [(k, v) for k, v in api.objects.items() if k[0] == "rayjobs"]
    return obj


def test_submit_on_shared_cluster_uses_cluster_selector(api):
    backend = _backend(api, cluster_name="etrain")
    url = backend.submit(_req())
    job = _only_rayjob(api)
    assert job["metadata"]["name"] == "etrain-j-0a1b2c3d4e5f-0"
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "etrain"}
    assert "rayClusterSpec" not in job["spec"]
    assert job["spec"]["entrypoint"] == "exec python -m workers.launch"
    assert job["spec"]["jobId"] == "etrain-j-0a1b2c3d4e5f-0"
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["ETRAIN_JOB_ID"] == "j-0a1b2c3d4e5f"
    assert json.loads(env["ETRAIN_JOB_SPEC"])["resources"]["workers"] == {"min": 2, "max": 4}
    assert env["ETRAIN_REPORT_TOKEN"] == SECRET
    assert url == (
        "http://etrain-head-svc.etrain.svc.cluster.local:8265/#/jobs/etrain-j-0a1b2c3d4e5f-0"
    )


def test_submit_without_cluster_embeds_one_sized_from_the_job(api):
    backend = _backend(
        api,
        ttl_seconds_after_finished=600,
        active_deadline_seconds=86400,
        dashboard_url="http://localhost:8265/",
    )
    url = backend.submit(_req(workers={"min": 2, "max": 4}))
    spec = _only_rayjob(api)["spec"]
    assert "clusterSelector" not in spec
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 600
    assert spec["activeDeadlineSeconds"] == 86400
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (2, 4)
    assert group["rayStartParams"]["num-gpus"] == "1"
    assert group["rayStartParams"]["num-cpus"] == "4"
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert url == "http://localhost:8265/#/jobs/etrain-j-0a1b2c3d4e5f-0"


def test_submit_is_idempotent_per_submission(api):
    backend = _backend(api, cluster_name="etrain")
    backend.submit(_req())
    backend.submit(_req())
    assert len([k for k in api.objects if k[0] == "rayjobs"]) == 1


def test_submit_refuses_an_object_kuberay_would_reject(api):
    backend = _backend(
        api,
        cluster_template=RayClusterConfig(name="etrain", image=""),
        active_deadline_seconds=None,
    )
    backend.active_deadline = -5  # activeDeadlineSeconds must be positive
    with pytest.raises(BackendError, match="activeDeadlineSeconds") as info:
        backend.submit(_req())
    assert SECRET not in str(info.value)
    assert not api.objects


@pytest.mark.parametrize(
    "status, state",
    [
        ({}, RunState.PENDING),
        ({"jobDeploymentStatus": "Initializing"}, RunState.PENDING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "PENDING"}, RunState.PENDING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, RunState.RUNNING),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, RunState.SUCCEEDED),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "FAILED"}, RunState.FAILED),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, RunState.STOPPED),
        ({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, RunState.FAILED),
        ({"jobDeploymentStatus": "ValidationFailed", "message": "bad spec"}, RunState.FAILED),
        ({"jobDeploymentStatus": "Suspended"}, RunState.STOPPED),
    ],
)
def test_status_mapping(status, state):
    assert map_rayjob_status(status).state == state


def test_status_follows_the_object_and_missing_when_gone(api):
    backend = _backend(api, cluster_name="etrain")
    req = _req()
    backend.submit(req)
    api.set_status(
        "rayjobs",
        NS,
        "etrain-j-0a1b2c3d4e5f-0",
        {
            "jobDeploymentStatus": "Failed",
            "reason": "DeadlineExceeded",
            "message": "the RayJob has passed the activeDeadlineSeconds",
        },
    )
    got = backend.status(req.submission_id)
    assert got.state == RunState.FAILED and "DeadlineExceeded" in got.message
    backend.stop(req.submission_id)
    assert ("delete", "rayjobs", NS, "etrain-j-0a1b2c3d4e5f-0") in api.calls
    assert backend.status(req.submission_id).state == RunState.MISSING
    backend.stop(req.submission_id)  # already gone: not an error


def test_long_submission_ids_give_valid_stable_names(api):
    backend = _backend(api, cluster_name="etrain")
    sub = "etrain-" + "J" * 60 + "-12"
    backend.submit(_req(sub=sub))
    name = _only_rayjob(api)["metadata"]["name"]
    assert len(name) <= 47 and name == name.lower()
    assert backend.status(sub).state == RunState.PENDING


def test_api_errors_are_translated(api):
    backend = _backend(api, cluster_name="etrain")
    api.fail_with = ApiException(status=403, reason="Forbidden")
    with pytest.raises(BackendUnavailable, match="403"):
        backend.status("etrain-x-0")
    api.fail_with = ApiException(status=422, reason="Invalid")
    with pytest.raises(BackendError, match="422"):
        backend.submit(_req())
    api.fail_with = ConnectionRefusedError("connection refused")
    with pytest.raises(BackendUnavailable, match="unreachable"):
        backend.ping()


def test_cluster_reports_capacity_at_max_replicas(api):
    cluster = build_raycluster(RayClusterConfig())  # 1 group: 0..4 pods x 8 GPU, 32 CPU
    api.objects[("rayclusters", NS, "etrain")] = cluster
    info = _backend(api, cluster_name="etrain").cluster()
    assert info.total == {"CPU": 4 * 32.0, "GPU": 32.0}  # the head has num-cpus "0"
    assert sum(1 for n in info.nodes if not n["is_head"]) == 4
    _backend(api, cluster_name="etrain").ping()
    with pytest.raises(BackendUnavailable, match="RayCluster other not found"):
        _backend(api, cluster_name="other").ping()


def test_per_job_clusters_report_the_quota(api):
    info = _backend(api, quota={"CPU": 16.0, "GPU": 4.0}).cluster()
    assert info.total == {"CPU": 16.0, "GPU": 4.0}
    _backend(api).ping()
    assert api.calls[-1][0] == "list"


def test_logs_go_through_the_clusters_ray_job_api(api, monkeypatch):
    backend = _backend(api, cluster_name="etrain")
    backend.submit(_req())
    api.set_status(
        "rayjobs",
        NS,
        "etrain-j-0a1b2c3d4e5f-0",
        {"dashboardURL": "etrain-head-svc.etrain.svc.cluster.local:8265"},
    )
    seen = {}

    def fake_logs(self, submission_id):
        seen["address"], seen["id"] = self.address, submission_id
        return "step 1 loss 2.0\n"

    monkeypatch.setattr("service.backends.ray_jobs.RayJobBackend.logs", fake_logs)
    assert backend.logs("etrain-j-0a1b2c3d4e5f-0") == "step 1 loss 2.0\n"
    assert seen == {
        "address": "http://etrain-head-svc.etrain.svc.cluster.local:8265",
        "id": "etrain-j-0a1b2c3d4e5f-0",
    }


def test_factory_selects_kuberay_from_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("ETRAIN_BACKEND", "kuberay")
    monkeypatch.setenv("ETRAIN_K8S_NAMESPACE", "ml")
    monkeypatch.setenv("ETRAIN_RAYCLUSTER_NAME", "gpu-pool")
    backend, embedded = build_backend(Settings(data_dir=tmp_path).ray)
    assert isinstance(backend, KubeRayBackend) and embedded is None
    assert (backend.namespace, backend.cluster_name) == ("ml", "gpu-pool")


def test_dashboard_links_of_shared_configured_and_per_job_clusters(api):
    sub = "etrain-j-0a1b2c3d4e5f-0"
    shared = _backend(api, cluster_name="etrain").dashboard_links(sub)
    head = "http://etrain-head-svc.etrain.svc.cluster.local:8265"
    assert shared == {"job": f"{head}/#/jobs/{sub}", "train_runs": f"{head}/api/train/v2/runs/v1"}
    configured = _backend(api, dashboard_url="http://localhost:8265/").dashboard_links(sub)
    assert configured == {
        "job": f"http://localhost:8265/#/jobs/{sub}",
        "train_runs": "http://localhost:8265/api/train/v2/runs/v1",
    }
    # A per-job cluster's dashboard is only known once KubeRay made it.
    assert _backend(api).dashboard_links(sub) == {"job": f"kuberay://{NS}/rayjobs/{sub}"}
    assert api.calls == []  # links cost no Kubernetes API call
