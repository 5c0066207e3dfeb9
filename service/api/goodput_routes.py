"""REST route for a job's goodput (productive time over wall time, and where the rest went)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import Queries, User
from service.api.schemas import GoodputPublic

v1 = APIRouter(prefix="/v1")


@v1.get("/jobs/{job_id}/goodput")
def read_job_goodput(job_id: str, user: User, queries: Queries) -> GoodputPublic:
    """Productive training time over wall time, with start-up, waiting, checkpoint
    blocking, restart/restore, recomputed steps and other time broken down (seconds)."""
    return GoodputPublic.model_validate(queries.goodput(user, job_id))
