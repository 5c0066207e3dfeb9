"""Checkpoint stores checked before a job runs, and their errors explained without secrets.

:func:`check_storage` writes and deletes a probe object with the credentials
this process holds (the service's, at submit and plan time); every failure
becomes one :class:`~workers.storage.location.StorageError` that names
``checkpoint.storage``, where the credentials came from (by variable name) and
what to change. :func:`redact_credentials` keeps key values out of any text.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import fsspec

from workers.storage.credentials import S3_OPTIONS, StorageError
from workers.storage.location import StorageLocation

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

PROBE_PREFIX = ".etrain-probe-"
# S3 error codes that mean the credentials themselves were refused (not a missing grant).
_BAD_CREDENTIALS = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "InvalidClientTokenId",
}


def check_storage(loc: StorageLocation, *, timeout_s: float = 10.0) -> None:
    """Raise :class:`StorageError` unless a checkpoint can be written under ``loc``.

    Writes and deletes ``<root>/.etrain-probe-<uuid>``, which fails when the
    bucket does not exist, the credentials are refused, the prefix is not
    writable or the store cannot be reached within about ``timeout_s``. The
    message names checkpoint.storage, the credential source by name and the
    fix; it never holds a credential value.
    """
    fs = _probe_fs(loc, timeout_s)
    probe = loc.join(f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}")
    try:
        if loc.scheme == "file":
            fs.makedirs(loc.root, exist_ok=True)
        # An async (object-store) file system also gets fsspec's own deadline per call,
        # which cancels the request: a store that accepts and never answers (or waits on
        # `Expect: 100-continue`) cannot hold the probe past its socket timeouts.
        deadline = {"timeout": timeout_s} if getattr(fs, "async_impl", False) else {}
        fs.pipe_file(probe, b"etrain storage probe\n", **deadline)
        fs.rm_file(probe, **deadline)
    except Exception as e:
        raise StorageError(redact_credentials(_explain(loc, e), loc)) from e


def quick_fs(loc: StorageLocation, timeout_s: float) -> AbstractFileSystem:
    """``loc``'s store with the probe's short timeouts and single attempt, for any other
    request the service makes at submit (such as reading model.hf's config.json)."""
    return _probe_fs(loc, timeout_s)


def _probe_fs(loc: StorageLocation, timeout_s: float) -> AbstractFileSystem:
    """A fresh (uncached) file system with short timeouts: a probe must answer quickly."""
    if loc.scheme == "s3":
        # One attempt, in botocore and in s3fs (which retries timeouts 5 times itself):
        # a store that does not answer costs the caller timeout_s, not minutes.
        config = {
            "connect_timeout": timeout_s,
            "read_timeout": timeout_s,
            "retries": {"max_attempts": 1, "mode": "standard"},
        }
        fs = fsspec.filesystem("s3", skip_instance_cache=True, config_kwargs=config, **loc.options)
        fs.retries = 1  # this instance only (uncached)
        return fs
    if loc.scheme == "gs":
        return fsspec.filesystem(
            "gs", skip_instance_cache=True, requests_timeout=timeout_s, **loc.options
        )
    return loc.fs


def store_error_code(e: BaseException) -> str | None:
    """The S3 error code behind an s3fs error (``NoSuchBucket``, ``AccessDenied``, ...)."""
    for err in (e, e.__cause__):
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            return response.get("Error", {}).get("Code")
    return None


def _explain(loc: StorageLocation, e: Exception) -> str:
    """What went wrong with ``loc`` and what to change, from the exception the probe raised."""
    code = store_error_code(e)
    bucket = loc.root.split("/", 1)[0]
    at = f" at {loc.endpoint_url}" if loc.endpoint_url else ""
    endpoint_field = f"stores.{'gcs' if loc.scheme == 'gs' else 's3'}.endpoint_url"
    head = f"checkpoint.storage {loc.uri}"
    if loc.scheme == "file":
        return (
            f"{head} is not writable by the service ({type(e).__name__}: {e}); use a "
            "directory the service and every Ray worker can write"
        )
    if code == "NoSuchBucket" or (code is None and isinstance(e, FileNotFoundError)):
        return (
            f"{head}: bucket {bucket!r} does not exist{at}; create it, or correct the "
            f"bucket in checkpoint.storage (or {endpoint_field})"
        )
    if code in _BAD_CREDENTIALS:
        return (
            f"{head}: the store{at} rejected the credentials from {loc.credentials_source} "
            f"({code}); correct them in the service's and the workers' environment"
        )
    if isinstance(e, PermissionError):
        return (
            f"{head}: the credentials from {loc.credentials_source} may not write there "
            f"({code or 'permission denied'}); grant put, get, list and delete on that "
            "prefix, or use another checkpoint.storage"
        )
    return (
        f"{head}: cannot reach the store{at} ({type(e).__name__}: {e}); check "
        f"checkpoint.storage, {endpoint_field} and the network"
    )


def redact_credentials(text: str, loc: StorageLocation) -> str:
    """``text`` with every credential value of ``loc`` replaced by ``***``."""
    for key in S3_OPTIONS:
        value = loc.options.get(key)
        if isinstance(value, str) and len(value) >= 4 and value != "anon":
            text = text.replace(value, "***")
    return text
