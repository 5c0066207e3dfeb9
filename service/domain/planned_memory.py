"""What the planner predicts a job's ranks hold, for ``GET /v1/jobs/{id}/memory``.

The numbers are the planner's own (``service.planner``): the worst rank of the job's
layout at its current world size (the newest reported step's, else its minimum), sized
with the same workload (``model.hf``'s shape when the job names one) a submit plans with.
A job's spec never changes, so the answer is kept per job and world size.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

import service.planner.layout_rules as rules
from service.domain.model_source import ModelRefused, model_config_of
from service.planner.diffusion import planned_bytes
from service.planner.hardware import resolve_cluster
from service.planner.plan import PerRank
from service.planner.planning import layout_of, workload_of
from workers.spec import JobSpec

log = logging.getLogger(__name__)

# The kinds of bytes MemoryPublic.planned has (PerRank's, without buffers_bytes); beside
# them, the frozen parts by name as the workers measure them (``reference_bytes``).
PLANNED_FIELDS = (
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "total_bytes",
)


def planned_memory(spec: JobSpec, world: int, *, tenant: str = "") -> dict[str, int] | None:
    """The planner's per-rank bytes of ``spec`` at ``world`` workers (its worst rank);
    None when the job's model cannot be sized now (``model.hf`` unreadable)."""
    try:
        config = model_config_of(spec, tenant=tenant)
    except ModelRefused as e:
        log.info("no planned memory: %s", e)
        return None
    if spec.objective == "diffusion":
        return None if config is None else planned_bytes(spec, config, world)
    hw, _ = resolve_cluster({})  # device bytes do not depend on the hardware
    job = rules.evaluate(
        workload_of(spec, config),
        layout_of(spec, world),
        hw,
        gpus_per_worker=spec.resources.gpus_per_worker,
    )
    per_rank = PerRank.of(job)
    out = {name: getattr(per_rank, name) for name in PLANNED_FIELDS}
    reference = job.memory.detail["buffers"].get("dpo_reference_model")
    return out | ({"reference_bytes": reference} if reference else {})


class PlannedMemory:
    """:func:`planned_memory` of the ``size`` most recent (job, world size) pairs. A model
    that could not be sized is asked again only after ``retry_s`` (a page polling the
    memory of a job whose store does not answer must not wait on it every time)."""

    def __init__(self, size: int = 256, *, retry_s: float = 60.0):
        """Keep at most ``size`` answers."""
        self.size, self.retry_s = size, retry_s
        self._lock = threading.Lock()
        self._answers: OrderedDict[tuple[str, int], tuple[dict | None, float]] = OrderedDict()

    def of(self, job_id: str, spec: JobSpec, world: int, *, tenant: str = "") -> dict | None:
        """The planned bytes of job ``job_id`` (whose spec is ``spec``) at ``world``."""
        key, now = (job_id, world), time.monotonic()
        with self._lock:
            if key in self._answers:
                answer, at = self._answers[key]
                if answer is not None or now - at < self.retry_s:
                    self._answers.move_to_end(key)
                    return answer
        answer = planned_memory(spec, world, tenant=tenant)
        with self._lock:
            self._answers[key] = (answer, now)
            self._answers.move_to_end(key)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)
        return answer
