"""Elastic scaling that keeps the parallel layout, and says why a group changed size.

Ray Train's :class:`ElasticScalingPolicy` starts as many workers as the
cluster's reserved resources allow, between ``min_workers`` and ``max_workers``.
A tensor- or pipeline-parallel job can only use a multiple of ``tp x pp``
workers: the mesh is ``(pp, dp, tp)`` and only ``dp`` may change. This policy
rounds every count Ray would pick down to such a multiple (never below the
minimum), and reports each resize, each unused worker slot and each wait for
resources as a job event from the Ray Train controller.
"""

from __future__ import annotations

import logging
import posixpath
import time

import ray
from ray.train import ScalingConfig
from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.train.v2._internal.execution.scaling_policy import (
    ElasticScalingPolicy,
    ResizeDecision,
    ScalingDecision,
)
from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
    AUTOSCALING_REQUESTS_GET_TIMEOUT_S as RESERVED_RESOURCES_TIMEOUT_S,
)
from ray.train.v2._internal.util import time_monotonic

from workers.telemetry import TelemetryReporter

log = logging.getLogger(__name__)


def usable_workers(possible: int, *, unit: int, max_workers: int) -> int:
    """The most workers a layout of ``unit`` (tp x pp) ranks per dp replica can use."""
    n = min(possible, max_workers)
    return n - n % unit


def resize_message(before: int, after: int) -> str:
    """The event text for a worker group going from ``before`` to ``after`` workers."""
    cause = "node added" if after > before else "node lost"
    return f"resized {before} → {after} ({cause})"


class LayoutScalingPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, restricted to sizes that keep ``tp x pp`` intact.

    Runs inside the Ray Train controller (it is pickled there), so its events
    go out through a reporter created lazily on that side.
    """

    def __init__(self, scaling_config: ScalingConfig, *, unit: int, job_id: str):
        super().__init__(scaling_config)
        self.unit, self.job_id = unit, job_id
        self._size: int | None = None  # size of the latest group this policy started
        self._said: tuple | None = None  # last unused-slot or waiting notice (no repeats)
        self._reporter: TelemetryReporter | None = None
        self._starting = False  # inside make_decision_for_non_running_worker_group

    def _count_possible_workers(self, reserved_resources) -> int:
        possible = super()._count_possible_workers(reserved_resources)
        usable = usable_workers(possible, unit=self.unit,
                                max_workers=self.scaling_config.max_workers)
        if usable != possible:
            self._notice(("unused", possible), "layout_unused",
                         f"{possible} workers could run; using {usable}: the layout needs a "
                         f"multiple of parallelism.tp x parallelism.pp ({self.unit})",
                         {"possible": possible, "used": usable, "unit": self.unit})
        return usable

    def make_decision_for_non_running_worker_group(self) -> ScalingDecision:
        """Start (or restart after a failure) at the largest usable size, or wait."""
        self._starting = True
        try:
            decision = super().make_decision_for_non_running_worker_group()
        finally:
            self._starting = False
        if isinstance(decision, ResizeDecision):
            self._started(decision.num_workers)
        elif self._size is not None:
            self._notice(("waiting",), "waiting",
                         f"waiting for resources: fewer than resources.workers.min "
                         f"({self.scaling_config.min_workers}) workers can run",
                         {"min_workers": self.scaling_config.min_workers})
        return decision

    def _get_reserved_resources(self):
        """The reservation, recomputed from the live node list when a group is about to start.

        Ray's coordinator refreshes its node list every 20 s. After a node dies,
        a restart sized from that stale view asks for workers on the dead node
        and waits out the worker-group start timeout (once per stale view: 10 s
        in a measured node loss). A start pins workers to nodes, so it asks for a
        fresh view, which Ray's coordinator offers for exactly this
        (``recompute=True``); a running group keeps Ray's cheap polling.
        """
        if not self._starting:
            return super()._get_reserved_resources()
        try:
            reserved = ray.get(self._autoscaling_coordinator.get_reserved_resources.remote(
                self._requester_id, recompute=True), timeout=RESERVED_RESOURCES_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - Ray's own polling is the fallback
            log.warning("recomputing the cluster reservation failed (%s); using Ray's view", e)
            return super()._get_reserved_resources()
        self._latest_reserved_resources = reserved
        self._latest_reserved_resources_query_time = time_monotonic()
        return reserved

    def make_decision_for_running_worker_group(self, worker_group_state,
                                               worker_group_status) -> ScalingDecision:
        """Grow (or shrink) a healthy group when the usable size changed."""
        decision = super().make_decision_for_running_worker_group(worker_group_state,
                                                                  worker_group_status)
        if isinstance(decision, ResizeDecision):
            self._size = worker_group_state.num_workers
            self._started(decision.num_workers)
        return decision

    def _started(self, size: int) -> None:
        before, self._size, self._said = self._size, size, None
        if before is not None and before != size:
            self._reporter_().event(
                "resized", resize_message(before, size),
                data={"from": before, "to": size, "ts": time.time()},
                dedup_key=f"resize:{time.time_ns()}")

    def _notice(self, key: tuple, kind: str, message: str, data: dict) -> None:
        if self._said != key:
            self._said = key
            self._reporter_().event(kind, message, data=data,
                                    dedup_key=f"{kind}:{time.time_ns()}")

    def _reporter_(self) -> TelemetryReporter:
        if self._reporter is None:
            self._reporter = TelemetryReporter.from_env(self.job_id)
        return self._reporter

    def __getstate__(self):
        return {**self.__dict__, "_reporter": None}



class ReleaseStaleReservation(ControllerCallback):
    """Cancel the cluster reservation an earlier run of this job left behind.

    Every Ray Train controller reserves its workers' resources with Ray's
    AutoscalingCoordinator (requester ``train-<run id>``) and cancels the
    reservation when it shuts down. A controller that dies with its driver
    (driver SIGKILLed, job resubmitted) cannot, and the reservation holds the
    resources for 180 s, so the resubmitted job would find no free workers for
    three minutes. The requester id of each run is kept in ``marker`` (in the
    job's storage); the next run cancels the one it finds there.
    """

    def __init__(self, marker_uri: str, checkpoint=None):
        """``marker_uri`` in the job's storage; ``checkpoint`` (the spec's section) says how
        to reach an object store (credentials come from the controller's environment)."""
        self.marker_uri, self.checkpoint = marker_uri, checkpoint

    def after_controller_start(self, train_run_context) -> None:
        """Cancel the previous run's reservation, then record this run's."""
        from workers.storage import resolve_checkpoint_storage, resolve_storage

        mine = f"train-{train_run_context.run_id}"  # as ScalingPolicy names it
        loc = (resolve_checkpoint_storage(self.checkpoint, uri=self.marker_uri)
               if self.checkpoint is not None else resolve_storage(self.marker_uri))
        try:
            previous = loc.fs.cat_file(loc.root).decode().strip()
        except (FileNotFoundError, OSError):
            previous = ""
        if previous and previous != mine:
            cancel_reservation(previous)
        loc.fs.makedirs(posixpath.dirname(loc.root), exist_ok=True)
        loc.fs.pipe_file(loc.root, mine.encode())  # one small write: whole or absent


def cancel_reservation(requester_id: str) -> None:
    """Ask Ray's AutoscalingCoordinator to drop ``requester_id``'s reservation (best effort)."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    try:
        ray.get(get_or_create_autoscaling_coordinator().cancel_request.remote(
            requester_id=requester_id), timeout=5)
    except Exception as e:  # noqa: BLE001 - it expires on its own after 180 s
        log.warning("could not cancel the stale reservation %s: %s", requester_id, e)
