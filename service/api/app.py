"""The FastAPI application and the composition root: settings, stores, backend, domain, routes."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.api import generate_routes, goodput_routes, routes, standby_routes, token_routes
from service.api.deps import Runtime
from service.api.docs_pages import mount_docs
from service.api.limits import BodyLimit
from service.api.openapi import document_bodies
from service.api.prometheus import JOB_METRICS
from service.api.store_threads import StoreThreads
from service.auth import ensure_admin_token
from service.backends.base import Backend
from service.domain.generation import Generation
from service.domain.ingest import TelemetryIngest
from service.domain.leadership import Leadership
from service.domain.lifecycle import Lifecycle
from service.domain.monitoring import Monitoring
from service.domain.queries import JobQueries
from service.domain.queue_view import ClusterView
from service.domain.ray_dashboard import token_hint
from service.domain.reconciler import Reconciler
from service.domain.standby_jobs import StandbyJobs
from service.domain.submission import Submission
from service.domain.tokens import Tokens
from service.errors import EtrainError, InvalidSpec
from service.settings import Settings
from service.store import Stores, migrate
from service.store.leases import LeaseStore
from service.store.replicas import WakeChannel, hold_sqlite
from service.ui import mount_ui


def _start(settings: Settings, backend: Backend | None, embedded_box: list) -> Runtime:
    """Migrate and open the store, make sure an admin token exists, wire the domain."""
    settings.data_path.mkdir(mode=0o700, parents=True, exist_ok=True)
    migrate(settings.db_url)
    stores = Stores.open(settings.db_url)
    hold_sqlite(stores.db)  # SQLite: this process only; PostgreSQL: any number of replicas
    token_file = ensure_admin_token(
        stores.tokens,
        configured=settings.admin_token.get_secret_value() if settings.admin_token else None,
        data_dir=settings.data_path,
    )
    if backend is None:
        from service.backends.factory import build_backend

        backend, embedded = build_backend(settings.ray)
        embedded_box.append(embedded)
    # Each service gets its slice of the settings (service/settings/slices.py), not all of them.
    wake = WakeChannel(stores.db)
    leadership = Leadership(
        LeaseStore(stores.db) if wake.shared else None, ttl_s=settings.leader_lease_s
    )
    reconciler = Reconciler(stores, backend, settings.reconciler, leadership=leadership)
    leadership.on_elected = reconciler.wake  # a new leader picks up every job in flight now

    def stored() -> None:
        reconciler.wake()
        if not leadership.leads():
            wake.notify()  # the leader is another replica (its next poll, should this miss)

    queries = JobQueries(stores, backend, token_hint=token_hint(settings.ray))
    return Runtime(
        api=settings.api,
        stores=stores,
        backend=backend,
        # A stored job wakes the reconciler: admitted now, not at the next poll.
        submission=Submission(stores.jobs, backend, settings.submission, on_stored=stored),
        queries=queries,
        lifecycle=Lifecycle(stores, backend),
        ingest=TelemetryIngest(stores, JOB_METRICS),
        monitoring=Monitoring(stores, backend, JOB_METRICS, leadership, reconciler),
        reconciler=reconciler,
        wake=wake,
        tokens=Tokens(stores.tokens),
        # A standby's finished job wakes it too: recorded now, and the standby free for the
        # next job now, not at the next poll.
        standby=StandbyJobs(backend, on_done=reconciler.wake),
        cluster=ClusterView(backend, stores.jobs, settings.quotas),
        generation=Generation(stores, queries, settings.generation),
        admin_token_file=str(token_file) if token_file else None,
        store_threads=StoreThreads(stores.db.dialect),
    )


def _stop(runtime: Runtime, embedded_box: list) -> None:
    """Stop what :func:`_start` started, the control loop first."""
    runtime.reconciler.leadership.stop()  # handed back: another replica leads now
    runtime.reconciler.stop()
    runtime.store_threads.close()
    runtime.backend.close()
    for embedded in embedded_box:
        if embedded is not None:
            embedded.stop()
    runtime.stores.close()


def create_app(
    settings: Settings | None = None, *, backend: Backend | None = None, reconcile: bool = True
) -> FastAPI:
    """Build the app. With no ``backend`` one is built from settings (maybe embedded Ray)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        """Start the runtime (and the reconciler) with the app; stop them with it."""
        embedded_box: list = []
        runtime = _start(settings, backend, embedded_box)
        app.state.runtime = runtime
        stop_listening = threading.Event()
        if reconcile:
            runtime.reconciler.start()
            runtime.reconciler.leadership.start()
            if runtime.wake.shared:
                wake_up = (runtime.reconciler.wake, stop_listening)
                threading.Thread(target=runtime.wake.listen, args=wake_up, daemon=True).start()
        try:
            yield
        finally:
            stop_listening.set()
            _stop(runtime, embedded_box)

    app = FastAPI(
        title="etrain",
        version="0.1.0",
        lifespan=lifespan,
        description="Elastic cluster training service on Ray Train.",
        docs_url=None,  # /docs and /redoc: same-origin assets, no CDN (service/api/docs_pages.py)
        redoc_url=None,
    )

    @app.exception_handler(EtrainError)
    async def _domain_error(request: Request, exc: EtrainError) -> JSONResponse:
        if isinstance(exc, InvalidSpec):
            return JSONResponse(status_code=422, content={"detail": exc.errors})
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc)})

    # Outermost: a too-large body is refused before any route or dependency reads it.
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    app.include_router(routes.probes)
    app.include_router(routes.v1)
    app.include_router(goodput_routes.v1)
    app.include_router(token_routes.v1)
    app.include_router(standby_routes.v1)
    app.include_router(generate_routes.v1)
    mount_docs(app)
    mount_ui(app)  # the web pages under /ui/ (not in the OpenAPI schema)
    document_bodies(
        app, (*routes.BODY_MODELS, *token_routes.BODY_MODELS, *generate_routes.BODY_MODELS)
    )
    return app
