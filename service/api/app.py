"""The FastAPI application: wiring of settings, store, backend, reconciler and routes."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.api.metrics import JOB_METRICS
from service.auth import ensure_admin_token
from service.backends.base import Backend
from service.domain.jobs import JobService
from service.domain.reconciler import Reconciler
from service.errors import EtrainError, InvalidSpec
from service.settings import Settings
from service.store import JobStore, migrate

log = logging.getLogger("etrain")


@dataclass
class Runtime:
    """What the routes reach through ``request.app.state.runtime``."""

    settings: Settings
    store: JobStore
    backend: Backend
    jobs: JobService
    reconciler: Reconciler | None
    admin_token_file: str | None


def _start(settings: Settings, backend: Backend | None, embedded_box: list) -> Runtime:
    settings.data_path.mkdir(parents=True, exist_ok=True)
    migrate(settings.db_url)
    store = JobStore(settings.db_url)
    token_file = ensure_admin_token(
        store, configured=settings.admin_token.get_secret_value() if settings.admin_token else None,
        data_dir=settings.data_path)
    if backend is None:
        from service.backends.factory import build_backend
        backend, embedded = build_backend(settings)
        embedded_box.append(embedded)
    jobs = JobService(store, backend, settings, job_metrics=JOB_METRICS)
    return Runtime(settings=settings, store=store, backend=backend, jobs=jobs,
                   reconciler=Reconciler(store, backend, settings),
                   admin_token_file=str(token_file) if token_file else None)


def create_app(settings: Settings | None = None, *, backend: Backend | None = None,
               reconcile: bool = True) -> FastAPI:
    """Build the app. With no ``backend`` one is built from settings (maybe embedded Ray)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        embedded_box: list = []
        runtime = _start(settings, backend, embedded_box)
        app.state.runtime = runtime
        if reconcile:
            runtime.reconciler.start()
        try:
            yield
        finally:
            runtime.reconciler.stop()
            for embedded in embedded_box:
                if embedded is not None:
                    embedded.stop()
            runtime.store.close()

    app = FastAPI(title="etrain", version="0.1.0", lifespan=lifespan,
                  description="Elastic cluster training service on Ray Train.")

    @app.exception_handler(EtrainError)
    async def _domain_error(request: Request, exc: EtrainError) -> JSONResponse:
        if isinstance(exc, InvalidSpec):
            return JSONResponse(status_code=422, content={"detail": exc.errors})
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc)})

    from service.api import goodput_routes, routes
    app.include_router(routes.probes)
    app.include_router(routes.v1)
    app.include_router(goodput_routes.v1)
    return app
