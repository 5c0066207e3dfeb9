"""Headless Debian chromium driven by playwright, on loopback only.

Chromium starts with the flags a closed network needs (without them it stalls on
background connections) and a fresh profile (playwright gives every launch its own
temporary ``--user-data-dir``). Each :class:`Tab` is its own browser context (its own
cookies and session storage, so two tenants never share a sign-in), refuses every request
that leaves loopback, and records console errors, uncaught page errors and the requests
it refused; :meth:`Tab.check` fails on any of them. Screenshots go under the test's
temp dir.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless chromium (playwright ``Browser``), closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


class Tab:
    """One page in a fresh context: loopback only, console errors recorded."""

    def __init__(self, browser, shots: Path, *, width: int = 1280, height: int = 900):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.shots = shots
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _route(self, route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about") or parts.hostname in LOOPBACK:
            route.continue_()
        else:
            self.refused.append(url)
            route.abort("blockedbyclient")

    def _console(self, msg) -> None:
        if msg.type == "error":
            self.errors.append(f"console: {msg.text} @ {msg.location}")

    def sign_in(self, url: str, token: str) -> None:
        """Sign in to the service at ``url`` through its form; land on the jobs table."""
        self.page.goto(f"{url}/ui/signin")
        self.page.fill("#token", token)
        self.page.click("#signin-button")
        self.page.wait_for_selector("#jobs-table")

    def shot(self, name: str) -> Path:
        """Save a full-page screenshot as ``<shots>/<name>.png``."""
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def check(self, *, allow: tuple[str, ...] = ()) -> None:
        """No console errors (except those containing an ``allow`` text), no refused requests."""
        errors = [e for e in self.errors if not any(a in e for a in allow)]
        assert not errors, f"console errors: {errors}"
        assert not self.refused, f"requests left loopback: {self.refused}"

    def close(self) -> None:
        self.context.close()


@contextlib.contextmanager
def tabs(browser, shots: Path) -> Iterator:
    """A factory of :class:`Tab` (``open(width=...)``); every tab is checked and closed on exit."""
    opened: list[Tab] = []

    def open_tab(**size) -> Tab:
        tab = Tab(browser, shots, **size)
        opened.append(tab)
        return tab

    try:
        yield open_tab
    finally:
        for tab in opened:
            tab.close()
