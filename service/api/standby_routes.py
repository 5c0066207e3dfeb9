"""The route a standby job driver asks for its job on (``service.domain.standby_jobs``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from service.api.deps import Standbys
from workers.contract import STANDBY_DONE_ROUTE, STANDBY_ROUTE

v1 = APIRouter(prefix="/v1")


class StandbyJob(BaseModel):
    """The job a standby driver runs: what a driver started for it gets in its environment."""

    job_id: str
    submission_id: str  # the job's own; its log lines in the standby's log are marked so
    spec_json: str  # the validated spec, checkpoint storage filled in
    env: dict[str, str]  # its reporter token and the object-store keys its spec names


@v1.get(
    STANDBY_ROUTE.removeprefix("/v1"),
    response_model=StandbyJob,
    responses={204: {"description": "No job yet: ask again"}},
)
async def read_standby_job(
    standby_id: str,
    standbys: Standbys,
    authorization: Annotated[str | None, Header()] = None,
    wait: Annotated[float, Query(ge=0, le=30)] = 20,
    memory: Annotated[int | None, Query(ge=0, le=2**50)] = None,
) -> Response:
    """For etrain's own standby job drivers (their standby token only): the job handed to
    this one, waiting up to ``wait`` seconds for it; 204 when none came. Its answer holds
    the job's credentials, once. ``memory``: bytes its processes hold (the driver's and
    the ones it warmed), shown in ``GET /v1/cluster``."""
    job = await run_in_threadpool(
        standbys.fetch, standby_id, authorization, wait_s=wait, memory_bytes=memory
    )
    if job is None:
        return Response(status_code=204)
    return JSONResponse(job, headers={"Cache-Control": "no-store"})


@v1.post(STANDBY_DONE_ROUTE.removeprefix("/v1"), status_code=204)
async def report_standby_done(
    standby_id: str,
    standbys: Standbys,
    authorization: Annotated[str | None, Header()] = None,
    submission_id: Annotated[str, Query(max_length=128)] = "",
) -> Response:
    """For etrain's own standby job drivers (their standby token only): the job this one
    ran (``submission_id``) succeeded; it then takes the next job it is handed."""
    await run_in_threadpool(standbys.done, standby_id, authorization, submission_id)
    return Response(status_code=204)
