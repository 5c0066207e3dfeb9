"""Ray Train controller callbacks: worker failures as job events, what the scaling
policy's decisions say, the cluster reservation a killed earlier run of the job left
behind, and the timestamps of each worker group's start."""

from __future__ import annotations

import logging
import posixpath
import sys
import time

from ray.train import UserCallback

from workers.contract import EventKind
from workers.elastic.decisions import Decision
from workers.ray_compat import ControllerCallback, WorkerGroupCallback, cancel_reservation
from workers.telemetry.reporter import TelemetryReporter
from workers.warm.startup_times import note_group_times, process_start_time

log = logging.getLogger(__name__)


class EventCallback(UserCallback):
    """Reports worker-group failures (and the restart that follows) to the control plane.

    Runs in the Ray Train controller, not on the workers, so a worker killed
    mid-step is still reported.
    """

    def __init__(self, job_id: str):
        self.job_id = job_id
        self._reporter: TelemetryReporter | None = None

    def _get_reporter(self) -> TelemetryReporter:
        # Created lazily on the controller: the callback object is pickled there.
        if self._reporter is None:
            self._reporter = TelemetryReporter.from_env(self.job_id)
        return self._reporter

    def after_exception(self, run_context, worker_exceptions: dict) -> None:
        """Record which ranks failed and why; Ray Train then restarts the group."""
        ranks = sorted(worker_exceptions)
        first = worker_exceptions[ranks[0]] if ranks else None
        # Ray's messages run to many lines of actor metadata; the first says what happened.
        detail = str(first).strip().splitlines()[0][:200] if first else ""
        reason = f"{type(first).__name__}: {detail}" if first else "unknown"
        self._get_reporter().event(
            EventKind.WORKER_FAILED,
            f"worker(s) {ranks} failed: {reason}",
            data={"ranks": ranks},
            dedup_key=f"fail:{time.time_ns()}",
        )

    def __getstate__(self):
        return {"job_id": self.job_id, "_reporter": None}


class ScalingReports:
    """Says what each decision of the scaling policy carries: its job-log lines on the
    controller's stderr (the job's log, which tests and bench/recovery.py read), then its
    events to the control plane.

    Runs in the Ray Train controller with the policy, which hands it every decision
    (:class:`workers.elastic.scaling.LayoutScalingPolicy`): Ray's controller calls its
    callbacks back only for the resizes it executes, not for the decisions to keep
    training or keep waiting that most notices belong to.
    """

    def __init__(self, job_id: str):
        self.job_id = job_id
        self._reporter: TelemetryReporter | None = None

    def report(self, decision: Decision) -> Decision:
        """Say what ``decision`` carries; return it."""
        for line in decision.log_lines:
            print(line, file=sys.stderr, flush=True)
        for notice in decision.notices:
            self._get_reporter().event(
                notice.kind,
                notice.message,
                data=notice.data,
                dedup_key=f"{notice.dedup}:{time.time_ns()}",
            )
        return decision

    def _get_reporter(self) -> TelemetryReporter:
        # Created lazily on the controller: the policy holding this is pickled there.
        if self._reporter is None:
            self._reporter = TelemetryReporter.from_env(self.job_id)
        return self._reporter

    def __getstate__(self):
        return {"job_id": self.job_id, "_reporter": None}


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

    def __init__(self, marker_uri: str, stores=None):
        """``marker_uri`` in the job's storage; ``stores`` (the spec's section) says how
        to reach an object store (credentials come from the controller's environment)."""
        self.marker_uri, self.stores = marker_uri, stores

    def after_controller_start(self, train_run_context) -> None:
        """Cancel the previous run's reservation, then record this run's."""
        from workers.storage.location import resolve_store

        mine = f"train-{train_run_context.run_id}"  # as ScalingPolicy names it
        loc = resolve_store(self.marker_uri, self.stores)
        try:
            previous = loc.fs.cat_file(loc.root).decode().strip()
        except (FileNotFoundError, OSError):
            previous = ""
        if previous and previous != mine:
            try:
                cancel_reservation(previous)
            except Exception as e:  # noqa: BLE001 - it expires on its own after 180 s
                log.warning("could not cancel the stale reservation %s: %s", previous, e)
        loc.fs.makedirs(posixpath.dirname(loc.root), exist_ok=True)
        loc.fs.pipe_file(loc.root, mine.encode())  # one small write: whole or absent


class StartupTimes(ControllerCallback, WorkerGroupCallback):
    """Runs in the Ray Train controller: timestamps its own start and each worker group's
    and hands them to the group's workers (one short call per worker, once per start)."""

    def __init__(self):
        self._times: dict[str, float] = {}
        self._controller: dict[str, float] = {}

    def __setstate__(self, state: dict) -> None:
        """Unpickled: in the controller, before it creates Ray Train's other actors, whose
        processes then skip the torch import the controller's needs (or in a worker, once
        the controller is up). Either way no process of this run started later on this
        node is the controller."""
        self.__dict__.update(state)
        from workers.warm.spares import mark_controller

        mark_controller()

    def after_controller_start(self, train_run_context) -> None:
        """The controller actor is up and starts its run."""
        self._controller = {"controller_start": time.time()}
        started = process_start_time()  # long before: a process started ahead for it
        if started is not None:
            self._controller["controller_process"] = started

    def before_worker_group_start(self, worker_group_context) -> None:
        """The group is about to ask for its placement group."""
        self._times = {**self._controller, "group_start": time.time()}

    def before_init_train_context(self, workers) -> dict:
        """The group's actors are alive."""
        self._times["actors_ready"] = time.time()
        return {}

    def after_worker_group_start(self, worker_group) -> None:
        """Ray Train's callbacks before this one set up the backend (the process group)."""
        self._times["backend_ready"] = time.time()
        worker_group.execute(note_group_times, dict(self._times))
