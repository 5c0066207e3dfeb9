"""Object-storage checks at submit and plan time, and the credentials a launch forwards.

A job whose ``checkpoint.storage`` is ``s3://`` or ``gs://`` is probed with the
credentials its workers will use, read from the service's environment (the
``ETRAIN_SECRET_<NAME>_*`` variables of ``stores.s3.credentials_secret``, or
AWS_* where the access policy lets the tenant use the service's own keys) before
it is queued, so a missing bucket or a refused key is a 422 now, not a failed
job after the first checkpoint. ``file://`` storage is not probed: the service
may not share the workers' file system (the embedded default is its own data
directory, which it created).

Probes run in :class:`StorageProbes`' own threads, never on the event loop or in
the API's thread pool: each is bounded by ``ETRAIN_PROBE_TIMEOUT_S`` (a store that
does not answer is a 422 then), at most ``ETRAIN_PROBE_WORKERS`` are in flight, and
at most ``ETRAIN_PROBE_PER_TENANT`` of one tenant (one more is a 429). Other reads
the service makes from a tenant's stores at submit (an object-store model.hf's
config.json) go through :meth:`StorageProbes.call` under the same bounds.

The credentials a launch forwards are those of every store the spec names
(``checkpoint.storage``, ``model.hf``, ``model.tokenizer``, ``data.path``,
``data.eval.path``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from service.errors import EtrainError, InvalidSpec
from workers.spec import CheckpointSpec, JobSpec, StoresSpec
from workers.storage.location import StorageError, is_remote, job_credential_env, resolve_store
from workers.storage.probe import check_storage

T = TypeVar("T")


class TooManyProbes(EtrainError):
    """A tenant (or the service) already has as many storage probes in flight as allowed."""

    status_code = 429


def check_checkpoint_storage(
    checkpoint: CheckpointSpec,
    stores: StoresSpec | None,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> None:
    """Raise InvalidSpec (422) unless an object-store ``checkpoint.storage`` can be written.

    Credentials come from ``env`` (default: the service's environment), chosen as the
    job's workers choose them (``stores.s3.credentials_secret``, else AWS_*), and the
    store options are ``stores``' for the scheme; the error names checkpoint.storage (or
    the secret) and the fix, never a credential value.
    """
    if not is_remote(checkpoint.storage):
        return
    try:
        check_storage(resolve_store(checkpoint.storage, stores, env=env), timeout_s=timeout_s)
    except StorageError as e:
        secret = str(e).startswith("stores.s3.credentials_secret")
        field = ["stores", "s3", "credentials_secret"] if secret else ["checkpoint", "storage"]
        loc = ["body", *field]
        raise InvalidSpec(str(e), [{"loc": loc, "msg": str(e), "type": "storage"}]) from e


def storage_launch_env(spec: JobSpec, *, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Credential variables of the service's environment that the job's workers need.

    Only the variables the job's stores read are returned: AWS_* for ``s3://``, or
    ``ETRAIN_SECRET_<NAME>_*`` for ``stores.s3.credentials_secret: NAME``, for every
    store the spec names (checkpoint.storage, model.hf, model.tokenizer, data.path,
    data.eval.path), so a model in S3 is readable beside local checkpoints; and the
    ``ETRAIN_SECRET_<NAME>_*`` of its experiment trackers' ``credentials_secret``.
    """
    return job_credential_env(spec, env=env)


class StorageProbes:
    """Object-store probes in their own bounded thread pool, with a deadline and a
    per-tenant bound (see the module docstring)."""

    def __init__(self, *, workers: int, per_tenant: int, timeout_s: float):
        """At most ``workers`` probes at once, ``per_tenant`` of one tenant, each given
        ``timeout_s`` (connect and read timeouts, and the caller's deadline)."""
        self.workers, self.per_tenant, self.timeout_s = workers, per_tenant, timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._active: dict[str, int] = {}

    def _start(self, tenant: str, spec: JobSpec) -> Future | None:
        """The probe of ``spec``'s checkpoint storage started for ``tenant`` (None: nothing
        to probe)."""
        if not is_remote(spec.checkpoint.storage):
            return None
        return self._spawn(
            tenant,
            lambda: check_checkpoint_storage(
                spec.checkpoint, spec.stores, timeout_s=self.timeout_s
            ),
        )

    def call(self, tenant: str, fn: Callable[[float], T]) -> T:
        """``fn(timeout_s)`` (another object-store read, such as model.hf's config.json)
        in a probe thread under the same bounds, waiting in this thread (never the event
        loop's); ``TimeoutError`` past ``timeout_s``."""
        future = self._spawn(tenant, lambda: fn(self.timeout_s))
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"no answer within {self.timeout_s:g} s") from None

    def _spawn(self, tenant: str, target: Callable[[], Any]) -> Future:
        """``target`` started in its own daemon thread for ``tenant``, within the bounds."""
        with self._lock:
            if self._closed:
                raise TooManyProbes("the service is shutting down; retry against the new one")
            if sum(self._active.values()) >= self.workers:
                raise TooManyProbes(
                    f"{self.workers} object-store checks are in flight "
                    "(ETRAIN_PROBE_WORKERS); retry in a few seconds"
                )
            if self._active.get(tenant, 0) >= self.per_tenant:
                raise TooManyProbes(
                    f"tenant {tenant!r} already has {self.per_tenant} object-store checks in "
                    "flight (ETRAIN_PROBE_PER_TENANT); retry once they answered"
                )
            self._active[tenant] = self._active.get(tenant, 0) + 1
        future: Future = Future()
        # The slot is held until the probe's thread is done, not until the caller gave up.
        future.add_done_callback(lambda _: self._release(tenant))
        # A daemon thread per probe (at most ``workers``), not a ThreadPoolExecutor: the
        # interpreter joins an executor's threads at exit, so one store that never answers
        # would keep `etrain serve` (or a test run) from exiting.
        threading.Thread(
            target=self._run, args=(future, target), name="etrain-probe", daemon=True
        ).start()
        return future

    def _run(self, future: Future, target: Callable[[], Any]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = target()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller, as an executor does
            future.set_exception(e)
        else:
            future.set_result(result)

    def _release(self, tenant: str) -> None:
        with self._lock:
            self._active[tenant] -= 1
            if not self._active[tenant]:
                del self._active[tenant]

    def _too_slow(self, checkpoint: CheckpointSpec) -> InvalidSpec:
        msg = (
            f"checkpoint.storage {checkpoint.storage}: the store did not answer within "
            f"{self.timeout_s:g} s (ETRAIN_PROBE_TIMEOUT_S); check checkpoint.storage, its "
            "endpoint_url and the network"
        )
        return InvalidSpec(msg, [{"loc": ["body", "checkpoint", "storage"], "msg": msg}])

    def check(self, tenant: str, spec: JobSpec) -> None:
        """Probe ``spec``'s checkpoint storage for ``tenant``, waiting in this thread."""
        future = self._start(tenant, spec)
        if future is None:
            return
        try:
            future.result(timeout=self.timeout_s)
        except FutureTimeout as e:
            future.cancel()
            raise self._too_slow(spec.checkpoint) from e

    async def check_async(self, tenant: str, spec: JobSpec) -> None:
        """:meth:`check` for the event loop: it waits without holding any thread."""
        future = self._start(tenant, spec)
        if future is None:
            return
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError as e:
            raise self._too_slow(spec.checkpoint) from e

    def close(self) -> None:
        """Stop taking probes; those in flight end on their own timeouts (their threads
        are daemons: none keeps the process from exiting)."""
        with self._lock:
            self._closed = True
