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
