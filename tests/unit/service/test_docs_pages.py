"""/docs and /redoc work on a closed network: every asset they load is served by etrain itself."""

from __future__ import annotations

import re

import pytest

# src=/href= attributes and the openapi/spec URL the page's script fetches.
_REFS = re.compile(
    r"""(?:src|href)\s*=\s*["']([^"']+)["']|(?:url|spec-url)\s*[:=]\s*["']([^"']+)["']"""
)
_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}


def _refs(html: str) -> list[str]:
    return [a or b for a, b in _REFS.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_page_references_only_same_origin_assets_that_answer(module_client, page):
    r = module_client.get(page)  # no Authorization header: the page itself is public
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    assert not re.search(r"(?:https?:)?//[a-z0-9.-]+", html, re.I), "page points at another host"
    refs = _refs(html)
    assert "/openapi.json" in refs
    assets = [u for u in refs if u.startswith("/static/")]
    suffixes = {u.rsplit(".", 1)[-1] for u in assets}
    assert {"js", "png"} <= suffixes  # the UI's script and the favicon
    if page == "/docs":
        assert "css" in suffixes
    for url in refs:
        assert url.startswith("/"), url
        got = module_client.get(url)
        assert got.status_code == 200, url
        want = _TYPES["." + url.rsplit(".", 1)[-1]]
        assert want in got.headers["content-type"], (url, got.headers["content-type"])
        assert len(got.content) > 4000, url  # a real bundle, not an empty placeholder


def test_swagger_ui_bundle_is_the_real_library(module_client):
    js = module_client.get("/static/docs/swagger-ui-bundle.js").text
    assert "SwaggerUIBundle" in js
    assert "Redoc" in module_client.get("/static/docs/redoc.standalone.js").text


def test_docs_pages_stay_out_of_the_schema_and_the_api_still_needs_a_token(module_client):
    paths = module_client.get("/openapi.json").json()["paths"]
    assert not {"/docs", "/redoc"} & set(paths)
    assert not any(p.startswith("/static") for p in paths)
    assert module_client.get("/v1/jobs").status_code == 401
    assert module_client.get("/static/docs/nope.js").status_code == 404
