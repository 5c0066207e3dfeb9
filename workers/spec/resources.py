"""``resources``: how many workers a job runs on (a count, or an elastic range) and what
each asks of the cluster."""

from __future__ import annotations

from typing import Annotated

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from workers.spec.base import MAX_WORKERS, Spec


class WorkerRange(Spec):
    """An elastic worker range: the job uses what the cluster offers between min and max."""

    min: int = Field(ge=1, le=MAX_WORKERS, description="Fewest workers the job runs with.")
    max: int = Field(ge=1, le=MAX_WORKERS, description="Most workers the job uses.")

    @model_validator(mode="after")
    def _ordered(self) -> WorkerRange:
        if self.min > self.max:
            raise ValueError(
                f"resources.workers.min ({self.min}) must be <= resources.workers.max ({self.max})"
            )
        return self


# Tagged so a bad range reports one error at resources.workers.range, not an extra
# "should be a valid integer" and a loc holding pydantic's validator name.
Workers = Annotated[
    Annotated[Annotated[int, Field(le=MAX_WORKERS)], Tag("count")]
    | Annotated[WorkerRange, Tag("range")],
    Discriminator(lambda v: "range" if isinstance(v, (dict, WorkerRange)) else "count"),
]


class ResourcesSpec(Spec):
    """What each worker asks of the cluster."""

    workers: Workers = Field(
        2, description=f"Fixed worker count, or {{min, max}} for an elastic job; <= {MAX_WORKERS}."
    )
    gpus_per_worker: int = Field(0, ge=0, le=16, description="GPUs per worker; 0 = CPU (gloo).")
    cpus_per_worker: float = Field(
        1.0, ge=0.01, le=1024, description="CPUs per worker; may be fractional (>= 0.01)."
    )

    @field_validator("workers")
    @classmethod
    def _positive(cls, v: int | WorkerRange) -> int | WorkerRange:
        if isinstance(v, int) and v < 1:
            raise ValueError("resources.workers must be >= 1, or {min, max} with min >= 1")
        return v

    @property
    def min_workers(self) -> int:
        """Fewest workers the job may run with."""
        return self.workers if isinstance(self.workers, int) else self.workers.min

    @property
    def max_workers(self) -> int:
        """Most workers the job may use."""
        return self.workers if isinstance(self.workers, int) else self.workers.max
