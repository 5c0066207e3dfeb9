"""Elastic scaling that keeps the parallel layout, and says why a group changed size.

Ray Train's :class:`ElasticScalingPolicy` starts as many workers as the
cluster's reserved resources allow, between ``min_workers`` and ``max_workers``.
A tensor- or pipeline-parallel job can only use a multiple of ``tp x pp``
workers: the mesh is ``(pp, dp, tp)`` and only ``dp`` may change. This policy
rounds every count Ray would pick down to such a multiple (never below the
minimum), and says so: each decision it returns carries the job events (a resize, an
unused worker slot, a wait for resources) and job-log lines it has to report, and
:class:`workers.elastic.callbacks.ScalingReports` reports them from the Ray Train
controller.

A node that joins a running group is acted on at once (:mod:`workers.elastic.node_spares`):
warm spares start there, and the policy considers a resize on the next control-loop
iteration, and on each one after for ``JOIN_WINDOW_S``, from a reservation recomputed
from the live node list (the node's resources may take a moment to show), instead of
waiting for the resize monitor and the coordinator's 20 s view. A resize that grows the
group waits until the joined node's warm spares are ready (at most
``node_spares.SPARES_WAIT_S``): the running group trains meanwhile, and the grown one
starts in processes that have the training stack imported.
"""

from __future__ import annotations

import time

from ray.train import ScalingConfig

from workers.contract import EventKind
from workers.elastic.callbacks import ScalingReports
from workers.elastic.decisions import Decision, Noop, Notice, Resize
from workers.elastic.node_spares import SPARES_WAIT_S, NodeWatch
from workers.ray_compat import ElasticPolicyBase, ResizeDecision

JOIN_WINDOW_S = 30.0  # after a node joins, consider a resize on every iteration this long


def usable_workers(possible: int, *, unit: int, max_workers: int) -> int:
    """The most workers a layout of ``unit`` (tp x pp) ranks per dp replica can use."""
    n = min(possible, max_workers)
    return n - n % unit


def resize_message(before: int, after: int) -> str:
    """The event text for a worker group going from ``before`` to ``after`` workers."""
    cause = "node added" if after > before else "node lost"
    return f"resized {before} → {after} ({cause})"


class LayoutScalingPolicy(ElasticPolicyBase):
    """Ray Train's elastic policy, restricted to sizes that keep ``tp x pp`` intact.

    Runs inside the Ray Train controller (it is pickled there). ``decide_*`` return
    decisions with what they have to say attached; Ray's ``make_decision_*`` hand each
    to ``reports`` (:class:`ScalingReports`), which says it, and return it to Ray.
    """

    def __init__(self, scaling_config: ScalingConfig, *, unit: int, job_id: str):
        super().__init__(scaling_config)
        self.unit, self.job_id = unit, job_id
        self.reports = ScalingReports(job_id)
        self._size: int | None = None  # size of the latest group this policy started
        self._said: tuple | None = None  # last unused-slot or waiting notice (no repeats)
        self._waiting: set[str] = set()  # joined nodes whose spares a resize waits for
        self._heard: list[Notice] = []  # notices of the decision being made
        self.nodes = NodeWatch(
            max_workers=scaling_config.max_workers,
            cpus=scaling_config.num_cpus_per_worker,
            gpus=scaling_config.num_gpus_per_worker,
        )

    def make_decision_for_non_running_worker_group(self) -> Decision:
        """Ray's entry point: :meth:`decide_for_non_running_group`, reported."""
        return self.reports.report(self.decide_for_non_running_group())

    def make_decision_for_running_worker_group(
        self, worker_group_state, worker_group_status
    ) -> Decision:
        """Ray's entry point: :meth:`decide_for_running_group`, reported."""
        decision = self.decide_for_running_group(worker_group_state, worker_group_status)
        return self.reports.report(decision)

    def usable_workers(self, possible: int) -> int:
        """The largest multiple of tp x pp among the ``possible`` workers (a notice if less)."""
        usable = usable_workers(
            possible, unit=self.unit, max_workers=self.scaling_config.max_workers
        )
        if usable != possible:
            self._notice(
                ("unused", possible),
                EventKind.LAYOUT_UNUSED,
                f"{possible} workers could run; using {usable}: the layout needs a "
                f"multiple of parallelism.tp x parallelism.pp ({self.unit})",
                {"possible": possible, "used": usable, "unit": self.unit},
            )
        return usable

    def decide_for_non_running_group(self) -> Decision:
        """Start (or restart after a failure) at the largest usable size, or wait.

        The size comes from the reservation recomputed from the live node list: Ray's
        coordinator refreshes its node list every 20 s, and after a node dies a restart
        sized from that stale view asks for workers on the dead node and waits out the
        worker-group start timeout (once per stale view: 10 s in a measured node loss).
        A start pins workers to nodes, so it asks for a fresh view; a running group
        keeps Ray's cheap polling.
        """
        self._heard = []
        self.nodes.poll()
        self.refresh_reservation()
        decision = super().make_decision_for_non_running_worker_group()
        if isinstance(decision, ResizeDecision):
            self.nodes.resized()  # a restart places workers on every live node
            self._started(decision.num_workers)
        elif self._size is not None:
            self._notice(
                ("waiting",),
                EventKind.WAITING,
                f"waiting for resources: fewer than resources.workers.min "
                f"({self.scaling_config.min_workers}) workers can run",
                {"min_workers": self.scaling_config.min_workers},
            )
        return self._decided(decision)

    def decide_for_running_group(self, worker_group_state, worker_group_status) -> Decision:
        """Grow (or shrink) a healthy group when the usable size changed: every resize
        monitor interval, and on every iteration for ``JOIN_WINDOW_S`` after a node joined."""
        self._heard = []
        self.nodes.poll(worker_group_state.num_workers)
        lines, warming = self._spares_warming()
        if warming:  # a grow would start in them: train on meanwhile
            return Noop(log_lines=lines)
        joined = self.nodes.joined_at
        if joined is not None and time.monotonic() - joined < JOIN_WINDOW_S:
            self.skip_resize_interval()
            self.refresh_reservation()
        decision = super().make_decision_for_running_worker_group(
            worker_group_state, worker_group_status
        )
        if isinstance(decision, ResizeDecision):
            self.nodes.resized()
            self._size = worker_group_state.num_workers
            self._started(decision.num_workers)
        return self._decided(decision, lines)

    def _decided(self, decision, lines: tuple[str, ...] = ()) -> Decision:
        """Ray's ``decision`` with the notices heard while making it and ``lines``."""
        notices, self._heard = tuple(self._heard), []
        if isinstance(decision, ResizeDecision):
            return Resize(
                num_workers=decision.num_workers,
                resources_per_worker=decision.resources_per_worker,
                notices=notices,
                log_lines=lines,
            )
        return Noop(notices=notices, log_lines=lines)

    def _spares_warming(self) -> tuple[tuple[str, ...], bool]:
        """The job-log lines a joined node's warming spares call for (once as a wait
        starts, once as it ends), and whether any still import."""
        warming = self.nodes.warming()
        lines = [
            f"etrain: node {node_id[:8]} joined: resizing once its {left} warm spare(s) "
            f"are ready (at most {SPARES_WAIT_S:g} s); the group trains meanwhile"
            for node_id, left in warming.items()
            if node_id not in self._waiting
        ]
        lines += [self._wait_over(node_id) for node_id in self._waiting - warming.keys()]
        self._waiting = set(warming)
        return tuple(lines), bool(warming)

    def _wait_over(self, node_id: str) -> str:
        """The job-log line for the end of a wait for ``node_id``'s spares."""
        joined = self.nodes.joined_at
        waited = None if joined is None else time.monotonic() - joined
        if waited is None:
            how = "no longer waited for: the group restarted meanwhile, on every live node"
        elif waited >= SPARES_WAIT_S:
            how = f"not all ready after {SPARES_WAIT_S:g} s: resizing without waiting longer"
        else:
            how = f"ready {waited:.1f} s after it joined: resizing"
        return f"etrain: node {node_id[:8]}'s warm spares {how}"

    def _started(self, size: int) -> None:
        before, self._size, self._said = self._size, size, None
        if before is not None and before != size:
            self._heard.append(
                Notice(
                    EventKind.RESIZED,
                    resize_message(before, size),
                    {"from": before, "to": size, "ts": time.time()},
                    dedup="resize",
                )
            )

    def _notice(self, key: tuple, kind: EventKind, message: str, data: dict) -> None:
        if self._said != key:
            self._said = key
            self._heard.append(Notice(kind, message, data, dedup=f"{kind}"))
