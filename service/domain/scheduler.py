"""Admission policy: which queued jobs may start now. Pure: decides, does not act."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    """What a job needs to start: its minimum workers times per-worker resources."""

    job_id: str
    cpus: float
    gpus: float

    @classmethod
    def for_spec(
        cls, job_id: str, *, min_workers: int, cpus_per_worker: float, gpus_per_worker: int
    ) -> Demand:
        """The demand of a job spec's minimum worker count."""
        return cls(
            job_id, cpus=min_workers * cpus_per_worker, gpus=float(min_workers * gpus_per_worker)
        )


@dataclass(frozen=True)
class AdmissionDecision:
    """The jobs to submit now (in order) and why the first of the rest waits."""

    admit: tuple[str, ...]
    waiting_reason: str | None = None


def decide_admissions(
    queued: list[Demand], *, free_cpus: float, free_gpus: float
) -> AdmissionDecision:
    """First in, first out: admit queued jobs in order while their minimum fits.

    The first job that does not fit blocks the ones behind it, so a large job
    is not starved by a stream of small ones.
    """
    admit: list[str] = []
    for d in queued:
        if d.cpus > free_cpus + 1e-9 or d.gpus > free_gpus + 1e-9:
            return AdmissionDecision(
                tuple(admit),
                waiting_reason=(
                    f"waiting for resources: needs {d.cpus:g} CPU / {d.gpus:g} GPU, "
                    f"free {free_cpus:g} CPU / {free_gpus:g} GPU"
                ),
            )
        free_cpus -= d.cpus
        free_gpus -= d.gpus
        admit.append(d.job_id)
    return AdmissionDecision(tuple(admit))
