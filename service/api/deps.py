"""What the routes depend on: the app's runtime, the caller, and the domain services."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from service.auth import Principal, authenticate, require_user
from service.backends.base import Backend
from service.domain.ingest import TelemetryIngest
from service.domain.lifecycle import Lifecycle
from service.domain.monitoring import Monitoring
from service.domain.queries import JobQueries
from service.domain.reconciler import Reconciler
from service.domain.submission import Submission
from service.settings import Settings
from service.store import Stores


@dataclass
class Runtime:
    """What the routes reach through ``request.app.state.runtime`` (wired by ``app.create_app``)."""

    settings: Settings
    stores: Stores
    backend: Backend
    submission: Submission
    queries: JobQueries
    lifecycle: Lifecycle
    ingest: TelemetryIngest
    monitoring: Monitoring
    reconciler: Reconciler
    admin_token_file: str | None


# The dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` one in its
# thread pool, and a hop there and back per dependency was a large part of every request.


def runtime(request: Request) -> Runtime:
    """The runtime of the app serving ``request``."""
    return request.app.state.runtime


def get_principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """Any valid token (user, admin or a job's reporter)."""
    return authenticate(runtime(request).stores.tokens, authorization)


async def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """A user or admin token (not a job's reporter token)."""
    return require_user(principal)


def scrape_with_jobs(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> bool:
    """Whether a /metrics scrape gets the per-job series: with an admin token, or any
    scrape when ETRAIN_METRICS_JOB_LABELS is on. A token that is sent must be valid."""
    rt = runtime(request)
    if authorization is not None and authenticate(rt.stores.tokens, authorization).role == "admin":
        return True
    return rt.settings.metrics_job_labels


async def get_submission(request: Request) -> Submission:
    """Submitting and planning jobs."""
    return runtime(request).submission


async def get_queries(request: Request) -> JobQueries:
    """Reading jobs and their telemetry."""
    return runtime(request).queries


async def get_lifecycle(request: Request) -> Lifecycle:
    """Cancelling jobs."""
    return runtime(request).lifecycle


async def get_ingest(request: Request) -> TelemetryIngest:
    """Storing workers' telemetry."""
    return runtime(request).ingest


Caller = Annotated[Principal, Depends(get_principal)]
User = Annotated[Principal, Depends(get_user)]
Submissions = Annotated[Submission, Depends(get_submission)]
Queries = Annotated[JobQueries, Depends(get_queries)]
Lifecycles = Annotated[Lifecycle, Depends(get_lifecycle)]
Ingest = Annotated[TelemetryIngest, Depends(get_ingest)]
JobSeries = Annotated[bool, Depends(scrape_with_jobs)]
