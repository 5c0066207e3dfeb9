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


def _strategy_literals(tree: ast.AST) -> list[str]:
    """Strategy names written as strings where a strategy is compared or a layout built."""
    from workers.contract import STRATEGIES

    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in STRATEGIES

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            touches = any(isinstance(s, ast.Attribute) and s.attr == "strategy" for s in sides)
            if touches and any(named(s) for s in sides):
                found.append(f"line {node.lineno}: compared with a string")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Layout":
            found += [f"line {node.lineno}: Layout({a.value!r})" for a in node.args if named(a)]
        elif isinstance(node, ast.IfExp) and any(named(n) for n in (node.body, node.orelse)):
            found.append(f"line {node.lineno}: chosen as a string")
    return found


PLANNER_MODULES = sorted((ROOT / "service" / "planner").glob("*.py"))


@pytest.mark.parametrize("path", PLANNER_MODULES, ids=lambda p: p.name)
def test_the_planner_names_strategies_by_the_contracts_constants(path):
    assert _strategy_literals(ast.parse(path.read_text())) == [], "use workers.contract's names"


def test_the_strategy_check_sees_string_names():
    source = 'a = x.strategy == "ddp"\nb = Layout("fsdp", dp=2)\nc = "tp" if y else "pp"\n'
    assert len(_strategy_literals(ast.parse(source))) == 3
