"""The DCP storage writer for checkpoints on local disk (and mounted file systems).

DCP's own :class:`~torch.distributed.checkpoint.FileSystemWriter` (one file per
writer thread, each fsynced before ``write_data`` returns, ``.metadata``
fsynced), with two costs taken off a save's critical path:

* **Writeback while serializing.** Without a hint the kernel keeps a whole
  checkpoint in the page cache (it is far below the dirty limits) and the disk
  only starts writing at the fsync, after every byte is serialized; the fsync
  then costs as much as the disk's whole write. Every ``WRITEBACK_BYTES`` the
  stream asks the kernel to start writing out what it holds
  (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, as PostgreSQL's
  ``checkpoint_flush_after`` and RocksDB's ``bytes_per_sync`` do), so the disk
  works while the next tensors are serialized. It only starts I/O earlier:
  durability still comes from DCP's fsync of each file.
* **No zip CRC-32.** Every tensor goes through ``torch.save``, which computes a
  CRC-32 of all the bytes (about 0.1 s per 276 MB here) that nothing reads:
  ``torch.load``, and so DCP's reader, does not check it. The setting is
  per thread in torch (a ContextVar), and it is set only around the writing of
  each file, in DCP's writer threads.

The files are DCP's format unchanged; any DCP reader loads them.
"""

from __future__ import annotations

import ctypes
import io
import os
from collections.abc import Generator
from contextlib import contextmanager

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.utils.serialization import config as serialization_config

WRITEBACK_BYTES = 16 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start write-out of dirty pages, do not wait


def _load_sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range  # this process's libc
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int) -> bool:
    """Ask the kernel to start writing the file's dirty pages out now; do not wait.

    A hint, so it never raises: where it is unsupported (not Linux, or the file
    system refuses) the pages are written at the fsync as before. Returns whether
    the kernel took it.
    """
    if _sync_file_range is None:
        return False
    return _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) == 0  # 0, 0: the whole file


class WritebackFile:
    """A binary file for writing that starts writeback every ``WRITEBACK_BYTES``;
    everything else (``tell``, ``flush``, ``fileno``, ``close``) is the file's."""

    def __init__(self, f: io.BufferedWriter, every: int = WRITEBACK_BYTES):
        self._f, self._every, self._pending = f, every, 0

    def write(self, data) -> int:
        """Write ``data``; start writeback once ``every`` bytes have gone in since the last."""
        n = self._f.write(data)
        self._pending += n
        if self._pending >= self._every:
            self._pending = 0
            start_writeback(self._f.fileno())
        return n

    def __getattr__(self, name: str):
        return getattr(self._f, name)


class WritebackFileSystem(FileSystem):
    """DCP's local FileSystem whose write streams are :class:`WritebackFile` and
    whose ``torch.save`` calls, while a stream is open, skip the zip CRC-32."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        """DCP opens every shard and ``.metadata`` here, in the thread that writes it."""
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        # patch() sets torch's thread-local override and restores it on exit, so
        # only this writer thread's torch.save calls are affected, and only here.
        with (
            serialization_config.patch({"save.compute_crc32": False}),
            super().create_stream(path, mode) as stream,
        ):
            yield WritebackFile(stream)


class LocalCheckpointWriter(FileSystemWriter):
    """``FileSystemWriter`` (``sync_files=True``) writing through :class:`WritebackFileSystem`."""

    def __init__(self, path: str | os.PathLike, *, thread_count: int):
        super().__init__(path, thread_count=thread_count, sync_files=True)
        self.fs = WritebackFileSystem()
