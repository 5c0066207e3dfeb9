"""Data and tokenizer files on object stores (``s3://``, ``gs://``), reached like checkpoints.

A job's ``data.path``, ``data.eval.path``, ``model.tokenizer`` or ``model.hf`` may
name an object store. It is reached with the same mapping from a spec to a store as the
checkpoints: the caller passes ``stores``, a function of a URL to its
``StorageLocation`` (the training loop and the CLI pass
:func:`workers.storage.location.stores_for` over the spec's ``stores`` section,
whose ``s3`` / ``gcs`` options apply when the scheme is theirs; credentials from the
environment). This package sits below ``workers.checkpoint``, so it takes the function
rather than importing it; without one, fsspec's defaults reach the store. Rows are
streamed (fsspec file objects: jsonl line by line, parquet with ranged reads); what
must be a local folder (a tokenizer, prepared shards to memory-map) is copied once per node into
the cache under a file lock, keyed by what the store says about the files.

Torch-free: ``etrain data prepare`` and the service import it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable
from typing import IO, Any

from workers.storage.confine import ROOTS_ENV, Roots
from workers.storage.location import is_remote as is_remote  # the one rule, asked here too

# A URL -> its StorageLocation (an fsspec ``fs`` and the ``root`` path it sees).
Stores = Callable[[str], Any]

CACHE_ENV = "ETRAIN_DATA_CACHE"
# Tokenizer files are small; a bigger one is refused rather than fetched.
MAX_TOKENIZER_FILE = 64 << 20


def cache_root() -> str:
    """Where this job's processes keep what they prepare or fetch: a folder of the node cache
    ($ETRAIN_DATA_CACHE, else the temp dir) of the job's tenant alone, named after the
    folders the service lets the tenant use (``ETRAIN_STORAGE_ROOTS``), so one tenant's job
    never reads an entry another tenant's job made."""
    base = os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "etrain-data-cache")
    who = os.environ.get(ROOTS_ENV, "")
    return os.path.join(base, hashlib.sha256(who.encode()).hexdigest()[:16] if who else "local")


def cache_roots() -> Roots:
    """The node cache as a root: what is read back from it is opened beneath it."""
    return Roots.of([cache_root()])


def store_identity(url: str, stores: Stores | None = None) -> dict:
    """Which store ``url`` is in, for cache keys: the URL (scheme, bucket, full path) and the
    endpoint the spec maps it to; a local path as an absolute path."""
    if not is_remote(url):
        return {"path": os.path.abspath(url.removeprefix("file://"))}
    endpoint = None
    if stores is not None:
        with contextlib.suppress(ValueError):
            endpoint = stores(url).endpoint_url
    return {"url": url.rstrip("/"), "endpoint": endpoint or ""}


def locate(url: str, stores: Stores | None = None, *, field: str = "data.path") -> tuple[Any, str]:
    """``(fsspec file system, path as it sees it)`` of ``url``, through ``stores`` (the
    spec's mapping to a store), else fsspec's defaults."""
    if stores is None:
        import fsspec

        return fsspec.core.url_to_fs(url)
    try:
        loc = stores(url)
    except ValueError as e:  # StorageError: the store cannot be used as configured
        raise ValueError(f"{field} {url!r}: {e}") from e
    return loc.fs, loc.root


def _unreadable(field: str, url: str, e: BaseException) -> ValueError:
    if isinstance(e, FileNotFoundError):
        return ValueError(f"{field} {url!r} does not exist; name an object that does")
    if isinstance(e, PermissionError):
        return ValueError(f"{field} {url!r}: access denied; check the job's store credentials")
    return ValueError(f"{field} {url!r}: cannot read it ({type(e).__name__}: {e})")


def file_info(url: str, stores: Stores | None = None, *, field: str = "data.path") -> dict:
    """The store's facts about object ``url`` (a ValueError naming it when it is missing
    or a folder)."""
    fs, path = locate(url, stores, field=field)
    try:
        fs.invalidate_cache(path)
        info = fs.info(path)
    except Exception as e:
        raise _unreadable(field, url, e) from e
    if info.get("type") != "file":
        raise ValueError(f"{field} {url!r} is not a file (a folder?); name the data file")
    return info


def identity(url: str, info: dict) -> dict:
    """Name, size, ETag and modification time of an object: what its samples came from."""
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation")
    mtime = info.get("LastModified") or info.get("updated") or info.get("mtime")
    return {
        "url": url,
        "name": posixpath.basename(url.rstrip("/")),
        "size": int(info.get("size") or 0),
        "etag": str(etag or ""),
        "mtime": str(mtime or ""),
    }


def open_file(url: str, stores: Stores | None = None, *, field: str = "data.path") -> IO[bytes]:
    """A streaming binary file object of ``url`` (read in blocks, not downloaded whole)."""
    fs, path = locate(url, stores, field=field)
    try:
        return fs.open(path, "rb")
    except Exception as e:
        raise _unreadable(field, url, e) from e


def cached_folder(out: str, fill: Callable[[str], None], ready: Callable[[str], bool]) -> str:
    """Folder ``out`` of the node cache: when ``ready(out)`` is false, ``fill`` a fresh
    folder beside it and move it into place, under a file lock so one process does it."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(Exception):
            if ready(out):
                return out
        replace_folder(out, fill, prefix=".fetch-")
    return out


def replace_folder(out: str, fill: Callable[[str], None], *, prefix: str) -> None:
    """``fill`` a fresh folder beside ``out``, then move it into ``out``'s place (readers
    never see a half-written folder; a failed fill leaves ``out`` as it was)."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=os.path.dirname(os.path.abspath(out)))
    try:
        fill(tmp)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_small(url: str, stores: Stores | None, limit: int, *, field: str) -> bytes:
    """The bytes of object ``url``, refused when it is larger than ``limit``."""
    info = file_info(url, stores, field=field)
    if int(info.get("size") or 0) > limit:
        raise ValueError(f"{field} {url!r} is larger than {limit} bytes; is it the right file?")
    with open_file(url, stores, field=field) as f:
        return f.read(limit + 1)[:limit]


def fetch_files(
    url: str,
    names: tuple[str, ...],
    stores: Stores | None,
    *,
    field: str,
    required: str,
    limit: int,
) -> str:
    """The files ``names`` of folder ``url`` that exist (``required`` must), copied once into
    a node-cache folder keyed by the URL and each file's size and ETag; return the folder."""
    fs, root = locate(url, stores, field=field)
    try:
        fs.invalidate_cache(root)
        entries = fs.ls(root, detail=True)
    except Exception as e:
        raise _unreadable(field, url, e) from e
    found = {posixpath.basename(e["name"]): e for e in entries if e.get("type") == "file"}
    if required not in found:
        raise ValueError(
            f"{field} {url!r} has no {required}; name a folder holding {required} "
            f"(found: {', '.join(sorted(found)) or 'nothing'})"
        )
    picked = [n for n in names if n in found]
    for name in picked:
        if int(found[name].get("size") or 0) > limit:
            raise ValueError(f"{field} {url!r}: {name} is larger than {limit} bytes")
    facts = [identity(f"{url}/{n}", found[n]) for n in picked]
    where = store_identity(url, stores)
    key = hashlib.sha256(json.dumps([where, facts], sort_keys=True).encode()).hexdigest()[:32]

    def fill(tmp: str) -> None:
        for name in picked:
            try:
                fs.get_file(posixpath.join(root, name), os.path.join(tmp, name))
            except Exception as e:
                raise _unreadable(field, f"{url.rstrip('/')}/{name}", e) from e
        with open(os.path.join(tmp, ".complete"), "w") as f:
            json.dump(facts, f)

    out = os.path.join(cache_root(), "fetched", key)
    return cached_folder(out, fill, lambda d: os.path.isfile(os.path.join(d, ".complete")))
