"""Backend on KubeRay: each submission is a ray.io/v1 RayJob.

The RayJob runs the same driver with the same environment as the Ray-job-API
backend (``python -m workers.launch``, ``ETRAIN_JOB_ID``, ``ETRAIN_JOB_SPEC``,
the request's env), either on a shared RayCluster (``clusterSelector``) or on a
cluster of its own sized from the job's resources (``rayClusterSpec``). Every
object is validated before it is sent. Cancelling deletes the RayJob; the
operator's finalizer stops the Ray job. Logs come from the cluster's Ray job
API, through the same code as :class:`RayJobBackend`.

Tenants: a per-job cluster's pods get the job's storage credentials from its
tenant's Secret only (``<prefix>-<tenant>``, one ``secretKeyRef`` per variable
the job's storage reads) and mount only the tenant's folder of the checkpoint
claim (``subPath: <tenant>``). A shared cluster's pods hold no tenant's keys,
so a job that names a ``credentials_secret`` (``stores.s3``, ``metrics.mlflow``,
``metrics.wandb``) is refused there.

The control plane's RBAC needs: rayjobs create/get/list/watch/delete and
rayclusters get/list/watch, in its namespace (``deploy/base/rbac.yaml``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from service.backends.base import Backend, ClusterInfo, LaunchRequest, RunState, RunStatus
from service.backends.kuberay_capacity import raycluster_capacity
from service.backends.ray_jobs import RayJobBackend, dashboard_links_at
from service.errors import BackendError, BackendUnavailable
from service.k8s.manifests import (
    RayClusterConfig,
    RayJobConfig,
    build_rayjob,
    rayjob_name,
    worker_group_for_job,
)
from service.k8s.pod_security import (
    DEFAULT_STORAGE_SECRET_PREFIX,
    checkpoint_mount,
    tenant_storage_env,
)
from service.k8s.validate import ManifestError, validate_objects

GROUP, VERSION = "ray.io", "v1"
_JOB_STATES = {
    "SUCCEEDED": RunState.SUCCEEDED,
    "FAILED": RunState.FAILED,
    "STOPPED": RunState.STOPPED,
    "RUNNING": RunState.RUNNING,
}
_FAILED_DEPLOYMENTS = {"Failed", "ValidationFailed"}


def load_custom_objects_api():
    """A CustomObjectsApi from the in-cluster service account, else from kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as e:
            raise BackendUnavailable(
                f"no Kubernetes credentials: run in a pod or set KUBECONFIG ({e})"
            ) from e
    return client.CustomObjectsApi()


def map_rayjob_status(status: dict) -> RunStatus:
    """A RayJob's ``.status`` as a RunStatus (jobStatus first, then jobDeploymentStatus)."""
    job, deploy = status.get("jobStatus") or "", status.get("jobDeploymentStatus") or ""
    message = "; ".join(p for p in (deploy, status.get("reason"), status.get("message")) if p)
    if job in _JOB_STATES:
        return RunStatus(_JOB_STATES[job], message)
    if deploy in _FAILED_DEPLOYMENTS:
        return RunStatus(RunState.FAILED, message)
    if deploy in ("Suspended", "Complete"):
        # Complete without a Ray job status: the driver never reported one.
        return RunStatus(RunState.STOPPED if deploy == "Suspended" else RunState.FAILED, message)
    return RunStatus(RunState.PENDING, message)  # New, Initializing, Waiting, Retrying, ...


class KubeRayBackend(Backend):
    """Runs each submission as a RayJob in one namespace through the Kubernetes API."""

    def __init__(
        self,
        *,
        namespace: str,
        cluster_name: str | None = None,
        cluster_template: RayClusterConfig | None = None,
        dashboard_url: str | None = None,
        ttl_seconds_after_finished: int = 3600,
        active_deadline_seconds: int | None = None,
        quota: dict[str, float] | None = None,
        storage_secret_prefix: str = DEFAULT_STORAGE_SECRET_PREFIX,
        api_factory: Callable[[], Any] = load_custom_objects_api,
    ):
        self.namespace = namespace
        self.cluster_name = cluster_name
        self.template = cluster_template or RayClusterConfig(namespace=namespace)
        self.dashboard_url = dashboard_url.rstrip("/") if dashboard_url else None
        self.ttl = ttl_seconds_after_finished
        self.active_deadline = active_deadline_seconds
        self.quota = quota or {"CPU": 64.0, "GPU": 8.0}
        self.storage_secret_prefix = storage_secret_prefix
        self._api_factory, self._api_obj = api_factory, None

    def _api(self):
        if self._api_obj is None:
            self._api_obj = self._api_factory()
        return self._api_obj

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one API call; ApiException keeps its status, anything else is 'unavailable'."""
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except ApiException:
            raise
        except Exception as e:
            raise BackendUnavailable(f"Kubernetes API unreachable ({what}): {e}") from e

    # --- building -----------------------------------------------------------------------
    def build(self, req: LaunchRequest) -> dict:
        """The RayJob for ``req``, validated (raises BackendError if KubeRay would refuse it)."""
        if self.cluster_name:
            self._check_fits_shared_cluster(req)
        cluster = None if self.cluster_name else self._cluster_for(req)
        cfg = RayJobConfig(
            name=rayjob_name(req.submission_id),
            namespace=self.namespace,
            job_id=req.job_id,
            submission_id=req.submission_id,
            env=req.env,
            cluster_name=self.cluster_name,
            cluster=cluster,
            ttl_seconds_after_finished=self.ttl,
            active_deadline_seconds=self.active_deadline,
        )
        body = build_rayjob(cfg, spec_json=req.spec_json)
        try:
            validate_objects([body])
        except ManifestError as e:  # the messages name fields, never env values
            raise BackendError(f"RayJob for job {req.job_id} is invalid: {e}") from e
        return body

    def _check_fits_shared_cluster(self, req: LaunchRequest) -> None:
        """Refuse a job that needs a tenant's keys: the shared cluster's pods hold none."""
        spec = _spec(req)
        sections = {
            "stores.s3": spec.stores.s3,
            **{f"metrics.{name}": getattr(spec.metrics, name) for name in ("mlflow", "wandb")},
        }
        named = [
            f"{k}.credentials_secret" for k, v in sections.items() if v and v.credentials_secret
        ]
        if named:
            raise BackendError(
                f"{' and '.join(named)} needs a RayCluster per job: the shared "
                f"RayCluster {self.cluster_name} holds no tenant's storage keys (unset "
                "ETRAIN_RAYCLUSTER_NAME, Helm controlPlane.sharedCluster=false)"
            )

    def _cluster_for(self, req: LaunchRequest) -> RayClusterConfig:
        """A RayCluster of the template's image, sized from the job's resources, that sees
        only the job's tenant's checkpoint folder and storage Secret."""
        spec = _spec(req)
        if not req.tenant:
            raise BackendError(f"job {req.job_id} has no tenant: cannot scope its RayCluster")
        try:
            checkpoint_mount(req.tenant)  # the tenant's folder must be one folder name
            storage_env = tenant_storage_env(  # every store the spec names
                req.tenant, spec, prefix=self.storage_secret_prefix
            )
        except ValueError as e:
            raise BackendError(str(e)) from e
        res = spec.resources
        template = self.template.worker_groups[0]
        group = worker_group_for_job(
            min_workers=res.min_workers,
            max_workers=res.max_workers,
            gpus_per_worker=res.gpus_per_worker,
            cpus_per_worker=res.cpus_per_worker,
            template=template,
        )
        return dataclasses.replace(
            self.template,
            namespace=self.namespace,
            worker_groups=(group,),
            checkpoint_subpath=req.tenant if self.template.checkpoint_claim else None,
            storage_env=storage_env,
        )

    def dashboard_job_url(self, submission_id: str) -> str:
        """Link to the job's page in the Ray dashboard (``kuberay://`` when none is known)."""
        base = self.dashboard_url or self._cluster_dashboard()
        if base is None:
            return f"kuberay://{self.namespace}/rayjobs/{rayjob_name(submission_id)}"
        return f"{base}/#/jobs/{submission_id}"

    def dashboard_links(self, submission_id: str) -> dict[str, str]:
        """Ray job page and Train run list (only the ``kuberay://`` job when no URL is known)."""
        base = self.dashboard_url or self._cluster_dashboard()
        if base is None:
            return {"job": self.dashboard_job_url(submission_id)}
        return dashboard_links_at(base, submission_id)

    def _cluster_dashboard(self) -> str | None:
        if not self.cluster_name:
            return None  # a per-job cluster's name is only known once KubeRay made it
        return f"http://{self.cluster_name}-head-svc.{self.namespace}.svc.cluster.local:8265"

    # --- Backend ------------------------------------------------------------------------
    def submit(self, req: LaunchRequest) -> str:
        """Create the RayJob; an existing one for this submission id is not an error."""
        from kubernetes.client.exceptions import ApiException

        body = self.build(req)
        try:
            self._call(
                "create rayjob",
                lambda: self._api().create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "rayjobs", body
                ),
            )
        except ApiException as e:
            if e.status != 409:
                raise _translate(e, f"create RayJob {body['metadata']['name']}") from e
        return self.dashboard_job_url(req.submission_id)

    def _get_rayjob(self, submission_id: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        name = rayjob_name(submission_id)
        try:
            return self._call(
                "get rayjob",
                lambda: self._api().get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "rayjobs", name
                ),
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise _translate(e, f"read RayJob {name}") from e

    def status(self, submission_id: str) -> RunStatus:
        """Follow ``.status.jobStatus`` / ``.status.jobDeploymentStatus``; MISSING if gone."""
        obj = self._get_rayjob(submission_id)
        if obj is None:
            return RunStatus(
                RunState.MISSING,
                f"RayJob {rayjob_name(submission_id)} not found in namespace {self.namespace}",
            )
        return map_rayjob_status(obj.get("status") or {})

    def stop(self, submission_id: str) -> None:
        """Delete the RayJob (KubeRay stops the Ray job); an absent one is left alone."""
        from kubernetes.client.exceptions import ApiException

        name = rayjob_name(submission_id)
        try:
            self._call(
                "delete rayjob",
                lambda: self._api().delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "rayjobs", name, propagation_policy="Foreground"
                ),
            )
        except ApiException as e:
            if e.status != 404:
                raise _translate(e, f"delete RayJob {name}") from e

    def _ray_jobs(self, submission_id: str) -> RayJobBackend:
        """The Ray job API of the cluster running ``submission_id``."""
        obj = self._get_rayjob(submission_id)
        url = ((obj or {}).get("status") or {}).get("dashboardURL") or ""
        if not url and self.cluster_name:
            url = self._cluster_dashboard() or ""
        if not url:
            raise BackendUnavailable(f"no Ray dashboard known yet for {submission_id}")
        return RayJobBackend(url if re.match(r"^https?://", url) else f"http://{url}")

    def logs(self, submission_id: str) -> str:
        """The driver log, read from the cluster's Ray job API."""
        return self._ray_jobs(submission_id).logs(submission_id)

    async def tail_logs(self, submission_id: str) -> AsyncIterator[str]:
        """Stream the driver log until the job ends."""
        async for chunk in self._ray_jobs(submission_id).tail_logs(submission_id):
            yield chunk

    def cluster(self) -> ClusterInfo:
        """Capacity at full scale-out: the shared RayCluster's groups at maxReplicas, or the
        quota."""
        if not self.cluster_name:
            node = {
                "node_id": "kuberay-per-job",
                "ip": None,
                "is_head": False,
                "resources": dict(self.quota),
            }
            return ClusterInfo(
                nodes=[node],
                total=dict(self.quota),
                available=dict(self.quota),
                dashboard_url=self.dashboard_url,
            )
        return raycluster_capacity(
            self._get_raycluster(), dashboard_url=self.dashboard_url or self._cluster_dashboard()
        )

    def _get_raycluster(self) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(
                "get raycluster",
                lambda: self._api().get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "rayclusters", self.cluster_name
                ),
            )
        except ApiException as e:
            if e.status == 404:
                raise BackendUnavailable(
                    f"RayCluster {self.cluster_name} not found in namespace "
                    f"{self.namespace}: apply deploy/ or set "
                    "ETRAIN_RAYCLUSTER_NAME"
                ) from e
            raise _translate(e, f"read RayCluster {self.cluster_name}") from e

    def ping(self) -> None:
        """Raise BackendUnavailable unless the API answers (and the shared cluster exists)."""
        from kubernetes.client.exceptions import ApiException

        if self.cluster_name:
            self._get_raycluster()
            return
        try:
            self._call(
                "list rayjobs",
                lambda: self._api().list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "rayjobs", limit=1
                ),
            )
        except ApiException as e:
            raise _translate(e, "list RayJobs") from e


def _spec(req: LaunchRequest):
    """The request's job spec; a spec that does not validate is a BackendError."""
    try:
        return req.spec
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise BackendError(f"cannot build a RayJob from this spec: {e}") from e


def _translate(e, what: str) -> Exception:
    """An ApiException as a domain error: auth and server trouble is 'unavailable'."""
    reason = f"{what}: HTTP {e.status} {e.reason}"
    if e.status in (401, 403) or e.status is None or e.status >= 500:
        return BackendUnavailable(f"Kubernetes API refused to {reason}")
    return BackendError(f"Kubernetes API refused to {reason}")
