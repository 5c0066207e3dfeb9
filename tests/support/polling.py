"""Waiting for something a real system does in its own time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    fn: Callable[[], T],
    *,
    timeout: float = 240,
    every: float = 0.5,
    what: str = "condition",
    detail: Callable[[], str] = lambda: "",
) -> T:
    """Poll ``fn`` until it returns something truthy and return that; TimeoutError naming
    ``what`` (and ``detail()``, what was seen instead) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}: {detail()}")
