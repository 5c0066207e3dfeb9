"""REST routes. Each parses, authorises, calls one domain function and shapes the answer."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from service.api import metrics as prom
from service.auth import Principal, authenticate, create_user_token, require_user
from service.domain.jobs import JobService, job_view, parse_body
from service.domain.states import JobStatus
from service.errors import Forbidden
from workers.spec import JobSpec

probes = APIRouter()
v1 = APIRouter(prefix="/v1")


def _runtime(request: Request):
    return request.app.state.runtime


def get_jobs(request: Request) -> JobService:
    """The job service of this app."""
    return _runtime(request).jobs


def get_principal(request: Request,
                  authorization: Annotated[str | None, Header()] = None) -> Principal:
    """Any valid token (user, admin or a job's reporter)."""
    return authenticate(_runtime(request).store, authorization)


def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """A user or admin token (not a job's reporter token)."""
    return require_user(principal)


User = Annotated[Principal, Depends(get_user)]
Jobs = Annotated[JobService, Depends(get_jobs)]

_SPEC_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": JobSpec.model_json_schema(by_alias=True)},
    "application/yaml": {"schema": {"type": "string"}}}}}


@probes.get("/healthz")
def healthz() -> dict:
    """Liveness: the process answers."""
    return {"status": "ok"}


@probes.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """Readiness: the store and the Ray backend both answer."""
    rt = _runtime(request)
    try:
        rt.store.ping()
        rt.backend.ping()
    except Exception as e:  # noqa: BLE001 - any failure means not ready
        return JSONResponse(status_code=503, content={"status": "unavailable",
                                                      "reason": type(e).__name__})
    return JSONResponse({"status": "ready"})


@probes.get("/metrics")
def read_prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics of the control plane."""
    return Response(prom.render(_runtime(request).store), media_type=CONTENT_TYPE_LATEST)


@v1.post("/jobs", status_code=201, openapi_extra=_SPEC_BODY)
async def create_job(request: Request, user: User, jobs: Jobs) -> dict:
    """Submit a job spec (JSON, or YAML with Content-Type: application/yaml)."""
    data = parse_body(await request.body(), request.headers.get("content-type"))
    # Off the event loop: submit may probe the job's object storage over the network.
    job = await run_in_threadpool(jobs.submit, user, data)
    prom.SUBMITTED.inc()
    return job_view(job)


@v1.get("/jobs")
def read_jobs(user: User, jobs: Jobs, status: JobStatus | None = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              offset: Annotated[int, Query(ge=0)] = 0) -> dict:
    """List the caller's jobs, newest first."""
    items, total = jobs.list(user, status=status, limit=limit, offset=offset)
    return {"items": [job_view(j) for j in items], "total": total}


@v1.get("/jobs/{job_id}")
def read_job(job_id: str, user: User, jobs: Jobs) -> dict:
    """One job with its latest metrics and its Ray dashboard links."""
    return jobs.detail(user, job_id)


@v1.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str, user: User, jobs: Jobs) -> dict:
    """Cancel a job; harmless on a job that already ended."""
    return job_view(jobs.cancel(user, job_id))


@v1.get("/jobs/{job_id}/logs", response_model=None)
def read_job_logs(job_id: str, user: User, jobs: Jobs,
                  follow: bool = False) -> PlainTextResponse | StreamingResponse:
    """Driver and worker logs; ``?follow=true`` streams until the job ends."""
    if follow:
        jobs.get(user, job_id)  # 404 before the stream starts
        return StreamingResponse(jobs.follow_logs(user, job_id), media_type="text/plain")
    return PlainTextResponse(jobs.logs(user, job_id))


@v1.get("/jobs/{job_id}/metrics")
def read_job_metrics(job_id: str, user: User, jobs: Jobs, after_step: int = -1) -> dict:
    """Per-step metrics (step, loss, lr, samples/s, tokens/s, world_size, ...)."""
    return {"items": jobs.metrics(user, job_id, after_step=after_step)}


@v1.get("/jobs/{job_id}/events")
def read_job_events(job_id: str, user: User, jobs: Jobs, after_id: int = 0) -> dict:
    """Lifecycle events in order."""
    return {"items": [dataclasses.asdict(e) for e in jobs.events(user, job_id, after_id=after_id)]}


@v1.get("/jobs/{job_id}/checkpoints")
def read_job_checkpoints(job_id: str, user: User, jobs: Jobs) -> dict:
    """Committed checkpoints: step, uri, bytes, save seconds."""
    return {"items": jobs.checkpoints(user, job_id)}


@v1.get("/jobs/{job_id}/memory")
def read_job_memory(job_id: str, user: User, jobs: Jobs) -> dict:
    """Per-rank memory the workers measured at their latest start (bytes of local shards)."""
    return jobs.memory(user, job_id)


@v1.post("/jobs/{job_id}/telemetry", include_in_schema=False)
async def create_job_telemetry(job_id: str, request: Request,
                               principal: Annotated[Principal, Depends(get_principal)],
                               jobs: Jobs) -> dict:
    """Metrics, events and checkpoints from a job's workers (reporter token only)."""
    batch = parse_body(await request.body(), "application/json")
    result = jobs.ingest_telemetry(principal, job_id, batch)
    prom.TELEMETRY_POINTS.inc(result["accepted"])
    return result


@v1.post("/plan")
async def create_plan(request: Request, user: User, jobs: Jobs) -> dict:
    """Dry run: memory per rank, layout, warnings, errors and a recommendation."""
    del user
    data = parse_body(await request.body(), request.headers.get("content-type"))
    return await run_in_threadpool(jobs.plan, data)  # may probe object storage


@v1.get("/cluster")
def read_cluster(user: User, jobs: Jobs) -> dict:
    """Ray nodes, resources and the dashboard URL."""
    del user
    return jobs.cluster()


class TokenRequest(BaseModel):
    """A new user token for a tenant."""

    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][-a-z0-9]*$",
                        description="Tenant name (created if new).")
    name: str = Field("token", max_length=64, description="A label for the token.")


@v1.post("/tokens", status_code=201)
def create_token(body: TokenRequest, user: User, request: Request) -> dict:
    """Admin only: create a tenant's API token. The token is shown only in this answer."""
    if user.role != "admin":
        raise Forbidden("only an admin token can create tokens")
    token = create_user_token(_runtime(request).store, tenant=body.tenant, name=body.name)
    return {"tenant": body.tenant, "name": body.name, "token": token}
