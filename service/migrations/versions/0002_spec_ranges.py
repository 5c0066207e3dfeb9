"""Stored specs within the ranges job specs gained: worker counts, CPUs, steps, seeds, ...

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

This release bounds numbers a spec could set without limit (e.g. ``resources.workers``
<= 4096, ``resources.cpus_per_worker`` >= 0.01). A stored spec outside them could not
be read back, so each value outside its range is moved to the nearest bound, and a job
still QUEUED with such a spec is failed (it was never run; what it asked for is refused
now) with an error saying which fields to change. The ranges are written out here, as
they were in this release: a migration is history.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (section, field) -> (lowest, highest) as of this release.
RANGES: dict[tuple[str, str], tuple[float, float]] = {
    ("resources", "cpus_per_worker"): (0.01, 1024),
    ("data", "num_samples"): (1, 10**9),
    ("train", "steps"): (1, 10**9),
    ("train", "global_batch_size"): (1, 2**24),
    ("train", "micro_batch_size"): (1, 2**16),
    ("train", "warmup_steps"): (0, 10**9),
    ("train", "weight_decay"): (0, 10),
    ("train", "grad_clip"): (0, 1e6),
    ("train", "seed"): (0, 2**32 - 1),
    ("failure", "max_failures"): (-1, 10_000),
    ("failure", "max_resubmits"): (0, 1000),
    ("parallelism", "dp"): (1, 4096),
    ("parallelism", "tp"): (1, 4096),
    ("parallelism", "pp"): (1, 4096),
    ("checkpoint", "every_steps"): (1, 10**9),
    ("checkpoint", "every_seconds"): (0, 10**8),
    ("checkpoint", "mtbf_prior_s"): (0, 10**8),
    ("checkpoint", "keep_last"): (1, 100_000),
    ("checkpoint", "keep_every"): (1, 10**9),
}
MAX_WORKERS = 4096


def _clamp(value: Any, low: float, high: float) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return min(max(value, low), high)


def within_ranges(spec: dict) -> tuple[dict, list[str]]:
    """``spec`` with every value moved into its range, and the fields that moved."""
    spec = {k: dict(v) if isinstance(v, dict) else v for k, v in spec.items()}
    moved = []
    for (section, name), (low, high) in RANGES.items():
        part = spec.get(section)
        if isinstance(part, dict) and part.get(name) is not None:
            new = _clamp(part[name], low, high)
            if new != part[name]:
                part[name] = new
                moved.append(f"{section}.{name}")
    pipeline = (spec.get("parallelism") or {}).get("pipeline")
    if isinstance(pipeline, dict) and _clamp(pipeline.get("microbatches"), 1, 4096) != (
        pipeline.get("microbatches")
    ):
        spec["parallelism"]["pipeline"] = {**pipeline, "microbatches": 4096}
        moved.append("parallelism.pipeline.microbatches")
    resources = spec.get("resources")
    workers = resources.get("workers") if isinstance(resources, dict) else None
    if isinstance(workers, int) and workers > MAX_WORKERS:
        resources["workers"] = MAX_WORKERS
        moved.append("resources.workers")
    elif isinstance(workers, dict) and max(workers.get("min", 0), workers.get("max", 0)) > (
        MAX_WORKERS
    ):
        resources["workers"] = {k: min(v, MAX_WORKERS) for k, v in workers.items()}
        moved.append("resources.workers")
    return spec, moved


def upgrade() -> None:
    """Move stored specs into the ranges; fail QUEUED jobs whose spec had to move."""
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("status", sa.String),
        sa.column("spec", sa.JSON),
        sa.column("min_workers", sa.Integer),
        sa.column("error", sa.Text),
        sa.column("finished_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    conn = op.get_bind()
    now = dt.datetime.now(dt.UTC)
    query = sa.select(jobs.c.id, jobs.c.status, jobs.c.spec, jobs.c.min_workers)
    for row in conn.execute(query).all():
        spec, moved = within_ranges(row.spec or {})
        if not moved:
            continue
        values: dict[str, Any] = {"spec": spec, "updated_at": now}
        values["min_workers"] = min(row.min_workers, MAX_WORKERS)
        if row.status == "QUEUED":
            values |= {
                "status": "FAILED",
                "finished_at": now,
                "error": f"{', '.join(moved)} outside the ranges of this release; "
                "change them and submit the job again",
            }
        conn.execute(sa.update(jobs).where(jobs.c.id == row.id).values(**values))


def downgrade() -> None:
    """Nothing to undo: the moved values are within the old (unbounded) ranges too."""
