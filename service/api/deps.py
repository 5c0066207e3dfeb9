"""What the routes depend on: the caller and the domain services, each through FastAPI's
``Depends`` (a route never reaches the runtime, the stores or the backend itself)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from service.api.store_threads import StoreThreads
from service.auth import Principal, require_user
from service.backends.base import Backend
from service.domain.generation import Generation
from service.domain.ingest import TelemetryIngest
from service.domain.lifecycle import Lifecycle
from service.domain.monitoring import Monitoring
from service.domain.queries import JobQueries
from service.domain.queue_view import ClusterView
from service.domain.reconciler import Reconciler
from service.domain.standby_jobs import StandbyJobs
from service.domain.submission import Submission
from service.domain.tokens import Tokens
from service.settings.slices import ApiSettings
from service.store import Stores
from service.store.replicas import WakeChannel


@dataclass
class Runtime:
    """What the app holds in ``request.app.state.runtime`` (wired by ``app.create_app``);
    the dependencies below hand its services to the routes."""

    api: ApiSettings  # its slice of the settings
    stores: Stores
    backend: Backend
    submission: Submission
    queries: JobQueries
    lifecycle: Lifecycle
    ingest: TelemetryIngest
    monitoring: Monitoring
    reconciler: Reconciler
    wake: WakeChannel  # replicas wake the leader through the database
    tokens: Tokens
    standby: StandbyJobs
    cluster: ClusterView
    generation: Generation
    admin_token_file: str | None
    store_threads: StoreThreads  # the busiest routes' store calls


# The dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` one in its
# thread pool, and a hop there and back per dependency was a large part of every request.


def _runtime(request: Request) -> Runtime:
    """The runtime of the app serving ``request``."""
    return request.app.state.runtime


async def get_tokens(request: Request) -> Tokens:
    """Authentication and the token lifecycle."""
    return _runtime(request).tokens


TokenService = Annotated[Tokens, Depends(get_tokens)]


async def get_store_threads(request: Request) -> StoreThreads:
    """The threads the busiest routes run their store calls in."""
    return _runtime(request).store_threads


StoreCalls = Annotated[StoreThreads, Depends(get_store_threads)]


async def get_principal(
    tokens: TokenService,
    store: StoreCalls,
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    """Any valid token (user, admin or a job's reporter): one verified moments ago on the
    event loop, any other looked up in the store's threads."""
    principal = tokens.verified(authorization)
    if principal is None:
        principal = await store.run(tokens.authenticate, authorization)
    return principal


async def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """A user or admin token (not a job's reporter token)."""
    return require_user(principal)


def scrape_with_jobs(
    request: Request, tokens: TokenService, authorization: Annotated[str | None, Header()] = None
) -> bool:
    """Whether a /metrics scrape gets the per-job series: with an admin token, or any
    scrape when ETRAIN_METRICS_JOB_LABELS is on. A token that is sent must be valid."""
    if authorization is not None and tokens.authenticate(authorization).role == "admin":
        return True
    return _runtime(request).api.metrics_job_labels


async def get_submission(request: Request) -> Submission:
    """Submitting and planning jobs."""
    return _runtime(request).submission


async def get_queries(request: Request) -> JobQueries:
    """Reading jobs and their telemetry."""
    return _runtime(request).queries


async def get_lifecycle(request: Request) -> Lifecycle:
    """Cancelling jobs."""
    return _runtime(request).lifecycle


async def get_ingest(request: Request) -> TelemetryIngest:
    """Storing workers' telemetry."""
    return _runtime(request).ingest


async def get_monitoring(request: Request) -> Monitoring:
    """Readiness and the job counts of a scrape."""
    return _runtime(request).monitoring


async def get_standby(request: Request) -> StandbyJobs:
    """Jobs handed to standby drivers."""
    return _runtime(request).standby


async def get_cluster(request: Request) -> ClusterView:
    """The cluster, its queue and standbys as a caller may see them."""
    return _runtime(request).cluster


async def get_generation(request: Request) -> Generation:
    """Generating text from finished jobs."""
    return _runtime(request).generation


Caller = Annotated[Principal, Depends(get_principal)]
User = Annotated[Principal, Depends(get_user)]
Submissions = Annotated[Submission, Depends(get_submission)]
Queries = Annotated[JobQueries, Depends(get_queries)]
Lifecycles = Annotated[Lifecycle, Depends(get_lifecycle)]
Ingest = Annotated[TelemetryIngest, Depends(get_ingest)]
Monitor = Annotated[Monitoring, Depends(get_monitoring)]
Standbys = Annotated[StandbyJobs, Depends(get_standby)]
Cluster = Annotated[ClusterView, Depends(get_cluster)]
JobSeries = Annotated[bool, Depends(scrape_with_jobs)]
Generations = Annotated[Generation, Depends(get_generation)]
