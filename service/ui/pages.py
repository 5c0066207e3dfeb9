"""The routes of the web pages: ``/`` redirects to ``/ui/``; each page is a static HTML shell
whose JavaScript reads the API with the user's token. The shells and assets need no token
(they hold no data); every API call they make does.

Every ``/ui`` answer carries a strict Content-Security-Policy: scripts, styles and
connections from this origin only, no inline script, no framing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).parent / "static"
PREFIX = "/ui"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# Page path (under /ui) -> its HTML shell.
PAGES = {
    "/": "jobs.html",
    "/jobs": "jobs.html",
    "/jobs/{job_id}": "job.html",
    "/cluster": "cluster.html",
    "/plan": "plan.html",
    "/signin": "signin.html",
}


class UiStatic(StaticFiles):
    """The pages' JavaScript and CSS, with the pages' security headers."""

    async def get_response(self, path: str, scope: Scope):
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def _page(name: str):
    file = STATIC_DIR / name

    async def page() -> FileResponse:
        return FileResponse(file, media_type="text/html", headers=HEADERS)

    page.__name__ = f"ui_{name.removesuffix('.html')}"
    return page


def mount_ui(app: FastAPI) -> None:
    """Serve the pages under /ui/ and redirect / there (none of it in the OpenAPI schema)."""

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    for path, name in PAGES.items():
        app.add_api_route(PREFIX + path, _page(name), methods=["GET"], include_in_schema=False)
    app.mount(f"{PREFIX}/static", UiStatic(directory=STATIC_DIR), name="ui-static")
