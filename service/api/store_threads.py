"""The few threads the busiest routes run their store calls in.

FastAPI runs a plain ``def`` route, and ``run_in_threadpool``, in anyio's pool of 40
threads. Under load 40 threads take turns on the GIL around every SQLite call, and
that cost more CPU than the calls: ``GET /v1/jobs`` took about 4 ms of server CPU with
50 clients in the pool, 2.5 ms in one thread (``bench/api_load.py``). Routes that may
block for long (a log followed, a Ray call) stay in anyio's pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# SQLite: one (its calls are short and its writers take turns anyway); PostgreSQL: a few,
# so that one request's round trips do not hold up the others'.
THREADS = {"sqlite": 1, "postgresql": 4}


class StoreThreads:
    """Run store calls off the event loop, in ``THREADS[dialect]`` threads of their own."""

    def __init__(self, dialect: str):
        """Threads for a store on ``dialect`` (``sqlite`` or ``postgresql``)."""
        self._pool = ThreadPoolExecutor(THREADS.get(dialect, 4), thread_name_prefix="etrain-store")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in one of the threads, with the caller's context."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Stop the threads once the calls in them end; no new call is taken."""
        self._pool.shutdown(wait=False, cancel_futures=True)
