"""Per-job Prometheus series, fed by the telemetry the domain has just stored.

Every series carries a ``job_id`` label; ``/metrics`` serves them only to a scrape
with an admin token, or to any when the operator turns ETRAIN_METRICS_JOB_LABELS on.
Gauges are set from what the store holds after a batch (the job's newest metric
point, its newest checkpoint), so a replayed batch writes the same values again;
counters only move for events the store newly inserted (``add_event``
de-duplicates on ``dedup_key``).

Cardinality: a job's series are removed at the first scrape at least
``ended_grace_s`` after a scrape first saw the job ended (or gone), so
Prometheus still reads the final values, and the series held at any time are
those of live jobs plus those that ended in the last few minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from service.errors import JobNotFound
from service.store import JobStore
from workers.contract import EventKind, MetricPoint

LABEL = "job_id"  # not "job": Prometheus' scrape config owns that label
_BLOCKING = "etrain_job_checkpoint_blocking_seconds"


def _point_gauges(**gauges: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """Gauge name and help by MetricPoint field; a key that is no field fails at import,
    so a field renamed in the contract cannot leave a gauge silently unset."""
    unknown = sorted(set(gauges) - set(MetricPoint.model_fields))
    if unknown:
        raise TypeError(f"{unknown} are not fields of workers.contract.MetricPoint")
    return gauges


_POINT_GAUGES = _point_gauges(
    step=("etrain_job_step", "Newest reported training step"),
    step_time_s=("etrain_job_step_time_seconds", "Wall time of the newest reported step"),
    samples_per_s=("etrain_job_samples_per_second", "Training throughput in samples"),
    tokens_per_s=("etrain_job_tokens_per_second", "Training throughput in tokens"),
    world_size=("etrain_job_world_size", "Train workers in the newest reported step"),
    loss=("etrain_job_loss", "Training loss of the newest reported step"),
    eval_loss=("etrain_job_eval_loss", "Held-out loss of the newest evaluation"),
    eval_perplexity=(
        "etrain_job_eval_perplexity",
        "Held-out perplexity (exp of the loss) of the newest evaluation",
    ),
    rewards_accuracy=(
        "etrain_job_rewards_accuracy",
        "Objective dpo: share of the newest step's pairs whose chosen answer has the higher reward",
    ),
    rewards_margin=(
        "etrain_job_rewards_margin",
        "Objective dpo: mean chosen - rejected reward of the newest step's pairs",
    ),
)
# The store keeps these on a job's newest point until a restore goes back before the
# evaluation; a point without them means there is none, so their series go.
_EVAL_GAUGES = frozenset({"eval_loss", "eval_perplexity"})
# Event kind -> counter name (exported with the _total suffix) and help.
_EVENT_COUNTERS = {
    EventKind.WORKER_FAILED.value: (
        "etrain_job_restarts",
        "Worker-group restarts (worker_failed events)",
    ),
    EventKind.RESIZED.value: (
        "etrain_job_resizes",
        "Elastic resizes of the worker group (resized events)",
    ),
}


class JobMetrics:
    """Gauges and counters labelled by job id, registered on ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        ended_grace_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ended_grace_s = ended_grace_s
        self._clock = clock
        self._gauges = {
            key: Gauge(name, text, [LABEL], registry=registry)
            for key, (name, text) in _POINT_GAUGES.items()
        }
        self._counters = {
            kind: Counter(name, text, [LABEL], registry=registry)
            for kind, (name, text) in _EVENT_COUNTERS.items()
        }
        self._checkpoint_blocking = Gauge(
            _BLOCKING,
            "Seconds training waited for the newest committed checkpoint",
            [LABEL],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._jobs: set[str] = set()
        self._ended_since: dict[str, float] = {}

    @staticmethod
    def families() -> frozenset[str]:
        """Names of the metric families labelled by job id."""
        named = (*_POINT_GAUGES.values(), *_EVENT_COUNTERS.values(), (_BLOCKING, ""))
        return frozenset(name for name, _ in named)

    def _track(self, job_id: str) -> None:
        with self._lock:
            if job_id in self._jobs:
                return
            self._jobs.add(job_id)
        for counter in self._counters.values():
            counter.labels(job_id)  # export 0 from the start, so increase() sees the first one

    def observe_point(self, job_id: str, point: Mapping) -> None:
        """Set the gauges from the job's newest stored metric point. A missing key leaves
        its gauge as it was, but for the evaluation's, whose series are removed."""
        self._track(job_id)
        for key, gauge in self._gauges.items():
            value = point.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                gauge.labels(job_id).set(value)
            elif key in _EVAL_GAUGES and value is None:
                gauge.remove(job_id)

    def count_event(self, job_id: str, kind: str) -> None:
        """Count one newly stored event (only the kinds that have a counter)."""
        self._track(job_id)
        if kind in self._counters:
            self._counters[kind].labels(job_id).inc()

    def observe_checkpoint(self, job_id: str, blocking_s: float | None) -> None:
        """Set the blocking seconds of the job's newest committed checkpoint."""
        self._track(job_id)
        if blocking_s is not None:
            self._checkpoint_blocking.labels(job_id).set(blocking_s)

    def tracked(self) -> set[str]:
        """Job ids that have series now."""
        with self._lock:
            return set(self._jobs)

    def forget(self, job_id: str) -> None:
        """Remove every series of ``job_id``."""
        with self._lock:
            self._jobs.discard(job_id)
            self._ended_since.pop(job_id, None)
        for metric in (*self._gauges.values(), *self._counters.values(), self._checkpoint_blocking):
            metric.remove(job_id)

    def prune(self, store: JobStore) -> list[str]:
        """Forget jobs that ended (or vanished) ``ended_grace_s`` ago or more; return their ids."""
        now, removed = self._clock(), []
        for job_id in sorted(self.tracked()):
            try:
                ended = store.get_job(job_id).status.terminal
            except JobNotFound:
                ended = True
            if not ended:
                continue
            with self._lock:
                since = self._ended_since.setdefault(job_id, now)
            if now - since >= self.ended_grace_s:
                self.forget(job_id)
                removed.append(job_id)
        return removed
