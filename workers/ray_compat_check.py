"""The check that every use in :mod:`workers.ray_compat` still finds what it needs in the
installed Ray: one probe per use, named as the use is; ``tests/unit/workers/test_ray_compat.py``
runs them, so a Ray upgrade cannot break a use silently.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy

from workers.ray_compat import (
    PREEMPTION_WATCHER_ENV,
    RUN_ACTOR_MODULES,
    WORKER_MODULES,
    ControllerCallback,
    WorkerGroupCallback,
)

# --- the check ------------------------------------------------------------------------------


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _has_params(fn, *names: str) -> bool:
    return all(n in _params(fn) for n in names)


def _source_mentions(obj, *names: str) -> bool:
    source = inspect.getsource(obj)
    return all(n in source for n in names)


def _elastic_policy() -> bool:
    return (
        _has_params(ElasticScalingPolicy._count_possible_workers, "reserved_resources")
        and _params(ElasticScalingPolicy._get_reserved_resources) == ["self"]
        and _source_mentions(
            ElasticScalingPolicy.__init__,
            "self._latest_reserved_resources",
            "self._latest_reserved_resources_query_time",
            "self._latest_monitor_time",
        )
        and "self._latest_monitor_time" in inspect.getsource(ElasticScalingPolicy)
        and _source_mentions(
            ElasticScalingPolicy._get_reserved_resources,
            "self._autoscaling_coordinator",
            "self._requester_id",
            # refresh_reservation's view is read back from the cache Ray keeps this long
            "self.GET_RESERVED_RESOURCES_INTERVAL_S",
        )
        and ElasticScalingPolicy.GET_RESERVED_RESOURCES_INTERVAL_S > 0
    )


def _coordinator_recompute() -> bool:
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor,
    )

    return _has_params(
        _AutoscalingCoordinatorActor.get_reserved_resources, "requester_id", "recompute"
    )


def _trainer_seam() -> bool:
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.execution.controller import TrainController

    return _source_mentions(
        TorchTrainer._initialize_and_run_controller, "controller_init_kwargs"
    ) and _has_params(TrainController.__init__, "scaling_policy")


def _no_datasets_callback() -> bool:
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return isinstance(DatasetsCallback, type) and _source_mentions(
        DataParallelTrainer._create_default_callbacks, "DatasetsCallback(", "self.datasets"
    )


def _preemption_watcher_env() -> bool:
    from ray.train.v2._internal import constants
    from ray.train.v2._internal.execution.controller import controller

    return (
        constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR == PREEMPTION_WATCHER_ENV
        and PREEMPTION_WATCHER_ENV in constants.ENV_VARS_TO_PROPAGATE
        and _source_mentions(controller.TrainController.__init__, "ENABLE_PREEMPTION_WATCHER")
    )


def _controller_callback() -> bool:
    return _params(ControllerCallback.after_controller_start) == ["self", "train_run_context"]


def _worker_group_callback() -> bool:
    return (
        _params(WorkerGroupCallback.before_worker_group_start) == ["self", "worker_group_context"]
        and _params(WorkerGroupCallback.before_init_train_context) == ["self", "workers"]
        and _params(WorkerGroupCallback.after_worker_group_start) == ["self", "worker_group"]
    )


def _cancel_request() -> bool:
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor,
        get_or_create_autoscaling_coordinator,
    )

    return callable(get_or_create_autoscaling_coordinator) and _has_params(
        _AutoscalingCoordinatorActor.cancel_request, "requester_id"
    )


def _prestart() -> bool:
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    fields = set(node_manager_pb2.PrestartWorkersRequest.DESCRIPTOR.fields_by_name)
    return (
        {"language", "job_id", "runtime_env_info", "keep_alive_duration_secs", "num_workers"}
        <= fields
        and hasattr(node_manager_pb2_grpc.NodeManagerServiceStub, "__init__")
        and "PrestartWorkers" in inspect.getsource(node_manager_pb2_grpc.NodeManagerServiceStub)
        and _has_params(init_grpc_channel, "address", "options", "asynchronous")
    )


def _auth() -> bool:
    from ray._private.authentication.http_token_authentication import (
        get_auth_headers_if_auth_enabled,
    )

    return len(_params(get_auth_headers_if_auth_enabled)) >= 1


def _worker_runtime_env() -> bool:
    from ray.train.v2._internal.constants import get_env_vars_to_propagate
    from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return (
        callable(get_env_vars_to_propagate)
        and _source_mentions(
            DataParallelTrainer._initialize_and_run_controller,
            "get_env_vars_to_propagate",
            "DEFAULT_RAY_WARN_BLOCKING_GET_INSIDE_ASYNC_VALUE",
        )
        and _source_mentions(WorkerGroup._get_worker_runtime_env, "get_env_vars_to_propagate")
    )


def _setup_hook_env() -> bool:
    from ray._private.runtime_env.setup_hook import export_setup_func_module as export

    return _source_mentions(export, "env_vars[ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR]")


def _worker_modules() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in WORKER_MODULES)


def _run_actor_modules() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in RUN_ACTOR_MODULES)


def _train_singletons() -> bool:
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator
    from ray.train.v2._internal.state import state_actor

    return (
        _params(default_autoscaling_coordinator.get_or_create_autoscaling_coordinator) == []
        and _params(state_actor.get_or_create_state_actor) == []
    )


def _kv() -> bool:
    from ray.experimental import internal_kv

    return (
        _has_params(internal_kv._internal_kv_put, "key", "value", "namespace")
        and _has_params(internal_kv._internal_kv_del, "key", "del_by_prefix", "namespace")
        and _has_params(internal_kv._internal_kv_list, "prefix", "namespace")
    )


CHECKS: dict[str, Callable[[], bool]] = {
    "ElasticPolicyBase: ElasticScalingPolicy._count_possible_workers(reserved_resources), "
    "_get_reserved_resources() (serving its cache for GET_RESERVED_RESOURCES_INTERVAL_S), "
    "_latest_reserved_resources[_query_time], _latest_monitor_time, "
    "_autoscaling_coordinator, _requester_id": _elastic_policy,
    "ElasticPolicyBase: AutoscalingCoordinator.get_reserved_resources(requester_id, "
    "recompute=)": _coordinator_recompute,
    "trainer_class: TorchTrainer._initialize_and_run_controller(**controller_init_kwargs) -> "
    "TrainController(scaling_policy=)": _trainer_seam,
    "trainer_class: DataParallelTrainer._create_default_callbacks() adds DatasetsCallback "
    "for self.datasets": _no_datasets_callback,
    "PREEMPTION_WATCHER_ENV: ENABLE_PREEMPTION_WATCHER_ENV_VAR, propagated to the "
    "controller, read in TrainController.__init__": _preemption_watcher_env,
    "ControllerCallback.after_controller_start(train_run_context)": _controller_callback,
    "WorkerGroupCallback.before_worker_group_start(worker_group_context), "
    "before_init_train_context(workers), after_worker_group_start(worker_group)": (
        _worker_group_callback
    ),
    "cancel_reservation: get_or_create_autoscaling_coordinator().cancel_request("
    "requester_id=)": _cancel_request,
    "prestart_workers: raylet PrestartWorkers and init_grpc_channel": _prestart,
    "auth_headers: get_auth_headers_if_auth_enabled(headers)": _auth,
    "WORKER_MODULES importable": _worker_modules,
    "RUN_ACTOR_MODULES importable": _run_actor_modules,
    "create_train_singletons: get_or_create_autoscaling_coordinator(), "
    "get_or_create_state_actor()": _train_singletons,
    "train_worker_runtime_env: DataParallelTrainer and WorkerGroup._get_worker_runtime_env "
    "pass get_env_vars_to_propagate()": _worker_runtime_env,
    "kv_put / kv_delete / kv_count: internal_kv._internal_kv_put(key, value, namespace=), "
    "_internal_kv_del(key, del_by_prefix=, namespace=), _internal_kv_list(prefix, "
    "namespace=)": _kv,
    "setup_hook_of_this_job: export_setup_func_module puts the hook in "
    "WORKER_PROCESS_SETUP_HOOK_ENV_VAR": _setup_hook_env,
}


def check() -> list[str]:
    """The uses above that the installed Ray no longer supports, by name (empty: all fine)."""
    broken = []
    for name, probe in CHECKS.items():
        try:
            ok = probe()
        except Exception as e:  # noqa: BLE001 - a missing module or attribute is the finding
            ok, name = False, f"{name} ({type(e).__name__}: {e})"
        if not ok:
            broken.append(name)
    return broken
