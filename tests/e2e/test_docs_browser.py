"""/docs (Swagger UI) and /redoc of a running `etrain serve`, rendered by a real browser
that may reach nothing but loopback: every operation shows, nothing logs an error."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

METHODS = {"get", "post", "put", "patch", "delete"}


def _operations(url: str) -> list[tuple[str, str, str]]:
    """(method, path, summary) of every operation in the service's /openapi.json."""
    spec = httpx.get(f"{url}/openapi.json", timeout=30).json()
    return [
        (method, path, op["summary"])
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def test_swagger_ui_renders_every_operation(served, open_tab):
    ops = _operations(served.url)
    tab = open_tab()
    tab.page.goto(f"{served.url}/docs")
    create = tab.page.locator(
        ".opblock.opblock-post", has=tab.page.locator('[data-path="/v1/jobs"]')
    )
    create.wait_for(timeout=60_000)
    assert tab.page.locator(".opblock").count() == len(ops)
    for method, path, _ in ops:
        block = tab.page.locator(
            f".opblock.opblock-{method}", has=tab.page.locator(f'[data-path="{path}"]')
        )
        assert block.count() == 1, (method, path)
    create.locator(".opblock-summary").click()  # expand: the request body's schema renders
    # Swagger UI fills the expanded block in steps: wait for the request body itself (on a
    # busy machine the block's frame shows well before its sections).
    create.get_by_text("Request body", exact=True).first.wait_for(timeout=30_000)
    assert "Request body" in create.inner_text()
    tab.shot("swagger")
    tab.check()


def test_redoc_renders_every_operation(served, open_tab):
    ops = _operations(served.url)
    tab = open_tab()
    tab.page.goto(f"{served.url}/redoc")
    tab.page.wait_for_function(
        f"document.querySelectorAll('h2').length >= {len(ops)}", timeout=120_000
    )
    headings = set(tab.page.locator("h2").all_inner_texts())
    missing = [summary for _, _, summary in ops if summary not in headings]
    assert not missing, missing
    assert "POST/v1/jobs" in tab.page.inner_text("body").replace(" ", "").replace("\n", "")
    tab.shot("redoc")
    # ReDoc's footer logo from cdn.redoc.ly is refused by the page's own CSP (img-src
    # 'self'), so no request leaves loopback; the browser logs that refusal.
    tab.check(allow=("cdn.redoc.ly/redoc/logo-mini.svg' violates",))
