"""A committed checkpoint opened where it lies, outside a job (``etrain export``, tools).

The store comes from the job's ``stores`` section (the one mapping in
:mod:`workers.storage.location`); the folder counts only if the checkpoint
layout lists it as committed; and every failure to read it is one
:class:`ExportError` that says what to change, naming credentials by their
source and never by their value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch.distributed.checkpoint import CheckpointException

from workers.checkpoint.dcp_io import dcp_reader
from workers.checkpoint.manager import MANIFEST, CheckpointInfo, CheckpointManager
from workers.storage.location import (
    StorageError,
    StorageLocation,
    resolve_store,
)
from workers.storage.probe import redact_credentials, store_error_code

if TYPE_CHECKING:
    from workers.spec import CheckpointSpec, StoresSpec


class ExportError(ValueError):
    """A checkpoint cannot be exported as asked; the message says what to change."""


def local_base(base: dict, marker: str, fix: str) -> str:
    """The folder of a checkpoint's base ``base["hf"]`` on this machine's file system (it
    holds ``marker``); ExportError ending with ``fix`` when it is elsewhere."""
    path = str(base["hf"]).removeprefix("file://")
    if "://" in path or not os.path.isfile(os.path.join(path, marker)):
        raise ExportError(
            f"the base model.hf {base['hf']!r} of this checkpoint is not on this machine's "
            f"file system; {fix}"
        )
    return path


@dataclass(frozen=True)
class ExportSource:
    """A committed checkpoint and the store it is read from (see :func:`open_checkpoint_dir`)."""

    loc: StorageLocation  # the checkpoints folder that holds it
    info: CheckpointInfo  # step, path as ``loc.fs`` sees it, uri

    @property
    def uri(self) -> str:
        """The checkpoint's full URI (``file://``, ``s3://``, ``gs://``)."""
        return self.info.uri

    def reader(self):
        """A DCP StorageReader of the checkpoint (ranged reads on object stores)."""
        return dcp_reader(self.loc, self.info.path)


def open_checkpoint_dir(
    uri: str | os.PathLike,
    *,
    checkpoint: CheckpointSpec | None = None,
    stores: StoresSpec | None = None,
    env: Mapping[str, str] | None = None,
) -> ExportSource:
    """The committed checkpoint at ``uri``: ``file:///abs/step_N``, a local path, or
    ``s3://`` / ``gs://`` ``bucket/prefix/step_N.<attempt>``.

    ``stores`` is the job's ``stores`` section: its ``s3`` / ``gcs`` fields say how to
    reach the store. ``checkpoint`` is the job's ``checkpoint`` section: an
    object-store ``uri`` must lie under its ``storage`` (this process's credentials
    are sent nowhere else). Credentials come from ``env`` (default: this process's environment), as
    :func:`workers.storage.location.resolve_storage` reads them. Reads the manifest
    only (one request to an object store).
    """
    uri = os.fspath(uri)
    scheme, sep, rest = uri.partition("://")
    if not sep:
        scheme, rest = "file", os.path.abspath(uri)
    elif scheme == "file" and not rest.startswith("/"):
        raise ExportError(f"checkpoint uri {uri!r} must be file:///absolute/path (no host)")
    folder, _, name = rest.rstrip("/").rpartition("/")
    if scheme == "file":
        folder = folder or "/"
    elif not folder or not name:
        raise ExportError(
            f"checkpoint uri {uri!r} must name a step folder: "
            f"{scheme}://bucket/prefix/step_XXXXXXXX.<attempt>"
        )
    if checkpoint is not None and scheme != "file":
        storage = (checkpoint.storage or "").rstrip("/")
        if not uri.startswith(f"{storage}/"):
            raise ExportError(
                f"checkpoint {uri} is not under the job's checkpoint.storage "
                f"({storage or 'unset'}); export refuses to read it with this "
                "shell's credentials"
            )
    try:
        folder_uri = f"{scheme}://{folder}"
        loc = resolve_store(folder_uri, stores, env=env)
    except StorageError as e:
        raise ExportError(f"checkpoint uri {uri!r}: {e}") from e
    if loc.scheme == "file" and not loc.fs.isdir(loc.join(name)):
        raise ExportError(
            f"checkpoint folder {loc.join(name)} does not exist on this machine: "
            "export reads the storage directly; run it where the storage is "
            "mounted"
        )
    return ExportSource(loc=loc, info=_committed_info(loc, name))


def _committed_info(loc: StorageLocation, name: str) -> CheckpointInfo:
    """Folder ``name`` of ``loc`` as the checkpoint layout lists it; ExportError unless
    committed."""
    try:
        # The layout's own rules: final step_N on disk, step_N.<attempt> on object
        # stores, committed only once its manifest exists.
        found = CheckpointManager(loc, keep_last=None, rank=0).committed(names=[name])
    except Exception as e:
        raise read_error(loc, loc.uri_of(name), e) from e
    if not found:
        raise ExportError(
            f"{loc.uri_of(name)} is not a committed checkpoint (no {MANIFEST}: its save never "
            "finished, it is a .partial- staging folder, or retention deleted it); export a "
            "committed step (etrain export JOB --step N lists the available ones)"
        )
    return found[0]


# Errors of the store clients that mean: no credentials were found at all.
_NO_CREDENTIALS = ("NoCredentialsError", "DefaultCredentialsError")


def _refusal(e: BaseException) -> str | None:
    """Why the store refused this process's credentials (an error code), or None when it
    failed otherwise. s3fs raises PermissionError; gcsfs OSError("Forbidden: ...") for 403
    and HttpError (``code`` 401) for a bad token."""
    code = store_error_code(e)
    if isinstance(e, PermissionError) or str(e).startswith("Forbidden:"):
        return code or "access denied"
    if getattr(e, "code", None) in (401, 403):
        return f"HTTP {e.code}"  # type: ignore[attr-defined]
    return None


def read_error(loc: StorageLocation, uri: str, e: BaseException) -> ExportError:
    """An ExportError saying why ``uri`` could not be read and what to change; credentials
    are named by their source, and any value of them in the text is redacted."""
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]  # DCP wraps the reader's error per rank
    at = f" at {loc.endpoint_url}" if loc.endpoint_url else ""
    fix = (
        "set credentials that may read (get, list) the job's checkpoint.storage in this "
        "shell's environment (the variables the job's workers use) and export again"
    )
    refusal = _refusal(e)
    if type(e).__name__ in _NO_CREDENTIALS:
        text = f"cannot read {uri}: found no credentials in {loc.credentials_source}; {fix}"
    elif refusal:
        text = (
            f"cannot read {uri}: the store{at} refused the credentials from "
            f"{loc.credentials_source} ({refusal}); {fix}"
        )
    else:
        detail = str(e).splitlines()[0][:300] if str(e) else ""
        text = (
            f"cannot read {uri}{at} ({type(e).__name__}: {detail}); check that the store "
            "is reachable from here (stores.s3.endpoint_url, the network) and export "
            "again"
        )
    return ExportError(redact_credentials(text, loc))
