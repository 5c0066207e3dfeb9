"""/docs (Swagger UI) and /redoc served with no CDN: the assets come from a pinned wheel.

FastAPI's default pages load Swagger UI and ReDoc from jsDelivr, so on a cluster with no
internet they are blank. The ``fastapi-offline`` wheel (pinned in pyproject.toml) ships the
released bundles; etrain mounts its ``static`` folder at ``/static/docs`` and builds both pages
with FastAPI's own HTML helpers pointed there. The pages and assets need no token (they are
public JavaScript and CSS); every API operation they call still does.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_PREFIX = "/static/docs"


def assets_dir() -> Path:
    """The folder of Swagger UI / ReDoc bundles inside the installed fastapi-offline wheel."""
    return Path(str(files("fastapi_offline") / "static"))


def mount_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc from same-origin assets (call with docs_url=redoc_url=None)."""
    app.mount(STATIC_PREFIX, StaticFiles(directory=assets_dir()), name="docs-static")
    favicon = f"{STATIC_PREFIX}/favicon.png"
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{STATIC_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_PREFIX}/swagger-ui.css",
            swagger_favicon_url=favicon,
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{STATIC_PREFIX}/redoc.standalone.js",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )
        # ReDoc's menu footer always shows Redocly's logo from cdn.redoc.ly; images from
        # elsewhere than this origin are refused, so the page asks nothing off this host
        # (the logo hides itself when it fails to load).
        page.headers["Content-Security-Policy"] = "img-src 'self' data:"
        return page
