"""The connected cluster's shape, read at most once per ``MAX_AGE_S`` for every request.

Every submit and plan is planned against the connected cluster. Asking Ray for it on each
request put a dashboard round trip (and, with 50 clients, 50 of them at once) in front of
every ``POST /v1/jobs``. Requests within ``MAX_AGE_S`` of a read share it. When it is
older, one request reads it again while the others go on with the previous answer, so no
request waits for the cluster except the very first ones (they wait for that one read
instead of each asking). A failed read is remembered just as long, so an unreachable
cluster costs one timeout per period, not one per request. The reconciler still reads the
cluster itself on every tick.
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
        self.lock = threading.Lock()  # held by the first read, and to swap answers
        self.read_at = float("-inf")
        self.answer: ClusterInfo | BackendUnavailable | None = None
        self.reading = False


_views: weakref.WeakKeyDictionary[Backend, _View] = weakref.WeakKeyDictionary()
_views_lock = threading.Lock()


def _view(backend: Backend) -> _View:
    with _views_lock:
        view = _views.get(backend)
        if view is None:
            view = _views[backend] = _View()
        return view


def _read(backend: Backend) -> ClusterInfo | BackendUnavailable:
    try:
        return backend.cluster()
    except BackendUnavailable as e:
        return e


def cluster_info(backend: Backend, *, max_age_s: float = MAX_AGE_S) -> ClusterInfo:
    """``backend.cluster()``, or its answer (or BackendUnavailable) of at most
    ``max_age_s`` ago; past that, the previous answer while another request reads anew."""
    view = _view(backend)
    with view.lock:
        if view.answer is None:  # the first read: everyone waits for it
            view.answer, view.read_at = _read(backend), time.monotonic()
        stale = time.monotonic() - view.read_at > max_age_s and not view.reading
        view.reading = view.reading or stale
        answer = view.answer
    if stale:  # this request reads for everyone; the others keep the previous answer
        try:
            answer = _read(backend)
        finally:
            with view.lock:
                view.answer, view.read_at, view.reading = answer, time.monotonic(), False
    if isinstance(answer, BackendUnavailable):
        raise answer
    return answer
