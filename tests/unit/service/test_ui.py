"""The web pages under /ui/: served by the API's own app, strict CSP, nothing from another host,
the shells public (they hold no data) while every API call they make needs the token."""

from __future__ import annotations

import re

import pytest

from service.ui.pages import PAGES, STATIC_DIR, TEMPLATES
from tests.support.fakes import ADMIN_H

# An address of another host: scheme-relative or absolute URLs, and CSS @import / url().
_EXTERNAL = re.compile(r"(?:https?:)?//[a-z0-9][a-z0-9.-]*\.[a-z]{2,}", re.I)
# The SVG namespace names no place to load from: the only absolute URL the pages may hold.
_SVG_NS = "http://www.w3.org/2000/svg"
_REFS = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|from\s+["'](\.[^"']+)["']""")
ASSETS = sorted(p.relative_to(STATIC_DIR).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file())
PAGE_URLS = ["/ui/", "/ui/jobs", "/ui/jobs/j-123", "/ui/cluster", "/ui/plan", "/ui/signin"]


def _csp(response) -> dict[str, str]:
    policy = response.headers["content-security-policy"]
    return {d.split()[0]: d.strip() for d in policy.split(";") if d.strip()}


def test_root_redirects_to_the_pages(module_client):
    r = module_client.get("/", follow_redirects=False)
    assert r.status_code == 307
    assert r.headers["location"] == "/ui/"


@pytest.mark.parametrize("url", PAGE_URLS)
def test_page_shell_is_public_html_with_a_strict_csp(module_client, url):
    r = module_client.get(url)  # no token: the shell holds no data
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    csp = _csp(r)
    assert csp["default-src"] == "default-src 'self'"
    assert csp["script-src"] == "script-src 'self'"  # no 'unsafe-inline', no other host
    assert csp["frame-ancestors"] == "frame-ancestors 'none'"
    assert "unsafe" not in r.headers["content-security-policy"]
    html = r.text
    assert not _EXTERNAL.search(html), "page points at another host"
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline script"
    assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler"
    assert not re.search(r"\sstyle\s*=", html), "inline style"


@pytest.mark.parametrize("asset", ASSETS)
def test_every_asset_is_served_with_the_csp_and_names_no_other_host(module_client, asset):
    r = module_client.get(f"/ui/static/{asset}")
    assert r.status_code == 200
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    text = r.text.replace(_SVG_NS, "")
    assert not _EXTERNAL.search(text), f"{asset} points at another host"
    if asset.endswith(".js"):
        assert "javascript" in r.headers["content-type"]
        assert (
            "innerHTML" not in text and "outerHTML" not in text and "insertAdjacentHTML" not in text
        )
        assert "eval(" not in text and "new Function" not in text


def test_every_reference_of_the_pages_and_modules_answers(module_client):
    """Scripts, styles, icons and each ES module's imports all resolve on this server."""
    seen, todo = set(), [u for u in PAGE_URLS]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        r = module_client.get(url)
        assert r.status_code == 200, url
        for a, b in _REFS.findall(r.text):
            ref = a or url.rsplit("/", 1)[0] + "/" + b.removeprefix("./")
            if ref.startswith("/ui/static/"):
                todo.append(ref)
            else:
                assert ref.startswith("/"), (url, ref)
    modules = {u for u in seen if u.endswith(".js")}
    assert {
        f"/ui/static/js/{m}.js" for m in ("api", "dom", "chart", "jobs", "job", "plan")
    } <= modules


def test_pages_are_left_out_of_the_openapi_schema(module_client):
    paths = module_client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith("/ui")]
    assert set(PAGES) == {"/", "/jobs", "/jobs/{job_id}", "/cluster", "/plan", "/signin"}


def test_the_data_the_pages_read_still_needs_the_token(module_client):
    assert module_client.get("/v1/jobs?limit=1").status_code == 401
    assert module_client.get("/v1/jobs?limit=1", headers=ADMIN_H).status_code == 200
    assert module_client.get("/v1/cluster").status_code == 401


def test_a_missing_asset_is_404_not_a_page(module_client):
    assert module_client.get("/ui/static/js/nope.js").status_code == 404
    assert module_client.get("/ui/static/../pages.py").status_code == 404
    assert module_client.get("/ui/nope").status_code == 404


def test_every_asset_ships_in_the_package():
    """A non-editable install (the control-plane image) carries every file the pages serve."""
    import tomllib
    from fnmatch import fnmatch

    root = STATIC_DIR.parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["service"]
    templates = [f"ui/templates/{p.name}" for p in TEMPLATES.glob("*.html")]
    assert len(templates) == len(set(PAGES.values())) + 2  # the pages, the base, the nav
    for path in [f"ui/static/{asset}" for asset in ASSETS] + templates:
        assert any(fnmatch(path, g) and path.count("/") == g.count("/") for g in globs), path


def test_the_job_page_reads_every_goodput_part_and_the_evaluation():
    """Static: the goodput bar has a part for each key of the API's breakdown, the
    summary shows the newest evaluation, and the loss chart draws it as a second series."""
    from service.domain.goodput import BREAKDOWN_KEYS

    panels = (STATIC_DIR / "js" / "job_panels.js").read_text()
    assert set(re.findall(r"g\.breakdown\.(\w+)", panels)) == set(BREAKDOWN_KEYS)
    assert {"eval_loss", "eval_perplexity", "eval_step"} <= set(re.findall(r"\bm\.(\w+)", panels))
    page = (STATIC_DIR / "js" / "job.js").read_text()
    assert re.search(r'id: "chart-loss", series: \["train", "eval"\]', page)
    assert re.search(r"eval: evals\.map\(\(m\) => \(\{ x: m\.step, y: m\.eval_loss \}\)\)", page)
