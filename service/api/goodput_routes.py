"""REST route for a job's goodput (productive time over wall time, and where the rest went)."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter

from service.api.routes import Jobs, User
from service.domain.goodput import get_goodput

v1 = APIRouter(prefix="/v1")


@v1.get("/jobs/{job_id}/goodput")
def read_job_goodput(job_id: str, user: User, jobs: Jobs) -> dict:
    """Productive training time over wall time, with start-up, waiting, checkpoint
    blocking, restart/restore, recomputed steps and other time broken down (seconds)."""
    return dataclasses.asdict(get_goodput(jobs, user, job_id))
