"""The shape the code keeps: modules a reader takes in at once, functions that fit a screen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60
SOURCES = sorted(
    p
    for package in ("service", "workers")
    for p in (ROOT / package).rglob("*.py")
    if "versions" not in p.parts
)  # Alembic's generated migrations


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"split {path.name} by concept"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == [], f"{path.name}: split {', '.join(long)}"


ROUTE_MODULES = sorted((ROOT / "service" / "api").glob("*routes*.py"))
# What a route would reach the stores, the backend or the app's runtime by: the import
# contracts see modules, not attributes, so these are looked for in the code itself.
REACHING_ATTRIBUTES = {"stores", "backend", "state", "app"}
REACHING_NAMES = {"getattr", "runtime", "_runtime", "Runtime"}


def _reaches(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in REACHING_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in REACHING_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.ImportFrom):
            names = {alias.name for alias in node.names} & REACHING_NAMES
            found += [f"line {node.lineno}: imports {name}" for name in sorted(names)]
    return found


def test_route_modules_are_found():
    assert {p.name for p in ROUTE_MODULES} >= {"routes.py", "token_routes.py", "standby_routes.py"}


@pytest.mark.parametrize("path", ROUTE_MODULES, ids=lambda p: p.name)
def test_routes_reach_domain_services_only_through_depends(path):
    """A route gets each domain service from service.api.deps (FastAPI Depends) and never
    reaches the stores, the backend or the runtime through attributes."""
    assert _reaches(ast.parse(path.read_text())) == [], f"{path.name}: use a service from deps"


@pytest.mark.parametrize(
    "source",
    [
        "def f(request):\n    return runtime(request).stores.tokens\n",
        "def f(rt):\n    return getattr(rt.backend, 'standby', None)\n",
        "def f(request):\n    return request.app.state.runtime\n",
        "from service.api.deps import runtime\n",
    ],
)
def test_the_route_check_sees_each_way_of_reaching_past_the_services(source):
    assert _reaches(ast.parse(source))
