"""Every Ray API etrain uses that Ray does not publish, in one module.

etrain pins Ray (``RAY_VERSION``) and everything here was written against that
release. Nothing else in the project touches ``ray._private``, ``ray.core``,
``ray.data._internal`` or ``ray.train.v2._internal``, or overrides a Ray method
whose name starts with ``_``. ``workers.ray_compat_check.check`` verifies that each
use below still finds what it needs in the installed Ray, and names the one that
does not; ``tests/unit/workers/test_ray_compat.py`` runs it (and fails when the
installed Ray is not the pinned one), so a Ray upgrade cannot break these silently.

The uses, each with what it is for:

1. :class:`ElasticPolicyBase`: Ray Train's ``ElasticScalingPolicy`` with two seams
   on its private methods. ``_count_possible_workers`` is capped by
   :meth:`~ElasticPolicyBase.usable_workers` (etrain keeps tp x pp intact), and
   :meth:`~ElasticPolicyBase.refresh_reservation` asks the AutoscalingCoordinator for a
   view recomputed from the live node list (its ``recompute=True``), writing the
   policy's cached ``_latest_reserved_resources[_query_time]`` as Ray's own
   ``_get_reserved_resources`` does, which then answers the next decision from it;
   :meth:`~ElasticPolicyBase.skip_resize_interval` clears ``_latest_monitor_time``.
2. :func:`trainer_class`: a ``TorchTrainer`` that hands its controller another
   scaling policy through ``_initialize_and_run_controller(scaling_policy=...)``,
   the one seam Ray 2.60's ``DataParallelTrainer`` has for it, and that leaves Ray
   Train's ``DatasetsCallback`` out of ``_create_default_callbacks()`` when it has no
   Ray Datasets (etrain's workers read their data themselves): that callback starts a
   dataset-manager actor, a process of its own, for every worker group.
3. :data:`ControllerCallback`: Train V2's controller callback base (runs in the
   controller at start; etrain cancels a stale reservation there).
4. :func:`cancel_reservation`: the AutoscalingCoordinator actor's ``cancel_request``.
5. :func:`prestart_workers`: the raylet's ``PrestartWorkers`` gRPC call (warm spares).
6. :func:`auth_headers`: the token header Ray's own clients send to the dashboard's
   HTTP API (``/nodes``) when token auth is on.
7. :data:`WORKER_MODULES`: private modules a restarted Ray Train worker imports,
   which warm spares import ahead of time.
8. :data:`WorkerGroupCallback`: Train V2's worker-group callback base (runs in the
   controller around each group start; etrain timestamps the start's phases there).
9. :func:`train_worker_runtime_env`: the runtime environment Ray Train's worker actors
   will get, as the raylet matches it, so the driver can prestart their processes
   (``prestart_workers(runtime_env=...)``) before the controller asks for them.
10. :func:`setup_hook_of_this_job`: the job's ``worker_process_setup_hook`` (from the
   variable Ray reserves for it): the controller's sign that the job has warm spares.
11. :data:`RUN_ACTOR_MODULES`: the modules of Ray Train's own actors of a run (controller,
   placement-group cleaner, sync actor, state actor), which their prestarted processes
   import ahead of time.
12. :func:`create_train_singletons`: Ray Train's cluster-wide detached actors (its state
   actor and Ray Data's AutoscalingCoordinator), which the first run on a cluster would
   otherwise create, each in a new process, while it starts.
13. :func:`kv_put`, :func:`kv_delete`, :func:`kv_count`: Ray's GCS key-value store
   (``ray.experimental.internal_kv``), which every process of the cluster reaches: a
   warm spare records itself ready there, and the controller on another node counts them.
14. :data:`PREEMPTION_WATCHER_ENV`: Ray Train's switch for its preemption watcher, an
   actor (a process of its own) per worker group that polls the nodes for drain notices
   and relays them to the workers. etrain reads no such notice (a lost node is a failed
   group that it restarts, elastic or not), so its drivers turn the watcher off.

:func:`workers.ray_compat_check.check` probes each of them.

Importing this module imports Ray Train's scaling policy (not torch).
"""

from __future__ import annotations

import json
import logging

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2._internal.execution.scaling_policy import (
    ElasticScalingPolicy,
    NoopDecision,
    ResizeDecision,
    ScalingDecision,
)
from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
    AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
)
from ray.train.v2._internal.util import time_monotonic

from workers.contract import RAY_VERSION

log = logging.getLogger(__name__)

__all__ = [
    "PREEMPTION_WATCHER_ENV",
    "RAY_VERSION",
    "RUN_ACTOR_MODULES",
    "WORKER_MODULES",
    "ControllerCallback",
    "ElasticPolicyBase",
    "NoopDecision",
    "ResizeDecision",
    "ScalingDecision",
    "WorkerGroupCallback",
    "auth_headers",
    "cancel_reservation",
    "create_train_singletons",
    "prestart_workers",
    "setup_hook_of_this_job",
    "this_node",
    "train_worker_runtime_env",
    "trainer_class",
]

# (7) What a Ray Train worker imports before its first step after a restore, beyond
# torch and etrain: the worker actor's module, Ray Train's torch backend, and the Ray
# Tune module ``ray.train.get_context()`` imports on its first call (Ray Train's torch
# backend calls it as it sets up the process group: about 1 s inside a started worker).
WORKER_MODULES = (
    "ray.train.torch",
    "ray.train.v2._internal.execution.worker_group.worker",
    "ray.tune.trainable.trainable_fn_utils",
)
# (11) What Ray Train's own actors of a run import: each runs in a process of its own.
RUN_ACTOR_MODULES = (
    "ray.train.v2._internal.execution.controller.controller",
    "ray.train.v2._internal.execution.controller.placement_group_cleaner",
    "ray.train.v2._internal.execution.checkpoint.sync_actor",
    "ray.train.v2._internal.state.state_actor",
)
# (14) Read by the controller (from the driver's environment, which Ray Train passes on).
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


class ElasticPolicyBase(ElasticScalingPolicy):
    """(1) Ray Train's elastic scaling policy with etrain's two seams.

    Subclasses override :meth:`usable_workers` and call :meth:`refresh_reservation`
    before a decision that must see the live node list.
    """

    def usable_workers(self, possible: int) -> int:
        """How many of the ``possible`` workers to start (default: all of them)."""
        return possible

    def skip_resize_interval(self) -> None:
        """Let the next decision for a running group skip Ray's resize-monitor interval."""
        self._latest_monitor_time = float("-inf")

    def _count_possible_workers(self, reserved_resources) -> int:
        return self.usable_workers(super()._count_possible_workers(reserved_resources))

    def refresh_reservation(self) -> None:
        """Recompute the reservation from the live node list now and cache it as Ray's
        ``_get_reserved_resources`` does, so the next decision reads this view (not one up to
        the coordinator's 20 s node-list refresh old). On failure Ray's polling stays."""
        try:
            reserved = ray.get(
                self._autoscaling_coordinator.get_reserved_resources.remote(
                    self._requester_id, recompute=True
                ),
                timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
            )
        except Exception as e:  # noqa: BLE001 - Ray's own polling is the fallback
            log.warning("recomputing the cluster reservation failed (%s); using Ray's view", e)
            return
        self._latest_reserved_resources = reserved
        self._latest_reserved_resources_query_time = time_monotonic()


def trainer_class():
    """(2) ``TorchTrainer`` taking ``scaling_policy=``: None keeps the policy Ray builds;
    without ``datasets`` it runs no dataset manager."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    class EtrainTrainer(TorchTrainer):
        def __init__(self, *args, scaling_policy=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.etrain_scaling_policy = scaling_policy

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            if self.etrain_scaling_policy is not None:
                controller_init_kwargs["scaling_policy"] = self.etrain_scaling_policy
            return super()._initialize_and_run_controller(**controller_init_kwargs)

        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            if self.datasets:
                return callbacks
            return [cb for cb in callbacks if not isinstance(cb, DatasetsCallback)]

    return EtrainTrainer


def cancel_reservation(requester_id: str, *, timeout_s: float = 5.0) -> None:
    """(4) Drop ``requester_id``'s reservation in the AutoscalingCoordinator; raises on failure."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    ray.get(
        get_or_create_autoscaling_coordinator().cancel_request.remote(requester_id=requester_id),
        timeout=timeout_s,
    )


def prestart_workers(
    count: int, *, keep_alive_s: int, timeout_s: float = 10.0, runtime_env=None, node_id=None
) -> None:
    """(5) Ask the raylet of ``node_id`` (by default this process's node) for ``count`` idle
    worker processes of this job, with ``runtime_env`` (serialized; by default this
    process's own), so the next actors with it placed on that node run in them."""
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    from ray.core.generated import runtime_environment_pb2 as runtime_env_pb2

    ctx = ray.get_runtime_context()
    node = this_node(node_id)
    channel = init_grpc_channel(
        f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}", [], asynchronous=False
    )
    try:
        request = node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.PYTHON,
            job_id=bytes.fromhex(ctx.get_job_id()),
            runtime_env_info=runtime_env_pb2.RuntimeEnvInfo(
                serialized_runtime_env=runtime_env or ctx.get_runtime_env_string()
            ),
            keep_alive_duration_secs=keep_alive_s,
            num_workers=count,
        )
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
            request, timeout=timeout_s
        )
    finally:
        channel.close()


def this_node(node_id: str | None = None) -> dict:
    """Ray's entry for ``node_id`` (by default this process's node) in ``ray.nodes()``:
    its address, raylet port and total ``Resources``."""
    node_id = node_id or ray.get_runtime_context().get_node_id()
    return next(n for n in ray.nodes() if n["NodeID"] == node_id)


def train_worker_runtime_env(worker_runtime_env: dict) -> str:
    """(9) The serialized runtime environment of the worker actors a ``TorchTrainer`` fit
    from this driver starts with ``RunConfig(worker_runtime_env=worker_runtime_env)``.

    Ray Train gives its controller actor the variables of ``get_env_vars_to_propagate``
    (plus a ``RAY_WARN_BLOCKING_GET_INSIDE_ASYNC`` default) and each worker actor those
    again with the worker runtime env's; Ray merges an actor's environment variables into
    its parent's and serializes the result as compact JSON with sorted keys.
    """
    from ray._common.constants import RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR
    from ray.train.v2._internal.constants import (
        DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE,
        get_env_vars_to_propagate,
    )

    job = json.loads(ray.get_runtime_context().get_runtime_env_string() or "{}")
    controller = get_env_vars_to_propagate()
    controller.setdefault(
        RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_ENV_VAR, DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE
    )
    env_vars = {
        **job.get("env_vars", {}),
        **controller,
        **get_env_vars_to_propagate(),
        **worker_runtime_env.get("env_vars", {}),
    }
    merged = {**job, **worker_runtime_env, "env_vars": env_vars}
    return json.dumps(merged, sort_keys=True, separators=(",", ":"))


def setup_hook_of_this_job() -> str | None:
    """(10) The ``worker_process_setup_hook`` (module path) of this process's job, or None."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    env = json.loads(ray.get_runtime_context().get_runtime_env_string() or "{}")
    return env.get("env_vars", {}).get(WORKER_PROCESS_SETUP_HOOK_ENV_VAR)


def auth_headers() -> dict[str, str]:
    """(6) Headers that authenticate this process to a Ray dashboard's HTTP API (token auth
    from ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN(_PATH)``, as Ray's clients read it)."""
    from ray._private.authentication.http_token_authentication import (
        get_auth_headers_if_auth_enabled,
    )

    return get_auth_headers_if_auth_enabled({})


def create_train_singletons(*, state_tracking: bool) -> None:
    """(12) Ask Ray to create Ray Train's cluster-wide detached actors if they do not exist
    (without waiting for them): the AutoscalingCoordinator every run asks for its workers'
    resources and, with ``state_tracking`` (RAY_TRAIN_ENABLE_STATE_TRACKING), the state
    actor."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    get_or_create_autoscaling_coordinator()
    if state_tracking:
        from ray.train.v2._internal.state.state_actor import get_or_create_state_actor

        get_or_create_state_actor()


def kv_put(key: str, *, namespace: str) -> None:
    """(13) Store ``key`` (no value) in the cluster's GCS key-value store."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, b"", namespace=namespace)


def kv_delete(key: str, *, namespace: str, prefix: bool = False) -> None:
    """(13) Drop ``key`` (with ``prefix``: every key that starts with it)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, del_by_prefix=prefix, namespace=namespace)


def kv_count(prefix: str, *, namespace: str) -> int:
    """(13) How many keys in ``namespace`` start with ``prefix``."""
    from ray.experimental import internal_kv

    return len(internal_kv._internal_kv_list(prefix, namespace=namespace))
