"""REST routes. Each parses, authorises, calls one domain function and shapes the answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from service.api import openapi
from service.api import prometheus as prom
from service.api.cluster_schemas import ClusterPublic
from service.api.deps import (
    Caller,
    Cluster,
    Ingest,
    JobSeries,
    Lifecycles,
    Monitor,
    Queries,
    StoreCalls,
    Submissions,
    User,
)
from service.api.parsing import read_body
from service.api.schemas import (
    CheckpointPage,
    CheckpointPublic,
    EventPage,
    EventPublic,
    Health,
    JobDetail,
    JobPage,
    JobPages,
    JobPublic,
    MemoryPublic,
    MetricPage,
    NotReady,
    Ready,
    TelemetryAccepted,
)
from service.planner import ClusterSpec, Plan
from service.status import JobStatus
from workers.contract import TELEMETRY_ROUTE, TelemetryBatch
from workers.spec import JobSpec

probes = APIRouter()
v1 = APIRouter(prefix="/v1")

_V1 = v1.prefix
# Bound of integer query parameters: the largest value a database integer holds.
MAX_INT = 2**63 - 1
# The JSON of listed jobs, as of their updated_at (process-wide: job ids are unique).
PAGES = JobPages()
# Bodies the routes decode themselves (JSON, or YAML); app.create_app documents them.
BODY_MODELS = (JobSpec, ClusterSpec, TelemetryBatch)
_PLAN_REQUEST = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": openapi.ref(JobSpec),
        "cluster": {**openapi.ref(ClusterSpec), "description": "Default: the connected cluster."},
    },
}


def _text(media_type: str, description: str) -> dict:
    """OpenAPI for a 200 answered as text of ``media_type``."""
    return {
        200: {"description": description, "content": {media_type: {"schema": {"type": "string"}}}}
    }


@probes.get("/healthz")
def healthz() -> Health:
    """Liveness: the process answers."""
    return Health()


@probes.get("/readyz", response_model=Ready, responses={503: {"model": NotReady}})
def readyz(monitoring: Monitor) -> Ready | JSONResponse:
    """Readiness: the store answers and the backend can accept a job now;
    ``ready_for_fast_start`` says whether it would start at warm speed."""
    reason = monitoring.not_ready()
    if reason is not None:
        return JSONResponse(status_code=503, content=NotReady(reason=reason).model_dump())
    role, leader = monitoring.role()
    return Ready(ready_for_fast_start=monitoring.ready_for_fast_start(), role=role, leader=leader)


@probes.get(
    "/metrics",
    response_class=Response,
    responses=_text(CONTENT_TYPE_LATEST, "The Prometheus text exposition format."),
)
def read_prometheus_metrics(monitoring: Monitor, with_jobs: JobSeries) -> Response:
    """Prometheus metrics of the control plane. Per-job series (labelled job_id) only to a
    scrape with an admin token, unless ETRAIN_METRICS_JOB_LABELS is on."""
    scrape = monitoring.scrape()
    body = prom.render(scrape, with_jobs=with_jobs, loop=monitoring.loop_load())
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@v1.post(
    "/jobs",
    status_code=201,
    response_model=JobPublic,
    openapi_extra=openapi.body(openapi.ref(JobSpec)),
)
async def create_job(
    request: Request, user: User, submission: Submissions, store: StoreCalls
) -> Response:
    """Submit a job spec (JSON, or YAML with Content-Type: application/yaml)."""
    data = await read_body(request)
    # The checks read files and may read the cluster: anyio's pool, not the store's threads.
    prepared = await run_in_threadpool(submission.prepare, user, data)
    await submission.probe(prepared)  # object storage: its own threads, awaited here
    job = await store.run(submission.store, prepared)  # wakes the reconciler
    prom.SUBMITTED.inc()
    return PAGES.response(job, status_code=201)  # kept for the lists that follow


@v1.get("/jobs", response_model=JobPage)
async def read_jobs(
    user: User,
    queries: Queries,
    store: StoreCalls,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
) -> Response:
    """List the caller's jobs, newest first."""
    # The store in its threads; the page is built and written on the event loop (a plain
    # def route would hop to anyio's pool twice: once to run, once to check its answer).
    items, total = await store.run(queries.list, user, status=status, limit=limit, offset=offset)
    return PAGES.page(items, total)


@v1.get("/jobs/{job_id}")
def read_job(job_id: str, user: User, queries: Queries) -> JobDetail:
    """One job with its latest metrics and its Ray dashboard links."""
    return JobDetail.of_detail(queries.detail(user, job_id))


@v1.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str, user: User, lifecycle: Lifecycles) -> JobPublic:
    """Cancel a job; harmless on a job that already ended."""
    return JobPublic.of(lifecycle.cancel(user, job_id))


@v1.get(
    "/jobs/{job_id}/logs",
    response_class=PlainTextResponse,
    responses=_text("text/plain", "Logs so far, or streamed with ?follow=true."),
)
def read_job_logs(job_id: str, user: User, queries: Queries, follow: bool = False) -> Response:
    """Driver and worker logs; ``?follow=true`` streams until the job ends."""
    if follow:
        return StreamingResponse(queries.follow_logs(user, job_id), media_type="text/plain")
    return PlainTextResponse(queries.logs(user, job_id))


@v1.get("/jobs/{job_id}/metrics")
def read_job_metrics(
    job_id: str,
    user: User,
    queries: Queries,
    after_step: Annotated[int, Query(ge=-1, le=MAX_INT)] = -1,
) -> MetricPage:
    """Per-step metrics (step, loss, lr, samples/s, tokens/s, world_size, ...)."""
    return MetricPage(items=queries.metrics(user, job_id, after_step=after_step))


@v1.get("/jobs/{job_id}/events")
def read_job_events(
    job_id: str, user: User, queries: Queries, after_id: Annotated[int, Query(ge=0, le=MAX_INT)] = 0
) -> EventPage:
    """Lifecycle events in order."""
    return EventPage(
        items=[
            EventPublic.model_validate(e) for e in queries.events(user, job_id, after_id=after_id)
        ]
    )


@v1.get("/jobs/{job_id}/checkpoints")
def read_job_checkpoints(job_id: str, user: User, queries: Queries) -> CheckpointPage:
    """Committed checkpoints: step, uri, bytes, save seconds."""
    return CheckpointPage(items=[CheckpointPublic(**c) for c in queries.checkpoints(user, job_id)])


@v1.get("/jobs/{job_id}/memory")
def read_job_memory(job_id: str, user: User, queries: Queries) -> MemoryPublic:
    """Per-rank memory the workers measured at their latest start (bytes of local shards)."""
    return MemoryPublic.model_validate(queries.memory(user, job_id))


@v1.post(
    TELEMETRY_ROUTE.removeprefix(_V1),
    openapi_extra=openapi.body(openapi.ref(TelemetryBatch), yaml=False),
)
async def create_job_telemetry(
    job_id: str, request: Request, principal: Caller, ingest: Ingest, store: StoreCalls
) -> TelemetryAccepted:
    """Metrics, events and checkpoints from a job's workers (its reporter token only)."""
    data = await read_body(request, yaml_ok=False)
    accepted = await store.run(ingest.ingest, principal, job_id, data)
    prom.TELEMETRY_POINTS.inc(accepted)
    return TelemetryAccepted(accepted=accepted)


@v1.post("/plan", openapi_extra=openapi.body(_PLAN_REQUEST))
async def create_plan(request: Request, user: User, submission: Submissions) -> Plan:
    """Dry run: memory per rank, layout, warnings, errors and a recommendation."""
    data = await read_body(request)
    prepared = await run_in_threadpool(submission.prepare_plan, user, data)
    await submission.probe(prepared)  # object storage: its own threads, awaited here
    return prepared.plan


@v1.get("/cluster")
def read_cluster(user: User, cluster: Cluster) -> ClusterPublic:
    """Ray nodes, resources, the dashboard URL, the queue in scheduling order with why
    each job waits (other tenants' jobs anonymous), and the standby drivers kept warm."""
    return ClusterPublic.model_validate(cluster.status(user))
