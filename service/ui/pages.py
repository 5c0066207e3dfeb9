"""The routes of the web pages: ``/`` redirects to ``/ui/``; each page is an HTML shell (one
layout, ``templates/base.html``, around the page's own ``<main>``) whose JavaScript reads
the API with the user's token. The shells and assets need no token
(they hold no data); every API call they make does.

Every ``/ui`` answer carries a strict Content-Security-Policy: scripts, styles and
connections from this origin only, no inline script, no framing.
"""

from __future__ import annotations

import string
from functools import cache
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).parent / "static"
TEMPLATES = Path(__file__).parent / "templates"
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
# Page path (under /ui) -> its page (templates/<page>.html, static/js/<page>.js).
PAGES = {
    "/": "jobs",
    "/jobs": "jobs",
    "/jobs/{job_id}": "job",
    "/cluster": "cluster",
    "/plan": "plan",
    "/signin": "signin",
}
TITLES = {"jobs": "Jobs", "job": "Job", "cluster": "Cluster", "plan": "Plan", "signin": "Sign in"}


class UiStatic(StaticFiles):
    """The pages' JavaScript and CSS, with the pages' security headers."""

    async def get_response(self, path: str, scope: Scope):
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


@cache
def render(page: str) -> str:
    """The page's HTML: the layout around its ``<main>``; the navigation on all but sign-in."""
    read = lambda name: (TEMPLATES / f"{name}.html").read_text()  # noqa: E731
    return string.Template(read("base")).substitute(
        title=TITLES[page],
        page=page,
        nav="" if page == "signin" else read("nav"),
        main=read(page),
    )


def _page(page: str):
    async def handler() -> HTMLResponse:
        return HTMLResponse(render(page), headers=HEADERS)

    handler.__name__ = f"ui_{page}"
    return handler


def mount_ui(app: FastAPI) -> None:
    """Serve the pages under /ui/ and redirect / there (none of it in the OpenAPI schema)."""

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=307)

    for path, name in PAGES.items():
        app.add_api_route(PREFIX + path, _page(name), methods=["GET"], include_in_schema=False)
    app.mount(f"{PREFIX}/static", UiStatic(directory=STATIC_DIR), name="ui-static")
