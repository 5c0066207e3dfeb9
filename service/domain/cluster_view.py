"""The connected cluster's shape, read at most once per ``MAX_AGE_S`` for every request.

Every submit and plan is planned against the connected cluster. Asking Ray for it on each
request put a dashboard round trip (and, with 50 clients, 50 of them at once) in front of
every ``POST /v1/jobs``. Requests within ``MAX_AGE_S`` of a read share it, and while one
thread reads, the others wait for its answer instead of asking too. A failed read is
remembered just as long, so an unreachable cluster costs one timeout per period, not one
per request. The reconciler still reads the cluster itself on every tick.
"""

from __future__ import annotations

import threading
import time
import weakref

from service.backends.base import Backend, ClusterInfo
from service.errors import BackendUnavailable

MAX_AGE_S = 2.0


class _View:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.read_at = float("-inf")
        self.info: ClusterInfo | None = None
        self.error: BackendUnavailable | None = None


_views: weakref.WeakKeyDictionary[Backend, _View] = weakref.WeakKeyDictionary()
_views_lock = threading.Lock()


def cluster_info(backend: Backend, *, max_age_s: float = MAX_AGE_S) -> ClusterInfo:
    """``backend.cluster()``, or its answer (or BackendUnavailable) of at most
    ``max_age_s`` ago."""
    with _views_lock:
        view = _views.get(backend)
        if view is None:
            view = _views[backend] = _View()
    with view.lock:  # one reader at a time; the others then find its fresh answer
        if time.monotonic() - view.read_at > max_age_s:
            try:
                view.info, view.error = backend.cluster(), None
            except BackendUnavailable as e:
                view.info, view.error = None, e
            view.read_at = time.monotonic()
        if view.error is not None:
            raise view.error
        assert view.info is not None
        return view.info
