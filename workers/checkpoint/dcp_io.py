"""torch.distributed.checkpoint readers and writers for a checkpoint store.

Local disk gets DCP's own file-system writer (every file fsynced) with
writeback while it serializes (:mod:`workers.checkpoint.local_writer`); object
stores are written and read through the location's fsspec file system, shard by
shard, with no local copy.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from urllib.parse import urlsplit

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecReader

from workers.checkpoint.safe_load import SafeMetadataReader
from workers.storage.location import StorageError, StorageLocation


def _as_uri(loc: StorageLocation, path: str) -> str:
    """``path`` (from ``loc.join`` or ``loc.uri_of``) as a URI of ``loc``'s scheme."""
    if "://" in path:
        if not path.startswith(f"{loc.scheme}://"):
            raise StorageError(
                f"{path.split('://', 1)[0]}:// path given for a {loc.scheme}:// checkpoint.storage"
            )
        return path
    return f"{loc.scheme}://{path.lstrip('/')}"


def dcp_writer(loc: StorageLocation, path: str, *, thread_count: int = 1):
    """A torch.distributed.checkpoint StorageWriter for the checkpoint folder ``path``.

    ``path`` comes from ``loc.join`` (or ``loc.uri_of``). For object stores the
    writer streams every shard straight to the store through ``loc``'s fsspec
    file system (s3fs uploads in parts as it goes): no full local copy.
    """
    if loc.scheme == "file":
        # DCP's FileSystemWriter (every file fsynced), writing back while it serializes.
        from workers.checkpoint.local_writer import LocalCheckpointWriter

        return LocalCheckpointWriter(_local_path(path), thread_count=thread_count)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    # An object is durable once its upload completed: there is no fsync to do
    # (DCP would fall back to os.sync() of the local disks).
    return FsspecWriter(
        _as_uri(loc, path), sync_files=False, thread_count=thread_count, **loc.options
    )


def dcp_reader(loc: StorageLocation, path: str):
    """A torch.distributed.checkpoint StorageReader for the checkpoint folder ``path``.

    Object stores are read through ``loc``'s fsspec file system, shard by shard
    (ranged reads), without downloading the checkpoint first. Nothing read runs code:
    see :mod:`workers.checkpoint.safe_load` (load with its ``SafeLoadPlanner``).
    """
    if loc.scheme == "file":
        return _SafeFileSystemReader(_local_path(path))
    return _SafeFsspecReader(_as_uri(loc, path), **loc.options)


class _SafeFileSystemReader(SafeMetadataReader, FileSystemReader):
    """DCP's local reader; ``.metadata`` unpickled with an allow-list (safe_load)."""


class _SafeFsspecReader(SafeMetadataReader, FsspecReader):
    """DCP's fsspec reader; ``.metadata`` unpickled with an allow-list (safe_load), its
    shards opened with a read-ahead cache (:class:`_ReadAheadFileSystem`)."""

    def __init__(self, path: str, **kwargs) -> None:
        super().__init__(path, **kwargs)
        fs, self.fs = self.fs, _ReadAheadFileSystem()
        self.fs.fs = fs.fs


class _ReadAheadFileSystem(FileSystem):
    """DCP's fsspec file system, reading through fsspec's ``readahead`` cache.

    DCP reads each item of a shard in offset order, and ``torch.load`` reads a tensor's
    record in many small pieces (zip headers of a few bytes, then the data). gcsfs's
    default cache (``adaptive``) takes that for random access and sends one ranged GET
    per piece: about 1,200 GETs to restore a tiny model's 4 shards. Read ahead, each
    block is one GET. (s3fs reads ahead by default; naming the cache keeps it so.)
    """

    @contextmanager
    def create_stream(self, path, mode: str):
        if mode != "rb":
            raise ValueError(f"checkpoint reader opened {path} for {mode!r}")
        with self.fs.open(os.fspath(path), mode, cache_type="readahead") as stream:
            yield stream


def _local_path(path: str) -> str:
    return urlsplit(path).path if path.startswith("file://") else path
